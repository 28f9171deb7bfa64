//! Where the speech-in models' time goes on this machine.
//!
//! `vad`: Silero VAD's time per 512-sample window over the fixture clip
//! (and, for `perf record`, nothing else).
//!
//! `asr` (default): Whisper tiny.en's front end /
//! encoder / decoder split per utterance of the fixture clip, and the cost
//! of each op class at the encoder's shapes (1500 frames, width 384), run
//! through the same [`Device`] calls the model makes.
//!
//!     cargo run -p edgeflow-speech --example speech_profile [-- vad|asr]
//!
//! `ASR_PROFILE_DECODE_ONLY=1` stops after the decoder section, looping
//! decoder steps (for `perf record`).
//!
//! Times are medians of 5 runs after a warm-up; the machine is shared, so
//! compare ratios within one run.

use edgeflow_runtime::{ConvCfg, Device, DeviceSpec, Tensor, UnaryOp};
use edgeflow_speech::cards::{SILERO_VAD, SILERO_WEIGHTS, WHISPER_TINY_EN};
use edgeflow_speech::silero::{SileroVad, WINDOW};
use edgeflow_speech::whisper::Transcriber;
use std::time::Instant;

fn median_ms(mut f: impl FnMut()) -> f64 {
    f();
    let mut v: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[2]
}

fn rand(dev: &Device, dims: &[usize], seed: u64) -> Tensor {
    dev.rand_normal(dims, 0.0, 0.5, seed).expect("rand")
}

