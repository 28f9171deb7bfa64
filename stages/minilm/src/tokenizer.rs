//! BERT's WordPiece tokenizer, read from a Hugging Face `tokenizer.json`.
//!
//! The steps are those of Hugging Face `tokenizers` for a BERT file, so the
//! ids are the reference's (sentence-transformers tokenizes with it):
//!
//! 1. **Added tokens** (`[CLS]`, `[SEP]`, `[MASK]`, ... with `normalized:
//!    false`) are found in the raw text first, leftmost-longest, and map to
//!    their ids whole; the text between them goes through the next steps
//!    piece by piece.
//! 2. **BertNormalizer**: drop NUL, U+FFFD and control / format /
//!    unassigned / private-use characters (tab, newline and carriage return
//!    are whitespace), turn every whitespace into a space, put spaces around
//!    CJK ideographs, strip accents (NFD, then drop non-spacing marks; on
//!    when lowercasing unless the file says otherwise), lowercase.
//! 3. **BertPreTokenizer**: split on whitespace, and make every punctuation
//!    character (ASCII punctuation or a Unicode `P*` category) a word of its
//!    own.
//! 4. **WordPiece**: greedy longest match from the left, later pieces
//!    looked up with the `##` prefix; a word with no full cover, or longer
//!    than `max_input_chars_per_word` characters, is one `[UNK]`.
//! 5. **Post-processing**: `[CLS] ... [SEP]` (the file's `TemplateProcessing`
//!    or `BertProcessing`), the body truncated so the whole fits `max_len`.
//!
//! Encoding streams: it stops reading the text once the body is full, so a
//! megabyte of text costs no more than the first few hundred words (plus
//! one scan for added tokens).

use crate::{Error, Result};
use serde::Deserialize;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::Path;
use unicode_categories::UnicodeCategories;
use unicode_normalization::UnicodeNormalization;

/// The token ids of one text, special tokens included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoding {
    /// `[CLS] pieces... [SEP]`.
    pub ids: Vec<u32>,
    /// Pieces were dropped to fit the length limit.
    pub truncated: bool,
}

/// The normalizer's switches (`normalizer` in `tokenizer.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Normalizer {
    clean_text: bool,
    handle_chinese_chars: bool,
    strip_accents: bool,
    lowercase: bool,
}

/// A BERT WordPiece tokenizer (see the module docs for its steps).
#[derive(Debug, Clone)]
pub struct Tokenizer {
    /// Every vocabulary entry (word-initial pieces and everything else).
    vocab: HashMap<String, u32>,
    /// Continuation pieces by their text without the `##` prefix, so
    /// lookups inside a word need no allocation.
    continuing: HashMap<String, u32>,
    /// Token text by id (for [`Tokenizer::id_to_token`]).
    tokens: Vec<String>,
    unk: u32,
    max_input_chars_per_word: usize,
    normalizer: Option<Normalizer>,
    /// Tokens matched whole in the raw text, longest first.
    added: Vec<(String, u32)>,
    /// Special ids before and after the body.
    prefix: Vec<u32>,
    suffix: Vec<u32>,
}

