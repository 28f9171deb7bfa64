//! Benchmarks (see [`bench`]).
