//! Small audio utilities: `gain`, `channel_mix` and `chunker`.

use crate::error::Error;
use edgeflow_graph::{
    AudioChunk, BuildEnv, Epoch, Input, ParamInfo, ParamType, Params, Payload, PortSpec, PortType,
    Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult,
};

fn audio_of<'a>(input: &'a Input, ctx: &StageCtx, kind: &str) -> StageResult<&'a AudioChunk> {
    input.msg.payload.as_audio().ok_or_else(|| {
        StageError::msg(format!(
            "{kind} `{}` got a {} message; it takes audio",
            ctx.id(),
            input.msg.payload.type_name()
        ))
    })
}

fn audio_ports(out_channels: Option<u16>, out_doc: &str) -> Ports {
    Ports {
        inputs: vec![PortSpec::new("in", PortType::AUDIO_ANY, "audio")],
        outputs: vec![PortSpec::new(
            "out",
            PortType::Audio {
                sample_rate: None,
                channels: out_channels,
            },
            out_doc,
        )],
    }
}

// ---------------------------------------------------------------- gain

/// The `gain` stage kind.
#[derive(Debug)]
pub struct GainKind;

impl StageFactory for GainKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "gain",
            doc: "Multiplies audio by a fixed gain given in dB (no clipping: samples stay f32).",
            params: vec![ParamInfo::new(
                "db",
                ParamType::Float,
                0.0,
                "gain in dB (-120..=60); -6 halves the amplitude",
            )],
            ports: audio_ports(None, "the audio, scaled"),
            source: false,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let db: f64 = p.get_or("db", 0.0)?;
        if !(-120.0..=60.0).contains(&db) {
            return Err(p
                .error("db", format!("must be in -120..=60 dB, got {db}"))
                .into());
        }
        Ok(Box::new(Gain {
            factor: 10f64.powf(db / 20.0) as f32,
        }))
    }
}

/// The `gain` stage.
#[derive(Debug)]
pub struct Gain {
    factor: f32,
}

impl Stage for Gain {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let a = audio_of(&input, ctx, "gain")?;
        let samples = a.samples.iter().map(|s| s * self.factor).collect();
        ctx.emit(0, Payload::audio(a.sample_rate, a.channels, samples))
    }
}

// ---------------------------------------------------------------- channel_mix

/// Mix interleaved `input` of `from` channels to `to` channels: down-mixing
/// averages the source channels that fold onto each output (`i % to`),
/// up-mixing repeats them (`j % from`); mono to stereo duplicates.
pub fn mix_channels(input: &[f32], from: u16, to: u16) -> Vec<f32> {
    let (from, to) = (from.max(1) as usize, to.max(1) as usize);
    if from == to {
        return input.to_vec();
    }
    let frames = input.len() / from;
    let mut out = vec![0f32; frames * to];
    if to < from {
        // Number of sources folding onto each output channel.
        let counts: Vec<f32> = (0..to).map(|j| (from - j).div_ceil(to) as f32).collect();
        for f in 0..frames {
            let src = &input[f * from..(f + 1) * from];
            let dst = &mut out[f * to..(f + 1) * to];
            for (i, s) in src.iter().enumerate() {
                dst[i % to] += s;
            }
            for (d, c) in dst.iter_mut().zip(&counts) {
                *d /= c;
            }
        }
    } else {
        for f in 0..frames {
            for j in 0..to {
                out[f * to + j] = input[f * from + j % from];
            }
        }
    }
    out
}

/// The `channel_mix` stage kind.
#[derive(Debug)]
pub struct ChannelMixKind;

fn mix_target(p: &Params) -> StageResult<u16> {
    let ch: u16 = p.get("channels")?;
    if !(1..=64).contains(&ch) {
        return Err(p
            .error("channels", format!("must be in 1..=64, got {ch}"))
            .into());
    }
    Ok(ch)
}

impl StageFactory for ChannelMixKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "channel_mix",
            doc: "Converts audio to N channels: down-mix averages (stereo -> mono = (L+R)/2), up-mix repeats (mono -> stereo duplicates).",
            params: vec![ParamInfo::required("channels", ParamType::Int, "output channel count (1..=64)")],
            ports: audio_ports(None, "audio with `channels` channels"),
            source: false,
        }
    }

    fn ports(&self, p: &Params, _env: &BuildEnv) -> StageResult<Ports> {
        Ok(audio_ports(
            Some(mix_target(p)?),
            "audio with `channels` channels",
        ))
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        Ok(Box::new(ChannelMix { to: mix_target(p)? }))
    }
}

/// The `channel_mix` stage.
#[derive(Debug)]
pub struct ChannelMix {
    to: u16,
}

impl Stage for ChannelMix {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let a = audio_of(&input, ctx, "channel_mix")?;
        if a.channels == self.to {
            return ctx.emit_msg(0, input.msg);
        }
        let samples = mix_channels(&a.samples, a.channels, self.to);
        ctx.emit(0, Payload::audio(a.sample_rate, self.to, samples))
    }
}

// ---------------------------------------------------------------- chunker

/// The `chunker` stage kind.
#[derive(Debug)]
pub struct ChunkerKind;