impl Tokenizer {
    /// Read a `tokenizer.json` with a WordPiece model.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text, path)
    }

    /// Parse the text of a `tokenizer.json`; `path` names it in errors.
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let bad = |msg: String| Error::bad_model(path, msg);
        let file: FileJson = serde_json::from_str(text)
            .map_err(|e| bad(format!("not a tokenizer.json with a WordPiece model: {e}")))?;
        let m = file.model;
        if m.kind != "WordPiece" {
            return Err(bad(format!(
                "model type is `{}`; this tokenizer reads WordPiece (BERT) files only",
                m.kind
            )));
        }
        let unk = *m.vocab.get(&m.unk_token).ok_or_else(|| {
            bad(format!(
                "the unknown token `{}` is not in the vocabulary",
                m.unk_token
            ))
        })?;
        let rows = m.vocab.values().map(|&i| i as usize + 1).max().unwrap_or(0);
        // Ids index the embedding table: a sparse id far past the entries
        // is a broken file, not a reason to allocate gigabytes.
        if rows > 4 * m.vocab.len() + 1024 {
            return Err(bad(format!(
                "vocabulary ids reach {} for {} entries: the ids are not dense",
                rows - 1,
                m.vocab.len()
            )));
        }
        let mut tokens = vec![String::new(); rows];
        for (t, &i) in &m.vocab {
            tokens[i as usize] = t.clone();
        }
        let prefix_str = m.continuing_subword_prefix.as_str();
        let continuing = m
            .vocab
            .iter()
            .filter_map(|(t, &i)| t.strip_prefix(prefix_str).map(|s| (s.to_string(), i)))
            .collect();
        let normalizer = match file.normalizer {
            None => None,
            Some(n) if n.kind == "BertNormalizer" => Some(Normalizer {
                clean_text: n.clean_text,
                handle_chinese_chars: n.handle_chinese_chars,
                strip_accents: n.strip_accents.unwrap_or(n.lowercase),
                lowercase: n.lowercase,
            }),
            Some(n) => {
                return Err(bad(format!(
                    "normalizer `{}` is not supported (BertNormalizer or none)",
                    n.kind
                )))
            }
        };
        match &file.pre_tokenizer {
            Some(p) if p.kind == "BertPreTokenizer" => {}
            Some(p) => {
                return Err(bad(format!(
                    "pre-tokenizer `{}` is not supported (BertPreTokenizer)",
                    p.kind
                )))
            }
            None => return Err(bad("the pre-tokenizer is missing (BertPreTokenizer)".into())),
        }
        let mut added = Vec::new();
        for a in file.added_tokens {
            if a.content.is_empty() {
                continue;
            }
            if a.normalized || a.lstrip || a.rstrip || a.single_word {
                return Err(bad(format!(
                    "added token `{}` uses normalized / lstrip / rstrip / single_word, \
                     which this tokenizer does not support",
                    a.content
                )));
            }
            added.push((a.content, a.id));
        }
        // Longest first: the leftmost match is then also the longest there.
        added.sort_by_key(|a| std::cmp::Reverse(a.0.len()));
        let lookup = |name: &str| -> Result<u32> {
            added
                .iter()
                .find(|(t, _)| t == name)
                .map(|(_, i)| *i)
                .or_else(|| m.vocab.get(name).copied())
                .ok_or_else(|| bad(format!("special token `{name}` has no id")))
        };
        let (prefix, suffix) = match file.post_processor {
            None => (Vec::new(), Vec::new()),
            Some(p) => post_processor(&p, &lookup).map_err(bad)?,
        };
        Ok(Tokenizer {
            vocab: m.vocab,
            continuing,
            tokens,
            unk,
            max_input_chars_per_word: m.max_input_chars_per_word,
            normalizer,
            added,
            prefix,
            suffix,
        })
    }

    /// Entries in the vocabulary (the model's embedding rows cover them).
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The text of token `id`.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens
            .get(id as usize)
            .map(String::as_str)
            .filter(|t| !t.is_empty())
    }

    /// The id of token `token` (a vocabulary entry or an added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added
            .iter()
            .find(|(t, _)| t == token)
            .map(|(_, i)| *i)
            .or_else(|| self.vocab.get(token).copied())
    }

    /// Special tokens around every encoding (`[CLS]` and `[SEP]`: 2).
    pub fn num_special_tokens(&self) -> usize {
        self.prefix.len() + self.suffix.len()
    }

    /// Token ids of `text`: special tokens around the pieces, which are cut
    /// (from the end) so that the whole is at most `max_len` ids, as
    /// Hugging Face's tokenizer with `truncation=True, max_length=max_len`.
    /// `max_len` must leave room for the special tokens.
    pub fn encode(&self, text: &str, max_len: usize) -> Result<Encoding> {
        let budget = max_len
            .checked_sub(self.num_special_tokens())
            .ok_or_else(|| {
                Error::BadInput(format!(
                    "a length limit of {max_len} tokens leaves no room for the {} special tokens",
                    self.num_special_tokens()
                ))
            })?;
        let mut body = Vec::new();
        let mut truncated = false;
        let mut push = |id: u32| {
            if body.len() == budget {
                truncated = true;
                ControlFlow::Break(())
            } else {
                body.push(id);
                ControlFlow::Continue(())
            }
        };
        let mut rest = text;
        let mut words = Words::new(self);
        loop {
            let (piece, next) = match self.find_added(rest) {
                Some((at, len, id)) => (&rest[..at], Some((id, &rest[at + len..]))),
                None => (rest, None),
            };
            if self.piece(piece, &mut words, &mut push).is_break() {
                break;
            }
            match next {
                Some((id, after)) => {
                    if push(id).is_break() {
                        break;
                    }
                    rest = after;
                }
                None => break,
            }
        }
        let mut ids = Vec::with_capacity(body.len() + self.num_special_tokens());
        ids.extend_from_slice(&self.prefix);
        ids.append(&mut body);
        ids.extend_from_slice(&self.suffix);
        Ok(Encoding { ids, truncated })
    }

    /// The first added token in `s`: (byte offset, byte length, id).
    fn find_added(&self, s: &str) -> Option<(usize, usize, u32)> {
        if self.added.is_empty() {
            return None;
        }
        s.char_indices().find_map(|(i, _)| {
            self.added
                .iter()
                .find(|(t, _)| s[i..].starts_with(t.as_str()))
                .map(|(t, id)| (i, t.len(), *id))
        })
    }

    /// Normalize, split and look up one piece of text between added tokens.
    fn piece(
        &self,
        s: &str,
        words: &mut Words<'_>,
        push: &mut impl FnMut(u32) -> ControlFlow<()>,
    ) -> ControlFlow<()> {
        for c in self.normalized(s) {
            if c.is_whitespace() {
                words.flush(push)?;
            } else if is_bert_punctuation(c) {
                words.flush(push)?;
                words.add(c);
                words.flush(push)?;
            } else {
                words.add(c);
            }
        }
        words.flush(push)
    }

    /// The characters of `s` after the normalizer, lazily.
    fn normalized<'a>(&self, s: &'a str) -> Box<dyn Iterator<Item = char> + 'a> {
        let Some(n) = self.normalizer else {
            return Box::new(s.chars());
        };
        let mut it: Box<dyn Iterator<Item = char> + 'a> = Box::new(s.chars());
        if n.clean_text {
            it = Box::new(
                it.filter(|&c| !(c == '\0' || c == '\u{fffd}' || is_control(c)))
                    .map(|c| if is_whitespace(c) { ' ' } else { c }),
            );
        }
        if n.handle_chinese_chars {
            it = Box::new(it.flat_map(|c| {
                let pad = is_chinese_char(c).then_some(' ');
                pad.into_iter().chain(std::iter::once(c)).chain(pad)
            }));
        }
        if n.strip_accents {
            it = Box::new(it.nfd().filter(|c| !c.is_mark_nonspacing()));
        }
        if n.lowercase {
            it = Box::new(it.flat_map(char::to_lowercase));
        }
        it
    }

    /// The WordPiece ids of `word` (at most `max_input_chars_per_word`
    /// characters) into `out`: greedy longest match, or one `[UNK]`.
    fn word_pieces(&self, word: &str, out: &mut Vec<u32>) {
        out.clear();
        let mut start = 0;
        while start < word.len() {
            let table = if start == 0 {
                &self.vocab
            } else {
                &self.continuing
            };
            let mut end = word.len();
            let mut found = None;
            while start < end {
                let sub = &word[start..end];
                if let Some(&id) = table.get(sub) {
                    found = Some(id);
                    break;
                }
                end -= sub.chars().next_back().map_or(1, char::len_utf8);
            }
            match found {
                Some(id) => out.push(id),
                None => {
                    out.clear();
                    out.push(self.unk);
                    return;
                }
            }
            start = end;
        }
    }
}

