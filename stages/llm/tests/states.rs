//! `Llama::forward_states` and `Llama::embed_tokens` on SmolLM2: the
//! logits are `forward`'s bit for bit, and a prefill's state rows are those
//! of feeding the same tokens one at a time.
//!
//! Measured on 2026-11-30 (37-token chat prompt): with the weights expanded
//! to f32, prefill rows and one-at-a-time rows differ by at most 7.4e-5 (of
//! values up to ~50): a prefill multiplies s rows with a GEMM, a step one
//! row with a GEMV, adding in a different order. With the weights kept
//! quantized (Q4_1, the product path) every op computes a row the same way
//! whatever the number of rows, so the rows are equal bit for bit (checked
//! here; `prefill_decode.rs` checks the logits on SmolLM2 and Qwen2.5).

#![allow(clippy::unwrap_used)]

use edgeflow_llm::{ChatMessage, Config, Llama, TextTokenizer, VarBuilder};
use edgeflow_runtime::weights::GgufFile;

/// Prefill rows versus one-token-at-a-time rows on f32 weights: GEMM versus
/// GEMV summation order (measured 7.4e-5 on an AVX2 machine), with room for
/// other SIMD paths' orders; a real difference (a wrong row, a missing
/// term) is of order 1.
const ROW_TOL: f32 = 2e-4;

fn load(dequantize: bool) -> Option<(Llama, TextTokenizer)> {
    if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("EDGEFLOW_SKIP_MODEL_TESTS=1: skipping a test that needs SmolLM2");
        return None;
    }
    let path = match edgeflow_llm::SMOLLM2.path(edgeflow_llm::cards::GGUF_FILE) {
        Ok(p) => p,
        Err(e) => panic!(
            "{e}\n(run `edgeflow models fetch smollm2`, or set EDGEFLOW_SKIP_MODEL_TESTS=1 to skip)"
        ),
    };
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&g).unwrap();
    let cfg = Config {
        dequantize,
        ..Config::from_gguf(&g).unwrap()
    };
    Some((
        Llama::load(&VarBuilder::from_reader(g, &dev), &cfg).unwrap(),
        tok,
    ))
}

fn prompt(tok: &TextTokenizer) -> Vec<u32> {
    let text = tok
        .render_chat(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    tok.encode(&text).unwrap()
}

/// `forward` then `forward_states` over a prompt and two steps: the same
/// logits bit for bit, the cache advanced alike; returns the prefill's
/// state rows and those of the prompt fed one token at a time.
fn check(m: &mut Llama, ids: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let d = m.config().d_model;
    let s = ids.len();
    let steps = [1u32, 2];
    let same = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    };

    m.reset();
    let mut want = vec![m.forward(ids).unwrap()];
    for t in steps {
        want.push(m.forward(&[t]).unwrap());
    }

    m.reset();
    let (logits, states) = m.forward_states(ids).unwrap();
    assert_eq!(m.position(), s, "the KV cache holds the prompt");
    assert_eq!(states.dims(), &[1, s, d]);
    assert!(
        same(&logits, &want[0]),
        "prefill logits differ from forward's"
    );
    for (k, t) in steps.iter().enumerate() {
        let (logits, st) = m.forward_states(&[*t]).unwrap();
        assert_eq!(st.dims(), &[1, 1, d]);
        assert!(
            same(&logits, &want[k + 1]),
            "step {k} logits differ from forward's"
        );
    }
    assert_eq!(m.position(), s + steps.len());

    m.reset();
    let mut one = Vec::with_capacity(s * d);
    for &t in ids {
        let (_, st) = m.forward_states(&[t]).unwrap();
        one.extend(st.to_vec_f32().unwrap());
    }
    (states.to_vec_f32().unwrap(), one)
}

/// Largest |a - b|, whether a and b are equal bit for bit, largest |a|.
fn compare(a: &[f32], b: &[f32]) -> (f32, bool, f32) {
    let max = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let bitwise = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    (max, bitwise, a.iter().map(|v| v.abs()).fold(0f32, f32::max))
}

#[test]
fn forward_states_keeps_the_logits_quantized() {
    let Some((mut m, tok)) = load(false) else {
        return;
    };
    let ids = prompt(&tok);
    let (prefill, one) = check(&mut m, &ids);
    let (max, bitwise, scale) = compare(&prefill, &one);
    eprintln!(
        "quantized, prefill vs one at a time over {} rows: max |diff| {max:e} \
         (bitwise {bitwise}; max |value| {scale})",
        ids.len()
    );
    assert!(bitwise, "quantized prefill rows differ by up to {max}");
    // A state row is not its embedding alone: the hidden state is there.
    let emb = m.embed_tokens(&ids).unwrap().to_vec_f32().unwrap();
    assert!(prefill.iter().zip(&emb).any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn forward_states_prefill_rows_match_one_token_at_a_time_f32() {
    let Some((mut m, tok)) = load(true) else {
        return;
    };
    let ids = prompt(&tok);
    let (prefill, one) = check(&mut m, &ids);
    let (max, bitwise, scale) = compare(&prefill, &one);
    eprintln!(
        "f32, prefill vs one at a time over {} rows: max |diff| {max:e} \
         (bitwise {bitwise}; max |value| {scale})",
        ids.len()
    );
    assert!(max <= ROW_TOL, "max |diff| {max} > {ROW_TOL}");
}

#[test]
fn embed_tokens_is_the_embedding_rows_and_checks_ids() {
    let Some((m, _)) = load(false) else { return };
    let c = m.config().clone();
    let e = m.embed_tokens(&[0, 5, 5, c.vocab as u32 - 1]).unwrap();
    assert_eq!(e.dims(), &[1, 4, c.d_model]);
    let v = e.to_vec_f32().unwrap();
    let (d, row) = (c.d_model, |i: usize| &v[i * c.d_model..(i + 1) * c.d_model]);
    assert_eq!(row(1), row(2), "the same id gives the same row");
    assert_ne!(row(0), row(1));
    assert!(v[..d].iter().all(|x| x.is_finite()));
    assert_eq!(m.position(), 0, "the cache is untouched");
    let err = m
        .embed_tokens(&[1, c.vocab as u32])
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    assert!(m.embed_tokens(&[]).is_err());
}
