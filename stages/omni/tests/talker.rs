//! The codec talker against `transformers`' Qwen2.5-Omni talker on a small
//! random-initialised configuration (fixture from
//! scripts/omni_talker_reference.py: 2 layers, hidden 48, embedding 40,
//! 4 query / 2 key-value heads of size 16, codec vocabulary 64).

use edgeflow_nn::VarBuilder;
use edgeflow_omni::talker::{
    process_logits, weight_shapes, Config, Talker, TalkerInput, TalkerSampling,
};
use edgeflow_omni::Error;
use edgeflow_runtime::weights::{SafetensorsFile, WeightReader};
use edgeflow_runtime::{Device, DeviceSpec, Tensor};
use std::path::PathBuf;

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/talker.safetensors")
}

fn file() -> SafetensorsFile {
    SafetensorsFile::open(path()).expect("fixture")
}

fn get(name: &str) -> Tensor {
    file().load(name).expect(name)
}

fn vec(name: &str) -> Vec<f32> {
    get(name).to_vec_f32().expect("f32")
}

fn cpu() -> Device {
    edgeflow_backends::open(DeviceSpec::Cpu).expect("cpu")
}

fn config() -> Config {
    let f = file();
    let json = f.metadata().expect("metadata")["config"].clone();
    Config::from_json(&json).expect("config")
}

fn talker() -> Talker {
    let vb = VarBuilder::open(&[path()], &cpu()).expect("open");
    Talker::load(&vb.pp("talker"), &config()).expect("load")
}

fn input() -> TalkerInput {
    TalkerInput {
        prompt: get("prompt"),
        text_bos: get("text_bos"),
        reply: get("reply"),
        text_eos: get("text_eos"),
        text_pad: get("text_pad"),
    }
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn greedy16() -> TalkerSampling {
    TalkerSampling {
        max_new_tokens: 16,
        ..TalkerSampling::greedy()
    }
}

#[test]
fn steps_on_the_kv_cache_match_transformers() {
    let mut t = talker();
    let mut pos = 0;
    for k in 0..4 {
        let x = get(&format!("step_in_{k}"));
        pos += x.dims()[1];
        let got = t.step(&x).expect("step");
        let want = vec(&format!("step_logits_{k}"));
        let d = max_abs(&got, &want);
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        eprintln!(
            "step {k} ({} rows): max |diff| {d:e}, max |logit| {scale}",
            x.dims()[1]
        );
        // f32 on both sides, the same operations summed in other orders
        // (torch's GEMMs, our kernels): measured 1.7e-6..3.0e-6 on logits
        // up to ~5 (a few ulps through two layers). 2e-5 leaves margin
        // for other kernels and still fails on any real error (a wrong
        // position, bias or norm moves logits by > 1e-2).
        assert!(d < 2e-5, "step {k}: max |diff| {d}");
        assert_eq!(t.position(), pos);
    }
    t.reset();
    assert_eq!(t.position(), 0);
    let again = t.step(&get("step_in_0")).expect("step");
    assert_eq!(again, {
        let mut u = talker();
        u.step(&get("step_in_0")).expect("step")
    });
}

#[test]
fn greedy_codes_match_transformers_generate() {
    let mut t = talker();
    let want: Vec<u32> = vec("greedy_codes").iter().map(|&c| c as u32).collect();
    let want_logits = vec("greedy_logits");
    let vocab = t.config().vocab_size;
    let mut s = t.start(&input(), greedy16()).expect("start");
    let mut worst = 0f32;
    let mut k = 0;
    while let Some(code) = s.next_code().expect("code") {
        let d = max_abs(s.logits(), &want_logits[k * vocab..(k + 1) * vocab]);
        worst = worst.max(d);
        k += 1;
        assert!(
            k <= want.len(),
            "more codes than the reference: {:?}",
            s.codes()
        );
        assert_eq!(code, want[k - 1], "code {k}");
    }
    eprintln!(
        "greedy codes {:?}; raw logits max |diff| {worst:e}",
        s.codes()
    );
    assert_eq!(s.codes(), &want[..]);
    assert!(
        !s.finished(),
        "16 codes, no stop token: max_new_tokens ended it"
    );
    // Same tolerance and reason as the step test (measured 3.9e-6 over
    // the 16 steps, positions up to 23).
    assert!(worst < 2e-5, "generation logits max |diff| {worst}");
    // The talker's own loop gives the same codes, one callback each.
    let mut streamed = Vec::new();
    let codes = t
        .generate(&input(), greedy16(), || false, |c| streamed.push(c))
        .expect("generate");
    assert_eq!((codes, streamed), (want.clone(), want));
}

#[test]
fn a_stop_token_ends_generation_without_being_returned() {
    let want: Vec<u32> = vec("greedy_codes").iter().map(|&c| c as u32).collect();
    // Any code works as a stop token for the test: it only ends the run.
    let stop = want[9];
    let first = want.iter().position(|&c| c == stop).expect("present");
    let mut t = talker();
    let params = TalkerSampling {
        stop_tokens: Some(vec![stop]),
        ..greedy16()
    };
    let mut s = t.start(&input(), params).expect("start");
    while s.next_code().expect("code").is_some() {}
    assert!(s.finished());
    assert_eq!(s.codes(), &want[..first]);
    assert_eq!(s.next_code().expect("after the end"), None);
}

#[test]
fn sampling_filters_match_transformers_processors() {
    let cfg = config();
    let vocab = cfg.vocab_size;
    let mut l = vec("greedy_logits")[..vocab].to_vec();
    // The first step's history: the prompt's six mask ids, pad, bos.
    let mut history = vec![cfg.tts_codec_mask_token_id; 6];
    history.extend([cfg.tts_codec_pad_token_id, cfg.tts_codec_start_token_id]);
    process_logits(
        &mut l,
        &history,
        &[cfg.tts_codec_start_token_id],
        &TalkerSampling::default(),
    );
    let want = vec("filtered");
    let mut kept = 0;
    for (i, (g, w)) in l.iter().zip(&want).enumerate() {
        assert_eq!(g.is_finite(), w.is_finite(), "code {i}: {g} vs {w}");
        if w.is_finite() {
            kept += 1;
            // Same f32 divisions as torch: exact up to one rounding.
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                "code {i}: {g} vs {w}"
            );
        }
    }
    eprintln!("filters keep {kept} of {vocab} codes, as transformers");
    assert!(
        kept > 1 && kept < 40,
        "the test should exercise top-p: {kept}"
    );
}

