//! A prefill and the same tokens fed one at a time (or in other splits)
//! give the same logits bit for bit, with the weights kept quantized:
//! SmolLM2 (Q4_1, Q8_0 embeddings) and Qwen2.5-Coder-0.5B (Q5_0 / Q8_0 /
//! Q4_K / Q6_K, Q/K/V biases).
//!
//! Every op of a decoder layer computes a row the same way whatever the
//! number of rows: the quantized linears quantize each activation row on
//! its own and sum in a fixed order, element-wise ops run the same vector
//! code on every layout, and attention computes each query row alone.
//! Until 2026-12-02 SiLU took candle's scalar `exp` on the gate half of a
//! fused gate/up product (a strided view when there are several rows) and
//! the vectorized `exp` on one row (contiguous): an ulp of difference that
//! the int8 activation rounding of the next linear turned into logits
//! differing by up to ~2 on SmolLM2 after two tokens.

#![allow(clippy::unwrap_used)]

use edgeflow_llm::{ChatMessage, Config, Llama, TextTokenizer, VarBuilder};
use edgeflow_runtime::weights::GgufFile;

fn load(card: &str) -> Option<(Llama, TextTokenizer)> {
    if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("EDGEFLOW_SKIP_MODEL_TESTS=1: skipping a test that needs {card}");
        return None;
    }
    let path = match edgeflow_llm::cards::gguf_path(card) {
        Ok(p) => p,
        Err(e) => panic!(
            "{e}\n(run `edgeflow models fetch {card}`, or set EDGEFLOW_SKIP_MODEL_TESTS=1 to skip)"
        ),
    };
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let tok = TextTokenizer::from_gguf(&g).unwrap();
    let cfg = Config::from_gguf(&g).unwrap();
    Some((
        Llama::load(&VarBuilder::from_reader(g, &dev), &cfg).unwrap(),
        tok,
    ))
}

fn prompt(tok: &TextTokenizer) -> Vec<u32> {
    let text = tok
        .render_chat(
            &[ChatMessage::new(
                "user",
                "Write a short poem about the sea, then explain what a tide is.",
            )],
            true,
        )
        .unwrap();
    tok.encode(&text).unwrap()
}

/// The logits after each chunk of `ids` fed in `splits` (chunk lengths).
fn run(m: &mut Llama, ids: &[u32], splits: &[usize]) -> Vec<Vec<f32>> {
    m.reset();
    let mut out = Vec::new();
    let mut at = 0;
    for &len in splits {
        out.push(m.forward(&ids[at..at + len]).unwrap());
        at += len;
    }
    assert_eq!(at, ids.len());
    out
}

fn check(card: &str) {
    let Some((mut m, tok)) = load(card) else {
        return;
    };
    let ids = prompt(&tok);
    let s = ids.len();
    assert!(s > 16, "{card}: a prompt of {s} tokens");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let max_diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    // One token at a time: the logits after each prefix.
    let one = run(&mut m, &ids, &vec![1; s]);
    // Two tokens (the smallest prefill), the whole prompt, and uneven
    // chunks, each against the one-at-a-time logits of the same prefix.
    let splits: [Vec<usize>; 3] = [vec![2], vec![s], vec![5, 1, 7, s - 13]];
    for split in &splits {
        let got = run(&mut m, &ids[..split.iter().sum()], split);
        let mut at = 0;
        for (len, logits) in split.iter().zip(&got) {
            at += len;
            let want = &one[at - 1];
            assert!(
                bits(logits) == bits(want),
                "{card}: split {split:?}, logits after {at} tokens differ from one at a time \
                 by up to {}",
                max_diff(logits, want)
            );
        }
    }
    // Decode steps after a prefill continue as after one-at-a-time steps.
    let steps = [17u32, 42];
    let mut after = Vec::new();
    for split in [vec![s], vec![1; s]] {
        run(&mut m, &ids, &split);
        after.push(steps.map(|t| bits(&m.forward(&[t]).unwrap())));
    }
    assert!(
        after[0] == after[1],
        "{card}: decode after a prefill differs"
    );
}

#[test]
fn smollm2_prefill_equals_one_token_at_a_time() {
    check("smollm2");
}

#[test]
fn qwen25_05b_prefill_equals_one_token_at_a_time() {
    check("qwen2.5-0.5b");
}
