//! The `thinker` stage: a user turn in, the answer out as streamed text
//! pieces, then an [`Event::Flush`] on the `done` port.
//!
//! The conversation is kept across turns (unless `history: false`) and the
//! KV cache keeps the longest prefix the new prompt shares with what is
//! cached, so a follow-up question prefills only its own tokens, and so
//! does the turn after a cancelled one. At start the stage prefills the
//! part of the chat template every prompt begins with (system prompt and
//! the user header), so the first turn does not pay for it. Cancelling an
//! epoch stops the decode loop at the next token, and `reset` drops that
//! turn from the conversation (its tokens leave the cache at the next
//! turn, which shares only the earlier prefix).

use crate::cards::{GGUF_FILE, SMOLLM2};
use crate::model::{Config, Llama};
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::{ChatMessage, TextTokenizer, Utf8Stream};
use crate::{Error, VarBuilder};
use edgeflow_graph::{
    BuildEnv, Epoch, Event, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType,
    Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use edgeflow_runtime::Device;
use std::time::Instant;

/// Output port index of the text pieces.
pub const OUT_TEXT: usize = 0;
/// Output port index of the end-of-turn [`Event::Flush`].
pub const OUT_DONE: usize = 1;

/// Factory of the `thinker` kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThinkerKind;

fn ports() -> Ports {
    Ports {
        inputs: vec![PortSpec::new(
            "in",
            PortType::Text,
            "a user turn (one message = one turn)",
        )],
        outputs: vec![
            PortSpec::new(
                "out",
                PortType::Text,
                "the answer, in pieces as they decode (each ends on a UTF-8 character boundary)",
            ),
            PortSpec::optional(
                "done",
                PortType::Control,
                "Event::Flush when a turn's answer is complete",
            ),
        ],
    }
}

impl StageFactory for ThinkerKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "thinker",
            doc: "LLM thinker: a llama or qwen2 GGUF model (default SmolLM2-135M-Instruct; \
                  Qwen2.5-Coder 0.5B / 1.5B Instruct by card name) \
                  answers each text turn with the model's chat template, streaming text pieces; \
                  stops within one token of a cancel.",
            params: vec![
                ParamInfo::optional(
                    "model",
                    ParamType::Path,
                    "a model card name (smollm2: fastest, weakest answers; qwen2.5-0.5b: \
                     answers factual questions, ~4x slower; qwen2.5-1.5b: best answers, ~3x slower \
                     again; `edgeflow models fetch NAME`) or a GGUF file (llama or qwen2 \
                     architecture); default smollm2",
                ),
                ParamInfo::new("max_tokens", ParamType::Int, 256, "most tokens per answer"),
                ParamInfo::new("temperature", ParamType::Float, 0.0, "0 = greedy; otherwise sampling temperature"),
                ParamInfo::new("top_k", ParamType::Int, 0, "sample among the k most likely tokens (0 = all)"),
                ParamInfo::new("top_p", ParamType::Float, 1.0, "nucleus sampling mass (1 = off)"),
                ParamInfo::new("repetition_penalty", ParamType::Float, 1.0, "> 1 discourages repeating context tokens (1 = off)"),
                ParamInfo::new("seed", ParamType::Int, 0, "seed of the sampling generator"),
                ParamInfo::new("system", ParamType::String, "", "system prompt (empty: the chat template's default)"),
                ParamInfo::new("history", ParamType::Bool, true, "keep the conversation across turns (false: every turn starts fresh)"),
                ParamInfo::new("dequantize", ParamType::Bool, false, "expand quantized weights to f32 at load (the transformers reference's arithmetic; about 5x the memory)"),
            ],
            ports: ports(),
            source: false,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let cfg = ThinkerConfig::from_params(p, env)?;
        let dev = env.open_device()?;
        Ok(Box::new(Thinker::new(&dev, cfg)?))
    }
}

/// Settings of a [`Thinker`].
#[derive(Debug, Clone, PartialEq)]
pub struct ThinkerConfig {
    /// The GGUF file.
    pub model: std::path::PathBuf,
    /// Most tokens per answer.
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplingParams,
    /// System prompt; empty = the template's default.
    pub system: String,
    /// Keep the conversation across turns.
    pub history: bool,
    /// Expand quantized weights to f32 at load (see [`Config::dequantize`]).
    pub dequantize: bool,
}