/// The word being built by the pre-tokenizer, and the pieces of the last.
#[derive(Debug)]
struct Words<'t> {
    tok: &'t Tokenizer,
    word: String,
    /// Characters seen in the word; only the first
    /// `max_input_chars_per_word + 1` are kept (enough to know it is long).
    chars: usize,
    pieces: Vec<u32>,
}

impl<'t> Words<'t> {
    fn new(tok: &'t Tokenizer) -> Self {
        Words {
            tok,
            word: String::new(),
            chars: 0,
            pieces: Vec::new(),
        }
    }

    fn add(&mut self, c: char) {
        if self.chars <= self.tok.max_input_chars_per_word {
            self.word.push(c);
        }
        self.chars += 1;
    }

    fn flush(&mut self, push: &mut impl FnMut(u32) -> ControlFlow<()>) -> ControlFlow<()> {
        if self.chars == 0 {
            return ControlFlow::Continue(());
        }
        if self.chars > self.tok.max_input_chars_per_word {
            self.pieces.clear();
            self.pieces.push(self.tok.unk);
        } else {
            self.tok.word_pieces(&self.word, &mut self.pieces);
        }
        self.word.clear();
        self.chars = 0;
        self.pieces.iter().try_for_each(|&id| push(id))
    }
}

/// BERT's whitespace: Unicode White_Space (tab, newline and carriage
/// return included).
fn is_whitespace(c: char) -> bool {
    c.is_whitespace()
}

