//! The tokenizer against Hugging Face's (the `tokenizers` crate reading the
//! same tokenizer.json, the library sentence-transformers calls) on seeded
//! random text built from hostile pieces: control and format characters,
//! combining marks, every script the normalizer treats specially, emoji
//! sequences, bracketed special tokens, very long words and texts.

mod common;

use edgeflow_minilm::Tokenizer;

const PIECES: &[&str] = &[
    "push",
    "the",
    "red",
    "block",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\u{0}",
    "\u{7}",
    "\u{1b}",
    "\u{7f}",
    "\u{85}",
    "\u{a0}",
    "\u{ad}",
    "\u{200b}",
    "\u{200d}",
    "\u{2028}",
    "\u{3000}",
    "\u{feff}",
    "\u{fffd}",
    "\u{e000}",
    "\u{f0000}",
    "\u{e0041}",
    "\u{10ffff}",
    "\u{301}",
    "\u{327}",
    "\u{94d}",
    "é",
    "É",
    "ß",
    "İ",
    "ı",
    "Σ",
    "ς",
    "ǅ",
    "ﬁ",
    "Ａ",
    "１",
    "ｶ",
    "中",
    "文",
    "㐀",
    "豈",
    "𠀀",
    "한",
    "ㄱ",
    "カ",
    "ひ",
    "ก",
    "ि",
    "م",
    "ש",
    "я",
    "ά",
    "😀",
    "🥲",
    "🫠",
    "👍🏽",
    "👨\u{200d}👩\u{200d}👧",
    "🇫🇷",
    "0️⃣",
    "✓",
    "→",
    "∀",
    "²",
    "½",
    "€",
    "$",
    "#",
    "@",
    "_",
    "-",
    "—",
    "'",
    "\"",
    "«",
    "“",
    ".",
    ",",
    "!",
    "?",
    "…",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "<",
    ">",
    "\\",
    "/",
    "|",
    "^",
    "`",
    "~",
    "+",
    "=",
    "%",
    "&",
    "*",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "[UNK]",
    "[PAD]",
    "[mask]",
    "[CLS",
    "unaffable",
    "antidisestablishmentarianism",
    "3.14",
    "2026",
    "x",
];

/// xorshift64*: a fixed sequence of cases on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn hf(dir: &std::path::Path, max_len: usize) -> tokenizers::Tokenizer {
    let mut t = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("hf tokenizer");
    // sentence-transformers' call: truncation at max_seq_length, no fixed
    // padding (the file asks for 128).
    t.with_padding(None);
    t.with_truncation(Some(tokenizers::TruncationParams {
        max_length: max_len,
        ..Default::default()
    }))
    .expect("truncation");
    t
}

#[test]
fn random_hostile_text_tokenizes_as_hugging_face_does() {
    let Some(dir) = common::model() else { return };
    let ours = Tokenizer::from_file(&dir.join("tokenizer.json")).expect("tokenizer");
    let theirs = hf(&dir, 256);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut checked = 0;
    for case in 0..3000 {
        // Mostly short texts; every 50th is long, some glue pieces into
        // one long word (no spaces).
        let n = if case % 50 == 0 {
            400
        } else {
            1 + rng.below(12)
        };
        let glue = case % 7 == 0;
        let mut text = String::new();
        for _ in 0..n {
            text.push_str(PIECES[rng.below(PIECES.len())]);
            if !glue && rng.below(3) == 0 {
                text.push(' ');
            }
        }
        let want: Vec<u32> = theirs
            .encode(text.as_str(), true)
            .expect("hf encode")
            .get_ids()
            .to_vec();
        let got = ours.encode(&text, 256).expect("encode");
        assert_eq!(got.ids, want, "case {case}: {text:?}");
        checked += 1;
    }
    assert_eq!(checked, 3000);
}

#[test]
fn every_code_point_alone_tokenizes_as_hugging_face_does() {
    let Some(dir) = common::model() else { return };
    let ours = Tokenizer::from_file(&dir.join("tokenizer.json")).expect("tokenizer");
    let theirs = hf(&dir, 4096);
    // Every Unicode scalar value, in chunks of 64 code points between
    // letters (one text per chunk keeps the test fast).
    let mut differ = Vec::new();
    let all: Vec<char> = (0u32..=0x10ffff).filter_map(char::from_u32).collect();
    for chunk in all.chunks(64) {
        let text: String = chunk.iter().flat_map(|&c| [c, ' ', 'a', ' ']).collect();
        let want = theirs
            .encode(text.as_str(), true)
            .expect("hf encode")
            .get_ids()
            .to_vec();
        let got = ours.encode(&text, 4096).expect("encode").ids;
        if got != want {
            differ.push(format!(
                "U+{:04X}..U+{:04X}",
                chunk[0] as u32,
                *chunk.last().expect("chunk") as u32
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "{} chunks differ: {}",
        differ.len(),
        differ.join(", ")
    );
}

#[test]
fn megabytes_of_text_take_milliseconds() {
    let Some(dir) = common::model() else { return };
    let ours = Tokenizer::from_file(&dir.join("tokenizer.json")).expect("tokenizer");
    let words = "push the red block onto the green target ".repeat(100_000); // 4 MB
    let t0 = std::time::Instant::now();
    let e = ours.encode(&words, 256).expect("encode");
    let dt = t0.elapsed();
    assert_eq!(e.ids.len(), 256);
    assert!(e.truncated);
    // One scan for added tokens over the whole text, the rest stops at 254
    // pieces.
    assert!(dt.as_secs_f64() < 2.0, "{dt:?}");
    let one_word = "x".repeat(4 << 20);
    let e = ours.encode(&one_word, 256).expect("encode");
    assert_eq!(e.ids, [101, 100, 102]);
}
