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
//!
//! With `emit_states: true` the stage also hands Qwen2.5-Omni's codec
//! talker (the `talker` stage of `edgeflow-omni`, see its `TalkerInput`)
//! what it needs: per turn, after the answer and before the `done` Flush,
//! two tensors on the `states` port (host f32, rows of width `d_model`; a
//! "state row" is `norm(h) + embed(token)`, see [`Llama::forward_states`]):
//!
//! 1. `[1, n_prompt + 3, d_model]`: the state rows of this turn's prompt
//!    (the chat-templated tokens after the part the previous completed
//!    turn's tokens already cover; the whole prompt, system prompt and
//!    template included, when the conversation has no earlier turn), then
//!    the input embeddings of `tts_text_bos`, `tts_text_eos` and
//!    `tts_text_pad` (the talker's `text_bos`, `text_eos`, `text_pad`);
//! 2. `[1, n_reply, d_model]`: the state rows of the reply tokens as they
//!    were fed back to the model, i.e. every generated token but the last
//!    (the end-of-turn token, or the answer's last token when `max_tokens`
//!    or the context ended it) — upstream's `thinker_reply_part`. When no
//!    generated token was fed back (the answer ended at its first token)
//!    there is no state to give; the one row is then the input embedding
//!    of that first generated token alone (no hidden-state part), so the
//!    talker still gets the one reply row it needs.
//!
//! The state rows of cached tokens are kept (host memory, `d_model` f32 a
//! token) so a prompt's rows are not recomputed; none of this runs without
//! `emit_states`. An empty turn emits only the Flush.

