//! Qwen2.5-Omni's codec talker (`Qwen2_5OmniTalkerForConditionalGeneration`
//! in `transformers`): a Qwen2 decoder that turns the thinker's reply into
//! speech codec tokens, one at a time, for token2wav.
//!
//! The model: `thinker_to_talker_proj` (a linear with bias, the thinker's
//! `embedding_size` to the talker's `hidden_size`) over input embeddings
//! that add the thinker's states to the talker's own codec embeddings
//! (`model.embed_tokens`, codec vocabulary x `embedding_size`), the shared
//! Qwen2 decoder stack ([`edgeflow_nn::Decoder`] under Hugging Face names:
//! biases on Q/K/V, a head size that need not be `hidden_size /
//! num_attention_heads`), `model.norm` and `codec_head` (no bias).
//!
//! Tensor names read (relative to the talker; the released checkpoint
//! nests them under `talker.`, so load it with `vb.pp("talker")`):
//! `thinker_to_talker_proj.{weight,bias}`, `model.embed_tokens.weight`,
//! `model.layers.N.{input_layernorm, self_attn.{q,k,v}_proj.{weight,bias},
//! self_attn.o_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}.weight`,
//! `model.norm.weight`, `codec_head.weight` (see [`weight_shapes`]).
//!
//! Positions: upstream rotates with the 3-section multimodal RoPE
//! (`mrope_section`, temporal / height / width rows of position ids). For
//! text and speech input the three rows are equal, and the sections then
//! reassemble one ordinary rotate-halves RoPE exactly (the reference
//! script checks this: `torch.equal`). This talker supports that case
//! only (thinker prompts of text and audio, no image or video grids), with
//! positions `0, 1, 2, ...` as upstream's rope index gives for them.
//! Sliding-window attention (off in the released configuration) is
//! rejected by [`Config::check`].
//!
//! Generation ([`Talker::start`], [`Talker::generate`]) builds the inputs
//! as `Qwen2_5OmniForConditionalGeneration.generate` does (see
//! [`TalkerInput`]) and samples with upstream's processors in upstream's
//! order: repetition penalty over every codec id in the sequence (the
//! prompt's mask / pad / bos ids included), the codec bos suppressed,
//! temperature, top-k, top-p ([`TalkerSampling`]).
//!
//! Real weights are not shipped: users bring the Qwen2.5-Omni checkpoint.
//! Parity with `transformers` is tested on a small random-initialised
//! configuration (`scripts/omni_talker_reference.py`,
//! `stages/omni/tests/talker.rs`).

use crate::{Error, Result};
use edgeflow_nn::{
    Decoder, DecoderConfig, DecoderNames, Embedding, Linear, QkvBias, RmsNorm, RopeLayout,
    RotaryEmbedding, VarBuilder, WeightFormat,
};
use edgeflow_runtime::rng::Xoshiro256;
use edgeflow_runtime::{Device, Tensor};
use serde::Deserialize;
use std::path::Path;

/// `rope_scaling` of the talker config (the released checkpoint has
/// `{"mrope_section": [16, 24, 24], "rope_type": "default"}`).
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(default)]
pub struct RopeScaling {
    /// `rope_type` (only `default` is supported).
    pub rope_type: Option<String>,
    /// `type`, the older spelling of `rope_type`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Rotary pairs per temporal / height / width section (they sum to
    /// `head_dim / 2`); equal position rows make them one plain RoPE.
    pub mrope_section: Option<Vec<usize>>,
}

