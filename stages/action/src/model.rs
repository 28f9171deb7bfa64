//! The flow-matching action head on edgeflow's runtime: a small
//! pre-norm transformer over `[vision tokens, instruction, state, action
//! tokens]` that predicts the flow velocity of each action token.
//!
//! Tokens (all `d_model` wide, plus a learned position per slot `pos`):
//! - `vision_in`: each vision token `[feature_dim * vision_stack^2]`
//!   ([`crate::config::pool_vision_tokens`]); with keypoints, the CLS token
//!   only, and each keypoint `[x, y]` through `kp_in` (scored per patch by
//!   `kp_fc2(silu(kp_fc1(patch)))`, see [`crate::config::spatial_softmax`]),
//!   optionally with the patches under it (`kp_feat`) and an angle read
//!   out of them (`kp_ang2(silu(kp_ang1(..)))`, [`Config::keypoint_angles`]);
//! - `text_in`: the instruction embedding `[feature_dim]`;
//! - `state_in`: the normalised robot state `[state_dim]`;
//! - action tokens, pi0-style: `time_mlp_out(silu(time_mlp_in([action_in(x_j), emb(t_j)])))`,
//!   with a flow time per token (a frozen prefix token has `t = 1`).
//!
//! Blocks `blocks.{i}`: `z += attn(ln1(z))` (every token sees every
//! token), `z += fc2(silu(fc1(ln2(z))))`; then `ln_f` and `action_out` on
//! the action tokens give the output `[b, H, action_dim]`: the velocity, or
//! the clean chunk ([`crate::config::Prediction`]).
//!
//! With `arch: mlp` ([`crate::config::Arch::Mlp`]) the same conditioning
//! tokens (with `pos` over them only) are flattened and, with the flattened
//! noisy chunk and [`Config::time_input`]'s row, go through `mlp.{i}`
//! (each followed by SiLU) and `action_out` to the whole chunk at once.
//! The checkpoint also holds the [`Normalizer`] as `norm.*`.

use crate::config::{
    spatial_softmax, spatial_softmax_weights, Arch, Config, Normalizer, Prediction,
};
use crate::{Error, Result};
use edgeflow_nn::{Attention, LayerNorm, Linear, Masking, Projections, VarBuilder};
use edgeflow_runtime::{Device, Tensor};

/// Names of every tensor in a checkpoint for `cfg`, with their dims (the
/// training twin creates exactly these).
pub fn tensor_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (d, f, m) = (cfg.d_model, cfg.feature_dim, cfg.mlp_dim);
    let mut v: Vec<(String, Vec<usize>)> = Vec::new();
    let mut lin = |name: &str, i: usize, o: usize| {
        v.push((format!("{name}.weight"), vec![o, i]));
        v.push((format!("{name}.bias"), vec![o]));
    };
    lin("vision_in", cfg.vision_width(), d);
    if cfg.keypoints > 0 {
        lin("kp_fc1", f, cfg.keypoint_hidden);
        lin("kp_fc2", cfg.keypoint_hidden, cfg.keypoints);
        lin("kp_in", cfg.keypoint_inputs(), d);
        if cfg.keypoint_features {
            lin("kp_feat", f, d);
        }
        if cfg.keypoint_angles > 0 {
            lin("kp_ang1", f, cfg.keypoint_hidden);
            lin("kp_ang2", cfg.keypoint_hidden, 2);
        }
    }
    lin("text_in", f, d);
    lin("state_in", cfg.state_dim, d);
    if cfg.arch == Arch::Mlp {
        for i in 0..cfg.n_layers {
            lin(
                &format!("mlp.{i}"),
                if i == 0 { cfg.mlp_inputs() } else { m },
                m,
            );
        }
        lin("action_out", m, cfg.horizon * cfg.action_dim);
        v.push(("pos".into(), vec![cfg.cond_tokens(), d]));
        return v;
    }
    lin("action_in", cfg.action_dim, d);
    lin("time_mlp_in", 2 * d, d);
    lin("time_mlp_out", d, d);
    for i in 0..cfg.n_layers {
        let b = format!("blocks.{i}");
        for p in ["q", "k", "v", "o"] {
            lin(&format!("{b}.attn.{p}"), d, d);
        }
        lin(&format!("{b}.fc1"), d, m);
        lin(&format!("{b}.fc2"), m, d);
    }
    lin("action_out", d, cfg.action_dim);
    for n in ["ln_f".to_string()].into_iter().chain(
        (0..cfg.n_layers).flat_map(|i| [format!("blocks.{i}.ln1"), format!("blocks.{i}.ln2")]),
    ) {
        v.push((format!("{n}.weight"), vec![d]));
        v.push((format!("{n}.bias"), vec![d]));
    }
    v.push(("pos".into(), vec![cfg.tokens(), d]));
    v
}

