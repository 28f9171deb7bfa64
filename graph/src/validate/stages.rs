//! One stage of the spec to a [`PlannedStage`]: kind, placement, params
//! (file values, then `--set` overrides, then defaults), ports.

use super::overrides::{self, Override};
use super::source_map::{List, Pos};
use super::{closest, Ctx};
use crate::error::Diagnostic;
use crate::plan::PlannedStage;
use crate::registry::{BuildEnv, ParamError, ParamType, Params, Registry};
use crate::stage::StageError;
use edgeflow_runtime::DeviceSpec;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Largest accepted `threads:`.
const MAX_THREADS: usize = 256;

/// Resolve one stage: kind, device, threads, params, ports.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan_stage(
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
    let declared: Vec<&str> = info.params.iter().map(|p| p.name).collect();
    // Placement: the file's fields, or `--set STAGE.device|threads|inline`.
    let set = |field: &str| overrides::placement(overrides, &s.id, field, &declared);
    let device = match set("device") {
        Some(o) => {
            let written = overrides::device_text(o);
            match written.parse::<DeviceSpec>() {
                Ok(d) => d,
                Err(e) => {
                    diags.push(cx.diag(
                        item,
                        format!("{ctx}, {}", o.label()),
                        e.to_string(),
                        format!(
                            "pass `--set {id}.device=cpu`, `gpu`, `gpu:0`, `npu`, `npu:0` or `auto`",
                            id = s.id
                        ),
                    ));
                    DeviceSpec::Cpu
                }
            }
        }
        None => match s.device.as_deref().unwrap_or("cpu").parse::<DeviceSpec>() {
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
        },
    };
    let threads = match set("threads") {
        Some(o) => match o.value.as_u64().and_then(|t| usize::try_from(t).ok()) {
            Some(t) if (1..=MAX_THREADS).contains(&t) => t,
            _ => {
                diags.push(cx.diag(
                    item,
                    format!("{ctx}, {}", o.label()),
                    format!(
                        "threads must be a whole number 1..={MAX_THREADS}, got {}",
                        o.value
                    ),
                    format!(
                        "pass `--set {}.threads=N` with the number of cores the stage may use",
                        s.id
                    ),
                ));
                1
            }
        },
        None => {
            let threads = s.threads.unwrap_or(1);
            if threads == 0 || threads > MAX_THREADS {
                diags.push(cx.diag(
                    cx.field_or_item(List::Stages, i, "threads"),
                    ctx.clone(),
                    format!("threads must be 1..={MAX_THREADS}, got {threads}"),
                    "set `threads:` to the number of cores the stage may use",
                ));
            }
            threads
        }
    };
    let inline = match set("inline") {
        Some(o) => match o.value.as_bool() {
            Some(b) => b,
            None => {
                diags.push(cx.diag(
                    item,
                    format!("{ctx}, {}", o.label()),
                    format!("inline must be true or false, got {}", o.value),
                    format!(
                        "pass `--set {}.inline=true` (run on the producer's thread) or `=false`",
                        s.id
                    ),
                ));
                s.inline
            }
        },
        None => s.inline,
    };
    // Params: file values, then overrides; each problem points at its source.
    let mut values: BTreeMap<String, Value> = s.params.clone();
    let mut overridden: HashMap<&str, &Override> = HashMap::new();
    for o in overrides
        .iter()
        .filter(|o| o.stage == s.id && !overrides::is_placement(o, &declared))
    {
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
    let names = &declared;
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
                match closest(k, names) {
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
        inline,
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
