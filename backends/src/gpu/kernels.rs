//! WGSL sources of the GPU backend's compute kernels.
//!
//! Every kernel reads its scalar parameters (sizes, strides, float
//! attributes as bit patterns) from binding 0, a read-only `array<u32>`, so
//! one compiled pipeline serves every shape. Element-wise kernels index
//! `(workgroup_id.x + workgroup_id.y * num_workgroups.x) * 256 + local index`
//! so a dispatch can be split over two dimensions when it needs more than
//! `max_compute_workgroups_per_dimension` workgroups; row kernels (softmax,
//! norms) use one workgroup per row, indexed the same way.

use edgeflow_runtime::{BinaryOp, UnaryOp};

/// Threads per workgroup of the 1-D kernels and of the row kernels.
pub(crate) const WG: u32 = 256;
/// Tile edge of the matmul kernel (a `TILE x TILE` workgroup).
pub(crate) const TILE: u32 = 16;

/// Math helpers shared by the element-wise kernels.
const HELPERS: &str = r#"
fn tanh_s(v: f32) -> f32 {
    // tanh(+-9) is 1 in f32; clamping avoids exp overflow inside some drivers.
    return tanh(clamp(v, -9.0, 9.0));
}
fn erf_s(v: f32) -> f32 {
    // Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7.
    let a = abs(v);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * exp(-a * a);
    return select(y, -y, v < 0.0);
}
fn sigmoid_s(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}
"#;

/// WGSL expression of `v` (and the float attributes `c0`, `c1`) for a unary op.
pub(crate) fn unary_expr(op: UnaryOp) -> &'static str {
    match op {
        UnaryOp::Neg => "-v",
        UnaryOp::Abs => "abs(v)",
        UnaryOp::Exp => "exp(v)",
        UnaryOp::Log => "log(v)",
        UnaryOp::Sqrt => "sqrt(v)",
        UnaryOp::Sqr => "v * v",
        UnaryOp::Recip => "1.0 / v",
        UnaryOp::Sin => "sin(v)",
        UnaryOp::Cos => "cos(v)",
        UnaryOp::Tanh => "tanh_s(v)",
        UnaryOp::Sigmoid => "sigmoid_s(v)",
        UnaryOp::Relu => "max(v, 0.0)",
        UnaryOp::Gelu => {
            "0.5 * v * (1.0 + tanh_s(0.7978845608028654 * v * (1.0 + 0.044715 * v * v)))"
        }
        UnaryOp::GeluErf => "0.5 * v * (1.0 + erf_s(v * 0.7071067811865476))",
        UnaryOp::Silu => "v * sigmoid_s(v)",
        // Stable form of log(1 + exp(v)).
        UnaryOp::Softplus => "max(v, 0.0) + log(1.0 + exp(-abs(v)))",
    }
}

/// `x * c0 + c1`.
pub(crate) const AFFINE_EXPR: &str = "v * c0 + c1";
/// `max(x, c0 * x)`.
pub(crate) const LEAKY_RELU_EXPR: &str = "select(c0 * v, v, v >= 0.0)";

/// Element-wise unary kernel. Params: `[n, c0 bits, c1 bits]`.
pub(crate) fn unary_src(expr: &str) -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
{HELPERS}
fn f(v: f32, c0: f32, c1: f32) -> f32 {{
    return {expr};
}}
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let i = (wid.x + wid.y * nwg.x) * {WG}u + li;
    if (i >= p[0]) {{
        return;
    }}
    y[i] = f(x[i], bitcast<f32>(p[1]), bitcast<f32>(p[2]));
}}
"#
    )
}

/// WGSL expression of `a`, `b` for a binary op.
pub(crate) fn binary_expr(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "a + b",
        BinaryOp::Sub => "a - b",
        BinaryOp::Mul => "a * b",
        BinaryOp::Div => "a / b",
        BinaryOp::Max => "max(a, b)",
        BinaryOp::Min => "min(a, b)",
        // As candle: exp(b * ln(a)), NaN for negative bases.
        BinaryOp::Pow => "exp(b * log(a))",
    }
}

/// Snake activation with a per-channel `alpha` broadcast as the second operand.
pub(crate) const SNAKE_EXPR: &str = "a + sin(b * a) * sin(b * a) / b";

