//! `edgeflow bench omni`: the Omni speech path's synthesis stages on our
//! runtime against PyTorch on the CPU, same threads, same run.
//!
//! - **token2wav** (Qwen2.5-Omni's DiT sampler, then BigVGAN) at the real
//!   configuration (DiT 22 layers x 1024, BigVGAN 1536 channels and 240x
//!   upsampling), with seeded random weights on both sides: no Qwen2.5-Omni
//!   weights can be had offline, and the time does not depend on the
//!   values. Ours loads through its own loader from
//!   [`RandomWeights`]; the peer is `transformers`' implementation
//!   (`scripts/omni_bench_peer.py token2wav`, from the venv of
//!   `scripts/peer_envs.sh omni`). Rows: the DiT's whole-utterance sample
//!   (`--codes` codec tokens, `--steps` schedule points as upstream's
//!   `num_steps`, RK4 3/8 rule with guidance), BigVGAN on its mel, and the
//!   time to first audio of a streamed start: the DiT on the first chunk of
//!   `--first-chunk` codes with `--right` codes of look-ahead, then
//!   BigVGAN on its frames (upstream has no streamed mode to compare; the
//!   row has no baseline).
//! - **HiFi-GAN V1 universal** (real weights, `edgeflow models fetch
//!   hifigan-universal`) against its PyTorch generator
//!   (`scripts/omni_bench_peer.py hifigan`) on the same number of frames.
//!
//! Our times are medians of `--runs` before and `--runs` after the peer's
//! (each after one warm-up), so a load that drifts during the run does not
//! favour either side; the peer's are medians of `--runs`. Real-time
//! factor is time / audio duration.

use super::{median, pool_threads, repo_root, Bench, BenchReport, Peer, Row};
use anyhow::Context as _;
use edgeflow_omni::{bigvgan, dit, VarBuilder, WeightFormat};
use edgeflow_runtime::weights::RandomWeights;
use edgeflow_runtime::{Device, DeviceSpec, Tensor};
use std::process::Command;
use std::time::Instant;

/// Options of `edgeflow bench omni`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct OmniArgs {
    /// Codec tokens of the utterance (2 mel frames each, 10 ms per frame).
    #[arg(long, default_value_t = 50)]
    pub codes: usize,
    /// ODE schedule points (upstream's `num_steps`: steps - 1 RK4 steps).
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Codes of the first streamed chunk (the time-to-first-audio row).
    #[arg(long, default_value_t = 12)]
    pub first_chunk: usize,
    /// Codes of look-ahead after the first chunk.
    #[arg(long, default_value_t = 12)]
    pub right: usize,
    /// Mel frames for the HiFi-GAN rows (172 frames: 2 s at 22.05 kHz).
    #[arg(long, default_value_t = 172)]
    pub hifigan_frames: usize,
    /// Timed runs per row (after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Skip the token2wav rows (they take minutes on a small CPU).
    #[arg(long)]
    pub no_token2wav: bool,
    /// The DiT's linear weights in bf16 (on a CPU with AVX512_BF16, its
    /// bf16 dot product), and PyTorch's DiT in bfloat16.
    #[arg(long)]
    pub dit_bf16: bool,
    /// After each model's timed runs, one more run with every op timed:
    /// the top K ops by time go into the notes (0: none).
    #[arg(long, default_value_t = 0)]
    pub profile_ops: usize,
}

impl Default for OmniArgs {
    fn default() -> Self {
        OmniArgs {
            codes: 50,
            steps: 5,
            first_chunk: 12,
            right: 12,
            hifigan_frames: 172,
            runs: 3,
            no_token2wav: false,
            dit_bf16: false,
            profile_ops: 0,
        }
    }
}

