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
use edgeflow_runtime::weights::WeightStore;
use edgeflow_runtime::{Device, PadMode, Tensor, UnaryOp};
use std::path::Path;

/// Samples per window at 16 kHz.
pub const WINDOW: usize = 512;
/// Samples of the previous window prepended to each window.
pub const CONTEXT: usize = 64;
/// The only sample rate this model takes.
pub const SAMPLE_RATE: u32 = 16_000;
const HIDDEN: usize = 128;
const BINS: usize = 129;
const N_FFT: usize = 256;
const HOP: usize = 128;
/// STFT frames per window: (64 + 512 + 64 reflect-padded - 256) / 128 + 1.
const FRAMES: usize = (CONTEXT + WINDOW + 64 - N_FFT) / HOP + 1;

/// A 3-tap convolution (padding 1) in time-major form: `y[T_out, O] =
/// cols[T_out, 3C] @ w[O, 3C]^T + b`, where row `t` of `cols` is input rows
/// `t*stride - 1 ..= t*stride + 1` side by side (zero rows outside).
struct Conv {
    /// `w[o, k*C + c] = W[o, c, k]` of the PyTorch `[O, C, 3]` weight.
    w: Tensor,
    b: Tensor,
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
    stft: Tensor,
    convs: Vec<Conv>,
    /// `[W_ih | W_hh]`, `[4h, 2h]`: one matmul for both LSTM inputs.
    w_lstm: Tensor,
    bias: Tensor,
    final_w: Tensor,
    final_b: Tensor,
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
    /// Load Silero weights (safetensors) onto `dev`.
    pub fn load(path: &Path, dev: &Device) -> Result<Self> {
        let ws = WeightStore::open(&[path], dev.clone())?;
        Self::new(&ws)
    }

    /// Build from a weight store holding the PyTorch names
    /// (`stft_conv.weight`, `conv1..4.*`, `lstm_cell.*`, `final_conv.*`).
    pub fn new(ws: &WeightStore) -> Result<Self> {
        let dev = ws.device().clone();
        let stft = ws.get_with_shape("stft_conv.weight", &[2 * BINS, 1, 256])?;
        // [258, 1, 256] -> [258, 256]: frames [4, 256] through a linear.
        let stft = dev.place(&dev.reshape(&stft, &[2 * BINS, 256])?)?;
        let shapes = [(128, BINS, 1), (64, 128, 2), (64, 64, 2), (128, 64, 1)];
        let mut convs = Vec::new();
        let mut t_in = FRAMES;
        for (i, (o, c, stride)) in shapes.into_iter().enumerate() {
            let w = ws.get_with_shape(&format!("conv{}.weight", i + 1), &[o, c, 3])?;
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
            let t_out = (t_in - 1) / stride + 1;
            let idx: Vec<i64> = (0..t_out)
                .flat_map(|t| (0..3).map(move |k| (t * stride + k) as i64))
                .collect();
            convs.push(Conv {
                w: dev.place(&Tensor::from_vec(wt, &[o, 3 * c])?)?,
                b: ws.get_with_shape(&format!("conv{}.bias", i + 1), &[o])?,
                idx: dev.place(&Tensor::from_i64(idx, &[3 * t_out])?)?,
                t_out,
                c,
            });
            t_in = t_out;
        }
        if t_in != 1 {
            return Err(Error::BadInput(format!(
                "Silero VAD: the convolutions leave {t_in} steps, expected 1"
            )));
        }
        let w_ih = ws.get_with_shape("lstm_cell.weight_ih", &[4 * HIDDEN, HIDDEN])?;
        let w_hh = ws.get_with_shape("lstm_cell.weight_hh", &[4 * HIDDEN, HIDDEN])?;
        let b_ih = ws.get_with_shape("lstm_cell.bias_ih", &[4 * HIDDEN])?;
        let b_hh = ws.get_with_shape("lstm_cell.bias_hh", &[4 * HIDDEN])?;
        let bias = dev.add(&b_ih, &b_hh)?;
        let w_lstm = dev.concat(&[&w_ih, &w_hh], 1)?;
        let final_w = ws.get_with_shape("final_conv.weight", &[1, HIDDEN, 1])?;
        let final_w = dev.reshape(&final_w, &[1, HIDDEN])?;
        let final_b = ws.get_with_shape("final_conv.bias", &[1])?;
        let zeros = dev.place(&Tensor::zeros(&[1, HIDDEN])?)?;
        Ok(SileroVad {
            stft,
            convs,
            w_lstm,
            bias,
            final_w,
            final_b,
            h: zeros.clone(),
            c: zeros,
            context: vec![0.0; CONTEXT],
            dev,
        })
    }

