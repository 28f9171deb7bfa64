use super::gemv::WeightFormat;
use super::tensors::ggml_dtype;
use super::*;
use edgeflow_runtime::{DType, Device};

/// `len` pseudo-random values in -1..1 from `seed` (xorshift), for the
/// kernels' tests across this module.
pub(super) fn values(len: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec_f32()
        .expect("host f32")
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// A quantized matrix placed on the CPU (packed into the kernels' tiles where
/// this machine reads them packed) gives what the GGML-layout tensor
/// gives, bit for bit: linear (decode, prefill, bias), embedding rows,
/// dequantization, any other op, and the bytes it downloads to.
#[test]
fn placed_quantized_weights_give_the_ggml_layout_results() {
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let dev = Device::new(cpu.clone(), cpu);
    for dt in [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0] {
        // 13 rows: three whole tiles and a tail row; 96 values: an odd
        // block count.
        let w = dev
            .cast(
                &rng::rand_normal_host(&[13, 96], 0.0, 0.3, 7).expect("w"),
                dt,
            )
            .expect("quantize");
        let placed = dev.place(&w).expect("place");
        let packed = PackedWeights::of(&placed).is_some();
        let fmt =
            WeightFormat::of_ggml(ggml_dtype(dt).expect("block format")).expect("block format");
        assert_eq!(
            packed,
            gemv::packs(fmt),
            "{dt}: packed where the kernels read it"
        );
        assert_eq!(placed.size_bytes(), w.size_bytes());
        assert_eq!(placed.dtype(), dt);
        // Placing again keeps it as it is.
        let again = dev.place(&placed).expect("place again");
        assert_eq!(PackedWeights::of(&again).is_some(), packed);
        let b = rng::rand_normal_host(&[13], 0.0, 1.0, 8).expect("b");
        for rows in [1usize, 3, 6] {
            let x = rng::rand_normal_host(&[rows, 96], 0.0, 1.0, rows as u64).expect("x");
            let want = dev.linear(&x, &w, Some(&b)).expect("ggml layout");
            let got = dev.linear(&x, &placed, Some(&b)).expect("placed");
            assert_eq!(bits(&got), bits(&want), "{dt} linear, {rows} rows");
        }
        let idx = Tensor::from_i64(vec![12, 0, 5, 3, 12], &[5]).expect("idx");
        let want = dev.index_select(&w, &idx, 0).expect("ggml rows");
        let got = dev.index_select(&placed, &idx, 0).expect("placed rows");
        assert_eq!(bits(&got), bits(&want), "{dt} index_select");
        let bad = Tensor::from_i64(vec![13], &[1]).expect("idx");
        let e = dev
            .index_select(&placed, &bad, 0)
            .expect_err("out of range");
        assert!(e.to_string().contains("out of range"), "{e}");
        let want = dev.cast(&w, DType::F32).expect("dequantize");
        let got = dev.cast(&placed, DType::F32).expect("dequantize placed");
        assert_eq!(bits(&got), bits(&want), "{dt} cast");
        let got = dev.transpose(&placed, 0, 1).expect("another op");
        let want = dev.transpose(&w, 0, 1).expect("another op");
        assert_eq!(bits(&got), bits(&want), "{dt} transpose");
        let back = dev.to_host(&placed).expect("download");
        let (Storage::Quantized(a), Storage::Quantized(o)) = (back.storage(), w.storage()) else {
            panic!("{dt}: downloads as a quantized host tensor");
        };
        assert_eq!(
            a.data().expect("bytes").as_ref(),
            o.data().expect("bytes").as_ref()
        );
    }
}

/// `conv_transpose1d` on the polyphase direct kernel agrees with
/// candle's scatter form (plus the bias) over upsampling shapes and
/// the odd ones: kernel shorter than the stride, stride 1, padding
/// past the kernel, output padding, a long input (spans padded inside
/// the tasks), one output channel, batch 2. Dilation and groups fall
/// back to candle. Tolerance: 1e-4 of the output's largest value (f32
/// sums in a different order over up to 256 x 3 products).
/// f32 convolution weights placed on the CPU keep the direct kernel's
/// packs from their first use (one per way they are used), and every op
/// gives on them the bits it gives on the plain tensor: convolution,
/// fused convolution with phases, transposed convolution, an element-wise
/// op, and the values they download to. Small tensors stay plain.
#[test]
fn placed_convolution_weights_keep_their_packs_and_give_the_plain_results() {
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let dev = Device::new(cpu.clone(), cpu);
    let w = rng::rand_normal_host(&[64, 32, 3], 0.0, 0.2, 11).expect("w");
    let placed = dev.place(&w).expect("place");
    assert!(
        pack_cache::PlacedConv::of(&placed).is_some(),
        "kept as placed conv weights"
    );
    assert_eq!(placed.dims(), w.dims());
    assert_eq!(placed.size_bytes(), w.size_bytes(), "no pack before a use");
    let again = dev.place(&placed).expect("place again");
    assert!(pack_cache::PlacedConv::of(&again).is_some());
    let b = rng::rand_normal_host(&[64], 0.0, 1.0, 12).expect("b");
    let x = rng::rand_normal_host(&[2, 32, 70], 0.0, 1.0, 13).expect("x");
    let cfg = edgeflow_runtime::ConvCfg {
        padding: 1,
        ..Default::default()
    };
    for _ in 0..2 {
        let want = dev.conv1d(&x, &w, Some(&b), cfg).expect("plain");
        let got = dev.conv1d(&x, &placed, Some(&b), cfg).expect("placed");
        assert_eq!(bits(&got), bits(&want), "conv1d");
    }
    let one_pack = placed.size_bytes();
    assert!(
        one_pack > w.size_bytes(),
        "the pack is kept with the weights"
    );
    let want = dev
        .conv1d_fused_phases(&x, &w, &b, cfg, Some(0.1), None, 2)
        .expect("plain");
    let got = dev
        .conv1d_fused_phases(&x, &placed, &b, cfg, Some(0.1), None, 2)
        .expect("placed");
    assert_eq!(bits(&got), bits(&want), "conv1d with phases");
    assert!(
        placed.size_bytes() > one_pack,
        "a second pack for the phases"
    );
    // As a transposed convolution's [c_in, c_out, k]: 64 in, 32 out.
    let xt = rng::rand_normal_host(&[1, 64, 20], 0.0, 1.0, 14).expect("x");
    let bt = rng::rand_normal_host(&[32], 0.0, 1.0, 15).expect("b");
    let tcfg = edgeflow_runtime::ConvTransposeCfg {
        stride: 3,
        ..Default::default()
    };
    let want = dev
        .conv_transpose1d(&xt, &w, Some(&bt), tcfg)
        .expect("plain");
    let got = dev
        .conv_transpose1d(&xt, &placed, Some(&bt), tcfg)
        .expect("placed");
    assert_eq!(bits(&got), bits(&want), "conv_transpose1d");
    let want = dev.mul(&w, &w).expect("plain");
    let got = dev.mul(&placed, &placed).expect("placed");
    assert_eq!(bits(&got), bits(&want), "element-wise");
    assert_eq!(bits(&dev.to_host(&placed).expect("down")), bits(&w));
    // A small weight or one of another rank stays a plain host tensor.
    for dims in [&[4usize, 4, 3][..], &[6144][..]] {
        let t = rng::rand_normal_host(dims, 0.0, 1.0, 16).expect("t");
        assert!(dev.place(&t).expect("place").is_host(), "{dims:?}");
    }
}

/// f32 linear weights placed on the CPU stay plain through products of
/// fewer than five rows and give their bits; the first product of five
/// rows or more packs them, after which only the pack is held (80 rows
/// pad to 96 lanes). On the pack, linear gives the bits of this crate's
/// GEMM on the plain weights for 5 to 29 rows, and within 1e-5 of the
/// output's largest value for 1 to 100 rows (another summation order
/// than the GEMV's, and than the `gemm` crate's where it takes 64 rows
/// or more). An op that reads the plain values afterwards gets them back
/// exactly, and both forms are kept from then on.
#[test]
fn placed_linear_weights_pack_on_prefill_and_give_the_plain_results() {
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let dev = Device::new(cpu.clone(), cpu);
    let (n, k) = (80, 768);
    let w = rng::rand_normal_host(&[n, k], 0.0, 0.2, 21).expect("w");
    let b = rng::rand_normal_host(&[n], 0.0, 1.0, 22).expect("b");
    let placed = dev.place(&w).expect("place");
    assert!(placed_linear::PlacedLinear::of(&placed).is_some());
    assert_eq!(placed.size_bytes(), w.size_bytes());
    let x = |rows: usize| rng::rand_normal_host(&[rows, k], 0.0, 1.0, 23 + rows as u64).expect("x");
    let close = |got: &Tensor, want: &Tensor, what: &str| {
        let (g, w) = (
            got.to_vec_f32().expect("got"),
            want.to_vec_f32().expect("want"),
        );
        let top = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = g
            .iter()
            .zip(&w)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= 1e-5 * top, "{what}: {worst} of {top}");
    };
    for rows in [1, 3] {
        let want = dev.linear(&x(rows), &w, Some(&b)).expect("plain");
        let got = dev.linear(&x(rows), &placed, Some(&b)).expect("placed");
        assert_eq!(bits(&got), bits(&want), "{rows} rows on plain weights");
    }
    assert_eq!(
        placed.size_bytes(),
        w.size_bytes(),
        "not packed for a few rows"
    );
    for rows in [5, 14, 29] {
        let want = dev.linear(&x(rows), &w, Some(&b)).expect("plain");
        let got = dev.linear(&x(rows), &placed, Some(&b)).expect("placed");
        assert_eq!(bits(&got), bits(&want), "{rows} rows on the pack");
    }
    let pack = 96 * k * 4;
    assert_eq!(placed.size_bytes(), pack, "only the pack is held");
    for rows in [65, 100, 1, 3] {
        let want = dev.linear(&x(rows), &w, Some(&b)).expect("plain");
        let got = dev.linear(&x(rows), &placed, Some(&b)).expect("placed");
        close(&got, &want, &format!("{rows} rows"));
    }
    // A 3-d input and no bias.
    let x3 = rng::rand_normal_host(&[2, 7, k], 0.0, 1.0, 40).expect("x3");
    let want = dev.linear(&x3, &w, None).expect("plain");
    let got = dev.linear(&x3, &placed, None).expect("placed");
    assert_eq!(got.dims(), &[2, 7, n]);
    assert_eq!(bits(&got), bits(&want), "3-d input");
    assert_eq!(
        bits(&dev.mul(&placed, &placed).expect("placed")),
        bits(&dev.mul(&w, &w).expect("plain"))
    );
    assert_eq!(
        placed.size_bytes(),
        pack + w.size_bytes(),
        "both forms kept"
    );
    assert_eq!(bits(&dev.to_host(&placed).expect("down")), bits(&w));
}

