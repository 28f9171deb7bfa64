//! # edgeflow-dialogue
//!
//! Dialogue logic for voice agents, as stages usable from YAML. It holds no
//! model and no audio processing: it decides, from the VAD's events, the
//! transcripts and the agent's own output, when a user's turn ends and when
//! the user barges in.
//!
//! | kind | what |
//! |---|---|
//! | `turn` | turn-taking and barge-in for voice loops (epochs, cancels, latencies) |

pub mod turn;

use edgeflow_graph::Registry;

/// Register every dialogue stage kind.
pub fn register(r: &mut Registry) {
    r.register(turn::TurnKind);
}
