//! Parse and validate a pipeline into a [`Plan`]. Every problem becomes a
//! [`Diagnostic`] naming the file, the line and column of the offending
//! stage, edge or field, what is wrong and the fix; validation collects all
//! of them before failing.
//!
//! Locations come from the YAML parser itself (serde-saphyr spans, see
//! [`source_map`]), never from searching the text, so a stage id that also
//! appears in a comment or another stage's params is not mistaken for it.

mod source_map;

use crate::error::{Diagnostic, Error, Result};
use crate::plan::{Plan, PlannedEdge, PlannedStage};
use crate::port::PortType;
use crate::registry::{BuildEnv, ParamError, ParamType, Params, Registry};
use crate::spec::{PipelineSpec, Policy, DEFAULT_CAPACITY, MAX_CAPACITY};
use crate::stage::StageError;
use edgeflow_runtime::DeviceSpec;
use serde_json::Value;
use source_map::{List, Pos, SourceMap};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};

/// Largest accepted `threads:`.
const MAX_THREADS: usize = 256;

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

impl Override {
    /// As written on the command line, for diagnostics.
    fn label(&self) -> String {
        let v = match &self.value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        format!("--set {}.{}={v}", self.stage, self.param)
    }
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

/// Builds diagnostics for one file.
struct Ctx<'a> {
    file: Option<&'a Path>,
    map: SourceMap,
}

impl Ctx<'_> {
    fn diag(
        &self,
        at: Option<Pos>,
        context: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Diagnostic {
        Diagnostic {
            file: self.file.map(Path::to_path_buf),
            line: at.map(|p| p.line),
            column: at.map(|p| p.column),
            context: context.into(),
            message: message.into(),
            fix: Some(fix.into()).filter(|f: &String| !f.is_empty()),
        }
    }

    /// Field `key` of an item, else the item itself.
    fn field_or_item(&self, list: List, index: usize, key: &str) -> Option<Pos> {
        self.map
            .field(list, index, key)
            .or_else(|| self.map.item_pos(list, index))
    }
}

/// Parse YAML text into a spec. Syntax and shape errors carry the line and
/// column, the stage or edge they occur in, and a fix.
pub fn parse_spec(source: &str, file: Option<&Path>) -> Result<PipelineSpec> {
    let empty = || {
        Error::invalid(Diagnostic {
            file: file.map(Path::to_path_buf),
            line: Some(1),
            column: Some(1),
            context: String::new(),
            message: "the pipeline file is empty".into(),
            fix: Some(
                "a pipeline needs at least `stages:`; see the pipelines/ folder or `edgeflow schema`"
                    .into(),
            ),
        })
    };
    if source.trim().is_empty() {
        return Err(empty());
    }
    let map = SourceMap::parse(source);
    if map.is_blank() {
        return Err(empty());
    }
    serde_saphyr::from_str::<PipelineSpec>(source).map_err(|e| {
        let at = e.location().as_ref().and_then(Pos::from_location);
        let message = clean_parse_message(&e.to_string());
        let owner = at.and_then(|p| map.owner(p));
        let context = owner
            .as_ref()
            .map(|o| item_label(&map, o.list, o.index))
            .unwrap_or_default();
        let field = match &owner {
            Some(o) => o.field.clone(),
            None => at.and_then(|p| map.top_field(p)),
        };
        let fix = parse_fix(&message, field.as_deref());
        Error::invalid(Diagnostic {
            file: file.map(Path::to_path_buf),
            line: at.map(|p| p.line),
            column: at.map(|p| p.column),
            context,
            message,
            fix: Some(fix),
        })
    })
}

/// How an item is named in a diagnostic, from the raw tree (the typed parse
/// may have failed).
fn item_label(map: &SourceMap, list: List, index: usize) -> String {
    match list {
        List::Stages => match map.scalar(list, index, "id") {
            Some(id) => format!("stage `{id}`"),
            None => format!("stage #{}", index + 1),
        },
        List::Edges => match (
            map.scalar(list, index, "from"),
            map.scalar(list, index, "to"),
        ) {
            (Some(f), Some(t)) => format!("edge `{f} -> {t}`"),
            _ => format!("edge #{}", index + 1),
        },
    }
}

