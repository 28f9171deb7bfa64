//! The controller's journal: every call it made on its [`ControllerCore`],
//! in order, with the clock readings the calls used.
//!
//! A controller's commands depend on more than the contents of its input
//! messages: on when its own metronome ticked, and on whether a chunk was
//! applied before or after a tick (its loop and its input run on two
//! threads). Neither is in the messages on its edges. So while a run is
//! recorded (`edgeflow run --record`) the controller journals each core
//! call under the core's lock — the order they really happened in — and
//! `edgeflow replay` feeds the same calls to a fresh core: its commands are
//! the recorded ones, bit for bit, whatever the replay machine's timing.
//! This is copper-rs's deterministic replay (every input of a task logged,
//! the clock included) for the one stage that owns a clock.
//!
//! Entry encoding, little-endian: `u8` version (1), `u8` kind, then
//! - 1 tick: `u64` now (ns, the graph clock);
//! - 2 chunk: `u64` start step, `u32` dim, `u32` value count n, n `f32`,
//!   `u64` now;
//! - 3 observation: `u64` capture time;
//! - 4 peer: `u8` lost (0/1), `u64` now.

use crate::core::{ControllerCore, Tick};
use crate::queue::{InsertReport, QueueError};
use crate::{Error, Result};

const VERSION: u8 = 1;
const TICK: u8 = 1;
const CHUNK: u8 = 2;
const OBSERVATION: u8 = 3;
const PEER: u8 = 4;

/// One call on a [`ControllerCore`].
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// [`ControllerCore::tick`] at `now_ns`.
    Tick {
        /// The tick's clock reading.
        now_ns: u64,
    },
    /// [`ControllerCore::on_chunk`].
    Chunk {
        /// First timestep of the chunk.
        start_step: u64,
        /// Values per action.
        dim: usize,
        /// The actions, row-major.
        actions: Vec<f32>,
        /// When the controller applied it.
        now_ns: u64,
    },
    /// [`ControllerCore::on_observation`].
    Observation {
        /// The observation's capture time.
        capture_ns: u64,
    },
    /// [`ControllerCore::set_peer_lost`].
    Peer {
        /// Lost (true) or back (false).
        lost: bool,
        /// When the controller applied it.
        now_ns: u64,
    },
}

/// What applying an entry returned.
#[derive(Debug)]
pub enum Applied {
    /// A tick's output.
    Tick(Tick),
    /// A chunk's merge report and inference delay, or why it was refused.
    Chunk(std::result::Result<(InsertReport, Option<u64>), QueueError>),
    /// Nothing to report (observation, peer).
    Nothing,
}

impl Entry {
    /// Make the call on `core`.
    pub fn apply(&self, core: &mut ControllerCore) -> Applied {
        match self {
            Entry::Tick { now_ns } => Applied::Tick(core.tick(*now_ns)),
            Entry::Chunk {
                start_step,
                dim,
                actions,
                now_ns,
            } => Applied::Chunk(core.on_chunk(*start_step, *dim, actions, *now_ns)),
            Entry::Observation { capture_ns } => {
                core.on_observation(*capture_ns);
                Applied::Nothing
            }
            Entry::Peer { lost, now_ns } => {
                core.set_peer_lost(*lost, *now_ns);
                Applied::Nothing
            }
        }
    }

    /// The entry's bytes (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![VERSION];
        match self {
            Entry::Tick { now_ns } => {
                b.push(TICK);
                b.extend(now_ns.to_le_bytes());
            }
            Entry::Chunk {
                start_step,
                dim,
                actions,
                now_ns,
            } => {
                b.reserve(26 + 4 * actions.len());
                b.push(CHUNK);
                b.extend(start_step.to_le_bytes());
                b.extend((*dim as u32).to_le_bytes());
                b.extend((actions.len() as u32).to_le_bytes());
                for v in actions {
                    b.extend(v.to_le_bytes());
                }
                b.extend(now_ns.to_le_bytes());
            }
            Entry::Observation { capture_ns } => {
                b.push(OBSERVATION);
                b.extend(capture_ns.to_le_bytes());
            }
            Entry::Peer { lost, now_ns } => {
                b.push(PEER);
                b.push(u8::from(*lost));
                b.extend(now_ns.to_le_bytes());
            }
        }
        b
    }

    /// Parse an entry; a short, long or unknown one is an error saying
    /// which (nothing is allocated from a count before it is checked
    /// against the bytes there are).
    pub fn decode(bytes: &[u8]) -> Result<Entry> {
        let bad = |msg: String| Error::Journal(msg);
        let mut r = Reader { b: bytes, at: 0 };
        let version = r.u8()?;
        if version != VERSION {
            return Err(bad(format!(
                "journal entry version {version}, this edgeflow reads version {VERSION}"
            )));
        }
        let e = match r.u8()? {
            TICK => Entry::Tick { now_ns: r.u64()? },
            CHUNK => {
                let start_step = r.u64()?;
                let dim = r.u32()? as usize;
                let n = r.u32()? as usize;
                let left = bytes.len() - r.at;
                if left != 4 * n + 8 {
                    return Err(bad(format!(
                        "a chunk entry claims {n} values but holds {left} bytes after its header (expected {})",
                        4usize.saturating_mul(n).saturating_add(8)
                    )));
                }
                let mut actions = Vec::with_capacity(n);
                for _ in 0..n {
                    actions.push(f32::from_bits(r.u32()?));
                }
                Entry::Chunk {
                    start_step,
                    dim,
                    actions,
                    now_ns: r.u64()?,
                }
            }
            OBSERVATION => Entry::Observation {
                capture_ns: r.u64()?,
            },
            PEER => {
                let lost = match r.u8()? {
                    0 => false,
                    1 => true,
                    v => return Err(bad(format!("a peer entry's flag is {v}, expected 0 or 1"))),
                };
                Entry::Peer {
                    lost,
                    now_ns: r.u64()?,
                }
            }
            k => return Err(bad(format!("unknown journal entry kind {k}"))),
        };
        if r.at != bytes.len() {
            return Err(bad(format!(
                "{} bytes after the end of a journal entry",
                bytes.len() - r.at
            )));
        }
        Ok(e)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self
            .b
            .get(self.at..self.at + N)
            .and_then(|s| <[u8; N]>::try_from(s).ok())
            .ok_or_else(|| {
                Error::Journal(format!(
                    "a journal entry ends at byte {} where {N} more were expected",
                    self.b.len()
                ))
            })?;
        self.at += N;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}

