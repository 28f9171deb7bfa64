//! The model's tokenizer and chat template, both read from the GGUF
//! metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`).
//!
//! GGUF `gpt2` tokenizers are byte-level BPE: every byte maps to a printable
//! character (GPT-2's `bytes_to_unicode`), words are split by a
//! pre-tokenizer regex, then merged by rank. SmolLM2 (`tokenizer.ggml.pre =
//! smollm`) first splits digits one by one, then applies GPT-2's regex
//! (`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`).
//! Qwen2 (`tokenizer.ggml.pre = qwen2`) splits with its own regex (llama.cpp's
//! `LLAMA_VOCAB_PRE_TYPE_QWEN2`, [`QWEN2_PATTERN`]: case-insensitive
//! contractions, a letter run with at most one leading non-letter, digits one
//! by one, ...) and byte-maps each piece without GPT-2's regex.
//! Control tokens (type 3, e.g. `<|im_start|>`) are matched whole in the
//! text before BPE. The `tokenizers` crate does the BPE; this module builds
//! it from the GGUF and adds streaming detokenization on UTF-8 boundaries.

use crate::{Error, Result};
use edgeflow_runtime::weights::GgufFile;
use std::collections::HashMap;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// The qwen2 pre-tokenizer's regex (llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`,
/// the `Split` of Qwen2's `tokenizer.json`).
pub const QWEN2_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a GGUF's `tokenizer.ggml.pre` splits text before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreSplit {
    /// GPT-2's regex.
    Gpt2,
    /// Digits one by one, then GPT-2's regex.
    DigitsThenGpt2,
    /// [`QWEN2_PATTERN`].
    Qwen2,
}

/// GGUF token type of control tokens (`<|im_start|>`, `<|endoftext|>`...).
const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token type of user-defined tokens (matched whole, like control ones).
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// One chat message for [`TextTokenizer::render_chat`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Tokenizer, detokenizer and chat template of a GGUF model.
pub struct TextTokenizer {
    tok: Tokenizer,
    /// Raw bytes of every token back to back (control tokens: their
    /// text): token `i`'s end at `ends[i]`, start where token `i - 1`'s
    /// end. One buffer rather than a vector per token, whose 152k small
    /// allocations cost a Qwen2.5 vocabulary about 8 MB.
    bytes: Vec<u8>,
    ends: Vec<u32>,
    control: Vec<bool>,
    bos: Option<u32>,
    eos: u32,
    bos_text: String,
    eos_text: String,
    template: Option<String>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab", &self.ends.len())
            .field("eos", &self.eos)
            .finish()
    }
}

/// GPT-2's byte <-> printable character table, as char -> byte.
fn unicode_to_byte() -> HashMap<char, u8> {
    let mut bs: Vec<u32> = (u32::from('!')..=u32::from('~'))
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    bs.iter()
        .zip(&cs)
        .filter_map(|(&b, &c)| Some((char::from_u32(c)?, b as u8)))
        .collect()
}