/// Broadcasting binary kernel.
/// Params: `[n, rank, out_dims[rank], a_strides[rank], b_strides[rank]]`
/// (a stride is 0 along a broadcast dimension).
pub(crate) fn binary_src(expr: &str) -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> xa: array<f32>;
@group(0) @binding(2) var<storage, read> xb: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
fn f(a: f32, b: f32) -> f32 {{
    return {expr};
}}
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let i = (wid.x + wid.y * nwg.x) * {WG}u + li;
    if (i >= p[0]) {{
        return;
    }}
    let r = p[1];
    var rem = i;
    var ia = 0u;
    var ib = 0u;
    for (var d = r; d > 0u; d = d - 1u) {{
        let dd = d - 1u;
        let size = p[2u + dd];
        let idx = rem % size;
        rem = rem / size;
        ia = ia + idx * p[2u + r + dd];
        ib = ib + idx * p[2u + 2u * r + dd];
    }}
    y[i] = f(xa[ia], xb[ib]);
}}
"#
    )
}

/// Strided copy: `y[out_off + sum idx*ostr] = x[in_off + sum idx*istr]` over
/// the index space `dims`. Serves permute, narrow, concat and zero padding.
/// Params: `[n, rank, in_off, out_off, dims[rank], istr[rank], ostr[rank]]`.
pub(crate) fn copy_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let i = (wid.x + wid.y * nwg.x) * {WG}u + li;
    if (i >= p[0]) {{
        return;
    }}
    let r = p[1];
    var rem = i;
    var ii = p[2];
    var io = p[3];
    for (var d = r; d > 0u; d = d - 1u) {{
        let dd = d - 1u;
        let size = p[4u + dd];
        let idx = rem % size;
        rem = rem / size;
        ii = ii + idx * p[4u + r + dd];
        io = io + idx * p[4u + 2u * r + dd];
    }}
    y[io] = x[ii];
}}
"#
    )
}

/// Batched, tiled matmul with workgroup shared memory and an optional bias
/// over the output columns (for `Linear`).
///
/// `out[b, i, j] = sum_k A[b](i, k) * B[b](k, j) (+ bias[j])` where
/// `A[b](i, k) = a[a_off(b) + i*a_rs + k*a_cs]` and likewise for `B`, so
/// the same kernel reads `w[n, k]` transposed for `Linear`.
/// Params: `[m, n, k, tiles_n, tiles_m, batch, a_rs, a_cs, b_rs, b_cs,
/// has_bias, brank, bdims[brank], a_bstr[brank], b_bstr[brank]]`.
pub(crate) fn matmul_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
var<workgroup> ta: array<array<f32, {TILE}>, {TILE}>;
var<workgroup> tb: array<array<f32, {TILE}>, {TILE}>;
@compute @workgroup_size({TILE}, {TILE}, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {{
    let m = p[0];
    let n = p[1];
    let k = p[2];
    let tiles_n = p[3];
    let tiles_m = p[4];
    let batch = p[5];
    let a_rs = p[6];
    let a_cs = p[7];
    let b_rs = p[8];
    let b_cs = p[9];
    let has_bias = p[10];
    let brank = p[11];
    let lin = wid.x + wid.y * nwg.x;
    let valid = lin < tiles_n * tiles_m * batch;
    let tn = lin % tiles_n;
    let rest = lin / tiles_n;
    let tm = rest % tiles_m;
    let bi = rest / tiles_m;
    var a_off = 0u;
    var b_off = 0u;
    var r = bi;
    for (var d = brank; d > 0u; d = d - 1u) {{
        let dd = d - 1u;
        let size = p[12u + dd];
        let idx = r % size;
        r = r / size;
        a_off = a_off + idx * p[12u + brank + dd];
        b_off = b_off + idx * p[12u + 2u * brank + dd];
    }}
    let row = tm * {TILE}u + lid.y;
    let col = tn * {TILE}u + lid.x;
    var acc = 0.0;
    let ktiles = (k + {TILE}u - 1u) / {TILE}u;
    for (var t = 0u; t < ktiles; t = t + 1u) {{
        let ka = t * {TILE}u + lid.x;
        var va = 0.0;
        if (valid && row < m && ka < k) {{
            va = a[a_off + row * a_rs + ka * a_cs];
        }}
        ta[lid.y][lid.x] = va;
        let kb = t * {TILE}u + lid.y;
        var vb = 0.0;
        if (valid && kb < k && col < n) {{
            vb = b[b_off + kb * b_rs + col * b_cs];
        }}
        tb[lid.y][lid.x] = vb;
        workgroupBarrier();
        for (var kk = 0u; kk < {TILE}u; kk = kk + 1u) {{
            acc = acc + ta[lid.y][kk] * tb[kk][lid.x];
        }}
        workgroupBarrier();
    }}
    if (valid && row < m && col < n) {{
        if (has_bias == 1u) {{
            acc = acc + bias[col];
        }}
        y[bi * m * n + row * n + col] = acc;
    }}
}}
"#
    )
}

