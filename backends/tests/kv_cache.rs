//! The KV cache on the host grows in place (spare rows, doubling) and must
//! behave exactly like concatenation: same contents after every append,
//! earlier returned tensors unchanged, clones independent, and attention
//! over its strided views equal to attention over contiguous copies.

#![allow(clippy::unwrap_used)]

use edgeflow_backends::open;
use edgeflow_runtime::{Device, DeviceSpec, KvCache, Tensor};

fn rows(dev: &Device, s: usize, seed: u64) -> Tensor {
    dev.rand_normal(&[1, 3, s, 8], 0.0, 1.0, seed).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec_f32().unwrap()
}

#[test]
fn in_place_cache_equals_concatenation() {
    let dev = open(DeviceSpec::Cpu).unwrap();
    let mut cache = KvCache::new();
    let (mut rk, mut rv): (Option<Tensor>, Option<Tensor>) = (None, None);
    let mut early: Option<(Tensor, Vec<f32>)> = None;
    let mut clone: Option<(KvCache, Tensor, Tensor)> = None;
    // A 7-row prefill, then single rows across the 64- and 128-row growths.
    for step in 0..150u64 {
        let s = if step == 0 { 7 } else { 1 };
        let (k, v) = (rows(&dev, s, 2 * step), rows(&dev, s, 2 * step + 1));
        let (ck, cv) = cache.append(&dev, &k, &v).unwrap();
        rk = Some(match rk {
            Some(r) => dev.concat(&[&r, &k], 2).unwrap(),
            None => k.clone(),
        });
        rv = Some(match rv {
            Some(r) => dev.concat(&[&r, &v], 2).unwrap(),
            None => v.clone(),
        });
        let (wk, wv) = (rk.as_ref().unwrap(), rv.as_ref().unwrap());
        assert_eq!(ck.dims(), wk.dims(), "step {step}");
        assert_eq!(values(&ck), values(wk), "keys differ at step {step}");
        assert_eq!(values(&cv), values(wv), "values differ at step {step}");
        assert_eq!(cache.len(), 7 + step as usize);
        if step == 10 {
            early = Some((ck.clone(), values(&ck)));
        }
        if step == 20 {
            clone = Some((cache.clone(), wk.clone(), wv.clone()));
        }
    }
    // A view handed out at step 10 still reads what it read then.
    let (t, was) = early.unwrap();
    assert_eq!(values(&t), was);
    // The clone taken at step 20 grows on its own.
    let (mut c, ck0, cv0) = clone.unwrap();
    let (k, v) = (rows(&dev, 2, 900), rows(&dev, 2, 901));
    let (gk, gv) = c.append(&dev, &k, &v).unwrap();
    assert_eq!(values(&gk), values(&dev.concat(&[&ck0, &k], 2).unwrap()));
    assert_eq!(values(&gv), values(&dev.concat(&[&cv0, &v], 2).unwrap()));
    // ... and did not write into the original.
    assert_eq!(
        values(&cache.append(&dev, &k, &v).unwrap().0),
        values(&dev.concat(&[rk.as_ref().unwrap(), &k], 2).unwrap())
    );
    cache.reset();
    assert!(cache.is_empty());
}

/// Tolerance: the same products summed by the same kernel, only the key /
/// value strides differ, so equal up to f32 reassociation (1e-5).
#[test]
fn attention_reads_the_cache_views_in_place() {
    let dev = open(DeviceSpec::Cpu).unwrap();
    let mut cache = KvCache::new();
    for step in 0..40u64 {
        let (k, v) = (rows(&dev, 1, 3 * step), rows(&dev, 1, 3 * step + 1));
        let (ck, cv) = cache.append(&dev, &k, &v).unwrap();
        let q = dev
            .rand_normal(&[1, 9, 1, 8], 0.0, 1.0, 3 * step + 2)
            .unwrap();
        let got = dev.attention(&q, &ck, &cv, None, 0.35, true).unwrap();
        let (ak, av) = (
            Tensor::from_vec(values(&ck), ck.dims()).unwrap(),
            Tensor::from_vec(values(&cv), cv.dims()).unwrap(),
        );
        let want = dev.attention(&q, &ak, &av, None, 0.35, true).unwrap();
        for (a, b) in values(&got).iter().zip(values(&want)) {
            assert!((a - b).abs() <= 1e-5, "step {step}: {a} vs {b}");
        }
    }
}

/// Truncating keeps the first rows, later appends continue from there, and
/// a view taken before the truncation keeps its contents.
#[test]
fn truncate_rolls_back_to_a_prefix() {
    let dev = open(DeviceSpec::Cpu).unwrap();
    let mut cache = KvCache::new();
    let (k0, v0) = (rows(&dev, 20, 1), rows(&dev, 20, 2));
    let (before, _) = cache.append(&dev, &k0, &v0).unwrap();
    let was = values(&before);
    cache.truncate(&dev, 12).unwrap();
    assert_eq!(cache.len(), 12);
    let (k1, v1) = (rows(&dev, 3, 3), rows(&dev, 3, 4));
    let (ck, cv) = cache.append(&dev, &k1, &v1).unwrap();
    let head = |t: &Tensor| dev.narrow(t, 2, 0, 12).unwrap();
    let want_k = dev.concat(&[&head(&k0), &k1], 2).unwrap();
    let want_v = dev.concat(&[&head(&v0), &v1], 2).unwrap();
    assert_eq!(values(&ck), values(&want_k));
    assert_eq!(values(&cv), values(&want_v));
    assert_eq!(values(&before), was, "an earlier view changed");
    cache.truncate(&dev, 40).unwrap();
    assert_eq!(cache.len(), 15, "truncating to more rows is a no-op");
    cache.truncate(&dev, 0).unwrap();
    assert!(cache.is_empty());
}
