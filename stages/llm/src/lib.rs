//! # edgeflow-llm
//!
//! The `thinker` stage: llama- and qwen2-architecture language models from
//! GGUF (SmolLM2-135M-Instruct by default, Qwen2.5 for better answers) on
//! the edgeflow tensor runtime.
//!
//! - [`model`]: the decoder ([`Llama`], for both architectures) with its KV
//!   cache; quantized weights (K-quants included) stay quantized;
//!   [`Llama::forward_states`] also returns each token's last hidden state
//!   (after the final norm) plus its embedding, and [`Llama::embed_tokens`]
//!   the input embeddings: what Qwen2.5-Omni's talker takes from its thinker;
//! - [`tokenizer`]: byte-level BPE and the chat template from the GGUF
//!   metadata, streaming detokenization on UTF-8 boundaries;
//! - [`sampling`]: greedy / temperature / top-k / top-p / repetition penalty;
//! - [`stage`]: the `thinker` stage kind; with `emit_states` it also emits,
//!   per turn before the Flush, the prompt's and the reply's states on its
//!   `states` port for the `talker` stage of `edgeflow-omni`;
//! - [`cards`](mod@cards): the model cards ([`cards()`]) the model registry fetches
//!   (SmolLM2-135M, Qwen2.5-Coder 0.5B and 1.5B Instruct);
//! - [`eval`]: 20 factual questions, to compare the models' answers.
//!
//! Prefill / decode throughput is measured by `edgeflow bench thinker`
//! (the CLI crate), through this crate's public API.

pub mod cards;
mod error;
pub mod eval;
pub mod model;
pub mod sampling;
pub mod stage;
pub mod tokenizer;

pub use cards::SMOLLM2;
pub use edgeflow_nn::VarBuilder;
pub use error::{Error, Result};
pub use model::{Arch, Config, Llama};
pub use sampling::{Sampler, SamplingParams};
pub use stage::{Thinker, ThinkerConfig, ThinkerKind};
pub use tokenizer::{ChatMessage, TextTokenizer, Utf8Stream};

use edgeflow_graph::Registry;

/// The model cards of the language models (`edgeflow models list`).
pub fn cards() -> &'static [edgeflow_models::ModelCard] {
    cards::CARDS
}

/// Register the stage kinds of this crate (`thinker`).
pub fn register(r: &mut Registry) {
    r.register(ThinkerKind);
}

/// Load a GGUF language model's weights onto `dev` under `cfg` (see
/// [`Llama::load`]) and, on a second thread meanwhile, its tokenizer
/// ([`TextTokenizer::from_gguf`]): a large vocabulary's tables take a
/// fifth of a second that the weights' copy would otherwise wait for.
pub fn load_gguf(
    gguf: edgeflow_runtime::weights::GgufFile,
    cfg: &Config,
    dev: &edgeflow_runtime::Device,
) -> Result<(Llama, TextTokenizer)> {
    let gguf = std::sync::Arc::new(gguf);
    let loaded = std::thread::scope(|s| {
        let tok = s.spawn(|| TextTokenizer::from_gguf(&gguf));
        let model = Llama::load(&VarBuilder::from_reader(gguf.clone(), dev), cfg);
        let tok = tok
            .join()
            .map_err(|_| Error::Tokenizer("the tokenizer's loading thread panicked".into()))?;
        Ok((model?, tok?))
    });
    // The weight store told the device that loading was over when the
    // weights were placed, while the file's metadata (a large vocabulary's
    // strings: tens of MB) and the tokenizer's build tables were still
    // alive; freed now, they are handed back too rather than staying
    // resident as free heap.
    drop(gguf);
    dev.release_load_memory();
    loaded
}

/// Greedy continuation: feed `prompt` (after whatever is cached) and return
/// the next `n` argmax tokens, without stopping at end-of-turn tokens. With
/// `gaps`, also the gap between the two largest logits at each step.
pub fn greedy(model: &mut Llama, prompt: &[u32], n: usize) -> Result<(Vec<u32>, Vec<f32>)> {
    let mut out = Vec::with_capacity(n);
    let mut gaps = Vec::with_capacity(n);
    let mut logits = model.forward(prompt)?;
    for i in 0..n {
        let id = sampling::argmax(&logits);
        let best = logits[id];
        let second = logits
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != id)
            .map(|(_, &l)| l)
            .fold(f32::NEG_INFINITY, f32::max);
        gaps.push(best - second);
        out.push(id as u32);
        if i + 1 < n {
            logits = model.forward(&[id as u32])?;
        }
    }
    Ok((out, gaps))
}
