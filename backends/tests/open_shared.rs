//! `open` hands out one backend per GPU adapter for the whole process, so
//! stages placed on the same GPU pass tensors without host round trips; each
//! NPU simulator placement gets its own simulator (its calibration is per
//! model: see `edgeflow_backends` docs, "Design").

#![allow(clippy::unwrap_used)]

use edgeflow_backends::open;
use edgeflow_runtime::{DeviceSpec, Tensor};
use std::sync::Arc;

#[test]
fn two_gpu_devices_share_buffers_without_transfers() {
    if std::env::var("EDGEFLOW_SKIP_GPU").as_deref() == Ok("1") {
        eprintln!("skipping GPU sharing test (EDGEFLOW_SKIP_GPU=1)");
        return;
    }
    let producer = open(DeviceSpec::Gpu(0)).unwrap_or_else(|e| {
        panic!(
            "no usable GPU adapter: {e}\nInstall `mesa-vulkan-drivers libvulkan1` \
             (software Vulkan) or set EDGEFLOW_SKIP_GPU=1 to skip the GPU tests."
        )
    });
    let consumer = open(DeviceSpec::Gpu(0)).unwrap();
    assert!(
        Arc::ptr_eq(producer.backend(), consumer.backend()),
        "two gpu:0 placements must share one backend"
    );

    // A stage computes on the GPU and hands its output to the next stage.
    let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let x = producer.place(&x).unwrap();
    let y = producer.add(&x, &x).unwrap();
    assert!(!y.is_host());

    let before = consumer.stats().snapshot();
    assert!(consumer.backend().holds(&y));
    let z = consumer.mul(&y, &y).unwrap();
    let after = consumer.stats().snapshot();
    assert_eq!(
        (after.uploads, after.downloads, after.bytes_transferred),
        (before.uploads, before.downloads, before.bytes_transferred),
        "the consumer must use the producer's buffer in place"
    );
    assert_eq!(after.fallback_ops, before.fallback_ops);
    assert!(!z.is_host());
    assert_eq!(
        consumer.to_host(&z).unwrap().to_vec_f32().unwrap(),
        vec![4.0, 16.0, 36.0, 64.0]
    );
}

#[test]
fn each_npu_placement_gets_its_own_simulator() {
    let a = open(DeviceSpec::Npu(0)).unwrap();
    let b = open(DeviceSpec::Npu(0)).unwrap();
    assert!(!Arc::ptr_eq(a.backend(), b.backend()));
}
