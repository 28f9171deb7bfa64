//! The int8 kernels on `vpdpbusd`: AVX-VNNI and AVX-512 VNNI (256-bit
//! registers).

/// `vpdpbusd` (AVX-VNNI).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
fn dot4_avxvnni(
    acc: std::arch::x86_64::__m256i,
    u: std::arch::x86_64::__m256i,
    s: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    std::arch::x86_64::_mm256_dpbusd_avx_epi32(acc, u, s)
}

/// `vpdpbusd` (AVX-512 VNNI, 256-bit form).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
#[inline]
pub(super) fn dot4_avx512vnni(
    acc: std::arch::x86_64::__m256i,
    u: std::arch::x86_64::__m256i,
    s: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    std::arch::x86_64::_mm256_dpbusd_epi32(acc, u, s)
}

#[cfg(target_arch = "x86_64")]
int8_kernels!(
    avxvnni,
    "avx2,fma,f16c,avxvnni",
    super::dot4_avxvnni,
    true,
    false,
    false
);
#[cfg(target_arch = "x86_64")]
int8_kernels!(
    avx512vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    super::dot4_avx512vnni,
    true,
    false,
    false
);