use crate::cards::{GGUF_FILE, SMOLLM2};
use crate::model::{Config, Llama};
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::{ChatMessage, TextTokenizer, Utf8Stream};
use crate::Error;
use edgeflow_graph::{
    BuildEnv, Epoch, Event, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType,
    Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use edgeflow_runtime::{Device, Tensor};
use std::time::Instant;

/// Output port index of the text pieces.
pub const OUT_TEXT: usize = 0;
/// Output port index of the end-of-turn [`Event::Flush`].
pub const OUT_DONE: usize = 1;
/// Output port index of the talker's states (with `emit_states`; see the
/// module docs).
pub const OUT_STATES: usize = 2;

/// Qwen2.5-Omni's `tts_text_start_token_id` (default of `tts_text_bos`).
pub const TTS_TEXT_BOS: u32 = 151_860;
/// Qwen2.5-Omni's `tts_text_end_token_id` (default of `tts_text_eos`).
pub const TTS_TEXT_EOS: u32 = 151_861;
/// Qwen2.5-Omni's `tts_text_pad_token_id` (default of `tts_text_pad`).
pub const TTS_TEXT_PAD: u32 = 151_859;

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
            PortSpec::optional(
                "states",
                PortType::Tensor,
                "with emit_states, per turn before the Flush, for the talker stage of \
                 edgeflow-omni: [1, n_prompt + 3, d_model] (this turn's prompt rows \
                 norm(last hidden) + embedding, then the embeddings of tts_text_bos / eos / pad), \
                 then [1, n_reply, d_model] (the rows of the reply tokens fed back)",
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
                  stops within one token of a cancel. With emit_states, also hands \
                  Qwen2.5-Omni's talker (edgeflow-omni) the thinker's states on `states`.",
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
                ParamInfo::new("emit_states", ParamType::Bool, false, "emit the talker's states on `states` each turn (two tensors before the Flush; costs one host row of d_model f32 per cached token)"),
                ParamInfo::new("tts_text_bos", ParamType::Int, i64::from(TTS_TEXT_BOS), "with emit_states: token whose embedding opens the talker's text (Qwen2.5-Omni's tts_text_start_token_id); must be in the vocabulary"),
                ParamInfo::new("tts_text_eos", ParamType::Int, i64::from(TTS_TEXT_EOS), "with emit_states: token whose embedding ends the talker's text (tts_text_end_token_id); must be in the vocabulary"),
                ParamInfo::new("tts_text_pad", ParamType::Int, i64::from(TTS_TEXT_PAD), "with emit_states: token whose embedding pads the talker's text (tts_text_pad_token_id); must be in the vocabulary"),
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
    /// Emit the talker's states on [`OUT_STATES`] (see the module docs).
    pub emit_states: bool,
    /// With `emit_states`: the tokens whose embeddings follow the prompt's
    /// rows (`tts_text_bos`, `tts_text_eos`, `tts_text_pad`); each must be
    /// in the model's vocabulary.
    pub tts_text: [u32; 3],
}

/// The parameter names of [`ThinkerConfig::tts_text`], in order.
const TTS_TEXT_PARAMS: [&str; 3] = ["tts_text_bos", "tts_text_eos", "tts_text_pad"];

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
            emit_states: false,
            tts_text: [TTS_TEXT_BOS, TTS_TEXT_EOS, TTS_TEXT_PAD],
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
        let mut tts_text = [TTS_TEXT_BOS, TTS_TEXT_EOS, TTS_TEXT_PAD];
        for (slot, name) in tts_text.iter_mut().zip(TTS_TEXT_PARAMS) {
            let v: i64 = p.get_or(name, i64::from(*slot))?;
            *slot = u32::try_from(v).map_err(|_| {
                StageError::from(p.error(name, "must be a token id (0 to 2^32 - 1)"))
            })?;
        }
        Ok(ThinkerConfig {
            model,
            max_tokens: max_tokens as usize,
            sampling,
            system: p.get_or("system", String::new())?,
            history: p.get_or("history", true)?,
            dequantize: p.get_or("dequantize", false)?,
            emit_states: p.get_or("emit_states", false)?,
            tts_text,
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
    /// With `emit_states`: the state row of each cached token
    /// (`cached.len() * d_model` values).
    states: Vec<f32>,
    /// With `emit_states`: the tokens of the conversation after the last
    /// completed turn (its prompt and the reply tokens fed back).
    earlier: Vec<u32>,
}

impl Thinker {
    /// Load the model on `dev`.
    pub fn new(dev: &Device, cfg: ThinkerConfig) -> Result<Self, Error> {
        let gguf = edgeflow_runtime::weights::GgufFile::open(&cfg.model)?;
        let model_cfg = Config {
            dequantize: cfg.dequantize,
            ..Config::from_gguf(&gguf)?
        };
        if cfg.emit_states {
            for (&id, name) in cfg.tts_text.iter().zip(TTS_TEXT_PARAMS) {
                if id as usize >= model_cfg.vocab {
                    return Err(Error::BadInput(format!(
                        "`{name}` is {id}, outside the vocabulary of {} tokens of {}: with \
                         emit_states, set `{name}` to a token id of this model (the defaults are \
                         Qwen2.5-Omni's)",
                        model_cfg.vocab,
                        cfg.model.display()
                    )));
                }
            }
        }
        let (model, tok) = crate::load_gguf(gguf, &model_cfg, dev)?;
        let sampler = Sampler::new(cfg.sampling)?;
        Ok(Thinker {
            cfg,
            model,
            tok,
            sampler,
            messages: Vec::new(),
            cached: Vec::new(),
            states: Vec::new(),
            earlier: Vec::new(),
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
        let want_states = self.cfg.emit_states;
        let d = self.model.config().d_model;
        let t0 = Instant::now();
        // Keep the cached prefix the prompt shares; at least the last
        // prompt token is run again (its logits start the answer).
        let shared = common_prefix(&self.cached, &ids).min(ids.len() - 1);
        self.model.truncate(shared)?;
        self.cached.truncate(shared);
        self.states.truncate(shared * d);
        let new = &ids[self.cached.len()..];
        let n_new = new.len();
        let mut logits = self.feed(new)?;
        self.cached = ids.clone();
        let prefill_s = t0.elapsed().as_secs_f64();
        ctx.record("prefill_tok_s", n_new as f64 / prefill_s.max(1e-9));
        ctx.record("prompt_tokens", n_new as f64);

        let mut stream = Utf8Stream::new();
        let mut answer = Vec::new();
        let mut first = true;
        let t1 = Instant::now();
        let mut decoded = 0usize;
        let mut first_id = None;
        for _ in 0..self.cfg.max_tokens {
            ctx.check()?;
            let id = self.sampler.sample(&mut logits, &self.cached)?;
            first_id.get_or_insert(id);
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
            logits = self.feed(&[id])?;
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
        if want_states {
            let (prompt, reply) = self.talker_states(&ids, first_id)?;
            ctx.emit(OUT_STATES, Payload::Tensor(prompt))?;
            ctx.emit(OUT_STATES, Payload::Tensor(reply))?;
            self.earlier = self.cached.clone();
        }
        ctx.emit(OUT_DONE, Payload::event(Event::Flush))
    }

    /// Run `tokens` after the cache; with `emit_states`, keep their state
    /// rows in step with the cache.
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, Error> {
        if !self.cfg.emit_states {
            return self.model.forward(tokens);
        }
        let (logits, rows) = self.model.forward_states(tokens)?;
        self.states.extend_from_slice(&rows.to_vec_f32()?);
        Ok(logits)
    }

    /// The two tensors of the `states` port for the turn whose prompt was
    /// `ids` (see the module docs); the reply's rows are those of the
    /// tokens cached after the prompt. `first_id` is the first generated
    /// token.
    fn talker_states(&self, ids: &[u32], first_id: Option<u32>) -> Result<(Tensor, Tensor), Error> {
        let d = self.model.config().d_model;
        let n = ids.len();
        if self.states.len() != self.cached.len() * d || self.cached.get(..n) != Some(ids) {
            return Err(Error::BadInput(format!(
                "thinker states out of step: {} rows for {} cached tokens",
                self.states.len() / d.max(1),
                self.cached.len()
            )));
        }
        // Rows the previous completed turn already covered are left out;
        // with no earlier turn in the conversation, the whole prompt.
        let from = if self.messages.len() > 2 {
            common_prefix(&self.earlier, ids).min(n.saturating_sub(1))
        } else {
            0
        };
        let mut prompt = self.states[from * d..n * d].to_vec();
        prompt.extend(self.model.embed_tokens(&self.cfg.tts_text)?.to_vec_f32()?);
        let prompt = Tensor::from_vec(prompt, &[1, n - from + 3, d])?;
        let fed = self.cached.len() - n;
        let reply = if fed > 0 {
            Tensor::from_slice(&self.states[n * d..], &[1, fed, d])?
        } else {
            let id = first_id.ok_or_else(|| {
                Error::BadInput("a turn ended before its first token was sampled".into())
            })?;
            self.model.embed_tokens(&[id])?
        };
        Ok((prompt, reply))
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

    /// Prefill the fixed prefix (`Thinker::fixed_prefix`) into an empty cache.
    pub fn warm_up(&mut self) -> Result<(), Error> {
        if !self.cached.is_empty() || !self.messages.is_empty() {
            return Ok(());
        }
        let ids = self.fixed_prefix()?;
        if ids.is_empty() {
            return Ok(());
        }
        self.model.reset();
        self.states.clear();
        self.feed(&ids)?;
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