/// Workgroup reductions shared by the row kernels.
const ROW_HELPERS: &str = r#"
var<workgroup> sh: array<f32, 256>;
fn wg_sum(li: u32, v: f32) -> f32 {
    sh[li] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (li < s) {
            sh[li] = sh[li] + sh[li + s];
        }
        workgroupBarrier();
    }
    let r = sh[0];
    workgroupBarrier();
    return r;
}
fn wg_max(li: u32, v: f32) -> f32 {
    sh[li] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (li < s) {
            sh[li] = max(sh[li], sh[li + s]);
        }
        workgroupBarrier();
    }
    let r = sh[0];
    workgroupBarrier();
    return r;
}
"#;

/// Softmax over the last dim, one workgroup per row. Params: `[rows, cols]`.
pub(crate) fn softmax_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
{ROW_HELPERS}
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let rows = p[0];
    let cols = p[1];
    let row = wid.x + wid.y * nwg.x;
    let valid = row < rows;
    let base = row * cols;
    var mx = -3.4028234663852886e38;
    if (valid) {{
        for (var c = li; c < cols; c = c + {WG}u) {{
            mx = max(mx, x[base + c]);
        }}
    }}
    mx = wg_max(li, mx);
    var s = 0.0;
    if (valid) {{
        for (var c = li; c < cols; c = c + {WG}u) {{
            s = s + exp(x[base + c] - mx);
        }}
    }}
    s = wg_sum(li, s);
    if (valid) {{
        for (var c = li; c < cols; c = c + {WG}u) {{
            y[base + c] = exp(x[base + c] - mx) / s;
        }}
    }}
}}
"#
    )
}

/// LayerNorm over the last dim (two-pass mean and variance), one workgroup
/// per row. Params: `[rows, cols, eps bits, has_beta]`.
pub(crate) fn layer_norm_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read> beta: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
{ROW_HELPERS}
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let rows = p[0];
    let cols = p[1];
    let eps = bitcast<f32>(p[2]);
    let has_beta = p[3];
    let row = wid.x + wid.y * nwg.x;
    let valid = row < rows;
    let base = row * cols;
    var s = 0.0;
    if (valid) {{
        for (var c = li; c < cols; c = c + {WG}u) {{
            s = s + x[base + c];
        }}
    }}
    let mean = wg_sum(li, s) / f32(cols);
    var q = 0.0;
    if (valid) {{
        for (var c = li; c < cols; c = c + {WG}u) {{
            let d = x[base + c] - mean;
            q = q + d * d;
        }}
    }}
    let var_ = wg_sum(li, q) / f32(cols);
    let inv = 1.0 / sqrt(var_ + eps);
    if (valid) {{
        for (var c = li; c < cols; c = c + {WG}u) {{
            var v = (x[base + c] - mean) * inv * gamma[c];
            if (has_beta == 1u) {{
                v = v + beta[c];
            }}
            y[base + c] = v;
        }}
    }}
}}
"#
    )
}

/// RmsNorm over the last dim, one workgroup per row. Params: `[rows, cols, eps bits]`.
pub(crate) fn rms_norm_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
{ROW_HELPERS}
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let rows = p[0];
    let cols = p[1];
    let eps = bitcast<f32>(p[2]);
    let row = wid.x + wid.y * nwg.x;
    let valid = row < rows;
    let base = row * cols;
    var q = 0.0;
    if (valid) {{
        for (var c = li; c < cols; c = c + {WG}u) {{
            let v = x[base + c];
            q = q + v * v;
        }}
    }}
    let inv = 1.0 / sqrt(wg_sum(li, q) / f32(cols) + eps);
    if (valid) {{
        for (var c = li; c < cols; c = c + {WG}u) {{
            y[base + c] = x[base + c] * inv * gamma[c];
        }}
    }}
}}
"#
    )
}

