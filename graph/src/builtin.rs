//! Built-in stage kinds that need no model: timers, text in/out, host ports,
//! passthrough and a discarding sink.

use crate::message::{Event, Message, Payload, Timestamp};
use crate::port::{PortSpec, PortType, Ports};
use crate::registry::{BuildEnv, ParamInfo, ParamType, Params, Registry, StageFactory, StageInfo};
use crate::stage::{Input, Poll, Stage, StageCtx, StageError, StageResult};
use std::io::{BufRead, Write};

use std::time::{Duration, Instant};

/// Kind name of the host input stage.
pub const HOST_IN: &str = "host_in";
/// Kind name of the host output stage.
pub const HOST_OUT: &str = "host_out";

pub(crate) fn register(r: &mut Registry) {
    r.register(TimerKind);
    r.register(TextKind);
    r.register(StdoutKind);
    r.register(PassthroughKind);
    r.register(NullKind);
    r.register(HostInKind);
    r.register(HostOutKind);
    r.register(SentenceChunkerKind);
}

fn out_port(ty: PortType, doc: &str) -> Ports {
    Ports {
        inputs: vec![],
        outputs: vec![PortSpec::new("out", ty, doc)],
    }
}

fn in_port(ty: PortType, doc: &str) -> Ports {
    Ports {
        inputs: vec![PortSpec::new("in", ty, doc)],
        outputs: vec![],
    }
}

// ---------------------------------------------------------------- timer

struct TimerKind;

impl StageFactory for TimerKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "timer",
            doc: "Emits a tick event at a fixed rate; counts deadline misses when a tick is late by more than half a period (ticks are never bunched up: missed ones are skipped and counted).",
            params: vec![
                ParamInfo::new("rate_hz", ParamType::Float, 10.0, "ticks per second (0 < rate <= 100000)"),
                ParamInfo::optional("count", ParamType::Int, "stop after this many ticks (default: run until stopped)"),
            ],
            ports: out_port(PortType::Control, "Event::Tick { index, due }"),
            source: true,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let rate: f64 = p.get_or("rate_hz", 10.0)?;
        if !(rate > 0.0 && rate <= 100_000.0) {
            return Err(p
                .error("rate_hz", format!("must be in (0, 100000], got {rate}"))
                .into());
        }
        Ok(Box::new(Timer {
            period: Duration::from_secs_f64(1.0 / rate),
            count: p.opt("count")?,
            next: None,
            index: 0,
        }))
    }
}

struct Timer {
    period: Duration,
    count: Option<u64>,
    next: Option<Instant>,
    index: u64,
}

impl Stage for Timer {
    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        if self.count.is_some_and(|c| self.index >= c) {
            return Ok(Poll::Done);
        }
        let due = *self.next.get_or_insert_with(Instant::now);
        if !ctx.sleep_until(due) {
            return Ok(if ctx.should_stop() {
                Poll::Done
            } else {
                Poll::Idle
            });
        }
        let now = Instant::now();
        let late = now.saturating_duration_since(due);
        if late > self.period / 2 {
            ctx.deadline_missed();
        }
        let msg = Message {
            epoch: ctx.current_epoch(),
            seq: 0,
            timestamp: Timestamp::from_instant(due),
            deadline: Some(Timestamp::from_instant(due + self.period)),
            payload: Payload::event(Event::Tick {
                index: self.index,
                due: Timestamp::from_instant(due),
            }),
        };
        self.index += 1;
        // Skip (and count) whole periods we slept through.
        let mut next = due + self.period;
        while next + self.period / 2 < now {
            next += self.period;
            self.index += 1;
            ctx.deadline_missed();
        }
        self.next = Some(next);
        ctx.emit_msg(0, msg)?;
        Ok(Poll::Continue)
    }
}

// ---------------------------------------------------------------- text

struct TextKind;

impl StageFactory for TextKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "text",
            doc: "Emits text: the `text` param, or each line of stdin when it is empty. One message per line unless `whole` is set.",
            params: vec![
                ParamInfo::new("text", ParamType::String, "", "text to emit; empty reads stdin until EOF"),
                ParamInfo::new("whole", ParamType::Bool, true, "emit the text as one message (false: one message per line)"),
            ],
            ports: out_port(PortType::Text, "the text"),
            source: true,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Ok(Box::new(TextSource {
            text: p.get_or("text", String::new())?,
            whole: p.get_or("whole", true)?,
            done: false,
        }))
    }
}

struct TextSource {
    text: String,
    whole: bool,
    done: bool,
}

