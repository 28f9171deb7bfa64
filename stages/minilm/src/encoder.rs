//! [`Encoder`]: text to one sentence embedding, as sentence-transformers'
//! `SentenceTransformer.encode` does with the folder's modules: the
//! tokenizer (truncating at `max_seq_length`), the BERT encoder, pooling
//! over the attention mask (mean for all-MiniLM-L6-v2), then L2
//! normalisation when the folder lists a `Normalize` module.

use crate::cards::{MINILM_L6, POOLING_CONFIG};
use crate::model::{BertModel, Config};
use crate::tokenizer::{Encoding, Tokenizer};
use crate::{Error, Result};
use edgeflow_nn::VarBuilder;
use edgeflow_runtime::{Device, Tensor};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// How token states become one vector (the `Pooling` module's mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Mean over the tokens the attention mask keeps (`[CLS]` and `[SEP]`
    /// included), as `pooling_mode_mean_tokens`.
    Mean,
    /// The first token's state (`pooling_mode_cls_token`).
    Cls,
    /// Element-wise maximum over the kept tokens (`pooling_mode_max_tokens`).
    Max,
}

/// One text's embedding and how it was tokenized.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// The embedding, [`Encoder::dim`] values (unit length when the model
    /// normalises).
    pub vector: Vec<f32>,
    /// The token ids the model read, `[CLS]` and `[SEP]` included.
    pub ids: Vec<u32>,
    /// The text was longer than `max_seq_length` tokens: its tail was cut.
    pub truncated: bool,
}

/// A sentence-transformers model of the BERT family: tokenizer, encoder,
/// pooling and normalisation, loaded from a folder laid out like
/// sentence-transformers' (`config.json`, `model.safetensors`,
/// `tokenizer.json`, `modules.json`, `sentence_bert_config.json`, the
/// pooling config) or like the `minilm-l6` card's cache folder.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu)?;
/// let enc = edgeflow_minilm::Encoder::from_cache(&dev)?;
/// let v = enc.embed("push the red block onto the green target")?;
/// assert_eq!(v.len(), 384);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Encoder {
    tokenizer: Tokenizer,
    model: BertModel,
    max_seq_length: usize,
    do_lower_case: bool,
    pooling: Pooling,
    normalize: bool,
    pad_id: u32,
}

impl Encoder {
    /// The `minilm-l6` model from the model cache (`edgeflow models fetch
    /// minilm-l6` puts it there), on `dev`.
    pub fn from_cache(dev: &Device) -> Result<Self> {
        Self::load(&MINILM_L6.locate()?, dev)
    }