/// bf16 weights: plain until their first product (a lookup leaves them
/// so), then packed, in pairs where the CPU has the bf16 dot product and
/// widened elsewhere; products within the rounding of
/// the activations to bf16 (2^-9 relative per value, so a 2^-8 share of the
/// sum of absolute products) of the f32 product on the same weights; the
/// plain values come back exactly.
#[test]
fn placed_bf16_weights_run_near_the_f32_product_and_give_their_values_back() {
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let dev = Device::new(cpu.clone(), cpu);
    let (n, k) = (80, 301);
    let w32 = rng::rand_normal_host(&[n, k], 0.0, 0.2, 31).expect("w");
    let w = dev.host().cast(&w32, DType::BF16).expect("bf16");
    let wide = dev.host().cast(&w, DType::F32).expect("widened");
    let b = rng::rand_normal_host(&[n], 0.0, 1.0, 32).expect("b");
    let placed = dev.place(&w).expect("place");
    assert_eq!(placed.dtype(), DType::BF16);
    let p = placed_linear::PlacedBf16::of(&placed).expect("placed bf16");
    assert_eq!(p.pairs(), bf16_gemm::available());
    // Plain until the first product; a lookup does not pack them.
    assert_eq!(placed.size_bytes(), n * k * 2);
    let ids = Tensor::from_i64(vec![3, 0, 79], &[3]).expect("ids");
    let rows = dev.index_select(&placed, &ids, 0).expect("lookup");
    assert_eq!(rows.dims(), &[3, k]);
    assert_eq!(placed.size_bytes(), n * k * 2, "a lookup does not pack");
    // Widened (what CPUs without the instruction get): the f32 product on
    // the widened weights, bit for bit where the f32 GEMM runs on a pack.
    let widened = placed_linear::PlacedBf16::place_as(&w, false).expect("widened");
    let wv = wide.to_vec_f32().expect("w");
    let wide_placed = dev.place(&wide).expect("place f32");
    for rows in [5, 20] {
        let x = rng::rand_normal_host(&[rows, k], 0.0, 1.0, 60 + rows as u64).expect("x");
        let want = dev.linear(&x, &wide_placed, Some(&b)).expect("f32");
        let got = dev.linear(&x, &widened, Some(&b)).expect("widened");
        assert_eq!(bits(&got), bits(&want), "{rows} rows widened");
    }
    assert_eq!(bits(&dev.to_host(&widened).expect("down")), bits(&w));
    for rows in [1, 3, 14, 33] {
        let x = rng::rand_normal_host(&[rows, k], 0.0, 1.0, 40 + rows as u64).expect("x");
        let want = dev.linear(&x, &wide, Some(&b)).expect("f32");
        let got = dev.linear(&x, &placed, Some(&b)).expect("bf16");
        assert_eq!(got.dims(), &[rows, n]);
        let (g, f, xv) = (
            got.to_vec_f32().expect("got"),
            want.to_vec_f32().expect("want"),
            x.to_vec_f32().expect("x"),
        );
        for i in 0..rows {
            for j in 0..n {
                let abs: f32 = (0..k).map(|p| (xv[i * k + p] * wv[j * k + p]).abs()).sum();
                let d = (g[i * n + j] - f[i * n + j]).abs();
                assert!(d <= abs / 256.0, "{rows} rows ({i}, {j}): {d} of {abs}");
            }
        }
    }
    // 80 outputs padded to 96; pairs of k in u32, or k widened to f32.
    let pack = if bf16_gemm::available() {
        96 * k.div_ceil(2) * 4
    } else {
        96 * k * 4
    };
    assert_eq!(placed.size_bytes(), pack, "only the pack is held");
    assert_eq!(bits(&dev.to_host(&placed).expect("down")), bits(&w));
    assert_eq!(placed.size_bytes(), pack + n * k * 2, "both forms kept");
}

