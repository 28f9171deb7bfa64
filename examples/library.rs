//! Using edgeflow as a library: register your own stage kind, build a
//! pipeline from YAML and another in code, push into and pull from named
//! ports, cancel an epoch (a barge-in) and join.
//!
//! Run: `cargo run -p edgeflow --example library`

use edgeflow::graph::{
    BuildEnv, Input, ParamInfo, ParamType, Params, PortSpec, PortType, Ports, Stage, StageCtx,
    StageError, StageFactory, StageInfo, StageResult,
};
use edgeflow::{Payload, Pipeline, PipelineBuilder};
use std::time::Duration;

/// Large allocations (a model's weights) fault in on 2 MB pages, as in the
/// `edgeflow` CLI.
#[global_allocator]
static ALLOC: edgeflow::HugePageAlloc = edgeflow::HugePageAlloc;

/// A stage kind of our own: upper-cases text, optionally slowly, word by word
/// (like a talker streaming a reply), and stops mid-reply when cancelled.
struct Shout;

impl StageFactory for Shout {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "shout",
            doc: "Upper-cases text, emitting one word at a time.",
            params: vec![ParamInfo::new(
                "word_ms",
                ParamType::Int,
                0,
                "pause after each word, in milliseconds",
            )],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Text, "text")],
                outputs: vec![PortSpec::new("out", PortType::Text, "upper-cased words")],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        Ok(Box::new(ShoutStage {
            pause: Duration::from_millis(p.get_or("word_ms", 0u64)?),
        }))
    }
}

struct ShoutStage {
    pause: Duration,
}

impl Stage for ShoutStage {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let text = input.msg.payload.as_text().unwrap_or_default().to_string();
        for word in text.split_whitespace() {
            ctx.check()?; // returns Cancelled if this turn was cancelled
            ctx.emit(0, Payload::text(word.to_uppercase()))?;
            ctx.sleep(self.pause);
        }
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let mut registry = edgeflow::registry();
    registry.register(Shout);

    // 1. From YAML: push in, pull out.
    let yaml = r#"
name: shout
stages:
  - { id: in, kind: host_in, params: { type: text } }
  - { id: shout, kind: shout }
  - { id: out, kind: host_out, params: { type: text } }
edges:
  - { from: in.out, to: shout.in }
  - { from: shout.out, to: out.in, capacity: 16 }
"#;
    let mut running = Pipeline::from_yaml(yaml, &registry)?.start()?;
    running.push("in", Payload::text("hello edge world"))?;
    let mut words = Vec::new();
    for _ in 0..3 {
        let m = running
            .pull("out", Duration::from_secs(5))?
            .ok_or_else(|| anyhow::anyhow!("stream ended early"))?;
        words.push(m.payload.as_text().unwrap_or_default().to_string());
    }
    println!("yaml pipeline: {}", words.join(" "));
    anyhow::ensure!(words == ["HELLO", "EDGE", "WORLD"]);
    running.close_input("in")?;
    let metrics = running.wait(Some(Duration::from_secs(5)))?;
    println!("{}", metrics.summary());

    // 2. Built in code, with a slow talker: interrupt the turn mid-reply.
    let running = PipelineBuilder::new("barge-in")
        .stage("in", "host_in", serde_json::json!({ "type": "text" }))
        .stage("talker", "shout", serde_json::json!({ "word_ms": 20 }))
        .stage("out", "host_out", serde_json::json!({ "type": "text" }))
        .edge("in.out", "talker.in")
        .edge("talker.out", "out.in")
        .build(&registry)?
        .start()?;
    let turn = running.current_epoch();
    running.push(
        "in",
        Payload::text("a very long answer that nobody wants to hear"),
    )?;
    let first = running.pull("out", Duration::from_secs(5))?;
    println!("talker started: {:?}", first.map(|m| m.payload));
    let report = running.cancel(turn, Duration::from_secs(2))?;
    println!(
        "cancelled turn {}: {} of {} stages acknowledged in {:.2} ms",
        report.epoch,
        report.acked,
        report.stages,
        report.ack_ms.unwrap_or(f64::NAN)
    );
    let next = running.new_epoch();
    running.push("in", Payload::text("yes?"))?;
    // After the acknowledged cancel no word of the old turn may arrive: the
    // next message is the new turn's.
    let m = running
        .pull("out", Duration::from_secs(5))?
        .ok_or_else(|| anyhow::anyhow!("stream ended early"))?;
    anyhow::ensure!(
        m.epoch == next,
        "a word of the cancelled turn arrived after the ack: {m:?}"
    );
    println!("new turn {next}: {:?}", m.payload);
    running.stop();
    let _ = running.wait(Some(Duration::from_secs(5)));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn example_runs() {
        super::main().unwrap();
    }
}
