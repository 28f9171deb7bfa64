//! WAV files: the `wav_source` and `wav_sink` stages, and helpers to read
//! and write whole files.
//!
//! Reading accepts integer PCM of 8, 16, 24 or 32 bits and 32-bit float, any
//! channel count (hound's formats); everything becomes interleaved f32 in
//! [-1, 1]. Writing goes to a temporary file in the target's folder that is
//! renamed over the target only when the stream ended normally, so a failed,
//! cancelled or killed run never leaves a half-written WAV behind.

use crate::error::{Error, Result};
use crate::resample::check_rate;
use edgeflow_graph::{
    BuildEnv, Epoch, Input, ParamInfo, ParamType, Params, Payload, Poll, PortSpec, PortType, Ports,
    Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use hound::{SampleFormat, WavReader, WavSpec, WavWriter};
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CONVERT_HINT: &str =
    "convert it to 16-bit PCM, e.g. `sox in.wav -e signed-integer -b 16 out.wav` \
                            or `ffmpeg -i in.wav -c:a pcm_s16le out.wav`";

/// Format of a WAV file as this crate reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WavInfo {
    /// Samples per second.
    pub sample_rate: u32,
    /// Interleaved channels.
    pub channels: u16,
    /// Frames the header declares.
    pub frames: u64,
    /// Bits per sample.
    pub bits: u16,
    /// Integer or float samples.
    pub float: bool,
}

/// A streaming WAV reader yielding interleaved f32.
pub struct WavFileReader {
    path: PathBuf,
    reader: WavReader<BufReader<File>>,
    info: WavInfo,
    scale: f32,
    read_frames: u64,
}

impl std::fmt::Debug for WavFileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WavFileReader")
            .field("path", &self.path)
            .field("info", &self.info)
            .finish()
    }
}

