//! The training twin of [`crate::model::ActionHead`]: the same network in
//! candle with autograd [`Var`]s and the same tensor names, so the
//! checkpoint it writes loads into the runtime model.

use crate::config::{patch_coords, Arch, Config, Normalizer};
use crate::model::{norm_shapes, norm_values, tensor_shapes};
use crate::rng::Rng;
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use std::collections::BTreeMap;
use std::path::Path;

/// [`TrainNet::condition_parts`]: the conditioning tokens and what the
/// auxiliary losses supervise.
#[derive(Debug)]
pub struct Conditioned {
    /// `[b, cond_tokens, d_model]`.
    pub cond: Tensor,
    /// With keypoints: `[b, K, 2]`, in [`patch_coords`]' coordinates.
    pub keypoints: Option<Tensor>,
    /// With [`Config::keypoint_angles`] `A`: the first `A` keypoints'
    /// angle read-outs, `[b, A, 2]` (towards `(cos 4a, sin 4a)`).
    pub angles: Option<Tensor>,
}

/// The head's parameters as candle variables, by checkpoint name.
#[derive(Debug)]
pub struct TrainNet {
    cfg: Config,
    vars: BTreeMap<String, Var>,
    dev: Device,
}

impl TrainNet {
    /// Fresh weights from `seed`: linear weights and positions normal with
    /// std 0.02, biases 0, layer norms 1 / 0; `action_out` starts small so
    /// the first velocities are near 0.
    pub fn init(cfg: &Config, seed: u64) -> Result<Self> {
        cfg.validate()?;
        let dev = Device::Cpu;
        let mut rng = Rng::new(seed);
        let mut vars = BTreeMap::new();
        for (name, dims) in tensor_shapes(cfg) {
            let n: usize = dims.iter().product();
            let ln = name.contains("ln1") || name.contains("ln2") || name.starts_with("ln_f");
            let data: Vec<f32> = if ln {
                vec![if name.ends_with("weight") { 1.0 } else { 0.0 }; n]
            } else if name.ends_with("bias") {
                vec![0.0; n]
            } else {
                let std = if name.starts_with("action_out") {
                    0.002
                } else if name.starts_with("mlp.") {
                    // LeCun: keeps a deep MLP's activations at unit scale.
                    1.0 / (dims[1] as f32).sqrt()
                } else {
                    0.02
                };
                rng.normals(n).into_iter().map(|v| v * std).collect()
            };
            let t = Tensor::from_vec(data, dims.as_slice(), &dev)?;
            vars.insert(name, Var::from_tensor(&t)?);
        }
        Ok(TrainNet {
            cfg: cfg.clone(),
            vars,
            dev,
        })
    }

