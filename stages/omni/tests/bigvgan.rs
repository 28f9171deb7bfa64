//! Qwen2.5-Omni's BigVGAN against transformers'
//! `Qwen2_5OmniToken2WavBigVGANModel` on a small random configuration
//! (fixture from scripts/omni_bigvgan_reference.py), chunked vocoding
//! against one-shot vocoding, the computed receptive field against the
//! measured one, and bad inputs.

use edgeflow_nn::VarBuilder;
use edgeflow_omni::bigvgan::{
    kaiser_sinc_filter, receptive_field, receptive_radius, weight_shapes, BigVgan, Config,
    MelStream,
};
use edgeflow_runtime::weights::{write_safetensors, SafetensorsFile, WeightReader};
use edgeflow_runtime::{Device, DeviceSpec, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixture_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bigvgan.safetensors")
}

fn fixture() -> SafetensorsFile {
    SafetensorsFile::open(fixture_path()).expect("fixture")
}

fn tensor(name: &str) -> Tensor {
    fixture().load(name).expect(name)
}

fn values(name: &str) -> Vec<f32> {
    tensor(name).to_vec_f32().expect("f32")
}

/// The configuration the fixture was made with (its metadata), read with
/// the upstream key names.
fn config() -> Config {
    let f = fixture();
    let json = f
        .metadata()
        .and_then(|m| m.get("config"))
        .expect("config metadata")
        .clone();
    let cfg: Config = serde_json::from_str(&json).expect("config json");
    cfg.check().expect("valid");
    cfg
}

fn cpu() -> Device {
    edgeflow_backends::open(DeviceSpec::Cpu).expect("cpu")
}

fn model(dev: &Device) -> BigVgan {
    let vb = VarBuilder::open(&[fixture_path()], dev).expect("open");
    BigVgan::load(&vb, &config()).expect("load")
}

