use super::*;
use edgeflow_graph::{ImageFrame, Payload, Pipeline, PixelFormat};
use image::Rgb;
use std::time::Duration;

fn gradient(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, 128])
    })
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

#[test]
fn png_and_jpeg_round_trip() {
    let img = gradient(40, 30);
    let png = decode::encode_png(&img).expect("png");
    let back = decode::decode(&png, "mem.png", &DecodeLimits::default()).expect("decode");
    assert_eq!(back, img);
    let mut jpg = std::io::Cursor::new(Vec::new());
    img.write_to(&mut jpg, image::ImageFormat::Jpeg)
        .expect("jpeg");
    let back = decode::decode(jpg.get_ref(), "mem.jpg", &DecodeLimits::default()).expect("jpeg");
    assert_eq!(back.dimensions(), (40, 30));
    // Lossy, but close on a smooth gradient.
    let err = back
        .as_raw()
        .iter()
        .zip(img.as_raw())
        .map(|(a, b)| (*a as i32 - *b as i32).abs())
        .max()
        .expect("pixels");
    assert!(err < 24, "jpeg error {err}");
}

#[test]
fn hostile_files_are_clear_errors() {
    let limits = DecodeLimits::default();
    let e = decode::decode(b"GIF89a....", "x.gif", &limits).expect_err("gif");
    assert!(
        e.to_string().contains("not supported (PNG and JPEG are)"),
        "{e}"
    );
    let e = decode::decode(b"hello world", "x.png", &limits).expect_err("garbage");
    assert!(
        e.to_string().contains("x.png") && e.to_string().contains("not a PNG or JPEG"),
        "{e}"
    );
    let png = decode::encode_png(&gradient(64, 64)).expect("png");
    let e = decode::decode(&png[..png.len() / 2], "cut.png", &limits).expect_err("truncated");
    assert!(e.to_string().contains("cannot decode image cut.png"), "{e}");
    // A header claiming 100000 x 100000 pixels (30 GB decoded): refused
    // from the header, before any allocation.
    let mut big = png.clone();
    big[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    big[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let crc = crc32(&big[12..29]);
    big[29..33].copy_from_slice(&crc.to_be_bytes());
    let e = decode::decode(&big, "big.png", &limits).expect_err("too large");
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("big.png is too large"), "{e}");
    let small = DecodeLimits {
        max_file_bytes: 10,
        ..limits
    };
    let e = decode::decode(&png, "f.png", &small).expect_err("file limit");
    assert!(e.to_string().contains("the limit is 10"), "{e}");
    let e = decode::open("/nonexistent/x.png", &limits).expect_err("missing");
    assert!(
        e.to_string().contains("cannot read /nonexistent/x.png"),
        "{e}"
    );
}

#[test]
fn resize_crop_and_normalise() {
    let flat = RgbImage::from_pixel(50, 30, Rgb([10, 200, 90]));
    for f in [Filter::Nearest, Filter::Bilinear, Filter::Bicubic] {
        let r = preprocess::resize(&flat, 17, 23, f).expect("resize");
        assert_eq!(r.dimensions(), (17, 23));
        assert!(r.pixels().all(|p| *p == Rgb([10, 200, 90])), "{f:?}");
    }
    let r = preprocess::resize_shortest_edge(&flat, 60, Filter::Bilinear).expect("resize");
    assert_eq!(r.dimensions(), (100, 60));
    let img = gradient(10, 8);
    let c = preprocess::center_crop(&img, 4, 3).expect("crop");
    assert_eq!(c.get_pixel(0, 0), img.get_pixel(3, 2));
    assert!(preprocess::center_crop(&img, 11, 3).is_err());
    assert!(preprocess::resize(&img, 0, 3, Filter::Bicubic).is_err());
    let t = preprocess::to_tensor(&img, &Normalize::IMAGENET).expect("tensor");
    assert_eq!(t.dims(), &[3, 8, 10]);
    let v = t.to_vec_f32().expect("values");
    let (x, y) = (7usize, 5usize);
    let p = img.get_pixel(x as u32, y as u32);
    let n = Normalize::IMAGENET;
    for (c, (&m, &sd)) in n.mean.iter().zip(&n.std).enumerate() {
        let want = (p[c] as f32 / 255.0 - m) / sd;
        let got = v[c * 80 + y * 10 + x];
        assert!((got - want).abs() < 1e-5, "channel {c}: {got} vs {want}");
    }
    let pre = Preprocess::dinov2(224);
    assert_eq!(pre.resize, Resize::ShortestEdge(256));
    let t = pre.apply(&gradient(320, 240)).expect("apply");
    assert_eq!(t.dims(), &[3, 224, 224]);
    assert_eq!(Filter::parse("bicubic").expect("f"), Filter::Bicubic);
    assert!(Filter::parse("lanczos").is_err());
}

#[test]
fn frames_convert_both_ways_and_bad_frames_are_refused() {
    let img = gradient(5, 4);
    let f = rgb_to_frame(img.clone());
    assert_eq!(frame_to_rgb(&f).expect("rgb"), img);
    let rgba = ImageFrame {
        width: 2,
        height: 1,
        format: PixelFormat::Rgba8,
        data: vec![1, 2, 3, 255, 4, 5, 6, 0],
    };
    assert_eq!(
        frame_to_rgb(&rgba).expect("rgba").into_raw(),
        vec![1, 2, 3, 4, 5, 6]
    );
    let grey = ImageFrame {
        width: 2,
        height: 1,
        format: PixelFormat::Gray8,
        data: vec![7, 9],
    };
    assert_eq!(
        frame_to_rgb(&grey).expect("grey").into_raw(),
        vec![7, 7, 7, 9, 9, 9]
    );
    let bad = ImageFrame {
        data: vec![0; 5],
        ..rgba
    };
    let e = frame_to_rgb(&bad).expect_err("short");
    assert!(e.to_string().contains("carries 5 bytes, expected 8"), "{e}");
}

fn pipeline(dir: &std::path::Path, extra: &str) -> String {
    format!(
        r#"
name: frames-test
stages:
  - {{ id: cam, kind: frames, params: {{ dir: "{}"{extra} }} }}
  - {{ id: out, kind: host_out, params: {{ type: image }} }}
edges:
  - {{ from: cam.out, to: out.in }}
"#,
        dir.display()
    )
}

#[test]
fn frames_source_reads_a_folder_in_name_order() {
    let dir = tempfile::tempdir().expect("tmp");
    for (name, w) in [("b.png", 3u32), ("a.png", 2), ("c.jpg", 4)] {
        gradient(w, 2).save(dir.path().join(name)).expect("save");
    }
    std::fs::write(dir.path().join("notes.txt"), "not an image").expect("txt");
    let running = Pipeline::from_yaml(&pipeline(dir.path(), ", rate_hz: 200"), &registry())
        .expect("pipeline")
        .start()
        .expect("start");
    let mut widths = Vec::new();
    let mut stamps = Vec::new();
    while let Some(m) = running.pull("out", Duration::from_secs(10)).expect("pull") {
        let Payload::Image(f) = &m.payload else {
            panic!("{:?}", m.payload)
        };
        widths.push(f.width);
        stamps.push(m.timestamp);
    }
    assert_eq!(widths, vec![2, 3, 4]);
    // 200 Hz: capture times 5 ms apart (the source's schedule).
    for w in stamps.windows(2) {
        let dt = w[1].0.saturating_sub(w[0].0);
        assert!(dt >= 4_000_000, "{dt} ns between frames");
    }
    running.wait(Some(Duration::from_secs(5))).expect("wait");
}

#[test]
fn frames_source_loops_and_reports_bad_files() {
    let dir = tempfile::tempdir().expect("tmp");
    gradient(2, 2).save(dir.path().join("a.png")).expect("save");
    let running = Pipeline::from_yaml(&pipeline(dir.path(), ", loop: true"), &registry())
        .expect("pipeline")
        .start()
        .expect("start");
    for _ in 0..5 {
        assert!(running
            .pull("out", Duration::from_secs(10))
            .expect("pull")
            .is_some());
    }
    running.stop();
    let _ = running.wait(Some(Duration::from_secs(5)));

    let bad = tempfile::tempdir().expect("tmp");
    std::fs::write(bad.path().join("x.png"), b"\x89PNG\r\n\x1a\n truncated").expect("write");
    let running = Pipeline::from_yaml(&pipeline(bad.path(), ""), &registry())
        .expect("pipeline")
        .start()
        .expect("start");
    let e = running
        .wait(Some(Duration::from_secs(10)))
        .expect_err("bad file");
    assert!(format!("{e:#}").contains("x.png"), "{e:#}");

    let empty = tempfile::tempdir().expect("tmp");
    let e = Pipeline::from_yaml(&pipeline(empty.path(), ""), &registry())
        .and_then(|p| p.start())
        .expect_err("empty folder");
    assert!(format!("{e:#}").contains("holds no .png"), "{e:#}");
}
