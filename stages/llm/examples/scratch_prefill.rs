//! scratch (not committed): prefill batched vs token by token.
use edgeflow_llm::{fetch, Llama};
use edgeflow_runtime::weights::GgufFile;
use std::time::Instant;
fn main() -> anyhow::Result<()> {
    let g = GgufFile::open(fetch::locate()?)?;
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu)?;
    let mut m = Llama::load_with(&dev, &g, false)?;
    let ids: Vec<u32> = (100..164).collect();
    for _ in 0..2 {
        m.reset();
        let t = Instant::now();
        m.forward(&ids)?;
        let a = t.elapsed().as_secs_f64();
        m.reset();
        let t = Instant::now();
        for &i in &ids { m.forward(&[i])?; }
        let b = t.elapsed().as_secs_f64();
        m.reset();
        let t = Instant::now();
        for c in ids.chunks(8) { m.forward(c)?; }
        let c = t.elapsed().as_secs_f64();
        println!("64 tokens: batched {a:.2}s, one by one {b:.2}s, chunks of 8 {c:.2}s");
    }
    Ok(())
}
