//! Silero VAD v6 (16 kHz) written against the edgeflow runtime.
//!
//! Per 512-sample window (32 ms) plus 64 samples of context carried over
//! from the previous window: reflect-pad 64 on the right, an STFT as a
//! strided convolution (n_fft 256, hop 128, 129 bins as real/imag rows),
//! magnitude, four 3-tap convolutions with ReLU (the last two of stride 2),
//! an LSTM cell (128) whose `(h, c)` is carried across windows, ReLU, a 1x1
//! convolution and a sigmoid. Weights are read under the names of
//! `silero_vad_16k.safetensors` (PyPI `silero-vad==6.2.3`); by default they
//! are those of the wheel's `silero_vad.onnx`, extracted by
//! [`crate::fetch`] (the safetensors file in the wheel is another
//! checkpoint of the same network).
//!
//! ## Speed
//! The network is tiny (about 0.7 M multiply-adds per window), so per-op
//! costs dominate. The window is framed on the host (it is built there
//! anyway), so the STFT is one matmul of `[4 frames, 256]` by the
//! basis; the convolutions run time-major (`[T, C]`) as one row gather
//! (im2col) and one linear each, against weights re-laid out at load as
//! contiguous `[O, 3C]` matrices (a convolution op would re-pack its
//! strided kernel on every call, which was most of the window's time). With
//! at most 4 rows, the CPU backend runs these linears as streaming GEMVs,
//! not through a GEMM's packing.

use crate::{Error, Result};
use edgeflow_nn::{Linear, VarBuilder};
use edgeflow_runtime::{Device, PadMode, Tensor, UnaryOp};

/// Samples per window at 16 kHz.
pub const WINDOW: usize = 512;
/// Samples of the previous window prepended to each window.
pub const CONTEXT: usize = 64;
/// The only sample rate this model takes.
pub const SAMPLE_RATE: u32 = 16_000;
/// Samples reflect-padded on the right of context + window.
const PAD: usize = 64;

/// The network's shape. The default is Silero VAD v6's 16 kHz branch (the
/// one the wheel's `silero_vad.onnx` holds); shapes are checked against
/// the weights on load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SileroConfig {
    /// LSTM width (128).
    pub hidden: usize,
    /// STFT size (256): `n_fft / 2 + 1` bins.
    pub n_fft: usize,
    /// STFT hop (128).
    pub hop: usize,
    /// Output channels and stride of each 3-tap convolution, in order; the
    /// first reads the bins, the last gives `hidden` channels.
    pub convs: Vec<(usize, usize)>,
}

impl Default for SileroConfig {
    fn default() -> Self {
        SileroConfig {
            hidden: 128,
            n_fft: 256,
            hop: 128,
            convs: vec![(128, 1), (64, 2), (64, 2), (128, 1)],
        }
    }
}

impl SileroConfig {
    /// Frequency bins of the STFT.
    pub fn bins(&self) -> usize {
        self.n_fft / 2 + 1
    }

    /// STFT frames per window: (64 + 512 + 64 reflect-padded - n_fft) / hop + 1.
    pub fn frames(&self) -> Result<usize> {
        let len = CONTEXT + WINDOW + PAD;
        if self.hop == 0 || self.n_fft == 0 || self.n_fft > len {
            return Err(Error::BadInput(format!(
                "Silero VAD: STFT n_fft {} / hop {} do not fit a {len}-sample frame",
                self.n_fft, self.hop
            )));
        }
        Ok((len - self.n_fft) / self.hop + 1)
    }
}

/// A 3-tap convolution (padding 1) in time-major form: `y[T_out, O] =
/// cols[T_out, 3C] @ w[O, 3C]^T + b`, where row `t` of `cols` is input rows
/// `t*stride - 1 ..= t*stride + 1` side by side (zero rows outside).
struct Conv {
    /// `w[o, k*C + c] = W[o, c, k]` of the PyTorch `[O, C, 3]` weight.
    lin: Linear,
    /// Rows of the zero-padded input `[T + 2, C]` that make `cols`, as
    /// `[T_out * 3]` indices (the input length is fixed per layer).
    idx: Tensor,
    /// Output steps and input channels.
    t_out: usize,
    c: usize,
}

