//! Streaming: a sentence decoded chunk by chunk (with left/right context)
//! joins to the one-shot output; the same seed gives the same audio.

mod common;

use edgeflow_piper::piper::{FrontEnd, InferenceScales, VoiceConfig};
use edgeflow_piper::vits::{Chunking, SynthesisParams, Vits, VitsConfig};
use edgeflow_runtime::DeviceSpec;

/// Chunked and one-shot decoding compute the same sums on the same inputs
/// (only the convolution matrix sizes differ), so they agree to float
/// rounding: at least 100 dB SNR and 1e-4 per sample.
const MIN_SNR_DB: f64 = 100.0;
const MAX_ABS: f32 = 1e-4;

fn load() -> Option<(FrontEnd, Vits)> {
    let voice = common::voice()?;
    let vc = VoiceConfig::read(&voice.config).expect("voice config");
    let cfg = VitsConfig {
        num_symbols: vc.num_symbols,
        ..VitsConfig::default()
    };
    let dev = edgeflow_backends::open(DeviceSpec::Cpu).expect("cpu device");
    let vb = edgeflow_piper::VarBuilder::open(&[&voice.weights], &dev).expect("open weights");
    let vits = Vits::load(&vb, &cfg).expect("load vits");
    Some((FrontEnd::new(vc, true), vits))
}

#[test]
fn chunked_stream_equals_one_shot() {
    let Some((fe, vits)) = load() else { return };
    let s = fe
        .sentences("The quick brown fox jumps over the lazy dog, twice, while nobody is watching.")
        .expect("front end");
    let params = SynthesisParams {
        scales: InferenceScales {
            noise_scale: 0.667,
            length_scale: 1.0,
            noise_w: 0.8,
        },
        seed: 7,
    };
    let one_shot = vits.synthesize(&s[0].ids, &params).expect("one shot");
    let again = vits.synthesize(&s[0].ids, &params).expect("again");
    assert_eq!(one_shot, again, "same seed, same audio");

    for chunking in [
        Chunking {
            first_frames: 24,
            frames: 128,
        },
        Chunking {
            first_frames: 5,
            frames: 17,
        },
    ] {
        let prior = vits.prior(&s[0].ids, &params).expect("prior");
        assert_eq!(prior.durations, one_shot.durations);
        let mut chunks: Vec<Vec<f32>> = Vec::new();
        vits.stream(&prior, chunking, &mut |c| {
            chunks.push(c);
            Ok(true)
        })
        .expect("stream");
        assert!(chunks.len() > 2, "{} chunks", chunks.len());
        assert_eq!(chunks[0].len(), chunking.first_frames * vits.hop_length());
        let joined: Vec<f32> = chunks.concat();
        assert_eq!(joined.len(), one_shot.audio.len());
        let snr = common::snr_db(&one_shot.audio, &joined);
        let max = one_shot
            .audio
            .iter()
            .zip(&joined)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!(
            "{chunking:?}: {} chunks, SNR {snr:.1} dB, max |diff| {max:e}",
            chunks.len()
        );
        assert!(
            snr > MIN_SNR_DB && max < MAX_ABS,
            "SNR {snr:.1} dB, max {max}"
        );
    }
}

#[test]
fn stream_stops_when_the_sink_says_so() {
    let Some((fe, vits)) = load() else { return };
    let s = fe
        .sentences("Stop after the first chunk, please.")
        .expect("front end");
    let params = SynthesisParams {
        scales: InferenceScales::default(),
        seed: 1,
    };
    let prior = vits.prior(&s[0].ids, &params).expect("prior");
    let mut n = 0;
    vits.stream(
        &prior,
        Chunking {
            first_frames: 8,
            frames: 8,
        },
        &mut |_| {
            n += 1;
            Ok(false)
        },
    )
    .expect("stream");
    assert_eq!(n, 1);
}