impl ThinkerConfig {
    /// Defaults with the cached SmolLM2 (errors when it is not cached).
    pub fn cached() -> Result<Self, Error> {
        Ok(ThinkerConfig {
            model: SMOLLM2.path(GGUF_FILE)?,
            max_tokens: 256,
            sampling: SamplingParams::default(),
            system: String::new(),
            history: true,
            dequantize: false,
        })
    }

    fn from_params(p: &Params, env: &BuildEnv) -> Result<Self, StageError> {
        let name: String = p.get_or("model", String::new())?;
        let model = match p.path("model", env)? {
            _ if crate::cards::card(&name).is_some() => crate::cards::gguf_path(&name)?,
            Some(m) if !m.is_file() => {
                return Err(p
                    .error(
                        "model",
                        format!(
                            "{} does not exist and is not a model card ({})",
                            m.display(),
                            crate::cards::names().join(", ")
                        ),
                    )
                    .into())
            }
            Some(m) => m,
            None => SMOLLM2.path(GGUF_FILE)?,
        };
        let max_tokens: i64 = p.get_or("max_tokens", 256)?;
        if max_tokens < 1 {
            return Err(p.error("max_tokens", "must be at least 1").into());
        }
        let top_k: i64 = p.get_or("top_k", 0)?;
        if top_k < 0 {
            return Err(p.error("top_k", "must be >= 0 (0 = off)").into());
        }
        let seed: i64 = p.get_or("seed", 0)?;
        let sampling = SamplingParams {
            temperature: p.get_or("temperature", 0.0)?,
            top_k: top_k as usize,
            top_p: p.get_or("top_p", 1.0)?,
            repetition_penalty: p.get_or("repetition_penalty", 1.0)?,
            seed: seed as u64,
        };
        sampling
            .validate()
            .map_err(|e| StageError::from(p.error("sampling", e.to_string())))?;
        Ok(ThinkerConfig {
            model,
            max_tokens: max_tokens as usize,
            sampling,
            system: p.get_or("system", String::new())?,
            history: p.get_or("history", true)?,
            dequantize: p.get_or("dequantize", false)?,
        })
    }
}

/// The thinker stage instance (see the module docs).
#[derive(Debug)]
pub struct Thinker {
    cfg: ThinkerConfig,
    model: Llama,
    tok: TextTokenizer,
    sampler: Sampler,
    /// The conversation, each message tagged with the epoch of its turn.
    messages: Vec<(Epoch, ChatMessage)>,
    /// Tokens whose keys/values are in the model's KV cache.
    cached: Vec<u32>,
}

impl Thinker {
    /// Load the model on `dev`.
    pub fn new(dev: &Device, cfg: ThinkerConfig) -> Result<Self, Error> {
        let gguf = edgeflow_runtime::weights::GgufFile::open(&cfg.model)?;
        let model_cfg = Config {
            dequantize: cfg.dequantize,
            ..Config::from_gguf(&gguf)?
        };
        let tok = TextTokenizer::from_gguf(&gguf)?;
        let model = Llama::load(&VarBuilder::from_reader(gguf, dev), &model_cfg)?;
        let sampler = Sampler::new(cfg.sampling)?;
        Ok(Thinker {
            cfg,
            model,
            tok,
            sampler,
            messages: Vec::new(),
            cached: Vec::new(),
        })
    }

    fn chat(&self) -> Vec<ChatMessage> {
        let mut v = Vec::with_capacity(self.messages.len() + 1);
        if !self.cfg.system.is_empty() {
            v.push(ChatMessage::new("system", &self.cfg.system));
        }
        v.extend(self.messages.iter().map(|(_, m)| m.clone()));
        v
    }

    /// Prompt tokens for the conversation, dropping the oldest turns when
    /// the prompt and the answer would not fit in the context.
    fn prompt(&mut self) -> Result<Vec<u32>, Error> {
        let ctx_len = self.model.config().context_length;
        loop {
            let ids = self
                .tok
                .encode(&self.tok.render_chat(&self.chat(), true)?)?;
            if ids.len() + self.cfg.max_tokens <= ctx_len {
                return Ok(ids);
            }
            if self.messages.len() <= 1 {
                return Err(Error::BadInput(format!(
                    "the prompt is {} tokens; with max_tokens {} it exceeds the model's context of {ctx_len}",
                    ids.len(),
                    self.cfg.max_tokens
                )));
            }
            // Drop the oldest exchange (user + assistant), keeping the
            // current user message (always the last).
            let n = if self.messages.len() >= 3 { 2 } else { 1 };
            self.messages.drain(..n);
        }
    }

