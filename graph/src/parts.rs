//! One pipeline split into parts (processes or hosts).
//!
//! A stage may say where it runs (`part: robot`); stages without one are in
//! the [`DEFAULT_PART`]. [`select_part`] turns the whole pipeline into the
//! pipeline one part runs: its own stages and the edges between them, and
//! for every edge that joins it to another part a stage that carries the
//! edge across, supplied by a [`PartBridge`]. The engine decides which
//! edges cross and what each one needs (key, port type, policy, capacity);
//! the bridge decides how they cross (the control crate's bridge uses zenoh
//! publications and subscriptions), so this crate does not depend on any
//! transport.
//!
//! The whole pipeline is validated first, so a port type mismatch between
//! two parts is reported like any other, naming both stages and so both
//! parts.

use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::port::PortType;
use crate::spec::{EdgeSpec, PipelineSpec, Policy, StageSpec, DEFAULT_CAPACITY};

/// The part of stages that name none.
pub const DEFAULT_PART: &str = "default";

/// The part a stage runs in.
pub fn part_of(s: &StageSpec) -> &str {
    s.part.as_deref().unwrap_or(DEFAULT_PART)
}

/// Every part the pipeline's stages name, sorted, without duplicates.
pub fn part_names(spec: &PipelineSpec) -> Vec<String> {
    let mut v: Vec<String> = spec.stages.iter().map(|s| part_of(s).to_string()).collect();
    v.sort();
    v.dedup();
    v
}

/// Whether any stage names a part (a pipeline without parts runs whole).
pub fn is_split(spec: &PipelineSpec) -> bool {
    part_names(spec).len() > 1
}

/// One edge between two parts, as the bridge sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Crossing {
    /// The pipeline's name.
    pub pipeline: String,
    /// The edge's index in the file.
    pub index: usize,
    /// The transport key: the edge's `key`, else
    /// `edgeflow/<pipeline>/<from stage>.<port>/<to stage>.<port>`.
    pub key: String,
    /// Producer stage id and output port name.
    pub from: (String, String),
    /// Consumer stage id and input port name.
    pub to: (String, String),
    /// The producer's part.
    pub from_part: String,
    /// The consumer's part.
    pub to_part: String,
    /// The type of the producer's port (what travels).
    pub port_type: PortType,
    /// The edge's policy.
    pub policy: Policy,
    /// The edge's capacity.
    pub capacity: usize,
}

impl Crossing {
    /// `from.port -> to.port`, for messages.
    pub fn label(&self) -> String {
        format!(
            "{}.{} -> {}.{}",
            self.from.0, self.from.1, self.to.0, self.to.1
        )
    }
}

/// Supplies the stages that carry an edge between parts.
pub trait PartBridge {
    /// The stage, in the producer's part, that takes the edge's messages on
    /// its input `in` and sends them across.
    fn sender(&self, c: &Crossing) -> std::result::Result<StageSpec, String>;
    /// The stage, in the consumer's part, whose output `out` delivers what
    /// crossed.
    fn receiver(&self, c: &Crossing) -> std::result::Result<StageSpec, String>;
}

/// The pipeline part `part` runs, given the whole pipeline `spec` and its
/// validated `plan` (which gives every port's type): part `part`'s stages,
/// the edges among them, and a bridge stage for each end of an edge to or
/// from another part (ids `xpart_out_<edge>` / `xpart_in_<edge>`).
pub fn select_part(
    spec: &PipelineSpec,
    plan: &Plan,
    part: &str,
    bridge: &dyn PartBridge,
) -> Result<PipelineSpec> {
    let names = part_names(spec);
    if !names.iter().any(|n| n == part) {
        return Err(Error::Split(format!(
            "the pipeline has no part `{part}`; its parts are: {}",
            names.join(", ")
        )));
    }
    let name = spec.name.clone().unwrap_or_else(|| plan.name.clone());
    let mut out = PipelineSpec {
        name: spec.name.clone(),
        description: spec.description.clone(),
        stages: spec
            .stages
            .iter()
            .filter(|s| part_of(s) == part)
            .cloned()
            .collect(),
        edges: Vec::new(),
        // The bridge stages carry what the part needs of `parts:`.
        parts: Default::default(),
    };
    if plan.edges.len() != spec.edges.len() {
        return Err(Error::Split(format!(
            "the plan has {} edges, the file {}: validate the same file you split",
            plan.edges.len(),
            spec.edges.len()
        )));
    }
    for (i, (e, pe)) in spec.edges.iter().zip(&plan.edges).enumerate() {
        let from_st = &plan.stages[pe.from.0];
        let to_st = &plan.stages[pe.to.0];
        let part_by_id = |id: &str| {
            spec.stages
                .iter()
                .find(|s| s.id == id)
                .map(part_of)
                .unwrap_or(DEFAULT_PART)
                .to_string()
        };
        let (fp, tp) = (part_by_id(&from_st.id), part_by_id(&to_st.id));
        if fp != part && tp != part {
            continue;
        }
        if fp == tp {
            out.edges.push(e.clone());
            continue;
        }
        let from_port = &from_st.ports.outputs[pe.from.1];
        let to_port = &to_st.ports.inputs[pe.to.1];
        let c = Crossing {
            pipeline: name.clone(),
            index: i,
            key: e.key.clone().unwrap_or_else(|| {
                format!(
                    "edgeflow/{}/{}.{}/{}.{}",
                    key_chunk(&name),
                    from_st.id,
                    from_port.name,
                    to_st.id,
                    to_port.name
                )
            }),
            from: (from_st.id.clone(), from_port.name.to_string()),
            to: (to_st.id.clone(), to_port.name.to_string()),
            from_part: fp.clone(),
            to_part: tp.clone(),
            port_type: from_port.ty,
            policy: pe.policy,
            capacity: e.capacity.unwrap_or(DEFAULT_CAPACITY),
        };
        let fail = |side: &str, m: String| {
            Error::Split(format!(
                "edge {} ({} -> {}) cannot cross parts ({side}): {m}",
                c.label(),
                c.from_part,
                c.to_part
            ))
        };
        if fp == part {
            let mut st = bridge.sender(&c).map_err(|m| fail("sender", m))?;
            st.id = format!("xpart_out_{i}");
            st.part = Some(part.to_string());
            out.edges.push(EdgeSpec {
                to: format!("{}.in", st.id),
                max_age: None,
                key: None,
                ..e.clone()
            });
            out.stages.push(st);
        } else {
            let mut st = bridge.receiver(&c).map_err(|m| fail("receiver", m))?;
            st.id = format!("xpart_in_{i}");
            st.part = Some(part.to_string());
            out.edges.push(EdgeSpec {
                from: format!("{}.out", st.id),
                key: None,
                ..e.clone()
            });
            out.stages.push(st);
        }
    }
    Ok(out)
}