/// serde-saphyr's message without its `error: line N column M:` prefix and
/// its snippet (the diagnostic carries the location itself).
fn clean_parse_message(text: &str) -> String {
    let first = text.lines().next().unwrap_or(text).trim();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let first = match first.strip_prefix("line ") {
        Some(rest) => rest.split_once(": ").map_or(first, |(_, m)| m),
        None => first,
    };
    if let Some(key) = first.strip_prefix("duplicate mapping key: ") {
        let key = key.split(',').next().unwrap_or(key).trim();
        return format!("duplicate key `{key}`");
    }
    if let Some(rest) = first.strip_prefix("cannot deserialize null into ") {
        let what = rest.split(';').next().unwrap_or(rest).trim();
        return format!("expected {what}, found a YAML null (`null`, `~` or nothing)");
    }
    let plain = match first {
        "expected sequence start" => Some("expected a list (`- item` lines or `[a, b]`)"),
        "expected mapping start" => {
            Some("expected a mapping (`key: value` lines or `{ key: value }`)")
        }
        "expected string scalar" => Some("expected a plain string"),
        "invalid u64" | "invalid usize" => Some("expected a whole number, 0 or more"),
        "invalid bool" => Some("expected `true` or `false`"),
        m if m.contains("untagged enum DurationSpec") => {
            Some("expected a duration like `200ms` or a number of seconds")
        }
        _ => None,
    };
    if let Some(p) = plain {
        return p.into();
    }
    if first.starts_with("budget breached") || first.starts_with("recursion limit exceeded") {
        return format!("the file exceeds a parser safety limit ({first})");
    }
    if first.starts_with("multiple YAML documents") {
        return "the file holds more than one YAML document (`---`)".into();
    }
    first.to_string()
}

/// The fix for a parse error, from its message and the field it is in.
fn parse_fix(message: &str, field: Option<&str>) -> String {
    let listed = |m: &str| -> (Option<String>, Vec<String>) {
        let name = m.split('`').nth(1).map(str::to_string);
        let options = m
            .split_once("expected one of ")
            .map(|(_, l)| {
                l.split(',')
                    .map(|s| s.trim().trim_matches('`').to_string())
                    .collect()
            })
            .unwrap_or_default();
        (name, options)
    };
    if message.starts_with("unknown field") {
        let (name, options) = listed(message);
        let opts: Vec<&str> = options.iter().map(String::as_str).collect();
        let guess = name.as_deref().and_then(|n| closest(n, &opts));
        return match guess {
            Some(g) => format!(
                "did you mean `{g}`? allowed fields here: {}; `edgeflow schema` documents each",
                opts.join(", ")
            ),
            None => format!(
                "remove or rename it; allowed fields here: {}",
                opts.join(", ")
            ),
        };
    }
    if message.starts_with("unknown variant") {
        let (name, options) = listed(message);
        let opts: Vec<&str> = options.iter().map(String::as_str).collect();
        return match name.as_deref().and_then(|n| closest(n, &opts)) {
            Some(g) => format!("did you mean `{g}`? use one of: {}", opts.join(", ")),
            None => format!("use one of: {}", opts.join(", ")),
        };
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.split('`').next().unwrap_or("");
        let add = match name {
            "stages" => return "add `stages:` with at least one stage".into(),
            "id" => "give the stage a unique `id:`".to_string(),
            "kind" => "add `kind: ...`; `edgeflow stages` lists every kind".to_string(),
            "from" | "to" => format!("add `{name}: STAGE.PORT`"),
            _ => format!("add `{name}:`"),
        };
        return format!(
            "{add} (if it is there, check its indentation: the fields of an item line up)"
        );
    }
    if message.starts_with("duplicate key") {
        return "each key may appear once in a mapping: remove one of them".into();
    }
    if message.contains("parser safety limit") {
        return "pipelines nest a few levels deep: remove the deep nesting or the alias chain there"
            .into();
    }
    if message.contains("more than one YAML document") {
        return "a pipeline is one YAML document: remove the `---` and what follows, or split it into files".into();
    }
    let null = message.contains("found a YAML null");
    if let Some(hint) = field.and_then(field_hint) {
        return if null {
            format!("{hint}; to write the word null, quote it: `\"null\"`")
        } else {
            hint.into()
        };
    }
    if null {
        return "give it a value; to write the word null, quote it: `\"null\"`".into();
    }
    if message.contains("expected a mapping") {
        return "a pipeline file is a mapping with `stages:` (a list of stages) and `edges:`"
            .into();
    }
    "fix the YAML at that position (indentation, quotes, brackets, `key: value`)".into()
}

