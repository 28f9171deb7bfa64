//! Writing a recording: an [`EdgeTap`] that hands every sent message to a
//! writer thread, which encodes it in the wire format and appends it to the
//! MCAP file.
//!
//! The tap only clones the message (payloads are shared, so that is a few
//! reference counts) and pushes it onto a bounded queue; a full queue drops
//! the message from the recording and counts it, so a slow disk never slows
//! the pipeline. The writer closes a chunk at least every
//! [`RecordOptions::flush_every`], so a crash loses at most that much: the
//! file then has no summary or footer but every complete chunk is readable
//! (`edgeflow inspect --partial`). A normal end, an interrupt or a pipeline
//! error all go through [`Recorder::finish`], which writes the summary and
//! footer.

use crate::error::{Error, Result};
use crate::format::{self, keys, EdgeName};
use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use edgeflow_control::wire;
use edgeflow_control::zenoh_io::payload_to_body;
use edgeflow_graph::{EdgeTap, Message, Plan, Timestamp};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How much to record and how often to make it durable.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    /// Size of one file, bytes: past it the recorder rotates or stops.
    pub max_bytes: u64,
    /// How many more files to rotate into (`run.1.mcap`, `run.2.mcap`...)
    /// before stopping; 0 stops at the first limit. The disk use is bounded
    /// by `(rotate + 1) * max_bytes` either way.
    pub rotate: u32,
    /// Longest time a written message waits in memory before its chunk is
    /// closed and flushed to the file (what a crash can lose).
    pub flush_every: Duration,
    /// Messages the queue between tap and writer holds; when it is full,
    /// messages are left out of the recording and counted.
    pub queue: usize,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            max_bytes: 1 << 30,
            rotate: 0,
            flush_every: Duration::from_secs(1),
            queue: 1 << 16,
        }
    }
}

/// What the recording is of.
#[derive(Debug, Clone, Default)]
pub struct RunInfo {
    /// The pipeline file's text (stored in the recording, replayed from it).
    pub pipeline_text: String,
    /// The pipeline file's path as given.
    pub file: Option<String>,
    /// `--set` overrides as written (replay applies them again).
    pub overrides: Vec<String>,
}

/// What a finished recording holds.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RecordStats {
    /// Messages written.
    pub messages: u64,
    /// Journal entries written (stages' journals, e.g. the controller's).
    pub journal_entries: u64,
    /// Approximate bytes written, all files.
    pub bytes: u64,
    /// Messages left out because the writer fell behind (queue full).
    pub dropped_queue_full: u64,
    /// Messages left out after the size limit stopped the recording.
    pub dropped_after_limit: u64,
    /// Messages whose payload could not be encoded (logged).
    pub encode_errors: u64,
    /// True when the size limit stopped the recording early.
    pub stopped_at_limit: bool,
    /// Every file written, in order.
    pub files: Vec<PathBuf>,
}

impl RecordStats {
    /// Warnings a user must see (empty when everything was recorded).
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.stopped_at_limit {
            w.push(format!(
                "recording stopped at the size limit: {} later messages were not recorded (raise --record-max-mb or use --record-rotate)",
                self.dropped_after_limit
            ));
        }
        if self.dropped_queue_full > 0 {
            w.push(format!(
                "{} messages were not recorded because the writer fell behind (a slow disk?)",
                self.dropped_queue_full
            ));
        }
        if self.encode_errors > 0 {
            w.push(format!(
                "{} messages could not be encoded and were left out (see the log)",
                self.encode_errors
            ));
        }
        w
    }
}

/// How long the writer sleeps when its queue is empty (the queue holds
/// [`RecordOptions::queue`] messages, 65536 by default: 2 ms of a 30 M
/// messages/s pipeline).
const IDLE_POLL: Duration = Duration::from_millis(2);

enum Item {
    Msg(usize, Message, Timestamp),
    Journal(Arc<str>, Vec<u8>, Timestamp),
    End,
}

/// The pipeline's side: cheap, never blocks.
struct Tap {
    tx: Sender<Item>,
    dropped_full: AtomicU64,
    dropped_after: AtomicU64,
    off: AtomicBool,
}