    /// The weights and normaliser of a checkpoint [`TrainNet::save`] wrote
    /// (its config from its metadata), to train on from there: every tensor
    /// is checked for its name, dtype (f32) and shape.
    pub fn from_checkpoint(path: &Path) -> Result<(Self, Normalizer)> {
        let cfg = Config::from_checkpoint(path)?;
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let bad = |msg: String| Error::BadModel {
            path: path.to_path_buf(),
            msg,
        };
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let read = |name: &str, dims: &[usize]| -> Result<Vec<f32>> {
            let t = st
                .tensor(name)
                .map_err(|e| bad(format!("tensor `{name}`: {e}")))?;
            if t.dtype() != safetensors::Dtype::F32 || t.shape() != dims {
                return Err(bad(format!(
                    "tensor `{name}` is {:?} {:?}, expected F32 {dims:?}",
                    t.dtype(),
                    t.shape()
                )));
            }
            Ok(t.data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        };
        let dev = Device::Cpu;
        let mut vars = BTreeMap::new();
        for (name, dims) in tensor_shapes(&cfg) {
            let t = Tensor::from_vec(read(&name, &dims)?, dims.as_slice(), &dev)?;
            vars.insert(name, Var::from_tensor(&t)?);
        }
        let mut norm = Normalizer::identity(&cfg);
        let shapes = norm_shapes(&cfg);
        let mut slots: Vec<&mut Vec<f32>> = vec![
            &mut norm.state_mean,
            &mut norm.state_std,
            &mut norm.action_mean,
            &mut norm.action_std,
        ];
        if cfg.vision_norm {
            slots.extend([&mut norm.vision_mean, &mut norm.vision_std]);
        }
        if cfg.text_norm {
            slots.extend([&mut norm.text_mean, &mut norm.text_std]);
        }
        for ((name, dims), slot) in shapes.iter().zip(slots) {
            *slot = read(name, dims)?;
        }
        Ok((TrainNet { cfg, vars, dev }, norm))
    }

    /// The config.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Every variable (for the optimiser).
    pub fn vars(&self) -> Vec<Var> {
        self.vars.values().cloned().collect()
    }

    /// Variables by name.
    pub fn named_vars(&self) -> &BTreeMap<String, Var> {
        &self.vars
    }

    /// A copy of every weight, by name (not tracked by autograd).
    pub fn weights(&self) -> Result<BTreeMap<String, Tensor>> {
        let mut w = BTreeMap::new();
        for (k, v) in &self.vars {
            // A copy: `detach` alone shares the storage the optimiser
            // updates in place.
            w.insert(k.clone(), v.as_tensor().detach().copy()?);
        }
        Ok(w)
    }

    /// Overwrite the weights with `w` (as [`TrainNet::weights`] gives them:
    /// every name, the same shapes).
    pub fn set_weights(&self, w: &BTreeMap<String, Tensor>) -> Result<()> {
        for (name, v) in &self.vars {
            let t = w
                .get(name)
                .ok_or_else(|| Error::Config(format!("no weights for `{name}`")))?;
            v.set(t)?;
        }
        Ok(())
    }

    /// An independent copy: its own variables with the same values.
    pub fn duplicate(&self) -> Result<TrainNet> {
        let mut vars = BTreeMap::new();
        for (name, v) in &self.vars {
            vars.insert(name.clone(), Var::from_tensor(&v.as_tensor().copy()?)?);
        }
        Ok(TrainNet {
            cfg: self.cfg.clone(),
            vars,
            dev: self.dev.clone(),
        })
    }

    fn var(&self, name: &str) -> Result<&Tensor> {
        self.vars
            .get(name)
            .map(|v| v.as_tensor())
            .ok_or_else(|| Error::Config(format!("the training net has no tensor `{name}`")))
    }

    fn linear(&self, name: &str, x: &Tensor) -> Result<Tensor> {
        let w = self.var(&format!("{name}.weight"))?;
        let b = self.var(&format!("{name}.bias"))?;
        // One GEMM over every row: [rows, in] x [in, out].
        let dims = x.dims().to_vec();
        let (rows, inp) = (
            dims[..dims.len() - 1].iter().product::<usize>(),
            dims[dims.len() - 1],
        );
        let y = (x.reshape((rows, inp))?.matmul(&w.t()?)? + self.repeat_rows(b, rows)?)?;
        let mut out = dims;
        if let Some(last) = out.last_mut() {
            *last = w.dims()[0];
        }
        Ok(y.reshape(out)?)
    }

    fn layer_norm(&self, name: &str, x: &Tensor) -> Result<Tensor> {
        let g = self.var(&format!("{name}.weight"))?;
        let b = self.var(&format!("{name}.bias"))?;
        let mean = x.mean_keepdim(D::Minus1)?;
        let xc = x.broadcast_sub(&mean)?;
        let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
        let y = xc.broadcast_div(&(var + self.cfg.norm_eps)?.sqrt()?)?;
        let d = g.elem_count();
        let rows = y.elem_count() / d.max(1);
        let y = y.reshape((rows, d))?;
        let y = ((y * self.repeat_rows(g, rows)?)? + self.repeat_rows(b, rows)?)?;
        Ok(y.reshape(x.dims())?)
    }

    /// `v` (n values) repeated on `rows` rows, `[rows, n]`, as a rank-1
    /// GEMM so that its gradient is a GEMM too. A broadcast's gradient is
    /// a sum over the broadcast (leading) dims, which candle's CPU backend
    /// does with an index division per element: with it, the bias, gain
    /// and position gradients took a sixth of a training step.
    fn repeat_rows(&self, v: &Tensor, rows: usize) -> Result<Tensor> {
        let n = v.elem_count();
        let ones = Tensor::ones((rows, 1), DType::F32, &self.dev)?;
        Ok(ones.matmul(&v.reshape((1, n))?)?)
    }

    /// `x[b, ...]` plus `v` (shaped like one sample of `x`) on every sample.
    fn add_per_sample(&self, x: &Tensor, v: &Tensor) -> Result<Tensor> {
        let b = x.dims()[0];
        Ok((x + self.repeat_rows(v, b)?.reshape(x.dims())?)?)
    }

    fn attention(&self, name: &str, x: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (h, hd) = (self.cfg.n_heads, self.cfg.head_dim());
        let heads = |p: &str| -> Result<Tensor> {
            let y = self.linear(&format!("{name}.{p}"), x)?;
            Ok(y.reshape((b, t, h, hd))?.transpose(1, 2)?.contiguous()?)
        };
        let (q, k, v) = (heads("q")?, heads("k")?, heads("v")?);
        let att = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
        let att = candle_nn::ops::softmax(&att, D::Minus1)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, h * hd))?;
        self.linear(&format!("{name}.o"), &y)
    }

    /// [`crate::model::ActionHead::condition`]: pooled vision `[b,
    /// vision_tokens, vision_width]`, instruction `[b, 1, feature_dim]`,
    /// normalised state `[b, 1, state_dim]`.
    /// `origin`: `[b, 1, 2]`, each sample's robot position in keypoint
    /// units.
    pub fn condition(
        &self,
        vision: &Tensor,
        text: &Tensor,
        state: &Tensor,
        origin: &Tensor,
    ) -> Result<Tensor> {
        Ok(self.condition_parts(vision, text, state, origin)?.cond)
    }

    /// [`Self::condition`] and what the auxiliary losses supervise.
    pub fn condition_parts(
        &self,
        vision: &Tensor,
        text: &Tensor,
        state: &Tensor,
        origin: &Tensor,
    ) -> Result<Conditioned> {
        let l = self.linear("text_in", text)?;
        let s = self.linear("state_in", state)?;
        let (c, keypoints, angles) = if self.cfg.keypoints > 0 {
            let cls = vision.narrow(1, 0, 1)?;
            let v = match self.cfg.cls_token {
                true => self.linear("vision_in", &cls)?,
                false => self.linear("vision_in", &cls.zeros_like()?)?,
            };
            let (kp, w) = self.keypoints_and_weights(vision)?;
            let mut parts = vec![kp.clone()];
            if self.cfg.keypoint_position_inputs() == 4 {
                parts.push(kp.broadcast_sub(origin)?);
            }
            // [b, K, P] x [b, P, f]: the patches under each keypoint.
            let n = self.cfg.vision_grid;
            let pooled = match self.cfg.keypoint_features || self.cfg.keypoint_angles > 0 {
                true => Some(w.matmul(&vision.narrow(1, 1, n * n)?.contiguous()?)?),
                false => None,
            };
            let angles = match (&pooled, self.cfg.keypoint_angles) {
                (Some(p), a) if a > 0 => {
                    let h = candle_nn::ops::silu(&self.linear("kp_ang1", p)?)?;
                    let ang = self.linear("kp_ang2", &h)?; // [b, K, 2]
                    let (b, k) = (ang.dims()[0], self.cfg.keypoints);
                    let read = ang.narrow(1, 0, a)?;
                    parts.push(match k - a {
                        0 => read.clone(),
                        rest => {
                            let zeros = Tensor::zeros((b, rest, 2), DType::F32, &self.dev)?;
                            Tensor::cat(&[&read, &zeros], 1)?
                        }
                    });
                    Some(read)
                }
                _ => None,
            };
            let input = Tensor::cat(&parts, 2)?;
            let mut t = self.linear("kp_in", &input)?;
            if let (true, Some(p)) = (self.cfg.keypoint_features, &pooled) {
                t = (t + self.linear("kp_feat", p)?)?;
            }
            (Tensor::cat(&[&v, &t, &l, &s], 1)?, Some(kp), angles)
        } else {
            let v = self.linear("vision_in", vision)?;
            (Tensor::cat(&[&v, &l, &s], 1)?, None, None)
        };
        let pos = self.var("pos")?.narrow(0, 0, self.cfg.cond_tokens())?;
        Ok(Conditioned {
            cond: self.add_per_sample(&c, &pos)?,
            keypoints,
            angles,
        })
    }

    /// [`crate::model::ActionHead::keypoints`]: `[b, K, 2]` of vision
    /// `[b, vision_tokens, feature_dim]`.
    pub fn keypoints(&self, vision: &Tensor) -> Result<Tensor> {
        Ok(self.keypoints_and_weights(vision)?.0)
    }

    /// [`Self::keypoints`] and their softmax weights over the patch grid,
    /// `[b, K, n * n]`.
    fn keypoints_and_weights(&self, vision: &Tensor) -> Result<(Tensor, Tensor)> {
        let (n, k) = (self.cfg.vision_grid, self.cfg.keypoints);
        let b = vision.dims()[0];
        let patches = vision.narrow(1, 1, n * n)?;
        let h = candle_nn::ops::silu(&self.linear("kp_fc1", &patches)?)?;
        let logits = self.linear("kp_fc2", &h)?; // [b, P, K]
        let w = candle_nn::ops::softmax(&logits.transpose(1, 2)?.contiguous()?, D::Minus1)?;
        let coords = Tensor::from_vec(patch_coords(n), (n * n, 2), &self.dev)?;
        let kp = w
            .reshape((b * k, n * n))?
            .matmul(&coords)?
            .reshape((b, k, 2))?;
        Ok((kp, w))
    }

    /// [`crate::model::ActionHead::forward`].
    pub fn forward(&self, cond: &Tensor, x: &Tensor, temb: &Tensor) -> Result<Tensor> {
        let (tc, h) = (self.cfg.cond_tokens(), self.cfg.horizon);
        if self.cfg.arch == Arch::Mlp {
            let (b, ad) = (x.dims()[0], self.cfg.action_dim);
            let c = cond.reshape((b, 1, tc * self.cfg.d_model))?;
            let a = x.reshape((b, 1, h * ad))?;
            let mut z = Tensor::cat(&[&c, &a, temb], 2)?;
            for i in 0..self.cfg.n_layers {
                z = candle_nn::ops::silu(&self.linear(&format!("mlp.{i}"), &z)?)?;
            }
            return Ok(self.linear("action_out", &z)?.reshape((b, h, ad))?);
        }
        let a = self.linear("action_in", x)?;
        let at = Tensor::cat(&[&a, temb], 2)?;
        let at = candle_nn::ops::silu(&self.linear("time_mlp_in", &at)?)?;
        let at = self.linear("time_mlp_out", &at)?;
        let mut at = self.add_per_sample(&at, &self.var("pos")?.narrow(0, tc, h)?)?;
        if self.cfg.condition_actions {
            let ls = (cond.narrow(1, tc - 2, 1)? + cond.narrow(1, tc - 1, 1)?)?;
            at = at.broadcast_add(&ls)?;
        }
        let mut z = Tensor::cat(&[cond, &at], 1)?;
        for i in 0..self.cfg.n_layers {
            let b = format!("blocks.{i}");
            let y = self.layer_norm(&format!("{b}.ln1"), &z)?;
            z = (&z + self.attention(&format!("{b}.attn"), &y)?)?;
            let y = self.layer_norm(&format!("{b}.ln2"), &z)?;
            let y = candle_nn::ops::silu(&self.linear(&format!("{b}.fc1"), &y)?)?;
            z = (&z + self.linear(&format!("{b}.fc2"), &y)?)?;
        }
        let za = z.narrow(1, tc, h)?;
        let za = self.layer_norm("ln_f", &za)?;
        self.linear("action_out", &za)
    }

    /// A host tensor on the training device.
    pub fn tensor(&self, data: Vec<f32>, dims: &[usize]) -> Result<Tensor> {
        Ok(Tensor::from_vec(data, dims, &self.dev)?)
    }

    /// Write the weights and `norm` as a checkpoint the runtime model loads
    /// (safetensors, f32, the config in its metadata).
    pub fn save(&self, norm: &Normalizer, path: &Path) -> Result<()> {
        let mut named: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
        for (name, v) in &self.vars {
            let t = v.as_tensor().to_dtype(DType::F32)?;
            named.push((name.clone(), t.dims().to_vec(), t.flatten_all()?.to_vec1()?));
        }
        let shapes = norm_shapes(&self.cfg);
        let values = norm_values(norm);
        if shapes.len() != values.len() {
            return Err(Error::Config(format!(
                "the normaliser has {} tensors, the config (vision_norm {}) wants {}",
                values.len(),
                self.cfg.vision_norm,
                shapes.len()
            )));
        }
        for ((name, dims), v) in shapes.into_iter().zip(values) {
            if v.len() != dims.iter().product::<usize>() {
                return Err(Error::Config(format!(
                    "`{name}` has {} values, expected {dims:?}",
                    v.len()
                )));
            }
            named.push((name, dims, v.clone()));
        }
        write_checkpoint(path, &self.cfg, &named)
    }
}

/// Write named f32 tensors as safetensors with `cfg` in the metadata.
pub fn write_checkpoint(
    path: &Path,
    cfg: &Config,
    named: &[(String, Vec<usize>, Vec<f32>)],
) -> Result<()> {
    let bytes: Vec<Vec<u8>> = named
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let mut views = Vec::with_capacity(named.len());
    for ((name, dims, _), b) in named.iter().zip(&bytes) {
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, dims.clone(), b)
            .map_err(|e| Error::Config(format!("tensor `{name}`: {e}")))?;
        views.push((name.clone(), view));
    }
    let meta = cfg.metadata()?;
    let data = safetensors::serialize(views, Some(meta))
        .map_err(|e| Error::Config(format!("serialising the checkpoint: {e}")))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    // Write beside, then rename: a checkpoint that exists is whole.
    let tmp = path.with_extension("safetensors.partial");
    std::fs::write(&tmp, data).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}