/// Milliseconds of `runs` calls of `f` after one warm-up call.
fn times_ms(runs: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<Vec<f64>> {
    f()?;
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t0 = Instant::now();
        f()?;
        t.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(t)
}

/// Median milliseconds of `runs` calls of `f` after one warm-up call.
fn time_ms(runs: usize, f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    Ok(median(times_ms(runs, f)?))
}

impl OmniArgs {
    /// With `--profile-ops K`, one more call of `f` with every op timed;
    /// its top K ops go into the report's notes under `what`.
    fn profile(
        &self,
        dev: &Device,
        rep: &mut BenchReport,
        what: &str,
        f: impl FnOnce() -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        if self.profile_ops > 0 {
            let ops = super::op_profile(dev, self.profile_ops, f)?;
            rep.notes.push(format!("{what}: {ops}"));
        }
        Ok(())
    }
}

/// Run the torch peer; its JSON (last stdout line), or None without a venv.
fn peer(args: &[String]) -> anyhow::Result<Option<serde_json::Value>> {
    let Some(py) = Peer::Omni.find() else {
        return Ok(None);
    };
    let r = Command::new(&py)
        .arg(repo_root().join("scripts/omni_bench_peer.py"))
        .args(args)
        .output()
        .with_context(|| format!("running {}", py.display()))?;
    if !r.status.success() {
        anyhow::bail!(
            "the torch peer failed: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    }
    let out = String::from_utf8_lossy(&r.stdout);
    let line = out.lines().last().unwrap_or_default();
    Ok(Some(
        serde_json::from_str(line).context("the torch peer printed no JSON")?,
    ))
}

fn row(label: String, ours: f64, base: Option<f64>, note: String) -> Row {
    match base {
        Some(b) => Row::new(label, ours, "ms")
            .baseline(b)
            .ratio(ours / b)
            .note(note),
        None => Row::new(label, ours, "ms").note(note),
    }
}

impl OmniArgs {
    fn token2wav(&self, dev: &Device, rep: &mut BenchReport, n: usize) -> anyhow::Result<()> {
        let dcfg = dit::Config::default();
        let vcfg = bigvgan::Config::default();
        let t0 = Instant::now();
        let dw = RandomWeights::new("random:token2wav-dit", dit::weight_shapes(&dcfg), 1)?;
        let vw = RandomWeights::new("random:token2wav-bigvgan", bigvgan::weight_shapes(&vcfg), 2)?;
        let params = dw.elements() + vw.elements();
        let format = if self.dit_bf16 {
            WeightFormat::Bf16
        } else {
            WeightFormat::Stored
        };
        let model = dit::Dit::load_with_format(&VarBuilder::from_reader(dw, dev), &dcfg, format)?;
        let voc = bigvgan::BigVgan::load(&VarBuilder::from_reader(vw, dev), &vcfg)?;
        let built_s = t0.elapsed().as_secs_f64();
        let pages = super::settle_huge_pages();
        rep.context.push(format!(
            "token2wav at the real configuration, random weights ({:.0} M parameters, f32{}), built in {built_s:.1} s, {pages}",
            params as f64 / 1e6,
            if self.dit_bf16 {
                "; the DiT's linear weights rounded to bf16, PyTorch's DiT in bfloat16"
            } else {
                ""
            },
        ));
        let cond = dev.rand_normal(&[1, dcfg.enc_emb_dim], 0.0, 1.0, 3)?;
        let ref_mel = dev.rand_normal(&[1, 300, dcfg.mel_dim], 0.0, 1.0, 4)?;
        let spk = model.speaker(&cond, &ref_mel)?;
        let codes: Vec<u32> = (0..self.codes)
            .map(|i| ((i * 7919) % dcfg.num_embeds) as u32)
            .collect();
        let opts = dit::SampleOptions {
            num_steps: self.steps,
            ..dit::SampleOptions::default()
        };
        let frames = self.codes * dcfg.repeats;
        let audio_s = (frames * vcfg.hop_length()) as f64 / 24_000.0;
        eprintln!(
            "  token2wav DiT ({} codes, {} steps)...",
            self.codes, self.steps
        );
        let mut mel: Option<Tensor> = None;
        let mut dit_t = times_ms(self.runs, || {
            mel = Some(model.sample_seeded(&spk, &codes, 5, &opts, || false)?);
            Ok(())
        })?;
        let mel = mel.context("no mel")?;
        eprintln!("  BigVGAN ({frames} frames)...");
        let vocode = || {
            let y = voc.forward(&mel)?;
            let _ = dev.to_host(&y)?;
            Ok(())
        };
        let mut voc_t = times_ms(self.runs, vocode)?;
        // A streamed start: the first chunk's frames with look-ahead, then
        // their audio.
        let first = self.first_chunk.clamp(1, self.codes);
        let right = self.right.min(self.codes - first);
        let noise = model.noise(frames, 5)?;
        eprintln!("  first chunk ({first} codes + {right} ahead)...");
        let ttfa_ms = time_ms(self.runs, || {
            let m =
                model.sample_window(&spk, &codes, &noise, 0..first, 0, right, &opts, || false)?;
            let y = voc.forward(&m)?;
            let _ = dev.to_host(&y)?;
            Ok(())
        })?;
        eprintln!("  transformers on torch...");
        let mut peer_args = vec![
            "token2wav".into(),
            "--threads".into(),
            n.to_string(),
            "--runs".into(),
            self.runs.to_string(),
            "--codes".into(),
            self.codes.to_string(),
            "--steps".into(),
            self.steps.to_string(),
        ];
        if self.dit_bf16 {
            peer_args.extend(["--dit-dtype".into(), "bfloat16".into()]);
        }
        let p = peer(&peer_args)?;
        // Ours again after the peer: on a shared machine the load drifts
        // between the two sides; runs on both sides of the peer's keep a
        // drift from favouring either.
        eprintln!("  token2wav again...");
        dit_t.extend(times_ms(self.runs, || {
            model.sample_seeded(&spk, &codes, 5, &opts, || false)?;
            Ok(())
        })?);
        voc_t.extend(times_ms(self.runs, vocode)?);
        self.profile(dev, rep, "BigVGAN", vocode)?;
        self.profile(dev, rep, "DiT", || {
            model.sample_seeded(&spk, &codes, 5, &opts, || false)?;
            Ok(())
        })?;
        let (dit_ms, voc_ms) = (median(dit_t), median(voc_t));
        let pd = p.as_ref().and_then(|j| j["dit_ms"].as_f64());
        let pv = p.as_ref().and_then(|j| j["bigvgan_ms"].as_f64());
        let note = |ms: f64, base: Option<f64>| match base {
            Some(b) => format!(
                "RTF {:.2} (torch {:.2}), {audio_s:.2} s of audio",
                ms / 1e3 / audio_s,
                b / 1e3 / audio_s
            ),
            None => format!("RTF {:.2}, {audio_s:.2} s of audio", ms / 1e3 / audio_s),
        };
        rep.rows.push(row(
            format!("token2wav DiT, {} codes, {} steps", self.codes, self.steps),
            dit_ms,
            pd,
            note(dit_ms, pd),
        ));
        rep.rows.push(row(
            format!("token2wav BigVGAN, {frames} frames"),
            voc_ms,
            pv,
            note(voc_ms, pv),
        ));
        rep.rows.push(row(
            format!("time to first audio: DiT on {first} codes (+{right} ahead) + BigVGAN"),
            ttfa_ms,
            None,
            format!(
                "{:.2} s of audio; target < 300 ms",
                (first * dcfg.repeats * vcfg.hop_length()) as f64 / 24_000.0
            ),
        ));
        Ok(())
    }

    fn hifigan(&self, dev: &Device, rep: &mut BenchReport, n: usize) -> anyhow::Result<()> {
        let dir = edgeflow_vocoder::cards::find("hifigan-universal")?.locate()?;
        let model = edgeflow_vocoder::HifiGan::from_dir(&dir, dev)?;
        // The CPU backend's one-off move of the placed weights onto 2 MB
        // pages runs on a background thread: let it finish before timing,
        // as `bench thinker` and `bench vision` do.
        let pages = super::settle_huge_pages();
        rep.context
            .push(format!("HiFi-GAN universal loaded, {pages}"));
        let cfg = model.config().clone();
        let frames = self.hifigan_frames.max(1);
        let v = edgeflow_runtime::rng::normal_f32(cfg.num_mels * frames, -5.0, 1.0, 6);
        let mel = dev.place(&Tensor::from_vec(v, &[1, cfg.num_mels, frames])?)?;
        eprintln!("  HiFi-GAN universal ({frames} frames)...");
        let run = || {
            let y = model.forward(&mel)?;
            let _ = dev.to_host(&y)?;
            Ok(())
        };
        let mut t = times_ms(self.runs, run)?;
        let p = peer(&[
            "hifigan".into(),
            "--threads".into(),
            n.to_string(),
            "--runs".into(),
            self.runs.to_string(),
            "--frames".into(),
            frames.to_string(),
            "--model-dir".into(),
            dir.display().to_string(),
        ])?;
        t.extend(times_ms(self.runs, run)?);
        self.profile(dev, rep, "HiFi-GAN", run)?;
        let ms = median(t);
        let base = p.as_ref().and_then(|j| j["median_ms"].as_f64());
        let audio_s = (frames * cfg.hop_length()) as f64 / f64::from(cfg.sampling_rate);
        rep.rows.push(row(
            format!("HiFi-GAN V1 universal, {frames} frames (real weights)"),
            ms,
            base,
            format!("RTF {:.2}, {audio_s:.2} s of audio", ms / 1e3 / audio_s),
        ));
        Ok(())
    }
}

impl Bench for OmniArgs {
    fn name(&self) -> &'static str {
        "omni"
    }

    fn compares(&self) -> &'static str {
        "token2wav (DiT + BigVGAN, real configuration, random weights) and HiFi-GAN universal vs PyTorch on the CPU (same threads)"
    }

    fn args(&self) -> Vec<String> {
        let d = OmniArgs::default();
        let mut a = Vec::new();
        let mut push = |flag: &str, v: usize, dv: usize| {
            if v != dv {
                a.extend([flag.to_string(), v.to_string()]);
            }
        };
        push("--codes", self.codes, d.codes);
        push("--steps", self.steps, d.steps);
        push("--first-chunk", self.first_chunk, d.first_chunk);
        push("--right", self.right, d.right);
        push("--hifigan-frames", self.hifigan_frames, d.hifigan_frames);
        push("--runs", self.runs, d.runs);
        push("--profile-ops", self.profile_ops, d.profile_ops);
        if self.no_token2wav {
            a.push("--no-token2wav".into());
        }
        if self.dit_bf16 {
            a.push("--dit-bf16".into());
        }
        a
    }

    fn run(&self) -> anyhow::Result<BenchReport> {
        if self.codes == 0 || self.steps < 2 {
            anyhow::bail!("--codes must be at least 1 and --steps at least 2");
        }
        eprintln!("measuring the Omni synthesis stages (and PyTorch)...");
        let n = pool_threads();
        let dev = edgeflow_backends::open(DeviceSpec::Cpu)?;
        let mut rep = BenchReport::new(
            format!("edgeflow bench omni: token2wav and HiFi-GAN, {n} threads"),
            "PyTorch (CPU)",
            "ours / PyTorch",
        );
        rep.context.push(format!(
            "ours: medians of {} runs before and as many after PyTorch's, each after one warm-up; PyTorch: {0} runs, torch.set_num_threads({n}), float32, no_grad",
            self.runs.max(1)
        ));
        self.hifigan(&dev, &mut rep, n)?;
        if !self.no_token2wav {
            self.token2wav(&dev, &mut rep, n)?;
        }
        if Peer::Omni.find().is_none() {
            rep.peer_missing("PyTorch", Peer::Omni.missing());
        }
        rep.notes
            .push("ratio = our time / PyTorch's (below 1: ours faster)".into());
        Ok(rep)
    }
}
