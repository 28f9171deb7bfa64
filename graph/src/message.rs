//! Messages that travel along edges, and their payloads.
//!
//! Big payloads sit behind `Arc`, so fan-out and every hop share the data:
//! a 4 MB tensor costs the same to send as a 4-byte one.

use edgeflow_runtime::Tensor;
use std::fmt;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A turn / stream id. Cancelling an epoch drops its messages everywhere and
/// resets every stage, leaving other epochs untouched.
pub type Epoch = u64;

/// Monotonic nanoseconds since the process's clock origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub u64);

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl Timestamp {
    /// Now, on the process-wide monotonic clock.
    pub fn now() -> Self {
        Timestamp(origin().elapsed().as_nanos() as u64)
    }

    /// Convert an `Instant` to this clock.
    pub fn from_instant(t: Instant) -> Self {
        Timestamp(t.saturating_duration_since(origin()).as_nanos() as u64)
    }

    /// Time elapsed since this timestamp (zero if in the future).
    pub fn elapsed(self) -> Duration {
        Duration::from_nanos(Self::now().0.saturating_sub(self.0))
    }

    /// `self + d`.
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(d.as_nanos() as u64))
    }
}

/// Interleaved f32 audio with its format.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioChunk {
    /// Samples per second.
    pub sample_rate: u32,
    /// Interleaved channels.
    pub channels: u16,
    /// `frames * channels` samples, interleaved, nominally in [-1, 1].
    pub samples: Vec<f32>,
}

impl AudioChunk {
    /// Frames (samples per channel).
    pub fn frames(&self) -> usize {
        self.samples.len() / self.channels.max(1) as usize
    }

    /// Duration of the chunk.
    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.frames() as f64 / self.sample_rate.max(1) as f64)
    }
}

/// Pixel layout of an [`ImageFrame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixelFormat {
    /// 8-bit RGB.
    Rgb8,
    /// 8-bit RGBA.
    Rgba8,
    /// 8-bit grey.
    Gray8,
}

/// One camera frame.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageFrame {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Pixel layout.
    pub format: PixelFormat,
    /// Row-major pixel bytes.
    pub data: Vec<u8>,
}

/// A timestep-indexed chunk of robot actions.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionChunk {
    /// Control step of the first action.
    pub start_step: u64,
    /// Time between actions.
    pub dt: Duration,
    /// Action dimension.
    pub dim: usize,
    /// `steps * dim` values, row-major.
    pub actions: Vec<f32>,
}

/// Control-lane and event payloads (not cancellation: that has its own lane).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A timer tick: its index and when it was due.
    Tick {
        /// Tick number from 0.
        index: u64,
        /// When it was scheduled.
        due: Timestamp,
    },
    /// Voice activity started.
    SpeechStart,
    /// Voice activity ended.
    SpeechEnd,
    /// The end of a unit of work (a sentence, a turn) for stages that batch.
    Flush,
    /// Anything else, by name, with an optional JSON value.
    Named(String, serde_json::Value),
}

/// The data a [`Message`] carries.
#[derive(Clone)]
pub enum Payload {
    /// Audio samples.
    Audio(Arc<AudioChunk>),
    /// UTF-8 text.
    Text(Arc<str>),
    /// Token ids.
    Tokens(Arc<[u32]>),
    /// A runtime tensor (already shared by `Arc` inside).
    Tensor(Tensor),
    /// An image frame.
    Image(Arc<ImageFrame>),
    /// Robot action chunk.
    Actions(Arc<ActionChunk>),
    /// An event.
    Event(Arc<Event>),
}

impl Payload {
    /// Short type name, as used by [`crate::PortType`].
    pub fn type_name(&self) -> &'static str {
        match self {
            Payload::Audio(_) => "audio",
            Payload::Text(_) => "text",
            Payload::Tokens(_) => "tokens",
            Payload::Tensor(_) => "tensor",
            Payload::Image(_) => "image",
            Payload::Actions(_) => "actions",
            Payload::Event(_) => "control",
        }
    }

    /// Convenience: text payload.
    pub fn text(s: impl AsRef<str>) -> Self {
        Payload::Text(Arc::from(s.as_ref()))
    }

    /// Convenience: audio payload.
    pub fn audio(sample_rate: u32, channels: u16, samples: Vec<f32>) -> Self {
        Payload::Audio(Arc::new(AudioChunk {
            sample_rate,
            channels,
            samples,
        }))
    }

    /// Convenience: event payload.
    pub fn event(e: Event) -> Self {
        Payload::Event(Arc::new(e))
    }

    /// The text, if this is a text payload.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Payload::Text(t) => Some(t),
            _ => None,
        }
    }

    /// The audio, if this is an audio payload.
    pub fn as_audio(&self) -> Option<&AudioChunk> {
        match self {
            Payload::Audio(a) => Some(a),
            _ => None,
        }
    }

    /// The event, if this is an event payload.
    pub fn as_event(&self) -> Option<&Event> {
        match self {
            Payload::Event(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Payload::Audio(a) => write!(
                f,
                "Audio({} frames @ {} Hz x{})",
                a.frames(),
                a.sample_rate,
                a.channels
            ),
            Payload::Text(t) => write!(f, "Text({t:?})"),
            Payload::Tokens(t) => write!(f, "Tokens({} ids)", t.len()),
            Payload::Tensor(t) => write!(f, "Tensor({:?} {})", t.dims(), t.dtype()),
            Payload::Image(i) => write!(f, "Image({}x{} {:?})", i.width, i.height, i.format),
            Payload::Actions(a) => write!(f, "Actions(step {}, dim {})", a.start_step, a.dim),
            Payload::Event(e) => write!(f, "Event({e:?})"),
        }
    }
}

/// What travels on an edge: a payload and its metadata.
#[derive(Debug, Clone)]
pub struct Message {
    /// Turn / stream id; cancellation works per epoch.
    pub epoch: Epoch,
    /// Sequence number, per producing port.
    pub seq: u64,
    /// Capture time of the data this derives from (sources stamp it; stages
    /// pass the input's on), used for end-to-end latency and `max_age`.
    pub timestamp: Timestamp,
    /// Optional deadline; a stage that sees it passed counts a miss.
    pub deadline: Option<Timestamp>,
    /// The data.
    pub payload: Payload,
}

impl Message {
    /// A message stamped now, in `epoch`.
    pub fn new(epoch: Epoch, payload: Payload) -> Self {
        Message {
            epoch,
            seq: 0,
            timestamp: Timestamp::now(),
            deadline: None,
            payload,
        }
    }
}

impl Message {
    /// A cheap empty message (used to move a message out of a slot).
    pub(crate) fn placeholder() -> Self {
        Message {
            epoch: 0,
            seq: 0,
            timestamp: Timestamp(0),
            deadline: None,
            payload: Payload::Text(Arc::from("")),
        }
    }
}
