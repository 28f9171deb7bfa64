//! Parse and validate a pipeline into a [`Plan`]. Every problem becomes a
//! [`Diagnostic`] naming the file, line and column (where known), the stage
//! or edge, and the fix; validation collects all of them before failing.

use crate::error::{Diagnostic, Error, Result};
use crate::plan::{Plan, PlannedEdge, PlannedStage};
use crate::registry::{BuildEnv, ParamType, Params, Registry};
use crate::spec::{PipelineSpec, DEFAULT_CAPACITY, MAX_CAPACITY};
use edgeflow_runtime::DeviceSpec;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// A `--set STAGE.PARAM=VALUE` override.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// Stage id.
    pub stage: String,
    /// Param name.
    pub param: String,
    /// Value (parsed as a YAML scalar: numbers and booleans are typed).
    pub value: Value,
}

impl std::str::FromStr for Override {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (lhs, rhs) = s
            .split_once('=')
            .ok_or_else(|| format!("`{s}`: expected STAGE.PARAM=VALUE"))?;
        let (stage, param) = lhs
            .split_once('.')
            .ok_or_else(|| format!("`{s}`: expected STAGE.PARAM=VALUE (no `.` in `{lhs}`)"))?;
        if stage.is_empty() || param.is_empty() {
            return Err(format!("`{s}`: expected STAGE.PARAM=VALUE"));
        }
        Ok(Override {
            stage: stage.to_string(),
            param: param.to_string(),
            value: scalar(rhs),
        })
    }
}

fn scalar(s: &str) -> Value {
    match s {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        "null" | "~" => return Value::Null,
        _ => {}
    }
    if let Ok(i) = s.parse::<i64>() {
        return Value::from(i);
    }
    if let Ok(f) = s.parse::<f64>() {
        if f.is_finite() {
            return Value::from(f);
        }
    }
    Value::String(s.to_string())
}

/// Where a diagnostic points.
pub(crate) struct Ctx<'a> {
    pub(crate) file: Option<&'a Path>,
    pub(crate) source: &'a str,
}

impl Ctx<'_> {
    fn diag(&self, context: String, message: String, fix: Option<String>, needle: Option<&str>) -> Diagnostic {
        let (line, column) = needle
            .and_then(|n| locate(self.source, n))
            .map(|(l, c)| (Some(l), Some(c)))
            .unwrap_or((None, None));
        Diagnostic {
            file: self.file.map(Path::to_path_buf),
            line,
            column,
            context,
            message,
            fix,
        }
    }
}

/// 1-based line/column of the first occurrence of `needle` as a YAML token.
pub(crate) fn locate(source: &str, needle: &str) -> Option<(usize, usize)> {
    for (i, line) in source.lines().enumerate() {
        let code = line.split(" #").next().unwrap_or(line);
        let mut from = 0;
        while let Some(pos) = code[from..].find(needle) {
            let at = from + pos;
            let before = code[..at].chars().last();
            let after = code[at + needle.len()..].chars().next();
            let boundary = |c: Option<char>| {
                c.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '-'))
            };
            if boundary(before) && boundary(after) {
                return Some((i + 1, code[..at].chars().count() + 1));
            }
            from = at + needle.len().max(1);
        }
    }
    None
}

/// Parse YAML text into a spec (syntax and shape errors with line/column).
pub fn parse_spec(source: &str, file: Option<&Path>) -> Result<PipelineSpec> {
    if source.trim().is_empty() {
        return Err(Error::invalid(Diagnostic {
            file: file.map(Path::to_path_buf),
            context: String::new(),
            message: "the pipeline file is empty".into(),
            fix: Some("a pipeline needs at least `stages:`; see pipelines/*.yaml or `edgeflow schema`".into()),
            ..Default::default()
        }));
    }
    serde_saphyr::from_str::<PipelineSpec>(source).map_err(|e| {
        let text = e.to_string();
        let (line, column) = error_location(&text);
        Error::invalid(Diagnostic {
            file: file.map(Path::to_path_buf),
            line,
            column,
            context: String::new(),
            message: first_line(&text),
            fix: Some(syntax_fix(&text)),
        })
    })
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).trim().to_string()
}