    /// Forget the LSTM state and the context (a new stream).
    pub fn reset(&mut self) -> Result<()> {
        let zeros = self.dev.place(&Tensor::zeros(&[1, HIDDEN])?)?;
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
        // Context + window, reflect-padded by 64 on the right (the edge
        // sample is not repeated), cut into FRAMES frames of N_FFT by HOP.
        let mut x = Vec::with_capacity(CONTEXT + WINDOW + 64);
        x.extend_from_slice(&self.context);
        x.extend_from_slice(window);
        let n = x.len();
        for i in 0..64 {
            x.push(x[n - 2 - i]);
        }
        self.context.copy_from_slice(&window[WINDOW - CONTEXT..]);
        let mut frames = Vec::with_capacity(FRAMES * N_FFT);
        for f in 0..FRAMES {
            frames.extend_from_slice(&x[f * HOP..f * HOP + N_FFT]);
        }
        let frames = dev.place(&Tensor::from_vec(frames, &[FRAMES, N_FFT])?)?;
        // [FRAMES, 2 * BINS]: real parts then imaginary parts.
        let spec = dev.linear(&frames, &self.stft, None)?;
        let sq = dev.unary(UnaryOp::Sqr, &spec)?;
        let re2 = dev.narrow(&sq, 1, 0, BINS)?;
        let im2 = dev.narrow(&sq, 1, BINS, BINS)?;
        let mut h = dev.unary(UnaryOp::Sqrt, &dev.add(&re2, &im2)?)?;
        for conv in &self.convs {
            let padded = dev.pad(&h, 0, 1, 1, PadMode::Zeros)?;
            let cols = dev.index_select(&padded, &conv.idx, 0)?;
            let cols = dev.reshape(&cols, &[conv.t_out, 3 * conv.c])?;
            let y = dev.linear(&cols, &conv.w, Some(&conv.b))?;
            h = dev.unary(UnaryOp::Relu, &y)?;
        }
        // [1, 128, 1] -> [1, 128]
        let feat = dev.reshape(&h, &[1, HIDDEN])?;
        let xh = dev.concat(&[&feat, &self.h], 1)?;
        let gates = dev.linear(&xh, &self.w_lstm, Some(&self.bias))?;
        // PyTorch LSTMCell gate order: input, forget, cell, output.
        let sg = dev.sigmoid(&gates)?;
        let i = dev.narrow(&sg, 1, 0, HIDDEN)?;
        let f = dev.narrow(&sg, 1, HIDDEN, HIDDEN)?;
        let g = dev.tanh(&dev.narrow(&gates, 1, 2 * HIDDEN, HIDDEN)?)?;
        let o = dev.narrow(&sg, 1, 3 * HIDDEN, HIDDEN)?;
        let c = dev.add(&dev.mul(&f, &self.c)?, &dev.mul(&i, &g)?)?;
        let hn = dev.mul(&o, &dev.tanh(&c)?)?;
        self.c = c;
        self.h = hn.clone();
        let y = dev.unary(UnaryOp::Relu, &hn)?;
        let logit = dev.linear(&y, &self.final_w, Some(&self.final_b))?;
        let p = dev.sigmoid(&logit)?;
        let v = dev.to_host(&p)?.to_vec_f32()?;
        v.first()
            .copied()
            .ok_or_else(|| Error::BadInput("Silero VAD produced an empty output".to_string()))
    }
}
