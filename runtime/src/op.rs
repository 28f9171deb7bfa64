//! The op set every backend implements (or falls back on the CPU for).
//!
//! Models are written once against [`crate::Device`], whose methods build an
//! [`Op`] and dispatch it. Because every op is a value, the dispatcher can
//! count fallbacks per op, the conformance suite can enumerate ops, and the
//! NPU delegate can capture a stage's graph.

use crate::DType;
use serde::{Deserialize, Serialize};

/// Element-wise unary functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Sqr,
    Recip,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    /// tanh approximation, as GPT-2 / candle `gelu`.
    Gelu,
    /// exact erf form, as PyTorch `nn.GELU()`.
    GeluErf,
    Silu,
    Softplus,
}

/// Element-wise binary functions with NumPy broadcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
}

/// Reductions over one dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    ArgMax,
}

/// Padding modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum PadMode {
    Zeros,
    Reflect,
    Replicate,
}

/// The resampling around [`Op::ResampledSnake`]'s activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SnakeResampling {
    /// Up- and downsampling factor (BigVGAN: 2).
    pub ratio: usize,
    /// Replicate padding of the input before the upsampler (left, right).
    pub up_pad: (usize, usize),
    /// Replicate padding of the activated signal before the downsampler.
    pub down_pad: (usize, usize),
}

