//! Greedy parity with PyTorch `transformers` on the same GGUF, and the
//! tokenizer / chat template against the reference tokenizer.
//!
//! The fixture (`fixtures/smollm2_greedy.json`) comes from
//! `scripts/llm_reference.py`: transformers 5.24 / torch 2.11 load
//! SmolLM2-135M-Instruct.Q4_1.gguf, dequantize every tensor to f32 and decode
//! 32 tokens greedily for 10 chat turns and 2 raw prompts; for each step it
//! stores the gap between the two largest logits.
//!
//! The product path computes with the weights still quantized: the CPU
//! backend's Q4_1 / Q8_0 GEMV quantizes the activations to int8 per block of
//! 32 (as llama.cpp does) before the integer dot products, while the
//! reference multiplies f32 activations by the dequantized f32 weights. That
//! moves logits by up to about a logit on this model, so where the
//! reference's top two logits are that close the argmax may flip; from there
//! the two continuations are different texts and are not compared further.
//!
//! Checked here:
//! - weights dequantized to f32 (the reference's arithmetic): all 12
//!   continuations identical over 32 tokens;
//! - quantized: identical up to the first divergence, and a divergence only
//!   where the reference's top-2 gap is below `NEAR_TIE` logits. Measured on
//!   2026-11-29: 1/12 identical over 32 tokens; first divergences at tokens
//!   1-31 (median 7), reference gaps there 0.01-1.13 (table in
//!   stages/llm/README.md). The int8 simulation of the backend kernel matches
//!   it to 3e-5, so the flips come from activation quantization, not a bug.

#![allow(clippy::unwrap_used)]

use edgeflow_llm::{greedy, ChatMessage, Config, Llama, TextTokenizer, VarBuilder};
use edgeflow_runtime::weights::GgufFile;
use serde_json::Value;
use std::path::PathBuf;

/// A reference top-2 gap below this (in logits) is a near-tie that
/// quantized arithmetic may break either way.
const NEAR_TIE: f32 = 1.5;

fn model() -> Option<PathBuf> {
    if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("EDGEFLOW_SKIP_MODEL_TESTS=1: skipping a test that needs SmolLM2");
        return None;
    }
    match edgeflow_llm::SMOLLM2.path(edgeflow_llm::cards::GGUF_FILE) {
        Ok(p) => Some(p),
        Err(e) => panic!(
            "{e}\n(run `edgeflow models fetch smollm2`, or set EDGEFLOW_SKIP_MODEL_TESTS=1 to skip)"
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

fn fixture() -> Vec<Case> {
    let raw = include_str!("fixtures/smollm2_greedy.json");
    let v: Value = serde_json::from_str(raw).expect("fixture is JSON");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    v["cases"]
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
        .collect()
}

#[test]
fn tokenizer_and_template_match_the_reference() {
    let Some(path) = model() else { return };
    let g = GgufFile::open(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&g).unwrap();
    for c in fixture() {
        if c.kind == "chat" {
            let text = tok
                .render_chat(&[ChatMessage::new("user", &c.prompt)], true)
                .unwrap();
            assert_eq!(text, c.text, "chat template for {:?}", c.prompt);
        }
        let ids = tok.encode(&c.text).unwrap();
        assert_eq!(ids, c.prompt_ids, "token ids of {:?}", c.text);
        assert_eq!(tok.decode(&ids), c.text, "round trip of {:?}", c.text);
    }
}

fn load(dequantize: bool) -> Option<Llama> {
    let path = model()?;
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let cfg = Config {
        dequantize,
        ..Config::from_gguf(&g).unwrap()
    };
    Some(Llama::load(&VarBuilder::from_reader(g, &dev), &cfg).unwrap())
}

/// With the weights dequantized to f32 (the reference's arithmetic) every
/// continuation is identical, token for token: the model code is right.
#[test]
fn greedy_f32_matches_transformers_exactly() {
    let Some(mut m) = load(true) else { return };
    let cases = fixture();
    assert!(cases.len() >= 10 && cases.iter().all(|c| c.expected.len() >= 32));
    for c in &cases {
        m.reset();
        let (got, _) = greedy(&mut m, &c.prompt_ids, c.expected.len()).unwrap();
        assert_eq!(got, c.expected, "greedy continuation of {:?}", c.prompt);
    }
}

/// Quantized weights (the product path): identical up to the first
/// divergence, and divergences only at reference near-ties. Returns how
/// many cases were identical over all their tokens.
fn check_quantized(m: &mut Llama, cases: &[Case]) -> usize {
    let mut identical = 0;
    for c in cases {
        m.reset();
        // Decode until the first divergence (the texts differ from there).
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
                    "{:?}: first divergence at token {k} (ours {got}, reference {}), reference top-2 gap {:.4}",
                    c.prompt, c.expected[k], c.gaps[k]
                );
                assert!(
                    c.gaps[k] < NEAR_TIE,
                    "{:?} diverges at token {k} where the reference is not near a tie \
                     (gap {} >= {NEAR_TIE})",
                    c.prompt,
                    c.gaps[k]
                );
            }
        }
    }
    identical
}

/// Every fixture case on the quantized path.
#[test]
fn greedy_quantized_diverges_only_at_near_ties() {
    let Some(mut m) = load(false) else { return };
    let cases = fixture();
    let n = check_quantized(&mut m, &cases);
    eprintln!("{n}/{} identical over 32 tokens", cases.len());
}
