//! The wire format of messages sent over zenoh (version 1). WIRE.md beside
//! this crate documents it byte by byte; `examples/python/edgeflow_wire.py`
//! implements the same layout in Python.
//!
//! Every message is a 48-byte header followed by a kind-specific body, all
//! little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | magic `b"EF"` |
//! | 2 | 1 | format version (this crate writes [`VERSION`]) |
//! | 3 | 1 | kind ([`Kind`]) |
//! | 4 | 4 | flags: bit 0 = a deadline is set; other bits 0 |
//! | 8 | 8 | epoch |
//! | 16 | 8 | sequence number (per publisher) |
//! | 24 | 8 | capture time, ns on the host's `CLOCK_MONOTONIC` |
//! | 32 | 8 | deadline, ns on the same clock (0 when flag bit 0 is clear) |
//! | 40 | 4 | body length in bytes |
//! | 44 | 4 | reserved, 0 |
//!
//! Decoding never panics and never allocates more than the bytes in hand
//! justify: every size a header claims is checked (with overflow-checked
//! arithmetic) against the actual body length before any buffer is made.

use edgeflow_graph::{ActionChunk, AudioChunk, Event, ImageFrame, PixelFormat};
use std::time::Duration;

/// The format version this crate writes and the newest it reads.
pub const VERSION: u8 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 48;
/// The two magic bytes every message starts with.
pub const MAGIC: [u8; 2] = *b"EF";
/// Largest body accepted (256 MiB): a bigger claim is refused before reading.
pub const MAX_BODY: usize = 256 << 20;
/// Most tensor dimensions.
pub const MAX_RANK: usize = 8;
const FLAG_DEADLINE: u32 = 1;

/// What a message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Interleaved f32 audio.
    Audio = 1,
    /// An n-dimensional f32 or i64 tensor.
    Tensor = 2,
    /// A camera frame.
    Image = 3,
    /// A robot state vector (joint / pose values) with its control step.
    RobotState = 4,
    /// A timestep-indexed chunk of actions (also used for commands).
    Actions = 5,
    /// UTF-8 text (e.g. the episode instruction).
    Text = 6,
    /// A control event (tick, named event with JSON value...).
    Event = 7,
}

impl Kind {
    /// From the header byte.
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Audio,
            2 => Kind::Tensor,
            3 => Kind::Image,
            4 => Kind::RobotState,
            5 => Kind::Actions,
            6 => Kind::Text,
            7 => Kind::Event,
            _ => return None,
        })
    }

    /// Parse the name used in YAML `type:` params.
    pub fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "audio" => Kind::Audio,
            "tensor" => Kind::Tensor,
            "image" => Kind::Image,
            "robot_state" | "state" => Kind::RobotState,
            "actions" => Kind::Actions,
            "text" => Kind::Text,
            "control" | "event" => Kind::Event,
            _ => return None,
        })
    }

    /// Name as written in YAML.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Audio => "audio",
            Kind::Tensor => "tensor",
            Kind::Image => "image",
            Kind::RobotState => "robot_state",
            Kind::Actions => "actions",
            Kind::Text => "text",
            Kind::Event => "control",
        }
    }
}

/// Why bytes are not a valid message. Each names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the header or the declared body.
    #[error("truncated: need {need} bytes, got {got}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        got: usize,
    },
    /// The first two bytes are not `EF`: not an edgeflow message.
    #[error("bad magic {0:02x?}: not an edgeflow wire message (expected \"EF\")")]
    BadMagic([u8; 2]),
    /// Written by a newer edgeflow: upgrade the receiver.
    #[error("wire format version {got} is newer than this build reads ({VERSION}); upgrade the receiving side")]
    NewerVersion {
        /// Version in the header.
        got: u8,
    },
    /// Version 0 does not exist.
    #[error("wire format version 0 is invalid")]
    ZeroVersion,
    /// A kind byte this version does not define.
    #[error("unknown kind {0}")]
    UnknownKind(u8),
    /// A valid message of another kind than the receiver expects.
    #[error("expected a {expected} message, got {got}")]
    WrongKind {
        /// What the receiver takes.
        expected: &'static str,
        /// What arrived.
        got: &'static str,
    },
    /// Reserved bits or bytes are not zero.
    #[error("reserved field `{0}` is not zero")]
    Reserved(&'static str),
    /// The header's body length does not match the bytes that follow.
    #[error("body length field says {declared} bytes but {actual} follow the header")]
    LengthMismatch {
        /// Declared.
        declared: usize,
        /// Actual.
        actual: usize,
    },
    /// The body is inconsistent (sizes, dtype, format, UTF-8).
    #[error("{kind} body: {msg}")]
    BadBody {
        /// Kind of the message.
        kind: &'static str,
        /// What is wrong.
        msg: String,
    },
}

