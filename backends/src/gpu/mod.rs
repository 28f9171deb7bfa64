//! GPU backend: wgpu compute shaders.