impl Stage for TextSource {
    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        if self.done {
            return Ok(Poll::Done);
        }
        self.done = true;
        let text = if self.text.is_empty() {
            let mut s = String::new();
            for line in std::io::stdin().lock().lines() {
                let line = line.map_err(|e| StageError::msg(format!("reading stdin: {e}")))?;
                if !self.whole {
                    if !line.trim().is_empty() {
                        ctx.emit(0, Payload::text(&line))?;
                    }
                    continue;
                }
                s.push_str(&line);
                s.push('\n');
            }
            if !self.whole {
                return Ok(Poll::Done);
            }
            s
        } else {
            std::mem::take(&mut self.text)
        };
        if self.whole {
            if !text.trim().is_empty() {
                ctx.emit(0, Payload::text(text.trim_end()))?;
            }
        } else {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                ctx.emit(0, Payload::text(line))?;
            }
        }
        Ok(Poll::Done)
    }
}

// ---------------------------------------------------------------- stdout

struct StdoutKind;

impl StageFactory for StdoutKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "stdout",
            doc: "Prints what it receives: text as is (streamed pieces joined), other payloads as a one-line summary.",
            params: vec![ParamInfo::new(
                "newline",
                ParamType::Bool,
                true,
                "end each message with a newline (false: stream text pieces on one line until end of stream)",
            )],
            ports: in_port(PortType::Any, "anything"),
            source: false,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Ok(Box::new(Stdout {
            newline: p.get_or("newline", true)?,
            wrote: false,
        }))
    }
}

struct Stdout {
    newline: bool,
    wrote: bool,
}

impl Stage for Stdout {
    fn process(&mut self, input: Input, _ctx: &mut StageCtx) -> StageResult {
        let mut out = std::io::stdout().lock();
        let r = match &input.msg.payload {
            Payload::Text(t) if !self.newline => write!(out, "{t}"),
            Payload::Text(t) => writeln!(out, "{t}"),
            other => writeln!(
                out,
                "[epoch {} #{}] {other:?}",
                input.msg.epoch, input.msg.seq
            ),
        };
        self.wrote = true;
        r.and_then(|_| out.flush())
            .map_err(|e| StageError::msg(format!("writing stdout: {e}")))
    }

    fn finish(&mut self, _ctx: &mut StageCtx) -> StageResult {
        if !self.newline && self.wrote {
            println!();
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- passthrough / discard

struct PassthroughKind;

impl StageFactory for PassthroughKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "passthrough",
            doc: "Forwards every message unchanged (shares the payload). Useful to tap or fan out an edge, and for latency benchmarks.",
            params: vec![],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Any, "anything")],
                outputs: vec![PortSpec::new("out", PortType::Any, "the same messages")],
            },
            source: false,
        }
    }

    fn build(&self, _p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Ok(Box::new(Passthrough))
    }
}

struct Passthrough;

impl Stage for Passthrough {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        ctx.emit_msg(0, input.msg)
    }
}

struct NullKind;

impl StageFactory for NullKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "discard",
            doc: "Consumes and discards everything (counts it in metrics).",
            params: vec![],
            ports: in_port(PortType::Any, "anything"),
            source: false,
        }
    }

    fn build(&self, _p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Ok(Box::new(Null))
    }
}

struct Null;

impl Stage for Null {
    fn process(&mut self, _input: Input, _ctx: &mut StageCtx) -> StageResult {
        Ok(())
    }
}

// ---------------------------------------------------------------- host ports

struct HostInKind;

impl StageFactory for HostInKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: HOST_IN,
            doc: "Data pushed from host code with `Running::push(id, payload)`; ends when the host calls `close_input(id)` or the pipeline is waited on.",
            params: vec![ParamInfo::new("type", ParamType::String, "any", "port type: audio, text, tokens, tensor, image, actions, control or any")],
            ports: out_port(PortType::Any, "what the host pushes"),
            source: true,
        }
    }

    fn ports(&self, p: &Params, _env: &BuildEnv) -> Result<Ports, StageError> {
        Ok(out_port(parse_type(p)?, "what the host pushes"))
    }

    fn build(&self, _p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Err(StageError::msg("host_in is built by the executor"))
    }
}

fn parse_type(p: &Params) -> Result<PortType, StageError> {
    let t: String = p.get_or("type", "any".to_string())?;
    Ok(match t.as_str() {
        "audio" => PortType::AUDIO_ANY,
        "text" => PortType::Text,
        "tokens" => PortType::Tokens,
        "tensor" => PortType::Tensor,
        "image" => PortType::Image,
        "actions" => PortType::Actions,
        "control" => PortType::Control,
        "any" => PortType::Any,
        other => {
            return Err(p
                .error("type", format!("unknown port type `{other}`; use audio, text, tokens, tensor, image, actions, control or any"))
                .into())
        }
    })
}