/// What each field of the format accepts.
fn field_hint(field: &str) -> Option<&'static str> {
    Some(match field {
        "capacity" => "`capacity:` is a whole number of messages, 1..=65536 (default 8)",
        "threads" => "`threads:` is a whole number, 1..=256",
        "policy" => "`policy:` is one of block, drop_oldest, latest, drop_newest",
        "max_age" => "`max_age:` is a duration like `200ms`, `1.5s` or a number of seconds",
        "inline" | "back_edge" => "write `true` or `false`",
        "device" => "`device:` is cpu, gpu, gpu:N, npu, npu:N or auto",
        "params" => "`params:` is a mapping `name: value`; `edgeflow stages KIND` lists them",
        "id" | "kind" => "write a plain string",
        "from" | "to" => "write `STAGE.PORT` as a string",
        "name" | "description" => "write a plain string",
        "stages" => "`stages:` is a list of stages, each a mapping with at least `id:` and `kind:`",
        "edges" => "`edges:` is a list of `{ from: STAGE.PORT, to: STAGE.PORT }` mappings",
        _ => return None,
    })
}

/// Read, parse and validate a pipeline file.
pub fn load_file(path: &Path, registry: &Registry, overrides: &[Override]) -> Result<Plan> {
    let bytes = std::fs::read(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        error: e,
    })?;
    let source = String::from_utf8(bytes).map_err(|e| {
        let bad = e.utf8_error().valid_up_to();
        let valid = String::from_utf8_lossy(&e.as_bytes()[..bad]);
        let line = valid.matches('\n').count() + 1;
        let column = valid.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        Error::invalid(Diagnostic {
            file: Some(path.to_path_buf()),
            line: Some(line),
            column: Some(column),
            context: String::new(),
            message: format!(
                "the file is not UTF-8 text (invalid byte 0x{:02x} at offset {bad})",
                e.as_bytes().get(bad).copied().unwrap_or(0)
            ),
            fix: Some("save the pipeline as UTF-8 (is this the right file?)".into()),
        })
    })?;
    let base = path
        .parent()
        .map(Path::to_path_buf)
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."));
    let spec = parse_spec(&source, Some(path))?;
    validate(&spec, registry, &base, overrides, Some(path), &source)
}

/// Validate a spec against a registry, apply overrides, resolve ports and
/// edges. `source` is the YAML text the spec was parsed from (empty for a
/// spec built in code); diagnostics point into it.
pub fn validate(
    spec: &PipelineSpec,
    registry: &Registry,
    base_dir: &Path,
    overrides: &[Override],
    file: Option<&Path>,
    source: &str,
) -> Result<Plan> {
    let mut map = SourceMap::parse(source);
    // A spec edited after parsing no longer matches the text: locate nothing
    // rather than point at the wrong stage.
    if map.len(List::Stages) != Some(spec.stages.len())
        || map.len(List::Edges) != Some(spec.edges.len())
    {
        map = SourceMap::default();
    }
    let cx = Ctx { file, map };
    let mut diags = Vec::new();
    if spec.stages.is_empty() {
        diags.push(cx.diag(
            cx.map.top_key("stages"),
            "",
            "the pipeline has no stages",
            "add at least one entry under `stages:`",
        ));
    }
    let ids = check_ids(spec, &cx, &mut diags);
    let stages: Vec<Option<PlannedStage>> = spec
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| plan_stage(i, s, registry, base_dir, overrides, &cx, &mut diags))
        .collect();
    check_overrides(spec, overrides, &cx, &mut diags);
    let (edges, edge_lines, fed) = plan_edges(spec, &ids, &stages, &cx, &mut diags);
    check_inputs(&stages, &fed, &cx, &mut diags);
    check_cycles(&stages, &edges, &edge_lines, &cx, &mut diags);
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

