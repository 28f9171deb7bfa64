//! The per-op profile a device keeps on request (`DeviceStats::profile_ops`).

use edgeflow_backends::open;
use edgeflow_runtime::{DeviceSpec, Tensor};

#[test]
fn profile_counts_each_op_and_shape_while_on() {
    let dev = open(DeviceSpec::Cpu).unwrap();
    let a = dev
        .place(&Tensor::from_vec(vec![1.0; 6], &[2, 3]).unwrap())
        .unwrap();
    let b = dev
        .place(&Tensor::from_vec(vec![2.0; 4], &[4]).unwrap())
        .unwrap();
    dev.add(&a, &a).unwrap();
    assert!(dev.stats().op_profile().is_empty(), "off by default");

    dev.stats().profile_ops(true);
    dev.add(&a, &a).unwrap();
    dev.add(&a, &a).unwrap();
    dev.add(&b, &b).unwrap();
    let rows = dev.stats().op_profile();
    let row = |op: &str| {
        rows.iter()
            .find(|r| r.op == op)
            .unwrap_or_else(|| panic!("{op} in {rows:?}"))
    };
    assert_eq!(row("add [2, 3] [2, 3]").calls, 2);
    assert_eq!(row("add [4] [4]").calls, 1);
    assert!(rows.iter().all(|r| r.seconds > 0.0));
    assert!(
        rows.windows(2).all(|w| w[0].seconds >= w[1].seconds),
        "most time first"
    );

    dev.stats().profile_ops(false);
    dev.add(&a, &a).unwrap();
    assert!(dev.stats().op_profile().is_empty(), "stopping clears it");
}