/// The talker's hyper-parameters: `Qwen2_5OmniTalkerConfig`'s keys (the
/// `talker_config` of the Qwen2.5-Omni `config.json`), defaults as
/// upstream's. Keys the talker does not use are ignored.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Codec vocabulary (8448).
    pub vocab_size: usize,
    /// Width of the thinker states and of the codec embedding (3584).
    pub embedding_size: usize,
    /// Decoder width (3584 by default; the released 7B talker has 896).
    pub hidden_size: usize,
    /// MLP inner size (18944).
    pub intermediate_size: usize,
    /// Decoder layers (28).
    pub num_hidden_layers: usize,
    /// Query heads (28).
    pub num_attention_heads: usize,
    /// Key / value heads (4; `null` means as many as query heads).
    pub num_key_value_heads: Option<usize>,
    /// Size of one head (128), independent of `hidden_size`.
    pub head_dim: usize,
    /// MLP activation (`silu`, the only one supported).
    pub hidden_act: String,
    /// Positions the rotary tables cover (32768).
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon (1e-6).
    pub rms_norm_eps: f64,
    /// RoPE base (1e6).
    pub rope_theta: f64,
    /// RoPE variant and multimodal sections (None by default).
    pub rope_scaling: Option<RopeScaling>,
    /// Sliding-window attention (false; true is rejected when any layer
    /// would use it).
    pub use_sliding_window: bool,
    /// Window size (32768; read only with `use_sliding_window`).
    pub sliding_window: Option<usize>,
    /// Layers below this index use full attention (28).
    pub max_window_layers: usize,
    /// Per-layer attention kind (`full_attention` / `sliding_attention`);
    /// derived from the fields above when absent.
    pub layer_types: Option<Vec<String>>,
    /// Tie `codec_head` to the embedding (false; true is rejected).
    pub tie_word_embeddings: bool,
    /// Codec bos (`tts_codec_start_token_id`, 8293).
    pub tts_codec_start_token_id: u32,
    /// Codec end of speech (`tts_codec_end_token_id`, 8294).
    pub tts_codec_end_token_id: u32,
    /// Codec pad (`tts_codec_pad_token_id`, 8292).
    pub tts_codec_pad_token_id: u32,
    /// Codec mask, at the prompt's positions (`tts_codec_mask_token_id`, 8296).
    pub tts_codec_mask_token_id: u32,
    /// Thinker-vocabulary id whose embedding opens the text
    /// (`tts_text_start_token_id`, 151860; the speaker's `bos_token` is used
    /// in generation).
    pub tts_text_start_token_id: u32,
    /// Thinker-vocabulary id whose embedding ends the reply
    /// (`tts_text_end_token_id`, 151861): [`TalkerInput::text_eos`].
    pub tts_text_end_token_id: u32,
    /// Thinker-vocabulary id whose embedding pads after the reply
    /// (`tts_text_pad_token_id`, 151859): [`TalkerInput::text_pad`].
    pub tts_text_pad_token_id: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            vocab_size: 8448,
            embedding_size: 3584,
            hidden_size: 3584,
            intermediate_size: 18944,
            num_hidden_layers: 28,
            num_attention_heads: 28,
            num_key_value_heads: Some(4),
            head_dim: 128,
            hidden_act: "silu".into(),
            max_position_embeddings: 32768,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            rope_scaling: None,
            use_sliding_window: false,
            sliding_window: Some(32768),
            max_window_layers: 28,
            layer_types: None,
            tie_word_embeddings: false,
            tts_codec_start_token_id: 8293,
            tts_codec_end_token_id: 8294,
            tts_codec_pad_token_id: 8292,
            tts_codec_mask_token_id: 8296,
            tts_text_start_token_id: 151860,
            tts_text_end_token_id: 151861,
            tts_text_pad_token_id: 151859,
        }
    }
}

