//! Eight (or sixteen) activation rows laid out for the prefill kernels
//! ([`Rows8`]), and the per-lane block values the AMX kernel's row groups
//! share ([`fill_lane`]).

use super::{Acts, KFormat};

/// Eight activation rows of [`Acts`] laid out for the AVX2 prefill kernel,
/// one lane per row (sixteen in [`Layout::Wide`]): each block's scale, and
/// its code sums per group of [`KFormat::groups`] (rows past the end repeat
/// the last row; their lanes are dropped).
pub(crate) struct Rows8 {
    /// First row.
    pub(super) r0: usize,
    /// Rows that are real (1 to [`Layout::lanes`]).
    pub(super) rows: usize,
    /// `[block][lane]` scales.
    pub(super) dx: Vec<f32>,
    /// Code sums per group, `[block][group pair][lane][2]`: lane `l` of a
    /// pair holds groups `2p` and `2p + 1` side by side, so one `madd`
    /// against a weight row's [`super::Unpacked::min_pairs`] gives each lane its
    /// two terms (i16: a group of at most 32 codes of at most 127).
    /// Empty for Q6_K in the lanes layout, whose kernel does not read it.
    pub(super) gs: Vec<i16>,
    /// The rows' codes interleaved as [`Self::layout`] says.
    pub(super) codes: Vec<i8>,
    pub(super) layout: Layout,
}

/// How [`Rows8`] interleaves its eight rows' codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// `[k / 32][lane][32]` (`avx2::rows8_vnni`): each 32 codes of the eight
    /// rows are 256 bytes in a row, so the kernel reads them at constant
    /// offsets from one pointer, in memory order.
    Rows,
    /// `[k / 4][lane][4]` ([`super::lanes`]): each 4 codes of the eight rows are
    /// one register, a lane per row.
    Lanes,
    /// [`Layout::Lanes`] with sixteen lanes (`lanes::rows16`): each 4
    /// codes of sixteen rows are one 512-bit register.
    Wide,
}

impl Layout {
    /// Activation rows (lanes) per group.
    pub(super) fn lanes(self) -> usize {
        match self {
            Layout::Rows | Layout::Lanes => 8,
            Layout::Wide => 16,
        }
    }
}

impl Rows8 {
    pub(super) fn new(fmt: KFormat, xq: &Acts, m: usize, r0: usize, layout: Layout) -> Self {
        let nb = xq.k / xq.block;
        let lanes = layout.lanes();
        let rows = (m - r0).min(lanes);
        let mut dx = vec![0f32; nb * lanes];
        // The lane kernels' Q6_K path folds the code sums' term into a
        // constant of the weight row (`Unpacked::offset_q6k`): no sums.
        let by_lane = layout != Layout::Rows;
        let sums = !(by_lane && fmt == KFormat::Q6K);
        let mut gs = vec![0i16; if sums { nb * fmt.groups() * lanes } else { 0 }];
        for lane in 0..lanes {
            fill_lane(
                fmt,
                xq,
                r0 + lane.min(rows - 1),
                (lanes, lane),
                &mut dx,
                &mut gs,
            );
        }
        let k = xq.k;
        let mut codes = vec![0i8; lanes * k];
        let span = if by_lane { 4 } else { 32 };
        for lane in 0..lanes {
            let x = xq.codes(r0 + lane.min(rows - 1));
            for (i, c) in x.chunks_exact(span).enumerate() {
                let at = span * (lanes * i + lane);
                codes[at..at + span].copy_from_slice(c);
            }
        }
        if by_lane && fmt == KFormat::Q6K {
            // The lane kernel's Q6_K operand: each code plus 128, as a
            // byte (see `Unpacked::offset_q6k`).
            for c in &mut codes {
                *c = (*c as u8 ^ 0x80) as i8;
            }
        }
        Rows8 {
            r0,
            rows,
            dx,
            gs,
            codes,
            layout,
        }
    }
}

/// Row `r`'s block scales and group code sums (of
/// [`KFormat::groups`]) into lane `lane` of `lanes`: `dx` is `[block][lane]`,
/// `gs` `[block][group pair][lane][2]` (the layout of [`Rows8`] and the
/// AMX kernel's row groups); an empty `gs` takes no sums.
pub(super) fn fill_lane(
    fmt: KFormat,
    xq: &Acts,
    r: usize,
    (lanes, lane): (usize, usize),
    dx: &mut [f32],
    gs: &mut [i16],
) {
    let g = fmt.groups();
    // Code sums (of 16) per group.
    let per = xq.block / g / xq.group;
    let (sc, sums) = (xq.scales(r), xq.sums(r));
    for (b, &d) in sc.iter().enumerate() {
        dx[b * lanes + lane] = d;
        if gs.is_empty() {
            continue;
        }
        for j in 0..g {
            let at = (b * g + j) * per;
            let s: i32 = sums[at..at + per].iter().sum();
            // |s| <= 32 * 127: exact in i16.
            gs[(b * g + (j & !1)) * lanes + 2 * lane + (j & 1)] = s as i16;
        }
    }
}
