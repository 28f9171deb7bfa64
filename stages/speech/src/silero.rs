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

use crate::{Error, Result};
use edgeflow_runtime::weights::WeightStore;
use edgeflow_runtime::{ConvCfg, Device, PadMode, Tensor, UnaryOp};
use std::path::Path;

/// Samples per window at 16 kHz.
pub const WINDOW: usize = 512;
/// Samples of the previous window prepended to each window.
pub const CONTEXT: usize = 64;
/// The only sample rate this model takes.
pub const SAMPLE_RATE: u32 = 16_000;
const HIDDEN: usize = 128;
const BINS: usize = 129;

struct Conv {
    w: Tensor,
    b: Tensor,
    stride: usize,
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
        let shapes = [(128, BINS, 1), (64, 128, 2), (64, 64, 2), (128, 64, 1)];
        let mut convs = Vec::new();
        for (i, (o, c, stride)) in shapes.into_iter().enumerate() {
            convs.push(Conv {
                w: ws.get_with_shape(&format!("conv{}.weight", i + 1), &[o, c, 3])?,
                b: ws.get_with_shape(&format!("conv{}.bias", i + 1), &[o])?,
                stride,
            });
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
        let dev = &self.dev;
        let mut x = Vec::with_capacity(CONTEXT + WINDOW);
        x.extend_from_slice(&self.context);
        x.extend_from_slice(window);
        self.context.copy_from_slice(&window[WINDOW - CONTEXT..]);
        let x = dev.place(&Tensor::from_vec(x, &[1, 1, CONTEXT + WINDOW])?)?;
        let x = dev.pad(&x, 2, 0, 64, PadMode::Reflect)?;
        let spec = dev.conv1d(
            &x,
            &self.stft,
            None,
            ConvCfg {
                stride: 128,
                ..Default::default()
            },
        )?;
        let sq = dev.unary(UnaryOp::Sqr, &spec)?;
        let re2 = dev.narrow(&sq, 1, 0, BINS)?;
        let im2 = dev.narrow(&sq, 1, BINS, BINS)?;
        let mut h = dev.unary(UnaryOp::Sqrt, &dev.add(&re2, &im2)?)?;
        for conv in &self.convs {
            let y = dev.conv1d(
                &h,
                &conv.w,
                Some(&conv.b),
                ConvCfg {
                    stride: conv.stride,
                    padding: 1,
                    ..Default::default()
                },
            )?;
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