/// BERT's control characters: general category C* (control, format,
/// unassigned, private use, surrogate) except tab, newline and carriage
/// return, which are whitespace.
fn is_control(c: char) -> bool {
    !matches!(c, '\t' | '\n' | '\r') && c.is_other()
}

/// ASCII punctuation (which includes symbols such as `$`, `+`, `^`) or a
/// Unicode punctuation category (P*).
fn is_bert_punctuation(c: char) -> bool {
    c.is_ascii_punctuation() || c.is_punctuation()
}

/// Code points of the CJK Unified Ideographs blocks and their extensions
/// and compatibility blocks (not Hangul, Hiragana or Katakana, whose words
/// are space separated).
fn is_chinese_char(c: char) -> bool {
    matches!(
        c as u32,
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B920..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

/// Special ids before and after the body, from a `TemplateProcessing` or
/// `BertProcessing` post-processor.
fn post_processor(
    p: &serde_json::Value,
    lookup: &dyn Fn(&str) -> Result<u32>,
) -> std::result::Result<(Vec<u32>, Vec<u32>), String> {
    let id_of = |name: &str| lookup(name).map_err(|e| e.to_string());
    match p.get("type").and_then(|t| t.as_str()) {
        Some("BertProcessing") => {
            let id = |key: &str| -> std::result::Result<u32, String> {
                p.get(key)
                    .and_then(|v| v.get(1))
                    .and_then(|v| v.as_u64())
                    .and_then(|v| u32::try_from(v).ok())
                    .ok_or_else(|| format!("BertProcessing without a `{key}` [token, id] pair"))
            };
            Ok((vec![id("cls")?], vec![id("sep")?]))
        }
        Some("TemplateProcessing") => {
            let single = p
                .get("single")
                .and_then(|s| s.as_array())
                .ok_or("TemplateProcessing without a `single` template")?;
            let (mut before, mut after, mut seen_seq) = (Vec::new(), Vec::new(), false);
            for item in single {
                if item.get("Sequence").is_some() {
                    if seen_seq {
                        return Err("the `single` template names the sequence twice".into());
                    }
                    seen_seq = true;
                } else if let Some(name) = item
                    .get("SpecialToken")
                    .and_then(|s| s.get("id"))
                    .and_then(|s| s.as_str())
                {
                    // The template names a special token; its ids are in
                    // `special_tokens` (one id for BERT's).
                    let ids: Vec<u32> = match p
                        .get("special_tokens")
                        .and_then(|s| s.get(name))
                        .and_then(|s| s.get("ids"))
                        .and_then(|s| s.as_array())
                    {
                        Some(ids) => ids
                            .iter()
                            .map(|v| {
                                v.as_u64()
                                    .and_then(|v| u32::try_from(v).ok())
                                    .ok_or_else(|| format!("special token `{name}` has a bad id"))
                            })
                            .collect::<std::result::Result<_, _>>()?,
                        None => vec![id_of(name)?],
                    };
                    if seen_seq {
                        after.extend(ids);
                    } else {
                        before.extend(ids);
                    }
                } else {
                    return Err(format!("unreadable template item {item}"));
                }
            }
            if !seen_seq {
                return Err("the `single` template has no sequence".into());
            }
            Ok((before, after))
        }
        other => Err(format!(
            "post-processor {other:?} is not supported (TemplateProcessing or BertProcessing)"
        )),
    }
}

#[derive(Deserialize)]
struct FileJson {
    #[serde(default)]
    added_tokens: Vec<AddedTokenJson>,
    normalizer: Option<NormalizerJson>,
    pre_tokenizer: Option<TypeOnly>,
    post_processor: Option<serde_json::Value>,
    model: ModelJson,
}

#[derive(Deserialize)]
struct AddedTokenJson {
    id: u32,
    content: String,
    #[serde(default)]
    single_word: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default)]
    normalized: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct NormalizerJson {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default = "yes")]
    clean_text: bool,
    #[serde(default = "yes")]
    handle_chinese_chars: bool,
    #[serde(default)]
    strip_accents: Option<bool>,
    #[serde(default = "yes")]
    lowercase: bool,
}