fn wav_err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Wav {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

impl WavFileReader {
    /// Open `path` and check its format.
    pub fn open(path: &Path) -> Result<Self> {
        let reader = WavReader::open(path).map_err(|e| match e {
            hound::Error::IoError(ioe) if ioe.kind() == std::io::ErrorKind::NotFound => {
                wav_err(path, "no such file: check the `path` param (relative paths are relative to the pipeline file)")
            }
            hound::Error::IoError(ioe) if ioe.kind() == std::io::ErrorKind::UnexpectedEof => {
                wav_err(path, format!("the file ends inside its header (truncated?): {ioe}; re-export or re-record it"))
            }
            hound::Error::IoError(ioe) => wav_err(path, format!("cannot read: {ioe}")),
            hound::Error::Unsupported => wav_err(
                path,
                format!("unsupported WAV encoding (compressed, 64-bit float or an unusual layout); {CONVERT_HINT}"),
            ),
            other => wav_err(path, format!("not a readable WAV file ({other}); {CONVERT_HINT}")),
        })?;
        let spec = reader.spec();
        let float = spec.sample_format == SampleFormat::Float;
        let scale = match (spec.sample_format, spec.bits_per_sample) {
            (SampleFormat::Float, 32) => 1.0,
            (SampleFormat::Int, b @ (8 | 16 | 24 | 32)) => 1.0 / (1u64 << (b - 1)) as f32,
            (fmt, b) => {
                return Err(wav_err(
                    path,
                    format!("unsupported sample format: {b}-bit {fmt:?}; {CONVERT_HINT}"),
                ))
            }
        };
        if spec.channels == 0 {
            return Err(wav_err(
                path,
                "the header declares 0 channels; the file is corrupt",
            ));
        }
        check_rate(spec.sample_rate, &path.display().to_string())?;
        let info = WavInfo {
            sample_rate: spec.sample_rate,
            channels: spec.channels,
            frames: reader.duration() as u64,
            bits: spec.bits_per_sample,
            float,
        };
        // hound trusts the header's data length; a file cut short is caught
        // here rather than as a surprise in the middle of a run.
        let data_bytes =
            info.frames * info.channels as u64 * (spec.bits_per_sample as u64).div_ceil(8);
        let file_len = std::fs::metadata(path)
            .map_err(|e| Error::Io {
                path: path.to_path_buf(),
                error: e,
            })?
            .len();
        if data_bytes > file_len {
            return Err(wav_err(
                path,
                format!(
                    "truncated: the header declares {} frames ({data_bytes} bytes of samples) but the file has only {file_len} bytes; \
                     the recording was cut short: re-export it, or repair the header with `sox in.wav out.wav`",
                    info.frames
                ),
            ));
        }
        Ok(WavFileReader {
            path: path.to_path_buf(),
            reader,
            info,
            scale,
            read_frames: 0,
        })
    }

    /// The file's format.
    pub fn info(&self) -> WavInfo {
        self.info
    }

    /// Read up to `frames` frames, appended to `out` as interleaved f32.
    /// Returns the number of frames read (0 at the end of the file).
    pub fn read(&mut self, frames: usize, out: &mut Vec<f32>) -> Result<usize> {
        let n = frames * self.info.channels as usize;
        let start = out.len();
        let path = &self.path;
        let map = |e: hound::Error| match e {
            hound::Error::IoError(ioe) => wav_err(
                path,
                format!("truncated or unreadable sample data ({ioe}); re-export the file"),
            ),
            other => wav_err(path, format!("bad sample data ({other})")),
        };
        if self.info.float {
            for s in self.reader.samples::<f32>().take(n) {
                out.push(s.map_err(map)?);
            }
        } else {
            let scale = self.scale;
            for s in self.reader.samples::<i32>().take(n) {
                out.push(s.map_err(map)? as f32 * scale);
            }
        }
        let got = out.len() - start;
        if !got.is_multiple_of(self.info.channels as usize) {
            return Err(wav_err(
                path,
                "the data ends in the middle of a frame (truncated); re-export the file",
            ));
        }
        let frames = got / self.info.channels as usize;
        self.read_frames += frames as u64;
        Ok(frames)
    }
}

/// Read a whole WAV file: (format, interleaved f32 samples).
pub fn read_wav(path: &Path) -> Result<(WavInfo, Vec<f32>)> {
    let mut r = WavFileReader::open(path)?;
    let info = r.info();
    let mut out = Vec::with_capacity((info.frames * info.channels as u64) as usize);
    while r.read(65_536, &mut out)? > 0 {}
    Ok((info, out))
}

/// Sample encoding of written WAV files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WavEncoding {
    /// 16-bit integer PCM (the most compatible).
    Pcm16,
    /// 24-bit integer PCM.
    Pcm24,
    /// 32-bit float.
    Float32,
}

impl WavEncoding {
    /// Parse `i16`, `i24` or `f32`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "i16" | "pcm16" => Some(WavEncoding::Pcm16),
            "i24" | "pcm24" => Some(WavEncoding::Pcm24),
            "f32" | "float" => Some(WavEncoding::Float32),
            _ => None,
        }
    }

    fn spec(self, sample_rate: u32, channels: u16) -> WavSpec {
        let (bits, fmt) = match self {
            WavEncoding::Pcm16 => (16, SampleFormat::Int),
            WavEncoding::Pcm24 => (24, SampleFormat::Int),
            WavEncoding::Float32 => (32, SampleFormat::Float),
        };
        WavSpec {
            channels,
            sample_rate,
            bits_per_sample: bits,
            sample_format: fmt,
        }
    }
}

/// A WAV file being written: it appears at its final path only on
/// [`AtomicWavWriter::commit`]; dropped without commit, nothing is left.
pub struct AtomicWavWriter {
    target: PathBuf,
    encoding: WavEncoding,
    writer: Option<WavWriter<BufWriter<File>>>,
    temp: Option<tempfile::TempPath>,
    sample_rate: u32,
    channels: u16,
    frames: u64,
}

