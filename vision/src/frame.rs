//! Conversions between the graph's [`ImageFrame`] and `image`'s RGB8 images.

use crate::{Error, Result};
use edgeflow_graph::{ImageFrame, PixelFormat};
use image::RgbImage;

/// Bytes per pixel of a [`PixelFormat`].
pub fn bytes_per_pixel(format: PixelFormat) -> usize {
    match format {
        PixelFormat::Rgb8 => 3,
        PixelFormat::Rgba8 => 4,
        PixelFormat::Gray8 => 1,
    }
}

/// Check that a frame's bytes match its dimensions and format.
pub fn check_frame(f: &ImageFrame) -> Result<()> {
    let want = (f.width as usize)
        .checked_mul(f.height as usize)
        .and_then(|n| n.checked_mul(bytes_per_pixel(f.format)));
    if f.width == 0 || f.height == 0 || want != Some(f.data.len()) {
        return Err(Error::BadInput(format!(
            "image frame {}x{} {:?} carries {} bytes, expected {}: the producer sent a malformed frame",
            f.width,
            f.height,
            f.format,
            f.data.len(),
            want.map_or_else(|| "an impossible size".to_string(), |n| n.to_string())
        )));
    }
    Ok(())
}

/// A frame as RGB8 (RGBA drops alpha, grey is replicated).
pub fn frame_to_rgb(f: &ImageFrame) -> Result<RgbImage> {
    check_frame(f)?;
    let rgb: Vec<u8> = match f.format {
        PixelFormat::Rgb8 => f.data.clone(),
        PixelFormat::Rgba8 => f
            .data
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        PixelFormat::Gray8 => f.data.iter().flat_map(|&g| [g, g, g]).collect(),
    };
    RgbImage::from_raw(f.width, f.height, rgb)
        .ok_or_else(|| Error::BadInput("frame bytes do not fill the image".into()))
}

/// An RGB8 image as a frame.
pub fn rgb_to_frame(img: RgbImage) -> ImageFrame {
    let (width, height) = img.dimensions();
    ImageFrame {
        width,
        height,
        format: PixelFormat::Rgb8,
        data: img.into_raw(),
    }
}