impl Config {
    /// Parse a talker config from JSON: either the talker's own object or
    /// a whole Qwen2.5-Omni `config.json` (its `talker_config` is read).
    /// The result is [`Config::check`]ed.
    pub fn from_json(json: &str) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| Error::BadInput(format!("talker config is not JSON: {e}")))?;
        let v = match v.get("talker_config") {
            Some(t) => t.clone(),
            None => v,
        };
        let cfg: Config = serde_json::from_value(v)
            .map_err(|e| Error::BadInput(format!("talker config: {e}")))?;
        cfg.check()?;
        Ok(cfg)
    }

    /// [`Config::from_json`] of a file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let s = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&s).map_err(|e| Error::bad_file(path, e.to_string()))
    }

    /// Key / value heads (`num_key_value_heads`, or the query heads when null).
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Codec ids that end generation by default: pad and end, as upstream's
    /// `talker_eos_token_id = [8292, 8294]`.
    pub fn stop_tokens(&self) -> Vec<u32> {
        vec![self.tts_codec_pad_token_id, self.tts_codec_end_token_id]
    }

    /// Reject values this talker cannot run, saying which and why.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::BadInput(format!("talker config: {m}")));
        if self.vocab_size == 0 || self.embedding_size == 0 || self.max_position_embeddings == 0 {
            return bad(format!(
                "vocab_size {}, embedding_size {} and max_position_embeddings {} must be positive",
                self.vocab_size, self.embedding_size, self.max_position_embeddings
            ));
        }
        if self.hidden_act != "silu" {
            return bad(format!(
                "hidden_act `{}` is not supported (only `silu`)",
                self.hidden_act
            ));
        }
        if self.tie_word_embeddings {
            return bad(
                "tie_word_embeddings = true is not supported (codec_head is its own weight)".into(),
            );
        }
        self.decoder_config(WeightFormat::Stored).check()?;
        for (name, id) in [
            ("tts_codec_start_token_id", self.tts_codec_start_token_id),
            ("tts_codec_end_token_id", self.tts_codec_end_token_id),
            ("tts_codec_pad_token_id", self.tts_codec_pad_token_id),
            ("tts_codec_mask_token_id", self.tts_codec_mask_token_id),
        ] {
            if id as usize >= self.vocab_size {
                return bad(format!(
                    "{name} {id} is outside the codec vocabulary of {}",
                    self.vocab_size
                ));
            }
        }
        if let Some(rs) = &self.rope_scaling {
            let kind = rs.rope_type.as_deref().or(rs.kind.as_deref());
            if let Some(k) = kind.filter(|k| *k != "default") {
                return bad(format!(
                    "rope_scaling type `{k}` is not supported (only `default`)"
                ));
            }
            if let Some(sec) = &rs.mrope_section {
                let sum: usize = sec.iter().sum();
                if sum != self.head_dim / 2 {
                    return bad(format!(
                        "mrope_section {sec:?} sums to {sum}, expected head_dim / 2 = {}",
                        self.head_dim / 2
                    ));
                }
            }
        }
        if let Some(types) = &self.layer_types {
            if types.len() != self.num_hidden_layers {
                return bad(format!(
                    "layer_types has {} entries for {} layers",
                    types.len(),
                    self.num_hidden_layers
                ));
            }
            if let Some(t) = types
                .iter()
                .find(|t| *t != "full_attention" && *t != "sliding_attention")
            {
                return bad(format!("unknown layer type `{t}`"));
            }
        }
        // Either way of asking for sliding layers is refused (upstream
        // derives layer_types from the other fields when it is absent).
        let sliding = self
            .layer_types
            .iter()
            .flatten()
            .any(|t| t == "sliding_attention")
            || (self.use_sliding_window && self.max_window_layers < self.num_hidden_layers);
        if sliding {
            return bad(
                "sliding-window attention is not implemented; use a configuration with \
                 use_sliding_window = false (the released one) or every layer `full_attention`"
                    .into(),
            );
        }
        Ok(())
    }

    fn decoder_config(&self, format: WeightFormat) -> DecoderConfig {
        DecoderConfig {
            n_layer: self.num_hidden_layers,
            d_model: self.hidden_size,
            n_head: self.num_attention_heads,
            n_kv_head: self.kv_heads(),
            head_dim: self.head_dim,
            ffn: self.intermediate_size,
            rms_eps: self.rms_norm_eps,
            format,
            qkv_bias: QkvBias::Required,
        }
    }
}

