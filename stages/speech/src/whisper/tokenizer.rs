//! Decoding Whisper token ids with the `tokenizer.json` shipped next to the
//! model (GPT-2 byte-level BPE): ids map to vocabulary strings whose
//! characters stand for bytes (GPT-2's `bytes_to_unicode`).

use crate::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// Whisper's special tokens, looked up by name in the tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `<|endoftext|>`
    pub eot: u32,
    /// `<|startoftranscript|>`
    pub sot: u32,
    /// `<|startofprev|>`
    pub sot_prev: u32,
    /// `<|notimestamps|>`
    pub no_timestamps: u32,
    /// `<|nospeech|>` or, in older vocabularies, `<|nocaptions|>`.
    pub no_speech: u32,
}

/// Id-to-text decoder.
#[derive(Debug, Clone)]
pub struct WhisperTokenizer {
    pieces: Vec<Option<String>>,
    specials: HashMap<String, u32>,
    byte_of: HashMap<char, u8>,
    tokens: SpecialTokens,
}

/// GPT-2's reversible byte -> printable char map, inverted.
fn byte_decoder() -> HashMap<char, u8> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
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
    bs.into_iter()
        .zip(cs)
        .filter_map(|(b, c)| Some((char::from_u32(c)?, b as u8)))
        .collect()
}

impl WhisperTokenizer {
    /// Read `tokenizer.json`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::bad_model(path, format!("not JSON: {e}")))?;
        let vocab = v
            .pointer("/model/vocab")
            .and_then(|v| v.as_object())
            .ok_or_else(|| Error::bad_model(path, "no `model.vocab` object"))?;
        let mut pieces: Vec<Option<String>> = Vec::new();
        let mut put = |id: u64, s: &str| {
            let id = id as usize;
            if pieces.len() <= id {
                pieces.resize(id + 1, None);
            }
            pieces[id] = Some(s.to_string());
        };
        for (s, id) in vocab {
            if let Some(id) = id.as_u64() {
                put(id, s);
            }
        }
        let mut specials = HashMap::new();
        for a in v
            .get("added_tokens")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
        {
            if let (Some(id), Some(s)) = (
                a.get("id").and_then(|i| i.as_u64()),
                a.get("content").and_then(|c| c.as_str()),
            ) {
                specials.insert(s.to_string(), id as u32);
            }
        }
        let find = |names: &[&str]| -> Result<u32> {
            names
                .iter()
                .find_map(|n| specials.get(*n).copied())
                .ok_or_else(|| {
                    Error::bad_model(path, format!("special token {} is missing", names[0]))
                })
        };
        let tokens = SpecialTokens {
            eot: find(&["<|endoftext|>"])?,
            sot: find(&["<|startoftranscript|>"])?,
            sot_prev: find(&["<|startofprev|>"])?,
            no_timestamps: find(&["<|notimestamps|>"])?,
            no_speech: find(&["<|nospeech|>", "<|nocaptions|>"])?,
        };
        Ok(WhisperTokenizer {
            pieces,
            specials,
            byte_of: byte_decoder(),
            tokens,
        })
    }

    /// The special tokens.
    pub fn special(&self) -> SpecialTokens {
        self.tokens
    }

    /// Id of a special token by its text (`<|en|>`).
    pub fn special_id(&self, s: &str) -> Option<u32> {
        self.specials.get(s).copied()
    }

    /// Text of `ids`, ignoring special and timestamp tokens (ids at or above
    /// `<|endoftext|>`), as faster-whisper's `Tokenizer.decode`.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids.iter().filter(|&&i| i < self.tokens.eot) {
            if let Some(Some(p)) = self.pieces.get(id as usize) {
                for ch in p.chars() {
                    match self.byte_of.get(&ch) {
                        Some(&b) => bytes.push(b),
                        None => {
                            let mut buf = [0u8; 4];
                            bytes.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                    }
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
