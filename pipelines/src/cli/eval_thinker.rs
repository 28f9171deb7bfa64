//! `edgeflow eval thinker`: the 20 short factual questions of
//! `edgeflow_llm::eval` for each thinker model, greedy through the model's
//! own chat template, as a table (correct answers, tokens, time). It makes
//! the speed / quality trade-off between the thinker models a measurement.

use anyhow::Context;
use edgeflow_llm::{eval, Config};
use edgeflow_runtime::weights::GgufFile;
use std::path::PathBuf;

/// `edgeflow eval thinker` options.
#[derive(Debug, clap::Args)]
pub(crate) struct ThinkerEvalArgs {
    /// Model cards, comma-separated (default: every thinker card in the
    /// model cache; `edgeflow models fetch NAME` puts one there).
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<String>,
    /// Longest answer, tokens.
    #[arg(long, default_value_t = 48)]
    pub max_tokens: usize,
    /// Print every question and answer.
    #[arg(long, short)]
    pub verbose: bool,
    /// Also write every answer and figure as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Run the questions for every model and print the table.
pub(super) fn eval_thinker(a: &ThinkerEvalArgs) -> anyhow::Result<()> {
    let names: Vec<String> = if a.models.is_empty() {
        edgeflow_llm::cards::names()
            .into_iter()
            .filter(|n| edgeflow_llm::cards::gguf_path(n).is_ok())
            .map(String::from)
            .collect()
    } else {
        a.models.clone()
    };
    if names.is_empty() {
        anyhow::bail!(
            "no thinker model in the cache: fetch one, e.g. `edgeflow models fetch smollm2` \
             (cards: {})",
            edgeflow_llm::cards::names().join(", ")
        );
    }
    let dev = edgeflow_backends::open(edgeflow_runtime::DeviceSpec::Cpu)?;
    println!(
        "{} factual questions, greedy, at most {} tokens each [{}]",
        eval::QUESTIONS.len(),
        a.max_tokens,
        super::eval::cpu_name()
    );
    println!("| model | correct | tokens | s (prefill and decode) | tokens/s |");
    println!("|---|---|---|---|---|");
    let mut rows = Vec::new();
    for name in &names {
        if edgeflow_llm::cards::card(name).is_none() {
            anyhow::bail!(
                "`{name}` is not a thinker model card (cards: {})",
                edgeflow_llm::cards::names().join(", ")
            );
        }
        let path = edgeflow_llm::cards::gguf_path(name)
            .with_context(|| format!("`{name}`: fetch it with `edgeflow models fetch {name}`"))?;
        let g = GgufFile::open(&path)?;
        let cfg = Config::from_gguf(&g)?;
        let (mut m, tok) = edgeflow_llm::load_gguf(g, &cfg, &dev)?;
        let r = eval::evaluate(&mut m, &tok, a.max_tokens)?;
        if a.verbose {
            for q in &r.answers {
                let mark = if q.correct { "ok" } else { "NO" };
                println!(
                    "{mark} {} -> {:?} (expected {})",
                    q.question, q.answer, q.expected
                );
            }
        }
        println!(
            "| {name} | {}/{} | {} | {:.1} | {:.1} |",
            r.correct(),
            r.answers.len(),
            r.tokens,
            r.seconds,
            r.tokens as f64 / r.seconds.max(1e-9)
        );
        rows.push(serde_json::json!({
            "model": name,
            "correct": r.correct(),
            "questions": r.answers.len(),
            "tokens": r.tokens,
            "seconds": r.seconds,
            "answers": r.answers.iter().map(|q| serde_json::json!({
                "question": q.question, "expected": q.expected,
                "answer": q.answer, "correct": q.correct,
            })).collect::<Vec<_>>(),
        }));
    }
    if let Some(p) = &a.json {
        let v = serde_json::json!({ "cpu": super::eval::cpu_name(), "models": rows });
        std::fs::write(p, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", p.display()))?;
        println!("wrote {}", p.display());
    }
    Ok(())
}
