//! PNG / JPEG decoding to RGB8 with limits on what a file may claim.
//!
//! A header can claim any size; the decoder is given [`DecodeLimits`]
//! before it allocates, the dimensions are read from the header and
//! checked first, and files are size-checked before they are read, so a
//! hostile or corrupt file costs at most the limits.

use crate::{Error, Result};
use image::{ImageFormat, ImageReader, RgbImage};
use std::io::{Cursor, Read};
use std::path::Path;

/// How large an image may be. The defaults take any camera frame or photo
/// up to 8192 x 8192 pixels and a 64 MiB file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Widest image accepted, pixels.
    pub max_width: u32,
    /// Tallest image accepted, pixels.
    pub max_height: u32,
    /// Largest file accepted, bytes.
    pub max_file_bytes: u64,
    /// Most bytes the decoder may allocate at once (its output included).
    pub max_alloc: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_width: 8192,
            max_height: 8192,
            max_file_bytes: 64 << 20,
            max_alloc: 512 << 20,
        }
    }
}

impl DecodeLimits {
    fn image_limits(&self) -> image::Limits {
        let mut l = image::Limits::default();
        l.max_image_width = Some(self.max_width);
        l.max_image_height = Some(self.max_height);
        l.max_alloc = Some(self.max_alloc);
        l
    }
}

fn decode_error(what: &str, e: image::ImageError) -> Error {
    match e {
        image::ImageError::Limits(l) => Error::TooLarge {
            what: what.to_string(),
            msg: format!("{l}; raise DecodeLimits if the image is genuine"),
        },
        image::ImageError::Unsupported(u) => Error::Decode {
            what: what.to_string(),
            msg: format!("{u} (PNG and JPEG are supported)"),
        },
        other => Error::Decode {
            what: what.to_string(),
            msg: other.to_string(),
        },
    }
}

/// The format of `bytes` from their magic number: PNG or JPEG, else a
/// clear error naming `what`.
pub fn sniff_format(bytes: &[u8], what: &str) -> Result<ImageFormat> {
    match image::guess_format(bytes) {
        Ok(f @ (ImageFormat::Png | ImageFormat::Jpeg)) => Ok(f),
        Ok(f) => Err(Error::Decode {
            what: what.to_string(),
            msg: format!("{f:?} images are not supported (PNG and JPEG are)"),
        }),
        Err(_) => Err(Error::Decode {
            what: what.to_string(),
            msg: "not a PNG or JPEG file (unknown signature)".into(),
        }),
    }
}

/// Decode PNG or JPEG `bytes` to RGB8 (grey and alpha images are
/// converted; alpha is dropped). `what` names the source in errors.
pub fn decode(bytes: &[u8], what: &str, limits: &DecodeLimits) -> Result<RgbImage> {
    if bytes.len() as u64 > limits.max_file_bytes {
        return Err(Error::TooLarge {
            what: what.to_string(),
            msg: format!(
                "{} bytes, the limit is {}",
                bytes.len(),
                limits.max_file_bytes
            ),
        });
    }
    let format = sniff_format(bytes, what)?;
    let reader = || {
        let mut r = ImageReader::new(Cursor::new(bytes));
        r.set_format(format);
        r.limits(limits.image_limits());
        r
    };
    // The header alone first: a claimed size over the limits is refused
    // before the decoder allocates anything for it.
    let (w, h) = reader()
        .into_dimensions()
        .map_err(|e| decode_error(what, e))?;
    if w == 0 || h == 0 {
        return Err(Error::Decode {
            what: what.to_string(),
            msg: format!("the header claims an empty {w}x{h} image"),
        });
    }
    if w > limits.max_width || h > limits.max_height {
        return Err(Error::TooLarge {
            what: what.to_string(),
            msg: format!(
                "{w}x{h} pixels, the limit is {}x{}",
                limits.max_width, limits.max_height
            ),
        });
    }
    let img = reader().decode().map_err(|e| decode_error(what, e))?;
    Ok(img.into_rgb8())
}

/// Read and decode the PNG / JPEG file at `path` (see [`decode`]).
pub fn open(path: impl AsRef<Path>, limits: &DecodeLimits) -> Result<RgbImage> {
    let path = path.as_ref();
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let what = path.display().to_string();
    if len > limits.max_file_bytes {
        return Err(Error::TooLarge {
            what,
            msg: format!("{len} bytes, the limit is {}", limits.max_file_bytes),
        });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // One byte past the limit shows a file that grew since `metadata`.
    file.take(limits.max_file_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    decode(&bytes, &what, limits)
}

/// Encode `img` as PNG (fixtures, debugging frames).
pub fn encode_png(img: &RgbImage) -> Result<Vec<u8>> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, ImageFormat::Png)
        .map_err(|e| Error::BadInput(format!("cannot encode a PNG: {e}")))?;
    Ok(out.into_inner())
}
