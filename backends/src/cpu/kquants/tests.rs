//! The K-quant kernels against the dequantized weights, and every path
//! against the portable one, bit for bit.

use super::*;
use candle_core::quantized::QTensor;

use crate::cpu::tests::values;

const FORMATS: [(KFormat, GgmlDType); 3] = [
    (KFormat::Q4K, GgmlDType::Q4K),
    (KFormat::Q5K, GgmlDType::Q5K),
    (KFormat::Q6K, GgmlDType::Q6K),
];

#[test]
fn matmul_matches_the_dequantized_weights() {
    let (n, k) = (9, 512);
    let dev = candle_core::Device::Cpu;
    let wv = values(n * k, 7);
    let wc = candle_core::Tensor::from_vec(wv, (n, k), &dev).expect("w");
    for (fmt, g) in FORMATS {
        let q = QTensor::quantize(&wc, g).expect("quantize");
        let deq = q
            .dequantize(&dev)
            .expect("deq")
            .flatten_all()
            .expect("flat")
            .to_vec1::<f32>()
            .expect("v");
        let data = q.data().expect("data");
        assert_eq!(data.len(), n * k / fmt.block() * fmt.block_bytes());
        for m in [1, 3] {
            let x = values(m * k, 11 + m as u32);
            let y = matmul(fmt, &data, n, &x, m).expect("fits");
            for r in 0..m {
                let xr = &x[r * k..(r + 1) * k];
                for j in 0..n {
                    let want: f64 = deq[j * k..(j + 1) * k]
                        .iter()
                        .zip(xr)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    // int8 activations: each value moves by at most half a
                    // step (amax / 254); the sum of |w| bounds the effect.
                    let wsum: f64 = deq[j * k..(j + 1) * k]
                        .iter()
                        .map(|v| f64::from(v.abs()))
                        .sum();
                    let bound = wsum / 254.0 + 1e-3;
                    let got = f64::from(y[r * n + j]);
                    assert!(
                        (got - want).abs() <= bound,
                        "{fmt:?} m {m} row {r} col {j}: {got} vs {want} (bound {bound})"
                    );
                }
            }
        }
    }
}

/// Every path (portable, AVX2 with its eight-row prefill kernels, AMX with
/// its sixteen-by-sixteen tiles where the CPU has them) and every row count
/// (whole groups of eight or sixteen, a tail, both; weight rows in whole
/// tile groups and a tail; rows longer than the prefill's chunk of
/// blocks) gives each output the bits of the one-row (decode) result.
#[test]
fn every_path_and_row_count_gives_the_same_bits() {
    let k = 1280;
    let dev = candle_core::Device::Cpu;
    // 48 rows: 36,864 values, enough for `Acts::new` to quantize on the pool.
    let x = values(48 * k, 5);
    assert!(48 * k >= PAR_ACTS);
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    // 37 / 38 / 39 weight rows: a last tile of 5 / 6 / 7 rows, which the
    // AVX2 kernel takes four and one / two / three at a time.
    for ((fmt, g), n) in FORMATS
        .into_iter()
        .flat_map(|f| [37usize, 38, 39].map(|n| (f, n)))
    {
        let wc = candle_core::Tensor::from_vec(values(n * k, 3), (n, k), &dev).expect("w");
        let q = QTensor::quantize(&wc, g).expect("quantize");
        let data = q.data().expect("data");
        let ones: Vec<Vec<f32>> = (0..48)
            .map(|r| matmul(fmt, &data, n, &x[r * k..(r + 1) * k], 1).expect("fits"))
            .collect();
        for m in [2usize, 4, 8, 9, 16, 17, 33, 48] {
            let x = &x[..m * k];
            let portable = matmul_with(fmt, &data, n, x, m, false).expect("fits");
            if has_avx2() {
                let (v, a) = (has_vnni(), has_amx());
                for (vnni, lanes_prefill, amx) in [
                    (false, false, false),
                    (v, false, false),
                    (v, true, false),
                    (v, false, a),
                ] {
                    let paths = Paths {
                        avx2: true,
                        vnni,
                        lanes_prefill,
                        amx,
                    };
                    let avx = matmul_isa(fmt, &data, n, x, m, paths).expect("fits");
                    assert_eq!(
                        bits(&portable),
                        bits(&avx),
                        "{fmt:?} m {m} vnni {vnni} lanes {lanes_prefill} amx {amx}: differs from \
                         the portable path"
                    );
                }
            }
            for (r, one) in ones.iter().enumerate().take(m) {
                assert_eq!(
                    bits(one),
                    bits(&portable[r * n..(r + 1) * n]),
                    "{fmt:?} m {m}: row {r} of a prefill differs from its decode"
                );
            }
        }
    }
}

