//! [`VisionEncoder`]: images in, DINOv2 tokens out, and the pooled views
//! of them the `vision_encoder` stage emits ([`Output`]).

use crate::cards::{DINOV2_VITS14, UPSTREAM_FILE, WEIGHTS_FILE};
use crate::model::{Config, Dinov2};
use crate::{Error, Result};
use edgeflow_nn::VarBuilder;
use edgeflow_runtime::{Device, Tensor};
use edgeflow_vision::{Preprocess, RgbImage};
use std::path::{Path, PathBuf};

/// The cached weights of the `dinov2-vits14` card: the converted file, or
/// an upstream `model.safetensors` put in the model's folder; else the
/// "run `edgeflow models fetch dinov2-vits14`" error.
pub fn default_weights() -> Result<PathBuf> {
    match DINOV2_VITS14.path(WEIGHTS_FILE) {
        Ok(p) => Ok(p),
        Err(e) => {
            let upstream = DINOV2_VITS14.dir().join(UPSTREAM_FILE);
            if upstream.is_file() {
                Ok(upstream)
            } else {
                Err(e.into())
            }
        }
    }
}

/// Open a Dinov2 checkpoint (HF names, bare or under `dinov2.` as in a
/// classification checkpoint) for `dev`. A `config.json` beside an
/// upstream file is read; otherwise the ViT-S/14 config.
pub fn load(path: &Path, dev: &Device) -> Result<Dinov2> {
    let vb = VarBuilder::open(&[path], dev)?;
    let vb = if vb.contains("embeddings.cls_token") {
        vb
    } else if vb.contains("dinov2.embeddings.cls_token") {
        vb.pp("dinov2")
    } else {
        return Err(Error::bad_model(
            path,
            "no `embeddings.cls_token`: not a Dinov2 checkpoint (HF Dinov2Model names)",
        ));
    };
    let cfg_path = path.with_file_name("config.json");
    let cfg = if cfg_path.is_file() {
        Config::from_json(&cfg_path)?
    } else {
        Config::vits14()
    };
    Dinov2::load(&vb, &cfg)
}

/// What the encoder hands downstream, from the last hidden state
/// `[1 + N, d]` of one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The class token `[d]`.
    Cls,
    /// The patch tokens `[N, d]`, row by row.
    Patches,
    /// Everything `[1 + N, d]`.
    All,
    /// The mean of the patch tokens `[d]`.
    Mean,
    /// The patch grid average-pooled to `k` x `k` cells `[k * k, d]`
    /// (adaptive pooling, as `torch.nn.AdaptiveAvgPool2d`): a handful of
    /// spatial tokens for a small policy.
    Grid(usize),
}

impl Output {
    /// By name: `cls`, `patches`, `all`, `mean` or `grid` (with `grid`
    /// cells per side).
    pub fn parse(name: &str, grid: usize) -> Result<Self> {
        match name {
            "cls" => Ok(Output::Cls),
            "patches" => Ok(Output::Patches),
            "all" => Ok(Output::All),
            "mean" => Ok(Output::Mean),
            "grid" if grid > 0 => Ok(Output::Grid(grid)),
            "grid" => Err(Error::BadInput("`grid` output needs grid >= 1".into())),
            other => Err(Error::BadInput(format!(
                "unknown output `{other}`: choose cls, patches, all, mean or grid"
            ))),
        }
    }

    /// Apply to host tokens `[1 + gh * gw, d]`.
    pub fn select(&self, tokens: &[f32], gh: usize, gw: usize, d: usize) -> Result<Tensor> {
        let n = gh * gw;
        if tokens.len() != (1 + n) * d {
            return Err(Error::BadInput(format!(
                "{} token values for a {gh}x{gw} grid of {d}-d tokens",
                tokens.len()
            )));
        }
        let patches = &tokens[d..];
        Ok(match *self {
            Output::Cls => Tensor::from_vec(tokens[..d].to_vec(), &[d])?,
            Output::Patches => Tensor::from_vec(patches.to_vec(), &[n, d])?,
            Output::All => Tensor::from_vec(tokens.to_vec(), &[1 + n, d])?,
            Output::Mean => {
                let mut m = vec![0f32; d];
                for t in patches.chunks_exact(d) {
                    m.iter_mut().zip(t).for_each(|(a, b)| *a += b);
                }
                m.iter_mut().for_each(|v| *v /= n as f32);
                Tensor::from_vec(m, &[d])?
            }
            Output::Grid(k) => {
                let mut out = vec![0f32; k * k * d];
                for cy in 0..k {
                    let (y0, y1) = (cy * gh / k, ((cy + 1) * gh).div_ceil(k));
                    for cx in 0..k {
                        let (x0, x1) = (cx * gw / k, ((cx + 1) * gw).div_ceil(k));
                        let cell = &mut out[(cy * k + cx) * d..(cy * k + cx + 1) * d];
                        for y in y0..y1 {
                            for x in x0..x1 {
                                let t = &patches[(y * gw + x) * d..(y * gw + x + 1) * d];
                                cell.iter_mut().zip(t).for_each(|(a, b)| *a += b);
                            }
                        }
                        let count = ((y1 - y0) * (x1 - x0)) as f32;
                        cell.iter_mut().for_each(|v| *v /= count);
                    }
                }
                Tensor::from_vec(out, &[k * k, d])?
            }
        })
    }
}

