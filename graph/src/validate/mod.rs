//! Parse and validate a pipeline into a [`Plan`]. Every problem becomes a
//! [`Diagnostic`] naming the file, the line and column of the offending
//! stage, edge or field, what is wrong and the fix; validation collects all
//! of them before failing.
//!
//! Locations come from the YAML parser itself (serde-saphyr spans, see
//! [`source_map`]), never from searching the text, so a stage id that also
//! appears in a comment or another stage's params is not mistaken for it.

mod edges;
mod overrides;
mod parse;
mod source_map;
mod stages;

pub use overrides::Override;
pub use parse::parse_spec;

use crate::error::{Diagnostic, Error, Result};
use crate::plan::{Plan, PlannedStage};
use crate::registry::Registry;
use crate::spec::PipelineSpec;
use source_map::{List, Pos, SourceMap};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Builds diagnostics for one file.
pub(super) struct Ctx<'a> {
    pub(super) file: Option<&'a Path>,
    pub(super) map: SourceMap,
}

impl Ctx<'_> {
    pub(super) fn diag(
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
    pub(super) fn field_or_item(&self, list: List, index: usize, key: &str) -> Option<Pos> {
        self.map
            .field(list, index, key)
            .or_else(|| self.map.item_pos(list, index))
    }
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
        .map(|(i, s)| stages::plan_stage(i, s, registry, base_dir, overrides, &cx, &mut diags))
        .collect();
    overrides::check_overrides(spec, overrides, &cx, &mut diags);
    let (edges, edge_lines, fed) = edges::plan_edges(spec, &ids, &stages, &cx, &mut diags);
    edges::check_inputs(&stages, &fed, &cx, &mut diags);
    edges::check_cycles(&stages, &edges, &edge_lines, &cx, &mut diags);
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
        if let Some(part) = &s.part {
            if part.is_empty()
                || !part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                diags.push(cx.diag(
                    cx.field_or_item(List::Stages, i, "part"),
                    format!("stage `{}`", s.id),
                    format!("part name `{part}` is not letters, digits, `_` or `-`"),
                    "name parts like `robot` or `edge_box` (they become zenoh key chunks)",
                ));
            }
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
    for name in spec.parts.keys() {
        if !spec.stages.iter().any(|s| crate::parts::part_of(s) == name) {
            diags.push(cx.diag(
                cx.map.top_key("parts"),
                format!("part `{name}`"),
                format!("`parts:` describes `{name}`, but no stage says `part: {name}`"),
                "remove the entry or put stages in that part",
            ));
        }
    }
    ids
}

/// The option closest to `s` by edit distance, if close enough to be a typo.
pub(super) fn closest<'a>(s: &str, options: &[&'a str]) -> Option<&'a str> {
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
}
