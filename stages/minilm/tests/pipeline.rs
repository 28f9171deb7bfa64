//! The `text_encoder` stage in a pipeline: host text in, embeddings out,
//! repeated instructions from the cache, blank text refused.

mod common;

use edgeflow_graph::{Payload, Pipeline, Registry};
use std::time::Duration;

fn registry() -> Registry {
    let mut r = Registry::builtin();
    r.set_device_opener(edgeflow_backends::open);
    edgeflow_minilm::register(&mut r);
    r
}

const YAML: &str = r#"
name: instruction
stages:
  - { id: in, kind: host_in, params: { type: text } }
  - { id: enc, kind: text_encoder, params: { cache: 8 } }
  - { id: out, kind: host_out, params: { type: tensor } }
edges:
  - { from: in.out, to: enc.in }
  - { from: enc.out, to: out.in, capacity: 16 }
"#;

#[test]
fn instructions_become_cached_unit_embeddings() {
    if common::model().is_none() {
        return;
    }
    let mut running = Pipeline::from_yaml(YAML, &registry())
        .expect("valid pipeline")
        .start()
        .expect("start");
    let texts = [
        "push the red block onto the green target",
        "push the blue block onto the yellow target",
        "push the red block onto the green target",
        "PUSH the red block onto the green target", // lowercased: same ids
    ];
    let mut outs = Vec::new();
    for t in texts {
        running.push("in", Payload::text(t)).expect("push");
        let m = running
            .pull("out", Duration::from_secs(60))
            .expect("pull")
            .expect("an embedding");
        let Payload::Tensor(t) = &m.payload else {
            panic!("expected a tensor, got {}", m.payload.type_name())
        };
        assert_eq!(t.dims(), [384]);
        outs.push(t.to_vec_f32().expect("host f32"));
    }
    running.close_input("in").expect("close");
    let metrics = running.wait(Some(Duration::from_secs(30))).expect("run");
    let norm = outs[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    assert_eq!(outs[0], outs[2]);
    assert_eq!(outs[0], outs[3]);
    assert_ne!(outs[0], outs[1]);
    let enc = metrics
        .stages
        .iter()
        .find(|s| s.id == "enc")
        .expect("enc metrics");
    let hits = &enc.values["text_encoder_cache_hit"];
    assert_eq!(
        (hits.count, hits.mean),
        (4, 0.5),
        "two of four from the cache"
    );
    assert_eq!(enc.values["text_encoder_ms"].count, 2);
}

#[test]
fn a_blank_instruction_stops_the_pipeline_with_the_reason() {
    if common::model().is_none() {
        return;
    }
    let mut running = Pipeline::from_yaml(YAML, &registry())
        .expect("valid pipeline")
        .start()
        .expect("start");
    running.push("in", Payload::text(" \n\t")).expect("push");
    running.close_input("in").expect("close");
    let e = running
        .wait(Some(Duration::from_secs(30)))
        .expect_err("blank text");
    assert!(
        e.to_string().contains("text_encoder got an empty text"),
        "{e}"
    );
}