/// The Silero VAD network and its streaming state (LSTM `h`, `c` and the
/// 64-sample context).
pub struct SileroVad {
    dev: Device,
    hidden: usize,
    bins: usize,
    n_fft: usize,
    hop: usize,
    frames: usize,
    stft: Linear,
    convs: Vec<Conv>,
    /// `[W_ih | W_hh]`, `[4h, 2h]`: one matmul for both LSTM inputs.
    lstm: Linear,
    fin: Linear,
    h: Tensor,
    c: Tensor,
    context: Vec<f32>,
}

impl std::fmt::Debug for SileroVad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SileroVad").finish_non_exhaustive()
    }
}

impl SileroVad {
    /// Load the weights under the PyTorch names (`stft_conv.weight`,
    /// `conv1..4.*`, `lstm_cell.*`, `final_conv.*`) from `vb` (the
    /// safetensors file: `VarBuilder::open(&[path], &dev)`) onto the device
    /// it carries.
    pub fn load(vb: &VarBuilder, cfg: &SileroConfig) -> Result<Self> {
        let dev = vb.device().clone();
        let (hidden, bins, n_fft) = (cfg.hidden, cfg.bins(), cfg.n_fft);
        let frames = cfg.frames()?;
        let stft = vb.get("stft_conv.weight", &[2 * bins, 1, n_fft])?;
        // [2 * bins, 1, n_fft] -> [2 * bins, n_fft]: frames through a linear.
        let stft = dev.place(&dev.reshape(&stft, &[2 * bins, n_fft])?)?;
        let mut convs = Vec::new();
        let mut t_in = frames;
        let mut c = bins;
        for (i, &(o, stride)) in cfg.convs.iter().enumerate() {
            let w = vb.get(&format!("conv{}.weight", i + 1), &[o, c, 3])?;
            // [O, C, 3] -> [O, 3C] with column k*C + c (a linear's weight).
            let wv = dev.to_host(&w)?.to_vec_f32()?;
            let mut wt = vec![0f32; 3 * c * o];
            for oo in 0..o {
                for cc in 0..c {
                    for k in 0..3 {
                        wt[oo * 3 * c + k * c + cc] = wv[(oo * c + cc) * 3 + k];
                    }
                }
            }
            let t_out = (t_in - 1) / stride.max(1) + 1;
            let idx: Vec<i64> = (0..t_out)
                .flat_map(|t| (0..3).map(move |k| (t * stride + k) as i64))
                .collect();
            convs.push(Conv {
                lin: Linear::new(
                    dev.place(&Tensor::from_vec(wt, &[o, 3 * c])?)?,
                    Some(vb.get(&format!("conv{}.bias", i + 1), &[o])?),
                ),
                idx: dev.place(&Tensor::from_i64(idx, &[3 * t_out])?)?,
                t_out,
                c,
            });
            t_in = t_out;
            c = o;
        }
        if t_in != 1 || c != hidden {
            return Err(Error::BadInput(format!(
                "Silero VAD: the convolutions leave {t_in} steps of {c} channels, expected 1 of {hidden}"
            )));
        }
        let w_ih = vb.get("lstm_cell.weight_ih", &[4 * hidden, hidden])?;
        let w_hh = vb.get("lstm_cell.weight_hh", &[4 * hidden, hidden])?;
        let b_ih = vb.get("lstm_cell.bias_ih", &[4 * hidden])?;
        let b_hh = vb.get("lstm_cell.bias_hh", &[4 * hidden])?;
        let bias = dev.add(&b_ih, &b_hh)?;
        let w_lstm = dev.concat(&[&w_ih, &w_hh], 1)?;
        let final_w = vb.get("final_conv.weight", &[1, hidden, 1])?;
        let final_w = dev.reshape(&final_w, &[1, hidden])?;
        let final_b = vb.get("final_conv.bias", &[1])?;
        let zeros = dev.place(&Tensor::zeros(&[1, hidden])?)?;
        Ok(SileroVad {
            hidden,
            bins,
            n_fft,
            hop: cfg.hop,
            frames,
            stft: Linear::new(stft, None),
            convs,
            lstm: Linear::new(w_lstm, Some(bias)),
            fin: Linear::new(final_w, Some(final_b)),
            h: zeros.clone(),
            c: zeros,
            context: vec![0.0; CONTEXT],
            dev,
        })
    }

