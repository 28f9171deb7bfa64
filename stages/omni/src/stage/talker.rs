//! The `talker` stage kind: Qwen2.5-Omni's codec talker. The thinker's
//! hidden states in (the `states` port of the `thinker` stage: per turn one
//! tensor for the prompt, then one for the reply), codec tokens out, one
//! message per token as it is sampled, then an `Event::Flush` on the same
//! port (so it cannot overtake the last codes); cancellable before every
//! token.
//!
//! Inputs, per turn, as `edgeflow-llm`'s thinker emits them:
//! 1. `[1, n_prompt + 3, E]`: for each prompt token its last hidden state
//!    plus its input embedding, then the thinker's input embeddings of the
//!    TTS text bos, eos and pad tokens;
//! 2. `[1, n_reply, E]`: the same rows for the reply tokens.
//!
//! `E` is the thinker's width, the talker's `embedding_size`.

use super::source::{random_notice, Source};
use crate::talker::{self, Config, Talker, TalkerInput, TalkerSampling};
use crate::{Error, Result};
use edgeflow_graph::{
    BuildEnv, Epoch, Event, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType,
    Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use edgeflow_runtime::{Device, Tensor};
use std::sync::Arc;
use std::time::Instant;

/// The small random configuration (`model: random-small`): the real codec
/// vocabulary and special tokens on a 2-layer, 256-wide decoder fed by a
/// thinker `embedding_size` wide.
pub fn small_config(embedding_size: usize) -> Config {
    Config {
        embedding_size,
        hidden_size: 256,
        intermediate_size: 768,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: Some(2),
        head_dim: 64,
        max_window_layers: 2,
        ..Config::default()
    }
}

/// Load the talker of `source` on `dev`.
pub fn load(source: &Source, embedding_size: usize, dev: &Device) -> Result<Talker> {
    let cfg = match source {
        Source::RandomSmall => small_config(embedding_size),
        Source::RandomReal => {
            return Err(Error::BadInput(
                "the talker offers random-small only (the real talker's width depends on the checkpoint's thinker); set model_dir to a Qwen2.5-Omni checkpoint folder for the real one".into(),
            ))
        }
        Source::Dir(dir) => Config::from_file(dir.join("config.json"))?,
    };
    let vb = source.var_builder("talker", talker::weight_shapes(&cfg), 3, dev)?;
    Talker::load(&vb, &cfg)
}

/// The `talker` stage kind.
#[derive(Debug)]
pub struct TalkerKind;

impl StageFactory for TalkerKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "talker",
            doc: "Qwen2.5-Omni's codec talker on the edgeflow runtime (device: cpu, gpu or npu): the thinker's hidden states in (the thinker's `states` port: per turn the prompt's rows with the TTS text bos/eos/pad embeddings, then the reply's rows), codec tokens out one message per token as sampled (temperature, top-k, top-p, repetition penalty), then a flush; a cancel stops it before the next token. Without model_dir it runs a small random configuration (says so at start). Records time_to_first_code_ms, codes and codes_per_s.",
            params: vec![
                ParamInfo::new("model", ParamType::String, "random-small", "random-small (a small random configuration): no Qwen2.5-Omni weights are shipped"),
                ParamInfo::optional("model_dir", ParamType::InputPath, "a Qwen2.5-Omni checkpoint folder (config.json, *.safetensors): runs the real talker"),
                ParamInfo::new("embedding_size", ParamType::Int, 896, "width of the thinker's states for random-small (896: Qwen2.5-0.5B, 576: SmolLM2-135M); a checkpoint's config says its own"),
                ParamInfo::new("greedy", ParamType::Bool, false, "take the most likely code instead of sampling"),
                ParamInfo::new("temperature", ParamType::Float, 0.9, "sampling temperature"),
                ParamInfo::new("top_k", ParamType::Int, 40, "keep the k most likely codes (0: all)"),
                ParamInfo::new("top_p", ParamType::Float, 0.8, "keep the most likely codes up to this probability mass"),
                ParamInfo::new("repetition_penalty", ParamType::Float, 1.05, "penalty on codes already in the sequence (1: off)"),
                ParamInfo::new("max_codes", ParamType::Int, 1000, "most codes per turn (20 ms each)"),
                ParamInfo::new("codebook", ParamType::Int, 8193, "codes at or above this are not speech codes (the DiT's codebook size) and are dropped, counted as dropped_codes"),
                ParamInfo::new("seed", ParamType::Int, 0, "seed of the sampler"),
            ],
            ports: Ports {
                inputs: vec![PortSpec::new(
                    "in",
                    PortType::Tensor,
                    "the thinker's states: [1, n_prompt + 3, E] then [1, n_reply, E] per turn",
                )],
                // One port for the codes and the end of the turn, so the
                // flush cannot overtake the last codes.
                outputs: vec![PortSpec::new(
                    "out",
                    PortType::Any,
                    "codec tokens, one per message, then Event::Flush after a turn's last code (what `dit` takes)",
                )],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> std::result::Result<Box<dyn Stage>, StageError> {
        let source = Source::from_params(p, env)?;
        if source == Source::RandomReal {
            return Err(p
                .error(
                    "model",
                    "the talker offers random-small only (the real talker's width depends on the checkpoint's thinker); set model_dir to a Qwen2.5-Omni checkpoint folder for the real one",
                )
                .into());
        }
        let embedding_size: usize = p.get_or("embedding_size", 896usize)?;
        if !(1..=65_536).contains(&embedding_size) {
            return Err(p
                .error(
                    "embedding_size",
                    format!("must be in 1..=65536, got {embedding_size}"),
                )
                .into());
        }
        let max_codes: usize = p.get_or("max_codes", 1000usize)?;
        let top_k: usize = p.get_or("top_k", 40usize)?;
        let sampling = TalkerSampling {
            do_sample: !p.get_or("greedy", false)?,
            temperature: p.get_or("temperature", 0.9f32)?,
            top_k,
            top_p: p.get_or("top_p", 0.8f32)?,
            repetition_penalty: p.get_or("repetition_penalty", 1.05f32)?,
            max_new_tokens: max_codes,
            stop_tokens: None,
            seed: p.get_or("seed", 0u64)?,
        };
        if let Err(e) = sampling.check() {
            return Err(p.error("temperature", e.to_string()).into());
        }
        let codebook: u32 = p.get_or("codebook", 8193u32)?;
        let dev = env.open_device()?;
        if let Some(line) = random_notice(&env.stage_id, "codec talker", &source) {
            eprintln!("{line}");
        }
        let model = load(&source, embedding_size, &dev)?;
        Ok(Box::new(TalkerStage {
            model,
            sampling,
            codebook,
            prompt: None,
        }))
    }
}

/// The `talker` stage.
#[derive(Debug)]
struct TalkerStage {
    model: Talker,
    sampling: TalkerSampling,
    codebook: u32,
    /// This turn's prompt rows and the three TTS text rows, until the reply.
    prompt: Option<Tensor>,
}

impl TalkerStage {
    /// Split the first tensor of a turn into the prompt and the three TTS
    /// text rows, and run the talker over the reply.
    fn turn(&mut self, prompt: &Tensor, reply: &Tensor, ctx: &mut StageCtx) -> StageResult {
        let dev = self.model.device().clone();
        let n = prompt.dims()[1];
        let row = |i: usize| dev.narrow(prompt, 1, i, 1);
        let input = TalkerInput {
            prompt: dev.narrow(prompt, 1, 0, n - 3)?,
            text_bos: row(n - 3)?,
            text_eos: row(n - 2)?,
            text_pad: row(n - 1)?,
            reply: reply.clone(),
        };
        let started = Instant::now();
        let (mut sent, mut dropped) = (0usize, 0usize);
        let mut session = self.model.start(&input, self.sampling.clone())?;
        // A cancel is seen before every token.
        while !ctx.is_cancelled() {
            let Some(code) = session.next_code()? else {
                break;
            };
            if code >= self.codebook {
                dropped += 1;
                continue;
            }
            if sent == 0 {
                ctx.record(
                    "time_to_first_code_ms",
                    started.elapsed().as_secs_f64() * 1e3,
                );
            }
            sent += 1;
            ctx.emit(0, Payload::Tokens(Arc::from([code].as_slice())))?;
        }
        ctx.check()?;
        let secs = started.elapsed().as_secs_f64();
        ctx.record("codes", sent as f64);
        if dropped > 0 {
            ctx.record("dropped_codes", dropped as f64);
        }
        if sent > 0 {
            ctx.record("codes_per_s", sent as f64 / secs);
        }
        super::record_precision(ctx, self.model.device());
        ctx.emit(0, Payload::event(Event::Flush))
    }
}

impl Stage for TalkerStage {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        ctx.attach_device(self.model.device().stats().clone());
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        match &input.msg.payload {
            Payload::Tensor(t) => {
                let e = self.model.config().embedding_size;
                let n = match t.dims() {
                    &[1, n, d] if d == e => n,
                    other => {
                        return Err(StageError::msg(format!(
                            "talker `{}`: thinker states must be [1, rows, {e}] (the talker's embedding_size is {e}: the thinker's width), got {other:?}",
                            ctx.id()
                        )))
                    }
                };
                match self.prompt.take() {
                    None => {
                        if n < 4 {
                            return Err(StageError::msg(format!(
                                "talker `{}`: a turn's first tensor must hold at least one prompt row and the 3 TTS text rows, got {n} rows",
                                ctx.id()
                            )));
                        }
                        self.prompt = Some(t.clone());
                        Ok(())
                    }
                    Some(prompt) => self.turn(&prompt, t, ctx),
                }
            }
            Payload::Event(_) => Ok(()),
            other => Err(StageError::msg(format!(
                "talker `{}` got a {} message; it takes the thinker's states (tensors from the thinker's `states` port)",
                ctx.id(),
                other.type_name()
            ))),
        }
    }

    fn reset(&mut self, _epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        self.prompt = None;
        self.model.reset();
        Ok(())
    }
}
