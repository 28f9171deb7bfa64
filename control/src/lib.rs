//! # edgeflow-control
//!
//! Robot control over zenoh, as stages usable from YAML:
//!
//! | kind | what |
//! |---|---|
//! | `zenoh_sub` | source: a key expression's wire messages as typed payloads; malformed ones counted and rejected; optional peer liveliness watch |
//! | `zenoh_pub` | sink: payloads published in the wire format with QoS from params |
//! | `expert_policy` | the push simulator's scripted expert as a policy stage (true state in, chunks out, artificial latency) |
//! | `controller` | fixed-rate loop on its own thread: action queue with chunk requests, overlap merge, stale-action drops, inference-delay measurement and a watchdog safe action |
//!
//! The wire format ([`wire`], `control/WIRE.md`) is versioned and shared
//! with the Python client in `examples/python/`. The per-period controller
//! logic ([`core::ControllerCore`]) and the queue ([`queue::ActionQueue`])
//! are plain types usable without a pipeline.

pub mod controller;
pub mod core;
mod error;
pub mod journal;
pub mod link;
pub mod netns;
pub mod parts;
pub mod queue;
pub mod rt;
pub mod session;
pub mod sim_link;
mod tun_wire;
pub mod wire;
pub mod zenoh_io;

pub use error::{Error, Result};

use edgeflow_graph::Registry;

/// Register the control stage kinds.
pub fn register(r: &mut Registry) {
    r.register(zenoh_io::ZenohSubKind);
    r.register(zenoh_io::ZenohPubKind);
    r.register(controller::ControllerKind);
    r.register(sim_link::ExpertPolicyKind);
}
