//! Qwen2.5-Omni's token2wav DiT and its ECAPA speaker encoder against
//! transformers 4.57.1 on a small random configuration (fixture from
//! scripts/omni_dit_reference.py: weights, inputs, reference outputs; the
//! configuration is in the file's metadata).

use edgeflow_nn::{OdeMethod, VarBuilder, WeightFormat};
use edgeflow_omni::dit::{self, Config, Dit, SampleOptions};
use edgeflow_omni::Error;
use edgeflow_runtime::weights::{SafetensorsFile, WeightReader};
use edgeflow_runtime::{Device, DeviceSpec, Tensor};
use std::path::PathBuf;

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dit.safetensors")
}

fn cpu() -> Device {
    edgeflow_backends::open(DeviceSpec::Cpu).expect("cpu")
}

struct Fixture {
    file: SafetensorsFile,
    cfg: Config,
    dev: Device,
    dit: Dit,
}

fn fixture() -> Fixture {
    let file = SafetensorsFile::open(path()).expect("fixture");
    let json = file
        .metadata()
        .and_then(|m| m.get("config"))
        .expect("config metadata")
        .clone();
    let cfg = Config::from_json(&json).expect("config");
    let dev = cpu();
    let vb = VarBuilder::open(&[path()], &dev).expect("vb");
    let dit = Dit::load(&vb, &cfg).expect("load");
    Fixture {
        file,
        cfg,
        dev,
        dit,
    }
}