    /// Load the model in folder `dir` onto `dev`.
    pub fn load(dir: &Path, dev: &Device) -> Result<Self> {
        let file = |name: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(Error::bad_model(
                    &p,
                    format!(
                        "missing; a sentence-transformers folder has {name} \
                         (`edgeflow models fetch {}` makes one in the model cache)",
                        MINILM_L6.name
                    ),
                ))
            }
        };
        let cfg = Config::from_file(&file("config.json")?)?;
        let tokenizer = Tokenizer::from_file(&file("tokenizer.json")?)?;
        if tokenizer.vocab_size() > cfg.vocab_size {
            return Err(Error::bad_model(
                &dir.join("tokenizer.json"),
                format!(
                    "has {} tokens, more than the model's {} embedding rows",
                    tokenizer.vocab_size(),
                    cfg.vocab_size
                ),
            ));
        }
        let modules = Modules::read(&file("modules.json")?)?;
        let sbert = file("sentence_bert_config.json")?;
        let st: SbertConfig = read_json(&sbert)?;
        let max_seq_length = st.max_seq_length.min(cfg.max_position_embeddings);
        if max_seq_length <= tokenizer.num_special_tokens() {
            return Err(Error::bad_model(
                &sbert,
                format!(
                    "max_seq_length {} leaves no room for text",
                    st.max_seq_length
                ),
            ));
        }
        let pooling = match &modules.pooling {
            Some(sub) => {
                let upstream = dir.join(sub).join("config.json");
                let p = if upstream.is_file() {
                    upstream
                } else {
                    file(POOLING_CONFIG)?
                };
                read_json::<PoolingConfig>(&p)?
                    .mode()
                    .map_err(|m| Error::bad_model(&p, m))?
            }
            None => {
                return Err(Error::bad_model(
                    &dir.join("modules.json"),
                    "lists no Pooling module: nothing turns token states into one vector",
                ))
            }
        };
        let vb = VarBuilder::open(&[file("model.safetensors")?], dev)?;
        let model = BertModel::load(&vb, &cfg)?;
        Ok(Encoder {
            pad_id: tokenizer.token_to_id("[PAD]").unwrap_or(0),
            tokenizer,
            model,
            max_seq_length,
            do_lower_case: st.do_lower_case,
            pooling,
            normalize: modules.normalize,
        })
    }

    /// Values per embedding (`hidden_size`, 384).
    pub fn dim(&self) -> usize {
        self.model.config().hidden_size
    }

    /// The longest token sequence read; longer texts are cut (256).
    pub fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    /// The pooling mode.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether embeddings are scaled to unit length.
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The BERT encoder.
    pub fn model(&self) -> &BertModel {
        &self.model
    }

    /// The device the encoder runs on.
    pub fn device(&self) -> &Device {
        self.model.device()
    }

    /// The ids the model reads for `text` (what [`Self::embed`] feeds it).
    pub fn tokenize(&self, text: &str) -> Result<Encoding> {
        if self.do_lower_case {
            self.tokenizer
                .encode(&text.to_lowercase(), self.max_seq_length)
        } else {
            self.tokenizer.encode(text, self.max_seq_length)
        }
    }

    /// The embedding of `text` ([`Self::dim`] values). An empty text is
    /// embedded as `[CLS] [SEP]`, as sentence-transformers does; text past
    /// [`Self::max_seq_length`] tokens is ignored.
    pub fn embed(&self, text: &str) -> Result<Vec<f32>> {
        Ok(self.embed_full(text)?.vector)
    }

    /// [`Self::embed`], with the token ids and whether the text was cut.
    pub fn embed_full(&self, text: &str) -> Result<Embedded> {
        let enc = self.tokenize(text)?;
        let vector = self.embed_ids(&enc.ids)?;
        Ok(Embedded {
            vector,
            ids: enc.ids,
            truncated: enc.truncated,
        })
    }

    /// The embedding of already tokenized `ids` (`[CLS] ... [SEP]`, at
    /// most [`Self::max_seq_length`]).
    pub fn embed_ids(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let mut v = self.embed_batch_ids(&[ids])?;
        v.pop()
            .ok_or_else(|| Error::BadInput("no embedding for one sequence".into()))
    }

    /// Embeddings of several texts in one forward pass (padded to the
    /// longest, padding masked out; the same vectors as one at a time up to
    /// float rounding).
    pub fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let encs = texts
            .iter()
            .map(|t| self.tokenize(t))
            .collect::<Result<Vec<_>>>()?;
        let ids: Vec<&[u32]> = encs.iter().map(|e| e.ids.as_slice()).collect();
        self.embed_batch_ids(&ids)
    }

    /// Embeddings of several tokenized sequences in one forward pass.
    pub fn embed_batch_ids(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let b = seqs.len();
        if b == 0 {
            return Ok(Vec::new());
        }
        let s = seqs.iter().map(|q| q.len()).max().unwrap_or(0);
        if s == 0 {
            return Err(Error::BadInput(
                "an empty token sequence: encode text with Encoder::tokenize, which adds [CLS] and [SEP]".into(),
            ));
        }
        if s > self.max_seq_length {
            return Err(Error::BadInput(format!(
                "{s} tokens exceed max_seq_length {}: tokenize with Encoder::tokenize, which truncates",
                self.max_seq_length
            )));
        }
        let vocab = self.model.config().vocab_size;
        let mut ids = Vec::with_capacity(b * s);
        let mut mask = Vec::with_capacity(b * s);
        for q in seqs {
            if let Some(&bad) = q.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::BadInput(format!(
                    "token id {bad} is outside the vocabulary of {vocab}"
                )));
            }
            ids.extend(q.iter().map(|&t| i64::from(t)));
            ids.extend(std::iter::repeat_n(i64::from(self.pad_id), s - q.len()));
            mask.extend(std::iter::repeat_n(1f32, q.len()));
            mask.extend(std::iter::repeat_n(0f32, s - q.len()));
        }
        let ids = Tensor::from_i64(ids, &[b, s])?;
        let ragged = seqs.iter().any(|q| q.len() != s);
        let mask_t = if ragged {
            Some(Tensor::from_vec(mask.clone(), &[b, s])?)
        } else {
            None
        };
        let dev = self.model.device();
        let h = self.model.forward(&ids, mask_t.as_ref())?;
        let h = dev.to_host(&h)?.to_vec_f32()?;
        let d = self.dim();
        Ok((0..b)
            .map(|i| {
                let v = pool(
                    self.pooling,
                    &h[i * s * d..(i + 1) * s * d],
                    &mask[i * s..(i + 1) * s],
                    d,
                );
                if self.normalize {
                    l2_normalize(v)
                } else {
                    v
                }
            })
            .collect())
    }
}

/// Pool token states `h[s, d]` over `mask[s]` (1 keeps a token).
fn pool(mode: Pooling, h: &[f32], mask: &[f32], d: usize) -> Vec<f32> {
    let rows = h.chunks_exact(d).zip(mask).filter(|(_, &m)| m > 0.0);
    match mode {
        Pooling::Cls => h[..d].to_vec(),
        Pooling::Mean => {
            let mut sum = vec![0f64; d];
            let mut n = 0f64;
            for (row, _) in rows {
                n += 1.0;
                for (s, &x) in sum.iter_mut().zip(row) {
                    *s += f64::from(x);
                }
            }
            // sentence-transformers clamps the count at 1e-9.
            let n = n.max(1e-9);
            sum.iter().map(|&s| (s / n) as f32).collect()
        }
        Pooling::Max => {
            let mut m = vec![f32::NEG_INFINITY; d];
            for (row, _) in rows {
                for (a, &x) in m.iter_mut().zip(row) {
                    *a = a.max(x);
                }
            }
            m
        }
    }
}