#[test]
fn transposed_convolution_in_polyphase_form_matches_candle() {
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let dev = Device::new(cpu.clone(), cpu);
    // (batch, c_in, c_out, l, k, stride, padding, output_padding, dilation, groups, direct)
    let cases = [
        (1, 256, 128, 200, 16, 8, 4, 0, 1, 1, true),
        (1, 64, 32, 37, 10, 5, 3, 0, 1, 1, true),
        (2, 5, 3, 7, 4, 2, 1, 0, 1, 1, true),
        (1, 6, 5, 13, 3, 5, 0, 0, 1, 1, true),
        (1, 4, 4, 9, 5, 3, 1, 2, 1, 1, true),
        (1, 7, 9, 20, 7, 1, 3, 0, 1, 1, true),
        (1, 3, 2, 11, 1, 2, 0, 1, 1, 1, true),
        (1, 8, 4, 25, 5, 2, 6, 0, 1, 1, true),
        (2, 16, 1, 3000, 8, 4, 2, 0, 1, 1, true),
        (1, 3, 2, 9, 3, 2, 0, 0, 2, 1, false),
        (1, 4, 4, 9, 4, 2, 1, 0, 1, 2, false),
    ];
    for (i, &(batch, c_in, c_out, l, k, stride, padding, op, dil, groups, direct)) in
        cases.iter().enumerate()
    {
        let seed = 100 + 3 * i as u64;
        let x = rng::rand_normal_host(&[batch, c_in, l], 0.0, 1.0, seed).expect("x");
        let w = rng::rand_normal_host(&[c_in, c_out / groups, k], 0.0, 0.3, seed + 1).expect("w");
        let b = rng::rand_normal_host(&[c_out], 0.0, 1.0, seed + 2).expect("b");
        let cfg = edgeflow_runtime::ConvTransposeCfg {
            stride,
            padding,
            output_padding: op,
            dilation: dil,
            groups,
        };
        let got = dev.conv_transpose1d(&x, &w, Some(&b), cfg).expect("ours");
        let (cx, cw) = (x.candle("x").expect("x"), w.candle("w").expect("w"));
        let cb = b.candle("b").expect("b").reshape((1, c_out, 1)).expect("b");
        let want = cx
            .conv_transpose1d(cw, padding, op, stride, dil, groups)
            .and_then(|y| y.broadcast_add(&cb))
            .expect("candle");
        let name = format!("case {i}: {:?}", cases[i]);
        assert_eq!(got.dims(), want.dims(), "{name}");
        let took =
            conv_transpose1d_direct(cx, cw, None, Some(&b), stride, padding, op, dil, groups)
                .expect("direct");
        assert_eq!(took.is_some(), direct, "{name}: direct kernel taken");
        let got = got.to_vec_f32().expect("f32");
        let want = want
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("f32");
        let top = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst <= 1e-4 * top,
            "{name}: off by {worst} (largest {top})"
        );
    }
}