/// Names and dims of the normaliser tensors.
pub fn norm_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let mut v = vec![
        ("norm.state_mean".into(), vec![cfg.state_dim]),
        ("norm.state_std".into(), vec![cfg.state_dim]),
        ("norm.action_mean".into(), vec![cfg.action_dim]),
        ("norm.action_std".into(), vec![cfg.action_dim]),
    ];
    if cfg.vision_norm {
        v.push(("norm.vision_mean".into(), vec![cfg.feature_dim]));
        v.push(("norm.vision_std".into(), vec![cfg.feature_dim]));
    }
    if cfg.text_norm {
        v.push(("norm.text_mean".into(), vec![cfg.feature_dim]));
        v.push(("norm.text_std".into(), vec![cfg.feature_dim]));
    }
    v
}

/// The normaliser's values in [`norm_shapes`]' order.
pub fn norm_values(norm: &Normalizer) -> Vec<&Vec<f32>> {
    let mut v = vec![
        &norm.state_mean,
        &norm.state_std,
        &norm.action_mean,
        &norm.action_std,
    ];
    if !norm.vision_mean.is_empty() {
        v.push(&norm.vision_mean);
        v.push(&norm.vision_std);
    }
    if !norm.text_mean.is_empty() {
        v.push(&norm.text_mean);
        v.push(&norm.text_std);
    }
    v
}

