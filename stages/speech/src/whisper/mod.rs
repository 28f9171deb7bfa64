//! Whisper speech recognition: the log-mel front end of `edgeflow-audio`,
//! the model in [`model`], and greedy decoding that follows faster-whisper
//! with `beam_size=1, temperature=0, without_timestamps=True`:
//!
//! - features of the whole utterance (`padding` 160 samples), cut into
//!   windows of 3000 frames, each zero-padded to 3000 (`pad_or_trim`);
//! - prompt `[<|startofprev|> previous tokens…] <|startoftranscript|>
//!   <|notimestamps|>` (tiny.en has no language or task token);
//! - CTranslate2's greedy search: `suppress_ids` from `config.json`
//!   (faster-whisper's default `suppress_tokens=[-1]` gives the same set)
//!   masked at every step, `suppress_ids_begin` (blank, `<|endoftext|>`) at
//!   the first step, at most 448 tokens in all;
//! - a window is skipped (no text) when the no-speech probability at
//!   `<|startoftranscript|>` exceeds 0.6 and the average log-probability is
//!   below -1.
//!
//! Temperature fallback (re-decoding a window by random sampling when it
//! looks repetitive) is not done: decoding is deterministic.

pub mod model;
pub mod tokenizer;

use crate::{Error, Result};
use edgeflow_audio::mel::{LogMel, HOP, SAMPLE_RATE};
use edgeflow_nn::VarBuilder;
use edgeflow_runtime::Device;
pub use model::{DecoderState, Whisper, WhisperConfig};
use std::path::Path;
use std::time::Instant;
pub use tokenizer::{SpecialTokens, WhisperTokenizer};

/// Mel frames per 30 s window.
const WINDOW_FRAMES: usize = 3000;

/// Decoding options (faster-whisper's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeOptions {
    /// Skip a window whose no-speech probability is above this (and whose
    /// average log-probability is below `log_prob_threshold`).
    pub no_speech_threshold: Option<f32>,
    /// See `no_speech_threshold`.
    pub log_prob_threshold: Option<f32>,
    /// Prompt each window with the text of the previous ones.
    pub condition_on_previous_text: bool,
    /// Limit on tokens generated per window (`None`: up to the 448-token context).
    pub max_new_tokens: Option<usize>,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            no_speech_threshold: Some(0.6),
            log_prob_threshold: Some(-1.0),
            condition_on_previous_text: true,
            max_new_tokens: None,
        }
    }
}

/// The result of transcribing one utterance.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcript {
    /// The text, trimmed.
    pub text: String,
    /// Generated text tokens of every window, in order.
    pub tokens: Vec<u32>,
    /// Windows decoded (30 s each).
    pub windows: usize,
    /// Seconds spent in the front end, the encoder and the decoder.
    pub mel_s: f64,
    /// See `mel_s`.
    pub encode_s: f64,
    /// See `mel_s`.
    pub decode_s: f64,
}

/// Whisper with its tokenizer, suppression lists and front end.
#[derive(Debug)]
pub struct Transcriber {
    model: Whisper,
    tokenizer: WhisperTokenizer,
    mel: LogMel,
    suppress: Vec<u32>,
    suppress_begin: Vec<u32>,
    /// Decoding options.
    pub options: DecodeOptions,
}

fn id_list(v: &serde_json::Value, key: &str, path: &Path) -> Result<Vec<u32>> {
    v.get(key)
        .and_then(|a| a.as_array())
        .ok_or_else(|| Error::bad_model(path, format!("no `{key}` list")))?
        .iter()
        .map(|x| {
            x.as_u64()
                .map(|x| x as u32)
                .ok_or_else(|| Error::bad_model(path, format!("`{key}` holds a non-integer: {x}")))
        })
        .collect()
}

fn log_softmax_at(logits: &[f32], i: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    ((logits[i] - max) as f64 - sum.ln()) as f32
}