impl TextTokenizer {
    /// Build the tokenizer from a GGUF's metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let model = g.meta_str("tokenizer.ggml.model").unwrap_or("");
        if model != "gpt2" {
            return Err(Error::Tokenizer(format!(
                "tokenizer.ggml.model is `{model}`; only byte-level BPE (`gpt2`) is supported"
            )));
        }
        let pre = g.meta_str("tokenizer.ggml.pre").unwrap_or("default");
        let split = match pre {
            // llama.cpp's SMOLLM / STARCODER / REFACT pre-tokenizers: digits
            // one by one, then GPT-2's regex.
            "smollm" | "starcoder" | "refact" => PreSplit::DigitsThenGpt2,
            "gpt2" | "default" => PreSplit::Gpt2,
            "qwen2" => PreSplit::Qwen2,
            other => {
                return Err(Error::Tokenizer(format!(
                    "pre-tokenizer `{other}` is not supported (supported: smollm, starcoder, refact, gpt2, qwen2)"
                )))
            }
        };
        let tokens = g
            .meta_strings("tokenizer.ggml.tokens")
            .ok_or_else(|| Error::Tokenizer("tokenizer.ggml.tokens is missing".into()))?;
        let merges = g
            .meta_strings("tokenizer.ggml.merges")
            .ok_or_else(|| Error::Tokenizer("tokenizer.ggml.merges is missing".into()))?;
        let types: Vec<i32> = match g.metadata().get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(|e| Error::Tokenizer(format!("tokenizer.ggml.token_type: {e}")))?
                .iter()
                .map(|x| x.to_i32().unwrap_or(1))
                .collect(),
            None => vec![1; tokens.len()],
        };
        let merges: Vec<(String, String)> = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| Error::Tokenizer(format!("malformed merge `{m}`")))
            })
            .collect::<Result<_>>()?;
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| Error::Tokenizer(format!("building BPE: {e}")))?;
        let mut tok = Tokenizer::new(bpe);
        let byte_level = ByteLevel::new(false, true, true);
        let pre: PreTokenizerWrapper = match split {
            PreSplit::DigitsThenGpt2 => {
                Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
            }
            PreSplit::Gpt2 => byte_level.into(),
            PreSplit::Qwen2 => {
                let regex = Split::new(
                    SplitPattern::Regex(QWEN2_PATTERN.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| Error::Tokenizer(format!("qwen2 pre-tokenizer regex: {e}")))?;
                // The regex did the splitting: byte-map only.
                let bytes_only = ByteLevel::new(false, false, false);
                Sequence::new(vec![regex.into(), bytes_only.into()]).into()
            }
        };
        tok.with_pre_tokenizer(Some(pre));
        tok.with_decoder(Some(ByteLevelDecoder::default()));
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &ty)| ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED)
            .map(|(t, _)| AddedToken::from(t.clone(), true))
            .collect();
        tok.add_special_tokens(special)
            .map_err(|e| Error::Tokenizer(format!("adding control tokens: {e}")))?;

        let table = unicode_to_byte();
        let control: Vec<bool> = (0..tokens.len())
            .map(|i| types.get(i) == Some(&TOKEN_TYPE_CONTROL))
            .collect();
        let mut bytes = Vec::with_capacity(tokens.iter().map(String::len).sum());
        let mut ends = Vec::with_capacity(tokens.len());
        for (t, &is_control) in tokens.iter().zip(&control) {
            if is_control {
                bytes.extend_from_slice(t.as_bytes());
            } else {
                // Characters outside the table cannot occur in a
                // byte-level vocabulary; keep them as their UTF-8.
                for ch in t.chars() {
                    match table.get(&ch) {
                        Some(&b) => bytes.push(b),
                        None => {
                            let mut buf = [0u8; 4];
                            bytes.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                    }
                }
            }
            let end = u32::try_from(bytes.len()).map_err(|_| {
                Error::Tokenizer("the vocabulary's tokens add up to more than 4 GB".into())
            })?;
            ends.push(end);
        }
        bytes.shrink_to_fit();
        let id = |k: &str| g.meta_u64(k).map(|v| v as u32);
        let eos = id("tokenizer.ggml.eos_token_id")
            .ok_or_else(|| Error::Tokenizer("tokenizer.ggml.eos_token_id is missing".into()))?;
        let bos = id("tokenizer.ggml.bos_token_id");
        let text_of = |i: Option<u32>| {
            i.and_then(|i| tokens.get(i as usize))
                .cloned()
                .unwrap_or_default()
        };
        Ok(TextTokenizer {
            tok,
            bytes,
            ends,
            control,
            bos,
            eos,
            bos_text: text_of(bos),
            eos_text: text_of(Some(eos)),
            template: g.meta_str("tokenizer.chat_template").map(str::to_string),
        })
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.ends.len()
    }

    /// End-of-sequence id (for SmolLM2-Instruct: `<|im_end|>`).
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// Beginning-of-sequence id, when the model has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// Whether `id` is a control token (never text; generation stops there).
    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    /// Token ids of `text`; control tokens written in the text
    /// (`<|im_start|>`) become their ids. No BOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tok
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(format!("encoding: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The raw bytes of a token (control tokens: their text); empty for an
    /// id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        let Some(&end) = self.ends.get(i) else {
            return &[];
        };
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start as usize..end as usize]
    }

    /// Text of `ids` (invalid UTF-8 replaced), control tokens included.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&i| self.token_bytes(i).iter().copied())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Render `messages` with the model's chat template (Jinja, from the
    /// GGUF), ending with the assistant prompt when `add_generation_prompt`.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_chat_with_tools(messages, &[], add_generation_prompt)
    }

    /// [`Self::render_chat`] with tool definitions (JSON function schemas,
    /// e.g. `{"type": "function", "function": {"name": ..., "parameters":
    /// ...}}`), which templates such as Qwen2.5's list in the system turn.
    /// Templates without tool support ignore them.
    pub fn render_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let tmpl = self.template.as_deref().ok_or_else(|| {
            Error::Template("the GGUF has no tokenizer.chat_template; use raw prompts".into())
        })?;
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson_python);
        env.add_template("chat", tmpl)
            .map_err(|e| Error::Template(format!("unsupported template: {e}")))?;
        let t = env
            .get_template("chat")
            .map_err(|e| Error::Template(e.to_string()))?;
        t.render(minijinja::context! {
            messages => messages,
            tools => (!tools.is_empty()).then_some(tools),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_text,
            eos_token => self.eos_text,
        })
        .map_err(|e| Error::Template(format!("rendering failed: {e}")))
    }
}