    fn turn(&mut self, text: &str, ctx: &mut StageCtx) -> StageResult {
        let epoch = ctx.epoch();
        if !self.cfg.history {
            self.messages.clear();
        }
        self.messages.push((epoch, ChatMessage::new("user", text)));
        let ids = self.prompt()?;
        let t0 = Instant::now();
        // Keep the cached prefix the prompt shares; at least the last
        // prompt token is run again (its logits start the answer).
        let shared = common_prefix(&self.cached, &ids).min(ids.len() - 1);
        self.model.truncate(shared)?;
        self.cached.truncate(shared);
        let new = &ids[self.cached.len()..];
        let n_new = new.len();
        let mut logits = self.model.forward(new)?;
        self.cached = ids.clone();
        let prefill_s = t0.elapsed().as_secs_f64();
        ctx.record("prefill_tok_s", n_new as f64 / prefill_s.max(1e-9));
        ctx.record("prompt_tokens", n_new as f64);

        let mut stream = Utf8Stream::new();
        let mut answer = Vec::new();
        let mut first = true;
        let t1 = Instant::now();
        let mut decoded = 0usize;
        for _ in 0..self.cfg.max_tokens {
            ctx.check()?;
            let id = self.sampler.sample(&mut logits, &self.cached)?;
            if first {
                ctx.record("time_to_first_token_ms", t0.elapsed().as_secs_f64() * 1e3);
                first = false;
            }
            if id == self.tok.eos() || self.tok.is_control(id) {
                break;
            }
            answer.push(id);
            let piece = stream.push(self.tok.token_bytes(id));
            if !piece.is_empty() {
                ctx.emit(OUT_TEXT, Payload::text(piece))?;
            }
            if answer.len() == self.cfg.max_tokens
                || self.model.position() + 1 > self.model.config().context_length
            {
                break;
            }
            logits = self.model.forward(&[id])?;
            self.cached.push(id);
            decoded += 1;
        }
        let tail = stream.finish();
        if !tail.is_empty() {
            ctx.emit(OUT_TEXT, Payload::text(tail))?;
        }
        if decoded > 0 {
            ctx.record(
                "decode_tok_s",
                decoded as f64 / t1.elapsed().as_secs_f64().max(1e-9),
            );
        }
        ctx.record("answer_tokens", answer.len() as f64);
        self.messages.push((
            epoch,
            ChatMessage::new("assistant", &self.tok.decode(&answer)),
        ));
        ctx.emit(OUT_DONE, Payload::event(Event::Flush))
    }
}

impl Thinker {
    /// The tokens every prompt of this stage begins with: what two chats
    /// with different first user messages share (system prompt and the
    /// user header of the chat template).
    fn fixed_prefix(&self) -> Result<Vec<u32>, Error> {
        let render = |text: &str| -> Result<Vec<u32>, Error> {
            let mut chat = self.chat();
            chat.push(ChatMessage::new("user", text));
            self.tok.encode(&self.tok.render_chat(&chat, true)?)
        };
        let (a, b) = (render("a")?, render("z")?);
        Ok(a[..common_prefix(&a, &b)].to_vec())
    }

    /// Prefill [`Thinker::fixed_prefix`] into an empty cache.
    pub fn warm_up(&mut self) -> Result<(), Error> {
        if !self.cached.is_empty() || !self.messages.is_empty() {
            return Ok(());
        }
        let ids = self.fixed_prefix()?;
        if ids.is_empty() {
            return Ok(());
        }
        self.model.reset();
        self.model.forward(&ids)?;
        self.cached = ids;
        Ok(())
    }
}

/// Length of the longest common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Stage for Thinker {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        ctx.attach_device(self.model.device().stats().clone());
        let t0 = Instant::now();
        self.warm_up()?;
        ctx.record("warm_up_ms", t0.elapsed().as_secs_f64() * 1e3);
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let Some(text) = input.msg.payload.as_text() else {
            return Err(StageError::msg(format!(
                "thinker takes text turns, got {}",
                input.msg.payload.type_name()
            )));
        };
        let text = text.trim();
        if text.is_empty() {
            return ctx.emit(OUT_DONE, Payload::event(Event::Flush));
        }
        self.turn(text, ctx)
    }

    fn reset(&mut self, epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        // The cancelled turn's tokens stay cached until the next turn,
        // which keeps only the prefix its prompt shares (the earlier turns).
        self.messages.retain(|(e, _)| *e != epoch);
        self.sampler.reseed();
        Ok(())
    }
}
