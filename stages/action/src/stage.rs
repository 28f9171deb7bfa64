//! The `action_head` stage: keeps the newest vision tokens, instruction
//! embedding and robot state, and on each `chunk_request` from the
//! controller samples a chunk of H pusher targets starting at the
//! requested step (real-time chunking per `rtc`).

use crate::policy::{Observation, Policy, RtcMode};
use crate::Error;
use edgeflow_graph::{
    ActionChunk, BuildEnv, Event, Input, Message, ParamInfo, ParamType, Params, Payload, PortSpec,
    PortType, Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult, Timestamp,
};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The `action_head` kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct ActionHeadKind;

impl StageFactory for ActionHeadKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "action_head",
            doc: "Flow-matching action head (a small pi0-style action expert): on each `chunk_request` {step, last_delay, prefix} it denoises H actions in `steps` Euler steps from the newest vision tokens, instruction embedding and robot state, and emits the chunk starting at `step`. With `rtc: prefix` the first min(last_delay, len(prefix)) actions are frozen to the queued prefix and the rest inpainted (real-time chunking); `rtc: none` samples every chunk afresh. Records `head_ms`, `frozen_actions`.",
            params: vec![
                ParamInfo::required("model", ParamType::InputPath, "checkpoint written by `edgeflow train policy` (safetensors, config in its metadata)"),
                ParamInfo::new("ensemble", ParamType::Any, Value::Array(Vec::new()), "more checkpoints run with `model` as one ensemble (a list of paths): heads trained on the same data, whose chunks are averaged at every Euler step"),
                ParamInfo::new("steps", ParamType::Int, 10, "Euler steps of the flow ODE (1..=1000)"),
                ParamInfo::new("rtc", ParamType::String, "prefix", "real-time chunking: `prefix` (freeze the executing prefix, inpaint the rest) or `none` (naive chunk switching)"),
                ParamInfo::new("seed", ParamType::Int, 0, "seed of the sampling noise"),
                ParamInfo::new("temperature", ParamType::Float, 1.0, "scale of the starting noise: 1 samples the trained distribution, 0 gives one deterministic chunk per observation"),
                ParamInfo::new("delay", ParamType::Duration, 0.0, "injected inference delay: extra time before each chunk is emitted, on top of the compute (evaluation of delay robustness, e.g. 40ms = 2 periods at 50 Hz)"),
            ],
            ports: Ports {
                inputs: vec![
                    PortSpec::new("vision", PortType::Tensor, "vision tokens [T_v, 384] (CLS + patch grid; give the edge `policy: latest`)"),
                    PortSpec::new("instruction", PortType::Tensor, "instruction embedding [384]"),
                    PortSpec::new("state", PortType::Tensor, "robot state [x, y, vx, vy]"),
                    PortSpec::new("request", PortType::Control, "chunk_request events {step, last_delay, prefix} from the controller"),
                ],
                outputs: vec![PortSpec::new("actions", PortType::Actions, "chunks of H pusher position targets [x, y], metres, from the requested step")],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        let path = p.path("model", env)?.ok_or_else(|| {
            p.error(
                "model",
                "is required: a checkpoint from `edgeflow train policy`",
            )
        })?;
        let steps: usize = p.get_or("steps", 10)?;
        if !(1..=1000).contains(&steps) {
            return Err(p
                .error("steps", format!("must be in 1..=1000, got {steps}"))
                .into());
        }
        let rtc_s: String = p.get_or("rtc", "prefix".to_string())?;
        let rtc: RtcMode = rtc_s
            .parse()
            .map_err(|e: Error| p.error("rtc", e.to_string()))?;
        let seed: u64 = p.get_or("seed", 0)?;
        let delay = p.duration("delay")?.unwrap_or_default();
        let dev = env.open_device()?;
        let temperature: f64 = p.get_or("temperature", 1.0)?;
        if !(0.0..=2.0).contains(&temperature) {
            return Err(p
                .error(
                    "temperature",
                    format!("must be in 0..=2, got {temperature}"),
                )
                .into());
        }
        let more: Vec<String> = p.get_or("ensemble", Vec::new())?;
        if more.len() > 15 {
            return Err(p
                .error(
                    "ensemble",
                    format!("has {} checkpoints; at most 15", more.len()),
                )
                .into());
        }
        let paths: Vec<std::path::PathBuf> = std::iter::once(path.clone())
            .chain(more.iter().map(|m| env.resolve(m)))
            .collect();
        for m in &paths[1..] {
            if !m.is_file() {
                return Err(p
                    .error(
                        "ensemble",
                        format!("names {}, which is not a file", m.display()),
                    )
                    .into());
            }
        }
        let mut policy = Policy::load_ensemble(&paths, &dev, steps, rtc, seed)?;
        if policy.config().privileged {
            return Err(p
                .error(
                    "model",
                    format!(
                        "{} is a privileged diagnostic head: it reads the simulator's true state, \
                         which no camera or robot gives; evaluate it with `edgeflow eval policy \
                         --checkpoint {}` and train a vision head for pipelines",
                        path.display(),
                        path.display()
                    ),
                )
                .into());
        }
        policy.temperature = temperature as f32;
        let dt = Duration::from_secs_f64(1.0 / policy.config().control_hz);
        Ok(Box::new(ActionHeadStage {
            policy,
            dev,
            dt,
            delay,
            vision: None,
            instruction: None,
            state: None,
        }))
    }
}

