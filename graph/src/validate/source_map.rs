//! Where each node of a pipeline file sits, so that semantic errors point at
//! the offending stage, edge or field rather than at a text match.
//!
//! The spec types stay plain (they are also built in code, serialized and
//! turned into a JSON schema); the file is parsed a second time into a
//! permissive tree of [`Spanned`] nodes that mirrors it. That costs one more
//! parse of a small file and keeps the executor and `PipelineBuilder` free of
//! location plumbing.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_saphyr::{Location, Spanned};
use std::fmt;

/// A 1-based line and column in the pipeline file (columns count characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pos {
    /// 1-based line.
    pub(crate) line: usize,
    /// 1-based column, in characters.
    pub(crate) column: usize,
}

impl Pos {
    /// A known location, or `None` for serde-saphyr's "unknown" (line 0).
    pub(crate) fn from_location(l: &Location) -> Option<Pos> {
        let (line, column) = (l.line(), l.column());
        if line == 0 {
            return None;
        }
        Some(Pos {
            line: usize::try_from(line).ok()?,
            column: usize::try_from(column.max(1)).ok()?,
        })
    }
}

/// A YAML node of any shape.
#[derive(Debug)]
enum Node {
    Map(Vec<(Spanned<String>, Spanned<Node>)>),
    Seq(Vec<Spanned<Node>>),
    Scalar(Option<String>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Scalar(Some(v.to_string())))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Scalar(Some(v.to_string())))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Scalar(Some(v.to_string())))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Scalar(Some(v.to_string())))
    }
    fn visit_u128<E>(self, v: u128) -> Result<Node, E> {
        Ok(Node::Scalar(Some(v.to_string())))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Scalar(Some(v.to_string())))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Scalar(Some(v.to_string())))
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<Node, E> {
        Ok(Node::Scalar(Some(String::from_utf8_lossy(v).into_owned())))
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Scalar(None))
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Scalar(None))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(x) = a.next_element()? {
            items.push(x);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = a.next_entry()? {
            entries.push(entry);
        }
        Ok(Node::Map(entries))
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<Node, A::Error> {
        Err(de::Error::custom(
            "tagged values are not used in pipeline files",
        ))
    }
}

/// The two lists of a pipeline file that hold located items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum List {
    Stages,
    Edges,
}

impl List {
    fn key(self) -> &'static str {
        match self {
            List::Stages => "stages",
            List::Edges => "edges",
        }
    }
}

/// What a position in the file belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The list the item is in.
    pub(crate) list: List,
    /// Index of the item in that list.
    pub(crate) index: usize,
    /// The item's field at or around the position, if any.
    pub(crate) field: Option<String>,
}

/// Locations of the nodes of one pipeline file. Empty (every lookup gives
/// `None`) when the text is not available or does not parse.
#[derive(Debug, Default)]
pub(crate) struct SourceMap {
    root: Option<Spanned<Node>>,
}

impl SourceMap {
    /// Map `source`; never fails (an unparsable text gives an empty map).
    pub(crate) fn parse(source: &str) -> Self {
        if source.trim().is_empty() {
            return Self::default();
        }
        SourceMap {
            root: serde_saphyr::from_str::<Spanned<Node>>(source).ok(),
        }
    }

    /// Whether the file has no content at all (only comments or `~`).
    pub(crate) fn is_blank(&self) -> bool {
        matches!(
            self.root.as_ref().map(|r| &r.value),
            Some(Node::Scalar(None))
        )
    }

    fn top(&self, key: &str) -> Option<&(Spanned<String>, Spanned<Node>)> {
        match &self.root.as_ref()?.value {
            Node::Map(entries) => entries.iter().find(|(k, _)| k.value == key),
            _ => None,
        }
    }

    /// Where a top-level key (`stages:`, `edges:`) is written.
    pub(crate) fn top_key(&self, key: &str) -> Option<Pos> {
        self.top(key)
            .and_then(|(k, _)| Pos::from_location(&k.referenced))
    }

    fn items(&self, list: List) -> Option<&[Spanned<Node>]> {
        match &self.top(list.key())?.1.value {
            Node::Seq(items) => Some(items),
            _ => None,
        }
    }

    /// Number of items in a list (0 when the key is absent or null).
    pub(crate) fn len(&self, list: List) -> Option<usize> {
        self.root.as_ref()?;
        match self.top(list.key()).map(|(_, v)| &v.value) {
            None | Some(Node::Scalar(None)) => Some(0),
            Some(Node::Seq(items)) => Some(items.len()),
            Some(_) => None,
        }
    }

    fn item(&self, list: List, index: usize) -> Option<&Spanned<Node>> {
        self.items(list)?.get(index)
    }

    /// Where item `index` of `list` starts.
    pub(crate) fn item_pos(&self, list: List, index: usize) -> Option<Pos> {
        self.item(list, index)
            .and_then(|n| Pos::from_location(&n.referenced))
    }

    fn entry(
        &self,
        list: List,
        index: usize,
        key: &str,
    ) -> Option<&(Spanned<String>, Spanned<Node>)> {
        match &self.item(list, index)?.value {
            Node::Map(entries) => entries.iter().find(|(k, _)| k.value == key),
            _ => None,
        }
    }