impl Tap {
    fn push(&self, item: Item) {
        if self.off.load(Ordering::Relaxed) {
            self.dropped_after.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.tx.try_send(item) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped_full.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {
                self.dropped_after.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl EdgeTap for Tap {
    fn on_message(&self, edge: usize, msg: &Message, at: Timestamp) {
        self.push(Item::Msg(edge, msg.clone(), at));
    }

    fn on_journal(&self, stage: &str, entry: &[u8], at: Timestamp) {
        self.push(Item::Journal(Arc::from(stage), entry.to_vec(), at));
    }

    fn wants_journal(&self) -> bool {
        true
    }
}

/// Records every edge of a running pipeline into an MCAP file.
///
/// ```no_run
/// # use edgeflow_graph::{Pipeline, Registry};
/// # use edgeflow_record::{Recorder, RecordOptions, RunInfo};
/// let yaml = "stages:\n  - { id: t, kind: timer, params: { count: 3 } }\n  - { id: s, kind: discard }\nedges:\n  - { from: t, to: s }\n";
/// let p = Pipeline::from_yaml(yaml, &Registry::builtin()).unwrap();
/// let info = RunInfo { pipeline_text: yaml.into(), ..Default::default() };
/// let rec = Recorder::create("run.mcap".as_ref(), p.plan(), info, RecordOptions::default()).unwrap();
/// let (_metrics, result) = p.start_with_tap(rec.tap()).unwrap().finish(None);
/// let stats = rec.finish().unwrap();
/// result.unwrap();
/// ```
pub struct Recorder {
    tap: Arc<Tap>,
    thread: Option<JoinHandle<Result<RecordStats>>>,
    path: PathBuf,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("path", &self.path)
            .finish()
    }
}

impl Recorder {
    /// Create the file (errors now, not mid-run) and start the writer.
    pub fn create(path: &Path, plan: &Plan, run: RunInfo, opts: RecordOptions) -> Result<Self> {
        let started_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let ctx = Context {
            base: path.to_path_buf(),
            edges: format::edge_names(plan),
            run_meta: run_metadata(plan, &run, started_unix),
            params: format::params_metadata(plan),
            pipeline_text: run.pipeline_text,
            wall_offset: started_unix.saturating_sub(Timestamp::now().0),
            opts: opts.clone(),
        };
        let first = Sink::open(&ctx, 0)?;
        let (tx, rx) = crossbeam_channel::bounded(opts.queue.max(1));
        let tap = Arc::new(Tap {
            tx,
            dropped_full: AtomicU64::new(0),
            dropped_after: AtomicU64::new(0),
            off: AtomicBool::new(false),
        });
        let tap2 = tap.clone();
        let thread = std::thread::Builder::new()
            .name("ef-recorder".into())
            .spawn(move || write_loop(ctx, first, rx, &tap2))
            .map_err(|e| Error::Io {
                path: path.to_path_buf(),
                error: e,
            })?;
        Ok(Recorder {
            tap,
            thread: Some(thread),
            path: path.to_path_buf(),
        })
    }

    /// The tap to install with `Pipeline::start_with_tap`.
    pub fn tap(&self) -> Arc<dyn EdgeTap> {
        self.tap.clone()
    }

    /// Write what is queued, the summary and the footer; close the file.
    pub fn finish(mut self) -> Result<RecordStats> {
        self.end()
    }

    fn end(&mut self) -> Result<RecordStats> {
        let Some(t) = self.thread.take() else {
            return Ok(RecordStats::default());
        };
        // The writer may have stopped (limit, error): then nobody receives.
        let _ = self.tap.tx.send(Item::End);
        match t.join() {
            Ok(r) => r,
            Err(_) => Err(Error::Write {
                path: self.path.clone(),
                msg: "the writer thread panicked".into(),
            }),
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Err(e) = self.end() {
            eprintln!("edgeflow: recording {}: {e}", self.path.display());
        }
    }
}

fn run_metadata(plan: &Plan, run: &RunInfo, started_unix: u64) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert(keys::PIPELINE.into(), plan.name.clone());
    m.insert(
        keys::PIPELINE_SHA256.into(),
        format::pipeline_hash(&run.pipeline_text),
    );
    m.insert(
        keys::EDGEFLOW_VERSION.into(),
        format::EDGEFLOW_VERSION.into(),
    );
    m.insert(keys::RECORD_FORMAT.into(), format::RECORD_FORMAT.into());
    m.insert(keys::FILE.into(), run.file.clone().unwrap_or_default());
    m.insert(
        keys::OVERRIDES.into(),
        serde_json::Value::from(run.overrides.clone()).to_string(),
    );
    m.insert(keys::STARTED_UNIX_NS.into(), started_unix.to_string());
    m
}

/// Everything the writer thread needs to open a file.
struct Context {
    base: PathBuf,
    edges: Vec<EdgeName>,
    run_meta: BTreeMap<String, String>,
    params: BTreeMap<String, String>,
    pipeline_text: String,
    /// Unix ns minus engine-clock ns.
    wall_offset: u64,
    opts: RecordOptions,
}

impl Context {
    /// `run.mcap` for part 0, `run.1.mcap`, `run.2.mcap`... after.
    fn part_path(&self, part: u32) -> PathBuf {
        if part == 0 {
            return self.base.clone();
        }
        let stem = self
            .base
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "recording".into());
        let ext = self
            .base
            .extension()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "mcap".into());
        self.base.with_file_name(format!("{stem}.{part}.{ext}"))
    }
}

/// One open file.
struct Sink {
    path: PathBuf,
    w: mcap::Writer<BufWriter<File>>,
    channels: Vec<u16>,
    /// Journal channels, by stage id, added at a stage's first entry.
    journals: BTreeMap<Arc<str>, u16>,
    journal_schema: u16,
    bytes: u64,
    unflushed: u64,
}

fn mcap_err(path: &Path, e: mcap::McapError) -> Error {
    Error::Write {
        path: path.to_path_buf(),
        msg: e.to_string(),
    }
}

impl Sink {
    fn open(ctx: &Context, part: u32) -> Result<Sink> {
        let path = ctx.part_path(part);
        let file = File::create(&path).map_err(|error| Error::Io {
            path: path.clone(),
            error,
        })?;
        let e = |err| mcap_err(&path, err);
        let mut w = mcap::WriteOptions::new()
            .profile(format::PROFILE)
            .library(format!("edgeflow-record {}", format::EDGEFLOW_VERSION))
            .compression(None)
            .chunk_size(Some(1 << 20))
            .create(BufWriter::new(file))
            .map_err(e)?;
        let schema = w
            .add_schema(
                format::SCHEMA_NAME,
                format::SCHEMA_ENCODING,
                format::SCHEMA_TEXT.as_bytes(),
            )
            .map_err(e)?;
        let journal_schema = w
            .add_schema(
                format::JOURNAL_SCHEMA_NAME,
                format::SCHEMA_ENCODING,
                format::JOURNAL_SCHEMA_TEXT.as_bytes(),
            )
            .map_err(e)?;
        let mut channels = Vec::with_capacity(ctx.edges.len());
        for (i, edge) in ctx.edges.iter().enumerate() {
            channels.push(
                w.add_channel(
                    schema,
                    &edge.topic(),
                    format::MESSAGE_ENCODING,
                    &edge.metadata(i),
                )
                .map_err(e)?,
            );
        }
        let mut run = ctx.run_meta.clone();
        run.insert(keys::PART.into(), part.to_string());
        w.write_metadata(&mcap::records::Metadata {
            name: format::META_RUN.into(),
            metadata: run,
        })
        .map_err(e)?;
        w.write_metadata(&mcap::records::Metadata {
            name: format::META_PARAMS.into(),
            metadata: ctx.params.clone(),
        })
        .map_err(e)?;
        let now = ctx.wall_offset.saturating_add(Timestamp::now().0);
        w.attach(&mcap::Attachment {
            log_time: now,
            create_time: now,
            name: format::ATTACH_PIPELINE.into(),
            media_type: "application/yaml".into(),
            data: std::borrow::Cow::Borrowed(ctx.pipeline_text.as_bytes()),
        })
        .map_err(e)?;
        w.flush().map_err(e)?;
        let bytes = 1024 + ctx.pipeline_text.len() as u64 + 256 * ctx.edges.len() as u64;
        Ok(Sink {
            path,
            w,
            channels,
            journals: BTreeMap::new(),
            journal_schema,
            bytes,
            unflushed: 0,
        })
    }