/// The `action_head` stage.
#[derive(Debug)]
pub struct ActionHeadStage {
    policy: Policy,
    dev: edgeflow_runtime::Device,
    dt: Duration,
    delay: Duration,
    vision: Option<(Vec<f32>, Timestamp)>,
    instruction: Option<Vec<f32>>,
    state: Option<Vec<f32>>,
}

/// A parsed `chunk_request`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkRequest {
    /// First step of the chunk to emit.
    pub step: u64,
    /// The controller's last measured inference delay, periods.
    pub last_delay: Option<usize>,
    /// Actions queued for `step`, `step + 1`, ..., flattened.
    pub prefix: Vec<f32>,
}

impl ChunkRequest {
    /// Parse `{"step": S, "last_delay": d | null, "prefix": [[x, y], ...]}`
    /// (`last_delay` and `prefix` may be absent).
    pub fn parse(v: &Value, dim: usize) -> Result<Self, Error> {
        let bad = |m: String| Error::BadInput(format!("chunk_request {v}: {m}"));
        let step = v
            .get("step")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("needs a non-negative integer `step`".into()))?;
        let last_delay = match v.get("last_delay") {
            None | Some(Value::Null) => None,
            Some(d) => {
                let f = d
                    .as_f64()
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .ok_or_else(|| {
                        bad("`last_delay` must be a non-negative number or null".into())
                    })?;
                Some(f.round().min(1e6) as usize)
            }
        };
        let mut prefix = Vec::new();
        match v.get("prefix") {
            None | Some(Value::Null) => {}
            Some(Value::Array(rows)) => {
                for (i, r) in rows.iter().enumerate() {
                    let row = r.as_array().filter(|a| a.len() == dim).ok_or_else(|| {
                        bad(format!("prefix row {i} is not a list of {dim} numbers"))
                    })?;
                    for x in row {
                        let f = x
                            .as_f64()
                            .filter(|f| f.is_finite())
                            .ok_or_else(|| bad(format!("prefix row {i} holds a non-number")))?;
                        prefix.push(f as f32);
                    }
                }
            }
            Some(_) => return Err(bad("`prefix` must be a list of [x, y] rows".into())),
        }
        Ok(ChunkRequest {
            step,
            last_delay,
            prefix,
        })
    }
}

fn tensor_values(input: &Input) -> Option<Vec<f32>> {
    match &input.msg.payload {
        Payload::Tensor(t) => t.to_vec_f32().ok(),
        _ => None,
    }
}