/// One tensor operation with its attributes. Inputs are passed separately,
/// in the order documented on each variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// `a[..., m, k] @ b[..., k, n]` with batch broadcasting.
    MatMul,
    /// `x[..., k] @ w[n, k]^T (+ bias[n])`; `w` may be quantized (Q4_0/Q4_1/Q8_0).
    /// Inputs: x, w, `[bias]`.
    Linear,
    /// Inputs: x[b, c_in, l], w[c_out, c_in/groups, k], `[bias[c_out]]`.
    Conv1d {
        /// Stride.
        stride: usize,
        /// Zero padding on both sides.
        padding: usize,
        /// Dilation.
        dilation: usize,
        /// Groups.
        groups: usize,
    },
    /// A 1-D convolution with the element-wise work around it folded in —
    /// the unit HiFi-GAN vocoders are made of:
    /// `y = conv1d(pre(x), w, bias) (+ residual)`, where `pre` is
    /// `LeakyRelu { slope: pre_slope }` when given. One pass over memory
    /// instead of three. Inputs: x[b, c_in, l], w[c_out, c_in/groups, k],
    /// bias[c_out], then residual[b, c_out, l_out] when `residual` (laid out
    /// as the output is).
    ///
    /// `phases > 1` writes the output interleaved, as the phases of a
    /// transposed convolution in its polyphase form: with
    /// `c = c_out / phases`, output channel `p * c + o` at time `t` goes to
    /// `[b, c, l_out * phases]` at `[o, t * phases + p]` (what a reshape to
    /// `[b, phases, c, l_out]`, a permute to `[b, c, l_out, phases]` and a
    /// reshape give, without the copy).
    /// Backends without it get it composed from [`Op::LeakyRelu`],
    /// [`Op::Conv1d`] and [`Op::Binary`] on the same device by
    /// `Device::conv1d_fused`, never through a CPU fallback.
    Conv1dFused {
        /// Stride.
        stride: usize,
        /// Zero padding on both sides.
        padding: usize,
        /// Dilation.
        dilation: usize,
        /// Groups.
        groups: usize,
        /// Leaky-ReLU slope applied to x first, if any.
        pre_slope: Option<f64>,
        /// Whether a residual input is added to the output.
        residual: bool,
        /// Output phases interleaved in time (1: none); divides `c_out`.
        phases: usize,
    },
    /// Inputs: x[b, c_in, h, w], w[c_out, c_in/groups, kh, kw], `[bias]`.
    Conv2d {
        /// Stride.
        stride: usize,
        /// Zero padding on all sides.
        padding: usize,
        /// Dilation.
        dilation: usize,
        /// Groups.
        groups: usize,
    },
    /// Inputs: x[b, c_in, l], w[c_in, c_out/groups, k], `[bias]` (PyTorch layout).
    ConvTranspose1d {
        /// Stride.
        stride: usize,
        /// Padding removed from both ends.
        padding: usize,
        /// Extra length added at the end.
        output_padding: usize,
        /// Dilation.
        dilation: usize,
        /// Groups.
        groups: usize,
    },
    /// Over the last dim. Inputs: x, gamma, `[beta]`.
    LayerNorm {
        /// Epsilon.
        eps: f64,
    },
    /// Over the last dim. Inputs: x, gamma.
    RmsNorm {
        /// Epsilon.
        eps: f64,
    },
    /// Softmax over `dim`.
    Softmax {
        /// Dimension.
        dim: usize,
    },
    /// Scaled dot-product attention. Inputs: q[b, h, s, d], k[b, hk, t, d],
    /// v[b, hk, t, d], [additive mask broadcastable to [b, h, s, t]].
    /// `hk` may divide `h` (grouped-query attention).
    Attention {
        /// Scale applied to q·k (usually 1/sqrt(d)).
        scale: f64,
        /// Apply a causal mask aligned to the end (for KV-cache decode).
        causal: bool,
    },
    /// Rotary embedding. Inputs: x[b, h, s, d], cos[s, d/2], sin[s, d/2].
    Rope {
        /// GPT-J interleaved pairs (true) or NeoX/Llama halves (false).
        interleaved: bool,
    },
    /// Element-wise unary.
    Unary(UnaryOp),
    /// `max(x, slope * x)`.
    LeakyRelu {
        /// Negative slope.
        slope: f64,
    },
    /// Snake activation (BigVGAN): `x + sin(alpha x)^2 / alpha`.
    /// Inputs: x[b, c, t], `alpha[c]`, optionally `gain[c]`, which makes
    /// it `x + gain * sin(alpha x)^2` (SnakeBeta with its log-scale
    /// parameters exponentiated: `alpha = e^alpha'`, `gain = 1 / (e^beta'
    /// + 1e-9)`); backends without the three-input form get it composed
    /// ([`crate::Device::snake_beta`]).
    Snake,
    /// SnakeBeta between anti-aliasing resamplers (BigVGAN's
    /// `Activation1d`), in one pass per channel. Inputs: `x[b, c, t]`,
    /// `freq[c]`, `gain[c]` (as [`Op::Snake`]'s three-input form), the
    /// upsampler's phase filters `up[ratio, 1, taps]` and their bias
    /// `up_bias[ratio]`, the downsampler's filter `down[1, 1, k]`. `x` is
    /// replicate-padded by `up_pad` and convolved with each phase filter,
    /// the phases interleaved (`ratio` times the samples); SnakeBeta; the
    /// result replicate-padded by `down_pad`, low-passed by `down` and
    /// decimated by `ratio`. Backends without it get exactly those ops
    /// ([`crate::Device::resampled_snake_beta`]).
    ResampledSnake(SnakeResampling),
    /// `silu(gate) * up`, the gated activation of Llama / Qwen2 MLPs, in
    /// one pass. Inputs: `gu[..., 2f]` (gate then up stacked on the last
    /// dim, as a fused gate / up projection gives them) -> `[..., f]`; or
    /// `gate` and `up` of one shape. Backends without it get it composed
    /// (narrow, [`UnaryOp::Silu`], [`BinaryOp::Mul`]: the same values) by
    /// [`crate::Device::swiglu`].
    SwiGlu,
    /// Element-wise binary with broadcasting. Inputs: a, b.
    Binary(BinaryOp),
    /// `x * mul + add`.
    Affine {
        /// Multiplier.
        mul: f64,
        /// Offset.
        add: f64,
    },
    /// Reduction over `dim`.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Dimension.
        dim: usize,
        /// Keep the reduced dim with size 1.
        keepdim: bool,
    },
    /// Inclusive cumulative sum over `dim`.
    Cumsum {
        /// Dimension.
        dim: usize,
    },
    /// Same data, new shape (element count must match).
    Reshape {
        /// New dims.
        shape: Vec<usize>,
    },
    /// Reorder dimensions.
    Permute {
        /// New order.
        dims: Vec<usize>,
    },
    /// Concatenate all inputs along `dim`.
    Concat {
        /// Dimension.
        dim: usize,
    },
    /// `len` elements of `dim` starting at `start`.
    Narrow {
        /// Dimension.
        dim: usize,
        /// First index.
        start: usize,
        /// Count.
        len: usize,
    },
    /// Pad `dim` with `before` and `after` elements.
    Pad {
        /// Dimension.
        dim: usize,
        /// Elements before.
        before: usize,
        /// Elements after.
        after: usize,
        /// How to fill.
        mode: PadMode,
    },
    /// `out[i][j] = x[i][idx[i][j]]` along `dim` (torch.gather). Inputs: x, idx.
    Gather {
        /// Dimension.
        dim: usize,
    },
    /// Select whole slices of `dim` by index (embedding lookup). Inputs: x, `idx[n]`.
    IndexSelect {
        /// Dimension.
        dim: usize,
    },
    /// Convert element type.
    Cast {
        /// Target dtype.
        dtype: DType,
    },
    /// Seeded standard-normal samples (no inputs): deterministic per seed on every backend.
    RandNormal {
        /// Output dims.
        shape: Vec<usize>,
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
        /// Seed.
        seed: u64,
    },
}

