//! `edgeflow graph`: the pipeline as Graphviz dot or a Mermaid flowchart.
//! Stages are nodes labelled with kind and device; edges are labelled with
//! their ports, policy and capacity; back-edges are dashed.

use edgeflow_graph::{Plan, PlannedEdge};
use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Graph output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum GraphFormat {
    /// Graphviz dot (`edgeflow graph p.yaml | dot -Tsvg > p.svg`).
    Dot,
    /// Mermaid flowchart (paste into Markdown).
    Mermaid,
}

/// Arguments of `edgeflow graph`.
#[derive(Debug, clap::Args)]
pub(crate) struct GraphArgs {
    /// Pipeline YAML file.
    pub file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "dot")]
    pub format: GraphFormat,
    /// Override a param: STAGE.PARAM=VALUE (repeatable).
    ///
    /// `STAGE.device=cpu|gpu|gpu:N|npu|npu:N|auto`, `STAGE.threads=N` (1..=256)
    /// and `STAGE.inline=true|false` override the stage's placement like
    /// params (a kind with its own `device` param, such as `mic` or
    /// `speaker`, gets that param instead). Values are checked as in the file.
    /// Paths are relative to the current directory.
    #[arg(long = "set", value_name = "STAGE.PARAM=VALUE")]
    pub set: Vec<String>,
}

/// Print the graph of a valid pipeline.
pub(super) fn run(a: GraphArgs) -> anyhow::Result<ExitCode> {
    let Some(plan) = super::validate::load(&a.file, &a.set)? else {
        return Ok(ExitCode::FAILURE);
    };
    print!(
        "{}",
        match a.format {
            GraphFormat::Dot => dot(&plan),
            GraphFormat::Mermaid => mermaid(&plan),
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// `out -> in`, policy, capacity and age limit of an edge.
fn edge_label(plan: &Plan, e: &PlannedEdge) -> (String, String) {
    let from = &plan.stages[e.from.0].ports.outputs[e.from.1].name;
    let to = &plan.stages[e.to.0].ports.inputs[e.to.1].name;
    let mut how = format!("{}, {}", e.policy.name(), e.capacity);
    if let Some(age) = e.max_age {
        let _ = write!(how, ", max_age {age:?}");
    }
    if e.back_edge {
        how.push_str(", back-edge");
    }
    (format!("{from} → {to}"), how)
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Graphviz dot.
pub(super) fn dot(plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", dot_escape(&plan.name));
    out.push_str("  rankdir=LR;\n  node [shape=box, style=rounded, fontname=\"Helvetica\"];\n");
    out.push_str("  edge [fontname=\"Helvetica\", fontsize=10];\n");
    for s in &plan.stages {
        let style = if s.source {
            ", style=\"rounded,bold\""
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  \"{id}\" [label=\"{id}\\n{kind} · {dev}\"{style}];",
            id = dot_escape(&s.id),
            kind = dot_escape(&s.kind),
            dev = s.env.device,
        );
    }
    for e in &plan.edges {
        let (ports, how) = edge_label(plan, e);
        let dashed = if e.back_edge {
            ", style=dashed, constraint=false"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  \"{}\" -> \"{}\" [label=\"{}\\n{}\"{dashed}];",
            dot_escape(&plan.stages[e.from.0].id),
            dot_escape(&plan.stages[e.to.0].id),
            dot_escape(&ports),
            dot_escape(&how),
        );
    }
    out.push_str("}\n");
    out
}

fn mermaid_escape(s: &str) -> String {
    s.replace('"', "#quot;")
}

/// Mermaid flowchart. Nodes are `s0`, `s1`... so any stage id is safe.
pub(super) fn mermaid(plan: &Plan) -> String {
    let mut out = String::from("flowchart LR\n");
    for (i, s) in plan.stages.iter().enumerate() {
        let label = format!("{}<br/>{} · {}", s.id, s.kind, s.env.device);
        let (open, close) = if s.source { ("([", "])") } else { ("[", "]") };
        let _ = writeln!(out, "  s{i}{open}\"{}\"{close}", mermaid_escape(&label));
    }
    for e in &plan.edges {
        let (ports, how) = edge_label(plan, e);
        let arrow = if e.back_edge { "-.->" } else { "-->" };
        let _ = writeln!(
            out,
            "  s{} {arrow}|\"{}<br/>{}\"| s{}",
            e.from.0,
            mermaid_escape(&ports),
            mermaid_escape(&how),
            e.to.0
        );
    }
    out
}
