//! The `text_encoder` stage: each text in, its sentence embedding out.
//!
//! Instructions repeat (the same one every control episode), so embeddings
//! are kept in a bounded least-recently-used cache keyed by the token ids
//! the model reads (at most `max_seq_length` of them, however long the
//! text): a repeated text costs one tokenization.

use crate::cards::MINILM_L6;
use crate::Encoder;
use edgeflow_graph::{
    BuildEnv, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType, Ports, Stage,
    StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use edgeflow_runtime::Tensor;
use std::collections::HashMap;
use std::time::Instant;

/// Default number of distinct texts whose embeddings are kept.
pub const DEFAULT_CACHE: usize = 64;

/// The `text_encoder` stage kind.
#[derive(Debug)]
pub struct TextEncoderKind;

impl StageFactory for TextEncoderKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "text_encoder",
            doc: "Sentence embedding of each text (all-MiniLM-L6-v2 by default, as sentence-transformers: WordPiece, BERT, mean pooling, L2 normalisation): a [384] f32 tensor, stamped like its text. Texts past 256 tokens are cut there; an empty or blank text is an error. Repeated texts come from a bounded cache. Records `text_encoder_ms` (computed ones), `text_encoder_cache_hit` (0 or 1), `text_encoder_tokens`, `text_encoder_truncated` (0 or 1).",
            params: vec![
                ParamInfo::optional("model", ParamType::InputPath, "sentence-transformers folder (config.json, model.safetensors, tokenizer.json, modules.json, sentence_bert_config.json, pooling config); default: minilm-l6 in the model cache"),
                ParamInfo::new("cache", ParamType::Int, DEFAULT_CACHE as u64, "distinct texts whose embeddings are kept (least recently used dropped first); 0 turns the cache off"),
            ],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Text, "texts to embed (an instruction)")],
                outputs: vec![PortSpec::new("out", PortType::Tensor, "the embedding of each text, [dim] f32 (384 for minilm-l6), unit length")],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let dir = match p.path("model", env)? {
            Some(d) => d,
            None => MINILM_L6.locate()?,
        };
        let cap: i64 = p.get_or("cache", DEFAULT_CACHE as i64)?;
        let cap = usize::try_from(cap)
            .ok()
            .filter(|&c| c <= 1 << 20)
            .ok_or_else(|| p.error("cache", format!("must be in [0, 1048576], got {cap}")))?;
        let dev = env.open_device()?;
        let encoder = Encoder::load(&dir, &dev)?;
        Ok(Box::new(TextEncoderStage {
            encoder,
            cache: EmbeddingCache::new(cap),
        }))
    }
}

/// The `text_encoder` stage.
#[derive(Debug)]
pub struct TextEncoderStage {
    encoder: Encoder,
    cache: EmbeddingCache,
}

impl TextEncoderStage {
    /// Over a loaded encoder, keeping up to `cache` embeddings.
    pub fn new(encoder: Encoder, cache: usize) -> Self {
        TextEncoderStage {
            encoder,
            cache: EmbeddingCache::new(cache),
        }
    }

    /// The embedding of `text` as a `[dim]` tensor, from the cache when the
    /// same ids were embedded before. A blank text is an error.
    pub fn embed(&mut self, text: &str) -> crate::Result<(Tensor, Metrics)> {
        if text.trim().is_empty() {
            return Err(crate::Error::BadInput(format!(
                "text_encoder got an empty text ({} bytes of whitespace): an instruction \
                 must name the goal; send a non-blank text",
                text.len()
            )));
        }
        let enc = self.encoder.tokenize(text)?;
        let mut m = Metrics {
            tokens: enc.ids.len(),
            truncated: enc.truncated,
            ms: None,
        };
        if let Some(t) = self.cache.get(&enc.ids) {
            return Ok((t, m));
        }
        let t0 = Instant::now();
        let v = self.encoder.embed_ids(&enc.ids)?;
        m.ms = Some(t0.elapsed().as_secs_f64() * 1e3);
        let dim = v.len();
        let t = Tensor::from_vec(v, &[dim])?;
        self.cache.put(enc.ids, t.clone());
        Ok((t, m))
    }
}

/// What one [`TextEncoderStage::embed`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    /// Ids the model read (or would have), `[CLS]` and `[SEP]` included.
    pub tokens: usize,
    /// The text was cut at `max_seq_length` tokens.
    pub truncated: bool,
    /// Milliseconds of the forward pass; `None` for a cache hit.
    pub ms: Option<f64>,
}

impl Stage for TextEncoderStage {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        ctx.attach_device(self.encoder.device().stats().clone());
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let Payload::Text(text) = &input.msg.payload else {
            return Err(StageError::msg(format!(
                "text_encoder takes text, got {}",
                input.msg.payload.type_name()
            )));
        };
        let (t, m) = self.embed(text)?;
        ctx.record(
            "text_encoder_cache_hit",
            f64::from(u8::from(m.ms.is_none())),
        );
        ctx.record("text_encoder_tokens", m.tokens as f64);
        ctx.record("text_encoder_truncated", f64::from(u8::from(m.truncated)));
        if let Some(ms) = m.ms {
            ctx.record("text_encoder_ms", ms);
        }
        ctx.emit(0, Payload::Tensor(t))
    }
}

/// Embeddings by token ids, least recently used dropped first.
#[derive(Debug)]
struct EmbeddingCache {
    cap: usize,
    tick: u64,
    map: HashMap<Vec<u32>, (Tensor, u64)>,
}

impl EmbeddingCache {
    fn new(cap: usize) -> Self {
        EmbeddingCache {
            cap,
            tick: 0,
            map: HashMap::new(),
        }
    }

    fn get(&mut self, ids: &[u32]) -> Option<Tensor> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(ids).map(|(t, used)| {
            *used = tick;
            t.clone()
        })
    }

    fn put(&mut self, ids: Vec<u32>, t: Tensor) {
        if self.cap == 0 {
            return;
        }
        if self.map.len() >= self.cap && !self.map.contains_key(&ids) {
            // A linear scan: the cache holds a few dozen instructions.
            if let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            {
                self.map.remove(&oldest);
            }
        }
        self.tick += 1;
        self.map.insert(ids, (t, self.tick));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(x: f32) -> Tensor {
        Tensor::from_vec(vec![x], &[1]).expect("tensor")
    }

    #[test]
    fn the_cache_is_bounded_and_drops_the_least_recently_used() {
        let mut c = EmbeddingCache::new(2);
        c.put(vec![1], t(1.0));
        c.put(vec![2], t(2.0));
        assert!(c.get(&[1]).is_some());
        c.put(vec![3], t(3.0));
        assert_eq!(c.len(), 2);
        assert!(c.get(&[2]).is_none(), "2 was the least recently used");
        assert!(c.get(&[1]).is_some() && c.get(&[3]).is_some());
        let mut off = EmbeddingCache::new(0);
        off.put(vec![1], t(1.0));
        assert!(off.get(&[1]).is_none());
    }
}