#[derive(Debug, Clone)]
struct Block {
    ln1: LayerNorm,
    attn: Attention,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl Block {
    fn load(vb: &VarBuilder, cfg: &Config) -> Result<Self> {
        let d = cfg.d_model;
        let a = vb.pp("attn");
        let proj = Projections::Separate {
            q: Linear::load(&a.pp("q"), d, d, true)?,
            k: Linear::load(&a.pp("k"), d, d, true)?,
            v: Linear::load(&a.pp("v"), d, d, true)?,
        };
        let o = Linear::load(&a.pp("o"), d, d, true)?;
        Ok(Block {
            ln1: LayerNorm::load(&vb.pp("ln1"), d, cfg.norm_eps)?,
            attn: Attention::new(proj, o, cfg.n_heads, cfg.n_heads, cfg.head_dim())?,
            ln2: LayerNorm::load(&vb.pp("ln2"), d, cfg.norm_eps)?,
            fc1: Linear::load(&vb.pp("fc1"), d, cfg.mlp_dim, true)?,
            fc2: Linear::load(&vb.pp("fc2"), cfg.mlp_dim, d, true)?,
        })
    }

    fn forward(&self, dev: &Device, z: &Tensor) -> Result<Tensor> {
        let y = self.ln1.forward(dev, z)?;
        let y = self.attn.forward(dev, &y, None, None, Masking::Full)?;
        let z = dev.add(z, &y)?;
        let y = self.ln2.forward(dev, &z)?;
        let y = dev.silu(&self.fc1.forward(dev, &y)?)?;
        let y = self.fc2.forward(dev, &y)?;
        Ok(dev.add(&z, &y)?)
    }
}

/// The spatial-softmax keypoint layers.
#[derive(Debug, Clone)]
struct Keypoints {
    fc1: Linear,
    fc2: Linear,
    kp_in: Linear,
    /// [`Config::keypoint_features`].
    feat: Option<Linear>,
    /// [`Config::keypoint_angles`]: `kp_ang1`, `kp_ang2`.
    angle: Option<(Linear, Linear)>,
}

/// The action head (see the module docs for its structure and names).
#[derive(Debug, Clone)]
pub struct ActionHead {
    cfg: Config,
    norm: Normalizer,
    vision_in: Linear,
    keypoint: Option<Keypoints>,
    text_in: Linear,
    state_in: Linear,
    pos: Tensor,
    body: Body,
    action_out: Linear,
}

/// What lies between the conditioning tokens and `action_out`.
#[derive(Debug, Clone)]
enum Body {
    Transformer(Box<TransformerBody>),
    Mlp(Vec<Linear>),
}

/// pi0's action tokens and blocks.
#[derive(Debug, Clone)]
struct TransformerBody {
    action_in: Linear,
    time_mlp_in: Linear,
    time_mlp_out: Linear,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
}

impl ActionHead {
    /// Load the head's tensors under `vb` for `cfg`.
    pub fn load(vb: &VarBuilder, cfg: &Config) -> Result<Self> {
        cfg.validate()?;
        let (d, f) = (cfg.d_model, cfg.feature_dim);
        let host = |name: &str, n: usize| -> Result<Vec<f32>> {
            let t = vb.get_f32(name, &[n])?;
            Ok(vb.device().to_host(&t)?.to_vec_f32()?)
        };
        let norm = Normalizer {
            state_mean: host("norm.state_mean", cfg.state_dim)?,
            state_std: host("norm.state_std", cfg.state_dim)?,
            action_mean: host("norm.action_mean", cfg.action_dim)?,
            action_std: host("norm.action_std", cfg.action_dim)?,
            vision_mean: if cfg.vision_norm {
                host("norm.vision_mean", cfg.feature_dim)?
            } else {
                Vec::new()
            },
            vision_std: if cfg.vision_norm {
                host("norm.vision_std", cfg.feature_dim)?
            } else {
                Vec::new()
            },
            text_mean: if cfg.text_norm {
                host("norm.text_mean", cfg.feature_dim)?
            } else {
                Vec::new()
            },
            text_std: if cfg.text_norm {
                host("norm.text_std", cfg.feature_dim)?
            } else {
                Vec::new()
            },
        };
        if norm
            .state_std
            .iter()
            .chain(&norm.action_std)
            .chain(&norm.vision_std)
            .chain(&norm.text_std)
            .any(|s| !(s.is_finite() && *s > 0.0))
        {
            return Err(Error::BadModel {
                path: vb.path(),
                msg: "norm.*_std holds a non-positive or non-finite value".into(),
            });
        }
        let (m, chunk) = (cfg.mlp_dim, cfg.horizon * cfg.action_dim);
        let (body, action_out) = match cfg.arch {
            Arch::Transformer => (
                Body::Transformer(Box::new(TransformerBody {
                    action_in: Linear::load(&vb.pp("action_in"), cfg.action_dim, d, true)?,
                    time_mlp_in: Linear::load(&vb.pp("time_mlp_in"), 2 * d, d, true)?,
                    time_mlp_out: Linear::load(&vb.pp("time_mlp_out"), d, d, true)?,
                    blocks: (0..cfg.n_layers)
                        .map(|i| Block::load(&vb.pp("blocks").pp(i), cfg))
                        .collect::<Result<Vec<_>>>()?,
                    ln_f: LayerNorm::load(&vb.pp("ln_f"), d, cfg.norm_eps)?,
                })),
                Linear::load(&vb.pp("action_out"), d, cfg.action_dim, true)?,
            ),
            Arch::Mlp => (
                Body::Mlp(
                    (0..cfg.n_layers)
                        .map(|i| {
                            let i_w = if i == 0 { cfg.mlp_inputs() } else { m };
                            Linear::load(&vb.pp("mlp").pp(i), i_w, m, true)
                        })
                        .collect::<std::result::Result<Vec<_>, _>>()?,
                ),
                Linear::load(&vb.pp("action_out"), m, chunk, true)?,
            ),
        };
        Ok(ActionHead {
            cfg: cfg.clone(),
            norm,
            vision_in: Linear::load(&vb.pp("vision_in"), cfg.vision_width(), d, true)?,
            keypoint: if cfg.keypoints > 0 {
                Some(Keypoints {
                    fc1: Linear::load(&vb.pp("kp_fc1"), f, cfg.keypoint_hidden, true)?,
                    fc2: Linear::load(&vb.pp("kp_fc2"), cfg.keypoint_hidden, cfg.keypoints, true)?,
                    kp_in: Linear::load(&vb.pp("kp_in"), cfg.keypoint_inputs(), d, true)?,
                    feat: if cfg.keypoint_features {
                        Some(Linear::load(&vb.pp("kp_feat"), f, d, true)?)
                    } else {
                        None
                    },
                    angle: if cfg.keypoint_angles > 0 {
                        let h = cfg.keypoint_hidden;
                        Some((
                            Linear::load(&vb.pp("kp_ang1"), f, h, true)?,
                            Linear::load(&vb.pp("kp_ang2"), h, 2, true)?,
                        ))
                    } else {
                        None
                    },
                })
            } else {
                None
            },
            text_in: Linear::load(&vb.pp("text_in"), f, d, true)?,
            state_in: Linear::load(&vb.pp("state_in"), cfg.state_dim, d, true)?,
            pos: vb.get_f32(
                "pos",
                &[
                    match cfg.arch {
                        Arch::Transformer => cfg.tokens(),
                        Arch::Mlp => cfg.cond_tokens(),
                    },
                    d,
                ],
            )?,
            body,
            action_out,
        })
    }