/// Direct 1-D convolution, one thread per output element.
/// Params: `[n_out, c_in, l, c_out, k, l_out, stride, padding, dilation, groups, has_bias]`.
pub(crate) fn conv1d_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let i = (wid.x + wid.y * nwg.x) * {WG}u + li;
    if (i >= p[0]) {{
        return;
    }}
    let c_in = p[1];
    let l = p[2];
    let c_out = p[3];
    let k = p[4];
    let l_out = p[5];
    let stride = p[6];
    let pad = p[7];
    let dil = p[8];
    let groups = p[9];
    let lo = i % l_out;
    let t = i / l_out;
    let co = t % c_out;
    let bi = t / c_out;
    let cin_g = c_in / groups;
    let cout_g = c_out / groups;
    let g = co / cout_g;
    var acc = 0.0;
    for (var ci = 0u; ci < cin_g; ci = ci + 1u) {{
        let xrow = (bi * c_in + g * cin_g + ci) * l;
        let wrow = (co * cin_g + ci) * k;
        for (var kk = 0u; kk < k; kk = kk + 1u) {{
            let pos = i32(lo * stride + kk * dil) - i32(pad);
            if (pos >= 0 && pos < i32(l)) {{
                acc = acc + x[xrow + u32(pos)] * w[wrow + kk];
            }}
        }}
    }}
    if (p[10] == 1u) {{
        acc = acc + bias[co];
    }}
    y[i] = acc;
}}
"#
    )
}

/// Attention probabilities in place: `scores * scale (+ mask) (causal)`
/// then softmax over the last dim, one workgroup per `(b, h, i)` row.
/// Causally hidden keys get probability 0, as `exp(-inf)` would give.
/// Params: `[rows, t, scale bits, causal, s, off, has_mask, h, ms_b, ms_h, ms_s, ms_t]`.
pub(crate) fn attn_softmax_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> mask: array<f32>;
@group(0) @binding(2) var<storage, read_write> sc: array<f32>;
{ROW_HELPERS}
fn score(base: u32, mbase: u32, j: u32) -> f32 {{
    var v = sc[base + j] * bitcast<f32>(p[2]);
    if (p[6] == 1u) {{
        v = v + mask[mbase + j * p[11]];
    }}
    return v;
}}
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let rows = p[0];
    let t = p[1];
    let row = wid.x + wid.y * nwg.x;
    let valid = row < rows;
    let s = p[4];
    let i = row % s;
    let bh = row / s;
    let hi = bh % p[7];
    let bi = bh / p[7];
    // Keys visible to query i: all, or j <= i + off when causal.
    var lim = t;
    if (p[3] == 1u) {{
        lim = min(t, i + p[5] + 1u);
    }}
    let base = row * t;
    let mbase = bi * p[8] + hi * p[9] + i * p[10];
    var mx = -3.4028234663852886e38;
    if (valid) {{
        for (var j = li; j < lim; j = j + {WG}u) {{
            mx = max(mx, score(base, mbase, j));
        }}
    }}
    mx = wg_max(li, mx);
    var sum = 0.0;
    if (valid) {{
        for (var j = li; j < lim; j = j + {WG}u) {{
            sum = sum + exp(score(base, mbase, j) - mx);
        }}
    }}
    sum = wg_sum(li, sum);
    if (valid) {{
        for (var j = li; j < t; j = j + {WG}u) {{
            var e = 0.0;
            if (j < lim) {{
                e = exp(score(base, mbase, j) - mx) / sum;
            }}
            sc[base + j] = e;
        }}
    }}
}}
"#
    )
}

/// Rotary embedding on `x[b, h, s, d]` with `cos/sin[s, d/2]`.
/// Params: `[n, s, d, interleaved]`.
pub(crate) fn rope_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> cs: array<f32>;
@group(0) @binding(3) var<storage, read> sn: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let i = (wid.x + wid.y * nwg.x) * {WG}u + li;
    if (i >= p[0]) {{
        return;
    }}
    let s = p[1];
    let d = p[2];
    let half = d / 2u;
    let dd = i % d;
    let row = i / d;
    let si = row % s;
    let rb = row * d;
    if (p[3] == 1u) {{
        let j = dd / 2u;
        let c = cs[si * half + j];
        let q = sn[si * half + j];
        let e = rb + 2u * j;
        if (dd % 2u == 0u) {{
            y[i] = x[e] * c - x[e + 1u] * q;
        }} else {{
            y[i] = x[e] * q + x[e + 1u] * c;
        }}
    }} else {{
        let j = dd % half;
        let c = cs[si * half + j];
        let q = sn[si * half + j];
        if (dd < half) {{
            y[i] = x[rb + j] * c - x[rb + j + half] * q;
        }} else {{
            y[i] = x[rb + j] * q + x[rb + j + half] * c;
        }}
    }}
}}
"#
    )
}