impl Fixture {
    fn t(&self, name: &str) -> Tensor {
        self.file.load(name).expect(name)
    }
    fn v(&self, name: &str) -> Vec<f32> {
        self.t(name).to_vec_f32().expect("f32")
    }
    fn codes(&self) -> Vec<u32> {
        self.v("in.codes").iter().map(|&c| c as u32).collect()
    }
    fn host(&self, t: &Tensor) -> Vec<f32> {
        self.dev
            .to_host(t)
            .expect("host")
            .to_vec_f32()
            .expect("f32")
    }
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn peak(a: &[f32]) -> f32 {
    a.iter().fold(0f32, |m, x| m.max(x.abs()))
}

#[test]
fn weight_shapes_list_every_fixture_tensor() {
    let f = fixture();
    let shapes = dit::weight_shapes(&f.cfg);
    let names: Vec<String> = f
        .file
        .names()
        .into_iter()
        // The rotary buffer is recomputed, not read.
        .filter(|n| !n.starts_with("in.") && !n.starts_with("out.") && n != "rotary_embed.inv_freq")
        .collect();
    assert_eq!(shapes.len(), names.len(), "tensor count");
    for (name, dims) in &shapes {
        let t = f.file.load(name).expect(name);
        assert_eq!(t.dims(), dims.as_slice(), "{name}");
    }
}

#[test]
fn speaker_encoder_matches_transformers() {
    let f = fixture();
    let spk = f
        .dit
        .speaker(&f.t("in.cond"), &f.t("in.ref_mel"))
        .expect("speaker");
    let got = f.host(&spk.encoded);
    let want = f.v("out.ecapa");
    let d = max_abs(&got, &want);
    let dz = max_abs(&f.host(&spk.encoded_null), &f.v("out.ecapa_zero"));
    eprintln!(
        "ecapa: max |diff| {d:e} (peak {}), zero input {dz:e}",
        peak(&want)
    );
    // f32 through 4 convolution layers, two softmax-weighted statistics
    // and a sqrt on O(1) values: ~1e-7 is seen (a few ulps); 1e-5 leaves
    // room for other summation orders and still fails on any real slip.
    assert!(d < 1e-5, "ecapa max |diff| {d}");
    assert!(dz < 1e-5, "ecapa(zeros) max |diff| {dz}");
}

#[test]
fn velocity_with_and_without_guidance_matches_transformers() {
    let f = fixture();
    let spk = f
        .dit
        .speaker(&f.t("in.cond"), &f.t("in.ref_mel"))
        .expect("speaker");
    let codes = f.codes();
    let x = f.t("in.x");
    let t = f.v("in.t")[0];
    // Guided batch: row 0 conditioned, row 1 dropped.
    let c = f.dit.prepare(&spk, &codes, true).expect("prepare");
    let raw = f.host(&f.dit.model_output(&c, &x, t).expect("model"));
    let want = f.v("out.velocity_cfg");
    let d = max_abs(&raw, &want);
    // The guided velocity, from the reference's two rows.
    let n = want.len() / 2;
    let g = 0.5f32;
    let want_guided: Vec<f32> = (0..n)
        .map(|i| want[i] + (want[i] - want[n + i]) * g)
        .collect();
    let guided = f.host(&f.dit.velocity(&c, &x, t, g).expect("velocity"));
    let dg = max_abs(&guided, &want_guided);
    // Without guidance.
    let plain = f.host(
        &f.dit
            .forward(&x, &f.t("in.ref_mel"), &f.t("in.cond"), &codes, t, 0.0)
            .expect("forward"),
    );
    let dp = max_abs(&plain, &f.v("out.velocity_plain"));
    eprintln!(
        "velocity: cfg batch max |diff| {d:e} (peak {}), guided {dg:e}, plain {dp:e}",
        peak(&want)
    );
    // 4 layers of f32 attention / MLP at width 32 after time features
    // with arguments up to 300 rad (an f32 ulp there is ~3e-5, computed in
    // f32 as upstream does): ~5e-6 is seen on outputs up to ~3; 5e-5
    // leaves 10x. A wrong mask misses by far more (checked below).
    assert!(d < 5e-5, "cfg batch max |diff| {d}");
    assert!(dg < 5e-5, "guided max |diff| {dg}");
    assert!(dp < 5e-5, "plain max |diff| {dp}");
    // The block mask matters: one block over everything, or no look-ahead
    // layer, and the velocity is another.
    for (what, change) in [
        (
            "one block",
            Box::new(|c: &mut Config| c.block_size = 1000) as Box<dyn Fn(&mut Config)>,
        ),
        (
            "no look-ahead",
            Box::new(|c: &mut Config| c.look_ahead_layers.clear()),
        ),
    ] {
        let mut cfg = f.cfg.clone();
        change(&mut cfg);
        let vb = VarBuilder::open(&[path()], &f.dev).expect("vb");
        let other = Dit::load(&vb, &cfg).expect("load");
        let c = other.prepare(&spk, &codes, true).expect("prepare");
        let raw = f.host(&other.model_output(&c, &x, t).expect("model"));
        let dm = max_abs(&raw, &want);
        eprintln!("{what}: max |diff| {dm:e}");
        assert!(dm > 1e-2, "{what}: {dm}");
    }
}

/// The time embedding and every block's modulations are kept per time: an
/// evaluation at a time seen before (from the cache, and again after 60
/// other times pushed it out) gives the bits of the first one and of a
/// fresh model's.
#[test]
fn a_time_evaluated_again_gives_the_same_bits() {
    let f = fixture();
    let spk = f
        .dit
        .speaker(&f.t("in.cond"), &f.t("in.ref_mel"))
        .expect("speaker");
    let c = f.dit.prepare(&spk, &f.codes(), true).expect("prepare");
    let (x, t) = (f.t("in.x"), f.v("in.t")[0]);
    let bits = |d: &Dit, c| -> Vec<u32> {
        let y = d.model_output(c, &x, t).expect("model");
        f.host(&y).iter().map(|v| v.to_bits()).collect()
    };
    let first = bits(&f.dit, &c);
    assert_eq!(bits(&f.dit, &c), first, "from the cache");
    for i in 0..60 {
        f.dit
            .model_output(&c, &x, i as f32 / 60.0 + 1e-3)
            .expect("other time");
    }
    assert_eq!(bits(&f.dit, &c), first, "after the cache turned over");
    let fresh = fixture().dit;
    let c2 = fresh.prepare(&spk, &f.codes(), true).expect("prepare");
    assert_eq!(bits(&fresh, &c2), first, "a fresh model");
}

/// The linear layers' weights in bf16 ([`WeightFormat::Bf16`]): the
/// velocity of the guided batch stays near transformers' f32 one, far
/// nearer than a model with a wrong mask gets (about 1, the test above).
#[test]
fn velocity_with_bf16_linear_weights_stays_near_transformers() {
    let f = fixture();
    let vb = VarBuilder::open(&[path()], &f.dev).expect("vb");
    let dit = Dit::load_with_format(&vb, &f.cfg, WeightFormat::Bf16).expect("load");
    let spk = dit
        .speaker(&f.t("in.cond"), &f.t("in.ref_mel"))
        .expect("speaker");
    let c = dit.prepare(&spk, &f.codes(), true).expect("prepare");
    let x = f.t("in.x");
    let raw = f.host(&dit.model_output(&c, &x, f.v("in.t")[0]).expect("model"));
    let want = f.v("out.velocity_cfg");
    let d = max_abs(&raw, &want);
    eprintln!(
        "bf16 linears: cfg batch max |diff| {d:e} (peak {})",
        peak(&want)
    );
    // bf16 keeps 8 significant bits: each weight moves by up to 2^-9 of
    // itself and, on a CPU with AVX512_BF16, each activation into a large
    // linear layer too. Through 4 layers on outputs up to ~3, 1.8e-2 is
    // seen (on Zen 4, AVX512_BF16); 7.5e-2 leaves 4x and stays far under
    // a wrong mask's miss.
    assert!(d < 7.5e-2, "bf16 cfg batch max |diff| {d}");
}

#[test]
fn ode_sample_matches_transformers() {
    let f = fixture();
    let spk = f
        .dit
        .speaker(&f.t("in.cond"), &f.t("in.ref_mel"))
        .expect("speaker");
    let codes = f.codes();
    let noise = f.t("in.noise");
    let opts = SampleOptions {
        num_steps: 5,
        method: OdeMethod::Rk4ThreeEighths,
        guidance_scale: 0.5,
        sway_coefficient: Some(-1.0),
    };
    let start = std::time::Instant::now();
    let mel = f
        .dit
        .sample(&spk, &codes, &noise, &opts, || false)
        .expect("sample");
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(mel.dims(), &[1, f.cfg.mel_dim, codes.len() * f.cfg.repeats]);
    let want = f.v("out.sample");
    let d = max_abs(&f.host(&mel), &want);
    let plain_opts = SampleOptions {
        guidance_scale: 0.0,
        ..opts
    };
    let plain = f
        .dit
        .sample(&spk, &codes, &noise, &plain_opts, || false)
        .expect("sample");
    let dp = max_abs(&f.host(&plain), &f.v("out.sample_plain"));
    eprintln!(
        "sample (4 RK4 3/8 steps, 16 guided evaluations, {secs:.3} s): max |diff| {d:e} (peak {}), unguided {dp:e}",
        peak(&want)
    );
    // 16 evaluations, each within ~5e-6 of the reference, integrated with
    // weights summing to 1 (the guidance amplifies differences by 1.5),
    // outputs up to ~5: ~3e-6 is seen; 5e-5 leaves >10x. The classic RK4
    // rule misses by ~0.8 (checked below).
    assert!(d < 5e-5, "sample max |diff| {d}");
    assert!(dp < 5e-5, "unguided sample max |diff| {dp}");
    let classic = f
        .dit
        .sample(
            &spk,
            &codes,
            &noise,
            &SampleOptions {
                method: OdeMethod::Rk4,
                ..opts
            },
            || false,
        )
        .expect("sample");
    let dc = max_abs(&f.host(&classic), &want);
    eprintln!("classic RK4 instead: max |diff| {dc:e}");
    assert!(dc > 10.0 * d, "the solver rule should matter: {dc} vs {d}");
}

#[test]
fn a_cancel_between_steps_stops_with_the_steps_done() {
    let f = fixture();
    let spk = f
        .dit
        .speaker(&f.t("in.cond"), &f.t("in.ref_mel"))
        .expect("speaker");
    let opts = SampleOptions {
        num_steps: 5,
        ..SampleOptions::default()
    };
    let mut asked = 0;
    let r = f.dit.sample(&spk, &f.codes(), &f.t("in.noise"), &opts, || {
        asked += 1;
        asked > 2
    });
    match r {
        Err(Error::Cancelled { steps: 2, total: 4 }) => {}
        other => panic!("expected a cancel after 2 of 4 steps, got {other:?}"),
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let f = fixture();
    let (cond, ref_mel) = (f.t("in.cond"), f.t("in.ref_mel"));
    let spk = f.dit.speaker(&cond, &ref_mel).expect("speaker");
    let mut codes = f.codes();
    let noise = f.t("in.noise");
    let opts = SampleOptions::default();
    // A code past the table (a talker special token left in).
    codes[2] = f.cfg.num_embeds as u32 + 1;
    let e = f
        .dit
        .sample(&spk, &codes, &noise, &opts, || false)
        .unwrap_err();
    assert!(matches!(e, Error::BadInput(_)), "{e}");
    assert!(e.to_string().contains("position 2"), "{e}");
    let codes = f.codes();
    // Wrong mel_dim in the reference mel and in the noise.
    let bad_mel = Tensor::zeros(&[1, 20, f.cfg.mel_dim + 1]).expect("t");
    let e = f.dit.speaker(&cond, &bad_mel).unwrap_err();
    assert!(e.to_string().contains("mel_dim"), "{e}");
    let bad_noise = Tensor::zeros(&[1, codes.len() * 2, f.cfg.mel_dim + 1]).expect("t");
    let e = f
        .dit
        .sample(&spk, &codes, &bad_noise, &opts, || false)
        .unwrap_err();
    assert!(e.to_string().contains("mel_dim"), "{e}");
    // Noise of the wrong length, a reference too short for the encoder's
    // padding, a conditioning vector of the wrong size, no codes, a
    // schedule of one time.
    let short = Tensor::zeros(&[1, 3, f.cfg.mel_dim]).expect("t");
    assert!(f
        .dit
        .sample(&spk, &codes[..5], &noise, &opts, || false)
        .is_err());
    assert!(f.dit.speaker(&cond, &short).is_err());
    assert!(f.dit.speaker(&ref_mel, &ref_mel).is_err());
    assert!(f.dit.sample(&spk, &[], &noise, &opts, || false).is_err());
    let one = SampleOptions {
        num_steps: 1,
        ..opts
    };
    assert!(f.dit.sample(&spk, &codes, &noise, &one, || false).is_err());
    // Inconsistent configurations.
    let mut cfg = f.cfg.clone();
    cfg.look_ahead_layers = vec![cfg.num_hidden_layers];
    assert!(cfg.check().is_err());
    let mut cfg = f.cfg.clone();
    cfg.enc_channels[3] += 1;
    assert!(cfg.check().unwrap_err().contains("enc_channels"));
    assert!(Config::default().check().is_ok());
}

#[test]
fn windowed_sampling_covers_the_full_sample() {
    let f = fixture();
    let spk = f
        .dit
        .speaker(&f.t("in.cond"), &f.t("in.ref_mel"))
        .expect("speaker");
    let codes = f.codes();
    let noise = f.t("in.noise");
    let opts = SampleOptions {
        num_steps: 5,
        ..SampleOptions::default()
    };
    let full = f.host(
        &f.dit
            .sample(&spk, &codes, &noise, &opts, || false)
            .expect("sample"),
    );
    let (mel, frames) = (f.cfg.mel_dim, codes.len() * f.cfg.repeats);
    assert_eq!(f.dit.window_alignment(), 2);
    // Centre codes 4..8 (frames 8..16) with all the context there is: the
    // window is the whole utterance, so the centre is the full sample's.
    let w = f
        .dit
        .sample_window(&spk, &codes, &noise, 4..8, 99, 99, &opts, || false)
        .expect("window");
    assert_eq!(w.dims(), &[1, mel, 8]);
    let w = f.host(&w);
    let centre: Vec<f32> = (0..mel)
        .flat_map(|m| full[m * frames + 8..m * frames + 16].to_vec())
        .collect();
    assert_eq!(max_abs(&w, &centre), 0.0);
    // One aligned block of context on each side (an odd left context is
    // moved back to a block boundary): close, not equal.
    let w = f
        .dit
        .sample_window(&spk, &codes, &noise, 4..8, 1, 2, &opts, || false)
        .expect("window");
    let d = max_abs(&f.host(&w), &centre);
    eprintln!("window with 1 block of context each side: max |diff| {d:e} against the full sample");
    assert!(d.is_finite() && d > 0.0);
    assert!(f
        .dit
        .sample_window(&spk, &codes, &noise, 8..8, 1, 1, &opts, || false)
        .is_err());
    // The seeded noise is a row-major stream: a longer draw starts with the
    // shorter one, so an utterance's noise can be drawn once, up front.
    let short = f.host(&f.dit.noise(5, 7).expect("noise"));
    let long = f.host(&f.dit.noise(9, 7).expect("noise"));
    assert_eq!(short[..], long[..short.len()]);
    let seeded = f
        .dit
        .sample_seeded(&spk, &codes[..4], 7, &opts, || false)
        .expect("seeded");
    assert_eq!(seeded.dims(), &[1, mel, 8]);
}