/// Stage ids: well-formed and unique. Returns id -> first index.
fn check_ids<'s>(
    spec: &'s PipelineSpec,
    cx: &Ctx<'_>,
    diags: &mut Vec<Diagnostic>,
) -> HashMap<&'s str, usize> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (i, s) in spec.stages.iter().enumerate() {
        let at = cx.field_or_item(List::Stages, i, "id");
        if s.id.is_empty() || s.id.contains('.') || s.id.contains(char::is_whitespace) {
            diags.push(cx.diag(
                at,
                format!("stage `{}`", s.id),
                "stage ids must be non-empty and contain no `.` or spaces",
                "rename it, e.g. `mic_1` (edges refer to ports as `id.port`)",
            ));
        }
        if let Some(&first) = ids.get(s.id.as_str()) {
            let first_line = cx
                .map
                .field(List::Stages, first, "id")
                .map(|p| format!(" (first used on line {})", p.line))
                .unwrap_or_default();
            diags.push(cx.diag(
                at,
                format!("stage `{}`", s.id),
                format!("duplicate stage id `{}`{first_line}", s.id),
                "give every stage a unique `id`",
            ));
        } else {
            ids.insert(&s.id, i);
        }
    }
    ids
}

/// Resolve one stage: kind, device, threads, params, ports.
#[allow(clippy::too_many_arguments)]
fn plan_stage(
    i: usize,
    s: &crate::spec::StageSpec,
    registry: &Registry,
    base_dir: &Path,
    overrides: &[Override],
    cx: &Ctx<'_>,
    diags: &mut Vec<Diagnostic>,
) -> Option<PlannedStage> {
    let ctx = format!("stage `{}`", s.id);
    let item = cx.map.item_pos(List::Stages, i);
    let Some(factory) = registry.get(&s.kind) else {
        let kinds: Vec<_> = registry.kinds().collect();
        diags.push(cx.diag(
            cx.field_or_item(List::Stages, i, "kind"),
            ctx,
            format!("unknown stage kind `{}`", s.kind),
            match closest(&s.kind, &kinds) {
                Some(c) => format!("did you mean `{c}`? `edgeflow stages` lists every kind"),
                None => format!(
                    "known kinds: {}; `edgeflow stages` documents each",
                    kinds.join(", ")
                ),
            },
        ));
        return None;
    };
    let info = factory.info();
    let device = match s.device.as_deref().unwrap_or("cpu").parse::<DeviceSpec>() {
        Ok(d) => d,
        Err(e) => {
            diags.push(cx.diag(
                cx.field_or_item(List::Stages, i, "device"),
                ctx.clone(),
                e.to_string(),
                "write `device: cpu`, `gpu`, `gpu:0`, `npu`, `npu:0` or `auto`",
            ));
            DeviceSpec::Cpu
        }
    };
    let threads = s.threads.unwrap_or(1);
    if threads == 0 || threads > MAX_THREADS {
        diags.push(cx.diag(
            cx.field_or_item(List::Stages, i, "threads"),
            ctx.clone(),
            format!("threads must be 1..={MAX_THREADS}, got {threads}"),
            "set `threads:` to the number of cores the stage may use",
        ));
    }
    // Params: file values, then overrides; each problem points at its source.
    let mut values: BTreeMap<String, Value> = s.params.clone();
    let mut overridden: HashMap<&str, &Override> = HashMap::new();
    for o in overrides.iter().filter(|o| o.stage == s.id) {
        // A path typed on the command line is relative to where the user
        // is, not to the pipeline file (which is what paths in the file
        // are relative to).
        let is_path = info
            .params
            .iter()
            .any(|p| p.name == o.param && matches!(p.ty, ParamType::Path | ParamType::InputPath));
        let value = match (&o.value, is_path) {
            (Value::String(v), true) if Path::new(v).is_relative() => std::env::current_dir()
                .map(|d| Value::String(d.join(v).to_string_lossy().into_owned()))
                .unwrap_or_else(|_| o.value.clone()),
            _ => o.value.clone(),
        };
        values.insert(o.param.clone(), value);
        overridden.insert(o.param.as_str(), o);
    }
    // Where param `name` comes from: (context, location of its value, of its key).
    let origin = |name: &str| -> (String, Option<Pos>, Option<Pos>) {
        match overridden.get(name) {
            Some(o) => (format!("{ctx}, {}", o.label()), item, item),
            None => {
                let (k, v) = cx
                    .map
                    .param(i, name)
                    .map_or((None, None), |(k, v)| (Some(k), v.or(Some(k))));
                (ctx.clone(), v.or(item), k.or(item))
            }
        }
    };
    let param_diags = diags.len();
    let names: Vec<&str> = info.params.iter().map(|p| p.name).collect();
    for k in values.keys() {
        if names.contains(&k.as_str()) {
            continue;
        }
        let (context, _, at) = origin(k);
        diags.push(cx.diag(
            at,
            context,
            format!("unknown param `{k}` for kind `{}`", s.kind),
            if names.is_empty() {
                format!("kind `{}` takes no params", s.kind)
            } else {
                match closest(k, &names) {
                    Some(c) => format!("did you mean `{c}`? valid params: {}", names.join(", ")),
                    None => format!("valid params: {}", names.join(", ")),
                }
            },
        ));
    }
    for p in &info.params {
        match values.get(p.name) {
            None | Some(Value::Null) => {
                if let Some(d) = &p.default {
                    values.insert(p.name.to_string(), d.clone());
                } else if !p.optional {
                    diags.push(cx.diag(
                        cx.map.field_key(List::Stages, i, "params").or(item),
                        ctx.clone(),
                        format!("missing required param `{}` ({})", p.name, p.doc),
                        format!(
                            "add `{}: ...` under `params:` or pass --set {}.{}=VALUE",
                            p.name, s.id, p.name
                        ),
                    ));
                }
            }
            Some(v) => {
                let (context, at, _) = origin(p.name);
                if let Err(m) = check_param_type(p.ty, v) {
                    diags.push(cx.diag(
                        at,
                        context,
                        format!("param `{}` {m}", p.name),
                        format!("`{}` is {}", p.name, p.doc),
                    ));
                } else if p.ty == ParamType::InputPath {
                    let written = v.as_str().unwrap_or_default();
                    let resolved = resolve(base_dir, written);
                    if written.is_empty() || !resolved.exists() {
                        diags.push(cx.diag(
                            at,
                            context,
                            format!(
                                "param `{}`: file `{}` does not exist",
                                p.name,
                                resolved.display()
                            ),
                            format!(
                                "check the path (relative paths resolve against the pipeline's folder, {}), \
                                 or pass --set {}.{}=PATH",
                                base_dir.display(),
                                s.id,
                                p.name
                            ),
                        ));
                    }
                }
            }
        }
    }
    let env = BuildEnv {
        stage_id: s.id.clone(),
        device,
        threads: threads.clamp(1, MAX_THREADS),
        base_dir: base_dir.to_path_buf(),
        device_opener: registry.device_opener().cloned(),
    };
    let params = Params::new(&s.id, values);
    let ports = match factory.ports(&params, &env) {
        Ok(p) => p,
        // A factory rejecting params already reported above only repeats it.
        Err(_) if diags.len() > param_diags => return None,
        Err(e) => {
            let fix = format!("`edgeflow stages {}` documents its params", s.kind);
            // A factory that names the param lets us point at its value.
            let param = match &e {
                StageError::Failed(inner) => inner.downcast_ref::<ParamError>(),
                _ => None,
            };
            diags.push(match param {
                Some(pe) => {
                    let (context, at, _) = origin(&pe.param);
                    cx.diag(at, context, format!("param `{}` {}", pe.param, pe.msg), fix)
                }
                None => cx.diag(item, ctx, e.to_string(), fix),
            });
            return None;
        }
    };
    Some(PlannedStage {
        id: s.id.clone(),
        kind: s.kind.clone(),
        factory: factory.clone(),
        params,
        env,
        source: ports.inputs.is_empty(),
        ports,
        inline: s.inline,
    })
}

