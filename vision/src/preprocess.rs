//! Resize, center-crop and normalise RGB8 images into f32 tensors `[3, H, W]`.
//!
//! Resampling is `image`'s separable filter (`imageops::resize`), which
//! widens its kernel when shrinking (antialiased, like Pillow's resize):
//! camera frames are small, so the resize costs well under a millisecond
//! beside an encoder that takes tens.

use crate::{Error, Result};
use edgeflow_runtime::Tensor;
use image::imageops::{self, FilterType};
use image::RgbImage;

/// Resampling filter of [`resize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Filter {
    /// Nearest neighbour (no smoothing: pixel art, masks).
    Nearest,
    /// Linear (triangle) filter.
    Bilinear,
    /// Catmull-Rom cubic filter (the usual "bicubic"; HF's Dinov2 processor
    /// resizes with bicubic).
    #[default]
    Bicubic,
}

impl Filter {
    /// By name: `nearest`, `bilinear` or `bicubic`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "nearest" => Ok(Filter::Nearest),
            "bilinear" | "linear" => Ok(Filter::Bilinear),
            "bicubic" | "cubic" => Ok(Filter::Bicubic),
            other => Err(Error::BadInput(format!(
                "unknown resize filter `{other}`: choose nearest, bilinear or bicubic"
            ))),
        }
    }

    fn image_filter(self) -> FilterType {
        match self {
            Filter::Nearest => FilterType::Nearest,
            Filter::Bilinear => FilterType::Triangle,
            Filter::Bicubic => FilterType::CatmullRom,
        }
    }
}

/// `img` resampled to `width` x `height` (a copy when the size is already
/// that).
pub fn resize(img: &RgbImage, width: u32, height: u32, filter: Filter) -> Result<RgbImage> {
    if width == 0 || height == 0 {
        return Err(Error::BadInput(format!(
            "cannot resize to an empty {width}x{height} image"
        )));
    }
    if img.dimensions() == (width, height) {
        return Ok(img.clone());
    }
    Ok(imageops::resize(img, width, height, filter.image_filter()))
}

/// `img` resized so that its shorter side is `size`, keeping the aspect
/// ratio (the longer side rounds to the nearest pixel, at least 1).
pub fn resize_shortest_edge(img: &RgbImage, size: u32, filter: Filter) -> Result<RgbImage> {
    let (w, h) = img.dimensions();
    if w == 0 || h == 0 {
        return Err(Error::BadInput("cannot resize an empty image".into()));
    }
    let scale = size as f64 / w.min(h) as f64;
    let nw = ((w as f64 * scale).round() as u32).max(1);
    let nh = ((h as f64 * scale).round() as u32).max(1);
    let (nw, nh) = if w <= h { (size, nh) } else { (nw, size) };
    resize(img, nw, nh, filter)
}

/// The centered `width` x `height` window of `img` (offsets rounded down,
/// as torchvision's `center_crop` rounds half a pixel).
pub fn center_crop(img: &RgbImage, width: u32, height: u32) -> Result<RgbImage> {
    let (w, h) = img.dimensions();
    if width == 0 || height == 0 || width > w || height > h {
        return Err(Error::BadInput(format!(
            "cannot crop {width}x{height} out of a {w}x{h} image: resize it first"
        )));
    }
    let x = (w - width) / 2;
    let y = (h - height) / 2;
    Ok(imageops::crop_imm(img, x, y, width, height).to_image())
}

/// Per-channel normalisation `(x / 255 - mean) / std`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize {
    /// Channel means (R, G, B) on the 0..1 scale.
    pub mean: [f32; 3],
    /// Channel standard deviations (R, G, B).
    pub std: [f32; 3],
}

impl Normalize {
    /// ImageNet statistics (what DINOv2 and most vision backbones expect).
    pub const IMAGENET: Normalize = Normalize {
        mean: [0.485, 0.456, 0.406],
        std: [0.229, 0.224, 0.225],
    };

    /// Just `x / 255`.
    pub const UNIT: Normalize = Normalize {
        mean: [0.0; 3],
        std: [1.0; 3],
    };
}

impl Default for Normalize {
    fn default() -> Self {
        Normalize::IMAGENET
    }
}

/// `img` as an f32 tensor `[3, H, W]` (channel-major), normalised.
pub fn to_tensor(img: &RgbImage, norm: &Normalize) -> Result<Tensor> {
    let (w, h) = img.dimensions();
    let plane = (w as usize) * (h as usize);
    let mut data = vec![0f32; 3 * plane];
    // (x / 255 - m) / s as one multiply-add per value.
    let scale: [f32; 3] = std::array::from_fn(|c| 1.0 / (255.0 * norm.std[c]));
    let shift: [f32; 3] = std::array::from_fn(|c| -norm.mean[c] / norm.std[c]);
    for (c, out) in data.chunks_exact_mut(plane.max(1)).enumerate() {
        let (a, b) = (scale[c], shift[c]);
        for (o, px) in out.iter_mut().zip(img.as_raw().chunks_exact(3)) {
            *o = px[c] as f32 * a + b;
        }
    }
    Ok(Tensor::from_vec(data, &[3, h as usize, w as usize])?)
}

/// How an image becomes a model's input: optional resize, optional
/// center crop, normalisation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preprocess {
    /// Resize first.
    pub resize: Resize,
    /// Then crop the center to `(width, height)`, if set.
    pub crop: Option<(u32, u32)>,
    /// Resampling filter.
    pub filter: Filter,
    /// Normalisation.
    pub normalize: Normalize,
}

/// The resize step of [`Preprocess`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resize {
    /// Keep the size.
    None,
    /// To exactly `(width, height)` (aspect ratio not kept).
    Exact(u32, u32),
    /// Shorter side to this many pixels, aspect ratio kept.
    ShortestEdge(u32),
}

impl Preprocess {
    /// Square input of `size` pixels: resize straight to `size` x `size`
    /// (bicubic), ImageNet normalisation. What a robot camera feeding a
    /// ViT wants: the whole field of view, no crop.
    pub fn square(size: u32) -> Self {
        Preprocess {
            resize: Resize::Exact(size, size),
            crop: None,
            filter: Filter::Bicubic,
            normalize: Normalize::IMAGENET,
        }
    }

    /// HF's Dinov2 image processor for `crop` pixels: shorter side to
    /// `crop * 256 / 224` (256 for 224), bicubic, center crop, ImageNet
    /// normalisation.
    pub fn dinov2(crop: u32) -> Self {
        Preprocess {
            resize: Resize::ShortestEdge((crop * 256).div_ceil(224)),
            crop: Some((crop, crop)),
            filter: Filter::Bicubic,
            normalize: Normalize::IMAGENET,
        }
    }

    /// The resized and cropped image, before normalisation.
    pub fn image(&self, img: &RgbImage) -> Result<RgbImage> {
        let img = match self.resize {
            Resize::None => img.clone(),
            Resize::Exact(w, h) => resize(img, w, h, self.filter)?,
            Resize::ShortestEdge(s) => resize_shortest_edge(img, s, self.filter)?,
        };
        match self.crop {
            Some((w, h)) => center_crop(&img, w, h),
            None => Ok(img),
        }
    }

    /// `img` as the model's input tensor `[3, H, W]`.
    pub fn apply(&self, img: &RgbImage) -> Result<Tensor> {
        to_tensor(&self.image(img)?, &self.normalize)
    }
}