/// The fused SwiGLU gives what narrow, silu and a multiply give, bit for
/// bit: gate and up stacked (one row as decode, many rows over the pool,
/// an odd width for the vector tail) and as two tensors; a prefill row
/// equals its decode; bad shapes are refused with what to fix.
#[test]
fn swiglu_gives_the_bits_of_silu_and_a_multiply() {
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let dev = Device::new(cpu.clone(), cpu);
    for (rows, f) in [(1, 8960), (1, 13), (9, 13), (40, 1000)] {
        let gu = rng::rand_normal_host(&[1, rows, 2 * f], 0.0, 3.0, 5).expect("gu");
        let fused = dev.swiglu(&gu, None).expect("fused");
        assert_eq!(fused.dims(), &[1, rows, f]);
        let g = dev.narrow(&gu, 2, 0, f).expect("gate");
        let u = dev.narrow(&gu, 2, f, f).expect("up");
        let composed = dev.mul(&dev.silu(&g).expect("silu"), &u).expect("mul");
        assert_eq!(bits(&fused), bits(&composed), "{rows} x {f} stacked");
        let two = dev.swiglu(&g, Some(&u)).expect("two inputs");
        assert_eq!(bits(&two), bits(&composed), "{rows} x {f} gate and up");
        let last = dev.narrow(&gu, 1, rows - 1, 1).expect("last row");
        let one = dev.swiglu(&last, None).expect("one");
        let all = bits(&fused);
        assert_eq!(
            bits(&one),
            all[(rows - 1) * f..],
            "{rows} x {f}: last row alone"
        );
    }
    let odd = rng::rand_normal_host(&[2, 7], 0.0, 1.0, 1).expect("odd");
    let e = dev.swiglu(&odd, None).expect_err("odd width");
    assert!(e.to_string().contains("even last dim"), "{e}");
    let other = rng::rand_normal_host(&[2, 6], 0.0, 1.0, 1).expect("other");
    let e = dev.swiglu(&odd, Some(&other)).expect_err("shapes differ");
    assert!(e.to_string().contains("one shape"), "{e}");
}