fn error_location(text: &str) -> (Option<usize>, Option<usize>) {
    // serde-saphyr reports "line N column M" (or "N:M") in its message.
    let lower = text.to_lowercase();
    if let Some(p) = lower.find("line ") {
        let rest = &lower[p + 5..];
        let l: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let c = rest
            .find("column ")
            .map(|q| rest[q + 7..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>());
        return (l.parse().ok(), c.and_then(|c| c.parse().ok()));
    }
    (None, None)
}

fn syntax_fix(text: &str) -> String {
    if text.contains("unknown field") {
        "remove or rename the field; `edgeflow schema` lists every allowed field".into()
    } else if text.contains("unknown variant") {
        "use one of the listed values".into()
    } else if text.contains("missing field") {
        "add the missing field".into()
    } else {
        "fix the YAML syntax at that position (indentation, quotes, `key: value`)".into()
    }
}

/// Read, parse and validate a pipeline file.
pub fn load_file(path: &Path, registry: &Registry, overrides: &[Override]) -> Result<Plan> {
    let bytes = std::fs::read(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let source = String::from_utf8(bytes).map_err(|e| {
        Error::invalid(Diagnostic {
            file: Some(path.to_path_buf()),
            message: format!(
                "the file is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
            fix: Some("save the pipeline as UTF-8".into()),
            ..Default::default()
        })
    })?;
    let base = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let spec = parse_spec(&source, Some(path))?;
    validate(&spec, registry, &base, overrides, Some(path), &source)
}

/// Validate a spec against a registry, apply overrides, resolve ports and
/// edges. `source` (the YAML text, may be empty) is used to locate problems.
pub fn validate(
    spec: &PipelineSpec,
    registry: &Registry,
    base_dir: &Path,
    overrides: &[Override],
    file: Option<&Path>,
    source: &str,
) -> Result<Plan> {
    let cx = Ctx { file, source };
    let mut diags = Vec::new();
    if spec.stages.is_empty() {
        diags.push(cx.diag(
            String::new(),
            "the pipeline has no stages".into(),
            Some("add at least one entry under `stages:`".into()),
            Some("stages"),
        ));
    }
    // Stages.
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut stages: Vec<Option<PlannedStage>> = Vec::new();
    for s in &spec.stages {
        let ctx = format!("stage `{}`", s.id);
        let needle = format!("{}", s.id);
        if s.id.is_empty() || s.id.contains('.') || s.id.contains(char::is_whitespace) {
            diags.push(cx.diag(
                ctx.clone(),
                "stage ids must be non-empty and contain no `.` or spaces".into(),
                Some("rename it, e.g. `mic_1`".into()),
                Some(&needle),
            ));
        }
        if ids.insert(&s.id, stages.len()).is_some() {
            diags.push(cx.diag(
                ctx.clone(),
                "duplicate stage id".into(),
                Some("give every stage a unique `id`".into()),
                nth_needle(source, &s.id, 2).as_deref(),
            ));
        }
        let Some(factory) = registry.get(&s.kind) else {
            let kinds: Vec<_> = registry.kinds().collect();
            let close = closest(&s.kind, &kinds);
            diags.push(cx.diag(
                ctx,
                format!("unknown stage kind `{}`", s.kind),
                Some(match close {
                    Some(c) => format!("did you mean `{c}`? `edgeflow stages` lists every kind"),
                    None => "`edgeflow stages` lists every kind".into(),
                }),
                Some(&s.kind),
            ));
            stages.push(None);
            continue;
        };
        let info = factory.info();
        let device = match s.device.as_deref().unwrap_or("cpu").parse::<DeviceSpec>() {
            Ok(d) => d,
            Err(e) => {
                diags.push(cx.diag(
                    ctx.clone(),
                    e.to_string(),
                    Some("write `device: cpu`, `gpu`, `gpu:0`, `npu` or `auto`".into()),
                    s.device.as_deref(),
                ));
                DeviceSpec::Cpu
            }
        };
        let threads = s.threads.unwrap_or(1);
        if threads == 0 || threads > 256 {
            diags.push(cx.diag(
                ctx.clone(),
                format!("threads must be 1..=256, got {threads}"),
                Some("set `threads:` to the number of cores the stage may use".into()),
                Some("threads"),
            ));
        }
        // Params: unknown names, types, defaults, overrides.
        let mut values: BTreeMap<String, Value> = s.params.clone();
        for o in overrides.iter().filter(|o| o.stage == s.id) {
            values.insert(o.param.clone(), o.value.clone());
        }
        for k in values.keys() {
            if !info.params.iter().any(|p| p.name == k) {
                let names: Vec<_> = info.params.iter().map(|p| p.name).collect();
                diags.push(cx.diag(
                    ctx.clone(),
                    format!("unknown param `{k}` for kind `{}`", s.kind),
                    Some(if names.is_empty() {
                        format!("kind `{}` takes no params", s.kind)
                    } else {
                        format!("valid params: {}", names.join(", "))
                    }),
                    Some(k),
                ));
            }
        }
        for p in &info.params {
            match values.get(p.name) {
                None | Some(Value::Null) => {
                    if let Some(d) = &p.default {
                        values.insert(p.name.to_string(), d.clone());
                    } else if !p.optional {
                        diags.push(cx.diag(
                            ctx.clone(),
                            format!("missing required param `{}` ({})", p.name, p.doc),
                            Some(format!(
                                "add `{}: ...` under `params:` or pass --set {}.{}=VALUE",
                                p.name, s.id, p.name
                            )),
                            Some(&s.id),
                        ));
                    }
                }
                Some(v) => {
                    if let Err(m) = check_param_type(p.ty, v) {
                        diags.push(cx.diag(
                            ctx.clone(),
                            format!("param `{}` {m}", p.name),
                            Some(format!("{}: {}", p.name, p.doc)),
                            Some(p.name),
                        ));
                    }
                }
            }
        }
        let env = BuildEnv {
            stage_id: s.id.clone(),
            device,
            threads: threads.clamp(1, 256),
            base_dir: base_dir.to_path_buf(),
        };
        let params = Params::new(&s.id, values);
        let ports = match factory.ports(&params, &env) {
            Ok(p) => p,
            Err(e) => {
                diags.push(cx.diag(ctx, e.to_string(), None, Some(&s.id)));
                stages.push(None);
                continue;
            }
        };
        stages.push(Some(PlannedStage {
            id: s.id.clone(),
            kind: s.kind.clone(),
            factory: factory.clone(),
            params,
            env,
            source: ports.inputs.is_empty(),
            ports,
            inline: s.inline,
        }));
    }
    for o in overrides {
        if !ids.contains_key(o.stage.as_str()) {
            diags.push(Diagnostic {
                file: file.map(Path::to_path_buf),
                context: format!("--set {}.{}", o.stage, o.param),
                message: format!("no stage `{}` in this pipeline", o.stage),
                fix: Some(format!(
                    "stages are: {}",
                    spec.stages.iter().map(|s| s.id.as_str()).collect::<Vec<_>>().join(", ")
                )),
                ..Default::default()
            });
        }
    }
    // Edges.
    let mut edges = Vec::new();
    for e in &spec.edges {
        let ctx = format!("edge `{} -> {}`", e.from, e.to);
        let from = resolve_end(&e.from, true, &ids, &stages);
        let to = resolve_end(&e.to, false, &ids, &stages);
        let (from, to) = match (from, to) {
            (Ok(f), Ok(t)) => (f, t),
            (f, t) => {
                for (r, s) in [(f.err(), &e.from), (t.err(), &e.to)] {
                    if let Some((m, fix)) = r {
                        diags.push(cx.diag(ctx.clone(), m, Some(fix), Some(s)));
                    }
                }
                continue;
            }
        };
        let capacity = e.capacity.unwrap_or(DEFAULT_CAPACITY);
        if capacity == 0 || capacity > MAX_CAPACITY {
            diags.push(cx.diag(
                ctx.clone(),
                format!("capacity {capacity} is out of range 1..={MAX_CAPACITY}"),
                Some("a bounded edge needs room for at least one message; use `policy: latest` for newest-only".into()),
                Some("capacity"),
            ));
            continue;
        }
        let max_age = match e.max_age.as_ref().map(|d| d.to_duration()) {
            Some(Ok(d)) if d.is_zero() => {
                diags.push(cx.diag(ctx.clone(), "max_age must be greater than zero".into(), Some("e.g. `max_age: 200ms`".into()), Some("max_age")));
                None
            }
            Some(Ok(d)) => Some(d),
            Some(Err(m)) => {
                diags.push(cx.diag(ctx.clone(), format!("max_age: {m}"), Some("e.g. `max_age: 200ms`".into()), Some("max_age")));
                None
            }
            None => None,
        };
        let (Some(fs), Some(ts)) = (&stages[from.0], &stages[to.0]) else {
            continue;
        };
        let fty = fs.ports.outputs[from.1].ty;
        let tty = ts.ports.inputs[to.1].ty;
        if let Err(hint) = fty.check_into(&tty) {
            diags.push(cx.diag(
                ctx.clone(),
                format!(
                    "type mismatch: `{}.{}` produces {fty} but `{}.{}` takes {tty}",
                    fs.id, fs.ports.outputs[from.1].name, ts.id, ts.ports.inputs[to.1].name
                ),
                Some(hint),
                Some(&e.from),
            ));
        }
        edges.push(PlannedEdge {
            from,
            to,
            capacity,
            policy: e.policy.unwrap_or_default(),
            max_age,
            back_edge: e.back_edge,
            label: format!("{} -> {}", e.from, e.to),
        });
    }
    // Required inputs must be fed.
    for (i, s) in stages.iter().enumerate() {
        let Some(s) = s else { continue };
        for (p, port) in s.ports.inputs.iter().enumerate() {
            if port.required && !edges.iter().any(|e| e.to == (i, p)) {
                diags.push(cx.diag(
                    format!("stage `{}`", s.id),
                    format!("required input `{}` ({}) has no incoming edge", port.name, port.ty),
                    Some(format!("add an edge `{{ from: SOME_STAGE.PORT, to: {}.{} }}`", s.id, port.name)),
                    Some(&s.id),
                ));
            }
        }
    }
    // Cycles need a declared back-edge.
    if let Some(cycle) = find_cycle(stages.len(), &edges) {
        let names: Vec<_> = cycle
            .iter()
            .filter_map(|&i| stages[i].as_ref().map(|s| s.id.clone()))
            .collect();
        diags.push(cx.diag(
            format!("stages {}", names.join(" -> ")),
            "the edges form a cycle with no declared back-edge (it could deadlock)".into(),
            Some("mark the feedback edge with `back_edge: true`, or remove it".into()),
            names.first().map(String::as_str),
        ));
    }
    if !diags.is_empty() {
        return Err(Error::Invalid(diags));
    }
    Ok(Plan {
        name: spec.name.clone().unwrap_or_else(|| {
            file.and_then(|f| f.file_stem())
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "pipeline".into())
        }),
        stages: stages.into_iter().flatten().collect(),
        edges,
    })
}

fn nth_needle(source: &str, needle: &str, n: usize) -> Option<String> {
    // Only used for locating; returns the needle when it occurs `n` times.
    (source.matches(needle).count() >= n).then(|| needle.to_string())
}

fn check_param_type(ty: ParamType, v: &Value) -> std::result::Result<(), String> {
    let ok = match ty {
        ParamType::Bool => v.is_boolean(),
        ParamType::Int => v.is_i64() || v.is_u64(),
        ParamType::Float => v.is_number(),
        ParamType::String | ParamType::Path => v.is_string(),
        ParamType::Duration => crate::spec::parse_duration_value(v).is_ok(),
        ParamType::Any => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("should be {} but is {v}", match ty {
            ParamType::Bool => "true or false",
            ParamType::Int => "a whole number",
            ParamType::Float => "a number",
            ParamType::String => "a string",
            ParamType::Path => "a file path (string)",
            ParamType::Duration => "a duration like `20ms` or a number of seconds",
            ParamType::Any => "anything",
        }))
    }
}

type EndResult = std::result::Result<(usize, usize), (String, String)>;

fn resolve_end(
    s: &str,
    output: bool,
    ids: &HashMap<&str, usize>,
    stages: &[Option<PlannedStage>],
) -> EndResult {
    let (id, port) = match s.split_once('.') {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    };
    let Some(&i) = ids.get(id) else {
        return Err((
            format!("no stage `{id}`"),
            format!(
                "write `STAGE.PORT` with one of: {}",
                ids.keys().copied().collect::<Vec<_>>().join(", ")
            ),
        ));
    };
    let Some(st) = &stages[i] else {
        return Err((format!("stage `{id}` is invalid (see above)"), "fix that stage first".into()));
    };
    let ports = if output { &st.ports.outputs } else { &st.ports.inputs };
    let dir = if output { "output" } else { "input" };
    let names = || ports.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
    match port {
        Some(p) => match ports.iter().position(|x| x.name == p) {
            Some(k) => Ok((i, k)),
            None => Err((
                format!("stage `{id}` ({}) has no {dir} port `{p}`", st.kind),
                if ports.is_empty() {
                    format!("`{}` has no {dir} ports", st.kind)
                } else {
                    format!("its {dir} ports are: {}", names())
                },
            )),
        },
        None if ports.len() == 1 => Ok((i, 0)),
        None => Err((
            format!("`{id}` needs a port name: it has {} {dir} ports", ports.len()),
            format!("write `{id}.PORT` with one of: {}", names()),
        )),
    }
}

fn find_cycle(n: usize, edges: &[PlannedEdge]) -> Option<Vec<usize>> {
    use petgraph::graph::DiGraph;
    let mut g = DiGraph::<usize, ()>::new();
    let nodes: Vec<_> = (0..n).map(|i| g.add_node(i)).collect();
    for e in edges.iter().filter(|e| !e.back_edge) {
        g.add_edge(nodes[e.from.0], nodes[e.to.0], ());
    }
    let sccs = petgraph::algo::tarjan_scc(&g);
    for scc in sccs {
        if scc.len() > 1 {
            return Some(scc.iter().rev().map(|n| g[*n]).collect());
        }
        if let Some(&only) = scc.first() {
            if g.contains_edge(only, only) {
                return Some(vec![g[only]]);
            }
        }
    }
    None
}

fn closest<'a>(s: &str, options: &[&'a str]) -> Option<&'a str> {
    options
        .iter()
        .map(|o| (levenshtein(s, o), *o))
        .filter(|(d, o)| *d <= 3.max(o.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, o)| o)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}