/// `v / max(|v|, 1e-12)`, as torch's `F.normalize`.
fn l2_normalize(v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let norm = norm.max(1e-12);
    v.into_iter()
        .map(|x| (f64::from(x) / norm) as f32)
        .collect()
}

fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> Result<T> {
    let text = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
    serde_json::from_str(&text).map_err(|e| Error::bad_model(p, format!("unreadable: {e}")))
}

fn default_max_seq_length() -> usize {
    512
}

#[derive(Deserialize)]
struct SbertConfig {
    #[serde(default = "default_max_seq_length")]
    max_seq_length: usize,
    #[serde(default)]
    do_lower_case: bool,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

impl PoolingConfig {
    fn mode(&self) -> std::result::Result<Pooling, String> {
        let modes = [
            (self.pooling_mode_mean_tokens, Some(Pooling::Mean)),
            (self.pooling_mode_cls_token, Some(Pooling::Cls)),
            (self.pooling_mode_max_tokens, Some(Pooling::Max)),
            (self.pooling_mode_mean_sqrt_len_tokens, None),
            (self.pooling_mode_weightedmean_tokens, None),
            (self.pooling_mode_lasttoken, None),
        ];
        let on: Vec<Option<Pooling>> = modes.iter().filter(|(b, _)| *b).map(|(_, m)| *m).collect();
        match on.as_slice() {
            [Some(m)] => Ok(*m),
            _ => Err("pooling must be exactly one of mean, cls or max tokens \
                 (mean_sqrt_len, weighted mean, last token and combined modes are not supported)"
                .into()),
        }
    }
}

/// What `modules.json` lists after the Transformer.
#[derive(Debug)]
struct Modules {
    /// Folder of the Pooling module (`1_Pooling`).
    pooling: Option<String>,
    normalize: bool,
}

#[derive(Deserialize)]
struct ModuleJson {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

impl Modules {
    fn read(p: &Path) -> Result<Self> {
        let list: Vec<ModuleJson> = read_json(p)?;
        let mut m = Modules {
            pooling: None,
            normalize: false,
        };
        for (i, module) in list.iter().enumerate() {
            let kind = module.kind.rsplit('.').next().unwrap_or("");
            match (i, kind) {
                (0, "Transformer") => {}
                (0, _) => {
                    return Err(Error::bad_model(
                        p,
                        format!("the first module is `{}`, not a Transformer", module.kind),
                    ))
                }
                (_, "Pooling") if m.pooling.is_none() => m.pooling = Some(module.path.clone()),
                (_, "Normalize") => m.normalize = true,
                _ => {
                    return Err(Error::bad_model(
                        p,
                        format!(
                            "module `{}` is not supported (Transformer, Pooling, Normalize)",
                            module.kind
                        ),
                    ))
                }
            }
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_pooling_skips_padding_and_normalizing_gives_unit_length() {
        let h = [1.0, 2.0, 3.0, 4.0, 100.0, 100.0];
        let v = pool(Pooling::Mean, &h, &[1.0, 1.0, 0.0], 2);
        assert_eq!(v, [2.0, 3.0]);
        assert_eq!(pool(Pooling::Cls, &h, &[1.0, 1.0, 0.0], 2), [1.0, 2.0]);
        assert_eq!(pool(Pooling::Max, &h, &[1.0, 1.0, 0.0], 2), [3.0, 4.0]);
        let n = l2_normalize(vec![3.0, 4.0]);
        assert_eq!(n, [0.6, 0.8]);
        assert_eq!(l2_normalize(vec![0.0, 0.0]), [0.0, 0.0]);
    }

    #[test]
    fn modules_and_pooling_configs_are_read_or_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("modules.json");
        std::fs::write(
            &p,
            r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]"#,
        )
        .expect("write");
        let m = Modules::read(&p).expect("modules");
        assert_eq!(m.pooling.as_deref(), Some("1_Pooling"));
        assert!(m.normalize);
        std::fs::write(
            &p,
            r#"[{"path": "", "type": "sentence_transformers.models.Transformer"},
                {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}]"#,
        )
        .expect("write");
        let e = Modules::read(&p).expect_err("dense");
        assert!(e.to_string().contains("Dense` is not supported"), "{e}");
        let mean: PoolingConfig = serde_json::from_str(
            r#"{"word_embedding_dimension": 384, "pooling_mode_mean_tokens": true}"#,
        )
        .expect("json");
        assert_eq!(mean.mode(), Ok(Pooling::Mean));
        let two: PoolingConfig = serde_json::from_str(
            r#"{"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}"#,
        )
        .expect("json");
        assert!(two.mode().is_err());
    }

    #[test]
    fn a_folder_without_the_model_says_what_is_missing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).expect("cpu");
        let e = Encoder::load(dir.path(), &dev).expect_err("empty folder");
        let msg = e.to_string();
        assert!(msg.contains("config.json: missing"), "{msg}");
        assert!(msg.contains("edgeflow models fetch minilm-l6"), "{msg}");
    }
}
