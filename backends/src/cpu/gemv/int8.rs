/// The int8 kernels for one x86 instruction set: `$features` for
/// `target_feature`, `$dot4(acc, u8s, i8s)` adding the 4-product sums of
/// each i32 lane, and `$vnni` when that is one instruction (both nibble
/// halves then go through it; without VNNI they add as i16 first).
#[cfg(target_arch = "x86_64")]
macro_rules! int8_kernels {
    ($name:ident, $features:literal, $dot4:path, $vnni:literal, $wide:literal, $vbmi:literal) => {
        pub(in crate::cpu::gemv) mod $name {
            use crate::cpu::gemv::{QuantRows, WeightFormat};
            use std::arch::x86_64::*;

            pub(in crate::cpu::gemv) const Q8_0: u8 = 0;
            pub(in crate::cpu::gemv) const Q4_0: u8 = 1;
            pub(in crate::cpu::gemv) const Q4_1: u8 = 2;
            pub(in crate::cpu::gemv) const Q5_0: u8 = 3;

            /// Bytes of one block.
            pub(in crate::cpu::gemv) const fn block_bytes(f: u8) -> usize {
                match f {
                    Q8_0 => 34,
                    Q4_0 => 18,
                    Q5_0 => 22,
                    _ => 20,
                }
            }

            /// Q5_0's fifth bits as 0x10 in the bytes of codes: byte `j` of
            /// each 128-bit half takes bit `j` of the 16-bit run `qh >> s`,
            /// where the shuffle index `rep` picks, per half, the two bytes
            /// of `qh` (in that half's 32-bit lanes) for bits 0-7 and 8-15.
            #[target_feature(enable = $features)]
            #[inline]
            fn fifth_bits(qh: __m256i, rep: __m256i) -> __m256i {
                let bytes = _mm256_shuffle_epi8(qh, rep);
                let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
                _mm256_and_si256(set, _mm256_set1_epi8(0x10))
            }

            // Loads: `_mm*_lddqu_si*` (unaligned, like loadu). stdarch implements
            // the `loadu` intrinsics with `ptr::copy_nonoverlapping`, whose
            // precondition checks (on in the dev profile the product builds with)
            // put a branch pair on every load of these loops and cost about half
            // their speed; `lddqu` maps straight to the instruction.

            /// 16 bytes at `p`.
            ///
            /// # Safety
            /// `p..p + 16` is readable.
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) unsafe fn load16<T>(p: *const T) -> __m128i {
                // SAFETY: the caller's contract.
                unsafe { _mm_lddqu_si128(p as *const __m128i) }
            }

            /// 32 bytes at `p`.
            ///
            /// # Safety
            /// `p..p + 32` is readable.
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) unsafe fn load32<T>(p: *const T) -> __m256i {
                // SAFETY: the caller's contract.
                unsafe { _mm256_lddqu_si256(p as *const __m256i) }
            }

            /// The f16 scales of blocks `a` and `b` (their first 16 bytes) as f16
            /// pairs in 32-bit lanes 0 and 1: `(d, m)` for Q4_1, `(d, +0)` for the
            /// others (whose second f16 slot holds quants).
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) fn scale_pairs<const F: u8>(
                a: __m128i,
                b: __m128i,
            ) -> __m128i {
                let dm = _mm_unpacklo_epi32(a, b);
                if F == Q4_1 {
                    dm
                } else {
                    _mm_blend_epi16::<0b1010_1010>(dm, _mm_setzero_si128())
                }
            }

            /// The weights of blocks `a` and `b` in the activation pair layout:
            /// (`A[0..16] B[0..16]`, `A[16..32] B[16..32]`).
            ///
            /// # Safety
            /// AVX2 available; `a` and `b` point at whole blocks.
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) unsafe fn unpack_pair<const F: u8>(
                a: *const u8,
                b: *const u8,
            ) -> (__m256i, __m256i) {
                // SAFETY: the 16-byte loads stay inside the blocks: nibbles at 2..18
                // (Q4_0), 4..20 (Q4_1) or 6..22 (Q5_0, fifth bits at 2..6),
                // quants at 2..34 (Q8_0).
                unsafe {
                    if F == Q8_0 {
                        let l =
                            _mm256_set_m128i(load16(b.wrapping_add(2)), load16(a.wrapping_add(2)));
                        let h = _mm256_set_m128i(
                            load16(b.wrapping_add(18)),
                            load16(a.wrapping_add(18)),
                        );
                        return (l, h);
                    }
                    let off = match F {
                        Q4_1 => 4,
                        Q5_0 => 6,
                        _ => 2,
                    };
                    let v =
                        _mm256_set_m128i(load16(b.wrapping_add(off)), load16(a.wrapping_add(off)));
                    let m4 = _mm256_set1_epi8(0x0f);
                    let (l, h) = (
                        _mm256_and_si256(v, m4),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
                    );
                    if F != Q5_0 {
                        return (l, h);
                    }
                    // Low nibbles are elements 0..16 of A then of B, high
                    // ones 16..32: fifth bits 0-15, then 16-31, of each.
                    let qh = _mm256_set_m128i(
                        _mm_set1_epi32((b.wrapping_add(2) as *const i32).read_unaligned()),
                        _mm_set1_epi32((a.wrapping_add(2) as *const i32).read_unaligned()),
                    );
                    let rep_l =
                        _mm256_set_epi64x(0x0101_0101_0101_0101, 0, 0x0101_0101_0101_0101, 0);
                    let rep_h = _mm256_set_epi64x(
                        0x0303_0303_0303_0303,
                        0x0202_0202_0202_0202,
                        0x0303_0303_0303_0303,
                        0x0202_0202_0202_0202,
                    );
                    (
                        _mm256_or_si256(l, fifth_bits(qh, rep_l)),
                        _mm256_or_si256(h, fifth_bits(qh, rep_h)),
                    )
                }
            }

            /// The weights of one block in plain element order.
            ///
            /// # Safety
            /// AVX2 available; `a` points at a whole block.
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) unsafe fn unpack_one<const F: u8>(a: *const u8) -> __m256i {
                // SAFETY: as in `unpack_pair`.
                unsafe {
                    if F == Q8_0 {
                        return load32(a.wrapping_add(2));
                    }
                    let off = match F {
                        Q4_1 => 4,
                        Q5_0 => 6,
                        _ => 2,
                    };
                    let raw = load16(a.wrapping_add(off));
                    let m4 = _mm_set1_epi8(0x0f);
                    let v = _mm256_set_m128i(
                        _mm_and_si128(_mm_srli_epi16::<4>(raw), m4),
                        _mm_and_si128(raw, m4),
                    );
                    if F != Q5_0 {
                        return v;
                    }
                    let qh = _mm256_set1_epi32((a.wrapping_add(2) as *const i32).read_unaligned());
                    let rep = _mm256_set_epi64x(
                        0x0303_0303_0303_0303,
                        0x0202_0202_0202_0202,
                        0x0101_0101_0101_0101,
                        0,
                    );
                    _mm256_or_si256(v, fifth_bits(qh, rep))
                }
            }

            /// `sum w * x` over byte quads, as 8 i32 partial sums of 4 products
            /// each, added to `acc`.
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) fn dot_i8<const F: u8>(
                acc: __m256i,
                w: __m256i,
                x: __m256i,
            ) -> __m256i {
                if F == Q8_0 {
                    // The unsigned operand must be |w|, and x carries w's sign
                    // (|-128| reads as the unsigned 128).
                    return $dot4(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
                }
                $dot4(acc, w, x)
            }

            /// The pair's i32 sums: lanes 0-3 block `A`, 4-7 block `B`, added to
            /// `acc`.
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) fn dot_pair<const F: u8>(
                acc: __m256i,
                l: __m256i,
                h: __m256i,
                xl: __m256i,
                xh: __m256i,
            ) -> __m256i {
                if $vnni || F == Q8_0 {
                    return dot_i8::<F>(dot_i8::<F>(acc, l, xl), h, xh);
                }
                // Codes on maddubs: at most 4 * 31 * 127 (Q5_0) per i16 lane,
                // so both halves add as i16 before one widening.
                let ones = _mm256_set1_epi16(1);
                let p = _mm256_add_epi16(_mm256_maddubs_epi16(l, xl), _mm256_maddubs_epi16(h, xh));
                _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones))
            }

            /// Per 128-bit half (one block), the totals of the four i32
            /// lanes of each of `s[0..4]`, in that order: one block's exact
            /// sums for four outputs.
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) fn reduce4(s: [__m256i; 4]) -> __m256i {
                let t0 = _mm256_add_epi32(
                    _mm256_unpacklo_epi32(s[0], s[1]),
                    _mm256_unpackhi_epi32(s[0], s[1]),
                );
                let t1 = _mm256_add_epi32(
                    _mm256_unpacklo_epi32(s[2], s[3]),
                    _mm256_unpackhi_epi32(s[2], s[3]),
                );
                _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1))
            }

            /// A block's four sums that [`reduce4`] left in two halves
            /// (an odd last block's lanes span both).
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) fn fold(v: __m256i) -> __m128i {
                _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))
            }

            /// The blocks at `a[0..4]` (one per weight row): their f16
            /// scales as u16 lanes 0-3, their second f16 (Q4_1's minimum)
            /// as lanes 4-7.
            ///
            /// # Safety
            /// Each `a[r]` points at a whole block (16 bytes or more).
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) unsafe fn row_halves(a: [*const u8; 4]) -> __m128i {
                // SAFETY: the caller's contract.
                unsafe {
                    let x01 = _mm_unpacklo_epi16(load16(a[0]), load16(a[1]));
                    let x23 = _mm_unpacklo_epi16(load16(a[2]), load16(a[3]));
                    _mm_unpacklo_epi32(x01, x23)
                }
            }

            /// Pair `p`'s scales `[A r0..r3 | B r0..r3]` of four weight rows
            /// (`w`: each row's first block) and, for Q4_1, their minima.
            ///
            /// # Safety
            /// Blocks `2p` and `2p + 1` of each row are whole.
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) unsafe fn row_scales<const F: u8>(
                w: [*const u8; 4],
                p: usize,
            ) -> (__m256, __m256) {
                let bb = block_bytes(F);
                // SAFETY: the caller's contract.
                let (xa, xb) = unsafe {
                    (
                        row_halves(w.map(|r| r.wrapping_add(2 * p * bb))),
                        row_halves(w.map(|r| r.wrapping_add((2 * p + 1) * bb))),
                    )
                };
                let d = _mm256_cvtph_ps(_mm_unpacklo_epi64(xa, xb));
                let m = if F == Q4_1 {
                    _mm256_cvtph_ps(_mm_unpackhi_epi64(xa, xb))
                } else {
                    _mm256_setzero_ps()
                };
                (d, m)
            }

            /// Four outputs from their accumulators: chains `b % 4 = 0, 2`
            /// in `acc[0]`, `acc[1]` lanes 0-3, chains 1, 3 in lanes 4-7;
            /// `(c0 + c2) + (c1 + c3)`.
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) fn finish(acc: [__m256; 2]) -> [f32; 4] {
                let t = _mm256_add_ps(acc[0], acc[1]);
                let u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
                let mut out = [0f32; 4];
                // SAFETY: 16 writable bytes.
                unsafe { _mm_storeu_ps(out.as_mut_ptr(), u) };
                out
            }

            /// `acc` with `v` added into lanes 0-3 (an odd last block).
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) fn add_low(
                acc: __m256,
                s: __m128i,
                sc: __m128,
                min: Option<__m128>,
            ) -> __m256 {
                let mut v = _mm_fmadd_ps(_mm_cvtepi32_ps(s), sc, _mm256_castps256_ps128(acc));
                if let Some(m) = min {
                    v = _mm_add_ps(v, m);
                }
                _mm256_insertf128_ps::<0>(acc, v)
            }

            /// Pair `p`'s terms of `RW` weight rows against `RX` (1 or 4)
            /// activation rows, one entry per register of outputs (one for
            /// one activation row, lanes: weight rows; else one per weight
            /// row, lanes: activation rows): the pair's exact block sums
            /// (lanes 0-3 block `2p`, 4-7 block `2p + 1`), their `d_w d_x`,
            /// and for Q4_1 the minimum terms `m_w Σx` (else zero).
            /// Prefetches the rows `pf` bytes ahead.
            ///
            /// # Safety
            /// As [`tile`], with blocks `2p`, `2p + 1` whole.
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) unsafe fn pair_terms<
                const F: u8,
                const RX: usize,
                const RW: usize,
            >(
                w: [*const u8; RW],
                x: [*const i8; RX],
                xs: [*const f32; RX],
                xo: [*const i32; RX],
                gx: [*const f32; 2],
                p: usize,
                pf: usize,
            ) -> [(__m256i, __m256, __m256); RW] {
                let bb = block_bytes(F);
                let to_scale = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2);
                let to_min = _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3);
                let mut out = [(
                    _mm256_setzero_si256(),
                    _mm256_setzero_ps(),
                    _mm256_setzero_ps(),
                ); RW];
                let mut s = [[_mm256_setzero_si256(); RW]; RX];
                let mut dm = [_mm256_setzero_ps(); RW];
                // SAFETY: the caller's contract (as `tile`'s pair loop).
                unsafe {
                    for r in 0..RW {
                        let a = w[r].wrapping_add(2 * p * bb);
                        let b = a.wrapping_add(bb);
                        // Every line of the pair's span (Q8_0's 68 bytes
                        // take two).
                        let mut line = 0;
                        while line < 2 * bb {
                            _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add(pf + line) as *const i8);
                            line += 64;
                        }
                        let (l, h) = unpack_pair::<F>(a, b);
                        if RX == 4 {
                            dm[r] = _mm256_castps128_ps256(_mm_cvtph_ps(scale_pairs::<F>(
                                load16(a),
                                load16(b),
                            )));
                        }
                        for i in 0..RX {
                            let xp = x[i].wrapping_add(64 * p);
                            s[i][r] = dot_pair::<F>(
                                start::<F>(xo[i], p),
                                l,
                                h,
                                load32(xp),
                                load32(xp.wrapping_add(32)),
                            );
                        }
                    }
                    if RX == 1 {
                        // Four weight rows (the last repeated).
                        let w4: [*const u8; 4] = std::array::from_fn(|r| w[r.min(RW - 1)]);
                        let (d, m) = row_scales::<F>(w4, p);
                        let xsc = _mm256_castps128_ps256(_mm_castsi128_ps(load16(
                            xs[0].wrapping_add(4 * p),
                        )));
                        let sc = _mm256_mul_ps(d, _mm256_permutevar8x32_ps(xsc, to_scale));
                        let min = if F == Q4_1 {
                            _mm256_mul_ps(m, _mm256_permutevar8x32_ps(xsc, to_min))
                        } else {
                            _mm256_setzero_ps()
                        };
                        out[0] = (
                            reduce4(std::array::from_fn(|r| s[0][r.min(RW - 1)])),
                            sc,
                            min,
                        );
                    } else {
                        let dx = _mm256_loadu_ps(gx[0].wrapping_add(8 * p));
                        for (r, o) in out.iter_mut().enumerate() {
                            let sc = _mm256_mul_ps(_mm256_permutevar8x32_ps(dm[r], to_scale), dx);
                            let min = if F == Q4_1 {
                                let sx = _mm256_loadu_ps(gx[1].wrapping_add(8 * p));
                                _mm256_mul_ps(_mm256_permutevar8x32_ps(dm[r], to_min), sx)
                            } else {
                                _mm256_setzero_ps()
                            };
                            *o = (reduce4(std::array::from_fn(|i| s[i][r])), sc, min);
                        }
                    }
                }
                out
            }

            /// [`pair_terms`] for an odd last block `nb - 1` (four lanes).
            ///
            /// # Safety
            /// As [`tile`].
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) unsafe fn odd_terms<
                const F: u8,
                const RX: usize,
                const RW: usize,
            >(
                w: [*const u8; RW],
                x: [*const i8; RX],
                xs: [*const f32; RX],
                xo: [*const i32; RX],
                gx: [*const f32; 2],
                nb: usize,
            ) -> [(__m128i, __m128, Option<__m128>); RW] {
                let bb = block_bytes(F);
                let (b, p) = (nb - 1, nb / 2);
                let mut out = [(_mm_setzero_si128(), _mm_setzero_ps(), None); RW];
                let mut s = [[_mm256_setzero_si256(); RW]; RX];
                let mut dm = [_mm_setzero_ps(); RW];
                // SAFETY: the caller's contract (as `tile`'s odd block).
                unsafe {
                    for r in 0..RW {
                        let a = w[r].wrapping_add(b * bb);
                        let wv = unpack_one::<F>(a);
                        if RX == 4 {
                            let first = load16(a);
                            dm[r] = _mm_cvtph_ps(scale_pairs::<F>(first, first));
                        }
                        for i in 0..RX {
                            let init = start::<F>(xo[i], p);
                            s[i][r] = dot_i8::<F>(init, wv, load32(x[i].wrapping_add(32 * b)));
                        }
                    }
                    if RX == 1 {
                        let h = row_halves(std::array::from_fn(|r| {
                            w[r.min(RW - 1)].wrapping_add(b * bb)
                        }));
                        let xd = *xs[0].wrapping_add(4 * p);
                        let sc = _mm_mul_ps(_mm_cvtph_ps(h), _mm_set1_ps(xd));
                        let min = (F == Q4_1).then(|| {
                            let mw = _mm_cvtph_ps(_mm_unpackhi_epi64(h, h));
                            _mm_mul_ps(mw, _mm_set1_ps(*xs[0].wrapping_add(4 * p + 1)))
                        });
                        out[0] = (
                            fold(reduce4(std::array::from_fn(|r| s[0][r.min(RW - 1)]))),
                            sc,
                            min,
                        );
                    } else {
                        let dx = _mm_loadu_ps(gx[0].wrapping_add(8 * p));
                        for (r, o) in out.iter_mut().enumerate() {
                            let sc = _mm_mul_ps(_mm_permute_ps::<0>(dm[r]), dx);
                            let min = (F == Q4_1).then(|| {
                                let sx = _mm_loadu_ps(gx[1].wrapping_add(8 * p));
                                _mm_mul_ps(_mm_permute_ps::<0b01_01_01_01>(dm[r]), sx)
                            });
                            *o = (fold(reduce4(std::array::from_fn(|i| s[i][r]))), sc, min);
                        }
                    }
                }
                out
            }

            /// Dot products of `RX` (1 or 4) activation rows with `RW` weight
            /// rows (1 to 4 for one activation row, any for four):
            /// `out[i][r]` = weight row `w[r]` . activation row `x[i]`, with
            /// the module's arithmetic. One activation row runs the weight
            /// rows in the lanes of a register; four run in the lanes, one
            /// register per weight row.
            ///
            /// # Safety
            /// AVX2, FMA and F16C available; each `w[r]` points at `nb` blocks of
            /// format `F`; each `x[i]` at `32 * nb` codes, each `xs[i]` at
            /// `4 * ceil(nb / 2)` scales and, for Q4_0 / Q5_0, each `xo[i]` at
            /// `8 * ceil(nb / 2)` offsets of a [`QuantRows`] row made for `F`;
            /// for four rows `gx` at their group's scales and (Q4_1) sums.
            #[target_feature(enable = $features)]
            unsafe fn tile<const F: u8, const RX: usize, const RW: usize>(
                w: [*const u8; RW],
                x: [*const i8; RX],
                xs: [*const f32; RX],
                xo: [*const i32; RX],
                gx: [*const f32; 2],
                nb: usize,
            ) -> [[f32; RW]; RX] {
                if $wide {
                    // SAFETY: the same contract; this instance's features
                    // include the wide kernel's (and VBMI where `$vbmi`).
                    return unsafe {
                        if $vbmi {
                            crate::cpu::gemv::avx512::tile_vbmi::<F, RX, RW>(w, x, xs, xo, gx, nb)
                        } else {
                            crate::cpu::gemv::avx512::tile::<F, RX, RW>(w, x, xs, xo, gx, nb)
                        }
                    };
                }
                debug_assert!((RX == 1 && RW <= 4) || RX == 4);
                let bb = block_bytes(F);
                // One activation row: acc[0] (lanes: weight rows); four:
                // acc[r] (lanes: activation rows). [0] takes pairs 2q,
                // [1] pairs 2q + 1: chains b % 4 (see `finish`).
                let mut acc = [[_mm256_setzero_ps(); 2]; RW];
                let groups = if RX == 1 { 1 } else { RW };
                // SAFETY: pair p reads blocks 2p and 2p + 1 < nb of every weight
                // row, codes 64p..64p + 64, scales 4p..4p + 4, (Q4_0, Q5_0)
                // offsets 8p..8p + 8 of every activation row and group
                // values 8p..8p + 8; the odd last block reads block nb - 1,
                // codes 32 (nb - 1).. + 32, scales 4 (nb / 2).. + 4, offsets
                // 8 (nb / 2).. + 8 and group values 8 (nb / 2).. + 4 (the
                // contract). The 16-byte loads at a block's start stay
                // inside it (blocks are 18 to 34 bytes).
                unsafe {
                    // Software prefetch two tiles ahead: the tile's RW rows are RW
                    // short interleaved streams (a few hundred bytes each), which
                    // the hardware prefetchers follow too late to keep DRAM busy
                    // (one tile ahead: about 1.5x the weight throughput of none on
                    // one thread streaming 256 MB; two tiles a little more).
                    // Prefetches never fault, so running past the rows is harmless.
                    let pf = 2 * RW * nb * bb;
                    for p in 0..nb / 2 {
                        let t = pair_terms::<F, RX, RW>(w, x, xs, xo, gx, p, pf);
                        for (a, (s, sc, min)) in acc.iter_mut().zip(t).take(groups) {
                            let mut v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, a[p % 2]);
                            if F == Q4_1 {
                                v = _mm256_add_ps(v, min);
                            }
                            a[p % 2] = v;
                        }
                    }
                    if nb % 2 == 1 {
                        let p = nb / 2;
                        let t = odd_terms::<F, RX, RW>(w, x, xs, xo, gx, nb);
                        for (a, (s, sc, min)) in acc.iter_mut().zip(t).take(groups) {
                            a[p % 2] = add_low(a[p % 2], s, sc, min);
                        }
                    }
                }
                let mut out = [[0f32; RW]; RX];
                if RX == 1 {
                    let y = finish(acc[0]);
                    out[0].copy_from_slice(&y[..RW]);
                } else {
                    for (r, a) in acc.iter().enumerate() {
                        for (i, v) in finish(*a).into_iter().enumerate() {
                            out[i][r] = v;
                        }
                    }
                }
                out
            }

            /// Where pair `p`'s i32 sums start: for Q4_0 and Q5_0 minus
            /// their offset term (`xo`: a [`QuantRows`] row's offsets), else
            /// zero.
            ///
            /// # Safety
            /// For Q4_0 and Q5_0, `xo` points at `8 * (p + 1)` offsets.
            #[target_feature(enable = $features)]
            #[inline]
            pub(in crate::cpu::gemv) unsafe fn start<const F: u8>(
                xo: *const i32,
                p: usize,
            ) -> __m256i {
                if F == Q4_0 || F == Q5_0 {
                    // SAFETY: the caller's contract.
                    let o = unsafe { load32(xo.wrapping_add(8 * p)) };
                    _mm256_sub_epi32(_mm256_setzero_si256(), o)
                } else {
                    _mm256_setzero_si256()
                }
            }

            /// [`tile`] for one activation row and the 4 weight rows of a
            /// packed tile at `t` ([`crate::cpu::gemv::pack::pack`]): the same operations on
            /// every lane in the same order, so the same bits. The scales
            /// of the tile's 8 blocks of a pair come in one load, already
            /// in the lane order of [`reduce4`]'s sums.
            ///
            /// # Safety
            /// As [`tile`], with `t` pointing at a whole packed tile of `nb`
            /// blocks a row.
            #[target_feature(enable = $features)]
            unsafe fn tile_packed<const F: u8>(
                t: *const u8,
                x: *const i8,
                xs: *const f32,
                xo: *const i32,
                nb: usize,
            ) -> [f32; 4] {
                let bb = block_bytes(F);
                // Bytes of one pair of blocks over the tile's rows, of one
                // row's quants of a pair, of the tile's fifth bits of a
                // pair (Q5_0: 8 a row, after the quants), and where the
                // scales (then minimums) start.
                let pair = 8 * bb;
                let row = if F == Q8_0 { 64 } else { 32 };
                let qh = if F == Q5_0 { 32 } else { 0 };
                let ds = 4 * row + qh;
                let mut acc = [_mm256_setzero_ps(); 2];
                let m4 = _mm256_set1_epi8(0x0f);
                // Q5_0: a row's 8 bytes of fifth bits broadcast to every
                // 64-bit lane; per half (block 2p, then 2p + 1) the bytes
                // for its low (codes 0-15) and high (16-31) nibbles.
                let rep_l = _mm256_set_epi64x(
                    0x0505_0505_0505_0505,
                    0x0404_0404_0404_0404,
                    0x0101_0101_0101_0101,
                    0,
                );
                let rep_h = _mm256_set_epi64x(
                    0x0707_0707_0707_0707,
                    0x0606_0606_0606_0606,
                    0x0303_0303_0303_0303,
                    0x0202_0202_0202_0202,
                );
                // SAFETY: pair p reads bytes p * pair.. + pair of the tile
                // and, as in `tile`, codes 64p.. + 64, scales 4p.. + 4 and
                // (Q4_0, Q5_0) offsets 8p.. + 8; the odd last block reads the
                // tile's last 4 * bb bytes. Prefetches never fault.
                unsafe {
                    // Two tiles ahead, every line of the pair's span.
                    let pf = 2 * 4 * nb * bb;
                    for p in 0..nb / 2 {
                        let tp = t.wrapping_add(p * pair);
                        let mut line = 0;
                        while line < pair {
                            _mm_prefetch::<_MM_HINT_T0>(tp.wrapping_add(pf + line) as *const i8);
                            line += 64;
                        }
                        let xp = x.wrapping_add(64 * p);
                        let (xl, xh) = (load32(xp), load32(xp.wrapping_add(32)));
                        // [d_x A, s_x A, d_x B, s_x B] (s_x: Q4_1's block sum).
                        let xsc = _mm_castsi128_ps(load16(xs.wrapping_add(4 * p)));
                        let dsc = _mm256_mul_ps(
                            _mm256_cvtph_ps(load16(tp.wrapping_add(ds))),
                            _mm256_set_m128(
                                _mm_permute_ps::<0b10_10_10_10>(xsc),
                                _mm_permute_ps::<0>(xsc),
                            ),
                        );
                        let init = start::<F>(xo, p);
                        let mut s = [_mm256_setzero_si256(); 4];
                        // A loop, not `from_fn`: the closure would not inline.
                        for r in 0..4 {
                            let q = tp.wrapping_add(row * r);
                            let (l, h) = if F == Q8_0 {
                                (load32(q), load32(q.wrapping_add(32)))
                            } else {
                                let v = load32(q);
                                let (l, h) = (
                                    _mm256_and_si256(v, m4),
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
                                );
                                if F == Q5_0 {
                                    let bits = _mm256_set1_epi64x(
                                        (tp.wrapping_add(4 * row + 8 * r) as *const i64)
                                            .read_unaligned(),
                                    );
                                    (
                                        _mm256_or_si256(l, fifth_bits(bits, rep_l)),
                                        _mm256_or_si256(h, fifth_bits(bits, rep_h)),
                                    )
                                } else {
                                    (l, h)
                                }
                            };
                            s[r] = dot_pair::<F>(init, l, h, xl, xh);
                        }
                        let mut v =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce4(s)), dsc, acc[p % 2]);
                        if F == Q4_1 {
                            let msc = _mm256_mul_ps(
                                _mm256_cvtph_ps(load16(tp.wrapping_add(ds + 16))),
                                _mm256_set_m128(
                                    _mm_permute_ps::<0b11_11_11_11>(xsc),
                                    _mm_permute_ps::<0b01_01_01_01>(xsc),
                                ),
                            );
                            v = _mm256_add_ps(v, msc);
                        }
                        acc[p % 2] = v;
                    }
                    if nb % 2 == 1 {
                        let (b, p) = (nb - 1, nb / 2);
                        let tp = t.wrapping_add(p * pair);
                        let xsc = _mm_castsi128_ps(load16(xs.wrapping_add(4 * p)));
                        // Four f16 scales (then minimums) of rows 0-3,
                        // after their quants and (Q5_0) fifth bits.
                        let d4 = _mm_cvtph_ps(_mm_loadl_epi64(
                            tp.wrapping_add(2 * row + qh / 2) as *const __m128i
                        ));
                        let dsc = _mm_mul_ps(d4, _mm_permute_ps::<0>(xsc));
                        let min = (F == Q4_1).then(|| {
                            let mins = _mm_cvtph_ps(_mm_loadl_epi64(
                                tp.wrapping_add(2 * row + 8) as *const __m128i
                            ));
                            _mm_mul_ps(mins, _mm_permute_ps::<0b01_01_01_01>(xsc))
                        });
                        let init = start::<F>(xo, p);
                        let xv = load32(x.wrapping_add(32 * b));
                        let mut s = [_mm256_setzero_si256(); 4];
                        for r in 0..4 {
                            // The block in plain order, as `unpack_one` gives it.
                            let wv = if F == Q8_0 {
                                load32(tp.wrapping_add(32 * r))
                            } else {
                                let raw = load16(tp.wrapping_add(16 * r));
                                let low = _mm256_castsi256_si128(m4);
                                let v = _mm256_set_m128i(
                                    _mm_and_si128(_mm_srli_epi16::<4>(raw), low),
                                    _mm_and_si128(raw, low),
                                );
                                if F == Q5_0 {
                                    let bits = _mm256_set1_epi32(
                                        (tp.wrapping_add(64 + 4 * r) as *const i32)
                                            .read_unaligned(),
                                    );
                                    let rep = _mm256_set_epi64x(
                                        0x0303_0303_0303_0303,
                                        0x0202_0202_0202_0202,
                                        0x0101_0101_0101_0101,
                                        0,
                                    );
                                    _mm256_or_si256(v, fifth_bits(bits, rep))
                                } else {
                                    v
                                }
                            };
                            s[r] = dot_i8::<F>(init, wv, xv);
                        }
                        acc[p % 2] = add_low(acc[p % 2], fold(reduce4(s)), dsc, min);
                    }
                }
                finish(acc)
            }

            /// [`rows_f`] over packed weights ([`crate::cpu::gemv::pack::pack`]): `w` starts
            /// at a tile boundary; its whole tiles are packed, any rows
            /// after them are in GGML's layout.
            ///
            /// # Safety
            /// As [`rows`] with `packed`, with `F` the format's code.
            #[target_feature(enable = $features)]
            unsafe fn rows_packed_f<const F: u8>(
                w: &[u8],
                rb: usize,
                xq: &QuantRows,
                out: &mut [f32],
            ) {
                const T: usize = crate::cpu::gemv::PACK_ROWS;
                let (n, m, nb) = (w.len() / rb, xq.m, xq.k / 32);
                let tiles = n / T;
                for t in 0..tiles {
                    let tp = w[t * T * rb..].as_ptr();
                    // Activation rows innermost: the tile (4 rows) stays in
                    // L1 while every row of a prefill passes over it.
                    for i in 0..m {
                        // SAFETY: tile t is whole (t < n / T) and row i < m
                        // of `xq` has the lengths `tile_packed` reads.
                        let y = unsafe {
                            tile_packed::<F>(
                                tp,
                                xq.codes(i).as_ptr(),
                                xq.scales(i).as_ptr(),
                                xq.offsets(i).as_ptr(),
                                nb,
                            )
                        };
                        for (r, v) in y.iter().enumerate() {
                            out[(t * T + r) * m + i] = *v;
                        }
                    }
                }
                for j in tiles * T..n {
                    for i in 0..m {
                        // SAFETY: row j < n is in GGML's layout, i < m.
                        unsafe { run_tile::<F, 1, 1>(w, rb, xq, i, j, out) };
                    }
                }
            }

            /// Run one `RX x RW` tile at activation row `i0`, weight row `j0`.
            ///
            /// # Safety
            /// As [`rows`]; `i0 + RX <= xq.m` and `j0 + RW` rows fit in `w`.
            #[target_feature(enable = $features)]
            unsafe fn run_tile<const F: u8, const RX: usize, const RW: usize>(
                w: &[u8],
                rb: usize,
                xq: &QuantRows,
                i0: usize,
                j0: usize,
                out: &mut [f32],
            ) {
                let wp: [*const u8; RW] = std::array::from_fn(|r| w[(j0 + r) * rb..].as_ptr());
                let xp: [*const i8; RX] = std::array::from_fn(|i| xq.codes(i0 + i).as_ptr());
                let sp: [*const f32; RX] = std::array::from_fn(|i| xq.scales(i0 + i).as_ptr());
                let op: [*const i32; RX] = std::array::from_fn(|i| xq.offsets(i0 + i).as_ptr());
                // Four activation rows start a group (the loops below step
                // by four from row 0).
                let gx = if RX == 4 {
                    debug_assert!(i0 % 4 == 0);
                    [
                        xq.group_scales(i0 / 4).as_ptr(),
                        xq.group_sums(i0 / 4).as_ptr(),
                    ]
                } else {
                    [std::ptr::null(); 2]
                };
                // SAFETY: the pointers start whole rows of the lengths `tile` needs
                // (slicing above checked the starts; rows are rb = nb blocks; the
                // offsets are read for Q4_0 / Q5_0 only, whose QuantRows has them;
                // the group values, for four rows only, are whole groups).
                let y = unsafe { tile::<F, RX, RW>(wp, xp, sp, op, gx, xq.k / 32) };
                for (i, yr) in y.iter().enumerate() {
                    for (r, v) in yr.iter().enumerate() {
                        out[(j0 + r) * xq.m + i0 + i] = *v;
                    }
                }
            }

            /// # Safety
            /// As [`rows`], with `F` the format's code.
            #[target_feature(enable = $features)]
            unsafe fn rows_f<const F: u8>(w: &[u8], rb: usize, xq: &QuantRows, out: &mut [f32]) {
                let n = w.len() / rb;
                let m = xq.m;
                // SAFETY: (every tile) rows j..j + RW < n of `w` and activation
                // rows i..i + RX < m, checked by the loop bounds.
                unsafe {
                    if m == 1 {
                        let mut j = 0;
                        while j + 4 <= n {
                            run_tile::<F, 1, 4>(w, rb, xq, 0, j, out);
                            j += 4;
                        }
                        for j in j..n {
                            run_tile::<F, 1, 1>(w, rb, xq, 0, j, out);
                        }
                        return;
                    }
                    let mut i = 0;
                    while i < m {
                        let mut j = 0;
                        if i + 4 <= m {
                            while j + 2 <= n {
                                run_tile::<F, 4, 2>(w, rb, xq, i, j, out);
                                j += 2;
                            }
                            for j in j..n {
                                run_tile::<F, 4, 1>(w, rb, xq, i, j, out);
                            }
                            i += 4;
                        } else {
                            while j + 2 <= n {
                                run_tile::<F, 1, 2>(w, rb, xq, i, j, out);
                                j += 2;
                            }
                            for j in j..n {
                                run_tile::<F, 1, 1>(w, rb, xq, i, j, out);
                            }
                            i += 1;
                        }
                    }
                }
            }

            /// All activation rows of `xq` against the weight rows in `w` (`rb`
            /// bytes each, `fmt` blocks; in [`crate::cpu::gemv::pack::pack`]'s layout when
            /// `packed`, from a tile boundary); `out[j * m + r]` = weight
            /// row j . activation row r.
            ///
            /// # Safety
            /// AVX2, FMA and F16C available; `xq` was made for `fmt` with `rb` =
            /// `fmt.row_bytes(xq.k)`; `out` has `m` slots per weight row.
            #[target_feature(enable = $features)]
            pub(in crate::cpu::gemv) unsafe fn rows(
                fmt: WeightFormat,
                w: &[u8],
                rb: usize,
                xq: &QuantRows,
                out: &mut [f32],
                packed: bool,
            ) {
                assert!(rb == fmt.row_bytes(xq.k) && out.len() == w.len() / rb * xq.m);
                assert!(fmt.offset().is_none() || xq.offsets.len() == xq.m * 8 * xq.k.div_ceil(64));
                // SAFETY: the caller's contract; the assert checks the lengths.
                unsafe {
                    match (fmt, packed) {
                        (WeightFormat::Q8_0, false) => rows_f::<Q8_0>(w, rb, xq, out),
                        (WeightFormat::Q4_0, false) => rows_f::<Q4_0>(w, rb, xq, out),
                        (WeightFormat::Q4_1, false) => rows_f::<Q4_1>(w, rb, xq, out),
                        (WeightFormat::Q5_0, false) => rows_f::<Q5_0>(w, rb, xq, out),
                        (WeightFormat::Q4_0, true) => rows_packed_f::<Q4_0>(w, rb, xq, out),
                        (WeightFormat::Q4_1, true) => rows_packed_f::<Q4_1>(w, rb, xq, out),
                        (WeightFormat::Q8_0, true) => rows_packed_f::<Q8_0>(w, rb, xq, out),
                        (WeightFormat::Q5_0, true) => rows_packed_f::<Q5_0>(w, rb, xq, out),
                        // matmul_with sends f32 weights to dot_f32 and
                        // packs block formats only, never here.
                        _ => {}
                    }
                }
            }
        }
    };
}
