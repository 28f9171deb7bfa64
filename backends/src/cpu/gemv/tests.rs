use super::portable::f16_at;
use super::*;

fn lcg(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn f32_rows_equal_one_row_gemvs() {
    let (n, k) = (37, 70);
    let w = lcg(n * k, 5);
    let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    for m in 1..=8 {
        let x = lcg(m * k, 6 + m as u32);
        let y = gemv_f32_rows(&w, &x, m, n).expect("shapes fit");
        for r in 0..m {
            let one = gemv(WeightFormat::F32, &wb, &x[r * k..(r + 1) * k], n).expect("fit");
            assert_eq!(&y[r * n..(r + 1) * n], &one[..], "m={m} row {r}");
        }
    }
    assert!(gemv_f32_rows(&w, &lcg(2 * k + 1, 1), 2, n).is_none());
}

#[test]
fn f32_gemv_avx_and_portable_agree_on_odd_sizes() {
    for &(n, k) in &[(1usize, 1usize), (7, 33), (33, 129), (5, 96)] {
        let w = lcg(n * k, 1);
        let x = lcg(k, 2);
        let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let y = gemv(WeightFormat::F32, &wb, &x, n).expect("shapes fit");
        for (j, yj) in y.iter().enumerate() {
            let want: f64 = (0..k).map(|i| w[j * k + i] as f64 * x[i] as f64).sum();
            assert!((*yj as f64 - want).abs() < 1e-4, "n{n} k{k} row {j}");
            let p = portable::dot_f32(&wb[j * 4 * k..(j + 1) * 4 * k], &x);
            assert!((p - yj).abs() < 1e-4);
        }
    }
}

const QFORMATS: [WeightFormat; 4] = [
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
    WeightFormat::Q5_0,
];

/// The formats [`pack`] lays out in tiles (all four; which instruction
/// sets read them is [`packs_on`]'s answer).
const PACKED: [WeightFormat; 4] = QFORMATS;

/// Rows of random blocks; every block has its own f16 scale (0.01 to
/// 0.06) and, for Q4_1, minimum (-0.5 to 0), so a kernel that pairs a
/// block with its neighbour's scale fails. Q8_0 codes cover -128..127.
fn blocks(fmt: WeightFormat, n: usize, k: usize, seed: u32) -> Vec<u8> {
    let bs = fmt.row_bytes(32);
    let r = lcg(n * fmt.row_bytes(k), seed);
    let mut out = Vec::with_capacity(r.len());
    for (b, rb) in r.chunks_exact(bs).enumerate() {
        let u = |i: usize| (rb[i] + 1.0) / 2.0;
        let d = half::f16::from_f32(0.01 + 0.05 * u(0)).to_le_bytes();
        let m = half::f16::from_f32(-0.5 * u(1)).to_le_bytes();
        for (i, v) in rb.iter().enumerate() {
            out.push(match (i, fmt) {
                (0 | 1, _) => d[i],
                (2 | 3, WeightFormat::Q4_1) => m[i - 2],
                // Every 7th block holds the extreme codes.
                _ if b % 7 == 3 => [0x00, 0xff, 0x80, 0x0f, 0xf0][i % 5],
                _ => ((v + 1.0) * 127.99) as u8,
            });
        }
    }
    out
}

/// (scale, min, 32 integer codes) of each block of a row.
fn decode(fmt: WeightFormat, row: &[u8]) -> Vec<(f64, f64, Vec<i64>)> {
    row.chunks_exact(fmt.row_bytes(32))
        .map(|b| {
            let (m, q0) = match fmt {
                WeightFormat::Q4_1 => (f16_at(&b[2..]) as f64, 4),
                WeightFormat::Q5_0 => (0.0, 6),
                _ => (0.0, 2),
            };
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let codes = (0..32)
                .map(|e| match fmt {
                    WeightFormat::Q8_0 => b[q0 + e] as i8 as i64,
                    _ => {
                        let byte = b[q0 + e % 16];
                        let nib = (if e < 16 { byte & 15 } else { byte >> 4 }) as i64;
                        match fmt {
                            WeightFormat::Q4_0 => nib - 8,
                            WeightFormat::Q5_0 => nib + 16 * ((qh >> e) & 1) as i64 - 16,
                            _ => nib,
                        }
                    }
                })
                .collect();
            (f16_at(b) as f64, m, codes)
        })
        .collect()
}

/// `m` activation rows of `k` values with one all-zero block (scale 0)
/// and one block of a thousand times the others' range.
fn activations(m: usize, k: usize, seed: u32) -> Vec<f32> {
    let mut x = lcg(m * k, seed);
    for r in 0..m {
        let row = &mut x[r * k..(r + 1) * k];
        if k >= 64 {
            row[32..64].fill(0.0);
        }
        if k >= 96 {
            row[64..96].iter_mut().for_each(|v| *v *= 1000.0);
        }
    }
    x
}

/// Every instruction set this machine runs.
fn paths() -> Vec<Isa> {
    Isa::available()
}

/// Against f64 arithmetic on the dequantized weights and the exact
/// activations. Error bound: quantizing an activation to int8 moves it
/// by at most half its block's step `d_x = max|x| / 127`, so output j
/// is off by at most `sum_blocks d_x / 2 * sum_e |d_w q_e|` (q_e the
/// signed code: Q4_0's offset is applied exactly through integer sums,
/// Q4_1's minimum multiplies the exact f32 block sum), plus f32 rounding
/// of the products and sums, bounded here by `1e-5 * sum |w x|` (about
/// 80 f32 epsilons).
#[test]
fn quantized_matmul_matches_f64_reference_within_int8_bound() {
    for fmt in QFORMATS {
        for k in [32usize, 64, 96, 160, 576] {
            for n in [1usize, 3, 7, 13] {
                let w = blocks(fmt, n, k, 9 + k as u32);
                let rb = fmt.row_bytes(k);
                let dec: Vec<_> = (0..n).map(|j| decode(fmt, &w[j * rb..][..rb])).collect();
                for m in 1..=9 {
                    let x = activations(m, k, 7 * m as u32);
                    for isa in paths() {
                        let y = matmul_with(fmt, &w, n, &x, m, isa, false).expect("shapes fit");
                        for r in 0..m {
                            let xr = &x[r * k..(r + 1) * k];
                            for (j, blocks) in dec.iter().enumerate() {
                                let (mut want, mut bound, mut mag) = (0f64, 0f64, 0f64);
                                for (b, (d, mn, codes)) in blocks.iter().enumerate() {
                                    let xs = &xr[32 * b..32 * b + 32];
                                    let amax = xs.iter().fold(0f64, |a, v| a.max(v.abs() as f64));
                                    let mut wq = 0f64;
                                    for (c, xv) in codes.iter().zip(xs) {
                                        let wv = d * *c as f64 + mn;
                                        want += wv * *xv as f64;
                                        mag += (wv.abs() + mn.abs()) * (xv.abs() as f64);
                                        wq += (d * *c as f64).abs();
                                    }
                                    bound += amax / 127.0 / 2.0 * wq;
                                }
                                let got = y[r * n + j] as f64;
                                let tol = bound + 1e-5 * mag + 1e-6;
                                assert!(
                                    (got - want).abs() <= tol,
                                    "{fmt:?} isa={isa:?} k={k} n={n} m={m} [{r}, {j}]: \
                                     {got} vs {want} (bound {tol})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Against the integer arithmetic the kernels promise (the int8 codes
/// and scales recomputed here, products summed exactly in i64): only
/// f32 rounding remains, well under `1e-5 * sum |terms|`. Catches a
/// wrong rounding mode or scale that the int8 bound above could hide.
#[test]
fn quantized_matmul_is_the_int8_arithmetic() {
    let (n, k, m) = (6, 160, 5);
    let x = activations(m, k, 3);
    for fmt in QFORMATS {
        let w = blocks(fmt, n, k, 4);
        let rb = fmt.row_bytes(k);
        for isa in paths() {
            let y = matmul_with(fmt, &w, n, &x, m, isa, false).expect("shapes fit");
            for r in 0..m {
                for j in 0..n {
                    let (mut want, mut mag) = (0f64, 0f64);
                    for (b, (d, mn, codes)) in
                        decode(fmt, &w[j * rb..][..rb]).into_iter().enumerate()
                    {
                        let xs = &x[r * k + 32 * b..][..32];
                        let dx = xs.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                        let id = if dx > 0.0 { 1.0 / dx } else { 0.0 };
                        let q: Vec<i64> = xs
                            .iter()
                            .map(|v| (v * id).round_ties_even() as i64)
                            .collect();
                        let s: i64 = codes.iter().zip(&q).map(|(c, qv)| c * qv).sum();
                        let sx: f64 = xs.iter().map(|v| *v as f64).sum();
                        let t = d * dx as f64 * s as f64 + mn * sx;
                        want += t;
                        // sum |w x| over the elements: the kernels add
                        // partial sums of a block (per SIMD lane) whose
                        // magnitudes can exceed the block's total.
                        let abs_s: i64 = codes.iter().zip(&q).map(|(c, qv)| (c * qv).abs()).sum();
                        let abs_sx: f64 = xs.iter().map(|v| (*v as f64).abs()).sum();
                        mag += (d * dx as f64).abs() * abs_s as f64 + (mn * abs_sx).abs();
                    }
                    let got = y[r * n + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * mag + 1e-6,
                        "{fmt:?} isa={isa:?} [{r}, {j}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// A prefill row (any tile shape, any thread split) is the one-row
/// result, bit for bit.
#[test]
fn multi_row_results_equal_the_one_row_kernel() {
    for fmt in QFORMATS {
        for (n, k) in [(13usize, 96usize), (9, 576), (40, 64)] {
            let w = blocks(fmt, n, k, 11);
            for m in 1..=9 {
                let x = activations(m, k, 5);
                for isa in paths() {
                    let y = matmul_with(fmt, &w, n, &x, m, isa, false).expect("shapes fit");
                    for r in 0..m {
                        let one = matmul_with(fmt, &w, n, &x[r * k..(r + 1) * k], 1, isa, false)
                            .expect("shapes fit");
                        let got: Vec<u32> =
                            y[r * n..(r + 1) * n].iter().map(|v| v.to_bits()).collect();
                        let want: Vec<u32> = one.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(got, want, "{fmt:?} isa={isa:?} n={n} k={k} m={m} row {r}");
                    }
                }
            }
        }
    }
}

/// Every path (plain Rust, AVX2 maddubs, AVX-VNNI, AVX-512 VNNI, wide, VBMI)
/// forms the same exact block sums and adds them in the same order: equal
/// bit for bit, for one row, four-row groups and the rows after them, odd
/// and even block counts and pair counts.
#[test]
fn all_paths_agree_bit_for_bit() {
    let simd = paths();
    for fmt in QFORMATS {
        for (n, k, m) in [
            (13usize, 96usize, 1usize),
            (9, 576, 5),
            (40, 160, 2),
            (7, 224, 9),
            (6, 32, 4),
            (5, 64, 8),
            // Whole groups of 16 weight rows and 8+ activation rows: the
            // AMX tiles where granted (one and two groups of 16
            // activation rows, partial last groups, rows after them).
            (37, 96, 20),
            (48, 160, 33),
            (16, 32, 8),
            (32, 288, 16),
        ] {
            let w = blocks(fmt, n, k, 21);
            let x = activations(m, k, 8);
            let ys: Vec<Vec<u32>> = simd
                .iter()
                .map(|isa| {
                    let y = matmul_with(fmt, &w, n, &x, m, *isa, false).expect("shapes fit");
                    y.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            for (isa, y) in simd.iter().zip(&ys) {
                assert_eq!(
                    y, &ys[0],
                    "{fmt:?} {isa:?} vs {:?} n={n} k={k} m={m}",
                    simd[0]
                );
            }
        }
    }
}

#[test]
fn shapes_that_do_not_fit_are_refused() {
    let w = blocks(WeightFormat::Q4_1, 2, 64, 1);
    let x = lcg(64, 2);
    assert!(matmul(WeightFormat::Q4_1, &w, 2, &x, 1).is_some());
    assert!(matmul(WeightFormat::Q4_1, &w, 3, &x, 1).is_none());
    assert!(matmul(WeightFormat::Q4_1, &w, 2, &x[..63], 1).is_none());
    assert!(matmul(WeightFormat::Q4_1, &w[..40], 1, &x[..48], 1).is_none());
    assert!(matmul(WeightFormat::Q4_1, &w, 2, &x, 0).is_none());
    assert!(matmul(WeightFormat::F32, &w, 2, &x, 1).is_none());
}
/// [`pack`] and [`unpack`] are inverse for every row count (whole
/// tiles, a tail, both; 3437 rows of 576: several of `pack`'s 1 MB
/// parallel chunks, the last one short, and a tail) and block count (odd
/// too); other formats and sizes are refused.
#[test]
fn packing_round_trips() {
    for fmt in PACKED {
        for k in [32usize, 64, 96, 160, 576] {
            let big: &[usize] = if k == 576 { &[3437] } else { &[] };
            for &n in [1usize, 3, 4, 5, 8, 13].iter().chain(big) {
                let w = blocks(fmt, n, k, 31 + n as u32);
                let p = pack(fmt, &w, n, k).expect("fits");
                assert_eq!(p.len(), w.len());
                if n >= PACK_ROWS {
                    assert_ne!(p, w, "{fmt:?} n={n} k={k}: the tiles moved");
                }
                assert_eq!(
                    unpack(fmt, &p, n, k).expect("fits"),
                    w,
                    "{fmt:?} n={n} k={k}"
                );
            }
        }
    }
    let w = blocks(WeightFormat::Q4_1, 4, 64, 1);
    assert!(pack(WeightFormat::Q4_1, &w, 4, 64).is_some());
    assert!(pack(WeightFormat::Q4_1, &w, 3, 64).is_none());
    assert!(pack(WeightFormat::Q4_1, &w, 4, 48).is_none());
    assert!(pack(WeightFormat::F32, &[0u8; 4 * 4 * 64], 4, 64).is_none());
}

/// The packed tile layout's known positions: row 1's nibbles of block
/// 1, and the scale of row 2's block 0, of the first pair.
#[test]
fn packed_layout_puts_a_pair_side_by_side() {
    let fmt = WeightFormat::Q4_1;
    let (n, k) = (4, 64);
    let w = blocks(fmt, n, k, 5);
    let p = pack(fmt, &w, n, k).expect("fits");
    let (rb, bb) = (fmt.row_bytes(k), 20);
    assert_eq!(&p[32 + 16..64], &w[rb + bb + 4..rb + 2 * bb]);
    assert_eq!(&p[128 + 4..128 + 6], &w[2 * rb..2 * rb + 2]);
    assert_eq!(
        &p[144 + 8 + 6..144 + 8 + 8],
        &w[3 * rb + bb + 2..3 * rb + bb + 4]
    );
}

/// Packed weights give the GGML-layout kernels' results bit for bit,
/// decode and prefill, with and without a tail of unpacked rows.
#[test]
fn packed_matmul_is_the_unpacked_bits() {
    let isas: Vec<Isa> = paths()
        .into_iter()
        .filter(|i| packs_on(WeightFormat::Q4_1, *i))
        .collect();
    if isas.is_empty() {
        eprintln!("no 256-bit int8 kernel on this machine: nothing packs");
    }
    for fmt in PACKED {
        let isas: Vec<Isa> = isas.iter().copied().filter(|&i| packs_on(fmt, i)).collect();
        for (n, k) in [
            (1usize, 64usize),
            (4, 32),
            (5, 96),
            (8, 160),
            (13, 576),
            (40, 64),
        ] {
            let w = blocks(fmt, n, k, 17 + k as u32);
            let p = pack(fmt, &w, n, k).expect("fits");
            for m in [1usize, 2, 5, 9] {
                let x = activations(m, k, 3 + m as u32);
                for &isa in &isas {
                    let want = matmul_with(fmt, &w, n, &x, m, isa, false).expect("fits");
                    let got = matmul_with(fmt, &p, n, &x, m, isa, true).expect("fits");
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{fmt:?} {isa:?} n={n} k={k} m={m}");
                }
            }
        }
    }
    let w = blocks(WeightFormat::Q4_1, 4, 64, 1);
    assert!(matmul_with(
        WeightFormat::Q4_1,
        &w,
        4,
        &lcg(64, 1),
        1,
        Isa::Portable,
        true
    )
    .is_none());
}

/// Rows read in place from packed weights are the unpacked rows.
#[test]
fn packed_rows_are_the_ggml_rows() {
    for fmt in PACKED {
        for (n, k) in [(4usize, 32usize), (7, 96), (13, 576), (8, 64)] {
            let w = blocks(fmt, n, k, 41);
            let p = pack(fmt, &w, n, k).expect("fits");
            let rb = fmt.row_bytes(k);
            let ids: Vec<usize> = (0..n).rev().chain([0, n - 1]).collect();
            let got = packed_rows(fmt, &p, n, k, &ids).expect("fits");
            let want: Vec<u8> = ids
                .iter()
                .flat_map(|&j| w[j * rb..(j + 1) * rb].to_vec())
                .collect();
            assert_eq!(got, want, "{fmt:?} n={n} k={k}");
            assert!(packed_rows(fmt, &p, n, k, &[n]).is_none());
        }
    }
}