impl Transcriber {
    /// Load a CTranslate2 Whisper directory (`model.bin`, `config.json`,
    /// `tokenizer.json`) onto `dev`.
    pub fn load(dir: &Path, dev: &Device) -> Result<Self> {
        let vb = VarBuilder::open(&[dir.join("model.bin")], dev)?.with_separator("/");
        let model = Whisper::load(&vb, &WhisperConfig::from_weights(&vb)?)?;
        let tokenizer = WhisperTokenizer::load(&dir.join("tokenizer.json"))?;
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
        let cfg: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::bad_model(&cfg_path, format!("not JSON: {e}")))?;
        let suppress = id_list(&cfg, "suppress_ids", &cfg_path)?;
        let suppress_begin = id_list(&cfg, "suppress_ids_begin", &cfg_path)?;
        let vocab = model.config().vocab as u32;
        if let Some(bad) = suppress
            .iter()
            .chain(&suppress_begin)
            .find(|&&t| t >= vocab)
        {
            return Err(Error::bad_model(
                &cfg_path,
                format!("suppressed token {bad} is outside the vocabulary ({vocab})"),
            ));
        }
        Ok(Transcriber {
            model,
            tokenizer,
            mel: LogMel::new(),
            suppress,
            suppress_begin,
            options: DecodeOptions::default(),
        })
    }

    /// The model.
    pub fn model(&self) -> &Whisper {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &WhisperTokenizer {
        &self.tokenizer
    }

    /// Transcribe 16 kHz mono `samples`. `cancelled` is polled before every
    /// decoder step; when it returns true, decoding stops with
    /// [`Error::Cancelled`].
    pub fn transcribe(
        &mut self,
        samples: &[f32],
        cancelled: &mut dyn FnMut() -> bool,
    ) -> Result<Transcript> {
        let t0 = Instant::now();
        let (feats, frames) = self.mel.compute(samples, HOP);
        let n_mels = self.model.config().n_mels;
        let content = frames.saturating_sub(1);
        let mel_s = t0.elapsed().as_secs_f64();
        let mut out = Transcript {
            text: String::new(),
            tokens: Vec::new(),
            windows: 0,
            mel_s,
            encode_s: 0.0,
            decode_s: 0.0,
        };
        let mut all_tokens: Vec<u32> = Vec::new();
        let mut text = String::new();
        let mut seek = 0;
        while seek < content {
            let size = WINDOW_FRAMES.min(content - seek);
            let mut window = vec![0f32; n_mels * WINDOW_FRAMES];
            for m in 0..n_mels {
                let src = &feats[m * frames + seek..m * frames + seek + size];
                window[m * WINDOW_FRAMES..m * WINDOW_FRAMES + size].copy_from_slice(src);
            }
            let t1 = Instant::now();
            let enc = self.model.encode(&window)?;
            out.encode_s += t1.elapsed().as_secs_f64();
            let t2 = Instant::now();
            let prev: &[u32] = if self.options.condition_on_previous_text {
                &all_tokens
            } else {
                &[]
            };
            let tokens = self.decode_window(&enc, prev, cancelled)?;
            out.decode_s += t2.elapsed().as_secs_f64();
            out.windows += 1;
            text.push_str(&self.tokenizer.decode(&tokens));
            all_tokens.extend_from_slice(&tokens);
            seek += size;
        }
        out.text = text.trim().to_string();
        out.tokens = all_tokens;
        Ok(out)
    }

    /// Greedy decoding of one encoded window; returns the text tokens
    /// (empty when the window is judged silent).
    fn decode_window(
        &self,
        enc: &edgeflow_runtime::Tensor,
        previous: &[u32],
        cancelled: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<u32>> {
        let sp = self.tokenizer.special();
        let max_length = self.model.config().n_text_ctx;
        let mut prompt = Vec::new();
        if !previous.is_empty() {
            prompt.push(sp.sot_prev);
            let keep = max_length / 2 - 1;
            prompt.extend_from_slice(&previous[previous.len().saturating_sub(keep)..]);
        }
        let sot_index = prompt.len();
        prompt.push(sp.sot);
        prompt.push(sp.no_timestamps);
        let limit = match self.options.max_new_tokens {
            Some(n) => (prompt.len() + n).min(max_length),
            None => max_length,
        };

        let mut st = self.model.start(enc)?;
        let mut logits = self
            .model
            .decode(&mut st, &prompt, &[sot_index, prompt.len() - 1])?;
        let mut last = logits.pop().unwrap_or_default();
        let at_sot = logits.pop().unwrap_or_default();
        let no_speech_prob = if at_sot.is_empty() {
            0.0
        } else {
            log_softmax_at(&at_sot, sp.no_speech as usize).exp()
        };

        let mut tokens = Vec::new();
        let mut sum_logprob = 0f64;
        let mut step = 0;
        loop {
            if cancelled() {
                return Err(Error::Cancelled);
            }
            for &t in &self.suppress {
                last[t as usize] = f32::NEG_INFINITY;
            }
            if step == 0 {
                for &t in &self.suppress_begin {
                    last[t as usize] = f32::NEG_INFINITY;
                }
            }
            let (best, _) =
                last.iter()
                    .enumerate()
                    .fold((0usize, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
                        if v > bv {
                            (i, v)
                        } else {
                            (bi, bv)
                        }
                    });
            sum_logprob += log_softmax_at(&last, best) as f64;
            let best = best as u32;
            if best == sp.eot {
                break;
            }
            tokens.push(best);
            step += 1;
            if prompt.len() + tokens.len() >= limit {
                break;
            }
            last = self
                .model
                .decode(&mut st, &[best], &[0])?
                .pop()
                .unwrap_or_default();
        }
        let n = tokens.len();
        // faster-whisper: avg_logprob = cumulative logprob / (len + 1).
        let avg_logprob = if n == 0 {
            0.0
        } else {
            (sum_logprob / (n as f64 + 1.0)) as f32
        };
        if let Some(th) = self.options.no_speech_threshold {
            let below = self
                .options
                .log_prob_threshold
                .is_none_or(|lp| avg_logprob <= lp);
            if no_speech_prob > th && below {
                return Ok(Vec::new());
            }
        }
        Ok(tokens)
    }
}

/// Whisper's input rate.
pub const WHISPER_SAMPLE_RATE: u32 = SAMPLE_RATE;