/// A bias on the crate's own kernels (K-quant, 32-weight, read in place
/// from a contiguous `x`) gives the bits of the product without it plus a
/// broadcast add, and a transposed `x` the bits of its contiguous copy; a
/// bias of the wrong length is refused, naming both.
#[test]
fn linear_bias_on_own_kernels_is_a_broadcast_add() {
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let dev = Device::new(cpu.clone(), cpu);
    for (dt, k) in [(DType::Q4K, 512), (DType::Q6K, 256), (DType::Q8_0, 96)] {
        let w = dev
            .cast(
                &rng::rand_normal_host(&[11, k], 0.0, 0.3, 3).expect("w"),
                dt,
            )
            .expect("quantize");
        let b = rng::rand_normal_host(&[11], 0.0, 1.0, 4).expect("b");
        for rows in [1usize, 5] {
            let x = rng::rand_normal_host(&[rows, k], 0.0, 1.0, 5).expect("x");
            let got = dev.linear(&x, &w, Some(&b)).expect("with bias");
            let plain = dev.linear(&x, &w, None).expect("without");
            let bias: Vec<f32> = b.to_vec_f32().expect("b");
            let want: Vec<u32> = plain
                .to_vec_f32()
                .expect("y")
                .chunks_exact(11)
                .flat_map(|r| r.iter().zip(&bias).map(|(v, b)| (v + b).to_bits()))
                .collect();
            assert_eq!(bits(&got), want, "{dt}, {rows} rows");
            // The same rows as a transposed view (not contiguous): copied
            // for the kernel, the same bits.
            let xt = rng::rand_normal_host(&[k, rows], 0.0, 1.0, 9).expect("xt");
            let view = dev.transpose(&xt, 0, 1).expect("view");
            let dense =
                Tensor::from_vec(view.to_vec_f32().expect("values"), &[rows, k]).expect("dense");
            let a = dev.linear(&view, &w, Some(&b)).expect("view");
            let c = dev.linear(&dense, &w, Some(&b)).expect("dense");
            assert_eq!(bits(&a), bits(&c), "{dt}, {rows} rows, transposed x");
        }
        let short = rng::rand_normal_host(&[7], 0.0, 1.0, 6).expect("b");
        let x = rng::rand_normal_host(&[2, k], 0.0, 1.0, 7).expect("x");
        let e = dev.linear(&x, &w, Some(&short)).expect_err("short bias");
        assert!(e.to_string().contains("7 values for 11 outputs"), "{e}");
    }
}