impl Op {
    /// Stable short name, used in metrics and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::MatMul => "matmul",
            Op::Linear => "linear",
            Op::Conv1d { .. } => "conv1d",
            Op::Conv1dFused { .. } => "conv1d_fused",
            Op::Conv2d { .. } => "conv2d",
            Op::ConvTranspose1d { .. } => "conv_transpose1d",
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Softmax { .. } => "softmax",
            Op::Attention { .. } => "attention",
            Op::Rope { .. } => "rope",
            Op::Unary(u) => match u {
                UnaryOp::Neg => "neg",
                UnaryOp::Abs => "abs",
                UnaryOp::Exp => "exp",
                UnaryOp::Log => "log",
                UnaryOp::Sqrt => "sqrt",
                UnaryOp::Sqr => "sqr",
                UnaryOp::Recip => "recip",
                UnaryOp::Sin => "sin",
                UnaryOp::Cos => "cos",
                UnaryOp::Tanh => "tanh",
                UnaryOp::Sigmoid => "sigmoid",
                UnaryOp::Relu => "relu",
                UnaryOp::Gelu => "gelu",
                UnaryOp::GeluErf => "gelu_erf",
                UnaryOp::Silu => "silu",
                UnaryOp::Softplus => "softplus",
            },
            Op::LeakyRelu { .. } => "leaky_relu",
            Op::Snake => "snake",
            Op::ResampledSnake(_) => "resampled_snake",
            Op::SwiGlu => "swiglu",
            Op::Binary(b) => match b {
                BinaryOp::Add => "add",
                BinaryOp::Sub => "sub",
                BinaryOp::Mul => "mul",
                BinaryOp::Div => "div",
                BinaryOp::Max => "maximum",
                BinaryOp::Min => "minimum",
                BinaryOp::Pow => "pow",
            },
            Op::Affine { .. } => "affine",
            Op::Reduce { op, .. } => match op {
                ReduceOp::Sum => "sum",
                ReduceOp::Mean => "mean",
                ReduceOp::Max => "max",
                ReduceOp::Min => "min",
                ReduceOp::ArgMax => "argmax",
            },
            Op::Cumsum { .. } => "cumsum",
            Op::Reshape { .. } => "reshape",
            Op::Permute { .. } => "permute",
            Op::Concat { .. } => "concat",
            Op::Narrow { .. } => "narrow",
            Op::Pad { .. } => "pad",
            Op::Gather { .. } => "gather",
            Op::IndexSelect { .. } => "index_select",
            Op::Cast { .. } => "cast",
            Op::RandNormal { .. } => "rand_normal",
        }
    }
}
