//! Whisper tiny.en on our runtime against faster-whisper (beam 1,
//! temperature 0, no timestamps; scripts/speech_reference.py) on the
//! fixture clip: whole, by sentence, and by VAD segment. Transcripts and
//! token ids must be identical.
//!
//! Tolerance: none on the outputs. Inside, the sums run in other orders
//! than CTranslate2's (gemm's AVX-512 / AVX2 tiles, our GEMV and attention
//! kernels) and decoder steps read the checkpoint's fp16 weights (linears
//! and the output projection) as f16, converted to f32 in registers: the
//! same products as faster-whisper's `compute_type="float32"`, which casts
//! them at load.

mod common;

use edgeflow_runtime::DeviceSpec;
use edgeflow_speech::cards::WHISPER_TINY_EN;
use edgeflow_speech::whisper::Transcriber;

#[test]
fn transcripts_match_faster_whisper() {
    let Some(dir) = common::model(&WHISPER_TINY_EN) else {
        return;
    };
    let dev = edgeflow_backends::open(DeviceSpec::Cpu).expect("cpu");
    let mut tr = Transcriber::load(&dir, &dev).expect("load");
    let r = common::reference();
    let clip = common::clip();
    let mut ranges = vec![("whole".to_string(), [0, clip.len()])];
    let offs: Vec<[usize; 2]> =
        serde_json::from_value(r["sentence_offsets"].clone()).expect("offsets");
    let segs: Vec<[usize; 2]> = serde_json::from_value(r["vad"]["segments"].clone()).expect("segs");
    ranges.extend(
        offs.iter()
            .enumerate()
            .map(|(i, o)| (format!("sentence{i}"), *o)),
    );
    ranges.extend(
        segs.iter()
            .enumerate()
            .map(|(i, o)| (format!("vad_segment{i}"), *o)),
    );
    let mut failures = Vec::new();
    for (name, [a, b]) in ranges {
        let want = r["asr"]
            .as_array()
            .expect("asr")
            .iter()
            .find(|x| x["name"] == name.as_str())
            .expect("reference entry");
        let t = tr
            .transcribe(&clip[a..b], &mut || false)
            .expect("transcribe");
        let want_tokens: Vec<u32> = serde_json::from_value(want["tokens"].clone()).expect("tokens");
        eprintln!(
            "{name}: {:?} (encode {:.0} ms, decode {:.0} ms; faster-whisper {:.0} ms)",
            t.text,
            t.encode_s * 1e3,
            t.decode_s * 1e3,
            want["seconds"].as_f64().unwrap_or(0.0) * 1e3
        );
        if t.text != want["text"].as_str().expect("text") || t.tokens != want_tokens {
            failures.push(format!(
                "{name}: got {:?} {:?}, faster-whisper {:?} {:?}",
                t.text, t.tokens, want["text"], want_tokens
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
