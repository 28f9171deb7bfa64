//! `edgeflow validate`: check a pipeline file without running it.

use anyhow::Context;
use edgeflow_graph::{Diagnostic, Error, Override, Plan};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `edgeflow validate`.
#[derive(Debug, clap::Args)]
pub(crate) struct ValidateArgs {
    /// Pipeline YAML file.
    pub file: PathBuf,
    /// Override a param: STAGE.PARAM=VALUE (repeatable).
    ///
    /// `STAGE.device=cpu|gpu|gpu:N|npu|npu:N|auto`, `STAGE.threads=N` (1..=256)
    /// and `STAGE.inline=true|false` override the stage's placement like
    /// params (a kind with its own `device` param, such as `mic` or
    /// `speaker`, gets that param instead). Values are checked as in the file.
    /// Paths are relative to the current directory.
    #[arg(long = "set", value_name = "STAGE.PARAM=VALUE")]
    pub set: Vec<String>,
    /// Print the result as JSON on stdout (for editors and CI): `ok`, counts,
    /// and each diagnostic's file, line, column, context, message and fix.
    #[arg(long)]
    pub json: bool,
}

/// Parse `--set` arguments.
pub(super) fn overrides(set: &[String]) -> anyhow::Result<Vec<Override>> {
    set.iter()
        .map(|s| s.parse::<Override>().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()
        .context("bad --set")
}

/// Load and validate `file`: the plan, or every diagnostic (a file that
/// cannot be read is one diagnostic without a line).
fn check(file: &Path, overrides: &[Override]) -> anyhow::Result<Result<Plan, Vec<Diagnostic>>> {
    let registry = edgeflow::registry();
    match edgeflow_graph::load_file(file, &registry, overrides) {
        Ok(plan) => Ok(Ok(plan)),
        Err(Error::Invalid(diags)) => Ok(Err(diags)),
        Err(Error::Io { path, error }) => Ok(Err(vec![Diagnostic {
            file: Some(path),
            message: format!("cannot read the file: {error}"),
            fix: Some("check the path".into()),
            ..Default::default()
        }])),
        Err(e) => Err(e.into()),
    }
}

/// Load and validate `file`. On validation errors, prints every diagnostic
/// to stderr and returns `Ok(None)`: the caller exits non-zero.
pub(super) fn load(file: &Path, set: &[String]) -> anyhow::Result<Option<Plan>> {
    match check(file, &overrides(set)?)? {
        Ok(plan) => Ok(Some(plan)),
        Err(diags) => {
            // Best effort: the snippet is skipped when the text is unreadable.
            let source = std::fs::read(file)
                .ok()
                .map(|b| String::from_utf8_lossy(&b).into_owned());
            for d in &diags {
                eprint!("{}", render(d, source.as_deref()));
            }
            eprintln!(
                "{}: {} problem{} found",
                file.display(),
                diags.len(),
                if diags.len() == 1 { "" } else { "s" }
            );
            Ok(None)
        }
    }
}

/// A diagnostic as printed on the terminal: the located message, the source
/// line with a caret under the column, then the fix.
pub(super) fn render(d: &Diagnostic, source: Option<&str>) -> String {
    let head = Diagnostic {
        fix: None,
        ..d.clone()
    };
    let mut out = format!("error: {head}\n");
    let text_line = d
        .line
        .and_then(|l| source.and_then(|s| s.lines().nth(l.checked_sub(1)?)));
    if let (Some(l), Some(text)) = (d.line, text_line) {
        let gutter = l.to_string().len();
        let chars: Vec<char> = text
            .chars()
            .map(|c| if c == '\t' { ' ' } else { c })
            .collect();
        let col = d.column.unwrap_or(1).saturating_sub(1).min(chars.len());
        // Long lines: a window around the column.
        const WIDTH: usize = 100;
        let start = col.saturating_sub(WIDTH / 2);
        let end = (start + WIDTH).min(chars.len());
        let mut shown: String = chars[start..end].iter().collect();
        let mut lead = col - start;
        if start > 0 {
            shown.insert_str(0, "...");
            lead += 3;
        }
        if end < chars.len() {
            shown.push_str("...");
        }
        out.push_str(&format!(" {l} | {shown}\n"));
        if d.column.is_some() {
            out.push_str(&format!(" {:gutter$} | {}^\n", "", " ".repeat(lead)));
        }
    }
    if let Some(fix) = &d.fix {
        out.push_str(&format!("  fix: {fix}\n"));
    }
    out
}

fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

fn diagnostic_json(d: &Diagnostic) -> Value {
    json!({
        "file": d.file.as_ref().map(|f| f.display().to_string()),
        "line": d.line,
        "column": d.column,
        "context": d.context,
        "message": d.message,
        "fix": d.fix,
    })
}

/// Validate a pipeline: prints a one-line summary, or every problem.
pub(super) fn run(a: ValidateArgs) -> anyhow::Result<ExitCode> {
    if a.json {
        let result = check(&a.file, &overrides(&a.set)?)?;
        let (code, v) = match &result {
            Ok(plan) => (
                ExitCode::SUCCESS,
                json!({
                    "ok": true,
                    "file": a.file.display().to_string(),
                    "name": plan.name,
                    "stages": plan.stages.len(),
                    "edges": plan.edges.len(),
                    "diagnostics": [],
                }),
            ),
            Err(diags) => (
                ExitCode::FAILURE,
                json!({
                    "ok": false,
                    "file": a.file.display().to_string(),
                    "diagnostics": diags.iter().map(diagnostic_json).collect::<Vec<_>>(),
                }),
            ),
        };
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(code);
    }
    let Some(plan) = load(&a.file, &a.set)? else {
        return Ok(ExitCode::FAILURE);
    };
    let sources = plan.stages.iter().filter(|s| s.source).count();
    let back = plan.edges.iter().filter(|e| e.back_edge).count();
    let extra = if back > 0 {
        format!(", {}", plural(back, "back-edge"))
    } else {
        String::new()
    };
    println!(
        "OK {}: pipeline `{}`, {} ({}), {}{extra}",
        a.file.display(),
        plan.name,
        plural(plan.stages.len(), "stage"),
        plural(sources, "source"),
        plural(plan.edges.len(), "edge"),
    );
    Ok(ExitCode::SUCCESS)
}