/// The metadata every message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Epoch (turn / episode id).
    pub epoch: u64,
    /// Sequence number, per publisher.
    pub seq: u64,
    /// Capture time, ns on `CLOCK_MONOTONIC`.
    pub capture_ns: u64,
    /// Deadline, ns on `CLOCK_MONOTONIC`.
    pub deadline_ns: Option<u64>,
}

/// Tensor element data.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// 32-bit floats (dtype code 1).
    F32(Vec<f32>),
    /// 64-bit integers (dtype code 2).
    I64(Vec<i64>),
}

/// A decoded body.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// Audio.
    Audio(AudioChunk),
    /// Tensor with its dims.
    Tensor {
        /// Dimensions (1..=8 of them).
        dims: Vec<usize>,
        /// `product(dims)` elements.
        data: TensorData,
    },
    /// Image.
    Image(ImageFrame),
    /// Robot state.
    RobotState {
        /// Control step the state was measured at.
        step: u64,
        /// The values.
        values: Vec<f32>,
    },
    /// Actions.
    Actions(ActionChunk),
    /// Text.
    Text(String),
    /// Event.
    Event(Event),
}

impl Body {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Body::Audio(_) => Kind::Audio,
            Body::Tensor { .. } => Kind::Tensor,
            Body::Image(_) => Kind::Image,
            Body::RobotState { .. } => Kind::RobotState,
            Body::Actions(_) => Kind::Actions,
            Body::Text(_) => Kind::Text,
            Body::Event(_) => Kind::Event,
        }
    }
}

/// A whole message.
#[derive(Debug, Clone, PartialEq)]
pub struct WireMessage {
    /// Metadata.
    pub header: Header,
    /// Body.
    pub body: Body,
}

/// Nanoseconds on the host's `CLOCK_MONOTONIC` (the clock of wire timestamps;
/// Python's `time.monotonic_ns()` on Linux).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Convert a wire (CLOCK_MONOTONIC) time to the graph's process clock.
pub fn to_graph_time(ns: u64) -> edgeflow_graph::Timestamp {
    let now_graph = edgeflow_graph::Timestamp::now().0;
    let now_mono = mono_ns();
    edgeflow_graph::Timestamp(now_graph.saturating_sub(now_mono.saturating_sub(ns)))
}

/// Convert a graph timestamp to wire (CLOCK_MONOTONIC) time.
pub fn from_graph_time(t: edgeflow_graph::Timestamp) -> u64 {
    let now_graph = edgeflow_graph::Timestamp::now().0;
    let now_mono = mono_ns();
    now_mono.saturating_sub(now_graph.saturating_sub(t.0))
}

// ---------------------------------------------------------------- encoding

fn put_u16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put_f32s(b: &mut Vec<u8>, v: &[f32]) {
    b.reserve(v.len() * 4);
    for x in v {
        b.extend_from_slice(&x.to_le_bytes());
    }
}

fn len_u32(n: usize, what: &'static str) -> Result<u32, WireError> {
    u32::try_from(n).map_err(|_| WireError::BadBody {
        kind: what,
        msg: format!("{n} does not fit the u32 field"),
    })
}