/// Decode (one activation row) on AVX2, and on AVX-512 VNNI eight weight
/// rows at a time (whole passes and a tail of rows), gives the portable
/// bits.
#[test]
fn decode_on_every_path_gives_the_portable_bits() {
    if !has_avx2() {
        return;
    }
    let dev = candle_core::Device::Cpu;
    for (fmt, g, k) in [
        (KFormat::Q4K, GgmlDType::Q4K, 512),
        (KFormat::Q4K, GgmlDType::Q4K, 1536),
        (KFormat::Q5K, GgmlDType::Q5K, 768),
        (KFormat::Q6K, GgmlDType::Q6K, 512),
        (KFormat::Q6K, GgmlDType::Q6K, 1280),
    ] {
        for n in [7, 8, 19] {
            let wc = candle_core::Tensor::from_vec(values(n * k, 21), (n, k), &dev).expect("w");
            let q = QTensor::quantize(&wc, g).expect("quantize");
            let data = q.data().expect("data");
            let x = values(k, 23);
            let portable = matmul_with(fmt, &data, n, &x, 1, false).expect("fits");
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for vnni in [false, has_vnni()] {
                let paths = Paths {
                    avx2: true,
                    vnni,
                    lanes_prefill: false,
                    amx: false,
                };
                let avx = matmul_isa(fmt, &data, n, &x, 1, paths).expect("fits");
                assert_eq!(
                    bits(&portable),
                    bits(&avx),
                    "{fmt:?} k {k} n {n} vnni {vnni}"
                );
            }
        }
    }
}

#[test]
fn shapes_that_do_not_fit_are_refused() {
    let w = vec![0u8; 210];
    assert!(matmul(KFormat::Q6K, &w, 1, &[0.0; 128], 1).is_none());
    assert!(matmul(KFormat::Q6K, &w, 2, &[0.0; 256], 1).is_none());
    assert!(matmul(KFormat::Q6K, &w, 1, &[0.0; 256], 1).is_some());
}

/// The lane kernel's Q6_K offsetting gives the same codes and block
/// constants on AVX2 as the scalar loop.
#[test]
fn q6k_offsets_on_avx2_equal_the_scalar_ones() {
    if !has_avx2() {
        return;
    }
    let (n, k) = (3, 1024);
    let dev = candle_core::Device::Cpu;
    let wc = candle_core::Tensor::from_vec(values(n * k, 5), (n, k), &dev).expect("w");
    let q = QTensor::quantize(&wc, GgmlDType::Q6K).expect("quantize");
    let data = q.data().expect("data");
    for row in data.chunks_exact(data.len() / n) {
        let mut a = Unpacked::new(KFormat::Q6K, row, k, true);
        let mut b = Unpacked::new(KFormat::Q6K, row, k, true);
        a.offset_q6k(true);
        b.offset_q6k(false);
        assert_eq!(a.codes, b.codes);
        assert_eq!(a.offsets, b.offsets);
        assert_eq!(a.offsets.len(), k / 256);
    }
}

/// The AVX2 unpacker writes the scalar code's bytes.
#[test]
fn avx2_unpacking_equals_the_scalar_one() {
    if !has_avx2() {
        return;
    }
    let (n, k) = (3, 512);
    let dev = candle_core::Device::Cpu;
    let wc = candle_core::Tensor::from_vec(values(n * k, 9), (n, k), &dev).expect("w");
    for (fmt, g) in FORMATS {
        let q = QTensor::quantize(&wc, g).expect("quantize");
        let data = q.data().expect("data");
        let rb = data.len() / n;
        for row in data.chunks_exact(rb) {
            let (a, b) = (
                Unpacked::new(fmt, row, k, false),
                Unpacked::new(fmt, row, k, true),
            );
            assert_eq!(a.codes, b.codes, "{fmt:?}");
            assert_eq!(a.scales, b.scales, "{fmt:?}");
        }
    }
}

