//! Thinker throughput on the cached SmolLM2 (see `edgeflow_llm::bench`).
//!
//! `cargo run -p edgeflow-llm --example thinker_bench [PROMPT_TOKENS DECODE_TOKENS RUNS]`

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let mut o = edgeflow_llm::BenchOptions::default();
    if let [p, d, r, ..] = args[..] {
        o.prompt_tokens = p;
        o.decode_tokens = d;
        o.runs = r;
    }
    o.dequantize = std::env::var("DEQUANTIZE").as_deref() == Ok("1");
    let dev = edgeflow_backends::open(o.device)?;
    print!("{}", edgeflow_llm::bench(&o, &dev)?);
    Ok(())
}
