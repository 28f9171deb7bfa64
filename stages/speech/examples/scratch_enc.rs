#![allow(missing_docs)]
use edgeflow_runtime::DeviceSpec;
use edgeflow_speech::whisper::Whisper;
use std::time::Instant;
fn main() {
    let dev = edgeflow_backends::open(DeviceSpec::Cpu).unwrap();
    let dir = edgeflow_speech::fetch::locate(&edgeflow_speech::fetch::WHISPER_TINY_EN).unwrap();
    let mut m = Whisper::load(&dir.join("model.bin"), &dev).unwrap();
    let mel: Vec<f32> = (0..80 * 3000).map(|i| ((i % 97) as f32) / 97.0 - 0.5).collect();
    let base = m.encode(&mel).unwrap().to_vec_f32().unwrap();
    for round in 0..3 {
        for c in [1500usize, 500, 250, 100] {
            m.set_attention_chunk(c);
            let t = Instant::now();
            let e = m.encode(&mel).unwrap();
            let dt = t.elapsed();
            let v = e.to_vec_f32().unwrap();
            let d = v.iter().zip(&base).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            eprintln!("round {round} chunk {c}: {dt:?} maxdiff {d:e}");
        }
    }
}