pub(crate) struct HostIn {
    rx: crossbeam_channel::Receiver<Message>,
}

impl HostIn {
    pub(crate) fn new(rx: crossbeam_channel::Receiver<Message>) -> Self {
        HostIn { rx }
    }
}

impl Stage for HostIn {
    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        match self.rx.recv_timeout(Duration::from_millis(20)) {
            Ok(m) => {
                ctx.emit_msg(0, m)?;
                Ok(Poll::Continue)
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Ok(Poll::Idle),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Ok(Poll::Done),
        }
    }
}

struct HostOutKind;

impl StageFactory for HostOutKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: HOST_OUT,
            doc: "Delivers messages to host code via `Running::pull(id, timeout)`; blocks (backpressure) when the host does not keep up.",
            params: vec![
                ParamInfo::new("type", ParamType::String, "any", "port type: audio, text, tokens, tensor, image, actions, control or any"),
                ParamInfo::new("capacity", ParamType::Int, 1024, "messages buffered for the host"),
            ],
            ports: in_port(PortType::Any, "what the host pulls"),
            source: false,
        }
    }

    fn ports(&self, p: &Params, _env: &BuildEnv) -> Result<Ports, StageError> {
        Ok(in_port(parse_type(p)?, "what the host pulls"))
    }

    fn build(&self, _p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Err(StageError::msg("host_out is built by the executor"))
    }
}

pub(crate) struct HostOut {
    tx: crossbeam_channel::Sender<Message>,
}

impl HostOut {
    pub(crate) fn new(tx: crossbeam_channel::Sender<Message>) -> Self {
        HostOut { tx }
    }
}

impl Stage for HostOut {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let mut m = input.msg;
        loop {
            match self.tx.send_timeout(m, Duration::from_millis(20)) {
                Ok(()) => return Ok(()),
                Err(crossbeam_channel::SendTimeoutError::Timeout(back)) => {
                    ctx.check()?;
                    m = back;
                }
                // Host dropped its end: discard.
                Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => return Ok(()),
            }
        }
    }
}

// ---------------------------------------------------------------- sentence_chunker

struct SentenceChunkerKind;

impl StageFactory for SentenceChunkerKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "sentence_chunker",
            doc: "Joins streamed text pieces (an LLM's tokens) into whole sentences for TTS: emits each sentence as soon as its terminator and the following space arrive; the rest on an Event::Flush (end of answer), at end of stream, or when `max_chars` is exceeded (split at the last clause break). A cancel drops the buffer.",
            params: vec![
                ParamInfo::new("min_chars", ParamType::Int, 12, "do not emit a sentence shorter than this (joins it with the next), so 'Hi.' does not become its own synthesis call"),
                ParamInfo::new("max_chars", ParamType::Int, 300, "split a sentence that grows past this at the last comma/semicolon/space"),
                ParamInfo::new("first_clause_chars", ParamType::Int, 0, "when > 0, a turn's first piece may end at a clause break (comma, semicolon, colon, dash) once it has this many characters, so speech starts before the first sentence is complete; 0 waits for whole sentences (the clause then gets its own synthesis call, with a clause's intonation)"),
            ],
            ports: Ports {
                inputs: vec![
                    PortSpec::new("in", PortType::Text, "text pieces"),
                    PortSpec::optional("flush", PortType::Control, "Event::Flush emits what is buffered"),
                ],
                outputs: vec![PortSpec::new("out", PortType::Text, "whole sentences")],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let min_chars: usize = p.get_or("min_chars", 12)?;
        let max_chars: usize = p.get_or("max_chars", 300)?;
        let first_clause_chars: usize = p.get_or("first_clause_chars", 0)?;
        if max_chars < 2 || min_chars >= max_chars {
            return Err(p
                .error(
                    "max_chars",
                    format!("must be >= 2 and greater than min_chars ({min_chars})"),
                )
                .into());
        }
        Ok(Box::new(SentenceChunker {
            buf: String::new(),
            epoch: None,
            min_chars,
            max_chars,
            first_clause_chars,
            emitted: false,
        }))
    }
}

/// Buffers text pieces and cuts them into sentences.
pub(crate) struct SentenceChunker {
    buf: String,
    epoch: Option<crate::Epoch>,
    min_chars: usize,
    max_chars: usize,
    /// 0, or the length from which a turn's first piece may end at a clause.
    first_clause_chars: usize,
    /// Whether this turn has emitted anything yet.
    emitted: bool,
}

const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "no", "fig",
    "approx", "inc", "ltd", "co", "mt",
];