fn resolve(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// `--set` naming a stage that does not exist.
fn check_overrides(
    spec: &PipelineSpec,
    overrides: &[Override],
    cx: &Ctx<'_>,
    diags: &mut Vec<Diagnostic>,
) {
    let ids: Vec<&str> = spec.stages.iter().map(|s| s.id.as_str()).collect();
    for o in overrides
        .iter()
        .filter(|o| !ids.contains(&o.stage.as_str()))
    {
        diags.push(cx.diag(
            cx.map.top_key("stages"),
            o.label(),
            format!("no stage `{}` in this pipeline", o.stage),
            match closest(&o.stage, &ids) {
                Some(c) => format!("did you mean `{c}`? stages are: {}", ids.join(", ")),
                None => format!("stages are: {}", ids.join(", ")),
            },
        ));
    }
}

/// Resolve every edge; check ends, capacity, age, types, duplicates.
/// Returns the planned edges, for each its index in the spec, and every
/// input port that some edge leads to (even an edge with other problems, so
/// that one mistake is not also reported as a dangling input).
fn plan_edges(
    spec: &PipelineSpec,
    ids: &HashMap<&str, usize>,
    stages: &[Option<PlannedStage>],
    cx: &Ctx<'_>,
    diags: &mut Vec<Diagnostic>,
) -> (Vec<PlannedEdge>, Vec<usize>, HashSet<(usize, usize)>) {
    let mut edges: Vec<PlannedEdge> = Vec::new();
    let mut spec_index = Vec::new();
    let mut fed = HashSet::new();
    let mut seen: HashMap<(PortRef, PortRef), usize> = HashMap::new();
    for (i, e) in spec.edges.iter().enumerate() {
        let ctx = format!("edge `{} -> {}`", e.from, e.to);
        let item = cx.map.item_pos(List::Edges, i);
        let mut ok = true;
        let mut ends = [None, None];
        for (k, (end, field, output)) in [(&e.from, "from", true), (&e.to, "to", false)]
            .into_iter()
            .enumerate()
        {
            match resolve_end(end, output, ids, stages) {
                Ok(r) => {
                    if !output {
                        fed.insert(r);
                    }
                    ends[k] = Some(r);
                }
                // The stage itself is invalid and already reported.
                Err(None) => ok = false,
                Err(Some((m, fix))) => {
                    ok = false;
                    diags.push(cx.diag(
                        cx.field_or_item(List::Edges, i, field),
                        ctx.clone(),
                        m,
                        fix,
                    ));
                }
            }
        }
        let capacity = e.capacity.unwrap_or(DEFAULT_CAPACITY);
        if capacity == 0 || capacity > MAX_CAPACITY {
            diags.push(cx.diag(
                cx.field_or_item(List::Edges, i, "capacity"),
                ctx.clone(),
                format!("capacity {capacity} is out of range 1..={MAX_CAPACITY}"),
                if capacity == 0 {
                    "a bounded edge needs room for at least one message; for newest-only use \
                     `capacity: 1` with `policy: latest`"
                } else {
                    "a queue that large hides a slow stage and costs memory; use a few messages \
                     (default 8) and a dropping policy if the consumer may lag"
                },
            ));
        }
        let max_age = match e.max_age.as_ref().map(|d| d.to_duration()) {
            Some(Ok(d)) if d.is_zero() => {
                diags.push(cx.diag(
                    cx.field_or_item(List::Edges, i, "max_age"),
                    ctx.clone(),
                    "max_age must be greater than zero",
                    "e.g. `max_age: 200ms`, or remove it to keep messages of any age",
                ));
                None
            }
            Some(Ok(d)) => Some(d),
            Some(Err(m)) => {
                diags.push(cx.diag(
                    cx.field_or_item(List::Edges, i, "max_age"),
                    ctx.clone(),
                    format!("max_age: {m}"),
                    "e.g. `max_age: 200ms`",
                ));
                None
            }
            None => None,
        };
        let (true, Some(from), Some(to)) = (ok, ends[0], ends[1]) else {
            continue;
        };
        let (Some(fs), Some(ts)) = (&stages[from.0], &stages[to.0]) else {
            continue;
        };
        let fty = fs.ports.outputs[from.1].ty;
        let tty = ts.ports.inputs[to.1].ty;
        if let Err(hint) = fty.check_into(&tty) {
            diags.push(cx.diag(
                item,
                ctx.clone(),
                format!(
                    "type mismatch: `{}.{}` produces {fty} but `{}.{}` takes {tty}",
                    fs.id, fs.ports.outputs[from.1].name, ts.id, ts.ports.inputs[to.1].name
                ),
                hint,
            ));
        }
        if let Some(first) = seen.insert((from, to), i) {
            let line = cx
                .map
                .item_pos(List::Edges, first)
                .map(|p| format!(" (first on line {})", p.line))
                .unwrap_or_default();
            diags.push(cx.diag(
                item,
                ctx.clone(),
                format!("the same edge is declared twice{line}"),
                "remove one of them",
            ));
        }
        edges.push(PlannedEdge {
            from,
            to,
            capacity,
            policy: e.policy.unwrap_or(Policy::Block),
            max_age,
            back_edge: e.back_edge,
            label: format!("{} -> {}", e.from, e.to),
        });
        spec_index.push(i);
    }
    (edges, spec_index, fed)
}

/// Every required input must be fed by an edge.
fn check_inputs(
    stages: &[Option<PlannedStage>],
    fed: &HashSet<(usize, usize)>,
    cx: &Ctx<'_>,
    diags: &mut Vec<Diagnostic>,
) {
    for (i, s) in stages.iter().enumerate() {
        let Some(s) = s else { continue };
        for (p, port) in s.ports.inputs.iter().enumerate() {
            if !port.required || fed.contains(&(i, p)) {
                continue;
            }
            let feeders = compatible_outputs(stages, i, &port.ty);
            let example = feeders.first().map_or("SOME_STAGE.PORT", String::as_str);
            let mut fix = format!(
                "add an edge `{{ from: {example}, to: {}.{} }}`",
                s.id, port.name
            );
            if feeders.len() > 1 {
                fix.push_str(&format!("; outputs that fit: {}", feeders.join(", ")));
            }
            diags.push(cx.diag(
                cx.map.item_pos(List::Stages, i),
                format!("stage `{}`", s.id),
                format!(
                    "required input `{}` ({}) has no incoming edge",
                    port.name, port.ty
                ),
                fix,
            ));
        }
    }
}

/// Up to four `stage.port` outputs (other than stage `skip`) that can feed `ty`.
fn compatible_outputs(stages: &[Option<PlannedStage>], skip: usize, ty: &PortType) -> Vec<String> {
    stages
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != skip)
        .filter_map(|(_, s)| s.as_ref())
        .flat_map(|s| {
            s.ports
                .outputs
                .iter()
                .filter(|o| o.ty.check_into(ty).is_ok())
                .map(move |o| format!("{}.{}", s.id, o.name))
        })
        .take(4)
        .collect()
}

