//! CPU backend: candle kernels.
