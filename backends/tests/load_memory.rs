//! Loading ends by handing freed memory back: the edgeflow binary keeps
//! freed heap memory for reuse (`keep_freed_memory`), so without this a
//! model's load temporaries (file reads, stacked and repacked copies) would
//! stay resident. One test in its own process: it reads the process's
//! resident size, which other tests running beside it would move.

#![allow(clippy::unwrap_used)]

use edgeflow_runtime::weights::WeightStore;
use edgeflow_runtime::DeviceSpec;

/// Resident MB of this process (`VmRSS`).
fn resident_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: f64 = line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb / 1024.0
}

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn dropping_a_cpu_weight_store_returns_load_temporaries() {
    edgeflow_backends::keep_freed_memory();
    let dev = edgeflow_backends::open(DeviceSpec::Cpu).unwrap();
    let store = WeightStore::new(Vec::new(), dev);
    // What a load leaves behind: many MB-sized copies, touched, then freed
    // while the weights made from them live on (here: small survivors
    // between them, so the free space is holes, not the heap's top).
    let mut survivors = Vec::new();
    let temps: Vec<Vec<u8>> = (0..48)
        .map(|i| {
            survivors.push(vec![i as u8; 4096]);
            vec![i as u8 + 1; 4 << 20]
        })
        .collect();
    let loaded = resident_mb();
    drop(temps);
    let freed = resident_mb();
    assert!(
        loaded - freed < 64.0,
        "freed memory was handed back before loading ended ({loaded:.0} -> {freed:.0} MB): \
         keep_freed_memory is not in force, so this test measures nothing"
    );
    drop(store);
    let released = resident_mb();
    assert!(
        freed - released > 128.0,
        "192 MB of load temporaries stayed resident after the store was dropped \
         ({freed:.0} -> {released:.0} MB)"
    );
    assert_eq!(survivors.len(), 48);
}