/// (stage index, port index).
type PortRef = (usize, usize);

type EndResult = std::result::Result<PortRef, Option<(String, String)>>;

/// Resolve `stage.port`. `Err(None)`: the stage exists but is itself invalid.
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
        let mut known: Vec<&str> = ids.keys().copied().collect();
        known.sort_unstable();
        return Err(Some((
            format!("no stage `{id}`"),
            match closest(id, &known) {
                Some(c) => format!("did you mean `{c}`? stages are: {}", known.join(", ")),
                None => format!("write `STAGE.PORT` with one of: {}", known.join(", ")),
            },
        )));
    };
    let Some(st) = &stages[i] else {
        return Err(None);
    };
    let ports = if output {
        &st.ports.outputs
    } else {
        &st.ports.inputs
    };
    let dir = if output { "output" } else { "input" };
    let names: Vec<&str> = ports.iter().map(|p| p.name.as_str()).collect();
    let listed = || {
        ports
            .iter()
            .map(|p| format!("`{}` ({})", p.name, p.ty))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match port {
        Some(p) => match names.iter().position(|x| *x == p) {
            Some(k) => Ok((i, k)),
            None => Err(Some((
                format!("stage `{id}` ({}) has no {dir} port `{p}`", st.kind),
                if ports.is_empty() {
                    format!("`{}` has no {dir} ports", st.kind)
                } else {
                    match closest(p, &names) {
                        Some(c) => {
                            format!("did you mean `{id}.{c}`? its {dir} ports are: {}", listed())
                        }
                        None => format!("its {dir} ports are: {}", listed()),
                    }
                },
            ))),
        },
        None if ports.len() == 1 => Ok((i, 0)),
        None if ports.is_empty() => Err(Some((
            format!("stage `{id}` ({}) has no {dir} ports", st.kind),
            format!(
                "`{}` cannot be on the `{}` side of an edge",
                st.kind,
                if output { "from" } else { "to" }
            ),
        ))),
        None => Err(Some((
            format!(
                "`{id}` needs a port name: it has {} {dir} ports",
                ports.len()
            ),
            format!("write `{id}.PORT` with one of: {}", listed()),
        ))),
    }
}

