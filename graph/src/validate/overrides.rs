//! `--set STAGE.PARAM=VALUE` overrides: parsing them, and the checks that
//! are about the override itself rather than the stage it lands on.

use super::{closest, Ctx};
use crate::error::Diagnostic;
use crate::spec::PipelineSpec;
use serde_json::Value;

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
    pub(super) fn label(&self) -> String {
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

/// `--set` naming a stage that does not exist.
pub(super) fn check_overrides(
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

/// Stage fields that `--set STAGE.FIELD=VALUE` overrides like params (a
/// kind's own param of the same name, e.g. `mic`'s `device`, takes the
/// override instead).
pub(super) const PLACEMENT_FIELDS: [&str; 3] = ["device", "threads", "inline"];

/// The last `--set` of placement field `field` for `stage`, unless the kind
/// declares a param of that name (then the override is that param's).
pub(super) fn placement<'o>(
    overrides: &'o [Override],
    stage: &str,
    field: &str,
    declared: &[&str],
) -> Option<&'o Override> {
    if declared.contains(&field) {
        return None;
    }
    overrides
        .iter()
        .rev()
        .find(|o| o.stage == stage && o.param == field)
}

/// Whether override `o` sets a placement field rather than a param.
pub(super) fn is_placement(o: &Override, declared: &[&str]) -> bool {
    PLACEMENT_FIELDS.contains(&o.param.as_str()) && !declared.contains(&o.param.as_str())
}

/// `--set STAGE.device=...` as a device string: what was written.
pub(super) fn device_text(o: &Override) -> String {
    match &o.value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
