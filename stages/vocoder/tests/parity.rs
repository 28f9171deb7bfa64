//! HiFi-GAN universal on the real weights against the upstream generator
//! in PyTorch (fixture from scripts/hifigan_reference.py), the HiFi-GAN mel
//! front end against jik876's `mel_spectrogram`, and streamed vocoding
//! against one-shot vocoding.
//!
//! Needs `edgeflow models fetch hifigan-universal`; with
//! EDGEFLOW_SKIP_MODEL_TESTS=1 a missing model skips the model tests.

use edgeflow_audio::mel_hifigan::{HifiganMel, HifiganMelConfig};
use edgeflow_runtime::weights::{SafetensorsFile, WeightReader};
use edgeflow_runtime::{Device, DeviceSpec, Tensor};
use edgeflow_vocoder::{cards, HifiGan, MelStream};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> Vec<f32> {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hifigan_reference.safetensors");
    let f = SafetensorsFile::open(&p).expect("fixture");
    f.load(name).expect(name).to_vec_f32().expect("f32")
}

fn model() -> Option<PathBuf> {
    match cards::HIFIGAN_UNIVERSAL.locate() {
        Ok(d) => Some(d),
        Err(e) if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipped (EDGEFLOW_SKIP_MODEL_TESTS=1): {e}");
            None
        }
        Err(e) => panic!("{e}\n(set EDGEFLOW_SKIP_MODEL_TESTS=1 to skip model tests)"),
    }
}

fn cpu() -> Device {
    edgeflow_backends::open(DeviceSpec::Cpu).expect("cpu")
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn mel_front_end_matches_hifigans_mel_spectrogram() {
    let audio = fixture("audio_in");
    let want = fixture("mel");
    let mut mel = HifiganMel::new(HifiganMelConfig::default()).expect("mel");
    let (got, frames) = mel.compute(&audio);
    assert_eq!(frames, audio.len() / 256);
    let d = max_abs(&got, &want);
    eprintln!("mel: max |diff| {d:e} over {} values", got.len());
    // Natural-log mel of real speech (range about -11.5..2): torch's FFT and
    // ours round differently (~1e-6 relative in magnitude); the log turns
    // that into ~1e-6 absolute except in near-silent bins clamped at 1e-5,
    // where relative error is largest. 1e-3 bounds both with margin.
    assert!(d < 1e-3, "mel max |diff| {d}");
}

#[test]
fn universal_generator_matches_pytorch() {
    let Some(dir) = model() else { return };
    let dev = cpu();
    let voc = HifiGan::from_dir(&dir, &dev).expect("load");
    let mel = fixture("mel");
    let frames = mel.len() / 80;
    let want = fixture("audio_universal");
    let m = Tensor::from_vec(mel.clone(), &[1, 80, frames]).expect("t");
    let got = dev
        .to_host(&voc.forward(&m).expect("forward"))
        .expect("host")
        .to_vec_f32()
        .expect("v");
    assert_eq!(got.len(), frames * 256);
    let d = max_abs(&got, &want);
    let peak = want.iter().fold(0f32, |a, x| a.max(x.abs()));
    eprintln!("audio: max |diff| {d:e}, reference peak {peak}");
    // f32 through 4 upsampling stages and 36 residual convolutions, with
    // weight norm folded in f64 by us and in f32 by torch, and different
    // summation orders (our fused convolution vs oneDNN): differences of a
    // few 1e-6 are expected on a signal peaking near 0.5. 1e-4 is ~-80 dB
    // of full scale.
    assert!(d < 1e-4, "audio max |diff| {d}");
}

#[test]
fn streamed_vocoding_equals_one_shot() {
    let Some(dir) = model() else { return };
    let dev = cpu();
    let voc = HifiGan::from_dir(&dir, &dev).expect("load");
    let mel = fixture("mel");
    let frames = mel.len() / 80;
    let m = Tensor::from_vec(mel.clone(), &[1, 80, frames]).expect("t");
    let one = dev
        .to_host(&voc.forward(&m).expect("forward"))
        .expect("host")
        .to_vec_f32()
        .expect("v");
    let radius = HifiGan::receptive_radius(voc.config());
    assert_eq!(radius, 15);
    // Frames arrive 7 at a time; chunks of 10 with the full context.
    let mut s = MelStream::new(80, 10, radius, radius).expect("stream");
    let mut joined = Vec::new();
    let mut sink = |c: Vec<f32>| {
        joined.extend(c);
        Ok(true)
    };
    for a in (0..frames).step_by(7) {
        let n = 7.min(frames - a);
        let piece: Vec<f32> = (0..80)
            .flat_map(|c| mel[c * frames + a..c * frames + a + n].to_vec())
            .collect();
        let t = Tensor::from_vec(piece, &[80, n]).expect("t");
        s.push(&voc, &t, &mut sink).expect("push");
    }
    s.finish(&voc, &mut sink).expect("finish");
    let d = max_abs(&joined, &one);
    eprintln!("streamed vs one-shot: max |diff| {d:e}");
    // The same arithmetic on the same receptive field; only the length of
    // the convolutions differs, which may change the kernels' blocking and
    // so summation order: float rounding only.
    assert!(d < 1e-5, "streamed max |diff| {d}");
    let bad = Tensor::from_vec(vec![0.0; 70], &[70, 1]).expect("t");
    let e = s.push(&voc, &bad, &mut |_| Ok(true)).expect_err("shape");
    assert!(e.to_string().contains("[80, frames]"), "{e}");
}