/// Encode a message. Fails only when a size does not fit its field or the
/// body exceeds [`MAX_BODY`].
pub fn encode(header: &Header, body: &Body) -> Result<Vec<u8>, WireError> {
    let mut b = Vec::with_capacity(HEADER_LEN + 64);
    b.extend_from_slice(&MAGIC);
    b.push(VERSION);
    b.push(body.kind() as u8);
    put_u32(
        &mut b,
        if header.deadline_ns.is_some() {
            FLAG_DEADLINE
        } else {
            0
        },
    );
    put_u64(&mut b, header.epoch);
    put_u64(&mut b, header.seq);
    put_u64(&mut b, header.capture_ns);
    put_u64(&mut b, header.deadline_ns.unwrap_or(0));
    put_u32(&mut b, 0); // body length, patched below
    put_u32(&mut b, 0);
    let kind = body.kind().name();
    match body {
        Body::Audio(a) => {
            if a.channels == 0 || a.sample_rate == 0 {
                return Err(WireError::BadBody {
                    kind,
                    msg: "sample rate and channels must be at least 1".into(),
                });
            }
            put_u32(&mut b, a.sample_rate);
            put_u16(&mut b, a.channels);
            put_u16(&mut b, 0);
            put_f32s(&mut b, &a.samples);
        }
        Body::Tensor { dims, data } => {
            if dims.is_empty() || dims.len() > MAX_RANK {
                return Err(WireError::BadBody {
                    kind,
                    msg: format!("rank {} is outside 1..={MAX_RANK}", dims.len()),
                });
            }
            let n: usize = dims.iter().product();
            let (code, len) = match data {
                TensorData::F32(v) => (1u8, v.len()),
                TensorData::I64(v) => (2u8, v.len()),
            };
            if n != len {
                return Err(WireError::BadBody {
                    kind,
                    msg: format!("dims {dims:?} hold {n} elements but the data has {len}"),
                });
            }
            b.push(code);
            b.push(dims.len() as u8);
            put_u16(&mut b, 0);
            for d in dims {
                put_u32(&mut b, len_u32(*d, kind)?);
            }
            match data {
                TensorData::F32(v) => put_f32s(&mut b, v),
                TensorData::I64(v) => {
                    for x in v {
                        b.extend_from_slice(&x.to_le_bytes());
                    }
                }
            }
        }
        Body::Image(i) => {
            let bpp = bytes_per_pixel(i.format);
            let need = (i.width as usize)
                .checked_mul(i.height as usize)
                .and_then(|p| p.checked_mul(bpp));
            if need != Some(i.data.len()) {
                return Err(WireError::BadBody {
                    kind,
                    msg: format!(
                        "{}x{} {:?} needs {:?} bytes, the frame has {}",
                        i.width,
                        i.height,
                        i.format,
                        need,
                        i.data.len()
                    ),
                });
            }
            put_u32(&mut b, i.width);
            put_u32(&mut b, i.height);
            b.push(format_code(i.format));
            b.extend_from_slice(&[0, 0, 0]);
            b.extend_from_slice(&i.data);
        }
        Body::RobotState { step, values } => {
            put_u32(&mut b, len_u32(values.len(), kind)?);
            put_u32(&mut b, 0);
            put_u64(&mut b, *step);
            put_f32s(&mut b, values);
        }
        Body::Actions(a) => {
            if a.dim == 0 || a.actions.len() % a.dim != 0 {
                return Err(WireError::BadBody {
                    kind,
                    msg: format!(
                        "{} values are not a whole number of {}-dim actions",
                        a.actions.len(),
                        a.dim
                    ),
                });
            }
            put_u64(&mut b, a.start_step);
            put_u64(&mut b, u64::try_from(a.dt.as_nanos()).unwrap_or(u64::MAX));
            put_u32(&mut b, len_u32(a.actions.len() / a.dim, kind)?);
            put_u32(&mut b, len_u32(a.dim, kind)?);
            put_f32s(&mut b, &a.actions);
        }
        Body::Text(t) => b.extend_from_slice(t.as_bytes()),
        Body::Event(e) => match e {
            Event::Tick { index, due } => {
                b.extend_from_slice(&[1, 0, 0, 0]);
                put_u64(&mut b, *index);
                put_u64(&mut b, from_graph_time(*due));
            }
            Event::SpeechStart => b.extend_from_slice(&[2, 0, 0, 0]),
            Event::SpeechEnd => b.extend_from_slice(&[3, 0, 0, 0]),
            Event::Flush => b.extend_from_slice(&[4, 0, 0, 0]),
            Event::Named(name, value) => {
                b.extend_from_slice(&[5, 0, 0, 0]);
                put_u32(&mut b, len_u32(name.len(), kind)?);
                b.extend_from_slice(name.as_bytes());
                if !value.is_null() {
                    b.extend_from_slice(value.to_string().as_bytes());
                }
            }
        },
    }
    let body_len = b.len() - HEADER_LEN;
    if body_len > MAX_BODY {
        return Err(WireError::BadBody {
            kind,
            msg: format!("{body_len} bytes exceed the {MAX_BODY}-byte limit"),
        });
    }
    b[40..44].copy_from_slice(&(body_len as u32).to_le_bytes());
    Ok(b)
}

fn bytes_per_pixel(f: PixelFormat) -> usize {
    match f {
        PixelFormat::Rgb8 => 3,
        PixelFormat::Rgba8 => 4,
        PixelFormat::Gray8 => 1,
    }
}

fn format_code(f: PixelFormat) -> u8 {
    match f {
        PixelFormat::Rgb8 => 1,
        PixelFormat::Rgba8 => 2,
        PixelFormat::Gray8 => 3,
    }
}

// ---------------------------------------------------------------- decoding

/// A bounds-checked little-endian reader.
struct Reader<'a> {
    b: &'a [u8],
    kind: &'static str,
}

