//! # edgeflow-stages
//!
//! Model stages written against the edgeflow tensor runtime.

use edgeflow_graph::Registry;

/// Register every model stage kind.
pub fn register(r: &mut Registry) {
    let _ = r;
}