/// Every tick a fresh core with `cfg` makes when fed `entries` in order:
/// the controller's commands, recomputed from its journal.
pub fn replay<'a>(
    cfg: crate::core::CoreConfig,
    entries: impl IntoIterator<Item = &'a Entry>,
) -> Vec<Tick> {
    let mut core = ControllerCore::new(cfg);
    entries
        .into_iter()
        .filter_map(|e| match e.apply(&mut core) {
            Applied::Tick(t) => Some(t),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::CoreConfig;

    fn samples() -> Vec<Entry> {
        vec![
            Entry::Observation { capture_ns: 5 },
            Entry::Tick { now_ns: 10 },
            Entry::Chunk {
                start_step: 0,
                dim: 2,
                actions: vec![0.1, -0.2, f32::MIN_POSITIVE, 3.5],
                now_ns: 11,
            },
            Entry::Tick { now_ns: 20_000_010 },
            Entry::Peer {
                lost: true,
                now_ns: 20_000_011,
            },
            Entry::Tick { now_ns: 40_000_010 },
            Entry::Peer {
                lost: false,
                now_ns: 40_000_011,
            },
        ]
    }

    #[test]
    fn entries_round_trip_bit_for_bit() {
        for e in samples() {
            assert_eq!(Entry::decode(&e.encode()).unwrap(), e);
        }
    }

    #[test]
    fn damaged_entries_are_refused_with_the_reason() {
        let chunk = samples()[2].encode();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "ends at byte 0"),
            (vec![2, TICK, 0, 0, 0, 0, 0, 0, 0, 0], "version 2"),
            (vec![1, 9], "unknown journal entry kind 9"),
            (chunk[..chunk.len() - 1].to_vec(), "claims 4 values"),
            ([chunk.clone(), vec![0]].concat(), "claims 4 values"),
            (vec![1, PEER, 7, 0, 0, 0, 0, 0, 0, 0, 0], "flag is 7"),
            (
                [Entry::Tick { now_ns: 1 }.encode(), vec![0]].concat(),
                "1 bytes after the end",
            ),
        ];
        for (bytes, want) in cases {
            let e = Entry::decode(&bytes).unwrap_err().to_string();
            assert!(e.contains(want), "{bytes:?}: {e}");
        }
        // A hostile count: refused before anything is allocated for it.
        let mut hostile = vec![1, CHUNK];
        hostile.extend(0u64.to_le_bytes());
        hostile.extend(2u32.to_le_bytes());
        hostile.extend(u32::MAX.to_le_bytes());
        let e = Entry::decode(&hostile).unwrap_err().to_string();
        assert!(e.contains("claims 4294967295 values"), "{e}");
    }

    #[test]
    fn replay_makes_the_calls_in_order() {
        let cfg = CoreConfig::default();
        let ticks = replay(cfg.clone(), &samples());
        assert_eq!(ticks.len(), 3);
        // The chunk (steps 0 and 1) arrived after step 0's tick: its first
        // action is stale, step 1 runs the second, then the peer loss
        // holds it.
        let second = vec![f32::MIN_POSITIVE, 3.5];
        assert!(ticks[0].command.is_empty());
        assert_eq!(ticks[1].command, second);
        assert_eq!(ticks[2].command, second);
        assert!(ticks[2].safe_started.is_some());
        // The same calls with the chunk before the first tick: step 0 runs
        // its first action. The order is part of the journal.
        let mut swapped = samples();
        swapped.swap(1, 2);
        let other = replay(cfg, &swapped);
        assert_eq!(other[0].command, vec![0.1, -0.2]);
    }
}
