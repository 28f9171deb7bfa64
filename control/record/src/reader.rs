//! Reading a recording back. The file is walked record by record with the
//! byte offset of each in hand, so a truncated or damaged file is reported
//! as "at byte N: expected X" rather than a bare parse failure; the records
//! themselves are parsed by the `mcap` crate.

use crate::error::{Error, Result};
use crate::format::{self, keys, EdgeName};
use edgeflow_control::wire::{self, WireMessage};
use mcap::records::{op, Record};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// One recorded edge (an MCAP channel).
#[derive(Debug, Clone)]
pub struct RecordedEdge {
    /// The edge's index in the recorded pipeline's plan.
    pub index: usize,
    /// Its producer and consumer.
    pub name: EdgeName,
    /// The MCAP topic.
    pub topic: String,
}

/// One recorded message.
#[derive(Debug, Clone)]
pub struct RecordedMessage {
    /// Index into [`Recording::edges`].
    pub edge: usize,
    /// When it was sent, ns since the Unix epoch.
    pub log_time: u64,
    /// Its capture time, ns since the Unix epoch.
    pub publish_time: u64,
    /// The wire-format bytes.
    pub data: Vec<u8>,
    /// Where its record starts in the file (its chunk's, when chunked).
    pub offset: u64,
}

/// One journal entry of a stage.
#[derive(Debug, Clone)]
pub struct JournalEntry {
    /// When the stage made it, ns since the Unix epoch.
    pub log_time: u64,
    /// The stage's encoding of it.
    pub data: Vec<u8>,
}

/// A recording, read into memory.
#[derive(Debug, Clone)]
pub struct Recording {
    /// The file.
    pub path: PathBuf,
    /// `edgeflow.run` metadata (pipeline name, hash, versions...).
    pub run: BTreeMap<String, String>,
    /// Resolved params of every stage (JSON text by stage id).
    pub params: BTreeMap<String, String>,
    /// `edgeflow.end` metadata, when the recorder finished normally.
    pub end: Option<BTreeMap<String, String>>,
    /// The pipeline file's text.
    pub pipeline_text: String,
    /// Edges, by channel.
    pub edges: Vec<RecordedEdge>,
    /// Messages in file order (the order they were sent on each edge).
    pub messages: Vec<RecordedMessage>,
    /// Stages' journals (`journal/<stage>` channels), by stage id, in
    /// file order: what a stage applied and when beyond its inputs (the
    /// controller's core calls; `edgeflow_control::journal`).
    pub journals: BTreeMap<String, Vec<JournalEntry>>,
    /// Set when the file was read with [`Recording::open_partial`] and
    /// ends early: why, and where the readable part stops.
    pub truncated: Option<String>,
    /// File size in bytes.
    pub size: u64,
}

/// Human name of a record opcode, for errors.
fn op_name(opcode: u8) -> String {
    let n = match opcode {
        op::HEADER => "header",
        op::FOOTER => "footer",
        op::SCHEMA => "schema",
        op::CHANNEL => "channel",
        op::MESSAGE => "message",
        op::CHUNK => "chunk",
        op::MESSAGE_INDEX => "message index",
        op::CHUNK_INDEX => "chunk index",
        op::ATTACHMENT => "attachment",
        op::ATTACHMENT_INDEX => "attachment index",
        op::STATISTICS => "statistics",
        op::METADATA => "metadata",
        op::METADATA_INDEX => "metadata index",
        op::SUMMARY_OFFSET => "summary offset",
        op::DATA_END => "data end",
        _ => return format!("unknown record (opcode {opcode:#04x})"),
    };
    format!("{n} record (opcode {opcode:#04x})")
}

/// Partial state while walking a file.
#[derive(Default)]
struct Walk {
    run: Option<BTreeMap<String, String>>,
    params: BTreeMap<String, String>,
    end: Option<BTreeMap<String, String>>,
    pipeline: Option<String>,
    channels: HashMap<u16, usize>,
    edges: Vec<RecordedEdge>,
    messages: Vec<RecordedMessage>,
    journal_channels: HashMap<u16, String>,
    journals: BTreeMap<String, Vec<JournalEntry>>,
}

impl Recording {
    /// Read a complete recording; a truncated or corrupt file is an error
    /// naming the byte offset and what was expected there.
    pub fn open(path: &Path) -> Result<Recording> {
        Self::read(path, false)
    }

    /// Read what is complete of a recording cut short (a crash): every
    /// record before the damage; [`Recording::truncated`] says where it
    /// stops. Corruption inside the readable part is still an error.
    pub fn open_partial(path: &Path) -> Result<Recording> {
        Self::read(path, true)
    }