impl<'a> Reader<'a> {
    fn bad(&self, msg: impl Into<String>) -> WireError {
        WireError::BadBody {
            kind: self.kind,
            msg: msg.into(),
        }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], WireError> {
        if self.b.len() < n {
            return Err(self.bad(format!(
                "ends inside `{what}` (needs {n} more bytes, {} left)",
                self.b.len()
            )));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self, what: &str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, WireError> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, WireError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, WireError> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn zero(&mut self, n: usize, what: &'static str) -> Result<(), WireError> {
        if self.take(n, what)?.iter().any(|&x| x != 0) {
            return Err(WireError::Reserved(what));
        }
        Ok(())
    }
    /// The rest must be exactly `count` elements of `size` bytes; checked
    /// before anything is allocated.
    fn exact(
        &mut self,
        count: Option<usize>,
        size: usize,
        what: &str,
    ) -> Result<&'a [u8], WireError> {
        let need = count.and_then(|c| c.checked_mul(size));
        match need {
            Some(n) if n == self.b.len() => self.take(n, what),
            _ => Err(self.bad(format!(
                "`{what}` needs {} bytes but {} remain",
                need.map_or_else(|| "an overflowing number of".to_string(), |n| n.to_string()),
                self.b.len()
            ))),
        }
    }
    fn finish(&self) -> Result<(), WireError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(self.bad(format!("{} trailing bytes", self.b.len())))
        }
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Decode a header only (cheap; used to reject early).
pub fn decode_header(bytes: &[u8]) -> Result<(Header, Kind, usize), WireError> {
    if bytes.len() < HEADER_LEN {
        // Check what can be checked so random short input gets the best message.
        if bytes.len() >= 2 && bytes[..2] != MAGIC {
            return Err(WireError::BadMagic([bytes[0], bytes[1]]));
        }
        return Err(WireError::Truncated {
            need: HEADER_LEN,
            got: bytes.len(),
        });
    }
    let mut r = Reader {
        b: &bytes[..HEADER_LEN],
        kind: "header",
    };
    let magic = r.take(2, "magic")?;
    if magic != MAGIC {
        return Err(WireError::BadMagic([magic[0], magic[1]]));
    }
    let version = r.u8("version")?;
    if version == 0 {
        return Err(WireError::ZeroVersion);
    }
    if version > VERSION {
        return Err(WireError::NewerVersion { got: version });
    }
    let kb = r.u8("kind")?;
    let kind = Kind::from_u8(kb).ok_or(WireError::UnknownKind(kb))?;
    let flags = r.u32("flags")?;
    if flags & !FLAG_DEADLINE != 0 {
        return Err(WireError::Reserved("flags"));
    }
    let epoch = r.u64("epoch")?;
    let seq = r.u64("seq")?;
    let capture_ns = r.u64("capture")?;
    let deadline = r.u64("deadline")?;
    if flags & FLAG_DEADLINE == 0 && deadline != 0 {
        return Err(WireError::Reserved("deadline (flag bit 0 is clear)"));
    }
    let body_len = r.u32("body length")? as usize;
    r.zero(4, "header reserved")?;
    if body_len > MAX_BODY {
        return Err(WireError::BadBody {
            kind: kind.name(),
            msg: format!("declared length {body_len} exceeds the {MAX_BODY}-byte limit"),
        });
    }
    let actual = bytes.len() - HEADER_LEN;
    if body_len != actual {
        return Err(WireError::LengthMismatch {
            declared: body_len,
            actual,
        });
    }
    Ok((
        Header {
            epoch,
            seq,
            capture_ns,
            deadline_ns: (flags & FLAG_DEADLINE != 0).then_some(deadline),
        },
        kind,
        body_len,
    ))
}

/// Decode a message of any kind.
pub fn decode(bytes: &[u8]) -> Result<WireMessage, WireError> {
    let (header, kind, _) = decode_header(bytes)?;
    let mut r = Reader {
        b: &bytes[HEADER_LEN..],
        kind: kind.name(),
    };
    let body = match kind {
        Kind::Audio => {
            let sample_rate = r.u32("sample_rate")?;
            let channels = r.u16("channels")?;
            r.zero(2, "audio reserved")?;
            if sample_rate == 0 || channels == 0 {
                return Err(r.bad("sample rate and channels must be at least 1"));
            }
            if !r.b.len().is_multiple_of(4 * channels as usize) {
                return Err(r.bad(format!(
                    "{} sample bytes are not whole frames of {channels} f32 samples",
                    r.b.len()
                )));
            }
            let n = r.b.len() / 4;
            let s = r.exact(Some(n), 4, "samples")?;
            Body::Audio(AudioChunk {
                sample_rate,
                channels,
                samples: f32s(s),
            })
        }
        Kind::Tensor => {
            let dtype = r.u8("dtype")?;
            let rank = r.u8("rank")? as usize;
            r.zero(2, "tensor reserved")?;
            let size = match dtype {
                1 => 4,
                2 => 8,
                d => return Err(r.bad(format!("dtype code {d} is not f32 (1) or i64 (2)"))),
            };
            if rank == 0 || rank > MAX_RANK {
                return Err(r.bad(format!("rank {rank} is outside 1..={MAX_RANK}")));
            }
            let mut dims = [0usize; MAX_RANK];
            for d in dims.iter_mut().take(rank) {
                *d = r.u32("dims")? as usize;
            }
            let dims = &dims[..rank];
            let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let s = r.exact(n, size, "tensor data")?;
            let data = if dtype == 1 {
                TensorData::F32(f32s(s))
            } else {
                TensorData::I64(
                    s.chunks_exact(8)
                        .map(|c| {
                            let mut a = [0u8; 8];
                            a.copy_from_slice(c);
                            i64::from_le_bytes(a)
                        })
                        .collect(),
                )
            };
            Body::Tensor {
                dims: dims.to_vec(),
                data,
            }
        }
        Kind::Image => {
            let width = r.u32("width")?;
            let height = r.u32("height")?;
            let format = match r.u8("format")? {
                1 => PixelFormat::Rgb8,
                2 => PixelFormat::Rgba8,
                3 => PixelFormat::Gray8,
                f => {
                    return Err(r.bad(format!(
                        "pixel format {f} is not rgb8 (1), rgba8 (2) or gray8 (3)"
                    )))
                }
            };
            r.zero(3, "image reserved")?;
            let px = (width as usize).checked_mul(height as usize);
            let s = r.exact(px, bytes_per_pixel(format), "pixels")?;
            Body::Image(ImageFrame {
                width,
                height,
                format,
                data: s.to_vec(),
            })
        }
        Kind::RobotState => {
            let dim = r.u32("dim")? as usize;
            r.zero(4, "state reserved")?;
            let step = r.u64("step")?;
            let s = r.exact(Some(dim), 4, "state values")?;
            Body::RobotState {
                step,
                values: f32s(s),
            }
        }
        Kind::Actions => {
            let start_step = r.u64("start_step")?;
            let dt = Duration::from_nanos(r.u64("dt_ns")?);
            let steps = r.u32("steps")? as usize;
            let dim = r.u32("dim")? as usize;
            if dim == 0 {
                return Err(r.bad("action dim 0"));
            }
            let s = r.exact(steps.checked_mul(dim), 4, "action values")?;
            Body::Actions(ActionChunk {
                start_step,
                dt,
                dim,
                actions: f32s(s),
            })
        }
        Kind::Text => {
            let s = std::str::from_utf8(r.b).map_err(|e| r.bad(format!("not UTF-8 ({e})")))?;
            r.b = &[];
            Body::Text(s.to_string())
        }
        Kind::Event => {
            let tag = r.u8("event tag")?;
            r.zero(3, "event reserved")?;
            let e = match tag {
                1 => Event::Tick {
                    index: r.u64("tick index")?,
                    due: to_graph_time(r.u64("tick due")?),
                },
                2 => Event::SpeechStart,
                3 => Event::SpeechEnd,
                4 => Event::Flush,
                5 => {
                    let n = r.u32("name length")? as usize;
                    let name = r.take(n, "name")?;
                    let name = std::str::from_utf8(name)
                        .map_err(|e| r.bad(format!("event name is not UTF-8 ({e})")))?
                        .to_string();
                    let value = if r.b.is_empty() {
                        serde_json::Value::Null
                    } else {
                        serde_json::from_slice(r.b)
                            .map_err(|e| r.bad(format!("event `{name}` value is not JSON ({e})")))?
                    };
                    r.b = &[];
                    Event::Named(name, value)
                }
                t => return Err(r.bad(format!("event tag {t} is not 1..=5"))),
            };
            Body::Event(e)
        }
    };
    r.finish()?;
    Ok(WireMessage { header, body })
}

/// Decode, requiring kind `expected`.
pub fn decode_kind(bytes: &[u8], expected: Kind) -> Result<WireMessage, WireError> {
    let (_, kind, _) = decode_header(bytes)?;
    if kind != expected {
        return Err(WireError::WrongKind {
            expected: expected.name(),
            got: kind.name(),
        });
    }
    decode(bytes)
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
