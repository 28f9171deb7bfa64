//! # edgeflow-llm
//!
//! The `thinker` stage: llama-architecture language models from GGUF.

use edgeflow_graph::Registry;

/// Register the stage kinds of this crate.
pub fn register(r: &mut Registry) {
    let _ = r;
}
