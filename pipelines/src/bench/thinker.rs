//! `edgeflow bench thinker`: prefill and decode tokens/s of the thinker's
//! LLM, and the weight bandwidth decode achieves (bytes of weights read per
//! token / time per token) against the host's read-bandwidth ceiling probed
//! in the same run, next to llama.cpp's `llama-bench` on the same
//! GGUF with the same thread count, prompt and decode lengths (the llama.cpp
//! peer build of `scripts/peer_envs.sh llama.cpp`).
//!
//! The prompt is a chat turn asking to continue a long text, cut to
//! `--prompt-tokens`; decode runs greedily for `--decode-tokens` without
//! stopping at end-of-turn tokens, so every run does the same work.
//!
//! Our runs and llama-bench's alternate (one llama-bench repetition after
//! each of our runs), and each ratio is the median of the per-round
//! ratios: on a shared machine whose speed drifts over a minute, two
//! blocks of runs one after the other would compare different machines.
//! Both sides warm up first: llama-bench runs an untimed prompt and decode
//! before it measures, and so do we (one untimed prefill and a few decoded
//! tokens), so neither side's first-touch costs land in a round.

use super::{median, pool_threads, Bench, BenchReport, Peer, Row};
use anyhow::Context as _;
use edgeflow_llm::{sampling, ChatMessage};
use edgeflow_runtime::DeviceSpec;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Options of `edgeflow bench thinker`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ThinkerArgs {
    /// A language model card (smollm2, qwen2.5-0.5b, qwen2.5-1.5b) or a
    /// GGUF file (default: the cached SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    pub model: Option<String>,
    /// Placement of our side: cpu, gpu:N, npu:N or auto.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens decoded for the decode measurement.
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// Rounds: each of our runs is followed by one llama-bench repetition;
    /// medians are reported, the ratios as the median of the rounds'.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Expand quantized weights to f32 at load.
    #[arg(long)]
    pub dequantize: bool,
    /// After the timed runs, time every op of one more prefill and decode
    /// and print the N costliest (op, input shapes) rows of each (0: off).
    #[arg(long, default_value_t = 0)]
    pub profile_ops: usize,
}

impl Default for ThinkerArgs {
    fn default() -> Self {
        ThinkerArgs {
            model: None,
            device: "cpu".into(),
            prompt_tokens: 128,
            decode_tokens: 64,
            runs: 3,
            dequantize: false,
            profile_ops: 0,
        }
    }
}

/// Our side's figures.
struct Ours {
    prefill_tps: f64,
    decode_tps: f64,
    /// The peer's (prefill, decode) tokens/s of each round, where it ran.
    peer: Vec<(f64, f64)>,
    /// Each round's ratios ours / peer (prefill, decode).
    ratios: Vec<(f64, f64)>,
    prompt_len: usize,
    weight_gbs: f64,
    /// Decode's weight bandwidth in each round, GB/s.
    round_gbs: Vec<f64>,
    /// The host's read-bandwidth ceiling probed after the runs, GB/s.
    ceiling_gbs: f64,
    mb_per_token: f64,
    load_s: f64,
    /// Resident MB added by loading, the peak after the runs, the file's MB.
    resident: Option<(f64, f64, f64)>,
    summary: String,
    profile: String,
}