impl std::fmt::Debug for AtomicWavWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtomicWavWriter")
            .field("target", &self.target)
            .field("frames", &self.frames)
            .finish()
    }
}

impl AtomicWavWriter {
    /// Start writing `target` (through a temporary file beside it).
    pub fn create(
        target: &Path,
        sample_rate: u32,
        channels: u16,
        encoding: WavEncoding,
    ) -> Result<Self> {
        check_rate(sample_rate, &target.display().to_string())?;
        if channels == 0 {
            return Err(wav_err(target, "cannot write audio with 0 channels"));
        }
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            return Err(wav_err(
                target,
                format!(
                    "the folder {} does not exist: create it or change `path`",
                    dir.display()
                ),
            ));
        }
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let prefix = format!(".{name}.");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".part");
        // Temp files are private (0600); the finished WAV should be an
        // ordinary file like any other output.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(std::fs::Permissions::from_mode(0o644));
        }
        let tmp = builder.tempfile_in(&dir).map_err(|e| Error::Io {
            path: dir.clone(),
            error: e,
        })?;
        let (file, temp) = tmp.into_parts();
        let writer = WavWriter::new(BufWriter::new(file), encoding.spec(sample_rate, channels))
            .map_err(|e| wav_err(target, format!("cannot start writing: {e}")))?;
        Ok(AtomicWavWriter {
            target: target.to_path_buf(),
            encoding,
            writer: Some(writer),
            temp: Some(temp),
            sample_rate,
            channels,
            frames: 0,
        })
    }

    /// Rate being written.
    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// Channels being written.
    pub fn channels(&self) -> u16 {
        self.channels
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Append interleaved samples (clipped to [-1, 1] for integer files).
    pub fn write(&mut self, samples: &[f32]) -> Result<()> {
        let target = &self.target;
        let Some(w) = self.writer.as_mut() else {
            return Err(wav_err(target, "already committed"));
        };
        let map = |e: hound::Error| wav_err(target, format!("write failed: {e} (disk full?)"));
        match self.encoding {
            WavEncoding::Pcm16 => {
                for &s in samples {
                    w.write_sample((s.clamp(-1.0, 1.0) * 32767.0).round() as i16)
                        .map_err(map)?;
                }
            }
            WavEncoding::Pcm24 => {
                for &s in samples {
                    w.write_sample((s.clamp(-1.0, 1.0) * 8_388_607.0).round() as i32)
                        .map_err(map)?;
                }
            }
            WavEncoding::Float32 => {
                for &s in samples {
                    w.write_sample(s).map_err(map)?;
                }
            }
        }
        self.frames += (samples.len() / self.channels as usize) as u64;
        Ok(())
    }

    /// Finish the file and move it to its final path.
    pub fn commit(mut self) -> Result<PathBuf> {
        let target = self.target.clone();
        if let Some(w) = self.writer.take() {
            w.finalize()
                .map_err(|e| wav_err(&target, format!("finishing the file failed: {e}")))?;
        }
        if let Some(t) = self.temp.take() {
            t.persist(&target).map_err(|e| Error::Io {
                path: target.clone(),
                error: e.error,
            })?;
        }
        Ok(target)
    }
}

/// Write a whole WAV file atomically.
pub fn write_wav(
    path: &Path,
    sample_rate: u32,
    channels: u16,
    encoding: WavEncoding,
    samples: &[f32],
) -> Result<()> {
    let mut w = AtomicWavWriter::create(path, sample_rate, channels, encoding)?;
    w.write(samples)?;
    w.commit()?;
    Ok(())
}

// ---------------------------------------------------------------- wav_source

/// The `wav_source` stage kind.
#[derive(Debug)]
pub struct WavSourceKind;

fn source_path(p: &Params, env: &BuildEnv) -> StageResult<PathBuf> {
    match p.path("path", env)? {
        Some(path) => Ok(path),
        None => Err(p.error("path", "is required: the WAV file to read").into()),
    }
}

