//! # edgeflow-vision (under construction)
//!
//! Images for the vision stages: decode, resize, normalise, frame sources.

use edgeflow_graph::Registry;

/// Register the stage kinds of this crate.
pub fn register(_r: &mut Registry) {}