impl StageFactory for ChunkerKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "chunker",
            doc: "Re-cuts audio into fixed-size chunks of `frames` new frames, each optionally preceded by `left_context` frames of the audio before it (zeros before the stream start), so every chunk has frames + left_context frames. The last chunk is zero-padded to full size unless `pad_last` is false.",
            params: vec![
                ParamInfo::required("frames", ParamType::Int, "new frames per chunk (>= 1)"),
                ParamInfo::new("left_context", ParamType::Int, 0, "frames of preceding audio repeated at the start of each chunk"),
                ParamInfo::new("pad_last", ParamType::Bool, true, "zero-pad the final partial chunk to full size (false: emit it short)"),
            ],
            ports: audio_ports(None, "fixed-size chunks"),
            source: false,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let frames: usize = p.get("frames")?;
        if !(1..=10_000_000).contains(&frames) {
            return Err(p
                .error("frames", format!("must be in 1..=10000000, got {frames}"))
                .into());
        }
        let left: usize = p.get_or("left_context", 0)?;
        if left > 10_000_000 {
            return Err(p
                .error(
                    "left_context",
                    format!("must be at most 10000000, got {left}"),
                )
                .into());
        }
        Ok(Box::new(Chunker::new(
            frames,
            left,
            p.get_or("pad_last", true)?,
        )))
    }
}

/// Fixed-size re-chunking with left context (usable outside a pipeline).
#[derive(Debug)]
pub struct Chunker {
    frames: usize,
    left: usize,
    pad_last: bool,
    format: Option<(u32, u16)>,
    /// Interleaved: `left` frames of context followed by new frames.
    buf: Vec<f32>,
}

impl Chunker {
    /// `frames` new frames per chunk, `left` frames of context, zero-pad the
    /// last chunk when `pad_last`.
    pub fn new(frames: usize, left: usize, pad_last: bool) -> Self {
        Chunker {
            frames,
            left,
            pad_last,
            format: None,
            buf: Vec::new(),
        }
    }

    /// Add audio; returns the complete chunks (interleaved).
    pub fn push(&mut self, samples: &[f32], channels: u16) -> Vec<Vec<f32>> {
        let ch = channels.max(1) as usize;
        if self.buf.is_empty() {
            self.buf = vec![0.0; self.left * ch];
        }
        self.buf.extend_from_slice(samples);
        let size = (self.left + self.frames) * ch;
        let step = self.frames * ch;
        let mut out = Vec::new();
        let mut pos = 0;
        while self.buf.len() - pos >= size {
            out.push(self.buf[pos..pos + size].to_vec());
            pos += step;
        }
        self.buf.drain(..pos);
        out
    }

    /// End of stream: the last partial chunk, if any new frames are left.
    pub fn flush(&mut self, channels: u16) -> Option<Vec<f32>> {
        let ch = channels.max(1) as usize;
        let ctx = self.left * ch;
        let has_new = self.buf.len() > ctx;
        let mut last = std::mem::take(&mut self.buf);
        if !has_new {
            return None;
        }
        if self.pad_last {
            last.resize((self.left + self.frames) * ch, 0.0);
        }
        Some(last)
    }

    /// Drop everything buffered (new stream).
    pub fn reset(&mut self) {
        self.buf.clear();
        self.format = None;
    }
}

impl Stage for Chunker {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let a = audio_of(&input, ctx, "chunker")?;
        let fmt = (a.sample_rate, a.channels);
        if let Some(old) = self.format.filter(|f| *f != fmt) {
            // A new format starts a new stream; the old one ends here.
            if let Some(last) = self.flush(old.1) {
                ctx.emit(0, Payload::audio(old.0, old.1, last))?;
            }
        }
        self.format = Some(fmt);
        if a.samples.len() % a.channels.max(1) as usize != 0 {
            return Err(Error::Format(format!(
                "chunker `{}`: {} samples is not a whole number of {}-channel frames",
                ctx.id(),
                a.samples.len(),
                a.channels
            ))
            .into());
        }
        for c in self.push(&a.samples, a.channels) {
            ctx.emit(0, Payload::audio(a.sample_rate, a.channels, c))?;
        }
        Ok(())
    }

    fn reset(&mut self, _epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        Chunker::reset(self);
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        if let Some((rate, ch)) = self.format {
            if let Some(last) = self.flush(ch) {
                ctx.emit(0, Payload::audio(rate, ch, last))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn channel_mix_rules() {
        assert_eq!(mix_channels(&[1.0, 3.0, -1.0, 1.0], 2, 1), vec![2.0, 0.0]);
        assert_eq!(
            mix_channels(&[0.5, -0.25], 1, 2),
            vec![0.5, 0.5, -0.25, -0.25]
        );
        // 3 -> 2: out0 = (c0 + c2) / 2, out1 = c1.
        assert_eq!(mix_channels(&[1.0, 2.0, 3.0], 3, 2), vec![2.0, 2.0]);
        // 2 -> 3: c0, c1, c0.
        assert_eq!(mix_channels(&[1.0, 2.0], 2, 3), vec![1.0, 2.0, 1.0]);
    }

    #[test]
    fn chunker_sizes_context_and_continuity() {
        let x: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let mut c = Chunker::new(160, 40, true);
        let mut chunks = Vec::new();
        for piece in x.chunks(37) {
            chunks.extend(c.push(piece, 1));
        }
        chunks.extend(c.flush(1));
        assert_eq!(chunks.len(), 7); // ceil(1000 / 160)
        for (k, ch) in chunks.iter().enumerate() {
            assert_eq!(ch.len(), 200);
            for (i, v) in ch.iter().enumerate() {
                let t = (k * 160 + i) as isize - 40;
                let want = if (0..1000).contains(&t) {
                    t as f32
                } else {
                    0.0
                };
                assert_eq!(*v, want, "chunk {k} sample {i}");
            }
        }
        // No padding: last chunk is short; stereo frames stay whole.
        let mut c = Chunker::new(4, 0, false);
        let st: Vec<f32> = (0..20).map(|i| i as f32).collect();
        let got = c.push(&st, 2);
        assert_eq!(got.len(), 2);
        assert_eq!(got[1], (8..16).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(c.flush(2), Some(vec![16.0, 17.0, 18.0, 19.0]));
        assert_eq!(c.flush(2), None);
    }
}