    /// The journal channel of `stage`, added on first use.
    fn journal_channel(&mut self, stage: &Arc<str>) -> std::result::Result<u16, mcap::McapError> {
        if let Some(&c) = self.journals.get(stage) {
            return Ok(c);
        }
        let meta = BTreeMap::from([("stage".to_string(), stage.to_string())]);
        let c = self.w.add_channel(
            self.journal_schema,
            &format::journal_topic(stage),
            format::JOURNAL_ENCODING,
            &meta,
        )?;
        self.journals.insert(stage.clone(), c);
        self.bytes += 256;
        Ok(c)
    }

    /// Write the end record, the summary and the footer.
    fn close(mut self, stats: &RecordStats) -> Result<u64> {
        let end: BTreeMap<String, String> = [
            ("messages", stats.messages.to_string()),
            ("journal_entries", stats.journal_entries.to_string()),
            ("dropped_queue_full", stats.dropped_queue_full.to_string()),
            ("dropped_after_limit", stats.dropped_after_limit.to_string()),
            ("stopped_at_limit", stats.stopped_at_limit.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let path = self.path.clone();
        self.w
            .write_metadata(&mcap::records::Metadata {
                name: format::META_END.into(),
                metadata: end,
            })
            .map_err(|e| mcap_err(&path, e))?;
        self.w.finish().map_err(|e| mcap_err(&path, e))?;
        Ok(self.bytes)
    }
}

/// Encode one message in the wire format.
fn encode(msg: &Message) -> std::result::Result<Vec<u8>, String> {
    let header = wire::Header {
        epoch: msg.epoch,
        seq: msg.seq,
        capture_ns: wire::from_graph_time(msg.timestamp),
        deadline_ns: msg.deadline.map(wire::from_graph_time),
    };
    let body = payload_to_body(&msg.payload, None, msg.seq).map_err(|e| e.to_string())?;
    wire::encode(&header, &body).map_err(|e| e.to_string())
}

fn write_loop(ctx: Context, first: Sink, rx: Receiver<Item>, tap: &Tap) -> Result<RecordStats> {
    let mut stats = RecordStats::default();
    let mut sink = Some(first);
    let mut part = 0u32;
    let mut last_flush = Instant::now();
    let mut failure: Option<Error> = None;
    // Already queued when the limit stopped the recording.
    let mut queued_after_limit = 0u64;
    loop {
        // Poll rather than block: a receiver parked in `recv` makes every
        // send a futex wake (a system call on the producer's thread, about
        // the cost of a whole hop); polling keeps the tap to a queue push.
        let item = match rx.try_recv() {
            Ok(i) => Some(i),
            Err(TryRecvError::Empty) => {
                std::thread::sleep(IDLE_POLL);
                None
            }
            Err(TryRecvError::Disconnected) => break,
        };
        match item {
            Some(Item::End) => break,
            Some(item @ (Item::Msg(..) | Item::Journal(..))) => {
                let Some(s) = sink.as_mut() else {
                    queued_after_limit += 1;
                    continue;
                };
                let journal = matches!(item, Item::Journal(..));
                let (header, data) = match item {
                    Item::Msg(edge, msg, at) => {
                        let data = match encode(&msg) {
                            Ok(d) => d,
                            Err(e) => {
                                stats.encode_errors += 1;
                                if stats.encode_errors <= 10 {
                                    eprintln!(
                                        "edgeflow: recording: a message on {} could not be encoded: {e}",
                                        ctx.edges.get(edge).map(|e| e.topic()).unwrap_or_default()
                                    );
                                }
                                continue;
                            }
                        };
                        let Some(&channel_id) = s.channels.get(edge) else {
                            continue;
                        };
                        let header = mcap::records::MessageHeader {
                            channel_id,
                            // MCAP's field is 32-bit; the full seq is in the payload.
                            sequence: msg.seq as u32,
                            log_time: ctx.wall_offset.saturating_add(at.0),
                            publish_time: ctx.wall_offset.saturating_add(msg.timestamp.0),
                        };
                        (header, data)
                    }
                    Item::Journal(stage, data, at) => {
                        let channel_id = match s.journal_channel(&stage) {
                            Ok(c) => c,
                            Err(e) => {
                                failure = Some(mcap_err(&s.path, e));
                                tap.off.store(true, Ordering::Relaxed);
                                break;
                            }
                        };
                        let t = ctx.wall_offset.saturating_add(at.0);
                        let header = mcap::records::MessageHeader {
                            channel_id,
                            sequence: (stats.journal_entries + 1) as u32,
                            log_time: t,
                            publish_time: t,
                        };
                        (header, data)
                    }
                    Item::End => break,
                };
                if let Err(e) = s.w.write_to_known_channel(&header, &data) {
                    failure = Some(mcap_err(&s.path, e));
                    tap.off.store(true, Ordering::Relaxed);
                    break;
                }
                if journal {
                    stats.journal_entries += 1;
                } else {
                    stats.messages += 1;
                }
                // Record header (9) + message header (22) + data.
                s.bytes += 31 + data.len() as u64;
                s.unflushed += 1;
                if s.bytes >= ctx.opts.max_bytes {
                    let rotate = part < ctx.opts.rotate;
                    if !rotate {
                        // Said in the file's end record too.
                        stats.stopped_at_limit = true;
                        tap.off.store(true, Ordering::Relaxed);
                    }
                    if let Some(full) = sink.take() {
                        let path = full.path.clone();
                        match full.close(&stats) {
                            Ok(b) => {
                                stats.bytes += b;
                                stats.files.push(path.clone());
                            }
                            Err(e) => {
                                failure = Some(e);
                                tap.off.store(true, Ordering::Relaxed);
                                break;
                            }
                        }
                        if !rotate {
                            eprintln!(
                                "edgeflow: warning: recording stopped: {} reached the size limit ({:.2} MB); the pipeline goes on unrecorded",
                                path.display(),
                                ctx.opts.max_bytes as f64 / f64::from(1u32 << 20)
                            );
                        }
                    }
                    if rotate {
                        part += 1;
                        match Sink::open(&ctx, part) {
                            Ok(s) => {
                                eprintln!("edgeflow: recording continues in {}", s.path.display());
                                sink = Some(s);
                            }
                            Err(e) => {
                                failure = Some(e);
                                tap.off.store(true, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                }
            }
            None => {}
        }
        if last_flush.elapsed() >= ctx.opts.flush_every {
            last_flush = Instant::now();
            if let Some(s) = sink.as_mut().filter(|s| s.unflushed > 0) {
                s.unflushed = 0;
                if let Err(e) = s.w.flush() {
                    failure = Some(mcap_err(&s.path, e));
                    tap.off.store(true, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
    // Whatever stopped the loop, the open file gets its footer.
    stats.count_drops(tap, queued_after_limit);
    if let Some(s) = sink.take() {
        let path = s.path.clone();
        match s.close(&stats) {
            Ok(b) => {
                stats.bytes += b;
                stats.files.push(path);
            }
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    stats.count_drops(tap, queued_after_limit);
    match failure {
        Some(e) => Err(e),
        None => Ok(stats),
    }
}

impl RecordStats {
    fn count_drops(&mut self, tap: &Tap, queued_after_limit: u64) {
        self.dropped_queue_full = tap.dropped_full.load(Ordering::Relaxed);
        self.dropped_after_limit = queued_after_limit + tap.dropped_after.load(Ordering::Relaxed);
    }
}
