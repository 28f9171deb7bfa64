//! Qwen2.5-Coder-0.5B-Instruct (qwen2, Q5_0 / Q8_0 / Q4_K / Q6_K) and
//! -1.5B-Instruct (Q4_K_M: Q4_K / Q6_K) against llama.cpp on the same GGUF:
//! tokenizer, chat template (tools included) and greedy continuations.
//!
//! The fixtures (`fixtures/qwen25_05b_greedy.json`,
//! `fixtures/qwen25_15b_greedy.json`) come from
//! `scripts/llm_reference.py --engine llama-cpp --model qwen2.5-0.5b` (and
//! `qwen2.5-1.5b`):
//! llama.cpp (llama-cpp-python 0.3.36 built from its sdist) tokenizes each
//! prompt and decodes 32 tokens greedily with its quantized kernels, storing
//! the gap between the two largest logits at each step.
//!
//! Both sides keep the weights quantized and quantize the activations to
//! int8, but not identically (llama.cpp rounds the Q8 activation scales to
//! f16 for Q5_0 / Q8_0 and uses -128 as Q8_K's extreme, sums in another
//! order), so logits differ by a few hundredths and the argmax may flip
//! where the reference's top two logits are that close; from there the
//! texts differ and are not compared further. The rule is the SmolLM2
//! test's: a divergence is allowed only where the reference's top-2 gap is
//! below `NEAR_TIE`.

#![allow(clippy::unwrap_used)]

use edgeflow_llm::{ChatMessage, Config, Llama, TextTokenizer, VarBuilder};
use edgeflow_runtime::weights::GgufFile;
use serde_json::Value;
use std::path::PathBuf;

/// One model under test: its card, its llama.cpp fixture, the shape its
/// GGUF must declare (layers, width, heads, KV heads) and its near-tie
/// bound: a reference top-2 gap below `near_tie` (in logits) is a near-tie
/// that different int8 activation rounding may break either way. Tighter
/// than SmolLM2's 1.5 (whose reference is f32 transformers): both sides
/// here quantize weights and activations alike.
struct Model {
    card: &'static str,
    fixture: &'static str,
    shape: (usize, usize, usize, usize),
    near_tie: f32,
}

/// Measured 2026-12-02: 9/13 cases identical over 32 tokens, the 4 others
/// diverge where llama.cpp's gap is 0.0004-0.068.
const QWEN_05B: Model = Model {
    card: "qwen2.5-0.5b",
    fixture: include_str!("fixtures/qwen25_05b_greedy.json"),
    shape: (24, 896, 14, 2),
    near_tie: 0.25,
};

/// Measured 2026-12-03: 6/13 identical; the 7 others diverge where llama.cpp's
/// gap is 0.0036-0.27 and ours puts the other token ahead by 0.003-0.13.
/// The widest, "def fibonacci(n):" at token 4 ("1" or "0" in `n <= 1`):
/// llama.cpp +0.27 for "1", ours +0.025 for "0", our f32-weight path
/// (`dequantize`) +0.19 for "1": two int8 paths 0.08 and 0.22 off the f32
/// margin in opposite directions. 28 layers of int8 activations (one scale
/// per 256 for the K-quants) move logits further than the 0.5B's 24 with
/// mostly 32-value blocks.
const QWEN_15B: Model = Model {
    card: "qwen2.5-1.5b",
    fixture: include_str!("fixtures/qwen25_15b_greedy.json"),
    shape: (28, 1536, 12, 2),
    near_tie: 0.35,
};

fn model(m: &Model) -> Option<PathBuf> {
    if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!(
            "EDGEFLOW_SKIP_MODEL_TESTS=1: skipping a test that needs {}",
            m.card
        );
        return None;
    }
    match edgeflow_llm::cards::gguf_path(m.card) {
        Ok(p) => Some(p),
        Err(e) => panic!(
            "{e}\n(run `edgeflow models fetch {}`, or set EDGEFLOW_SKIP_MODEL_TESTS=1 to skip)",
            m.card
        ),
    }
}

struct Case {
    kind: String,
    prompt: String,
    text: String,
    prompt_ids: Vec<u32>,
    expected: Vec<u32>,
    gaps: Vec<f32>,
}