/// A loaded DINOv2 with its preprocessing, on a device.
#[derive(Debug)]
pub struct VisionEncoder {
    model: Dinov2,
    pre: Preprocess,
    dev: Device,
}

impl VisionEncoder {
    /// Over a loaded model; images are prepared by `pre`.
    pub fn new(model: Dinov2, pre: Preprocess, dev: Device) -> Self {
        VisionEncoder { model, pre, dev }
    }

    /// The model.
    pub fn model(&self) -> &Dinov2 {
        &self.model
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The last hidden state of one image as host values `[1 + N, d]`,
    /// with the patch grid `(gh, gw)`.
    pub fn tokens(&self, img: &RgbImage) -> Result<(Vec<f32>, usize, usize)> {
        let x = self.pre.apply(img)?;
        let (h, w) = (x.dims()[1], x.dims()[2]);
        let x = self.dev.place(&x)?;
        let x = self.dev.reshape(&x, &[1, 3, h, w])?;
        let y = self.model.forward(&self.dev, &x)?;
        let (gh, gw) = self.model.grid(h, w);
        Ok((self.dev.to_host(&y)?.to_vec_f32()?, gh, gw))
    }

    /// [`Self::tokens`] of several images of one size in one forward pass
    /// (larger matrix products: faster per image on a CPU); one `[1 + N, d]`
    /// vector per image.
    pub fn tokens_batch(&self, imgs: &[RgbImage]) -> Result<(Vec<Vec<f32>>, usize, usize)> {
        let xs = imgs
            .iter()
            .map(|i| self.pre.apply(i).map_err(Error::from))
            .collect::<Result<Vec<_>>>()?;
        let Some(first) = xs.first() else {
            return Ok((Vec::new(), 0, 0));
        };
        let (h, w) = (first.dims()[1], first.dims()[2]);
        if let Some(x) = xs.iter().find(|x| x.dims() != first.dims()) {
            return Err(Error::BadInput(format!(
                "a batch of images must share one size after preprocessing: {:?} and {:?}",
                first.dims(),
                x.dims()
            )));
        }
        let placed = xs
            .iter()
            .map(|x| Ok(self.dev.reshape(&self.dev.place(x)?, &[1, 3, h, w])?))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Tensor> = placed.iter().collect();
        let x = self.dev.concat(&refs, 0)?;
        let y = self.model.forward(&self.dev, &x)?;
        let (gh, gw) = self.model.grid(h, w);
        let all = self.dev.to_host(&y)?.to_vec_f32()?;
        let per = all.len() / imgs.len();
        Ok((all.chunks(per).map(<[f32]>::to_vec).collect(), gh, gw))
    }

    /// `out` of one image, on the host.
    pub fn encode(&self, img: &RgbImage, out: Output) -> Result<Tensor> {
        let (t, gh, gw) = self.tokens(img)?;
        out.select(&t, gh, gw, self.model.config().hidden_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_select_and_pool_tokens() {
        // 1 class token + a 3 x 3 grid of 2-d tokens: token i = [i, -i].
        let t: Vec<f32> = (0..10).flat_map(|i| [i as f32, -(i as f32)]).collect();
        let v = |o: Output| {
            o.select(&t, 3, 3, 2)
                .expect("select")
                .to_vec_f32()
                .expect("v")
        };
        assert_eq!(v(Output::Cls), vec![0.0, 0.0]);
        assert_eq!(v(Output::Patches).len(), 18);
        assert_eq!(v(Output::All), t);
        assert_eq!(v(Output::Mean), vec![5.0, -5.0]);
        // 2 x 2 adaptive cells over 3 x 3: rows/cols {0,1} and {1,2}.
        let g = v(Output::Grid(2));
        assert_eq!(g.len(), 8);
        assert_eq!(g[0], (1.0 + 2.0 + 4.0 + 5.0) / 4.0);
        assert_eq!(g[6], (5.0 + 6.0 + 8.0 + 9.0) / 4.0);
        assert_eq!(v(Output::Grid(3)), t[2..].to_vec());
        assert!(Output::parse("pooled", 4).is_err());
        assert!(Output::parse("grid", 0).is_err());
        assert!(Output::Cls.select(&t[..5], 3, 3, 2).is_err());
    }
}