impl SentenceChunker {
    /// Byte index just past the first complete sentence (terminator, closing
    /// quotes, then whitespace), if there is one long enough.
    fn sentence_end(&self) -> Option<usize> {
        let b = &self.buf;
        let mut it = b.char_indices().peekable();
        while let Some((i, c)) = it.next() {
            if !matches!(c, '.' | '!' | '?' | '…' | ';' | ':') {
                continue;
            }
            let mut end = i + c.len_utf8();
            while let Some(&(j, q)) = it.peek() {
                if matches!(q, '"' | '\'' | ')' | ']' | '”' | '’' | '.' | '!' | '?') {
                    end = j + q.len_utf8();
                    it.next();
                } else {
                    break;
                }
            }
            let Some(&(_, next)) = it.peek() else {
                return None; // need the following space to be sure
            };
            if !next.is_whitespace() {
                continue;
            }
            if matches!(c, ';' | ':') {
                continue; // clause, not sentence: only used for max_chars splits
            }
            if c == '.' {
                let word = b[..i]
                    .rsplit(|ch: char| ch.is_whitespace())
                    .next()
                    .unwrap_or("")
                    .to_lowercase();
                let single_letter =
                    word.chars().count() == 1 && word.chars().all(char::is_alphabetic);
                if ABBREVIATIONS.contains(&word.as_str()) || single_letter {
                    continue;
                }
            }
            if b[..end].trim().chars().count() >= self.min_chars {
                return Some(end);
            }
        }
        None
    }

    /// Byte index just past the first clause break (`,` `;` `:` or a dash,
    /// then whitespace) that ends at least `first_clause_chars` characters,
    /// for a turn's first piece.
    fn clause_end(&self) -> Option<usize> {
        if self.first_clause_chars == 0 || self.emitted {
            return None;
        }
        let b = &self.buf;
        let mut it = b.char_indices().peekable();
        while let Some((i, c)) = it.next() {
            if !matches!(c, ',' | ';' | ':' | '\u{2014}' | '\u{2013}' | '-') {
                continue;
            }
            let end = i + c.len_utf8();
            let Some(&(_, next)) = it.peek() else {
                return None; // need the following space to be sure
            };
            if next.is_whitespace() && b[..end].trim().chars().count() >= self.first_clause_chars {
                return Some(end);
            }
        }
        None
    }

    fn emit_upto(&mut self, end: usize, ctx: &mut StageCtx) -> StageResult {
        let sentence: String = self.buf.drain(..end).collect();
        let s = sentence.trim();
        if !s.is_empty() {
            self.emitted = true;
            ctx.emit(0, Payload::text(s))?;
        }
        Ok(())
    }

    fn drain(&mut self, ctx: &mut StageCtx) -> StageResult {
        loop {
            let end = match self.sentence_end() {
                // A whole sentence, unless an earlier first clause qualifies.
                Some(end) => Some(self.clause_end().map_or(end, |c| c.min(end))),
                None => self.clause_end(),
            };
            let Some(end) = end else { break };
            self.emit_upto(end, ctx)?;
        }
        while self.buf.chars().count() > self.max_chars {
            let limit = self
                .buf
                .char_indices()
                .nth(self.max_chars)
                .map(|(i, _)| i)
                .unwrap_or(self.buf.len());
            let head = &self.buf[..limit];
            let cut = head
                .rfind([',', ';', ':'])
                .map(|i| i + 1)
                .or_else(|| head.rfind(char::is_whitespace))
                .filter(|&i| i > 0)
                .unwrap_or(limit);
            self.emit_upto(cut, ctx)?;
        }
        Ok(())
    }

    /// Emit what is buffered; the turn is over, so the next piece is a
    /// turn's first again.
    fn flush(&mut self, ctx: &mut StageCtx) -> StageResult {
        let rest = std::mem::take(&mut self.buf);
        let rest = rest.trim();
        if !rest.is_empty() {
            ctx.emit(0, Payload::text(rest))?;
        }
        self.emitted = false;
        Ok(())
    }
}

impl Stage for SentenceChunker {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        if self.epoch.is_some_and(|e| e != input.msg.epoch) {
            // A new turn: what was buffered belongs to an ended turn.
            self.buf.clear();
            self.emitted = false;
        }
        self.epoch = Some(input.msg.epoch);
        match (&input.msg.payload, input.port) {
            (Payload::Text(t), _) => {
                self.buf.push_str(t);
                self.drain(ctx)
            }
            (Payload::Event(e), _) if matches!(**e, Event::Flush) => self.flush(ctx),
            _ => Ok(()),
        }
    }

    fn reset(&mut self, epoch: crate::Epoch, _ctx: &mut StageCtx) -> StageResult {
        if self.epoch == Some(epoch) {
            self.buf.clear();
            self.emitted = false;
        }
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        self.flush(ctx)
    }
}