impl StageFactory for WavSourceKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "wav_source",
            doc: "Streams a WAV file (8/16/24/32-bit PCM or 32-bit float, any channels) as f32 audio chunks at the file's rate; the output port declares that rate and channel count.",
            params: vec![
                ParamInfo::required("path", ParamType::Path, "WAV file to read"),
                ParamInfo::new("chunk_ms", ParamType::Float, 20.0, "chunk length in milliseconds (0.1..=10000)"),
                ParamInfo::new("realtime", ParamType::Bool, false, "pace chunks at the file's real-time rate, like a live source"),
            ],
            ports: Ports {
                inputs: vec![],
                outputs: vec![PortSpec::new("out", PortType::AUDIO_ANY, "the file's audio")],
            },
            source: true,
        }
    }

    fn ports(&self, p: &Params, env: &BuildEnv) -> StageResult<Ports> {
        let path = source_path(p, env)?;
        let info = WavFileReader::open(&path)?.info();
        Ok(Ports {
            inputs: vec![],
            outputs: vec![PortSpec::new(
                "out",
                PortType::Audio {
                    sample_rate: Some(info.sample_rate),
                    channels: Some(info.channels),
                },
                "the file's audio",
            )],
        })
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let path = source_path(p, env)?;
        let chunk_ms: f64 = p.get_or("chunk_ms", 20.0)?;
        if !(0.1..=10_000.0).contains(&chunk_ms) {
            return Err(p
                .error(
                    "chunk_ms",
                    format!("must be in 0.1..=10000, got {chunk_ms}"),
                )
                .into());
        }
        let reader = WavFileReader::open(&path)?;
        let info = reader.info();
        let chunk_frames = ((chunk_ms * info.sample_rate as f64 / 1000.0).round() as usize).max(1);
        Ok(Box::new(WavSource {
            reader,
            chunk_frames,
            realtime: p.get_or("realtime", false)?,
            started: None,
            emitted: 0,
        }))
    }
}

/// The `wav_source` stage.
#[derive(Debug)]
pub struct WavSource {
    reader: WavFileReader,
    chunk_frames: usize,
    realtime: bool,
    started: Option<Instant>,
    emitted: u64,
}

impl Stage for WavSource {
    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        if ctx.should_stop() {
            return Ok(Poll::Done);
        }
        let info = self.reader.info();
        if self.realtime {
            let start = *self.started.get_or_insert_with(Instant::now);
            let due =
                start + Duration::from_secs_f64(self.emitted as f64 / info.sample_rate as f64);
            if !ctx.sleep_until(due) {
                return Ok(if ctx.should_stop() {
                    Poll::Done
                } else {
                    Poll::Idle
                });
            }
        }
        let mut buf = Vec::with_capacity(self.chunk_frames * info.channels as usize);
        let n = self.reader.read(self.chunk_frames, &mut buf)?;
        if n == 0 {
            return Ok(Poll::Done);
        }
        self.emitted += n as u64;
        ctx.emit(0, Payload::audio(info.sample_rate, info.channels, buf))?;
        Ok(Poll::Continue)
    }
}

// ---------------------------------------------------------------- wav_sink

/// The `wav_sink` stage kind.
#[derive(Debug)]
pub struct WavSinkKind;

