//! # edgeflow
//!
//! The library entry point: every stage kind registered in one
//! [`registry()`] (which also opens the stages' devices), every model card
//! in one [`model_cards()`], plus re-exports of the engine, runtime and
//! model registry, so a host program can build a pipeline from YAML or in
//! code, push into and pull from named ports, cancel an epoch and join.
//! A program that loads large models may install [`HugePageAlloc`] as its
//! global allocator, as the `edgeflow` CLI does.

pub use edgeflow_backends::HugePageAlloc;
pub use edgeflow_graph as graph;
pub use edgeflow_graph::{
    Message, MetricsSnapshot, Payload, Pipeline, PipelineBuilder, Registry, Running,
};
pub use edgeflow_models as models;
pub use edgeflow_runtime as runtime;

/// A registry with every stage kind that ships with edgeflow, whose stages
/// get their devices from `edgeflow_backends::open`.
pub fn registry() -> Registry {
    let mut r = Registry::builtin();
    r.set_device_opener(edgeflow_backends::open);
    edgeflow_audio::register(&mut r);
    edgeflow_piper::register(&mut r);
    edgeflow_dialogue::register(&mut r);
    edgeflow_llm::register(&mut r);
    edgeflow_speech::register(&mut r);
    edgeflow_control::register(&mut r);
    edgeflow_vision::register(&mut r);
    edgeflow_dinov2::register(&mut r);
    edgeflow_minilm::register(&mut r);
    edgeflow_action::register(&mut r);
    edgeflow_vocoder::register(&mut r);
    edgeflow_omni::register(&mut r);
    r
}

/// Every model edgeflow can fetch, from every model family, in the order
/// `edgeflow models list` prints them.
pub fn model_cards() -> Vec<&'static models::ModelCard> {
    edgeflow_piper::cards()
        .iter()
        .chain(edgeflow_llm::cards())
        .chain(edgeflow_speech::cards())
        .chain(edgeflow_dinov2::cards())
        .chain(edgeflow_minilm::cards())
        .chain(edgeflow_action::cards())
        .chain(edgeflow_vocoder::cards())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn model_cards_are_consistent_and_uniquely_named() {
        let cards = super::model_cards();
        assert!(cards.len() >= 4);
        for (i, c) in cards.iter().enumerate() {
            c.check().expect("consistent card");
            assert!(
                cards[..i]
                    .iter()
                    .all(|o| o.name != c.name && o.folder != c.folder),
                "two cards named `{}` or using folder `{}`",
                c.name,
                c.folder
            );
        }
    }

    #[test]
    fn the_registry_opens_devices() {
        assert!(super::registry().device_opener().is_some());
    }
}
