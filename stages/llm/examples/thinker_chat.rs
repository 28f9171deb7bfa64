//! One greedy answer per question from a model card's GGUF, with timings.
//!
//! `cargo run -p edgeflow-llm --example thinker_chat -- qwen2.5-0.5b "What is the capital of France?"`

use edgeflow_llm::{sampling, ChatMessage, Config, Llama, TextTokenizer, VarBuilder};
use edgeflow_runtime::weights::GgufFile;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "qwen2.5-0.5b".into());
    let questions: Vec<String> = args.collect();
    let path = edgeflow_llm::cards::gguf_path(&name)?;
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu)?;
    let t = Instant::now();
    let g = GgufFile::open(&path)?;
    let cfg = Config::from_gguf(&g)?;
    let tok = TextTokenizer::from_gguf(&g)?;
    let mut m = Llama::load(&VarBuilder::from_reader(g, &dev), &cfg)?;
    println!(
        "loaded {name} in {:.2} s ({:?})",
        t.elapsed().as_secs_f64(),
        cfg.arch
    );
    for q in questions {
        let text = tok.render_chat(&[ChatMessage::new("user", &q)], true)?;
        let ids = tok.encode(&text)?;
        m.reset();
        let t = Instant::now();
        let mut logits = m.forward(&ids)?;
        let prefill = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut out = Vec::new();
        for _ in 0..64 {
            let id = sampling::argmax(&logits) as u32;
            if id == tok.eos() || tok.is_control(id) {
                break;
            }
            out.push(id);
            logits = m.forward(&[id])?;
        }
        let decode = t.elapsed().as_secs_f64();
        println!(
            "Q: {q}\nA: {}\n   ({} prompt tokens {:.0} tok/s, {} tokens {:.1} tok/s)",
            tok.decode(&out),
            ids.len(),
            ids.len() as f64 / prefill,
            out.len(),
            out.len() as f64 / decode.max(1e-9)
        );
    }
    Ok(())
}
