//! `timer`: a fixed-rate tick source with deadline-miss counting.

use super::out_port;
use crate::message::{Event, Message, Payload, Timestamp};
use crate::port::PortType;
use crate::registry::{BuildEnv, ParamInfo, ParamType, Params, StageFactory, StageInfo};
use crate::stage::{Poll, Stage, StageCtx, StageError, StageResult};
use std::time::{Duration, Instant};

pub(super) struct TimerKind;

impl StageFactory for TimerKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "timer",
            doc: "Emits a tick event at a fixed rate; counts deadline misses when a tick is late by more than half a period (ticks are never bunched up: missed ones are skipped and counted).",
            params: vec![
                ParamInfo::new("rate_hz", ParamType::Float, 10.0, "ticks per second (0 < rate <= 100000)"),
                ParamInfo::optional("count", ParamType::Int, "stop after this many ticks (default: run until stopped)"),
            ],
            ports: out_port(PortType::Control, "Event::Tick { index, due }"),
            source: true,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let rate: f64 = p.get_or("rate_hz", 10.0)?;
        if !(rate > 0.0 && rate <= 100_000.0) {
            return Err(p
                .error("rate_hz", format!("must be in (0, 100000], got {rate}"))
                .into());
        }
        Ok(Box::new(Timer {
            period: Duration::from_secs_f64(1.0 / rate),
            count: p.opt("count")?,
            next: None,
            index: 0,
        }))
    }
}

struct Timer {
    period: Duration,
    count: Option<u64>,
    next: Option<Instant>,
    index: u64,
}

impl Stage for Timer {
    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        if self.count.is_some_and(|c| self.index >= c) {
            return Ok(Poll::Done);
        }
        let due = *self.next.get_or_insert_with(Instant::now);
        if !ctx.sleep_until(due) {
            return Ok(if ctx.should_stop() {
                Poll::Done
            } else {
                Poll::Idle
            });
        }
        let now = Instant::now();
        let late = now.saturating_duration_since(due);
        if late > self.period / 2 {
            ctx.deadline_missed();
        }
        let msg = Message {
            epoch: ctx.current_epoch(),
            seq: 0,
            timestamp: Timestamp::from_instant(due),
            deadline: Some(Timestamp::from_instant(due + self.period)),
            payload: Payload::event(Event::Tick {
                index: self.index,
                due: Timestamp::from_instant(due),
            }),
        };
        self.index += 1;
        // Skip (and count) whole periods we slept through.
        let mut next = due + self.period;
        while next + self.period / 2 < now {
            next += self.period;
            self.index += 1;
            ctx.deadline_missed();
        }
        self.next = Some(next);
        ctx.emit_msg(0, msg)?;
        Ok(Poll::Continue)
    }
}