#[test]
fn sampling_is_seeded_and_draws_only_kept_codes() {
    let cfg = config();
    let run = |seed| {
        let mut t = talker();
        let params = TalkerSampling {
            max_new_tokens: 12,
            seed,
            stop_tokens: Some(vec![]),
            ..Default::default()
        };
        let mut s = t.start(&input(), params.clone()).expect("start");
        let mut out = Vec::new();
        let mut history = vec![cfg.tts_codec_mask_token_id; 6];
        history.extend([cfg.tts_codec_pad_token_id, cfg.tts_codec_start_token_id]);
        while let Some(c) = s.next_code().expect("code") {
            let mut l = s.logits().to_vec();
            process_logits(&mut l, &history, &[cfg.tts_codec_start_token_id], &params);
            assert!(l[c as usize].is_finite(), "drew filtered-out code {c}");
            history.push(c);
            out.push(c);
        }
        out
    };
    let a = run(7);
    assert_eq!(a.len(), 12);
    assert_eq!(a, run(7));
    assert!(
        !a.contains(&cfg.tts_codec_start_token_id),
        "bos is suppressed"
    );
}

#[test]
fn cancel_stops_within_one_token() {
    let mut t = talker();
    let mut seen = Vec::new();
    let mut checks = 0;
    let r = t.generate(
        &input(),
        greedy16(),
        || {
            checks += 1;
            checks > 3
        },
        |c| seen.push(c),
    );
    match r {
        Err(Error::Cancelled { steps, total }) => assert_eq!((steps, total), (3, 16)),
        other => panic!("expected a cancel, got {other:?}"),
    }
    assert_eq!(seen.len(), 3);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let mut t = talker();
    let e = t.config().embedding_size;
    let msg = |r: Result<Vec<f32>, Error>| r.expect_err("must fail").to_string();
    let wide = Tensor::zeros(&[1, 2, e + 1]).expect("t");
    assert!(msg(t.step(&wide)).contains("embedding_size"));
    let empty = Tensor::zeros(&[1, 0, e]).expect("t");
    assert!(t.step(&empty).is_err());
    let long = Tensor::zeros(&[1, t.config().max_position_embeddings + 1, e]).expect("t");
    assert!(msg(t.step(&long)).contains("max_position_embeddings"));
    assert_eq!(t.position(), 0);
    assert!(t.embed_codes(&[64]).is_err());
    assert!(t.embed_codes(&[]).is_err());
    let mut bad = input();
    bad.text_bos = get("reply");
    let err = t.start(&bad, greedy16()).expect_err("two-row text_bos");
    assert!(err.to_string().contains("text_bos"), "{err}");
    for p in [
        TalkerSampling {
            temperature: 0.0,
            ..Default::default()
        },
        TalkerSampling {
            top_p: 0.0,
            ..Default::default()
        },
        TalkerSampling {
            repetition_penalty: -1.0,
            ..Default::default()
        },
        TalkerSampling {
            max_new_tokens: 0,
            ..Default::default()
        },
    ] {
        assert!(t.start(&input(), p).is_err());
    }
    // Configurations the talker cannot run.
    let base = config();
    let sliding = Config {
        use_sliding_window: true,
        max_window_layers: 1,
        ..base.clone()
    };
    assert!(sliding
        .check()
        .expect_err("sliding")
        .to_string()
        .contains("sliding-window"));
    let types = Config {
        layer_types: Some(vec!["full_attention".into(), "sliding_attention".into()]),
        ..base.clone()
    };
    assert!(types.check().is_err());
    let mut mrope = base.clone();
    if let Some(rs) = mrope.rope_scaling.as_mut() {
        rs.mrope_section = Some(vec![2, 3, 4]);
    }
    assert!(mrope
        .check()
        .expect_err("mrope")
        .to_string()
        .contains("mrope_section"));
    let heads = Config {
        num_key_value_heads: Some(3),
        ..base.clone()
    };
    assert!(heads.check().is_err());
    let token = Config {
        tts_codec_mask_token_id: 64,
        ..base.clone()
    };
    assert!(token.check().is_err());
    assert!(Config::from_json("{not json").is_err());
    // A checkpoint whose shapes do not fit the config names the tensor.
    let vb = VarBuilder::open(&[path()], &cpu()).expect("open");
    let wrong = Config {
        intermediate_size: 80,
        ..base
    };
    let err = Talker::load(&vb.pp("talker"), &wrong).expect_err("shape");
    assert!(
        err.to_string()
            .contains("talker.model.layers.0.mlp.gate_proj.weight"),
        "{err}"
    );
}