    fn read(path: &Path, partial: bool) -> Result<Recording> {
        let buf = std::fs::read(path).map_err(|error| Error::Io {
            path: path.to_path_buf(),
            error,
        })?;
        let mut w = Walk::default();
        let truncated = match walk(path, &buf, &mut w) {
            Ok(()) => None,
            Err(Error::Truncated {
                offset, expected, ..
            }) if partial => Some(format!(
                "the file ends early at byte {offset} (expected {expected}); {} messages before it were read",
                w.messages.len()
            )),
            Err(e) => return Err(e),
        };
        let not = |msg: &str| Error::NotARecording {
            path: path.to_path_buf(),
            msg: msg.into(),
        };
        let run = w.run.ok_or_else(|| {
            not("it has no `edgeflow.run` metadata (was it written by `edgeflow run --record`?)")
        })?;
        let pipeline_text = w
            .pipeline
            .ok_or_else(|| not("it has no `pipeline.yaml` attachment"))?;
        Ok(Recording {
            path: path.to_path_buf(),
            run,
            params: w.params,
            end: w.end,
            pipeline_text,
            edges: w.edges,
            messages: w.messages,
            journals: w.journals,
            truncated,
            size: buf.len() as u64,
        })
    }

    /// A run metadata value ("" when absent).
    pub fn meta(&self, key: &str) -> &str {
        self.run.get(key).map(String::as_str).unwrap_or("")
    }

    /// The recorded pipeline's name.
    pub fn pipeline_name(&self) -> &str {
        self.meta(keys::PIPELINE)
    }

    /// `--set` overrides the run was started with.
    pub fn overrides(&self) -> Vec<String> {
        serde_json::from_str(self.meta(keys::OVERRIDES)).unwrap_or_default()
    }

    /// Decode one message's wire bytes.
    pub fn decode(&self, m: &RecordedMessage) -> Result<WireMessage> {
        wire::decode(&m.data).map_err(|e| Error::Corrupt {
            path: self.path.clone(),
            offset: m.offset,
            expected: format!(
                "an edgeflow wire-format message on {}: {e}",
                self.edges
                    .get(m.edge)
                    .map(|e| e.topic.as_str())
                    .unwrap_or("?")
            ),
        })
    }

    /// Check that this recording was made from `pipeline_text` by this
    /// edgeflow version; the error lists every difference.
    pub fn check_matches(&self, pipeline_text: &str) -> Result<()> {
        let mut diffs = Vec::new();
        let want = format::pipeline_hash(pipeline_text);
        let got = self.meta(keys::PIPELINE_SHA256);
        if got != want {
            diffs.push(format!(
                "the pipeline file differs: recorded sha256 {} ({}), given {}{}",
                short(got),
                self.meta(keys::FILE),
                short(&want),
                first_difference(&self.pipeline_text, pipeline_text)
                    .map(|d| format!("; first difference: {d}"))
                    .unwrap_or_default()
            ));
        }
        let v = self.meta(keys::EDGEFLOW_VERSION);
        if v != format::EDGEFLOW_VERSION {
            diffs.push(format!(
                "recorded by edgeflow {v}, this is edgeflow {}",
                format::EDGEFLOW_VERSION
            ));
        }
        let f = self.meta(keys::RECORD_FORMAT);
        if f != format::RECORD_FORMAT {
            diffs.push(format!(
                "recording layout {f}, this edgeflow reads {}",
                format::RECORD_FORMAT
            ));
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(Error::Mismatch(diffs.join("; ")))
        }
    }
}