    /// The config.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The state / action normalisation stored with the weights.
    pub fn normalizer(&self) -> &Normalizer {
        &self.norm
    }

    /// The conditioning tokens `[b, cond_tokens, d_model]` of pooled
    /// vision tokens `[b, vision_tokens, vision_width]`, instruction
    /// embeddings `[b, 1, feature_dim]` and normalised states `[b, 1,
    /// state_dim]`; `origin` holds each sample's robot position in keypoint
    /// units (`[b * 2]`, [`Config::keypoint_origin`]; read only with
    /// relative keypoints). Computed once per chunk, reused by every ODE
    /// step.
    pub fn condition(
        &self,
        dev: &Device,
        vision: &Tensor,
        text: &Tensor,
        state: &Tensor,
        origin: &[f32],
    ) -> Result<Tensor> {
        let l = self.text_in.forward(dev, text)?;
        let s = self.state_in.forward(dev, state)?;
        let c = match &self.keypoint {
            None => {
                let v = self.vision_in.forward(dev, vision)?;
                dev.concat(&[&v, &l, &s], 1)?
            }
            Some(k) => {
                let (b, n) = (kp_batch(vision)?, self.cfg.keypoints);
                let cls = match self.cfg.cls_token {
                    true => dev.narrow(vision, 1, 0, 1)?,
                    // [`Config::cls_token`] off: the slot reads zeros.
                    false => {
                        let w = self.cfg.vision_width();
                        dev.place(&Tensor::from_vec(vec![0.0; b * w], &[b, 1, w])?)?
                    }
                };
                let v = self.vision_in.forward(dev, &cls)?;
                let logits = self.keypoint_logits(dev, k, vision)?;
                let kp = spatial_softmax(&logits, b, self.cfg.vision_grid, n);
                let relative = self.cfg.keypoint_position_inputs() == 4;
                if relative && origin.len() != 2 * b {
                    return Err(Error::BadInput(format!(
                        "{} origin values for a batch of {b} (x, y each)",
                        origin.len()
                    )));
                }
                let pooled = match self.cfg.keypoint_features || k.angle.is_some() {
                    true => Some(self.keypoint_features(dev, &logits, vision)?),
                    false => None,
                };
                let angles = match (&k.angle, &pooled) {
                    (Some((a1, a2)), Some(p)) => {
                        let h = dev.silu(&a1.forward(dev, p)?)?;
                        dev.to_host(&a2.forward(dev, &h)?)?.to_vec_f32()?
                    }
                    _ => Vec::new(),
                };
                let read = self.cfg.keypoint_angles;
                let mut input = Vec::with_capacity(b * n * self.cfg.keypoint_inputs());
                for (i, p) in kp.chunks(2).enumerate() {
                    input.extend_from_slice(p);
                    if relative {
                        let o = &origin[2 * (i / n)..2 * (i / n) + 2];
                        input.extend([p[0] - o[0], p[1] - o[1]]);
                    }
                    if !angles.is_empty() {
                        // Keypoints past the first `read` carry no angle.
                        match i % n < read {
                            true => input.extend_from_slice(&angles[2 * i..2 * i + 2]),
                            false => input.extend([0.0, 0.0]),
                        }
                    }
                }
                let kp = dev.place(&Tensor::from_vec(
                    input,
                    &[b, n, self.cfg.keypoint_inputs()],
                )?)?;
                let mut kp = k.kp_in.forward(dev, &kp)?;
                if let (Some(feat), Some(p)) = (&k.feat, &pooled) {
                    kp = dev.add(&kp, &feat.forward(dev, p)?)?;
                }
                dev.concat(&[&v, &kp, &l, &s], 1)?
            }
        };
        let pos = dev.narrow(&self.pos, 0, 0, self.cfg.cond_tokens())?;
        Ok(dev.add(&c, &pos)?)
    }