/// Our figures; `peer` (given the prompt length) runs once after each of
/// our runs and returns its (prefill, decode) tokens/s.
fn measure(
    o: &ThinkerArgs,
    path: &Path,
    spec: DeviceSpec,
    mut peer: Option<&mut dyn FnMut(usize) -> anyhow::Result<(f64, f64)>>,
) -> anyhow::Result<Ours> {
    let dev = edgeflow_backends::open(spec)?;
    let rss0 = super::resident_mb();
    let t = Instant::now();
    let gguf = edgeflow_runtime::weights::GgufFile::open(path)?;
    let cfg = edgeflow_llm::Config {
        dequantize: o.dequantize,
        ..edgeflow_llm::Config::from_gguf(&gguf)?
    };
    let (mut model, tok) = edgeflow_llm::load_gguf(gguf, &cfg, &dev)?;
    let load_s = t.elapsed().as_secs_f64();
    let rss_loaded = super::resident_mb();
    // The CPU backend moves the weights onto 2 MB pages on a background
    // thread after loading (a one-off copy).
    let pages = super::settle_huge_pages();
    let filler = "The history of the printing press begins in the fifteenth century, when \
                  movable type changed how books were made, sold and read across Europe. ";
    let text = tok.render_chat(
        &[ChatMessage::new(
            "user",
            &filler.repeat(o.prompt_tokens / 10 + 2),
        )],
        true,
    )?;
    let mut ids = tok.encode(&text)?;
    ids.truncate(o.prompt_tokens);

    // Untimed warm-up, as llama-bench does its own: the KV cache, scratch
    // buffers and first touches of the weights happen here.
    model.reset();
    let mut logits = model.forward(&ids)?;
    for _ in 0..o.decode_tokens.min(4) {
        let id = sampling::argmax(&logits) as u32;
        logits = model.forward(&[id])?;
    }

    let (mut pre, mut dec, mut peer_runs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.runs {
        model.reset();
        let t = Instant::now();
        let mut logits = model.forward(&ids)?;
        pre.push(ids.len() as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for _ in 0..o.decode_tokens {
            let id = sampling::argmax(&logits) as u32;
            logits = model.forward(&[id])?;
        }
        dec.push(o.decode_tokens as f64 / t.elapsed().as_secs_f64());
        let (p, d) = (pre[pre.len() - 1], dec[dec.len() - 1]);
        if let Some(peer) = peer.as_mut() {
            let (pp, pd) = peer(ids.len())?;
            eprintln!(
                "  round {}: prefill {p:.1} vs {pp:.1} tokens/s ({:.2}x), decode {d:.1} vs {pd:.1} ({:.2}x)",
                pre.len(),
                p / pp,
                d / pd
            );
            peer_runs.push((pp, pd));
        } else {
            eprintln!(
                "  run {}: prefill {p:.1} tokens/s, decode {d:.1}",
                pre.len()
            );
        }
    }
    let ratios = peer_runs
        .iter()
        .zip(pre.iter().zip(&dec))
        .map(|(p, (pre, dec))| (pre / p.0, dec / p.1))
        .collect();
    let profile = if o.profile_ops > 0 {
        // One more prefill and decode with every op timed (the timing
        // itself costs a little, so the timed runs above go without it).
        model.reset();
        dev.stats().profile_ops(true);
        let mut logits = model.forward(&ids)?;
        let prefill_rows = dev.stats().op_profile();
        dev.stats().profile_ops(true);
        for _ in 0..o.decode_tokens {
            let id = sampling::argmax(&logits) as u32;
            logits = model.forward(&[id])?;
        }
        let rows = dev.stats().op_profile();
        dev.stats().profile_ops(false);
        format!(
            "prefill of {} tokens, {}\ndecode of {} tokens, {}",
            ids.len(),
            edgeflow_runtime::render_op_profile(&prefill_rows, o.profile_ops),
            o.decode_tokens,
            edgeflow_runtime::render_op_profile(&rows, o.profile_ops)
        )
    } else {
        String::new()
    };
    let file_mb = std::fs::metadata(path).map_or(f64::NAN, |m| m.len() as f64 / (1 << 20) as f64);
    let resident = match (rss0, rss_loaded, super::resident_mb()) {
        (Some((r0, _)), Some((r1, _)), Some((_, peak))) => Some((r1 - r0, peak, file_mb)),
        _ => None,
    };
    // The ceiling decode's bandwidth reads against, measured here (after
    // the resident figures, so its buffer is not counted in them): a
    // multi-threaded f32 sum over 256 MB on huge pages, as `bench ops`
    // probes it, best of two full probes.
    let probe = edgeflow_backends::bandwidth::BandwidthProbe::new(256, pool_threads());
    let ceiling_gbs = probe.probe().max(probe.probe());
    drop(probe);
    let bytes = model.weight_bytes_per_token() as f64;
    let round_gbs = dec.iter().map(|d| bytes * d / 1e9).collect();
    let (pre, dec) = (median(pre), median(dec));
    let c = model.config();
    Ok(Ours {
        prefill_tps: pre,
        decode_tps: dec,
        peer: peer_runs,
        ratios,
        prompt_len: ids.len(),
        weight_gbs: bytes * dec / 1e9,
        round_gbs,
        ceiling_gbs,
        mb_per_token: bytes / 1e6,
        load_s,
        resident,
        summary: format!(
            "model: {} layers, d={}, {} heads / {} KV heads, vocab {}; {:.1} MB of weights, loaded in {:.2} s, {pages}",
            c.n_layer,
            c.d_model,
            c.n_head,
            c.n_kv_head,
            c.vocab,
            model.weight_bytes() as f64 / 1e6,
            load_s,
        ),
        profile,
    })
}

/// llama.cpp's `llama-bench` on one GGUF, one repetition per call.
struct LlamaBench<'a> {
    bin: &'a Path,
    gguf: &'a Path,
    threads: usize,
    decode_tokens: usize,
    /// `--repack 0` (set once a repacking run has failed).
    no_repack: bool,
}

impl LlamaBench<'_> {
    /// One repetition with a prompt of `prompt_len` tokens: (prefill
    /// tokens/s, decode tokens/s).
    fn once(&mut self, prompt_len: usize) -> anyhow::Result<(f64, f64)> {
        // Our pool's spinning threads go to sleep first.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let run = |no_repack: bool| {
            let mut c = Command::new(self.bin);
            c.arg("-m")
                .arg(self.gguf)
                .args(["-t", &self.threads.to_string()])
                .args(["-p", &prompt_len.to_string()])
                .args(["-n", &self.decode_tokens.to_string()])
                .args(["-r", "1", "-o", "json"]);
            if no_repack {
                c.args(["--repack", "0"]);
            }
            c.output()
                .with_context(|| format!("running {}", self.bin.display()))
        };
        let mut out = run(self.no_repack)?;
        if !out.status.success() && !self.no_repack {
            // On CPUs with AMX (Sapphire Rapids VMs) the repacked AMX matmul
            // of this llama.cpp build crashes (SIGSEGV in
            // ggml_backend_amx_mul_mat); the plain CPU kernels (still
            // -march=native: AVX-512 / VNNI) run.
            self.no_repack = true;
            out = run(true)?;
        }
        if !out.status.success() {
            anyhow::bail!(
                "{} failed: {}",
                self.bin.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("llama-bench printed no JSON")?;
        let tests = v.as_array().context("llama-bench JSON is not a list")?;
        let rate = |prompt: bool| {
            tests
                .iter()
                .find(|t| {
                    let p = t["n_prompt"].as_u64().unwrap_or(0);
                    let g = t["n_gen"].as_u64().unwrap_or(0);
                    if prompt {
                        p > 0 && g == 0
                    } else {
                        g > 0 && p == 0
                    }
                })
                .and_then(|t| t["avg_ts"].as_f64())
                .context("no pp / tg result in llama-bench's JSON")
        };
        Ok((rate(true)?, rate(false)?))
    }

    /// How it ran, for the report.
    fn note(&self, runs: usize) -> String {
        let mut note = format!(
            "llama-bench, {} threads, median of {runs} reps, each after one of ours",
            self.threads
        );
        if self.no_repack {
            note.push_str("; --repack 0 (the repacking run failed)");
        }
        note
    }
}

impl Bench for ThinkerArgs {
    fn name(&self) -> &'static str {
        "thinker"
    }

    fn compares(&self) -> &'static str {
        "the thinker's LLM (SmolLM2-135M Q4_1 by default; --model qwen2.5-0.5b...) prefill and \
         decode vs llama.cpp on the same GGUF and threads"
    }

    fn args(&self) -> Vec<String> {
        let d = ThinkerArgs::default();
        let mut a = Vec::new();
        if let Some(m) = &self.model {
            a.extend(["--model".into(), m.clone()]);
        }
        if self.device != d.device {
            a.extend(["--device".into(), self.device.clone()]);
        }
        let mut num = |flag: &str, v: usize, def: usize| {
            if v != def {
                a.extend([flag.to_string(), v.to_string()]);
            }
        };
        num("--prompt-tokens", self.prompt_tokens, d.prompt_tokens);
        num("--decode-tokens", self.decode_tokens, d.decode_tokens);
        num("--runs", self.runs, d.runs);
        num("--profile-ops", self.profile_ops, d.profile_ops);
        if self.dequantize {
            a.push("--dequantize".into());
        }
        a
    }

    fn run(&self) -> anyhow::Result<BenchReport> {
        if self.prompt_tokens == 0 || self.decode_tokens == 0 || self.runs == 0 {
            anyhow::bail!("--prompt-tokens, --decode-tokens and --runs must be at least 1");
        }
        let spec: DeviceSpec = self.device.parse()?;
        let path = match &self.model {
            Some(m) if edgeflow_llm::cards::card(m).is_some() => edgeflow_llm::cards::gguf_path(m)?,
            Some(p) => PathBuf::from(p),
            None => edgeflow_llm::SMOLLM2.path(edgeflow_llm::cards::GGUF_FILE)?,
        };
        let threads = pool_threads();
        let bin = Peer::LlamaCpp.find();
        let mut llama = bin.as_deref().map(|bin| LlamaBench {
            bin,
            gguf: &path,
            threads,
            decode_tokens: self.decode_tokens,
            no_repack: false,
        });
        eprintln!(
            "measuring {} prefill and decode{}...",
            self.model.as_deref().unwrap_or("smollm2"),
            if llama.is_some() {
                ", alternating with llama.cpp's llama-bench on the same GGUF"
            } else {
                ""
            }
        );
        let mut peer = llama
            .as_mut()
            .map(|l| move |prompt_len: usize| l.once(prompt_len));
        let ours = measure(
            self,
            &path,
            spec,
            peer.as_mut()
                .map(|p| p as &mut dyn FnMut(usize) -> anyhow::Result<(f64, f64)>),
        )?;
        let mut r = BenchReport::new(
            format!(
                "edgeflow bench thinker: {} on {spec}{}",
                path.display(),
                if self.dequantize {
                    " (weights dequantized to f32)"
                } else {
                    ""
                }
            ),
            "llama.cpp",
            "ours / llama.cpp",
        );
        r.context.push(ours.summary.clone());
        r.context.push(format!(
            "{} prompt tokens, {} decoded after the prompt, median of {} runs, {threads} threads",
            ours.prompt_len, self.decode_tokens, self.runs
        ));
        let prefill = Row::new("prefill", ours.prefill_tps, "tokens/s");
        let decode = Row::new("decode", ours.decode_tps, "tokens/s")
            .note(format!("{:.2} ms/token", 1e3 / ours.decode_tps));
        let (lo, hi) = ours
            .round_gbs
            .iter()
            .fold((f64::INFINITY, 0f64), |(lo, hi), &g| (lo.min(g), hi.max(g)));
        let bandwidth = Row::new("decode weight bandwidth", ours.weight_gbs, "GB/s").note(format!(
            "{:.1} MB read per token; {:.0} % of the {:.1} GB/s read ceiling probed after the \
             runs (rounds {:.0}-{:.0} %)",
            ours.mb_per_token,
            100.0 * ours.weight_gbs / ours.ceiling_gbs,
            ours.ceiling_gbs,
            100.0 * lo / ours.ceiling_gbs,
            100.0 * hi / ours.ceiling_gbs,
        ));
        match &llama {
            Some(l) if !ours.ratios.is_empty() => {
                let pick = |v: &[(f64, f64)], prefill: bool| -> Vec<f64> {
                    v.iter().map(|p| if prefill { p.0 } else { p.1 }).collect()
                };
                // The median of the rounds' ratios, and their spread.
                let spread = |prefill: bool| super::rounds_ratio(&pick(&ours.ratios, prefill));
                let ((rp, sp), (rd, sd)) = (spread(true), spread(false));
                r.rows.push(
                    prefill
                        .baseline(median(pick(&ours.peer, true)))
                        .ratio(rp)
                        .note(format!("{}; {sp}", l.note(self.runs))),
                );
                r.rows.push(
                    decode
                        .baseline(median(pick(&ours.peer, false)))
                        .ratio(rd)
                        .note(format!("{:.2} ms/token; {sd}", 1e3 / ours.decode_tps)),
                );
                r.rows.push(bandwidth);
            }
            _ => {
                r.rows.extend([prefill, decode, bandwidth]);
                r.peer_missing("prefill / decode vs llama.cpp", Peer::LlamaCpp.missing());
            }
        }
        r.rows.push(
            Row::new("load", ours.load_s, "s")
                .note("open the GGUF, read the tokenizer, place every weight on the device"),
        );
        if let Some((added, peak, file_mb)) = ours.resident {
            r.rows.push(
                Row::new("resident memory added by loading", added, "MiB").note(format!(
                    "{:.2}x the {file_mb:.0} MiB file; process peak after the runs {peak:.0} MiB",
                    added / file_mb
                )),
            );
        }
        r.notes.push(
            "ratio = our tokens/s / llama.cpp's (above 1: ours faster), the median of the \
             per-round ratios"
                .into(),
        );
        if !ours.profile.is_empty() {
            r.notes.push(ours.profile);
        }
        Ok(r)
    }
}
