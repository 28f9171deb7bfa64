use edgeflow_runtime::{ConvCfg, DeviceSpec, Tensor, UnaryOp};
use std::time::Instant;
fn main() {
    let dev = edgeflow_backends::open(DeviceSpec::Cpu).unwrap();
    let r = |d: &[usize]| dev.rand_normal(d, 0.0, 0.1, 1).unwrap();
    let x = r(&[1, 80, 3000]);
    let w1 = r(&[384, 80, 3]);
    let w2 = r(&[384, 384, 3]);
    let h = r(&[1, 1500, 384]);
    let wq = r(&[1152, 384]);
    let q = r(&[1, 6, 1500, 64]);
    let g = r(&[384]);
    for _ in 0..2 {
        let t = Instant::now();
        let y = dev.conv1d(&x, &w1, None, ConvCfg { padding: 1, ..Default::default() }).unwrap();
        eprintln!("conv1 {:?}", t.elapsed());
        let t = Instant::now();
        let _ = dev.conv1d(&y, &w2, None, ConvCfg { padding: 1, stride: 2, ..Default::default() }).unwrap();
        eprintln!("conv2 {:?}", t.elapsed());
        let t = Instant::now();
        let _ = dev.linear(&h, &wq, None).unwrap();
        eprintln!("linear qkv {:?}", t.elapsed());
        let t = Instant::now();
        let _ = dev.attention(&q, &q, &q, None, 0.125, false).unwrap();
        eprintln!("attention {:?}", t.elapsed());
        let t = Instant::now();
        let _ = dev.unary(UnaryOp::GeluErf, &y).unwrap();
        eprintln!("gelu 1.1M {:?}", t.elapsed());
        let t = Instant::now();
        let _ = dev.layer_norm(&h, &g, Some(&g), 1e-5).unwrap();
        eprintln!("ln {:?}", t.elapsed());
        let t = Instant::now();
        let p = dev.permute(&dev.reshape(&h, &[1, 1500, 6, 64]).unwrap(), &[0, 2, 1, 3]).unwrap();
        eprintln!("permute {:?} {:?}", t.elapsed(), p.dims());
        let _ = Tensor::zeros(&[1]);
    }
}