fn vocode(m: &BigVgan, mel: &[f32], frames: usize) -> Vec<f32> {
    let n = m.config().mel_dim;
    let t = Tensor::from_vec(mel.to_vec(), &[1, n, frames]).expect("t");
    let y = m.forward(&t).expect("forward");
    assert_eq!(y.dims(), &[frames * m.config().hop_length()]);
    m.device()
        .to_host(&y)
        .expect("host")
        .to_vec_f32()
        .expect("v")
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Vocode `mel` (`[n, frames]` channel-major) through a [`MelStream`] fed
/// `piece` frames at a time.
fn streamed(
    m: &BigVgan,
    mel: &[f32],
    frames: usize,
    piece: usize,
    chunk: usize,
    left: usize,
    right: usize,
) -> Vec<f32> {
    let n = m.config().mel_dim;
    let mut s = MelStream::new(n, chunk, left, right).expect("stream");
    let mut joined = Vec::new();
    let mut sink = |c: Vec<f32>| {
        joined.extend(c);
        Ok(true)
    };
    for a in (0..frames).step_by(piece) {
        let k = piece.min(frames - a);
        let p: Vec<f32> = (0..n)
            .flat_map(|c| mel[c * frames + a..c * frames + a + k].to_vec())
            .collect();
        let t = Tensor::from_vec(p, &[n, k]).expect("t");
        s.push(m, &t, &mut sink).expect("push");
    }
    s.finish(m, &mut sink).expect("finish");
    assert_eq!(s.vocoded(), 0, "finish starts over");
    joined
}

#[test]
fn kaiser_sinc_filter_matches_torch() {
    let got = kaiser_sinc_filter(0.25, 0.3, 12);
    for name in ["ref.filter_up", "ref.filter_down"] {
        let want = values(name);
        let d = max_abs(&got, &want);
        eprintln!("{name}: max |diff| {d:e}");
        // Taps of ~0.3 at most; torch builds the window and sinc in f32, we
        // in f64 and round once: a few f32 ulps at most.
        assert!(d < 1e-6, "{name} max |diff| {d}");
    }
    let sum: f32 = got.iter().sum();
    assert!(
        (sum - 1.0).abs() < 1e-6,
        "a low-pass of unit DC gain: {sum}"
    );
}

#[test]
fn matches_transformers() {
    let dev = cpu();
    let m = model(&dev);
    let mel = tensor("inputs.mel");
    let frames = mel.dims()[2];
    let want = values("outputs.audio");
    let t0 = std::time::Instant::now();
    let got = vocode(&m, &mel.to_vec_f32().expect("v"), frames);
    let d = max_abs(&got, &want);
    let clamped = want.iter().filter(|x| x.abs() >= 1.0).count();
    eprintln!(
        "audio: {} samples, max |diff| {d:e} ({clamped} at the clamp), {:?}",
        got.len(),
        t0.elapsed()
    );
    // f32 through conv_pre, 2 stages x 2 AMP blocks x 3 units (12
    // convolutions and 24 anti-aliased activations, each a 2x polyphase
    // upsampling, sin^2 and a 2x downsampling) and conv_post, on a signal
    // of std ~0.34: our summation orders (polyphase instead of a
    // transposed depthwise convolution, fused residual adds) and the
    // process_mel affine (instead of exp / log10) differ from torch's by
    // rounding, ~1e-6. 2e-5 leaves margin and is ~-94 dB of full scale.
    assert!(d < 2e-5, "audio max |diff| {d}");
}

#[test]
fn filters_in_the_checkpoint_are_read() {
    let dev = cpu();
    let f = fixture();
    let mut tensors: BTreeMap<String, Tensor> = BTreeMap::new();
    for (name, _) in weight_shapes(&config()) {
        let t = f.load(&name).expect(&name);
        tensors.insert(name, t);
    }
    // The original BigVGAN saves its filters: put torch's beside each activation.
    let up = tensor("ref.filter_up");
    let down = tensor("ref.filter_down");
    let acts: Vec<String> = tensors
        .keys()
        .filter_map(|k| k.strip_suffix(".act.alpha").map(str::to_string))
        .collect();
    for a in &acts {
        tensors.insert(format!("{a}.upsample.filter"), up.clone());
        tensors.insert(format!("{a}.downsample.filter"), down.clone());
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join("bigvgan_with_filters.safetensors");
    write_safetensors(&path, &tensors, None).expect("write");
    let vb = VarBuilder::open(&[&path], &dev).expect("open");
    let m = BigVgan::load(&vb, &config()).expect("load");
    let mel = tensor("inputs.mel");
    let got = vocode(&m, &mel.to_vec_f32().expect("v"), mel.dims()[2]);
    let d = max_abs(&got, &values("outputs.audio"));
    // Same filters up to f32 rounding (see kaiser_sinc_filter_matches_torch).
    assert!(d < 2e-5, "with stored filters: max |diff| {d}");

    // A stored filter is read: a malformed one is an error naming it.
    let bad = format!("{}.downsample.filter", acts[0]);
    tensors.insert(
        bad.clone(),
        Tensor::from_vec(vec![0.0; 11], &[1, 1, 11]).expect("t"),
    );
    let path = dir.join("bigvgan_bad_filter.safetensors");
    write_safetensors(&path, &tensors, None).expect("write");
    let vb = VarBuilder::open(&[&path], &dev).expect("open");
    let e = BigVgan::load(&vb, &config()).expect_err("bad filter");
    assert!(e.to_string().contains(&bad), "{e}");
}

#[test]
fn weight_shapes_list_every_stored_tensor() {
    let cfg = config();
    let f = fixture();
    let shapes = weight_shapes(&cfg);
    for (name, dims) in &shapes {
        let info = f.info(name).unwrap_or_else(|| panic!("{name} not stored"));
        assert_eq!(&info.dims, dims, "{name}");
    }
    let stored = f
        .names()
        .into_iter()
        .filter(|n| {
            !n.starts_with("ref.") && !n.starts_with("inputs.") && !n.starts_with("outputs.")
        })
        .count();
    assert_eq!(shapes.len(), stored);
}

#[test]
fn chunks_with_the_receptive_field_as_context_equal_one_shot() {
    let dev = cpu();
    let m = model(&dev);
    let cfg = m.config().clone();
    let (left, right) = receptive_field(&cfg);
    // Longer than the fixture's mel so chunks have context on both sides:
    // the fixture's mel and then its time reverse.
    let mel0 = values("inputs.mel");
    let f0 = mel0.len() / cfg.mel_dim;
    let frames = 2 * f0;
    let mel: Vec<f32> = (0..cfg.mel_dim)
        .flat_map(|c| {
            let row = &mel0[c * f0..(c + 1) * f0];
            row.iter()
                .copied()
                .chain(row.iter().rev().copied())
                .collect::<Vec<_>>()
        })
        .collect();
    let one = vocode(&m, &mel, frames);
    for (piece, chunk) in [(7, 10), (1, 4), (13, 5), (frames, 3)] {
        let joined = streamed(&m, &mel, frames, piece, chunk, left, right);
        let d = max_abs(&joined, &one);
        eprintln!("pieces of {piece}, chunks of {chunk}, context {left}/{right}: max |diff| {d:e}");
        // The same arithmetic on the same receptive field; only the
        // convolutions' lengths differ, which may change blocking and so
        // summation order: float rounding only.
        assert!(d < 1e-5, "streamed max |diff| {d}");
    }
    // The symmetric radius is at least as good.
    let r = receptive_radius(&cfg);
    let d = max_abs(&streamed(&m, &mel, frames, 5, 6, r, r), &one);
    assert!(d < 1e-5, "radius {r}: max |diff| {d}");

    // Smaller contexts: the error at chunk joins, reported only (a random
    // model says little about the real one's).
    for ctx in [1usize, 2, 4, 8, 16, 24, 32] {
        if ctx >= left.min(right) {
            continue;
        }
        let d = max_abs(&streamed(&m, &mel, frames, 10, 10, ctx, ctx), &one);
        eprintln!("context {ctx}/{ctx} (receptive field {left}/{right}): max |diff| {d:e}");
    }
}

#[test]
fn receptive_field_bounds_what_one_frame_reaches() {
    let dev = cpu();
    let m = model(&dev);
    let cfg = m.config().clone();
    let (left, right) = receptive_field(&cfg);
    let hop = cfg.hop_length();
    // Mel in the unclamped range of process_mel (-10.9..2.3) and a quiet
    // model output, so that neither clamp hides a change.
    let frames = 2 * (left + right) + 9;
    let n = cfg.mel_dim;
    let mel: Vec<f32> = (0..n * frames)
        .map(|i| -6.0 + 3.0 * ((i as f32 * 0.731).sin()))
        .collect();
    let base = vocode(&m, &mel, frames);
    let k = frames / 2;
    let mut bumped = mel.clone();
    for c in 0..n {
        bumped[c * frames + k] += 0.5;
    }
    let out = vocode(&m, &bumped, frames);
    let changed: Vec<usize> = (0..frames)
        .filter(|&f| (f * hop..(f + 1) * hop).any(|s| out[s] != base[s] && base[s].abs() < 1.0))
        .collect();
    let (first, last) = (changed[0], changed[changed.len() - 1]);
    eprintln!(
        "frame {k} reaches frames {first}..={last}; computed field {left}/{right}, \
         {} frames in between unchanged",
        (first..=last).count() - changed.len()
    );
    // Output frame f reads mel frames [f - left, f + right], so frame k
    // reaches output frames [k - right, k + left] at most. The outermost
    // paths run through the filters' smallest taps many times over, so
    // their contribution falls below f32 resolution before the structural
    // edge: the measured reach is narrower (23 frames here against 38).
    assert!(first >= k - right && last <= k + left, "{first}..={last}");
    assert!(changed.len() > 1, "a change reaches beyond its own frame");
}

#[test]
fn qwen_defaults() {
    let cfg = Config::default();
    cfg.check().expect("valid");
    assert_eq!(cfg.hop_length(), 240);
    let (l, r) = receptive_field(&cfg);
    eprintln!("Qwen2.5-Omni BigVGAN receptive field: {l} frames left, {r} right");
    assert_eq!(receptive_radius(&cfg), l.max(r));
    // Upstream's config.json keys; absent keys take the defaults.
    let cfg: Config = serde_json::from_str(
        r#"{"mel_dim": 80, "upsample_rates": [5, 3, 2, 2, 2, 2], "model_type": "qwen2_5_omni_bigvgan"}"#,
    )
    .expect("json");
    assert_eq!(cfg, Config::default());
    let shapes = weight_shapes(&cfg);
    assert!(shapes.contains(&("conv_pre.weight".into(), vec![1536, 80, 7])));
    assert!(shapes.contains(&("ups.5.0.weight".into(), vec![48, 24, 4])));
    assert!(shapes.contains(&("conv_post.weight".into(), vec![1, 24, 7])));
}

#[test]
fn bad_inputs_are_errors() {
    let dev = cpu();
    let m = model(&dev);
    let n = m.config().mel_dim;
    for dims in [vec![1, n + 1, 5], vec![n, 5], vec![1, n, 0], vec![1, 5, n]] {
        let t = Tensor::zeros(&dims).expect("t");
        let e = m.forward(&t).expect_err("bad mel");
        assert!(
            e.to_string().contains(&format!("[batch, {n}, frames]")),
            "{dims:?}: {e}"
        );
    }
    let mut cfg = config();
    cfg.resblock_dilation_sizes[1] = vec![1, 3];
    let e = cfg.check().expect_err("two dilations");
    assert!(e.contains("exactly 3 dilations"), "{e}");
    let vb = VarBuilder::open(&[fixture_path()], &dev).expect("open");
    assert!(BigVgan::load(&vb, &cfg).is_err());
    let mut cfg = config();
    cfg.upsample_kernel_sizes[0] = 5; // stride 2: odd difference
    assert!(cfg.check().expect_err("odd").contains("ups.0"));
    let mut cfg = config();
    cfg.mel_dim = 17; // the stored conv_pre is [32, 16, 7]
    let e = BigVgan::load(&vb, &cfg).expect_err("shape");
    assert!(e.to_string().contains("conv_pre.weight"), "{e}");

    let mut s = MelStream::new(n, 4, 2, 2).expect("stream");
    let bad = Tensor::zeros(&[n + 1, 3]).expect("t");
    let e = s.push(&m, &bad, &mut |_| Ok(true)).expect_err("shape");
    assert!(e.to_string().contains(&format!("[{n}, frames]")), "{e}");
    assert!(MelStream::new(n, 0, 2, 2).is_err());
}

/// Qwen2.5-Omni's configuration on seeded random weights: shapes and
/// timing only (a few seconds on two cores; `--ignored` to run).
#[test]
#[ignore]
fn qwen_configuration_runs() {
    let dev = cpu();
    let cfg = Config::default();
    let w = edgeflow_runtime::weights::RandomWeights::new("random:bigvgan", weight_shapes(&cfg), 1)
        .expect("random");
    eprintln!("{} parameters", w.elements());
    let vb = VarBuilder::from_reader(w, &dev);
    let t0 = std::time::Instant::now();
    let m = BigVgan::load(&vb, &cfg).expect("load");
    eprintln!("load {:?}", t0.elapsed());
    let frames = 20;
    let mel: Vec<f32> = (0..80 * frames)
        .map(|i| -5.0 + (i as f32 * 0.37).sin())
        .collect();
    let t0 = std::time::Instant::now();
    let y = vocode(&m, &mel, frames);
    eprintln!(
        "{frames} frames -> {} samples in {:?}",
        y.len(),
        t0.elapsed()
    );
    assert_eq!(y.len(), frames * 240);
    assert!(y.iter().all(|x| x.is_finite() && x.abs() <= 1.0));
}
