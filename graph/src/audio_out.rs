//! [`AudioOut`]: how a stage that synthesises audio (a vocoder, a TTS
//! voice) streams it out and measures it, so every such stage records the
//! same metrics the same way.

use crate::{Payload, StageCtx, StageError, StageResult, Timestamp};
use std::time::{Duration, Instant};

/// Streams the mono audio chunks a model produces out of one output port
/// and measures the utterance they belong to:
///
/// - `time_to_first_audio_ms`: from the capture time given to
///   [`AudioOut::start_utterance`] (the utterance's first input) to its
///   first chunk out;
/// - `rtf` (compute time over audio time) and `audio_s`, at
///   [`AudioOut::end_utterance`], over everything streamed since the last
///   end.
///
/// [`AudioOut::stream`] hands the producer a sink that stops it (returns
/// `false`) on a cancel or when the edge refuses the chunk; the refusal is
/// then the stream's error.
///
/// ```text
/// fn run(&mut self, ctx: &mut StageCtx, mel: Option<&Tensor>) -> StageResult {
///     let (model, stream) = (&self.model, &mut self.stream);
///     self.out.stream(ctx, |sink| match mel {
///         Some(m) => stream.push(model, m, sink),
///         None => stream.finish(model, sink),
///     })?;
///     if mel.is_none() {
///         self.out.end_utterance(ctx);
///     }
///     ctx.check()
/// }
/// ```
#[derive(Debug)]
pub struct AudioOut {
    port: usize,
    sample_rate: u32,
    /// Capture time of the utterance's first input, until its first audio.
    first_input: Option<Timestamp>,
    compute: Duration,
    samples: usize,
}

impl AudioOut {
    /// Audio at `sample_rate` out of output `port`.
    pub fn new(port: usize, sample_rate: u32) -> Self {
        AudioOut {
            port,
            sample_rate,
            first_input: None,
            compute: Duration::ZERO,
            samples: 0,
        }
    }

    /// The output sample rate.
    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// An utterance's first input, captured at `t`: its first chunk out
    /// records `time_to_first_audio_ms` from `t`. A second call before
    /// that chunk keeps the first time.
    pub fn start_utterance(&mut self, t: Timestamp) {
        self.first_input.get_or_insert(t);
    }

    /// Run `produce`, which passes each chunk of samples it makes to the
    /// sink it is given and stops when the sink returns `false`; each chunk
    /// is emitted as mono audio. Its time counts as compute time.
    pub fn stream<E>(
        &mut self,
        ctx: &mut StageCtx,
        produce: impl FnOnce(&mut dyn FnMut(Vec<f32>) -> Result<bool, E>) -> Result<(), E>,
    ) -> StageResult
    where
        StageError: From<E>,
    {
        let started = Instant::now();
        let (port, rate) = (self.port, self.sample_rate);
        let first_input = &mut self.first_input;
        let mut samples = 0usize;
        let mut refused: Option<StageError> = None;
        let mut sink = |chunk: Vec<f32>| -> Result<bool, E> {
            if ctx.is_cancelled() {
                return Ok(false);
            }
            if let Some(t) = first_input.take() {
                ctx.record("time_to_first_audio_ms", t.elapsed().as_secs_f64() * 1000.0);
            }
            samples += chunk.len();
            match ctx.emit(port, Payload::audio(rate, 1, chunk)) {
                Ok(()) => Ok(true),
                Err(e) => {
                    refused = Some(e);
                    Ok(false)
                }
            }
        };
        let produced = produce(&mut sink);
        self.compute += started.elapsed();
        self.samples += samples;
        produced?;
        match refused {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// End of the utterance: records `rtf` and `audio_s` over what was
    /// streamed since the last end, when that was any audio (returns
    /// whether it was), and starts over.
    pub fn end_utterance(&mut self, ctx: &StageCtx) -> bool {
        let streamed = self.samples > 0;
        if streamed {
            let audio_s = self.samples as f64 / f64::from(self.sample_rate);
            ctx.record("rtf", self.compute.as_secs_f64() / audio_s);
            ctx.record("audio_s", audio_s);
        }
        self.reset();
        streamed
    }

    /// Forget the utterance in progress (a cancel's reset).
    pub fn reset(&mut self) {
        self.first_input = None;
        self.compute = Duration::ZERO;
        self.samples = 0;
    }
}