    /// Where the value of field `key` of an item is written (falls back to
    /// the key when the value has no location of its own, e.g. `key:`).
    pub(crate) fn field(&self, list: List, index: usize, key: &str) -> Option<Pos> {
        let (k, v) = self.entry(list, index, key)?;
        Pos::from_location(&v.referenced).or_else(|| Pos::from_location(&k.referenced))
    }

    /// Where the key of field `key` of an item is written.
    pub(crate) fn field_key(&self, list: List, index: usize, key: &str) -> Option<Pos> {
        self.entry(list, index, key)
            .and_then(|(k, _)| Pos::from_location(&k.referenced))
    }

    /// The text of a scalar field of an item (for naming items in errors
    /// that the typed parse rejected).
    pub(crate) fn scalar(&self, list: List, index: usize, key: &str) -> Option<&str> {
        match &self.entry(list, index, key)?.1.value {
            Node::Scalar(Some(s)) => Some(s),
            _ => None,
        }
    }

    /// Where a stage's param is written: `(key, value)`.
    pub(crate) fn param(&self, stage: usize, name: &str) -> Option<(Pos, Option<Pos>)> {
        let (_, params) = self.entry(List::Stages, stage, "params")?;
        let Node::Map(entries) = &params.value else {
            return None;
        };
        let (k, v) = entries.iter().find(|(k, _)| k.value == name)?;
        Some((
            Pos::from_location(&k.referenced)?,
            Pos::from_location(&v.referenced),
        ))
    }

    /// The top-level key whose value a position falls in (for errors outside
    /// any stage or edge).
    pub(crate) fn top_field(&self, at: Pos) -> Option<String> {
        match &self.root.as_ref()?.value {
            Node::Map(entries) => entries
                .iter()
                .rfind(|(k, _)| Pos::from_location(&k.referenced).is_some_and(|p| p <= at))
                .map(|(k, _)| k.value.clone()),
            _ => None,
        }
    }

    /// The stage or edge that a position (e.g. of a parse error) falls in, and
    /// the field of that item it concerns.
    pub(crate) fn owner(&self, at: Pos) -> Option<Owner> {
        for list in [List::Stages, List::Edges] {
            for (index, item) in self.items(list).unwrap_or_default().iter().enumerate() {
                let Some(start) = Pos::from_location(&item.referenced) else {
                    continue;
                };
                let end = last_pos(item).unwrap_or(start);
                if at < start || at > end {
                    continue;
                }
                let field = match &item.value {
                    Node::Map(entries) => entries
                        .iter()
                        .rfind(|(k, _)| Pos::from_location(&k.referenced).is_some_and(|p| p <= at))
                        .map(|(k, _)| k.value.clone()),
                    _ => None,
                };
                return Some(Owner { list, index, field });
            }
        }
        None
    }
}

/// The last position anywhere inside a node.
fn last_pos(n: &Spanned<Node>) -> Option<Pos> {
    let own = Pos::from_location(&n.referenced);
    let inner = match &n.value {
        Node::Map(entries) => entries
            .iter()
            .flat_map(|(k, v)| [Pos::from_location(&k.referenced), last_pos(v)])
            .flatten()
            .max(),
        Node::Seq(items) => items.iter().filter_map(last_pos).max(),
        Node::Scalar(_) => None,
    };
    own.max(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "name: x\nstages:\n  - id: a\n    kind: timer\n    params: { rate_hz: 10 }\n  - { id: b, kind: stdout }\nedges:\n  - from: a.out\n    to: b.in\n";

    fn pos(line: usize, column: usize) -> Option<Pos> {
        Some(Pos { line, column })
    }

    #[test]
    fn finds_items_fields_and_params() {
        let m = SourceMap::parse(YAML);
        assert_eq!(m.len(List::Stages), Some(2));
        assert_eq!(m.len(List::Edges), Some(1));
        assert_eq!(m.item_pos(List::Stages, 1), pos(6, 5));
        assert_eq!(m.field(List::Stages, 1, "kind"), pos(6, 20));
        assert_eq!(m.field_key(List::Stages, 0, "kind"), pos(4, 5));
        assert_eq!(m.field(List::Edges, 0, "to"), pos(9, 9));
        assert_eq!(m.param(0, "rate_hz").map(|p| p.0), pos(5, 15));
        assert_eq!(m.scalar(List::Stages, 0, "id"), Some("a"));
        assert_eq!(m.top_key("edges"), pos(7, 1));
    }

    #[test]
    fn owner_of_a_position() {
        let m = SourceMap::parse(YAML);
        let o = m.owner(Pos {
            line: 5,
            column: 24,
        });
        assert_eq!(
            o,
            Some(Owner {
                list: List::Stages,
                index: 0,
                field: Some("params".into())
            })
        );
        assert_eq!(
            m.owner(Pos { line: 9, column: 5 }).map(|o| o.list),
            Some(List::Edges)
        );
        assert_eq!(m.owner(Pos { line: 1, column: 1 }), None);
        assert_eq!(
            m.top_field(Pos { line: 1, column: 7 }).as_deref(),
            Some("name")
        );
        assert_eq!(
            m.top_field(Pos { line: 8, column: 5 }).as_deref(),
            Some("edges")
        );
    }

    #[test]
    fn garbage_gives_an_empty_map() {
        let m = SourceMap::parse("stages: [ {");
        assert_eq!(m.len(List::Stages), None);
        assert_eq!(m.item_pos(List::Stages, 0), None);
        assert!(SourceMap::parse("# only a comment\n").is_blank());
    }
}
