//! # edgeflow-action (under construction)
//!
//! The flow-matching action head as a stage.

use edgeflow_graph::Registry;

/// The model cards of this crate (`edgeflow models list`).
pub fn cards() -> &'static [edgeflow_models::ModelCard] {
    &[]
}

/// Register the stage kinds of this crate.
pub fn register(_r: &mut Registry) {}
