//! The 20 factual questions of `edgeflow_llm::eval` for each model card
//! given (default: all that are cached), as a table.
//!
//! `cargo run -p edgeflow-llm --example thinker_eval -- smollm2 qwen2.5-0.5b`

use edgeflow_llm::{eval, Config, Llama, TextTokenizer, VarBuilder};
use edgeflow_runtime::weights::GgufFile;

fn main() -> anyhow::Result<()> {
    let mut names: Vec<String> = std::env::args().skip(1).collect();
    let verbose = names.iter().any(|n| n == "-v");
    names.retain(|n| n != "-v");
    if names.is_empty() {
        names = edgeflow_llm::cards::names()
            .into_iter()
            .filter(|n| edgeflow_llm::cards::gguf_path(n).is_ok())
            .map(String::from)
            .collect();
    }
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu)?;
    println!("| model | correct | tokens | s | tokens/s |");
    println!("|---|---|---|---|---|");
    for name in names {
        let path = edgeflow_llm::cards::gguf_path(&name)?;
        let g = GgufFile::open(&path)?;
        let cfg = Config::from_gguf(&g)?;
        let tok = TextTokenizer::from_gguf(&g)?;
        let mut m = Llama::load(&VarBuilder::from_reader(g, &dev), &cfg)?;
        let r = eval::evaluate(&mut m, &tok, 48)?;
        if verbose {
            for a in &r.answers {
                let mark = if a.correct { "ok " } else { "NO " };
                println!("{mark} {} -> {:?}", a.question, a.answer);
            }
        }
        println!(
            "| {name} | {}/{} | {} | {:.1} | {:.1} |",
            r.correct(),
            r.answers.len(),
            r.tokens,
            r.seconds,
            r.tokens as f64 / r.seconds
        );
    }
    Ok(())
}
