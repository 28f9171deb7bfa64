//! `WeightStore`: weights load once, are placed on the stage's device, and
//! their bytes are accounted as resident in the device's stats.

#![allow(clippy::unwrap_used)]

use edgeflow_backends::open;
use edgeflow_runtime::weights::WeightStore;
use edgeflow_runtime::{DType, DeviceSpec, Error};

fn write_safetensors(path: &std::path::Path) {
    let mut out = Vec::new();
    let header = r#"{"enc.fc.weight":{"dtype":"F32","shape":[4,64],"data_offsets":[0,1024]},"enc.fc.bias":{"dtype":"F32","shape":[4],"data_offsets":[1024,1040]}}"#;
    let pad = (8 - header.len() % 8) % 8;
    let header = format!("{header}{}", " ".repeat(pad));
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for i in 0..256 {
        out.extend_from_slice(&((i as f32) / 64.0 - 2.0).to_le_bytes());
    }
    for v in [0.5f32, -0.5, 1.0, 0.0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, out).unwrap();
}

#[test]
fn store_places_once_and_accounts_resident_bytes() {
    let dir = std::env::temp_dir().join(format!("edgeflow-ws-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.safetensors");
    write_safetensors(&path);

    let dev = open(DeviceSpec::Cpu).unwrap();
    let ws = WeightStore::open(&[&path], dev.clone()).unwrap();
    let fc = ws.pp("enc").pp("fc");
    let w = fc.get_with_shape("weight", &[4, 64]).unwrap();
    assert_eq!(dev.stats().snapshot().resident_bytes, 1024);
    // A second get returns the placed tensor and accounts nothing more.
    let _ = fc.get("weight").unwrap();
    assert_eq!(dev.stats().snapshot().resident_bytes, 1024);
    let b = fc.get("bias").unwrap();
    assert_eq!(dev.stats().snapshot().resident_bytes, 1040);
    assert_eq!(ws.resident_bytes(), 1040);

    // The loaded weights compute what they should.
    let x = edgeflow_runtime::Tensor::from_vec(vec![1.0; 64], &[1, 64]).unwrap();
    let y = dev.linear(&x, &w, Some(&b)).unwrap().to_vec_f32().unwrap();
    let want: Vec<f32> = (0..4)
        .map(|r| {
            (0..64)
                .map(|c| ((r * 64 + c) as f32) / 64.0 - 2.0)
                .sum::<f32>()
                + [0.5, -0.5, 1.0, 0.0][r]
        })
        .collect();
    for (g, w) in y.iter().zip(&want) {
        assert!((g - w).abs() < 1e-4, "{g} vs {w}");
    }

    // Quantized at load: Q8_0 bytes are accounted, not f32 bytes.
    let q = fc.get_as("weight", DType::Q8_0).unwrap();
    assert_eq!(q.dtype(), DType::Q8_0);
    assert_eq!(q.size_bytes(), 4 * 2 * 34);
    assert_eq!(dev.stats().snapshot().resident_bytes, 1040 + 272);

    // Wrong shape and missing names are Weights errors naming the tensor.
    let e = fc.get_with_shape("bias", &[5]).unwrap_err();
    assert!(
        matches!(e, Error::Weights { .. }) && e.to_string().contains("enc.fc.bias"),
        "{e}"
    );
    let e = ws.get("dec.nope").unwrap_err();
    assert!(
        e.to_string().contains("dec.nope") && e.to_string().contains("m.safetensors"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn weights_placed_on_an_accelerator_count_there() {
    // Placing on the NPU simulator (always available) uploads and accounts.
    let dir = std::env::temp_dir().join(format!("edgeflow-ws-npu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.safetensors");
    write_safetensors(&path);
    let dev = open(DeviceSpec::Npu(0)).unwrap();
    let ws = WeightStore::open(&[&path], dev.clone()).unwrap();
    let w = ws.get("enc.fc.weight").unwrap();
    let s = dev.stats().snapshot();
    assert!(!w.is_host(), "weights were not placed on the device");
    assert_eq!(s.uploads, 1);
    assert_eq!(s.resident_bytes, w.size_bytes() as u64);
    std::fs::remove_dir_all(&dir).unwrap();
}