/// Cycles must contain an edge marked `back_edge: true`. One diagnostic per
/// cycle, at the last edge (in file order) that closes it.
fn check_cycles(
    stages: &[Option<PlannedStage>],
    edges: &[PlannedEdge],
    spec_index: &[usize],
    cx: &Ctx<'_>,
    diags: &mut Vec<Diagnostic>,
) {
    use petgraph::graph::DiGraph;
    let mut g = DiGraph::<usize, ()>::new();
    let nodes: Vec<_> = (0..stages.len()).map(|i| g.add_node(i)).collect();
    let forward: Vec<(usize, &PlannedEdge)> = edges
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.back_edge)
        .collect();
    for (_, e) in &forward {
        g.add_edge(nodes[e.from.0], nodes[e.to.0], ());
    }
    let name = |i: usize| stages[i].as_ref().map_or("?", |s| s.id.as_str());
    for scc in petgraph::algo::tarjan_scc(&g) {
        let members: HashSet<usize> = scc.iter().map(|n| g[*n]).collect();
        let Some(&(k, closing)) = forward
            .iter()
            .filter(|(_, e)| members.contains(&e.from.0) && members.contains(&e.to.0))
            .max_by_key(|(k, _)| *k)
        else {
            continue;
        };
        let path = path_between(&forward, closing.to.0, closing.from.0, &members);
        let mut cycle: Vec<&str> = vec![name(closing.from.0)];
        cycle.extend(path.iter().map(|&i| name(i)));
        diags.push(
            cx.diag(
                spec_index
                    .get(k)
                    .and_then(|&k| cx.map.item_pos(List::Edges, k)),
                format!("edge `{}`", closing.label),
                format!(
                    "the edges form a cycle {} with no declared back-edge (it could deadlock)",
                    cycle.join(" -> ")
                ),
                "mark the feedback edge with `back_edge: true` (and give it a dropping policy or \
             enough capacity), or remove it",
            ),
        );
    }
}

