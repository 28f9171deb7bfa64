//! Qwen2.5-Coder-0.5B-Instruct (qwen2, Q5_0 / Q8_0 / Q4_K / Q6_K) against
//! llama.cpp on the same GGUF: tokenizer, chat template (tools included) and
//! greedy continuations.
//!
//! The fixture (`fixtures/qwen25_05b_greedy.json`) comes from
//! `scripts/llm_reference.py --engine llama-cpp --model qwen2.5-0.5b`:
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

/// A reference top-2 gap below this (in logits) is a near-tie that
/// different int8 activation rounding may break either way. Tighter than
/// SmolLM2's 1.5 (whose reference is f32 transformers): both sides here
/// quantize weights and activations alike. Measured 2026-12-02: 9/13 cases
/// identical over 32 tokens, the 4 others diverge where llama.cpp's gap is
/// 0.0004-0.068.
const NEAR_TIE: f32 = 0.25;

fn model() -> Option<PathBuf> {
    if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("EDGEFLOW_SKIP_MODEL_TESTS=1: skipping a test that needs Qwen2.5-0.5B");
        return None;
    }
    match edgeflow_llm::cards::gguf_path("qwen2.5-0.5b") {
        Ok(p) => Some(p),
        Err(e) => panic!(
            "{e}\n(run `edgeflow models fetch qwen2.5-0.5b`, or set EDGEFLOW_SKIP_MODEL_TESTS=1 to skip)"
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

fn fixture() -> (Vec<Case>, Vec<Value>) {
    let raw = include_str!("fixtures/qwen25_05b_greedy.json");
    let v: Value = serde_json::from_str(raw).expect("fixture is JSON");
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
    let Some(path) = model() else { return };
    let g = GgufFile::open(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&g).unwrap();
    let (cases, tools) = fixture();
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

#[test]
fn greedy_matches_llama_cpp_up_to_near_ties() {
    let Some(path) = model() else { return };
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    assert_eq!(cfg.arch, edgeflow_llm::Arch::Qwen2);
    assert_eq!(
        (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_kv_head),
        (24, 896, 14, 2)
    );
    assert_eq!(cfg.rope_theta, 1e6);
    let mut m = Llama::load(&VarBuilder::from_reader(g, &dev), &cfg).unwrap();
    let (cases, _) = fixture();
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
                    c.gaps[k] < NEAR_TIE,
                    "{:?} diverges at token {k} where llama.cpp is not near a tie (gap {} >= {NEAR_TIE})",
                    c.prompt,
                    c.gaps[k]
                );
            }
        }
    }
    eprintln!("{identical}/{} identical over 32 tokens", cases.len());
}
