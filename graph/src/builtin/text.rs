//! Text in: the `text` source (a param, or stdin of any length streamed as
//! sentences or lines) and `sentence_chunker` (streamed pieces, e.g. an
//! LLM's tokens, joined into sentences). Both cut text with one
//! [`SentenceSplitter`].

use super::out_port;
use crate::message::{Epoch, Event, Payload, Timestamp};
use crate::port::{PortSpec, PortType, Ports};
use crate::registry::{BuildEnv, ParamInfo, ParamType, Params, StageFactory, StageInfo};
use crate::stage::{Input, Poll, Stage, StageCtx, StageError, StageResult};
use std::io::Read;

// ---------------------------------------------------------------- text

/// Default longest message the `text` source emits from stdin.
const TEXT_MAX_CHARS: usize = 1000;
/// Bytes read from stdin per poll.
const READ_CHUNK: usize = 16 * 1024;

pub(super) struct TextKind;

impl StageFactory for TextKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "text",
            doc: "Emits text: the `text` param (one message, or one per line unless `whole` is set), or, when it is empty, stdin until EOF. Stdin of any length is read incrementally and streamed as sentences (one per line when `whole` is false); a sentence or line longer than `max_chars` is cut at a word boundary, so memory stays bounded and a slow consumer holds the reading back.",
            params: vec![
                ParamInfo::new("text", ParamType::String, "", "text to emit; empty reads stdin until EOF"),
                ParamInfo::new("whole", ParamType::Bool, true, "the `text` param as one message, stdin as one message per sentence (false: one message per line)"),
                ParamInfo::new("max_chars", ParamType::Int, TEXT_MAX_CHARS as u64, "stdin only: longest message; a longer sentence or line is cut at the last word boundary before it (>= 2)"),
            ],
            ports: out_port(PortType::Text, "the text"),
            source: true,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let text: String = p.get_or("text", String::new())?;
        let whole: bool = p.get_or("whole", true)?;
        let max_chars: usize = p.get_or("max_chars", TEXT_MAX_CHARS)?;
        if max_chars < 2 {
            return Err(p
                .error("max_chars", format!("must be >= 2, got {max_chars}"))
                .into());
        }
        let input = if text.is_empty() {
            Some(StdinText::new(Box::new(std::io::stdin()), whole, max_chars))
        } else {
            None
        };
        Ok(Box::new(TextSource {
            text,
            whole,
            input,
            done: false,
        }))
    }
}

struct TextSource {
    text: String,
    whole: bool,
    /// Set when reading stdin (the `text` param is empty).
    input: Option<StdinText>,
    done: bool,
}

impl Stage for TextSource {
    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        if self.done {
            return Ok(Poll::Done);
        }
        if let Some(input) = &mut self.input {
            let more = input.step(&mut |s: &str| ctx.emit(0, Payload::text(s)))?;
            self.done = !more;
            return Ok(if more { Poll::Continue } else { Poll::Done });
        }
        self.done = true;
        let text = std::mem::take(&mut self.text);
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

/// Text read incrementally from a byte stream (stdin) and cut into
/// sentences or lines of at most `max_chars`: what is held is one read
/// chunk plus one unfinished sentence or line, whatever the input's length.
pub(crate) struct StdinText {
    reader: Box<dyn Read + Send>,
    /// Bytes of a UTF-8 sequence split across reads.
    pending: Vec<u8>,
    /// Bytes consumed so far (for error messages).
    offset: u64,
    /// Sentences (`whole`), else lines.
    sentences: SentenceSplitter,
    line: String,
    by_sentence: bool,
    max_chars: usize,
}

impl StdinText {
    pub(crate) fn new(reader: Box<dyn Read + Send>, by_sentence: bool, max_chars: usize) -> Self {
        let mut sentences = SentenceSplitter::new(1, max_chars, 0);
        sentences.word_cuts = true;
        StdinText {
            reader,
            pending: Vec::new(),
            offset: 0,
            sentences,
            line: String::new(),
            by_sentence,
            max_chars,
        }
    }