/// Reduction over one dim seen as `[outer, len, inner]`, one thread per output.
/// Params: `[n_out, len, inner, op]` with op 0 sum, 1 mean, 2 max, 3 min.
pub(crate) fn reduce_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let i = (wid.x + wid.y * nwg.x) * {WG}u + li;
    if (i >= p[0]) {{
        return;
    }}
    let len = p[1];
    let inner = p[2];
    let op = p[3];
    let base = (i / inner) * len * inner + i % inner;
    var acc = x[base];
    for (var j = 1u; j < len; j = j + 1u) {{
        let v = x[base + j * inner];
        if (op <= 1u) {{
            acc = acc + v;
        }} else if (op == 2u) {{
            acc = max(acc, v);
        }} else {{
            acc = min(acc, v);
        }}
    }}
    if (op == 1u) {{
        acc = acc / f32(len);
    }}
    y[i] = acc;
}}
"#
    )
}

/// Whole slices of one dim picked by index (embedding lookup); the indices
/// were range-checked on the host. Params: `[n_out, dim_len, inner, n_idx]`.
pub(crate) fn index_select_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let i = (wid.x + wid.y * nwg.x) * {WG}u + li;
    if (i >= p[0]) {{
        return;
    }}
    let inner = p[2];
    let n_idx = p[3];
    let r = i / inner;
    let j = r % n_idx;
    let o = r / n_idx;
    y[i] = x[(o * p[1] + idx[j]) * inner + i % inner];
}}
"#
    )
}

/// Direct transposed 1-D convolution (PyTorch weight layout
/// `[c_in, c_out/groups, k]`), one thread per output element.
/// Params: `[n_out, c_in, l, c_out, k, l_out, stride, padding, dilation, groups, has_bias]`.
pub(crate) fn conv_transpose1d_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let i = (wid.x + wid.y * nwg.x) * {WG}u + li;
    if (i >= p[0]) {{
        return;
    }}
    let c_in = p[1];
    let l = p[2];
    let c_out = p[3];
    let k = p[4];
    let l_out = p[5];
    let stride = p[6];
    let pad = p[7];
    let dil = p[8];
    let groups = p[9];
    let lo = i % l_out;
    let t = i / l_out;
    let co = t % c_out;
    let bi = t / c_out;
    let cin_g = c_in / groups;
    let cout_g = c_out / groups;
    let g = co / cout_g;
    let cog = co % cout_g;
    var acc = 0.0;
    for (var kk = 0u; kk < k; kk = kk + 1u) {{
        let num = i32(lo + pad) - i32(kk * dil);
        if (num < 0 || u32(num) % stride != 0u) {{
            continue;
        }}
        let li_ = u32(num) / stride;
        if (li_ >= l) {{
            continue;
        }}
        for (var ci = 0u; ci < cin_g; ci = ci + 1u) {{
            let c = g * cin_g + ci;
            acc = acc + x[(bi * c_in + c) * l + li_] * w[(c * cout_g + cog) * k + kk];
        }}
    }}
    if (p[10] == 1u) {{
        acc = acc + bias[co];
    }}
    y[i] = acc;
}}
"#
    )
}

/// Direct 2-D convolution, one thread per output element.
/// Params: `[n_out, c_in, h, w, c_out, kh, kw, oh, ow, stride, padding, dilation, groups, has_bias]`.
pub(crate) fn conv2d_src() -> String {
    format!(
        r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let i = (wid.x + wid.y * nwg.x) * {WG}u + li;
    if (i >= p[0]) {{
        return;
    }}
    let c_in = p[1];
    let h = p[2];
    let wd = p[3];
    let c_out = p[4];
    let kh = p[5];
    let kw = p[6];
    let oh = p[7];
    let ow = p[8];
    let stride = p[9];
    let pad = i32(p[10]);
    let dil = p[11];
    let groups = p[12];
    let ox = i % ow;
    let t0 = i / ow;
    let oy = t0 % oh;
    let t1 = t0 / oh;
    let co = t1 % c_out;
    let bi = t1 / c_out;
    let cin_g = c_in / groups;
    let g = co / (c_out / groups);
    var acc = 0.0;
    for (var ci = 0u; ci < cin_g; ci = ci + 1u) {{
        let xc = (bi * c_in + g * cin_g + ci) * h;
        let wc = (co * cin_g + ci) * kh;
        for (var ky = 0u; ky < kh; ky = ky + 1u) {{
            let iy = i32(oy * stride + ky * dil) - pad;
            if (iy < 0 || iy >= i32(h)) {{
                continue;
            }}
            for (var kx = 0u; kx < kw; kx = kx + 1u) {{
                let ix = i32(ox * stride + kx * dil) - pad;
                if (ix >= 0 && ix < i32(wd)) {{
                    acc = acc + x[(xc + u32(iy)) * wd + u32(ix)] * w[(wc + ky) * kw + kx];
                }}
            }}
        }}
    }}
    if (p[13] == 1u) {{
        acc = acc + bias[co];
    }}
    y[i] = acc;
}}
"#
    )
}