/// Jinja's `tojson` as chat templates expect it (Python's `json.dumps`:
/// `", "` and `": "` separators, non-ASCII kept), which is what llama.cpp's
/// and transformers' renderers print; minijinja's own is compact.
fn tojson_python(v: minijinja::Value) -> std::result::Result<String, minijinja::Error> {
    let j = serde_json::to_value(&v).map_err(|e| {
        minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("tojson: {e}"),
        )
    })?;
    let mut out = String::new();
    write_json_python(&j, &mut out);
    Ok(out)
}

fn write_json_python(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value as J;
    match v {
        J::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json_python(x, out);
            }
            out.push(']');
        }
        J::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                write_json_python(x, out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Turns generated tokens into text pieces that end on UTF-8 character
/// boundaries (a multi-byte character split across tokens comes out whole).
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// A stream with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a token's bytes; returns the text that is now complete (may be empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let out = s.to_string();
                self.pending.clear();
                out
            }
            Err(e) if e.error_len().is_none() => {
                // An incomplete character at the end: keep it for later.
                let n = e.valid_up_to();
                let out = String::from_utf8_lossy(&self.pending[..n]).into_owned();
                self.pending.drain(..n);
                out
            }
            Err(_) => {
                // Bytes that can never become valid: emit them replaced.
                let out = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                out
            }
        }
    }

    /// Whatever is left (an incomplete character comes out replaced).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn utf8_stream_holds_split_characters() {
        let mut s = Utf8Stream::new();
        let octopus = "\u{1F419}".as_bytes();
        assert_eq!(s.push(b"a "), "a ");
        assert_eq!(s.push(&octopus[..1]), "");
        assert_eq!(s.push(&octopus[1..3]), "");
        assert_eq!(s.push(&octopus[3..]), "\u{1F419}");
        assert_eq!(s.push(&[0xC3]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
        assert_eq!(s.push(&[0xFF, b'x']), "\u{FFFD}x");
    }

    #[test]
    fn byte_table_covers_every_byte() {
        let t = unicode_to_byte();
        assert_eq!(t.len(), 256);
        assert_eq!(t[&'\u{0120}'], b' ');
        assert_eq!(t[&'!'], b'!');
    }
}