    /// Read one chunk and hand every finished piece to `emit` (which blocks
    /// on a full edge: backpressure). False at end of input, after the rest
    /// has been emitted.
    pub(crate) fn step(&mut self, emit: &mut dyn FnMut(&str) -> StageResult) -> StageResult<bool> {
        let mut buf = [0u8; READ_CHUNK];
        let n = loop {
            match self.reader.read(&mut buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(StageError::msg(format!("reading stdin: {e}"))),
            }
        };
        if n == 0 {
            if !self.pending.is_empty() {
                return Err(self.not_utf8(0));
            }
            if self.by_sentence {
                self.sentences.flush(emit)?;
            } else {
                let line = std::mem::take(&mut self.line);
                emit_line(&line, emit)?;
            }
            return Ok(false);
        }
        self.pending.extend_from_slice(&buf[..n]);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            // An incomplete sequence at the end waits for the next read.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(e) => return Err(self.not_utf8(e.valid_up_to())),
        };
        let rest = self.pending.split_off(valid);
        let chunk = std::mem::replace(&mut self.pending, rest);
        self.offset += valid as u64;
        let text = std::str::from_utf8(&chunk).map_err(|e| StageError::msg(e.to_string()))?;
        if self.by_sentence {
            self.sentences.push(text);
            self.sentences.drain(emit)?;
        } else {
            self.lines(text, emit)?;
        }
        Ok(true)
    }

    fn not_utf8(&self, at: usize) -> StageError {
        StageError::msg(format!(
            "reading stdin: the input is not UTF-8 text (invalid byte at offset {})",
            self.offset + at as u64
        ))
    }

    /// One message per non-empty line (without its `\n` / `\r\n`); a line
    /// past `max_chars` is emitted in pieces cut at word boundaries.
    fn lines(&mut self, text: &str, emit: &mut dyn FnMut(&str) -> StageResult) -> StageResult {
        let mut rest = text;
        loop {
            let (segment, newline) = match rest.find('\n') {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            self.line.push_str(segment);
            self.cut_line(emit)?;
            if !newline {
                return Ok(());
            }
            rest = &rest[segment.len() + 1..];
            let line = std::mem::take(&mut self.line);
            emit_line(line.strip_suffix('\r').unwrap_or(&line), emit)?;
        }
    }

    /// Emit the head of the line in hand while it is longer than
    /// `max_chars`, cut at word boundaries.
    fn cut_line(&mut self, emit: &mut dyn FnMut(&str) -> StageResult) -> StageResult {
        while self.line.len() > self.max_chars {
            let Some((limit, _)) = self.line.char_indices().nth(self.max_chars) else {
                break;
            };
            let cut = word_cut(&self.line, limit);
            let head: String = self.line.drain(..cut).collect();
            let head = head.trim();
            if !head.is_empty() {
                emit(head)?;
            }
            let blank = self.line.len() - self.line.trim_start().len();
            self.line.drain(..blank);
        }
        Ok(())
    }
}

fn emit_line(line: &str, emit: &mut dyn FnMut(&str) -> StageResult) -> StageResult {
    if line.trim().is_empty() {
        return Ok(());
    }
    emit(line)
}

/// Where to cut `s` so that the head ends before byte `limit` at a word
/// boundary: after the last whitespace in `s[..limit]`, or, for a single
/// word longer than the limit, at `limit` itself.
fn word_cut(s: &str, limit: usize) -> usize {
    // The character at `limit` being a space makes `limit` a word boundary.
    if s[limit..].starts_with(char::is_whitespace) {
        return limit;
    }
    s[..limit]
        .rfind(char::is_whitespace)
        .filter(|&i| i > 0)
        .unwrap_or(limit)
}

// ---------------------------------------------------------------- sentence_chunker

pub(super) struct SentenceChunkerKind;

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
            split: SentenceSplitter::new(min_chars, max_chars, first_clause_chars),
            epoch: None,
            flushed: None,
        }))
    }
}

/// Buffers text pieces and cuts them into sentences: a sentence ends at a
/// terminator (`.` `!` `?` `…`, closing quotes absorbed) followed by
/// whitespace, not after an abbreviation or a single letter, once it has
/// `min_chars`; a buffer past `max_chars` is cut at the last clause break or
/// space. Used by `sentence_chunker` and by the `text` source on stdin.
pub(crate) struct SentenceSplitter {
    buf: String,
    min_chars: usize,
    max_chars: usize,
    /// 0, or the length from which a turn's first piece may end at a clause.
    first_clause_chars: usize,
    /// Whether this turn has emitted anything yet.
    emitted: bool,
    /// Cut over-long text at word boundaries only (whitespace), never after
    /// a comma inside a token such as `1,000`.
    word_cuts: bool,
}

impl SentenceSplitter {
    /// A splitter with these limits (`min_chars < max_chars`).
    pub(crate) fn new(min_chars: usize, max_chars: usize, first_clause_chars: usize) -> Self {
        SentenceSplitter {
            buf: String::new(),
            min_chars,
            max_chars,
            first_clause_chars,
            emitted: false,
            word_cuts: false,
        }
    }
}

const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "no", "fig",
    "approx", "inc", "ltd", "co", "mt",
];