impl StageFactory for WavSinkKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "wav_sink",
            doc: "Writes the audio it receives to a WAV file. The file appears only when the stream ends normally (temp file + rename): a failed or stopped run leaves nothing, and cancelling an epoch discards what was recorded so far.",
            params: vec![
                ParamInfo::required("path", ParamType::Path, "WAV file to write (its folder must exist; an existing file is replaced)"),
                ParamInfo::new("format", ParamType::String, "i16", "sample encoding: i16, i24 or f32"),
            ],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::AUDIO_ANY, "audio of one rate and channel count")],
                outputs: vec![],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let Some(path) = p.path("path", env)? else {
            return Err(p.error("path", "is required: the WAV file to write").into());
        };
        let fmt: String = p.get_or("format", "i16".to_string())?;
        let Some(encoding) = WavEncoding::parse(&fmt) else {
            return Err(p
                .error(
                    "format",
                    format!("`{fmt}` is not a WAV encoding: use i16, i24 or f32"),
                )
                .into());
        };
        match path.parent() {
            Some(d) if !d.as_os_str().is_empty() && !d.is_dir() => {
                return Err(p
                    .error(
                        "path",
                        format!("the folder {} does not exist: create it first", d.display()),
                    )
                    .into())
            }
            _ => {}
        }
        Ok(Box::new(WavSink {
            path,
            encoding,
            writer: None,
        }))
    }
}

/// The `wav_sink` stage.
#[derive(Debug)]
pub struct WavSink {
    path: PathBuf,
    encoding: WavEncoding,
    writer: Option<AtomicWavWriter>,
}

