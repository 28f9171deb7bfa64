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
/// Output tile edge of the matmul kernel (16 x 16 threads, 4 x 4 outputs each).
pub(crate) const TILE: u32 = 64;
/// Matmuls with at most this many rows per batch use the GEMV kernel.
pub(crate) const GEMV_MAX_ROWS: usize = 4;

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

/// Prologue shared by the matmul kernels: unpacks the params and the batch
/// offsets of `a` and `b` for batch index `bi`.
const MATMUL_PARAMS: &str = r#"
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
fn batch_offsets(bi: u32) -> vec2<u32> {
    let brank = p[11];
    var off = vec2<u32>(0u, 0u);
    var r = bi;
    for (var d = brank; d > 0u; d = d - 1u) {
        let dd = d - 1u;
        let size = p[12u + dd];
        let idx = r % size;
        r = r / size;
        off = off + idx * vec2<u32>(p[12u + brank + dd], p[12u + 2u * brank + dd]);
    }
    return off;
}
"#;

/// Batched matmul, register-blocked: a 16x16 workgroup computes a
/// `TILE x TILE` (64 x 64) output tile, 4 x 4 outputs per thread, staging
/// `TILE x 16` slices of `a` and `b` in workgroup memory. An optional bias
/// over the output columns serves `Linear`.
///
/// `out[b, i, j] = sum_k A[b](i, k) * B[b](k, j) (+ bias[j])` where
/// `A[b](i, k) = a[a_off(b) + i*a_rs + k*a_cs]` and likewise for `B`, so
/// the same kernel reads `w[n, k]` transposed for `Linear`. Tile loads walk
/// whichever dimension is contiguous so neighbouring threads read
/// neighbouring addresses.
/// Params: `[m, n, k, tiles_n, tiles_m, batch, a_rs, a_cs, b_rs, b_cs,
/// has_bias, brank, bdims[brank], a_bstr[brank], b_bstr[brank]]`.
pub(crate) fn matmul_src() -> String {
    format!(
        r#"
{MATMUL_PARAMS}
var<workgroup> ta: array<f32, {TK_TILE}>;
var<workgroup> tb: array<f32, {TK_TILE}>;
@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
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
    let lin = wid.x + wid.y * nwg.x;
    let valid = lin < tiles_n * tiles_m * batch;
    let tn = lin % tiles_n;
    let rest = lin / tiles_n;
    let tm = rest % tiles_m;
    let bi = rest / tiles_m;
    let off = batch_offsets(bi);
    let row0 = tm * {TILE}u;
    let col0 = tn * {TILE}u;
    var acc: array<f32, 16>;
    for (var e = 0u; e < 16u; e = e + 1u) {{
        acc[e] = 0.0;
    }}
    let ktiles = (k + 15u) / 16u;
    for (var t = 0u; t < ktiles; t = t + 1u) {{
        for (var e = 0u; e < 4u; e = e + 1u) {{
            let idx = li + e * 256u;
            // a slice: rows row0.., depth t*16..; walk the contiguous dim.
            var r = idx % {TILE}u;
            var kk = idx / {TILE}u;
            if (a_cs == 1u) {{
                r = idx / 16u;
                kk = idx % 16u;
            }}
            let gr = row0 + r;
            let ga = t * 16u + kk;
            var va = 0.0;
            if (valid && gr < m && ga < k) {{
                va = a[off.x + gr * a_rs + ga * a_cs];
            }}
            ta[kk * {TILE}u + r] = va;
            var c = idx % {TILE}u;
            var kb = idx / {TILE}u;
            if (b_rs == 1u && b_cs != 1u) {{
                c = idx / 16u;
                kb = idx % 16u;
            }}
            let gc = col0 + c;
            let gb = t * 16u + kb;
            var vb = 0.0;
            if (valid && gb < k && gc < n) {{
                vb = b[off.y + gb * b_rs + gc * b_cs];
            }}
            tb[kb * {TILE}u + c] = vb;
        }}
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk = kk + 1u) {{
            let ab = kk * {TILE}u + lid.y * 4u;
            let bb = kk * {TILE}u + lid.x * 4u;
            let av = vec4<f32>(ta[ab], ta[ab + 1u], ta[ab + 2u], ta[ab + 3u]);
            let bv = vec4<f32>(tb[bb], tb[bb + 1u], tb[bb + 2u], tb[bb + 3u]);
            for (var r = 0u; r < 4u; r = r + 1u) {{
                acc[r * 4u] = acc[r * 4u] + av[r] * bv.x;
                acc[r * 4u + 1u] = acc[r * 4u + 1u] + av[r] * bv.y;
                acc[r * 4u + 2u] = acc[r * 4u + 2u] + av[r] * bv.z;
                acc[r * 4u + 3u] = acc[r * 4u + 3u] + av[r] * bv.w;
            }}
        }}
        workgroupBarrier();
    }}
    if (valid) {{
        for (var r = 0u; r < 4u; r = r + 1u) {{
            let row = row0 + lid.y * 4u + r;
            for (var c = 0u; c < 4u; c = c + 1u) {{
                let col = col0 + lid.x * 4u + c;
                if (row < m && col < n) {{
                    var v = acc[r * 4u + c];
                    if (p[10] == 1u) {{
                        v = v + bias[col];
                    }}
                    y[bi * m * n + row * n + col] = v;
                }}
            }}
        }}
    }}
}}
"#,
        TK_TILE = 16 * TILE
    )
}

