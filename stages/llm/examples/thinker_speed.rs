//! Prefill and decode tokens/s of a model card's GGUF, measured as
//! `edgeflow bench thinker` does (128-token prompt, 64 greedy tokens,
//! median of 3), without building the CLI.
//!
//! `cargo run -p edgeflow-llm --example thinker_speed -- qwen2.5-0.5b`

use edgeflow_llm::{sampling, ChatMessage, Config, Llama, TextTokenizer, VarBuilder};
use edgeflow_runtime::weights::GgufFile;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let name = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "qwen2.5-0.5b".into());
    let path = edgeflow_llm::cards::gguf_path(&name)?;
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu)?;
    let t = Instant::now();
    let g = GgufFile::open(&path)?;
    let cfg = Config::from_gguf(&g)?;
    let tok = TextTokenizer::from_gguf(&g)?;
    let mut m = Llama::load(&VarBuilder::from_reader(g, &dev), &cfg)?;
    let load = t.elapsed().as_secs_f64();
    let filler = "The history of the printing press begins in the fifteenth century, when \
                  movable type changed how books were made, sold and read across Europe. ";
    let text = tok.render_chat(&[ChatMessage::new("user", &filler.repeat(14))], true)?;
    let mut ids = tok.encode(&text)?;
    ids.truncate(128);
    let (mut pre, mut dec) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        m.reset();
        let t = Instant::now();
        let mut logits = m.forward(&ids)?;
        pre.push(ids.len() as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for _ in 0..64 {
            let id = sampling::argmax(&logits) as u32;
            logits = m.forward(&[id])?;
        }
        dec.push(64.0 / t.elapsed().as_secs_f64());
    }
    if std::env::var("PROFILE").is_ok() {
        m.reset();
        dev.stats().profile_ops(true);
        m.forward(&ids)?;
        let rows = dev.stats().op_profile();
        dev.stats().profile_ops(false);
        println!(
            "prefill: {}",
            edgeflow_runtime::render_op_profile(&rows, 12)
        );
    }
    let dec = median(dec);
    let bytes = m.weight_bytes_per_token() as f64;
    println!(
        "edgeflow {name}: prefill {:.1} tok/s, decode {:.1} tok/s ({:.1} GB/s of weights, {:.0} MB/token), load {:.2} s",
        median(pre),
        dec,
        bytes * dec / 1e9,
        bytes / 1e6,
        load
    );
    Ok(())
}