impl SentenceSplitter {
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

    fn emit_upto(&mut self, end: usize, emit: &mut dyn FnMut(&str) -> StageResult) -> StageResult {
        let sentence: String = self.buf.drain(..end).collect();
        let s = sentence.trim();
        if !s.is_empty() {
            self.emitted = true;
            emit(s)?;
        }
        Ok(())
    }

    /// Append a piece of text.
    pub(crate) fn push(&mut self, text: &str) {
        self.buf.push_str(text);
    }

    /// Bytes buffered (not yet emitted).
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Drop what is buffered; the next piece is a turn's first again.
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.emitted = false;
    }

    /// Hand every complete sentence to `emit`, then cut what has grown past
    /// `max_chars`; what is left waits for more text.
    pub(crate) fn drain(&mut self, emit: &mut dyn FnMut(&str) -> StageResult) -> StageResult {
        if self.word_cuts {
            return self.drain_bounded(emit);
        }
        loop {
            let end = match self.sentence_end() {
                // A whole sentence, unless an earlier first clause qualifies.
                Some(end) => Some(self.clause_end().map_or(end, |c| c.min(end))),
                None => self.clause_end(),
            };
            let Some(end) = end else { break };
            self.emit_upto(end, emit)?;
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
            self.emit_upto(cut, emit)?;
        }
        Ok(())
    }

    /// [`Self::drain`] for whole texts (read in large chunks, not token by
    /// token): no emitted piece is longer than `max_chars`; a longer
    /// sentence is cut at the last word boundary before the limit.
    fn drain_bounded(&mut self, emit: &mut dyn FnMut(&str) -> StageResult) -> StageResult {
        loop {
            // Leading blanks are not part of the next piece (and must not
            // count towards its limit).
            let blank = self.buf.len() - self.buf.trim_start().len();
            self.buf.drain(..blank);
            // Byte index of character number `max_chars`, when the buffer
            // has more characters than that.
            let limit = if self.buf.len() <= self.max_chars {
                None
            } else {
                self.buf.char_indices().nth(self.max_chars).map(|(i, _)| i)
            };
            match (self.sentence_end(), limit) {
                (Some(end), Some(limit)) if end > limit => {
                    let cut = word_cut(&self.buf, limit);
                    self.emit_upto(cut, emit)?;
                }
                (Some(end), _) => self.emit_upto(end, emit)?,
                (None, Some(limit)) => {
                    let cut = word_cut(&self.buf, limit);
                    self.emit_upto(cut, emit)?;
                }
                (None, None) => return Ok(()),
            }
        }
    }

    /// Emit what is buffered; the turn is over, so the next piece is a
    /// turn's first again.
    pub(crate) fn flush(&mut self, emit: &mut dyn FnMut(&str) -> StageResult) -> StageResult {
        let rest = std::mem::take(&mut self.buf);
        let rest = rest.trim();
        if !rest.is_empty() {
            emit(rest)?;
        }
        self.emitted = false;
        Ok(())
    }
}

/// The `sentence_chunker` stage: a [`SentenceSplitter`] per turn.
///
/// The end-of-answer Flush comes on its own edge, so it can overtake the
/// answer's last pieces (the stage reads its inputs in turn, and across
/// parts they are separate zenoh keys). An answer's pieces and its Flush
/// carry the same capture time (the user turn's, which the thinker
/// stamps them with), so a piece stamped like the last Flush is a late
/// piece of an answer that has ended: it is emitted at once rather than
/// held for a sentence end that will not come.
pub(crate) struct SentenceChunker {
    split: SentenceSplitter,
    epoch: Option<Epoch>,
    /// Capture time of the last Flush of this epoch.
    flushed: Option<Timestamp>,
}

