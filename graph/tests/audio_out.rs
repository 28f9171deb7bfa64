//! `AudioOut` in a running pipeline: chunks go out as audio, and each
//! utterance records its time to first audio, real-time factor and length.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use edgeflow_graph::{
    AudioOut, BuildEnv, Input, Params, PipelineBuilder, PortSpec, PortType, Ports, Registry, Stage,
    StageCtx, StageError, StageFactory, StageInfo, StageResult,
};
use serde_json::json;
use std::sync::{Arc, Mutex};

const RATE: u32 = 16_000;

/// Each text line `n` is an utterance of `n` chunks of 160 samples (10 ms),
/// made 2 ms apart.
struct Synth {
    out: AudioOut,
}

impl Stage for Synth {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let n: usize = input.msg.payload.as_text().unwrap().trim().parse().unwrap();
        self.out.start_utterance(input.msg.timestamp);
        self.out.stream(ctx, |sink| -> Result<(), StageError> {
            for i in 0..n {
                std::thread::sleep(std::time::Duration::from_millis(2));
                if !sink(vec![i as f32 / 100.0; 160])? {
                    break;
                }
            }
            Ok(())
        })?;
        assert!(self.out.end_utterance(ctx) == (n > 0));
        Ok(())
    }
}

/// Adds up the audio it receives.
struct Count(Arc<Mutex<(usize, usize)>>);

impl Stage for Count {
    fn process(&mut self, input: Input, _ctx: &mut StageCtx) -> StageResult {
        let a = input.msg.payload.as_audio().unwrap();
        assert_eq!((a.sample_rate, a.channels), (RATE, 1));
        let mut c = self.0.lock().unwrap();
        c.0 += 1;
        c.1 += a.samples.len();
        Ok(())
    }
}

struct Kind {
    name: &'static str,
    ports: Ports,
    build: Box<dyn Fn() -> Box<dyn Stage> + Send + Sync>,
}

impl StageFactory for Kind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: self.name,
            doc: "test stage",
            params: vec![],
            ports: self.ports.clone(),
            source: false,
        }
    }
    fn build(&self, _p: &Params, _e: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Ok((self.build)())
    }
}

#[test]
fn utterances_stream_out_and_record_first_audio_rtf_and_length() {
    let got = Arc::new(Mutex::new((0usize, 0usize)));
    let mut r = Registry::builtin();
    r.register(Kind {
        name: "synth",
        ports: Ports {
            inputs: vec![PortSpec::new("in", PortType::Text, "")],
            outputs: vec![PortSpec::new("out", PortType::audio_at(RATE), "")],
        },
        build: Box::new(|| {
            Box::new(Synth {
                out: AudioOut::new(0, RATE),
            })
        }),
    });
    let g = got.clone();
    r.register(Kind {
        name: "count",
        ports: Ports {
            inputs: vec![PortSpec::new("in", PortType::AUDIO_ANY, "")],
            outputs: vec![],
        },
        build: Box::new(move || Box::new(Count(g.clone()))),
    });
    let p = PipelineBuilder::new("audio-out")
        .stage("t", "text", json!({ "whole": false, "text": "3\n0\n5" }))
        .stage("s", "synth", json!({}))
        .stage("c", "count", json!({}))
        .edge("t.out", "s.in")
        .edge("s.out", "c.in")
        .build(&r)
        .unwrap();
    let m = p.run(None).unwrap();
    assert_eq!(*got.lock().unwrap(), (8, 8 * 160));
    let v = &m.stages.iter().find(|s| s.id == "s").unwrap().values;
    // Two utterances made audio; the empty one recorded nothing.
    assert_eq!(v["time_to_first_audio_ms"].count, 2);
    assert!(v["time_to_first_audio_ms"].min >= 2.0);
    assert_eq!(v["audio_s"].count, 2);
    assert!((v["audio_s"].min - 0.03).abs() < 1e-9 && (v["audio_s"].max - 0.05).abs() < 1e-9);
    // At least 2 ms of compute per 10 ms chunk.
    assert!(v["rtf"].min >= 0.2, "{:?}", v["rtf"]);
}