/// Every tensor [`Talker::load`] reads, with its shape, under upstream's
/// names relative to the talker (prefix them with `talker.` for the
/// released checkpoint's names).
pub fn weight_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (e, h, f, v) = (
        cfg.embedding_size,
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.vocab_size,
    );
    let (q, kv) = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.kv_heads() * cfg.head_dim,
    );
    let mut out = vec![
        ("thinker_to_talker_proj.weight".to_string(), vec![h, e]),
        ("thinker_to_talker_proj.bias".to_string(), vec![h]),
        ("model.embed_tokens.weight".to_string(), vec![v, e]),
    ];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        for (n, dims) in [
            ("input_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![q, h]),
            ("self_attn.q_proj.bias", vec![q]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.k_proj.bias", vec![kv]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.bias", vec![kv]),
            ("self_attn.o_proj.weight", vec![h, q]),
            ("post_attention_layernorm.weight", vec![h]),
            ("mlp.gate_proj.weight", vec![f, h]),
            ("mlp.up_proj.weight", vec![f, h]),
            ("mlp.down_proj.weight", vec![h, f]),
        ] {
            out.push((format!("{p}.{n}"), dims));
        }
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    out.push(("codec_head.weight".to_string(), vec![v, h]));
    out
}

/// The codec talker with its KV cache.
#[derive(Debug)]
pub struct Talker {
    cfg: Config,
    dev: Device,
    proj: Linear,
    embed: Embedding,
    decoder: Decoder,
    norm: RmsNorm,
    head: Linear,
    rope: RotaryEmbedding,
    pos: usize,
}

impl Talker {
    /// Load the talker from `vb` (names as in the module docs; pass
    /// `vb.pp("talker")` for the released checkpoint) with every weight as
    /// f32 (bf16 checkpoints are widened: the arithmetic of the f32
    /// reference).
    pub fn load(vb: &VarBuilder, cfg: &Config) -> Result<Self> {
        Self::load_with_format(vb, cfg, WeightFormat::F32)
    }