    /// The keypoints `[b, K, 2]` (host, row-major; coordinates of
    /// [`crate::config::patch_coords`]) of pooled, normalised vision
    /// tokens `[b, vision_tokens, feature_dim]`; empty without keypoints.
    pub fn keypoints(&self, dev: &Device, vision: &Tensor) -> Result<Vec<f32>> {
        let Some(k) = &self.keypoint else {
            return Ok(Vec::new());
        };
        Ok(spatial_softmax(
            &self.keypoint_logits(dev, k, vision)?,
            kp_batch(vision)?,
            self.cfg.vision_grid,
            self.cfg.keypoints,
        ))
    }

    /// Each patch's keypoint scores, `[b, P, K]` on the host.
    fn keypoint_logits(&self, dev: &Device, k: &Keypoints, vision: &Tensor) -> Result<Vec<f32>> {
        let p = self.cfg.vision_grid * self.cfg.vision_grid;
        let patches = dev.narrow(vision, 1, 1, p)?;
        let h = dev.silu(&k.fc1.forward(dev, &patches)?)?;
        Ok(dev.to_host(&k.fc2.forward(dev, &h)?)?.to_vec_f32()?)
    }

    /// [`Config::keypoint_features`]: the patch tokens under each keypoint
    /// of [`Self::keypoint_logits`]' scores, `[b, K, feature_dim]` on the
    /// device (host arithmetic: `vision_grid^2 x feature_dim` multiply-adds
    /// per keypoint, 24,576 at 8 x 8 x 384).
    fn keypoint_features(&self, dev: &Device, logits: &[f32], vision: &Tensor) -> Result<Tensor> {
        let (b, n, f) = (kp_batch(vision)?, self.cfg.keypoints, self.cfg.feature_dim);
        let p = self.cfg.vision_grid * self.cfg.vision_grid;
        let patches = dev.narrow(vision, 1, 1, p)?;
        let w = spatial_softmax_weights(logits, b, self.cfg.vision_grid, n);
        let patches = dev.to_host(&patches)?.to_vec_f32()?;
        let mut pooled = vec![0f32; b * n * f];
        for s in 0..b {
            for j in 0..n {
                let out = &mut pooled[(s * n + j) * f..(s * n + j + 1) * f];
                for (i, &wi) in w[(s * n + j) * p..(s * n + j + 1) * p].iter().enumerate() {
                    let row = &patches[(s * p + i) * f..(s * p + i + 1) * f];
                    out.iter_mut().zip(row).for_each(|(o, r)| *o += wi * r);
                }
            }
        }
        Ok(dev.place(&Tensor::from_vec(pooled, &[b, n, f])?)?)
    }