/// Stages on a shortest path `from -> ... -> to` inside `within` (inclusive).
fn path_between(
    forward: &[(usize, &PlannedEdge)],
    from: usize,
    to: usize,
    within: &HashSet<usize>,
) -> Vec<usize> {
    let mut prev: HashMap<usize, usize> = HashMap::new();
    let mut queue = VecDeque::from([from]);
    let mut seen = HashSet::from([from]);
    while let Some(u) = queue.pop_front() {
        if u == to {
            break;
        }
        for (_, e) in forward.iter().filter(|(_, e)| e.from.0 == u) {
            let v = e.to.0;
            if within.contains(&v) && seen.insert(v) {
                prev.insert(v, u);
                queue.push_back(v);
            }
        }
    }
    let mut path = vec![to];
    let mut at = to;
    while at != from {
        match prev.get(&at) {
            Some(&p) => {
                path.push(p);
                at = p;
            }
            None => break,
        }
    }
    path.reverse();
    path
}

fn check_param_type(ty: ParamType, v: &Value) -> std::result::Result<(), String> {
    let ok = match ty {
        ParamType::Bool => v.is_boolean(),
        ParamType::Int => v.is_i64() || v.is_u64(),
        ParamType::Float => v.is_number(),
        ParamType::String | ParamType::Path | ParamType::InputPath => v.is_string(),
        ParamType::Duration => crate::spec::parse_duration_value(v).is_ok(),
        ParamType::Any => true,
    };
    if ok {
        return Ok(());
    }
    let want = match ty {
        ParamType::Bool => "true or false",
        ParamType::Int => "a whole number",
        ParamType::Float => "a number",
        ParamType::String => "a string",
        ParamType::Path | ParamType::InputPath => "a file path (string)",
        ParamType::Duration => "a duration like `20ms` or a number of seconds",
        ParamType::Any => "anything",
    };
    Err(format!("should be {want} but is {v}"))
}

/// The option closest to `s` by edit distance, if close enough to be a typo.
fn closest<'a>(s: &str, options: &[&'a str]) -> Option<&'a str> {
    options
        .iter()
        .map(|o| (levenshtein(s, o), *o))
        .filter(|(d, o)| *d > 0 && *d <= 3.min(1 + o.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, o)| o)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push(
                (prev[j] + usize::from(ca != *cb))
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1),
            );
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typo_distance() {
        assert_eq!(closest("timr", &["timer", "text"]), Some("timer"));
        assert_eq!(closest("zzzzzz", &["timer", "text"]), None);
        assert_eq!(closest("timer", &["timer"]), None);
    }

    #[test]
    fn parse_messages_are_cleaned() {
        assert_eq!(
            clean_parse_message(
                "error: line 4 column 5: unknown field `x`, expected one of a, b\n --> x"
            ),
            "unknown field `x`, expected one of a, b"
        );
        assert_eq!(
            parse_fix("unknown field `kindd`, expected one of id, kind, device", None),
            "did you mean `kind`? allowed fields here: id, kind, device; `edgeflow schema` documents each"
        );
    }
}
