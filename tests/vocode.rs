//! Copy-synthesis on real speech with real weights: Piper "joe" speaks a
//! sentence, edgeflow's HiFi-GAN mel front end analyses it, HiFi-GAN
//! universal vocodes it back to audio, and Whisper tiny.en (ours)
//! transcribes that audio to the same words; then `pipelines/vocode.yaml`
//! runs end to end on its shipped clip.
//!
//! Needs the `piper-joe`, `hifigan-universal` and `whisper-tiny-en` models
//! in the cache (`edgeflow models fetch NAME`); with
//! EDGEFLOW_SKIP_MODEL_TESTS=1 a missing one skips the test instead.

use edgeflow::models::ModelCard;
use edgeflow_audio::mel_hifigan::{HifiganMel, HifiganMelConfig};
use std::path::{Path, PathBuf};

fn model(card: &ModelCard) -> Option<PathBuf> {
    match card.locate() {
        Ok(d) => Some(d),
        Err(e) if std::env::var("EDGEFLOW_SKIP_MODEL_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipped (EDGEFLOW_SKIP_MODEL_TESTS=1): {e}");
            None
        }
        Err(e) => panic!("{e}\n(set EDGEFLOW_SKIP_MODEL_TESTS=1 to skip model tests)"),
    }
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace()
        .map(|w| {
            w.chars()
                .filter(|c| c.is_alphanumeric())
                .collect::<String>()
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

fn cpu() -> edgeflow::runtime::Device {
    edgeflow_backends::open(edgeflow::runtime::DeviceSpec::Cpu).expect("cpu device")
}

#[test]
fn piper_speech_through_hifigan_is_transcribed_to_the_same_words() {
    let (Some(_), Some(voc_dir), Some(asr_dir)) = (
        model(&edgeflow_piper::PIPER_JOE),
        model(&edgeflow_vocoder::cards::HIFIGAN_UNIVERSAL),
        model(&edgeflow_speech::cards::WHISPER_TINY_EN),
    ) else {
        return;
    };
    let sentence = "The children are playing in the park on a sunny day.";
    let dir = tempfile::tempdir().expect("tmp");
    let wav = dir.path().join("piper.wav");
    let yaml = format!(
        "name: say\nstages:\n  - {{ id: text, kind: text, params: {{ text: \"{sentence}\" }} }}\n  \
         - {{ id: fe, kind: piper_frontend }}\n  - {{ id: tts, kind: vits, params: {{ noise_scale: 0.0, noise_w: 0.0 }} }}\n  \
         - {{ id: out, kind: wav_sink, params: {{ path: \"{}\" }} }}\nedges:\n  \
         - {{ from: text.out, to: fe.in }}\n  - {{ from: fe.out, to: tts.in }}\n  - {{ from: tts.out, to: out.in }}\n",
        wav.display()
    );
    edgeflow::Pipeline::from_yaml(&yaml, &edgeflow::registry())
        .expect("pipeline")
        .run(Some(std::time::Duration::from_secs(120)))
        .expect("piper run");
    let (info, speech) = edgeflow_audio::wav::read_wav(&wav).expect("piper wav");
    assert_eq!(info.sample_rate, 22_050);

    // Our mel -> HiFi-GAN universal, one shot.
    let mut mel = HifiganMel::new(HifiganMelConfig::default()).expect("mel");
    let (values, frames) = mel.compute(&speech);
    let dev = cpu();
    let voc = edgeflow_vocoder::HifiGan::from_dir(&voc_dir, &dev).expect("hifigan");
    let t0 = std::time::Instant::now();
    let m = edgeflow::runtime::Tensor::from_vec(values, &[1, 80, frames]).expect("tensor");
    let audio = dev
        .to_host(&voc.forward(&m).expect("vocode"))
        .expect("host")
        .to_vec_f32()
        .expect("vec");
    let vocode_s = t0.elapsed().as_secs_f64();
    assert_eq!(audio.len(), frames * 256);
    eprintln!(
        "vocoded {:.2} s of audio in {vocode_s:.2} s (RTF {:.2})",
        audio.len() as f64 / 22_050.0,
        vocode_s / (audio.len() as f64 / 22_050.0)
    );

    // Whisper hears the same words in both.
    let at16 = edgeflow_audio::resample::resample_all(&audio, 22_050, 16_000, 1).expect("resample");
    let mut asr = edgeflow_speech::whisper::Transcriber::load(&asr_dir, &dev).expect("whisper");
    let heard = asr.transcribe(&at16, &mut || false).expect("asr").text;
    let orig16 =
        edgeflow_audio::resample::resample_all(&speech, 22_050, 16_000, 1).expect("resample");
    let heard_orig = asr.transcribe(&orig16, &mut || false).expect("asr").text;
    eprintln!("piper: {heard_orig:?}; vocoded: {heard:?}");
    // The criterion: Whisper hears the same words in the vocoded copy as in
    // Piper's own audio (tiny.en's own mistakes, if any, included) ...
    assert_eq!(
        words(&heard),
        words(&heard_orig),
        "vocoded speech heard as {heard:?}, Piper's as {heard_orig:?}"
    );
    // ... and those are the sentence's words (all but at most one).
    let want = words(sentence);
    let got = words(&heard);
    let hits = want.iter().filter(|w| got.contains(w)).count();
    assert!(hits + 1 >= want.len(), "heard {heard:?} for {sentence:?}");
}

#[test]
fn vocode_pipeline_copies_the_shipped_clip() {
    if model(&edgeflow_vocoder::cards::HIFIGAN_UNIVERSAL).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("out.wav");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("vocode.yaml");
    let set: Vec<edgeflow::graph::Override> = vec![format!("out.path={}", out.display())
        .parse()
        .expect("override")];
    let p = edgeflow::Pipeline::from_file(&file, &edgeflow::registry(), &set).expect("pipeline");
    let metrics = p
        .run(Some(std::time::Duration::from_secs(300)))
        .expect("vocode.yaml runs");
    let (info, audio) = edgeflow_audio::wav::read_wav(&out).expect("out wav");
    assert_eq!(info.sample_rate, 22_050);
    // 4.4 s of input at 22050 Hz, whole frames of 256 samples.
    let input_s = 71_000.0 / 16_000.0;
    let got_s = audio.len() as f64 / 22_050.0;
    assert!(
        (got_s - input_s).abs() < 0.05,
        "{got_s} s out for {input_s} s in"
    );
    let rms = (audio.iter().map(|x| (x * x) as f64).sum::<f64>() / audio.len() as f64).sqrt();
    assert!(rms > 0.01, "silent output (rms {rms})");
    // One utterance (the clip, ended by end of stream): its first audio,
    // real-time factor and length are recorded once each.
    let voc = metrics
        .stages
        .iter()
        .find(|s| s.kind == "vocoder")
        .expect("vocoder stage");
    for name in ["time_to_first_audio_ms", "rtf", "audio_s"] {
        assert_eq!(voc.values.get(name).map(|v| v.count), Some(1), "{name}");
    }
    assert!((voc.values["audio_s"].max - got_s).abs() < 1e-6);
}