impl Stage for SentenceChunker {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        if self.epoch.is_some_and(|e| e != input.msg.epoch) {
            // A new turn: what was buffered belongs to an ended turn.
            self.split.clear();
            self.flushed = None;
        }
        self.epoch = Some(input.msg.epoch);
        let mut emit = |s: &str| ctx.emit(0, Payload::text(s));
        match (&input.msg.payload, input.port) {
            (Payload::Text(t), _) => {
                self.split.push(t);
                if self.flushed == Some(input.msg.timestamp) {
                    // A piece that its answer's Flush overtook.
                    self.split.flush(&mut emit)
                } else {
                    self.split.drain(&mut emit)
                }
            }
            (Payload::Event(e), _) if matches!(**e, Event::Flush) => {
                self.flushed = Some(input.msg.timestamp);
                self.split.flush(&mut emit)
            }
            _ => Ok(()),
        }
    }

    fn reset(&mut self, epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        if self.epoch == Some(epoch) {
            self.split.clear();
            self.flushed = None;
        }
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        self.split
            .flush(&mut |s: &str| ctx.emit(0, Payload::text(s)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use crate::Pipeline;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// `n` sentences of text made on the fly (never held whole), counting
    /// the bytes handed out.
    struct Generated {
        next: usize,
        n: usize,
        pending: Vec<u8>,
        read: Arc<AtomicU64>,
    }

    impl Generated {
        fn new(n: usize, read: Arc<AtomicU64>) -> Self {
            Generated {
                next: 0,
                n,
                pending: Vec::new(),
                read,
            }
        }
    }

    fn sentence(i: usize) -> String {
        format!("This is sentence {i}, with a clause.")
    }

    impl Read for Generated {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            while self.pending.len() < buf.len() && self.next < self.n {
                self.pending
                    .extend_from_slice(sentence(self.next).as_bytes());
                self.pending
                    .push(if self.next % 7 == 6 { b'\n' } else { b' ' });
                self.next += 1;
            }
            let k = buf.len().min(self.pending.len());
            buf[..k].copy_from_slice(&self.pending[..k]);
            self.pending.drain(..k);
            self.read.fetch_add(k as u64, Ordering::Relaxed);
            Ok(k)
        }
    }

    #[test]
    fn stdin_text_holds_one_chunk_and_one_sentence() {
        let n = 30_000; // ~1 MB
        let read = Arc::new(AtomicU64::new(0));
        let mut t = StdinText::new(Box::new(Generated::new(n, read.clone())), true, 200);
        let mut got = 0usize;
        let mut peak = 0usize;
        loop {
            let more = t
                .step(&mut |s: &str| {
                    assert_eq!(s, sentence(got));
                    got += 1;
                    Ok(())
                })
                .unwrap();
            peak = peak.max(t.sentences.buffered());
            if !more {
                break;
            }
        }
        assert!(read.load(Ordering::Relaxed) > 1_000_000);
        assert_eq!(got, n);
        assert!(
            peak < 200,
            "at most one unfinished sentence is held, held {peak}"
        );
    }

    #[test]
    fn long_sentences_and_lines_are_cut_at_word_boundaries() {
        let text = format!(
            "{} end.\nshort\n\n{}\n",
            "word ".repeat(100),
            "x".repeat(25)
        );
        let pieces = |by_sentence: bool| {
            let mut t = StdinText::new(
                Box::new(std::io::Cursor::new(text.clone())),
                by_sentence,
                20,
            );
            let mut out: Vec<String> = Vec::new();
            while t
                .step(&mut |s: &str| {
                    out.push(s.to_string());
                    Ok(())
                })
                .unwrap()
            {}
            out
        };
        for by_sentence in [true, false] {
            let mut out = pieces(by_sentence);
            // A single word longer than the limit is cut at the limit.
            let long = out.split_off(out.len() - 2);
            assert_eq!(long, ["x".repeat(20), "x".repeat(5)], "{out:?}");
            let words: Vec<&str> = out.iter().flat_map(|p| p.split_whitespace()).collect();
            let want: Vec<&str> = text.split_whitespace().collect();
            assert_eq!(
                words,
                want[..want.len() - 1],
                "every word whole, in order: {out:?}"
            );
            for p in &out {
                assert!(p.chars().count() <= 20, "{p:?}");
            }
        }
        // Lines keep their breaks; an empty line sends nothing.
        assert!(pieces(false).contains(&"short".to_string()));
    }

    #[test]
    fn a_sequence_split_across_reads_and_bad_utf8() {
        /// Hands out one byte per read.
        struct Trickle(std::io::Cursor<Vec<u8>>);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let k = buf.len().min(1);
                self.0.read(&mut buf[..k])
            }
        }
        let run = |bytes: Vec<u8>| {
            let mut t = StdinText::new(Box::new(Trickle(std::io::Cursor::new(bytes))), true, 100);
            let mut out: Vec<String> = Vec::new();
            loop {
                match t.step(&mut |s: &str| {
                    out.push(s.to_string());
                    Ok(())
                }) {
                    Ok(true) => {}
                    Ok(false) => return Ok(out),
                    Err(e) => return Err(e.to_string()),
                }
            }
        };
        let out = run("Grüße aus Köln… Ça va? Très bien.".as_bytes().to_vec()).unwrap();
        assert_eq!(out, ["Grüße aus Köln…", "Ça va?", "Très bien."]);
        let err = run(b"ok \xff\xfe more".to_vec()).unwrap_err();
        assert!(
            err.contains("not UTF-8") && err.contains("offset 3"),
            "{err}"
        );
        let err = run(b"cut \xc3".to_vec()).unwrap_err();
        assert!(err.contains("not UTF-8"), "{err}");
    }

    /// A `text` source whose input is a test reader instead of stdin.
    struct GeneratedKind(Mutex<Option<Generated>>);

    impl StageFactory for GeneratedKind {
        fn info(&self) -> StageInfo {
            StageInfo {
                kind: "generated_text",
                ..TextKind.info()
            }
        }

        fn build(&self, _p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
            let g = self.0.lock().unwrap().take().unwrap();
            Ok(Box::new(TextSource {
                text: String::new(),
                whole: true,
                input: Some(StdinText::new(Box::new(g), true, TEXT_MAX_CHARS)),
                done: false,
            }))
        }
    }

    /// Through a pipeline: a consumer that stops pulling stops the reading
    /// (backpressure reaches the input), and every sentence arrives.
    #[test]
    fn a_slow_consumer_holds_the_reading_back() {
        let n = 30_000;
        let read = Arc::new(AtomicU64::new(0));
        let mut r = Registry::builtin();
        r.register(GeneratedKind(Mutex::new(Some(Generated::new(
            n,
            read.clone(),
        )))));
        let yaml = "stages:\n  - { id: t, kind: generated_text }\n  - { id: out, kind: host_out, params: { type: text, capacity: 1 } }\nedges:\n  - { from: t.out, to: out.in, capacity: 1 }\n";
        let running = Pipeline::from_yaml(yaml, &r).unwrap().start().unwrap();
        let first = running
            .pull("out", Duration::from_secs(10))
            .unwrap()
            .unwrap();
        assert_eq!(first.payload.as_text(), Some(sentence(0).as_str()));
        std::thread::sleep(Duration::from_millis(300));
        let ahead = read.load(Ordering::Relaxed);
        assert!(
            ahead <= 2 * READ_CHUNK as u64,
            "read {ahead} bytes ahead of a consumer that took one sentence"
        );
        let mut got = 1;
        while let Some(m) = running.pull("out", Duration::from_secs(30)).unwrap() {
            assert_eq!(m.payload.as_text(), Some(sentence(got).as_str()));
            got += 1;
        }
        assert_eq!(got, n);
        running.wait(Some(Duration::from_secs(10))).unwrap();
    }

    /// The answer's Flush overtakes its last pieces (separate edges): the
    /// late pieces (stamped like the Flush) are still spoken, at once, not
    /// held for the next turn; the next answer (another stamp, same epoch)
    /// is cut into sentences as usual.
    #[test]
    fn pieces_overtaken_by_their_answers_flush_are_emitted_at_once() {
        use crate::Message;
        let r = Registry::builtin();
        let yaml = "stages:\n  - { id: text, kind: host_in, params: { type: text } }\n  - { id: done, kind: host_in, params: { type: control } }\n  - { id: s, kind: sentence_chunker }\n  - { id: out, kind: host_out, params: { type: text } }\nedges:\n  - { from: text.out, to: s.in }\n  - { from: done.out, to: s.flush }\n  - { from: s.out, to: out.in }\n";
        let running = Pipeline::from_yaml(yaml, &r).unwrap().start().unwrap();
        let epoch = running.current_epoch();
        let answer = |ts: Timestamp, p: Payload| {
            let mut m = Message::new(epoch, p);
            m.timestamp = ts;
            m
        };
        let turn1 = Timestamp::now();
        let pull = || {
            running
                .pull("out", Duration::from_secs(10))
                .unwrap()
                .unwrap()
        };
        running
            .push_msg(
                "text",
                answer(turn1, Payload::text("The capital of France")),
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        running
            .push_msg("done", answer(turn1, Payload::event(Event::Flush)))
            .unwrap();
        assert_eq!(pull().payload.as_text(), Some("The capital of France"));
        // The overtaken tail of the same answer: out at once.
        running
            .push_msg("text", answer(turn1, Payload::text(" is Paris.")))
            .unwrap();
        assert_eq!(pull().payload.as_text(), Some("is Paris."));
        // The next answer in the same epoch: sentences as usual.
        let turn2 = Timestamp::now();
        running
            .push_msg(
                "text",
                answer(turn2, Payload::text("Rome is the capital of Italy. And")),
            )
            .unwrap();
        assert_eq!(
            pull().payload.as_text(),
            Some("Rome is the capital of Italy.")
        );
        assert!(running
            .pull("out", Duration::from_millis(200))
            .unwrap_or(None)
            .is_none());
        running.stop();
        let _ = running.wait(Some(Duration::from_secs(10)));
    }
}