    /// [`Talker::load`] keeping the projection weights in `format`
    /// ([`WeightFormat::Stored`]: f16 / bf16 / quantized as in the file).
    /// Norms, biases and the codec embedding are f32 in every case.
    pub fn load_with_format(vb: &VarBuilder, cfg: &Config, format: WeightFormat) -> Result<Self> {
        cfg.check()?;
        let dev = vb.device().clone();
        let (e, h, v) = (cfg.embedding_size, cfg.hidden_size, cfg.vocab_size);
        let linear = |p: &VarBuilder, i: usize, o: usize, bias: bool| -> Result<Linear> {
            Ok(Linear::load_as(p, i, o, bias, format)?)
        };
        let m = vb.pp("model");
        let decoder = Decoder::load(
            &m.pp("layers"),
            &cfg.decoder_config(format),
            &DecoderNames::HF,
        )?;
        let rope = RotaryEmbedding::new(
            cfg.head_dim,
            cfg.max_position_embeddings,
            cfg.rope_theta,
            RopeLayout::Halves,
        )?;
        Ok(Talker {
            cfg: cfg.clone(),
            proj: linear(&vb.pp("thinker_to_talker_proj"), e, h, true)?,
            embed: Embedding::new(m.pp("embed_tokens").get_f32("weight", &[v, e])?),
            decoder,
            norm: RmsNorm::load(&m.pp("norm"), h, cfg.rms_norm_eps)?,
            head: linear(&vb.pp("codec_head"), h, v, false)?,
            rope,
            pos: 0,
            dev,
        })
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The device the talker runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Positions already in the KV cache.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes of weights read per step (decoder, norm, projection, head).
    pub fn weight_bytes_per_token(&self) -> usize {
        self.decoder.weight_bytes_per_token()
            + self.norm.weight().size_bytes()
            + self.proj.size_bytes()
            + self.head.size_bytes()
    }

    /// Forget the KV cache.
    pub fn reset(&mut self) {
        self.decoder.reset();
        self.pos = 0;
    }

    /// Codec embeddings of `codes`: `[1, n, embedding_size]`, to add to
    /// thinker states before [`Talker::step`].
    pub fn embed_codes(&self, codes: &[u32]) -> Result<Tensor> {
        if codes.is_empty() {
            return Err(Error::BadInput("embed_codes of zero codes".into()));
        }
        if let Some(&c) = codes.iter().find(|&&c| c as usize >= self.cfg.vocab_size) {
            return Err(Error::BadInput(format!(
                "codec id {c} is outside the talker's vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        let ids = Tensor::from_i64(
            codes.iter().map(|&c| i64::from(c)).collect(),
            &[codes.len()],
        )?;
        let x = self.embed.forward(&self.dev, &ids)?;
        Ok(self
            .dev
            .reshape(&x, &[1, codes.len(), self.cfg.embedding_size])?)
    }

    /// Run `inputs_embeds[1, s, embedding_size]` (thinker states plus codec
    /// embeddings, before `thinker_to_talker_proj`) after what is cached,
    /// append them to the KV cache and return the codec logits (length
    /// `vocab_size`) after the last row.
    pub fn step(&mut self, inputs_embeds: &Tensor) -> Result<Vec<f32>> {
        let e = self.cfg.embedding_size;
        let s = match inputs_embeds.dims() {
            &[1, s, d] if s > 0 && d == e => s,
            other => {
                return Err(Error::BadInput(format!(
                    "talker step takes inputs_embeds [1, seq >= 1, {e}] (embedding_size), got {other:?}"
                )))
            }
        };
        if self.pos + s > self.cfg.max_position_embeddings {
            return Err(Error::BadInput(format!(
                "talker context full: {} cached + {s} new positions exceed max_position_embeddings {}",
                self.pos, self.cfg.max_position_embeddings
            )));
        }
        let dev = self.dev.clone();
        dev.batch(|| self.step_ops(inputs_embeds, s))
    }

    fn step_ops(&mut self, inputs_embeds: &Tensor, s: usize) -> Result<Vec<f32>> {
        let dev = &self.dev;
        let x = self.proj.forward(dev, inputs_embeds)?;
        let rope = self.rope.at(dev, self.pos, s)?;
        let x = self.decoder.forward(dev, &x, &rope)?;
        let last = dev.narrow(&x, 1, s - 1, 1)?;
        let last = self.norm.forward(dev, &last)?;
        let logits = self.head.forward(dev, &last)?;
        let logits = dev.to_host(&logits)?.to_vec_f32()?;
        self.pos += s;
        Ok(logits)
    }

    /// Reset and prefill the talker with `input` (see [`TalkerInput`]);
    /// the session then yields codec tokens one at a time.
    pub fn start(
        &mut self,
        input: &TalkerInput,
        params: TalkerSampling,
    ) -> Result<TalkerSession<'_>> {
        params.check()?;
        let e = self.cfg.embedding_size;
        let prompt_len = input.check(e)?;
        let (pad, bos, mask) = (
            self.cfg.tts_codec_pad_token_id,
            self.cfg.tts_codec_start_token_id,
            self.cfg.tts_codec_mask_token_id,
        );
        let dev = self.dev.clone();
        let reply_len = input.reply.dims()[1];
        // Upstream: inputs_embeds = [prompt, text_bos, reply[0]], then
        // (in the talker's first forward) += codec pad on the second-last
        // row and codec bos on the last.
        let first = dev.narrow(&input.reply, 1, 0, 1)?;
        let tail = dev.concat(&[&input.text_bos, &first], 1)?;
        let tail = dev.add(&tail, &self.embed_codes(&[pad, bos])?)?;
        let x = dev.concat(&[&input.prompt, &tail], 1)?;
        // Upstream's thinker_reply_part: reply[1:], text_eos, text_pad; each
        // step takes its first row and drops it while more than one is left.
        let mut rest: Vec<&Tensor> = Vec::with_capacity(3);
        let later;
        if reply_len > 1 {
            later = dev.narrow(&input.reply, 1, 1, reply_len - 1)?;
            rest.push(&later);
        }
        rest.push(&input.text_eos);
        rest.push(&input.text_pad);
        let queue = dev.concat(&rest, 1)?;
        self.reset();
        let logits = self.step(&x)?;
        let mut history = vec![mask; prompt_len];
        history.extend([pad, bos]);
        let stop = params
            .stop_tokens
            .clone()
            .unwrap_or_else(|| self.cfg.stop_tokens());
        Ok(TalkerSession {
            rng: Xoshiro256::new(params.seed),
            params,
            stop,
            suppress: vec![bos],
            queue_len: queue.dims()[1],
            queue,
            queue_at: 0,
            history,
            prompt_codes: prompt_len + 2,
            logits,
            pending: None,
            finished: false,
            talker: self,
        })
    }

    /// Generate codec tokens for `input` until a stop token (not returned)
    /// or `params.max_new_tokens`, calling `on_code` with each as it comes
    /// and `cancel` before each: a `true` ends the run with
    /// [`Error::Cancelled`] (`steps` = codes produced).
    ///
    /// Upstream passes `talker_result[:, prompt_len:-1]` to token2wav,
    /// dropping the last code whether or not it is a stop token; here only
    /// a stop token is left out (a run ended by `max_new_tokens` keeps its
    /// last code).
    pub fn generate(
        &mut self,
        input: &TalkerInput,
        params: TalkerSampling,
        mut cancel: impl FnMut() -> bool,
        mut on_code: impl FnMut(u32),
    ) -> Result<Vec<u32>> {
        let total = params.max_new_tokens;
        let mut session = self.start(input, params)?;
        loop {
            if cancel() {
                return Err(Error::Cancelled {
                    steps: session.codes().len(),
                    total,
                });
            }
            match session.next_code()? {
                Some(c) => on_code(c),
                None => return Ok(session.codes().to_vec()),
            }
        }
    }
}

/// What the thinker hands the talker, as
/// `Qwen2_5OmniForConditionalGeneration.generate` builds it: every tensor
/// is `[1, n, embedding_size]` (the thinker's hidden size).
#[derive(Debug, Clone)]
pub struct TalkerInput {
    /// One row per prompt position: the thinker's last-layer hidden state
    /// plus its input embedding (`thinker_hidden_states[0] +
    /// thinker_token_embeds[0]`; upstream zeroes the embedding rows of
    /// audio / image / video placeholder tokens first).
    pub prompt: Tensor,
    /// `[1, 1, E]`: the thinker's embedding of the speaker's text bos token
    /// (`speaker_params["bos_token"]`).
    pub text_bos: Tensor,
    /// One row per reply token fed back to the thinker (so every reply
    /// token but the last): its last hidden state plus its embedding
    /// (`thinker_reply_part`); at least one row.
    pub reply: Tensor,
    /// `[1, 1, E]`: the thinker's embedding of `tts_text_end_token_id`.
    pub text_eos: Tensor,
    /// `[1, 1, E]`: the thinker's embedding of `tts_text_pad_token_id`.
    pub text_pad: Tensor,
}

impl TalkerInput {
    /// Check the shapes; returns the prompt length.
    fn check(&self, e: usize) -> Result<usize> {
        let rows = |name: &str, t: &Tensor, one: bool| -> Result<usize> {
            match t.dims() {
                &[1, n, d] if d == e && n >= 1 && (!one || n == 1) => Ok(n),
                other => Err(Error::BadInput(format!(
                    "talker input `{name}` is {other:?}, expected [1, {}, {e}] (embedding_size {e})",
                    if one { "1" } else { "n >= 1" }
                ))),
            }
        };
        let n = rows("prompt", &self.prompt, false)?;
        rows("reply", &self.reply, false)?;
        rows("text_bos", &self.text_bos, true)?;
        rows("text_eos", &self.text_eos, true)?;
        rows("text_pad", &self.text_pad, true)?;
        Ok(n)
    }
}

/// How the talker picks codes; the defaults are upstream's talker
/// defaults in `Qwen2_5OmniForConditionalGeneration.generate`.
#[derive(Debug, Clone, PartialEq)]
pub struct TalkerSampling {
    /// Sample (true) or take the most likely code (false).
    pub do_sample: bool,
    /// Logits are divided by it when sampling (0.9); > 0.
    pub temperature: f32,
    /// Keep the `top_k` most likely codes, ties included (40; 0 = all).
    pub top_k: usize,
    /// Keep the smallest set of codes whose probability exceeds `top_p`
    /// (0.8; 1 = all).
    pub top_p: f32,
    /// HF repetition penalty over every codec id in the sequence (1.05).
    pub repetition_penalty: f32,
    /// Most codes to generate (4096).
    pub max_new_tokens: usize,
    /// Codes that end generation; None = the config's pad and end
    /// ([`Config::stop_tokens`]).
    pub stop_tokens: Option<Vec<u32>>,
    /// Seed of the sampling generator.
    pub seed: u64,
}

impl Default for TalkerSampling {
    fn default() -> Self {
        TalkerSampling {
            do_sample: true,
            temperature: 0.9,
            top_k: 40,
            top_p: 0.8,
            repetition_penalty: 1.05,
            max_new_tokens: 4096,
            stop_tokens: None,
            seed: 0,
        }
    }
}

impl TalkerSampling {
    /// Greedy decoding (upstream's `do_sample=False`), other fields default.
    pub fn greedy() -> Self {
        TalkerSampling {
            do_sample: false,
            ..Default::default()
        }
    }

    /// Reject out-of-range values.
    pub fn check(&self) -> Result<()> {
        if self.do_sample && !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return Err(Error::BadInput(format!(
                "talker temperature must be > 0 when sampling, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::BadInput(format!(
                "talker top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(Error::BadInput(format!(
                "talker repetition_penalty must be > 0 (1 = off), got {}",
                self.repetition_penalty
            )));
        }
        if self.max_new_tokens == 0 {
            return Err(Error::BadInput(
                "talker max_new_tokens must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Upstream's logits processors in upstream's order, in place: the
/// repetition penalty over the distinct ids of `history` (negative logits
/// multiplied, others divided), `suppress` set to -inf, then, when
/// sampling, temperature, top-k (codes below the k-th largest value set to
/// -inf) and top-p (codes, smallest first, whose cumulative probability
/// stays within `1 - top_p` set to -inf; the most likely always kept).
pub fn process_logits(logits: &mut [f32], history: &[u32], suppress: &[u32], p: &TalkerSampling) {
    if p.repetition_penalty != 1.0 {
        let mut seen = vec![false; logits.len()];
        for &t in history {
            let t = t as usize;
            if t < logits.len() && !seen[t] {
                seen[t] = true;
                let l = &mut logits[t];
                *l = if *l < 0.0 {
                    *l * p.repetition_penalty
                } else {
                    *l / p.repetition_penalty
                };
            }
        }
    }
    for &t in suppress {
        if let Some(l) = logits.get_mut(t as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
    if !p.do_sample {
        return;
    }
    if p.temperature != 1.0 {
        logits.iter_mut().for_each(|l| *l /= p.temperature);
    }
    if p.top_k > 0 && p.top_k < logits.len() {
        let mut sorted = logits.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[p.top_k - 1];
        logits
            .iter_mut()
            .filter(|l| **l < kth)
            .for_each(|l| *l = f32::NEG_INFINITY);
    }
    if p.top_p < 1.0 {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[a].total_cmp(&logits[b]));
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f64> = order
            .iter()
            .map(|&i| f64::from(logits[i] - max).exp())
            .collect();
        let total: f64 = exps.iter().sum();
        let mut cum = 0.0;
        let cut = 1.0 - f64::from(p.top_p);
        let last = order.len().saturating_sub(1);
        for (rank, (&i, &x)) in order.iter().zip(&exps).enumerate() {
            cum += x / total;
            if cum <= cut && rank < last {
                logits[i] = f32::NEG_INFINITY;
            }
        }
    }
}

/// Index of the largest value; the first on ties (torch's argmax).
fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}

/// A generation in progress ([`Talker::start`]): codes one at a time with
/// [`TalkerSession::next_code`].
#[derive(Debug)]
pub struct TalkerSession<'a> {
    talker: &'a mut Talker,
    params: TalkerSampling,
    stop: Vec<u32>,
    suppress: Vec<u32>,
    rng: Xoshiro256,
    /// `thinker_reply_part` still to feed, `[1, queue_len, E]`.
    queue: Tensor,
    queue_len: usize,
    queue_at: usize,
    /// Codec ids of the sequence (prompt's mask / pad / bos, then codes).
    history: Vec<u32>,
    prompt_codes: usize,
    logits: Vec<f32>,
    /// The last code, not fed yet (fed when the next one is asked for).
    pending: Option<u32>,
    finished: bool,
}

impl TalkerSession<'_> {
    /// The next codec token, or None at a stop token (then
    /// [`Self::finished`]) or after `max_new_tokens` codes.
    pub fn next_code(&mut self) -> Result<Option<u32>> {
        if self.finished || self.codes().len() >= self.params.max_new_tokens {
            return Ok(None);
        }
        if let Some(code) = self.pending.take() {
            // Upstream: codec embedding of the last code plus the first row
            // of what is left of the reply.
            let dev = self.talker.dev.clone();
            let row = dev.narrow(&self.queue, 1, self.queue_at, 1)?;
            if self.queue_at + 1 < self.queue_len {
                self.queue_at += 1;
            }
            let x = dev.add(&self.talker.embed_codes(&[code])?, &row)?;
            self.logits = self.talker.step(&x)?;
        }
        let mut l = self.logits.clone();
        process_logits(&mut l, &self.history, &self.suppress, &self.params);
        let code = if self.params.do_sample {
            self.draw(&l)?
        } else {
            argmax(&l) as u32
        };
        if self.stop.contains(&code) {
            self.finished = true;
            return Ok(None);
        }
        self.history.push(code);
        self.pending = Some(code);
        Ok(Some(code))
    }

    /// A code drawn from the processed logits `l` (softmax over the finite ones).
    fn draw(&mut self, l: &[f32]) -> Result<u32> {
        let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return Err(Error::BadInput(
                "talker: every codec logit was filtered out or is not finite".into(),
            ));
        }
        let probs: Vec<f64> = l
            .iter()
            .map(|&x| {
                if x.is_finite() {
                    f64::from(x - max).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let total: f64 = probs.iter().sum();
        let u = self.rng.next_open01() * total;
        let mut cum = 0.0;
        let mut last = 0;
        for (i, &p) in probs.iter().enumerate() {
            if p > 0.0 {
                cum += p;
                last = i;
                if u < cum {
                    return Ok(i as u32);
                }
            }
        }
        Ok(last as u32)
    }

    /// Codes generated so far (no stop token).
    pub fn codes(&self) -> &[u32] {
        &self.history[self.prompt_codes..]
    }

    /// The raw codec logits the latest code was picked from (before the
    /// penalty and filters), or those of the next pick before the first.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Whether a stop token ended the generation.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The talker (its position, config).
    pub fn talker(&self) -> &Talker {
        self.talker
    }
}