impl Stage for ActionHeadStage {
    fn start(&mut self, ctx: &mut StageCtx) -> StageResult {
        ctx.attach_device(self.dev.stats().clone());
        Ok(())
    }

    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        match input.port {
            0..=2 => {
                let Some(v) = tensor_values(&input) else {
                    ctx.record("bad_inputs", 1.0);
                    eprintln!(
                        "action_head `{}`: input {} is not an f32 tensor; ignored",
                        ctx.id(),
                        ["vision", "instruction", "state"][input.port]
                    );
                    return Ok(());
                };
                match input.port {
                    0 => self.vision = Some((v, input.msg.timestamp)),
                    1 => self.instruction = Some(v),
                    _ => self.state = Some(v),
                }
                Ok(())
            }
            _ => {
                let Some(Event::Named(name, v)) = input.msg.payload.as_event() else {
                    return Ok(());
                };
                if name != "chunk_request" {
                    return Ok(());
                }
                let req = match ChunkRequest::parse(v, self.policy.config().action_dim) {
                    Ok(r) => r,
                    Err(e) => {
                        ctx.record("bad_requests", 1.0);
                        eprintln!("action_head `{}`: {e}; ignored", ctx.id());
                        return Ok(());
                    }
                };
                let (Some((vision, captured)), Some(instruction), Some(state)) =
                    (&self.vision, &self.instruction, &self.state)
                else {
                    ctx.record("requests_without_obs", 1.0);
                    return Ok(());
                };
                let obs = Observation {
                    vision: vision.clone(),
                    instruction: instruction.clone(),
                    state: state.clone(),
                };
                let captured = *captured;
                let t0 = Instant::now();
                let chunk = {
                    let c = &*ctx;
                    self.policy
                        .chunk(&obs, &req.prefix, req.last_delay.unwrap_or(0), || {
                            c.is_cancelled()
                        })
                };
                let chunk = match chunk {
                    Ok(c) => c,
                    Err(Error::Cancelled) => return Err(StageError::Cancelled),
                    Err(Error::BadInput(m)) => {
                        ctx.record("bad_inputs", 1.0);
                        eprintln!(
                            "action_head `{}`: {m}; no chunk for step {}",
                            ctx.id(),
                            req.step
                        );
                        return Ok(());
                    }
                    Err(e) => return Err(e.into()),
                };
                ctx.record("head_ms", t0.elapsed().as_secs_f64() * 1e3);
                ctx.record("frozen_actions", chunk.frozen as f64);
                if !self.delay.is_zero() && !ctx.sleep(self.delay) {
                    return Err(StageError::Cancelled);
                }
                ctx.emit_msg(
                    0,
                    Message {
                        epoch: ctx.epoch(),
                        seq: 0,
                        timestamp: captured,
                        deadline: None,
                        payload: Payload::Actions(Arc::new(ActionChunk {
                            start_step: req.step,
                            dt: self.dt,
                            dim: self.policy.config().action_dim,
                            actions: chunk.actions,
                        })),
                    },
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_parse_and_bad_ones_say_why() {
        let r = ChunkRequest::parse(
            &json!({"step": 40, "last_delay": 3, "prefix": [[0.1, 0.2], [0.3, 0.4]]}),
            2,
        )
        .expect("ok");
        assert_eq!(r.step, 40);
        assert_eq!(r.last_delay, Some(3));
        assert_eq!(r.prefix, vec![0.1, 0.2, 0.3, 0.4]);
        let r = ChunkRequest::parse(&json!({"step": 0, "last_delay": null}), 2).expect("ok");
        assert_eq!((r.last_delay, r.prefix.len()), (None, 0));
        for bad in [
            json!({"last_delay": 1}),
            json!({"step": -1}),
            json!({"step": 1, "last_delay": "x"}),
            json!({"step": 1, "prefix": [[0.1]]}),
            json!({"step": 1, "prefix": [[0.1, "a"]]}),
            json!({"step": 1, "prefix": 3}),
        ] {
            let e = ChunkRequest::parse(&bad, 2).expect_err("bad");
            assert!(e.to_string().contains("chunk_request"), "{e}");
        }
    }
}