impl Stage for WavSink {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let Some(a) = input.msg.payload.as_audio() else {
            return Err(StageError::msg(format!(
                "wav_sink `{}` got a {} message; it takes audio",
                ctx.id(),
                input.msg.payload.type_name()
            )));
        };
        let w = match self.writer.as_mut() {
            Some(w) => w,
            None => self.writer.insert(AtomicWavWriter::create(
                &self.path,
                a.sample_rate,
                a.channels,
                self.encoding,
            )?),
        };
        if w.sample_rate() != a.sample_rate || w.channels() != a.channels {
            return Err(Error::Format(format!(
                "wav_sink `{}`: the stream changed from {} Hz x{} to {} Hz x{}; a WAV file has one format: \
                 insert `resample` / `channel_mix` before it",
                ctx.id(),
                w.sample_rate(),
                w.channels(),
                a.sample_rate,
                a.channels
            ))
            .into());
        }
        w.write(&a.samples)?;
        Ok(())
    }

    fn reset(&mut self, _epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        // Dropping the writer deletes its temporary file.
        self.writer = None;
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        match self.writer.take() {
            Some(w) => {
                let frames = w.frames();
                let rate = w.sample_rate();
                w.commit()?;
                ctx.record("written_s", frames as f64 / rate as f64);
                Ok(())
            }
            None => Err(Error::Wav {
                path: self.path.clone(),
                msg: "no audio arrived before the end of the stream, so no file was written".into(),
            }
            .into()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Write;

    fn tone(frames: usize, channels: u16) -> Vec<f32> {
        (0..frames * channels as usize)
            .map(|i| {
                ((i / channels as usize) as f32 * 0.05).sin()
                    * 0.5
                    * if i % 2 == 0 { 1.0 } else { -1.0 }
            })
            .collect()
    }

    #[test]
    fn roundtrip_every_supported_encoding() {
        let dir = tempfile::tempdir().unwrap();
        for (bits, fmt, tol) in [
            (8u16, SampleFormat::Int, 1.0 / 128.0),
            (16, SampleFormat::Int, 1.0 / 32768.0),
            (24, SampleFormat::Int, 1e-6),
            (32, SampleFormat::Int, 1e-6),
            (32, SampleFormat::Float, 0.0),
        ] {
            for ch in [1u16, 2, 3] {
                let path = dir.path().join(format!("t{bits}{fmt:?}{ch}.wav"));
                let spec = WavSpec {
                    channels: ch,
                    sample_rate: 22_050,
                    bits_per_sample: bits,
                    sample_format: fmt,
                };
                let x = tone(1000, ch);
                let mut w = WavWriter::create(&path, spec).unwrap();
                for &s in &x {
                    match (fmt, bits) {
                        (SampleFormat::Float, _) => w.write_sample(s).unwrap(),
                        (_, 8) => w.write_sample((s * 127.0).round() as i8).unwrap(),
                        (_, 16) => w.write_sample((s * 32767.0).round() as i16).unwrap(),
                        (_, 24) => w.write_sample((s * 8_388_607.0).round() as i32).unwrap(),
                        _ => w
                            .write_sample((s as f64 * 2_147_483_647.0).round() as i32)
                            .unwrap(),
                    }
                }
                w.finalize().unwrap();
                let (info, y) = read_wav(&path).unwrap();
                assert_eq!(
                    (info.sample_rate, info.channels, info.frames),
                    (22_050, ch, 1000)
                );
                assert_eq!(y.len(), x.len());
                let worst = x
                    .iter()
                    .zip(&y)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst <= tol as f32 + 1e-7,
                    "{bits}-bit {fmt:?} x{ch}: error {worst}"
                );
            }
        }
    }

    #[test]
    fn atomic_writer_leaves_nothing_unless_committed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.wav");
        {
            let mut w = AtomicWavWriter::create(&target, 16_000, 1, WavEncoding::Pcm16).unwrap();
            w.write(&tone(500, 1)).unwrap();
            // Dropped without commit: a failure or cancel mid-write.
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "temp file left behind"
        );
        let mut w = AtomicWavWriter::create(&target, 16_000, 1, WavEncoding::Float32).unwrap();
        w.write(&tone(500, 1)).unwrap();
        assert!(!target.exists(), "target visible before commit");
        w.commit().unwrap();
        let (info, y) = read_wav(&target).unwrap();
        assert_eq!((info.frames, info.float), (500, true));
        assert_eq!(y, tone(500, 1));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn truncated_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.wav");
        write_wav(&path, 16_000, 1, WavEncoding::Pcm16, &tone(16_000, 1)).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let e = WavFileReader::open(&path).unwrap_err().to_string();
        assert!(e.contains("truncated") && e.contains("cut.wav"), "{e}");
        // Cut inside the header.
        std::fs::write(&path, &bytes[..20]).unwrap();
        let e = WavFileReader::open(&path).unwrap_err().to_string();
        assert!(e.contains("cut.wav"), "{e}");
    }

    #[test]
    fn unsupported_encodings_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        // A WAVE_FORMAT_ALAW (6) header: compressed, not PCM.
        let path = dir.path().join("alaw.wav");
        let mut f = File::create(&path).unwrap();
        let data = [0u8; 100];
        let mut h = Vec::new();
        h.extend_from_slice(b"RIFF");
        h.extend_from_slice(&(36u32 + data.len() as u32).to_le_bytes());
        h.extend_from_slice(b"WAVEfmt ");
        h.extend_from_slice(&16u32.to_le_bytes());
        h.extend_from_slice(&6u16.to_le_bytes()); // A-law
        h.extend_from_slice(&1u16.to_le_bytes());
        h.extend_from_slice(&8000u32.to_le_bytes());
        h.extend_from_slice(&8000u32.to_le_bytes());
        h.extend_from_slice(&1u16.to_le_bytes());
        h.extend_from_slice(&8u16.to_le_bytes());
        h.extend_from_slice(b"data");
        h.extend_from_slice(&(data.len() as u32).to_le_bytes());
        f.write_all(&h).unwrap();
        f.write_all(&data).unwrap();
        drop(f);
        let e = WavFileReader::open(&path).unwrap_err().to_string();
        assert!(e.contains("alaw.wav") && e.contains("sox"), "{e}");
        // Not a WAV at all.
        let path = dir.path().join("text.wav");
        std::fs::write(&path, b"hello, this is not audio at all").unwrap();
        let e = WavFileReader::open(&path).unwrap_err().to_string();
        assert!(e.contains("text.wav") && e.contains("WAV"), "{e}");
        // Missing.
        let e = WavFileReader::open(&dir.path().join("nope.wav"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no such file"), "{e}");
    }
}
