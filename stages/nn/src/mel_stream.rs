//! Vocoding a mel spectrogram that arrives in pieces ([`MelStream`]),
//! chunk by chunk with left / right context, for any [`MelVocoder`]
//! (HiFi-GAN in `edgeflow-vocoder`, BigVGAN in `edgeflow-omni`).

use crate::Error;
use edgeflow_runtime::{DType, Device, Tensor};

/// A runtime result as the model's error type.
fn rt<T, E: From<Error>>(r: edgeflow_runtime::Result<T>) -> std::result::Result<T, E> {
    r.map_err(|e| E::from(Error::from(e)))
}

/// A bad-input error as the model's error type.
fn bad<E: From<Error>>(msg: String) -> E {
    E::from(Error::BadInput(msg))
}

/// A model that vocodes a window of mel frames into `hop` samples per
/// frame: what [`MelStream`] drives (HiFi-GAN, BigVGAN, ...).
pub trait MelVocoder {
    /// The model crate's error type (this crate's converts into it).
    type Error: From<Error>;
    /// Mel bins per frame.
    fn mel_bins(&self) -> usize;
    /// Audio samples per frame.
    fn samples_per_frame(&self) -> usize;
    /// The device the model's inputs go to.
    fn device(&self) -> &Device;
    /// Audio of `mel[1, bins, frames]`: `frames * hop` samples.
    fn vocode(&self, mel: &Tensor) -> std::result::Result<Vec<f32>, Self::Error>;
}

/// Vocodes a mel spectrogram that arrives in pieces: [`MelStream::push`]
/// takes frames and returns, through `sink`, the audio of every whole chunk
/// whose right context has arrived; [`MelStream::finish`] the rest. Each
/// chunk is vocoded with up to `left` frames before it and `right` after
/// it, whose audio is then dropped.
///
/// With `left` and `right` at least the model's receptive field (in mel
/// frames, each side) the joined audio equals vocoding the whole
/// spectrogram at once, up to float rounding. Smaller contexts trade
/// exactness near chunk edges for less recomputation and latency (a right
/// context of `r` frames delays each chunk by `r` frames); MNN runs
/// Qwen2.5-Omni's vocoder with 8 / 8.
#[derive(Debug, Clone)]
pub struct MelStream {
    n_mels: usize,
    chunk: usize,
    left: usize,
    right: usize,
    /// Buffered frames, time-major (`frame * n_mels + bin`), from `base`.
    frames: Vec<f32>,
    base: usize,
    /// Frames vocoded so far.
    done: usize,
}

impl MelStream {
    /// A stream of `mel_bins`-bin frames vocoded `chunk` frames at a time
    /// with `left` / `right` frames of context.
    pub fn new(mel_bins: usize, chunk: usize, left: usize, right: usize) -> crate::Result<Self> {
        if chunk == 0 || mel_bins == 0 {
            return Err(bad(format!(
                "a mel stream needs at least one frame per chunk and one mel bin, got chunk \
                 {chunk} and {mel_bins} bins"
            )));
        }
        Ok(MelStream {
            n_mels: mel_bins,
            chunk,
            left,
            right,
            frames: Vec::new(),
            base: 0,
            done: 0,
        })
    }

    /// Frames received so far.
    pub fn received(&self) -> usize {
        self.base + self.frames.len() / self.n_mels
    }

    /// Frames vocoded so far.
    pub fn vocoded(&self) -> usize {
        self.done
    }

    /// Forget everything (a new utterance, or a cancel).
    pub fn reset(&mut self) {
        self.frames.clear();
        self.base = 0;
        self.done = 0;
    }

    /// Add `mel` (`[mel_bins, t]` or `[1, mel_bins, t]`, frames last) and
    /// vocode every chunk whose right context has arrived; `sink` gets each
    /// chunk's samples and returns `false` to stop (a cancel).
    pub fn push<M: MelVocoder + ?Sized>(
        &mut self,
        model: &M,
        mel: &Tensor,
        sink: &mut dyn FnMut(Vec<f32>) -> std::result::Result<bool, M::Error>,
    ) -> std::result::Result<(), M::Error> {
        if model.mel_bins() != self.n_mels {
            return Err(bad(format!(
                "this stream was made for {} mel bins, the model takes {}",
                self.n_mels,
                model.mel_bins()
            )));
        }
        let d = mel.dims().to_vec();
        let t = match d.as_slice() {
            [c, t] | [1, c, t] if *c == self.n_mels => *t,
            _ => {
                return Err(bad(format!(
                    "the vocoder takes mel frames [{n}, frames] or [1, {n}, frames], got {d:?}",
                    n = self.n_mels
                )))
            }
        };
        let v = rt::<_, M::Error>(model.device().to_host(mel))?;
        let v = if v.dtype() == DType::F32 {
            v
        } else {
            rt::<_, M::Error>(model.device().host().cast(&v, DType::F32))?
        };
        let v = rt::<_, M::Error>(v.to_vec_f32())?;
        let start = self.frames.len();
        self.frames.resize(start + t * self.n_mels, 0.0);
        for c in 0..self.n_mels {
            for (j, &x) in v[c * t..(c + 1) * t].iter().enumerate() {
                self.frames[start + j * self.n_mels + c] = x;
            }
        }
        while self.done + self.chunk + self.right <= self.received() {
            let to = self.done + self.chunk;
            if !self.vocode(model, to, sink)? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Vocode the frames left (the end of the spectrogram: no right
    /// context beyond it), then start over.
    pub fn finish<M: MelVocoder + ?Sized>(
        &mut self,
        model: &M,
        sink: &mut dyn FnMut(Vec<f32>) -> std::result::Result<bool, M::Error>,
    ) -> std::result::Result<(), M::Error> {
        let end = self.received();
        while self.done < end {
            let to = (self.done + self.chunk).min(end);
            if !self.vocode(model, to, sink)? {
                break;
            }
        }
        self.reset();
        Ok(())
    }

    /// Vocode `[done, to)` from the buffered frames with its context; drop
    /// frames no later chunk needs.
    fn vocode<M: MelVocoder + ?Sized>(
        &mut self,
        model: &M,
        to: usize,
        sink: &mut dyn FnMut(Vec<f32>) -> std::result::Result<bool, M::Error>,
    ) -> std::result::Result<bool, M::Error> {
        let from = self.done;
        let lo = from.saturating_sub(self.left).max(self.base);
        let hi = (to + self.right).min(self.received());
        let n = self.n_mels;
        let len = hi - lo;
        let mut cm = vec![0f32; n * len];
        for j in 0..len {
            let f = &self.frames[(lo - self.base + j) * n..(lo - self.base + j + 1) * n];
            for (c, &x) in f.iter().enumerate() {
                cm[c * len + j] = x;
            }
        }
        let audio = model.vocode(&rt::<_, M::Error>(Tensor::from_vec(cm, &[1, n, len]))?)?;
        let hop = model.samples_per_frame();
        let (a, b) = ((from - lo) * hop, (to - lo) * hop);
        let Some(piece) = audio.get(a..b) else {
            return Err(bad(format!(
                "the vocoder returned {} samples for {len} frames, expected {}",
                audio.len(),
                len * hop
            )));
        };
        let piece = piece.to_vec();
        self.done = to;
        let keep_from = self.done.saturating_sub(self.left).max(self.base);
        self.frames.drain(..(keep_from - self.base) * n);
        self.base = keep_from;
        sink(piece)
    }
}