/// The eight-at-once unpacking gives [`scale_min_k4`]'s values for every
/// byte pattern the 6-bit fields and their high bits can take.
#[test]
fn scales_and_minima_unpack_together_as_one_by_one() {
    let mut seed = 12345u32;
    for case in 0..2000 {
        let mut s = [0u8; 12];
        for b in s.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            *b = (seed >> 8) as u8;
        }
        if case == 0 {
            s = [0xff; 12];
        }
        let (sc, mn) = scales_mins_k4(&s);
        for j in 0..8 {
            let (a, m) = scale_min_k4(j, &s);
            assert_eq!((i32::from(sc[j]), i32::from(mn[j])), (a, m), "{s:?} j {j}");
        }
    }
}

/// The activation rounding equals `round().clamp()` on every kind of value,
/// halves and the largest f32 below a half included.
#[test]
fn activation_codes_round_as_round_does() {
    let mut vs = vec![
        0.0f32, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, 126.5, -126.5, 127.4, 200.0, -1e30,
    ];
    vs.extend([
        0.49999997f32,
        -0.49999997,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    vs.extend(values(100_000, 9).iter().map(|v| v * 130.0));
    for v in vs {
        let want = v.round().clamp(-127.0, 127.0) as i8;
        assert_eq!(round_code(v), want, "{v}");
    }
}

/// The AVX2 activation quantizer gives the scalar one's codes, scales and
/// sums, on the pool and off it, with zeros, NaN, infinities and ties.
#[test]
fn avx2_activation_quantizer_gives_the_scalar_bits() {
    if !has_avx2() {
        return;
    }
    let k = 512;
    let mut x: Vec<f32> = values(80 * k, 21).iter().map(|v| v * 3.0).collect();
    x[..256].fill(0.0);
    x[300] = f32::NAN;
    x[700] = f32::INFINITY;
    x[1000] = -1e30;
    // Ties: amax 127 makes the scale 1, so x.5 values round as written.
    for (i, v) in x[1024..1280].iter_mut().enumerate() {
        *v = ((i % 200) as f32 - 100.0) + 0.5;
    }
    x[1279] = -127.0;
    for len in [k, 80 * k] {
        let x = &x[..len];
        assert_eq!(len >= PAR_ACTS, len == 80 * k);
        let (a, b) = (
            Acts::new_with(KFormat::Q4K, x, k, false),
            Acts::new_with(KFormat::Q4K, x, k, true),
        );
        assert_eq!(a.codes, b.codes, "{len} values: codes");
        assert_eq!(a.sums, b.sums, "{len} values: sums");
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.scales), bits(&b.scales), "{len} values: scales");
    }
}

/// The sixteen-lane maximum equals one running maximum, NaN and all.
#[test]
fn abs_max_is_the_running_maximum() {
    let mut x = values(1000, 4);
    x[17] = f32::NAN;
    x[400] = -3.5;
    for len in [0, 1, 15, 16, 17, 256, 1000] {
        let want = x[..len].iter().fold(0f32, |a, v| a.max(v.abs()));
        assert_eq!(abs_max(&x[..len]).to_bits(), want.to_bits(), "len {len}");
    }
}

/// Prefill speed of each format on this CPU (one thread, 128 activation
/// rows, the min of 12 calls): `cargo test -p edgeflow-backends --lib
/// prefill_speed -- --ignored --nocapture`. Prints GMAC/s; asserts nothing
/// about time (shared machines are noisy), only that it ran.
#[test]
#[ignore = "a speed probe: run it by hand"]
fn prefill_speed() {
    let dev = candle_core::Device::Cpu;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    let m = 128;
    for ((fmt, g), (n, k)) in [
        (FORMATS[0], (2240, 1536)),
        (FORMATS[2], (768, 8960)),
        (FORMATS[0], (768, 8960)),
    ] {
        let wc = candle_core::Tensor::from_vec(values(n * k, 3), (n, k), &dev).expect("w");
        let data = QTensor::quantize(&wc, g)
            .expect("quantize")
            .data()
            .expect("data")
            .into_owned();
        let x = values(m * k, 5);
        let best = pool.install(|| {
            (0..12)
                .map(|_| {
                    let t = std::time::Instant::now();
                    let y = matmul(fmt, &data, n, &x, m).expect("fits");
                    std::hint::black_box(y);
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        });
        let macs = (m * n * k) as f64;
        eprintln!(
            "{fmt:?} {n} x {k} x {m} rows: {:.2} ms, {:.1} GMAC/s",
            best * 1e3,
            macs / best / 1e9
        );
    }
}