fn short(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

/// The first differing line of two texts, for a mismatch message.
fn first_difference(a: &str, b: &str) -> Option<String> {
    let (mut la, mut lb) = (a.lines(), b.lines());
    let mut n = 0;
    loop {
        n += 1;
        match (la.next(), lb.next()) {
            (None, None) => return None,
            (x, y) if x == y => continue,
            (x, y) => {
                return Some(format!(
                    "line {n}: recorded `{}`, given `{}`",
                    x.unwrap_or("<end of file>").trim(),
                    y.unwrap_or("<end of file>").trim()
                ))
            }
        }
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Walk the file's top-level records, offsets in hand.
fn walk(path: &Path, buf: &[u8], w: &mut Walk) -> Result<()> {
    let corrupt = |offset: usize, expected: String| Error::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        expected,
    };
    let truncated = |offset: usize, expected: String| Error::Truncated {
        path: path.to_path_buf(),
        offset: offset as u64,
        expected,
    };
    let magic = mcap::MAGIC;
    if buf.len() < magic.len() {
        return Err(if magic.starts_with(buf) {
            truncated(buf.len(), "the 8-byte MCAP magic".into())
        } else {
            corrupt(
                0,
                "the MCAP magic 89 4D 43 41 50 30 0D 0A (is this an MCAP file?)".into(),
            )
        });
    }
    if &buf[..magic.len()] != magic {
        return Err(corrupt(
            0,
            format!(
                "the MCAP magic 89 4D 43 41 50 30 0D 0A, found {:02X?} (is this an MCAP file?)",
                &buf[..magic.len()]
            ),
        ));
    }
    let mut pos = magic.len();
    let mut in_summary = false;
    let mut first = true;
    loop {
        if pos == buf.len() {
            return Err(truncated(
                pos,
                if in_summary {
                    "more summary records and the footer".into()
                } else {
                    "another record, or the data end record, summary and footer".into()
                },
            ));
        }
        if buf.len() - pos < 9 {
            return Err(truncated(
                pos,
                format!(
                    "a 9-byte record header (opcode, length), only {} bytes remain",
                    buf.len() - pos
                ),
            ));
        }
        let opcode = buf[pos];
        let len = le_u64(&buf[pos + 1..]);
        let left = (buf.len() - pos - 9) as u64;
        if len == u64::MAX {
            // The writer's placeholder: a chunk still open when it stopped.
            return Err(truncated(
                pos,
                format!(
                    "a finished {}, found one still being written (its length is the writer's placeholder)",
                    op_name(opcode)
                ),
            ));
        }
        if len > left {
            return Err(truncated(
                pos,
                format!("a {} of {len} bytes, only {left} remain", op_name(opcode)),
            ));
        }
        let body = &buf[pos + 9..pos + 9 + len as usize];
        if first && opcode != op::HEADER {
            return Err(corrupt(
                pos,
                format!("the header record, found a {}", op_name(opcode)),
            ));
        }
        first = false;
        let rec = mcap::parse_record(opcode, body)
            .map_err(|e| corrupt(pos, format!("a valid {}: {e}", op_name(opcode))))?;
        let next = pos + 9 + len as usize;
        match rec {
            Record::Footer(_) => {
                let rest = &buf[next..];
                if rest == magic {
                    return Ok(());
                }
                if rest.len() < magic.len() && magic.starts_with(rest) {
                    return Err(truncated(buf.len(), "the closing MCAP magic".into()));
                }
                return Err(corrupt(
                    next,
                    format!(
                        "the closing MCAP magic right after the footer, found {} bytes {:02X?}",
                        rest.len(),
                        &rest[..rest.len().min(8)]
                    ),
                ));
            }
            Record::DataEnd(_) => in_summary = true,
            // The summary repeats schemas and channels: already known.
            _ if in_summary => {}
            Record::Chunk { header, data } => {
                let reader = mcap::read::ChunkReader::new(header, &data)
                    .map_err(|e| corrupt(pos, format!("a readable chunk: {e}")))?;
                for r in reader {
                    let r =
                        r.map_err(|e| corrupt(pos, format!("a chunk whose records parse: {e}")))?;
                    take(path, r, pos, w)?;
                }
            }
            r => take(path, r, pos, w)?,
        }
        pos = next;
    }
}

/// Keep what a data-section record says.
fn take(path: &Path, r: Record<'_>, pos: usize, w: &mut Walk) -> Result<()> {
    let corrupt = |expected: String| Error::Corrupt {
        path: path.to_path_buf(),
        offset: pos as u64,
        expected,
    };
    match r {
        Record::Channel(c) if c.message_encoding == format::JOURNAL_ENCODING => {
            let Some(stage) = c.metadata.get("stage") else {
                return Err(corrupt(format!(
                    "journal channel `{}` to name its stage in the metadata (`stage`)",
                    c.topic
                )));
            };
            w.journal_channels.insert(c.id, stage.clone());
        }
        Record::Message { header, data } if w.journal_channels.contains_key(&header.channel_id) => {
            let stage = w.journal_channels[&header.channel_id].clone();
            w.journals.entry(stage).or_default().push(JournalEntry {
                log_time: header.log_time,
                data: data.into_owned(),
            });
        }
        Record::Channel(c) => {
            if c.message_encoding != format::MESSAGE_ENCODING {
                return Err(Error::NotARecording {
                    path: path.to_path_buf(),
                    msg: format!(
                        "channel `{}` has message encoding `{}`, expected `{}`",
                        c.topic,
                        c.message_encoding,
                        format::MESSAGE_ENCODING
                    ),
                });
            }
            let Some((index, name)) = EdgeName::from_metadata(&c.metadata) else {
                return Err(corrupt(format!(
                    "channel `{}` to carry the edge metadata (edge, from_stage, from_port, to_stage, to_port, policy)",
                    c.topic
                )));
            };
            if !w.channels.contains_key(&c.id) {
                w.channels.insert(c.id, w.edges.len());
                w.edges.push(RecordedEdge {
                    index,
                    name,
                    topic: c.topic,
                });
            }
        }
        Record::Message { header, data } => {
            let Some(&edge) = w.channels.get(&header.channel_id) else {
                return Err(corrupt(format!(
                    "a message on a channel declared before it, found channel id {}",
                    header.channel_id
                )));
            };
            w.messages.push(RecordedMessage {
                edge,
                log_time: header.log_time,
                publish_time: header.publish_time,
                data: data.into_owned(),
                offset: pos as u64,
            });
        }
        Record::Metadata(m) => match m.name.as_str() {
            // Rotated parts repeat it; the first one counts.
            format::META_RUN if w.run.is_none() => w.run = Some(m.metadata),
            format::META_PARAMS => w.params = m.metadata,
            format::META_END => w.end = Some(m.metadata),
            _ => {}
        },
        Record::Attachment { header, data, .. } if header.name == format::ATTACH_PIPELINE => {
            let text = String::from_utf8(data.into_owned())
                .map_err(|e| corrupt(format!("the pipeline attachment to be UTF-8 text: {e}")))?;
            w.pipeline = Some(text);
        }
        _ => {}
    }
    Ok(())
}
