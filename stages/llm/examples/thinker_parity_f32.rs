//! Greedy continuations of the parity fixture with the GGUF dequantized to
//! f32 (the reference's arithmetic) and with quantized matmuls, side by side.
//!
//! `cargo run -p edgeflow-llm --example thinker_parity_f32`

use edgeflow_llm::{greedy, Config, Llama, VarBuilder};
use edgeflow_runtime::weights::GgufFile;

fn main() -> anyhow::Result<()> {
    let path = edgeflow_llm::SMOLLM2.path(edgeflow_llm::cards::GGUF_FILE)?;
    let g = GgufFile::open(&path)?;
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu)?;
    let fx: serde_json::Value =
        serde_json::from_str(include_str!("../tests/fixtures/smollm2_greedy.json"))?;
    for dequantize in [true, false] {
        let cfg = Config {
            dequantize,
            ..Config::from_gguf(&g)?
        };
        let vb = VarBuilder::from_reader(GgufFile::open(&path)?, &dev);
        let mut m = Llama::load(&vb, &cfg)?;
        let mut same = 0;
        let cases = fx["cases"].as_array().cloned().unwrap_or_default();
        let t = std::time::Instant::now();
        for c in &cases {
            let ids: Vec<u32> = serde_json::from_value(c["prompt_ids"].clone())?;
            let want: Vec<u32> = serde_json::from_value(c["expected_ids"].clone())?;
            let gaps: Vec<f32> = serde_json::from_value(c["top2_gap"].clone())?;
            m.reset();
            let (got, ours) = greedy(&mut m, &ids, want.len())?;
            match got.iter().zip(&want).position(|(a, b)| a != b) {
                None => same += 1,
                Some(k) => println!(
                    "  dequantize={dequantize} {:?}: diverges at {k}: ref gap {:.4}, ours {:.4}",
                    c["prompt"], gaps[k], ours[k]
                ),
            }
        }
        println!(
            "dequantize={dequantize}: {same}/{} identical, {:.1} s",
            cases.len(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