#[test]
fn config_defaults_and_weight_shapes_are_upstreams() {
    let d = Config::default();
    assert_eq!(
        (
            d.vocab_size,
            d.embedding_size,
            d.hidden_size,
            d.head_dim,
            d.kv_heads()
        ),
        (8448, 3584, 3584, 128, 4)
    );
    assert_eq!(d.stop_tokens(), vec![8292, 8294]);
    d.check().expect("defaults are valid");
    // A whole Qwen2.5-Omni config.json: its talker_config is read.
    let whole = r#"{"architectures": ["Qwen2_5OmniModel"], "talker_config": {"hidden_size": 896,
        "num_attention_heads": 12, "num_hidden_layers": 24, "rope_scaling":
        {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"}}}"#;
    let c = Config::from_json(whole).expect("whole config");
    assert_eq!(
        (c.hidden_size, c.num_attention_heads, c.head_dim),
        (896, 12, 128)
    );
    // Every listed tensor is in the fixture with that shape, and nothing else is.
    let cfg = config();
    let f = file();
    let shapes = weight_shapes(&cfg);
    for (name, dims) in &shapes {
        let full = format!("talker.{name}");
        assert_eq!(f.load(&full).expect(&full).dims(), &dims[..], "{full}");
    }
    let in_file = f
        .names()
        .iter()
        .filter(|n| n.starts_with("talker."))
        .count();
    assert_eq!(in_file, shapes.len());
}