    /// The flow velocity `[b, H, action_dim]` of noisy normalised actions
    /// `x[b, H, action_dim]` at per-token flow times `times[b * H]` (a
    /// frozen prefix token, `t = 1`, gets 0), given [`Self::condition`]'s
    /// tokens: [`Self::forward`]'s output, or derived from its clean chunk
    /// ([`Prediction::Sample`]).
    pub fn velocity(
        &self,
        dev: &Device,
        cond: &Tensor,
        x: &Tensor,
        times: &[f32],
    ) -> Result<Tensor> {
        let ad = self.cfg.action_dim;
        let dims = x.dims().to_vec();
        if dims.len() != 3 || dims[0] * dims[1] != times.len() || dims[1] != self.cfg.horizon {
            return Err(Error::BadInput(format!(
                "{} flow times for noisy actions of dims {dims:?} (horizon {})",
                times.len(),
                self.cfg.horizon
            )));
        }
        let (temb, tdims) = self.cfg.time_input(times);
        let temb = dev.place(&Tensor::from_vec(temb, &tdims)?)?;
        let out = self.forward(dev, cond, x, &temb)?;
        let p = self.cfg.prediction;
        let w: Vec<f32> = times
            .iter()
            .flat_map(|&t| std::iter::repeat_n(p.velocity_weight(t), ad))
            .collect();
        let w = dev.place(&Tensor::from_vec(w, &dims)?)?;
        let y = match p {
            Prediction::Velocity => out,
            Prediction::Sample => dev.sub(&out, x)?,
        };
        Ok(dev.mul(&y, &w)?)
    }

    /// The network's output `[b, H, action_dim]` for noisy normalised
    /// actions `x[b, H, action_dim]` whose per-token flow times are given
    /// as [`Config::time_input`] writes them, given [`Self::condition`]'s
    /// tokens: the velocity or the clean chunk, as the config's
    /// `prediction` says.
    pub fn forward(
        &self,
        dev: &Device,
        cond: &Tensor,
        x: &Tensor,
        temb: &Tensor,
    ) -> Result<Tensor> {
        let (tc, h, ad) = (
            self.cfg.cond_tokens(),
            self.cfg.horizon,
            self.cfg.action_dim,
        );
        let t = match &self.body {
            Body::Transformer(t) => t,
            Body::Mlp(layers) => {
                let b = kp_batch(x)?;
                let c = dev.reshape(cond, &[b, 1, tc * self.cfg.d_model])?;
                let a = dev.reshape(x, &[b, 1, h * ad])?;
                let mut z = dev.concat(&[&c, &a, temb], 2)?;
                for l in layers {
                    z = dev.silu(&l.forward(dev, &z)?)?;
                }
                let y = self.action_out.forward(dev, &z)?;
                return Ok(dev.reshape(&y, &[b, h, ad])?);
            }
        };
        let a = t.action_in.forward(dev, x)?;
        let at = dev.concat(&[&a, temb], 2)?;
        let at = dev.silu(&t.time_mlp_in.forward(dev, &at)?)?;
        let at = t.time_mlp_out.forward(dev, &at)?;
        let mut at = dev.add(&at, &dev.narrow(&self.pos, 0, tc, h)?)?;
        if self.cfg.condition_actions {
            at = dev.add(&at, &dev.narrow(cond, 1, tc - 2, 1)?)?;
            at = dev.add(&at, &dev.narrow(cond, 1, tc - 1, 1)?)?;
        }
        let mut z = dev.concat(&[cond, &at], 1)?;
        for b in &t.blocks {
            z = b.forward(dev, &z)?;
        }
        let za = dev.narrow(&z, 1, tc, h)?;
        let za = t.ln_f.forward(dev, &za)?;
        self.action_out.forward(dev, &za).map_err(Error::from)
    }
}

/// The batch size of a `[b, rows, width]` tensor.
fn kp_batch(t: &Tensor) -> Result<usize> {
    t.dims()
        .first()
        .copied()
        .ok_or_else(|| Error::BadInput("vision tokens: a tensor without dims".into()))
}
