//! Thinker throughput: prefill and decode tokens/s, and the weight bandwidth
//! decode achieves (bytes of weights read per token / time per token), to
//! compare with the machine's memory-bandwidth ceiling and llama.cpp.

use crate::model::Llama;
use crate::tokenizer::{ChatMessage, TextTokenizer};
use crate::{sampling, Error, Result};
use edgeflow_runtime::{Device, DeviceSpec};
use std::path::PathBuf;
use std::time::Instant;

/// What [`bench`] runs.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// GGUF file; `None` = the cached SmolLM2.
    pub model: Option<PathBuf>,
    /// Placement.
    pub device: DeviceSpec,
    /// Prompt length for the prefill measurement.
    pub prompt_tokens: usize,
    /// Tokens decoded for the decode measurement.
    pub decode_tokens: usize,
    /// Repetitions; the median is reported.
    pub runs: usize,
    /// Expand quantized weights to f32 at load (see [`crate::Config::dequantize`]).
    pub dequantize: bool,
    /// After the timed runs, time every op of one more decode and report
    /// the N costliest (op, input shapes) rows (0: off).
    pub profile_ops: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            model: None,
            device: DeviceSpec::Cpu,
            prompt_tokens: 128,
            decode_tokens: 64,
            runs: 3,
            dequantize: false,
            profile_ops: 0,
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Measure prefill and decode throughput on `dev` (opened for
/// `o.device`); returns a readable report.
///
/// The prompt is a chat turn asking to continue a long text, cut to
/// `prompt_tokens`; decode runs greedily for `decode_tokens` without
/// stopping at end-of-turn tokens, so every run does the same work.
pub fn bench(o: &BenchOptions, dev: &Device) -> Result<String> {
    if o.prompt_tokens == 0 || o.decode_tokens == 0 || o.runs == 0 {
        return Err(Error::BadInput(
            "prompt_tokens, decode_tokens and runs must be at least 1".into(),
        ));
    }
    let path = match &o.model {
        Some(p) => p.clone(),
        None => crate::cards::SMOLLM2.path(crate::cards::GGUF_FILE)?,
    };
    let t = Instant::now();
    let gguf = edgeflow_runtime::weights::GgufFile::open(&path)?;
    let cfg = crate::Config {
        dequantize: o.dequantize,
        ..crate::Config::from_gguf(&gguf)?
    };
    let tok = TextTokenizer::from_gguf(&gguf)?;
    let mut model = Llama::load(&crate::VarBuilder::from_reader(gguf, dev), &cfg)?;
    let load_s = t.elapsed().as_secs_f64();
    let filler = "The history of the printing press begins in the fifteenth century, when \
                  movable type changed how books were made, sold and read across Europe. ";
    let text = tok.render_chat(
        &[ChatMessage::new(
            "user",
            &filler.repeat(o.prompt_tokens / 10 + 2),
        )],
        true,
    )?;
    let mut ids = tok.encode(&text)?;
    ids.truncate(o.prompt_tokens);

    let (mut pre, mut dec) = (Vec::new(), Vec::new());
    for _ in 0..o.runs {
        model.reset();
        let t = Instant::now();
        let mut logits = model.forward(&ids)?;
        pre.push(ids.len() as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for _ in 0..o.decode_tokens {
            let id = sampling::argmax(&logits) as u32;
            logits = model.forward(&[id])?;
        }
        dec.push(o.decode_tokens as f64 / t.elapsed().as_secs_f64());
    }
    let profile = if o.profile_ops > 0 {
        // One more decode with every op timed (the timing itself costs a
        // little, so the timed runs above go without it).
        model.reset();
        let mut logits = model.forward(&ids)?;
        dev.stats().profile_ops(true);
        for _ in 0..o.decode_tokens {
            let id = sampling::argmax(&logits) as u32;
            logits = model.forward(&[id])?;
        }
        let rows = dev.stats().op_profile();
        dev.stats().profile_ops(false);
        format!(
            "decode of {} tokens, {}",
            o.decode_tokens,
            edgeflow_runtime::render_op_profile(&rows, o.profile_ops)
        )
    } else {
        String::new()
    };
    let (pre, dec) = (median(pre), median(dec));
    let bytes = model.weight_bytes_per_token() as f64;
    let gbs = bytes * dec / 1e9;
    let c = model.config();
    Ok(format!(
        "thinker bench: {} on {}{}\n\
         model: {} layers, d={}, {} heads / {} KV heads, vocab {}; {:.1} MB of weights, loaded in {:.2} s\n\
         prefill: {:.1} tokens/s ({} prompt tokens, median of {})\n\
         decode:  {:.1} tokens/s ({:.2} ms/token, {} tokens after the prompt, median of {})\n\
         decode weight bandwidth: {:.2} GB/s ({:.1} MB read per token)\n{}",
        path.display(),
        o.device,
        if o.dequantize { " (weights dequantized to f32)" } else { "" },
        c.n_layer,
        c.d_model,
        c.n_head,
        c.n_kv_head,
        c.vocab,
        model.weight_bytes() as f64 / 1e6,
        load_s,
        pre,
        ids.len(),
        o.runs,
        dec,
        1e3 / dec,
        o.decode_tokens,
        o.runs,
        gbs,
        bytes / 1e6,
        profile,
    ))
}