fn fixture(m: &Model) -> (Vec<Case>, Vec<Value>) {
    let v: Value = serde_json::from_str(m.fixture).expect("fixture is JSON");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    let cases = v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            kind: c["kind"].as_str().expect("kind").to_string(),
            prompt: c["prompt"].as_str().expect("prompt").to_string(),
            text: c["text"].as_str().expect("text").to_string(),
            prompt_ids: ids(&c["prompt_ids"]),
            expected: ids(&c["expected_ids"]),
            gaps: c["top2_gap"]
                .as_array()
                .expect("gaps")
                .iter()
                .map(|x| x.as_f64().expect("gap") as f32)
                .collect(),
        })
        .collect();
    let tools = v["tools"].as_array().cloned().unwrap_or_default();
    (cases, tools)
}

#[test]
fn tokenizer_and_template_match_llama_cpp() {
    tokenizer_and_template(&QWEN_05B);
}

#[test]
fn tokenizer_and_template_of_the_1_5b_match_llama_cpp() {
    tokenizer_and_template(&QWEN_15B);
}

#[test]
fn greedy_matches_llama_cpp_up_to_near_ties() {
    greedy_up_to_near_ties(&QWEN_05B);
}

#[test]
fn greedy_of_the_1_5b_matches_llama_cpp_up_to_near_ties() {
    greedy_up_to_near_ties(&QWEN_15B);
}

fn tokenizer_and_template(m: &Model) {
    let Some(path) = model(m) else { return };
    let g = GgufFile::open(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&g).unwrap();
    let (cases, tools) = fixture(m);
    for c in &cases {
        let msgs = [ChatMessage::new("user", &c.prompt)];
        match c.kind.as_str() {
            "chat" => assert_eq!(tok.render_chat(&msgs, true).unwrap(), c.text),
            "tools" => assert_eq!(
                tok.render_chat_with_tools(&msgs, &tools, true).unwrap(),
                c.text
            ),
            _ => {}
        }
        let ids = tok.encode(&c.text).unwrap();
        assert_eq!(ids, c.prompt_ids, "token ids of {:?}", c.text);
        assert_eq!(tok.decode(&ids), c.text, "round trip of {:?}", c.text);
    }
    // End of turn: <|im_end|> is the GGUF's EOS, a control token.
    assert_eq!(tok.eos(), 151_645);
    assert!(tok.is_control(151_645) && tok.is_control(151_643));
}

fn greedy_up_to_near_ties(model_under_test: &Model) {
    let Some(path) = model(model_under_test) else {
        return;
    };
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    assert_eq!(cfg.arch, edgeflow_llm::Arch::Qwen2);
    assert_eq!(
        (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_kv_head),
        model_under_test.shape
    );
    assert_eq!(cfg.rope_theta, 1e6);
    let mut m = Llama::load(&VarBuilder::from_reader(g, &dev), &cfg).unwrap();
    let (cases, _) = fixture(model_under_test);
    assert!(cases.len() >= 10);
    let mut identical = 0;
    for c in &cases {
        m.reset();
        let mut logits = m.forward(&c.prompt_ids).unwrap();
        let mut diverged = None;
        for (k, &want) in c.expected.iter().enumerate() {
            let got = edgeflow_llm::sampling::argmax(&logits) as u32;
            if got != want {
                diverged = Some((k, got));
                break;
            }
            if k + 1 < c.expected.len() {
                logits = m.forward(&[got]).unwrap();
            }
        }
        match diverged {
            None => identical += 1,
            Some((k, got)) => {
                eprintln!(
                    "{:?}: first divergence at token {k} (ours {got}, llama.cpp {}), its top-2 gap {:.4}",
                    c.prompt, c.expected[k], c.gaps[k]
                );
                assert!(
                    c.gaps[k] < model_under_test.near_tie,
                    "{:?} diverges at token {k} where llama.cpp is not near a tie (gap {} >= {})",
                    c.prompt,
                    c.gaps[k],
                    model_under_test.near_tie
                );
            }
        }
    }
    eprintln!(
        "{}: {identical}/{} identical over 32 tokens",
        model_under_test.card,
        cases.len()
    );
}
