//! `edgeflow stages`: every stage kind with its ports and params.

use edgeflow_graph::{ParamInfo, ParamType, PortSpec, StageInfo};
use serde_json::{json, Value};
use std::fmt::Write;
use std::process::ExitCode;

/// Arguments of `edgeflow stages`.
#[derive(Debug, clap::Args)]
pub(crate) struct StagesArgs {
    /// Only this kind.
    pub kind: Option<String>,
    /// Machine-readable JSON (a list of kinds with ports and params).
    #[arg(long)]
    pub json: bool,
}

/// List stage kinds.
pub(super) fn run(a: StagesArgs) -> anyhow::Result<ExitCode> {
    let registry = edgeflow::registry();
    let mut infos = registry.infos();
    if let Some(kind) = &a.kind {
        infos.retain(|i| i.kind == kind.as_str());
        if infos.is_empty() {
            let kinds: Vec<&str> = registry.kinds().collect();
            eprintln!("error: no stage kind `{kind}`");
            eprintln!("  fix: known kinds: {}", kinds.join(", "));
            return Ok(ExitCode::FAILURE);
        }
    }
    if a.json {
        let list: Vec<Value> = infos.iter().map(info_json).collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for (n, info) in infos.iter().enumerate() {
            if n > 0 {
                println!();
            }
            print!("{}", info_text(info));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Name of a param type as written in docs and JSON.
fn type_name(t: ParamType) -> &'static str {
    match t {
        ParamType::Bool => "bool",
        ParamType::Int => "int",
        ParamType::Float => "float",
        ParamType::String => "string",
        ParamType::Path => "path",
        ParamType::InputPath => "input path",
        ParamType::Duration => "duration",
        ParamType::Any => "any",
    }
}

fn requirement(p: &ParamInfo) -> String {
    match (&p.default, p.optional) {
        (Some(d), _) => format!("default {d}"),
        (None, true) => "optional".into(),
        (None, false) => "required".into(),
    }
}

/// One kind as readable text: a header, then ports and params as a table.
fn info_text(info: &StageInfo) -> String {
    let mut out = String::new();
    let role = if info.source { " (source)" } else { "" };
    let _ = writeln!(out, "{}{role}: {}", info.kind, info.doc);
    let ports = info.ports.inputs.iter().chain(&info.ports.outputs);
    let name_w = ports
        .clone()
        .map(|p| p.name.len())
        .chain(info.params.iter().map(|p| p.name.len()))
        .max()
        .unwrap_or(0);
    let ty_w = ports
        .map(|p| p.ty.to_string().len())
        .chain(info.params.iter().map(|p| type_name(p.ty).len()))
        .max()
        .unwrap_or(0);
    let req_w = info
        .params
        .iter()
        .map(|p| requirement(p).len())
        .chain([8])
        .max()
        .unwrap_or(8);
    let row = |out: &mut String, name: &str, ty: &str, req: &str, doc: &str| {
        let _ = writeln!(
            out,
            "    {name:<name_w$}  {ty:<ty_w$}  {req:<req_w$}  {doc}"
        );
    };
    for (title, list) in [
        ("inputs", &info.ports.inputs),
        ("outputs", &info.ports.outputs),
    ] {
        if list.is_empty() {
            let _ = writeln!(out, "  {title}: none");
            continue;
        }
        let _ = writeln!(out, "  {title}:");
        for p in list {
            let req = if p.required { "required" } else { "optional" };
            row(&mut out, &p.name, &p.ty.to_string(), req, &p.doc);
        }
    }
    if info.params.is_empty() {
        out.push_str("  params: none\n");
    } else {
        out.push_str("  params:\n");
        for p in &info.params {
            row(&mut out, p.name, type_name(p.ty), &requirement(p), p.doc);
        }
    }
    out
}

fn port_json(p: &PortSpec) -> Value {
    json!({ "name": p.name, "type": p.ty.to_string(), "required": p.required, "doc": p.doc })
}

/// One kind as JSON.
fn info_json(info: &StageInfo) -> Value {
    json!({
        "kind": info.kind,
        "doc": info.doc,
        "source": info.source,
        "inputs": info.ports.inputs.iter().map(port_json).collect::<Vec<_>>(),
        "outputs": info.ports.outputs.iter().map(port_json).collect::<Vec<_>>(),
        "params": info.params.iter().map(|p| json!({
            "name": p.name,
            "type": type_name(p.ty),
            "default": p.default,
            "required": p.default.is_none() && !p.optional,
            "doc": p.doc,
        })).collect::<Vec<_>>(),
    })
}