fn main() -> anyhow::Result<()> {
    // As the CLI does.
    edgeflow_backends::keep_freed_memory();
    let dev = edgeflow_backends::open(DeviceSpec::Cpu)?;
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let (_, clip) = edgeflow_audio::wav::read_wav(&repo.join("tests/fixtures/speech_mix.wav"))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if std::env::args().nth(1).as_deref() == Some("vad") {
        let vb = edgeflow_speech::VarBuilder::open(&[SILERO_VAD.path(SILERO_WEIGHTS)?], &dev)?;
        let mut vad = SileroVad::load(&vb, &Default::default())?;
        for _ in 0..5 {
            vad.reset()?;
            let t = Instant::now();
            let mut n = 0;
            for w in clip.chunks_exact(WINDOW) {
                vad.step(w)?;
                n += 1;
            }
            println!(
                "VAD: {n} windows, {:.0} us per window",
                t.elapsed().as_secs_f64() * 1e6 / n as f64
            );
        }
        return Ok(());
    }
    let mut tr = Transcriber::load(&WHISPER_TINY_EN.locate()?, &dev)?;
    // The bench's VAD segments of the fixture clip.
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        repo.join("tests/fixtures/reference.json"),
    )?)?;
    let segs: Vec<[usize; 2]> = serde_json::from_value(reference["vad"]["segments"].clone())?;
    let decode_only = std::env::var_os("ASR_PROFILE_DECODE_ONLY").is_some();
    // Runs per utterance (after a warm-up); on a shared machine the minimum
    // is the steadier number.
    let runs: usize = std::env::var("ASR_PROFILE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1);
    println!("per utterance ({runs} runs): total / mel / encode / decode ms (median; min), tokens");
    for [a, b] in segs.into_iter().filter(|_| !decode_only) {
        let mut parts = Vec::new();
        for _ in 0..=runs {
            let t0 = Instant::now();
            let t = tr.transcribe(&clip[a..b], &mut || false)?;
            parts.push((
                t0.elapsed().as_secs_f64() * 1e3,
                t.mel_s * 1e3,
                t.encode_s * 1e3,
                t.decode_s * 1e3,
                t.tokens.len(),
            ));
        }
        parts.remove(0);
        parts.sort_by(|x, y| x.0.total_cmp(&y.0));
        let (tot, mel, enc, dec, n) = parts[parts.len() / 2];
        let min = |f: fn(&(f64, f64, f64, f64, usize)) -> f64| {
            parts.iter().map(f).fold(f64::INFINITY, f64::min)
        };
        println!(
            "  {:.2} s: {tot:.0} / {mel:.1} / {enc:.0} / {dec:.0} (min {:.0} / {:.0} / {:.0}), {n} tokens",
            (b - a) as f64 / 16_000.0,
            min(|p| p.0),
            min(|p| p.2),
            min(|p| p.3),
        );
    }

    // Decoder: cross-attention keys/values, the 3-token prompt, one step.
    let model = tr.model();
    let n_mels = model.config().n_mels;
    let enc = model.encode(&vec![0.1f32; n_mels * 3000])?;
    println!("decoder (median ms)");
    let start_ms = median_ms(|| {
        model.start(&enc).expect("start");
    });
    println!("  start (cross K/V of 4 layers)     {start_ms:7.2} ms");
    let sp = tr.tokenizer().special();
    let prompt_ms = median_ms(|| {
        let mut st = model.start(&enc).expect("start");
        model
            .decode(&mut st, &[sp.sot, sp.no_timestamps], &[1])
            .expect("prompt");
    }) - start_ms;
    println!("  prompt (2 tokens)                 {prompt_ms:7.2} ms");
    let mut st = model.start(&enc)?;
    model.decode(&mut st, &[sp.sot, sp.no_timestamps], &[1])?;
    if decode_only {
        // For `perf record`: nothing but decoder steps from here on.
        for _ in 0..10 {
            let mut st = model.start(&enc)?;
            model.decode(&mut st, &[sp.sot, sp.no_timestamps], &[1])?;
            let t = Instant::now();
            for _ in 0..40 {
                model.decode(&mut st, &[440], &[0])?;
            }
            println!(
                "  40 steps: {:.1} ms/step",
                t.elapsed().as_secs_f64() * 25.0
            );
        }
        return Ok(());
    }
    let step_ms = median_ms(|| {
        model.decode(&mut st, &[440], &[0]).expect("step");
    });
    println!("  one step (after ~5 tokens)        {step_ms:7.2} ms");

    let (s, d, f) = (1500, 384, 1536);
    let x = rand(&dev, &[1, s, d], 1);
    let w = rand(&dev, &[d, d], 2);
    let b = rand(&dev, &[d], 3);
    let w1 = rand(&dev, &[f, d], 4);
    let b1 = rand(&dev, &[f], 5);
    let w2 = rand(&dev, &[d, f], 6);
    let h = rand(&dev, &[1, s, f], 7);
    let q = dev.permute(&dev.reshape(&x, &[1, s, 6, 64])?, &[0, 2, 1, 3])?;
    let mel = rand(&dev, &[1, 80, 3000], 8);
    let c1 = rand(&dev, &[d, 80, 3], 9);
    let c2 = rand(&dev, &[d, d, 3], 10);
    let xc = rand(&dev, &[1, d, 3000], 11);
    let pad1 = ConvCfg {
        padding: 1,
        ..Default::default()
    };
    println!("encoder op classes at 1500 x 384 (median ms per call; calls per encode)");
    let row = |name: &str, calls: usize, f: &mut dyn FnMut()| {
        let ms = median_ms(f);
        println!(
            "  {name:<34} {ms:7.2} ms x {calls:2} = {:7.1} ms",
            ms * calls as f64
        );
    };
    row("conv1 80->384 k3", 1, &mut || {
        dev.conv1d(&mel, &c1, Some(&b), pad1).expect("conv1");
    });
    row("conv2 384->384 k3 s2", 1, &mut || {
        dev.conv1d(&xc, &c2, Some(&b), ConvCfg { stride: 2, ..pad1 })
            .expect("conv2");
    });
    row("linear 384->384 (q,k,v,out)", 16, &mut || {
        dev.linear(&x, &w, Some(&b)).expect("linear");
    });
    row("linear 384->1536 (fc1)", 4, &mut || {
        dev.linear(&x, &w1, Some(&b1)).expect("fc1");
    });
    row("linear 1536->384 (fc2)", 4, &mut || {
        dev.linear(&h, &w2, Some(&b)).expect("fc2");
    });
    row("attention 6 x 1500 x 1500 (whole)", 4, &mut || {
        dev.attention(&q, &q, &q, None, 0.125, false)
            .expect("attention");
    });
    row("gelu_erf 1500 x 1536", 4, &mut || {
        dev.unary(UnaryOp::GeluErf, &h).expect("gelu");
    });
    row("layer_norm 1500 x 384", 9, &mut || {
        dev.layer_norm(&x, &b, Some(&b), 1e-5).expect("ln");
    });
    row("add 1500 x 384", 8, &mut || {
        dev.add(&x, &x).expect("add");
    });
    row("heads/merge copy 1500 x 384", 4, &mut || {
        let m = dev.permute(&q, &[0, 2, 1, 3]).expect("permute");
        dev.reshape(&m, &[1, s, d]).expect("merge");
    });
    Ok(())
}
