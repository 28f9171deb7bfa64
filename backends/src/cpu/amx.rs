//! Intel AMX (Sapphire Rapids and later) plumbing shared by the tile
//! kernels ([`super::kquants`], [`super::gemv`]): whether the tiles may be
//! used here, and a tile configuration loaded for the duration of a run.
//! The tile instructions are inline assembly (Rust's AMX intrinsics are
//! not stable).

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Whether the AMX kernels run here: the CPU has AMX-TILE, AMX-INT8 and
/// AVX-512 (F, BW, VL, VNNI, VBMI) around the tiles, and Linux granted this
/// process the tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, asked once).
pub(crate) fn available() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
            let edx = __cpuid_count(7, 0).edx;
            let cpu = edx & (3 << 24) == 3 << 24
                && crate::cpu::kquants::has_vnni()
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vbmi");
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: arch_prctl with this request only changes which
            // state components the kernel lets the process use.
            cpu && unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            } == 0
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    })
}

/// A tile configuration (`ldtilecfg`'s 64-byte layout).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
    reserved2: [u8; 16],
}

impl TileConfig {
    /// A configuration of `palette` with no tiles.
    fn empty(palette: u8) -> Self {
        TileConfig {
            palette,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
            reserved2: [0; 16],
        }
    }
}

/// Loads `cfg` and returns the thread's previous configuration (all zero
/// when none was loaded), for [`leave`]: another AMX user on this thread
/// (candle's quantized matmul keeps its configuration loaded between
/// calls) gets its own back.
///
/// # Safety
/// [`available`] must be true; `cfg` valid for its palette.
#[inline]
unsafe fn enter(cfg: &TileConfig) -> TileConfig {
    let mut saved = TileConfig::empty(0);
    // SAFETY: `saved` is 64 writable bytes; the caller's promises.
    unsafe {
        asm!("sttilecfg [{0}]", in(reg) &mut saved, options(nostack));
        asm!("ldtilecfg [{0}]", in(reg) cfg, options(nostack, readonly));
    }
    saved
}

/// Restores what [`enter`] saved (or releases the tiles).
///
/// # Safety
/// `saved` came from [`enter`] on this thread.
#[inline]
unsafe fn leave(saved: &TileConfig) {
    // SAFETY: a configuration the CPU stored, or none.
    unsafe {
        if saved.palette == 0 {
            asm!("tilerelease", options(nostack, nomem));
        } else {
            asm!("ldtilecfg [{0}]", in(reg) saved, options(nostack, readonly));
        }
    }
}

/// The kernels' tile configuration loaded on this thread, from
/// [`Tiles::load`] until dropped (then the thread's previous configuration
/// is back). Loaded once per run of weight-row groups, not per kernel call (`ldtilecfg` is not cheap). It
/// must be dropped on the thread that loaded it, with no other AMX user
/// running on that thread meanwhile.
pub(crate) struct Tiles {
    saved: TileConfig,
    /// Bound to this thread: the configuration is the thread's.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Tiles {
    /// Loads a configuration of eight tiles, tile `t` of `shapes[t] =
    /// (rows, bytes per row)`.
    ///
    /// # Safety
    /// [`available`] must be true; every shape at most 16 rows of 64 bytes.
    pub(crate) unsafe fn load(shapes: [(u8, u16); 8]) -> Tiles {
        let mut cfg = TileConfig::empty(1);
        for (t, (rows, colsb)) in shapes.into_iter().enumerate() {
            debug_assert!(rows <= 16 && colsb <= 64);
            (cfg.rows[t], cfg.colsb[t]) = (rows, colsb);
        }
        Tiles {
            // SAFETY: AMX is available and granted (the caller's promise);
            // a palette-1 configuration of valid tile shapes.
            saved: unsafe { enter(&cfg) },
            _thread: std::marker::PhantomData,
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: `saved` is what `enter` stored on this thread (`Tiles`
        // is not Send).
        unsafe { leave(&self.saved) };
    }
}

/// The 16 x 16 transpose of `r` (row `i` of the result holds lane `i` of
/// every register): the kernels' per-weight-row accumulators become one
/// row of 16 outputs per activation row, for whole-row stores into `y`.
///
/// # Safety
/// AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose16(r: &[__m512; 16]) -> [__m512; 16] {
    // Rows 2i, 2i + 1 interleaved: per 128-bit lane, columns 0-1 / 2-3.
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4i + c]: per 128-bit lane L, rows 4i..4i + 4 at column 4L + c.
    let mut u = [_mm512_setzero_ps(); 16];
    for i in 0..4 {
        for j in 0..2 {
            let (a, b) = (
                _mm512_castps_pd(t[4 * i + j]),
                _mm512_castps_pd(t[4 * i + 2 + j]),
            );
            u[4 * i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            u[4 * i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    }
    // Column 4L + c gathers lane L of u[c], u[4 + c], u[8 + c], u[12 + c].
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        let v0 = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
        let v1 = _mm512_shuffle_f32x4::<0xdd>(u[c], u[4 + c]);
        let w0 = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
        let w1 = _mm512_shuffle_f32x4::<0xdd>(u[8 + c], u[12 + c]);
        out[c] = _mm512_shuffle_f32x4::<0x88>(v0, w0);
        out[4 + c] = _mm512_shuffle_f32x4::<0x88>(v1, w1);
        out[8 + c] = _mm512_shuffle_f32x4::<0xdd>(v0, w0);
        out[12 + c] = _mm512_shuffle_f32x4::<0xdd>(v1, w1);
    }
    out
}
