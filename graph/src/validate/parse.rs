//! YAML text to a [`PipelineSpec`]: syntax and shape errors located, named
//! and given a fix.

use super::closest;
use super::source_map::{List, Pos, SourceMap};
use crate::error::{Diagnostic, Error, Result};
use crate::spec::PipelineSpec;
use std::path::Path;

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

#[cfg(test)]
mod tests {
    use super::*;

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