#[derive(Deserialize)]
struct TypeOnly {
    #[serde(rename = "type")]
    kind: String,
}

fn default_prefix() -> String {
    "##".into()
}

fn default_max_chars() -> usize {
    100
}

#[derive(Deserialize)]
struct ModelJson {
    #[serde(rename = "type")]
    kind: String,
    vocab: HashMap<String, u32>,
    unk_token: String,
    #[serde(default = "default_prefix")]
    continuing_subword_prefix: String,
    #[serde(default = "default_max_chars")]
    max_input_chars_per_word: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small BERT-like tokenizer.json: specials, a few words and pieces,
    /// 8 characters per word at most.
    fn tiny() -> Tokenizer {
        let vocab = [
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "push", "the", "red", "block", "un",
            "##able", "##s", "a", "e", "!", ",", ".", "$", "中", "文", "cafe", "##x", "x",
        ];
        let vocab: serde_json::Map<String, serde_json::Value> = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i.into()))
            .collect();
        let added: Vec<serde_json::Value> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
            .iter()
            .enumerate()
            .map(|(i, t)| {
                serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": added,
            "normalizer": {"type": "BertNormalizer", "clean_text": true,
                "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}},
                           {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
                "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                                   "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
            "model": {"type": "WordPiece", "unk_token": "[UNK]",
                "continuing_subword_prefix": "##", "max_input_chars_per_word": 8,
                "vocab": vocab},
        });
        Tokenizer::from_json(&json.to_string(), Path::new("tiny.json")).expect("tiny tokenizer")
    }

    fn ids(t: &Tokenizer, s: &str) -> Vec<u32> {
        t.encode(s, 64).expect("encode").ids
    }

    #[test]
    fn words_pieces_and_specials() {
        let t = tiny();
        assert_eq!(ids(&t, "Push the RED blocks!"), [2, 5, 6, 7, 8, 11, 14, 3]);
        assert_eq!(ids(&t, "unable"), [2, 9, 10, 3]);
        // No cover for the rest of the word: the whole word is [UNK].
        assert_eq!(ids(&t, "unablez"), [2, 1, 3]);
        // Added tokens are matched in the raw text, even inside words.
        assert_eq!(ids(&t, "red[MASK]block"), [2, 7, 4, 8, 3]);
        assert_eq!(ids(&t, "[mask]"), [2, 1, 1, 1, 3]);
        assert_eq!(t.id_to_token(10), Some("##able"));
        assert_eq!(t.token_to_id("[SEP]"), Some(3));
    }

    #[test]
    fn empty_and_blank_text_is_just_the_special_tokens() {
        let t = tiny();
        for s in ["", " ", "\t\n\r ", "\u{200b}\u{feff}", "\0\u{fffd}"] {
            assert_eq!(ids(&t, s), [2, 3], "{s:?}");
        }
    }

    #[test]
    fn accents_case_cjk_and_punctuation() {
        let t = tiny();
        assert_eq!(ids(&t, "CAFÉ"), [2, 20, 3]);
        assert_eq!(ids(&t, "Cafe\u{301}"), [2, 20, 3]);
        assert_eq!(ids(&t, "中文"), [2, 18, 19, 3]);
        assert_eq!(ids(&t, "a,e.$"), [2, 12, 15, 13, 16, 17, 3]);
        // An ideograph not in the vocabulary is a word of its own: one [UNK].
        assert_eq!(ids(&t, "red丁block"), [2, 7, 1, 8, 3]);
    }

    #[test]
    fn hostile_input_is_handled() {
        let t = tiny();
        // Longer than max_input_chars_per_word: one [UNK], even when every
        // piece exists.
        assert_eq!(ids(&t, "xxxxxxxx"), [2, 22, 21, 21, 21, 21, 21, 21, 21, 3]);
        assert_eq!(ids(&t, "xxxxxxxxx"), [2, 1, 3]);
        let huge = "x".repeat(1 << 20);
        assert_eq!(ids(&t, &huge), [2, 1, 3]);
        // Control characters vanish (they do not split words); NUL too.
        assert_eq!(ids(&t, "re\u{7}d bl\0ock\u{1b}"), [2, 7, 8, 3]);
        // Lone combining marks and unassigned code points vanish.
        assert_eq!(ids(&t, "\u{301}\u{301}red\u{e000}"), [2, 7, 3]);
        // Emoji are symbols, not punctuation: part of the word, [UNK] here.
        assert_eq!(ids(&t, "red🙂"), [2, 1, 3]);
        // Many special-looking brackets without a match.
        assert_eq!(ids(&t, "[[[[").len(), 6);
    }

    #[test]
    fn truncation_keeps_the_head_and_reports_it() {
        let t = tiny();
        let e = t.encode("push the red block", 4).expect("encode");
        assert_eq!(e.ids, [2, 5, 6, 3]);
        assert!(e.truncated);
        let e = t.encode("push the", 4).expect("encode");
        assert_eq!(e.ids, [2, 5, 6, 3]);
        assert!(!e.truncated);
        // Pieces of one word may be cut, as Hugging Face's truncation does.
        let e = t.encode("unable", 3).expect("encode");
        assert_eq!(e.ids, [2, 9, 3]);
        assert!(e.truncated);
        // Megabytes of words stop at the limit without reading the rest.
        let long = "push the red block ".repeat(200_000);
        let t0 = std::time::Instant::now();
        let e = t.encode(&long, 256).expect("encode");
        assert_eq!(e.ids.len(), 256);
        assert!(e.truncated);
        assert!(t0.elapsed().as_secs_f64() < 1.0, "{:?}", t0.elapsed());
        let err = t.encode("push", 1).expect_err("no room");
        assert!(
            err.to_string().contains("no room for the 2 special tokens"),
            "{err}"
        );
    }

    #[test]
    fn unsupported_files_are_refused_with_the_reason() {
        let e = Tokenizer::from_json("{}", Path::new("t.json")).expect_err("empty");
        assert!(
            e.to_string().contains("t.json: not a tokenizer.json"),
            "{e}"
        );
        let bpe = r#"{"model": {"type": "BPE", "vocab": {"a": 0}, "unk_token": "a"},
                      "pre_tokenizer": {"type": "BertPreTokenizer"}}"#;
        let e = Tokenizer::from_json(bpe, Path::new("t.json")).expect_err("bpe");
        assert!(e.to_string().contains("WordPiece (BERT) files only"), "{e}");
        let no_unk = r#"{"model": {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "[UNK]"},
                         "pre_tokenizer": {"type": "BertPreTokenizer"}}"#;
        let e = Tokenizer::from_json(no_unk, Path::new("t.json")).expect_err("no unk");
        assert!(
            e.to_string().contains("`[UNK]` is not in the vocabulary"),
            "{e}"
        );
        let sparse = r#"{"model": {"type": "WordPiece", "vocab": {"[UNK]": 4000000000}, "unk_token": "[UNK]"},
                         "pre_tokenizer": {"type": "BertPreTokenizer"}}"#;
        let e = Tokenizer::from_json(sparse, Path::new("t.json")).expect_err("sparse ids");
        assert!(e.to_string().contains("the ids are not dense"), "{e}");
    }
}