/// Matrix-vector shaped matmul (few rows): one 64-thread workgroup per
/// output element reduces over `k`, so decode-time `Linear` reads each weight
/// row with neighbouring threads on neighbouring addresses.
/// Same params as [`matmul_src`] (`tiles_n`, `tiles_m` unused).
pub(crate) fn gemv_src() -> String {
    format!(
        r#"
{MATMUL_PARAMS}
var<workgroup> sh: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
    let m = p[0];
    let n = p[1];
    let k = p[2];
    let batch = p[5];
    let a_rs = p[6];
    let a_cs = p[7];
    let b_rs = p[8];
    let b_cs = p[9];
    let lin = wid.x + wid.y * nwg.x;
    let valid = lin < m * n * batch;
    let j = lin % n;
    let rest = lin / n;
    let i = rest % m;
    let bi = rest / m;
    let off = batch_offsets(bi);
    var acc = 0.0;
    if (valid) {{
        let ab = off.x + i * a_rs;
        let bb = off.y + j * b_cs;
        for (var kk = li; kk < k; kk = kk + 64u) {{
            acc = acc + a[ab + kk * a_cs] * b[bb + kk * b_rs];
        }}
    }}
    sh[li] = acc;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {{
        if (li < s) {{
            sh[li] = sh[li] + sh[li + s];
        }}
        workgroupBarrier();
    }}
    if (valid && li == 0u) {{
        var v = sh[0];
        if (p[10] == 1u) {{
            v = v + bias[j];
        }}
        y[bi * m * n + i * n + j] = v;
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

/// Softmax over one dim seen as `[outer, cols, inner]`, one workgroup per
/// `(outer, inner)` line. Params: `[rows = outer * inner, cols, inner]`.
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
    let inner = p[2];
    let base = (row / inner) * cols * inner + row % inner;
    var mx = -3.4028234663852886e38;
    if (valid) {{
        for (var c = li; c < cols; c = c + {WG}u) {{
            mx = max(mx, x[base + c * inner]);
        }}
    }}
    mx = wg_max(li, mx);
    var s = 0.0;
    if (valid) {{
        for (var c = li; c < cols; c = c + {WG}u) {{
            s = s + exp(x[base + c * inner] - mx);
        }}
    }}
    s = wg_sum(li, s);
    if (valid) {{
        for (var c = li; c < cols; c = c + {WG}u) {{
            y[base + c * inner] = exp(x[base + c * inner] - mx) / s;
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

/// Inclusive cumulative sum over one dim seen as `[outer, len, inner]`, one
/// thread per line. Params: `[lines, len, inner]`.
pub(crate) fn cumsum_src() -> String {
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
    let base = (i / inner) * len * inner + i % inner;
    var acc = 0.0;
    for (var j = 0u; j < len; j = j + 1u) {{
        acc = acc + x[base + j * inner];
        y[base + j * inner] = acc;
    }}
}}
"#
    )
}

/// Reflect (torch: the edge is not repeated) or replicate padding of one
/// dim seen as `[outer, n, inner]`. Params: `[n_out, out_len, n, inner, before, mode]`
/// with mode 0 reflect, 1 replicate.
pub(crate) fn pad_src() -> String {
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
    let out_len = p[1];
    let n = i32(p[2]);
    let inner = p[3];
    let r = i / inner;
    let pos = r % out_len;
    let o = r / out_len;
    var src = i32(pos) - i32(p[4]);
    if (p[5] == 0u) {{
        if (src < 0) {{
            src = -src;
        }}
        if (src >= n) {{
            src = 2 * (n - 1) - src;
        }}
    }} else {{
        src = clamp(src, 0, n - 1);
    }}
    y[i] = x[(o * u32(n) + u32(src)) * inner + i % inner];
}}
"#
    )
}

/// torch.gather along `dim`: `out[..i..] = x[..idx[..i..]..]` with indices
/// range-checked on the host. Params: `[n, rank, dim, out_dims[rank], x_strides[rank]]`.
pub(crate) fn gather_src() -> String {
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
    let r = p[1];
    let dim = p[2];
    var rem = i;
    var src = 0u;
    for (var d = r; d > 0u; d = d - 1u) {{
        let dd = d - 1u;
        let size = p[3u + dd];
        var c = rem % size;
        rem = rem / size;
        if (dd == dim) {{
            c = idx[i];
        }}
        src = src + c * p[3u + r + dd];
    }}
    y[i] = x[src];
}}
"#
    )
}
