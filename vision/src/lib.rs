//! # edgeflow-vision
//!
//! Images for the vision stages, as `audio/` is for sound:
//!
//! - [`decode`]: PNG / JPEG to RGB8 with the `image` crate, under
//!   [`DecodeLimits`] checked against the header before anything is
//!   allocated (bad, oversized and truncated files are clear errors);
//! - [`preprocess`]: resize ([`Filter`]), center crop, normalisation
//!   ([`Normalize::IMAGENET`] by default) into an f32 tensor `[3, H, W]`,
//!   combined in [`Preprocess`];
//! - [`frame`]: the graph's [`ImageFrame`](edgeflow_graph::ImageFrame)
//!   to and from RGB8 images;
//! - the `frames` stage ([`FramesKind`]): a folder of images as a camera.
//!
//! Frames from another process arrive through the control crate's
//! `zenoh_sub` (`type: image`) as the same `Payload::Image`.

pub mod decode;
mod error;
pub mod frame;
mod frames;
pub mod preprocess;

pub use decode::DecodeLimits;
pub use error::{Error, Result};
pub use frame::{frame_to_rgb, rgb_to_frame};
pub use frames::{list_images, FramesKind, FramesSource};
pub use image::RgbImage;
pub use preprocess::{Filter, Normalize, Preprocess, Resize};

use edgeflow_graph::Registry;

/// Register the stage kinds of this crate (`frames`).
pub fn register(r: &mut Registry) {
    r.register(FramesKind);
}

/// A registry with the engine's built-in kinds plus this crate's.
pub fn registry() -> Registry {
    let mut r = Registry::builtin();
    register(&mut r);
    r
}

#[cfg(test)]
mod tests;