/// `s` made safe as one chunk of a key expression (no `/`, `*`, `$`, `?`,
/// `#`; spaces become `_`).
pub fn key_chunk(s: &str) -> String {
    let t: String = s
        .chars()
        .map(|c| match c {
            '/' | '*' | '$' | '?' | '#' | ' ' => '_',
            c => c,
        })
        .collect();
    if t.is_empty() {
        "pipeline".into()
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Pipeline, Registry};

    struct Named;
    impl PartBridge for Named {
        fn sender(&self, c: &Crossing) -> std::result::Result<StageSpec, String> {
            Ok(stage("discard", &c.key))
        }
        fn receiver(&self, c: &Crossing) -> std::result::Result<StageSpec, String> {
            if c.port_type == PortType::Tokens {
                return Err("tokens do not travel".into());
            }
            Ok(stage("timer", &c.key))
        }
    }

    fn stage(kind: &str, key: &str) -> StageSpec {
        StageSpec {
            id: String::new(),
            kind: kind.into(),
            device: None,
            threads: None,
            inline: false,
            part: None,
            params: [("note".to_string(), serde_json::json!(key))]
                .into_iter()
                .collect(),
        }
    }

    const YAML: &str = r#"
name: split demo
stages:
  - { id: tick, kind: timer, part: robot, params: { rate_hz: 100, count: 3 } }
  - { id: mid, kind: passthrough, part: brain }
  - { id: show, kind: discard, part: robot }
  - { id: here, kind: discard }
edges:
  - { from: tick.out, to: mid.in, policy: latest, capacity: 1 }
  - { from: mid.out, to: show.in, key: custom/key }
  - { from: tick.out, to: here.in }
"#;

    fn split(part: &str) -> Result<PipelineSpec> {
        let spec = crate::parse_spec(YAML, None)?;
        let plan = Pipeline::from_yaml(YAML, &Registry::builtin())?;
        select_part(&spec, plan.plan(), part, &Named)
    }

    #[test]
    fn each_part_gets_its_stages_and_a_bridge_per_crossing_edge() {
        let robot = split("robot").expect("robot part");
        let ids: Vec<&str> = robot.stages.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(
            ids,
            ["tick", "show", "xpart_out_0", "xpart_in_1", "xpart_out_2"]
        );
        let edges: Vec<(&str, &str)> = robot
            .edges
            .iter()
            .map(|e| (e.from.as_str(), e.to.as_str()))
            .collect();
        assert_eq!(
            edges,
            [
                ("tick.out", "xpart_out_0.in"),
                ("xpart_in_1.out", "show.in"),
                ("tick.out", "xpart_out_2.in")
            ]
        );
        // The edge keeps its policy; the key is derived or as written.
        assert_eq!(robot.edges[0].policy, Some(Policy::Latest));
        assert_eq!(
            robot.stages[2].params["note"],
            "edgeflow/split_demo/tick.out/mid.in"
        );
        assert_eq!(robot.stages[3].params["note"], "custom/key");
        let brain = split("brain").expect("brain part");
        let ids: Vec<&str> = brain.stages.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["mid", "xpart_in_0", "xpart_out_1"]);
        let default = split(DEFAULT_PART).expect("default part");
        assert_eq!(default.stages.len(), 2, "here + the bridge from robot");
    }

    #[test]
    fn an_unknown_part_names_the_parts_there_are() {
        let e = split("arm").expect_err("no such part").to_string();
        assert!(e.contains("no part `arm`"), "{e}");
        assert!(e.contains("brain, default, robot"), "{e}");
    }

    #[test]
    fn a_type_mismatch_between_parts_names_both_parts() {
        let yaml = r#"
stages:
  - { id: tick, kind: timer, part: robot, params: { rate_hz: 10, count: 1 } }
  - { id: out, kind: host_out, part: brain, params: { type: audio } }
edges:
  - { from: tick.out, to: out.in }
"#;
        let e = Pipeline::from_yaml(yaml, &Registry::builtin())
            .expect_err("control into audio")
            .to_string();
        assert!(e.contains("(part `robot` -> part `brain`)"), "{e}");
    }

    #[test]
    fn part_names_are_sorted_and_unique() {
        let spec = crate::parse_spec(YAML, None).expect("parse");
        assert_eq!(part_names(&spec), ["brain", "default", "robot"]);
        assert!(is_split(&spec));
    }
}
