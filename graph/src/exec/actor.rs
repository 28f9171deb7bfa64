//! The body of a stage thread: its input loop, the control lane
//! (cancels, resets down an inline chain) and end of stream.

use super::{panic_message, Actor, Control, Inbox, InlineStage, Item, Shared, Target};
use crate::error::Error;
use crate::message::{Epoch, Timestamp};
use crate::stage::{Input, Poll, Stage, StageCtx, StageError};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

/// Runs one callback of the named stage (this thread's own or one of its
/// inline consumers), turning errors and panics into a pipeline failure
/// that names that stage; false when the stage failed.
type StageCall<'a> =
    dyn Fn(&str, &mut dyn FnMut() -> std::result::Result<(), StageError>) -> bool + 'a;

/// The body of a stage thread.
pub(super) fn run_actor(actor: Actor, inbox: Arc<Inbox>, shared: Arc<Shared>, source: bool) {
    let Actor {
        mut stage,
        mut ctx,
        downstream,
    } = actor;
    let id = ctx.id.to_string();
    let call = |stage: &str, f: &mut dyn FnMut() -> std::result::Result<(), StageError>| -> bool {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) | Ok(Err(StageError::Cancelled)) => true,
            Ok(Err(StageError::Failed(e))) => {
                shared.fail(Error::StageFailed {
                    stage: stage.to_string(),
                    msg: e.to_string(),
                });
                false
            }
            Err(p) => {
                shared.fail(Error::StagePanicked {
                    stage: stage.to_string(),
                    msg: panic_message(&p),
                });
                false
            }
        }
    };
    // Inline consumers start first, on this thread, as their own threads
    // would before their first message (and before this stage can emit).
    let mut ok = downstream
        .iter()
        .filter_map(|t| t.inline.as_ref())
        .all(|inl| start_inline(inl, &call))
        && call(&id, &mut || stage.start(&mut ctx));
    while ok {
        if source {
            // Control first, then one poll.
            match inbox.pop(&shared, false) {
                Some(Item::Control(c)) => {
                    ok = handle_control(c, &mut *stage, &mut ctx, &downstream, &call);
                    continue;
                }
                Some(Item::Stop) => break,
                _ => {}
            }
            ctx.timestamp = None;
            ctx.deadline = None;
            ctx.epoch = shared.current_epoch();
            let t0 = Instant::now();
            // A poll whose emit was refused because its epoch was cancelled
            // returns `Cancelled` (which `call` counts as fine): nothing
            // went out, and the source goes on (Idle), not to its end.
            let mut res = Poll::Idle;
            ok = call(&id, &mut || {
                res = stage.poll(&mut ctx)?;
                Ok(())
            });
            if res == Poll::Continue {
                ctx.metrics.processed(t0.elapsed());
            }
            if !ok || res == Poll::Done || shared.is_stopping() {
                break;
            }
            continue;
        }
        match inbox.pop(&shared, true) {
            Some(Item::Control(c)) => {
                ok = handle_control(c, &mut *stage, &mut ctx, &downstream, &call)
            }
            Some(Item::Msg(port, msg)) => {
                ctx.epoch = msg.epoch;
                ctx.timestamp = Some(msg.timestamp);
                ctx.deadline = msg.deadline;
                if let Some(d) = msg.deadline {
                    if Timestamp::now() > d {
                        ctx.metrics.deadline_missed();
                    }
                }
                let t0 = Instant::now();
                let mut input = Some(Input { port, msg });
                ok = call(&id, &mut || match input.take() {
                    Some(inp) => stage.process(inp, &mut ctx),
                    None => Ok(()),
                });
                ctx.metrics.processed(t0.elapsed());
            }
            Some(Item::EndOfStream) => {
                ctx.timestamp = None;
                let _ = call(&id, &mut || stage.finish(&mut ctx));
                break;
            }
            Some(Item::Stop) | None => break,
        }
    }
    // Inline consumers finish with their producer (recursively).
    for t in &downstream {
        if let Some(inl) = &t.inline {
            finish_inline(inl, &call);
        }
    }
    inbox.kill();
    for t in &downstream {
        if t.inline.is_none() {
            t.inbox.close_edge(t.edge);
        }
    }
}

/// Start an inline stage: its own inline consumers first, then its
/// `start`. False when one of them failed.
fn start_inline(inl: &InlineStage, call: &StageCall<'_>) -> bool {
    let mut g = inl.actor.lock();
    let Actor {
        stage,
        ctx,
        downstream,
    } = &mut *g;
    let started = downstream
        .iter()
        .filter_map(|t| t.inline.as_ref())
        .all(|next| start_inline(next, call));
    let id = ctx.id.clone();
    started && call(&id, &mut || stage.start(ctx))
}

/// End an inline stage: `finish`, then its own inline consumers, then close
/// its queued edges so end-of-stream travels on.
fn finish_inline(inl: &InlineStage, call: &StageCall<'_>) {
    let mut g = inl.actor.lock();
    let Actor {
        stage,
        ctx,
        downstream,
    } = &mut *g;
    ctx.timestamp = None;
    let id = ctx.id.clone();
    let _ = call(&id, &mut || stage.finish(ctx));
    for t in downstream.iter() {
        match &t.inline {
            Some(next) => finish_inline(next, call),
            None => t.inbox.close_edge(t.edge),
        }
    }
}

fn reset_inline(downstream: &[Target], epoch: Epoch, call: &StageCall<'_>) {
    for t in downstream {
        if let Some(inl) = &t.inline {
            let mut g = inl.actor.lock();
            let Actor {
                stage,
                ctx,
                downstream,
            } = &mut *g;
            let id = ctx.id.clone();
            let _ = call(&id, &mut || stage.reset(epoch, ctx));
            reset_inline(downstream, epoch, call);
        }
    }
}

fn handle_control(
    c: Control,
    stage: &mut dyn Stage,
    ctx: &mut StageCtx,
    downstream: &[Target],
    call: &StageCall<'_>,
) -> bool {
    match c {
        Control::Cancel(epoch, ack) => {
            let id = ctx.id.clone();
            let ok = call(&id, &mut || stage.reset(epoch, ctx));
            // Inline consumers reset with their producer.
            reset_inline(downstream, epoch, call);
            ack.ack();
            ok
        }
    }
}
