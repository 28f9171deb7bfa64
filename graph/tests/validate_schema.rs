//! The committed JSON schema (`pipelines/schema.json`) matches the spec
//! types, and every field of the format is documented.

use serde_json::Value;
use std::path::PathBuf;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../pipelines/schema.json")
}

#[test]
fn committed_schema_is_up_to_date() {
    let fresh = edgeflow_graph::spec::json_schema_text();
    if std::env::var_os("EDGEFLOW_BLESS").is_some() {
        std::fs::write(committed_path(), &fresh).expect("write pipelines/schema.json");
    }
    let committed = std::fs::read_to_string(committed_path()).unwrap_or_default();
    assert!(
        committed == fresh,
        "pipelines/schema.json is stale (or missing): the pipeline spec types changed.\n\
         Regenerate it with\n    cargo run -p edgeflow -- schema > pipelines/schema.json\n\
         (or EDGEFLOW_BLESS=1 cargo test -p edgeflow-graph --test validate_schema)\n\
         and commit it."
    );
}

/// Every property of every object in the schema has a description, and so
/// does every definition.
#[test]
fn every_field_is_documented() {
    fn walk(v: &Value, path: &str, missing: &mut Vec<String>) {
        let Some(obj) = v.as_object() else { return };
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            for (name, p) in props {
                let here = format!("{path}.{name}");
                if p.get("description")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    missing.push(here.clone());
                }
                walk(p, &here, missing);
            }
        }
        for key in ["$defs", "definitions"] {
            if let Some(defs) = obj.get(key).and_then(Value::as_object) {
                for (name, d) in defs {
                    if d.get("description").is_none() {
                        missing.push(format!("{key}.{name}"));
                    }
                    walk(d, &format!("{key}.{name}"), missing);
                }
            }
        }
    }
    let schema = edgeflow_graph::spec::json_schema();
    assert!(
        schema.get("description").is_some(),
        "the root is documented"
    );
    let mut missing = Vec::new();
    walk(&schema, "", &mut missing);
    assert!(missing.is_empty(), "undocumented: {missing:?}");
    // The fields users write most are all there.
    let text = schema.to_string();
    for field in [
        "stages",
        "edges",
        "kind",
        "device",
        "threads",
        "inline",
        "params",
        "capacity",
        "policy",
        "max_age",
        "back_edge",
        "drop_oldest",
    ] {
        assert!(
            text.contains(&format!("\"{field}\"")),
            "schema mentions `{field}`"
        );
    }
}