    /// Forget the LSTM state and the context (a new stream).
    pub fn reset(&mut self) -> Result<()> {
        let zeros = self.dev.place(&Tensor::zeros(&[1, self.hidden])?)?;
        self.h = zeros.clone();
        self.c = zeros;
        self.context.iter_mut().for_each(|v| *v = 0.0);
        Ok(())
    }

    /// Speech probability of the next 512-sample window (16 kHz), updating
    /// the state and the context.
    pub fn step(&mut self, window: &[f32]) -> Result<f32> {
        if window.len() != WINDOW {
            return Err(Error::BadInput(format!(
                "Silero VAD takes windows of {WINDOW} samples at 16 kHz, got {}",
                window.len()
            )));
        }
        let dev = self.dev.clone();
        // One batch of ops (on the CPU: run on the kernels' worker pool).
        dev.batch(|| self.step_ops(window))
    }

    fn step_ops(&mut self, window: &[f32]) -> Result<f32> {
        let dev = &self.dev;
        let (hidden, bins, n_fft, hop) = (self.hidden, self.bins, self.n_fft, self.hop);
        // Context + window, reflect-padded by 64 on the right (the edge
        // sample is not repeated), cut into frames of n_fft by hop.
        let mut x = Vec::with_capacity(CONTEXT + WINDOW + PAD);
        x.extend_from_slice(&self.context);
        x.extend_from_slice(window);
        let n = x.len();
        for i in 0..PAD {
            x.push(x[n - 2 - i]);
        }
        self.context.copy_from_slice(&window[WINDOW - CONTEXT..]);
        let mut frames = Vec::with_capacity(self.frames * n_fft);
        for f in 0..self.frames {
            frames.extend_from_slice(&x[f * hop..f * hop + n_fft]);
        }
        let frames = dev.place(&Tensor::from_vec(frames, &[self.frames, n_fft])?)?;
        // [frames, 2 * bins]: real parts then imaginary parts.
        let spec = self.stft.forward(dev, &frames)?;
        let sq = dev.unary(UnaryOp::Sqr, &spec)?;
        let re2 = dev.narrow(&sq, 1, 0, bins)?;
        let im2 = dev.narrow(&sq, 1, bins, bins)?;
        let mut h = dev.unary(UnaryOp::Sqrt, &dev.add(&re2, &im2)?)?;
        for conv in &self.convs {
            let padded = dev.pad(&h, 0, 1, 1, PadMode::Zeros)?;
            let cols = dev.index_select(&padded, &conv.idx, 0)?;
            let cols = dev.reshape(&cols, &[conv.t_out, 3 * conv.c])?;
            let y = conv.lin.forward(dev, &cols)?;
            h = dev.unary(UnaryOp::Relu, &y)?;
        }
        // [1, hidden, 1] -> [1, hidden]
        let feat = dev.reshape(&h, &[1, hidden])?;
        let xh = dev.concat(&[&feat, &self.h], 1)?;
        let gates = self.lstm.forward(dev, &xh)?;
        // PyTorch LSTMCell gate order: input, forget, cell, output.
        let sg = dev.sigmoid(&gates)?;
        let i = dev.narrow(&sg, 1, 0, hidden)?;
        let f = dev.narrow(&sg, 1, hidden, hidden)?;
        let g = dev.tanh(&dev.narrow(&gates, 1, 2 * hidden, hidden)?)?;
        let o = dev.narrow(&sg, 1, 3 * hidden, hidden)?;
        let c = dev.add(&dev.mul(&f, &self.c)?, &dev.mul(&i, &g)?)?;
        let hn = dev.mul(&o, &dev.tanh(&c)?)?;
        self.c = c;
        self.h = hn.clone();
        let y = dev.unary(UnaryOp::Relu, &hn)?;
        let logit = self.fin.forward(dev, &y)?;
        let p = dev.sigmoid(&logit)?;
        let v = dev.to_host(&p)?.to_vec_f32()?;
        v.first()
            .copied()
            .ok_or_else(|| Error::BadInput("Silero VAD produced an empty output".to_string()))
    }
}
