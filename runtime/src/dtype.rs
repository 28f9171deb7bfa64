//! Element types.

use serde::{Deserialize, Serialize};

/// Element type of a [`crate::Tensor`].
///
/// The quantized variants are block formats (GGML layout): a tensor of that
/// dtype holds blocks of 32 weights with their scale (and min for Q4_1),
/// or, for the K-quants (`Q4K`, `Q5K`, `Q6K`), super-blocks of 256.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit signed integer.
    I64,
    /// 32-bit signed integer (stored as u32 by candle where needed).
    I32,
    /// Unsigned byte.
    U8,
    /// GGML Q4_0 blocks (32 x 4-bit, one f16 scale).
    Q4_0,
    /// GGML Q4_1 blocks (32 x 4-bit, f16 scale and min).
    Q4_1,
    /// GGML Q8_0 blocks (32 x 8-bit, one f16 scale).
    Q8_0,
    /// GGML Q5_0 blocks (32 x 5-bit, one f16 scale).
    Q5_0,
    /// GGML Q4_K super-blocks (256 x 4-bit in 8 sub-blocks with 6-bit
    /// scales and mins, f16 super-block scale and min).
    #[serde(rename = "q4_k")]
    Q4K,
    /// GGML Q5_K super-blocks (256 x 5-bit, Q4_K's scale layout).
    #[serde(rename = "q5_k")]
    Q5K,
    /// GGML Q6_K super-blocks (256 x 6-bit in 16 sub-blocks with int8
    /// scales, one f16 super-block scale).
    #[serde(rename = "q6_k")]
    Q6K,
}

impl DType {
    /// True for block-quantized formats.
    pub fn is_quantized(self) -> bool {
        matches!(
            self,
            DType::Q4_0
                | DType::Q4_1
                | DType::Q8_0
                | DType::Q5_0
                | DType::Q4K
                | DType::Q5K
                | DType::Q6K
        )
    }

    /// Lower-case name as used in YAML and metrics.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q8_0 => "q8_0",
            DType::Q5_0 => "q5_0",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
