//! `frames`: a source that reads a folder of PNG / JPEG images, in name
//! order, and emits each as a [`Payload::Image`] stamped with its capture
//! time.

use crate::decode::{open, DecodeLimits};
use crate::frame::rgb_to_frame;
use crate::{Error, Result};
use edgeflow_graph::{
    BuildEnv, Message, ParamInfo, ParamType, Params, Payload, Poll, PortSpec, PortType, Ports,
    Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult, Timestamp,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The image files of `dir` (`.png`, `.jpg`, `.jpeg`, any case), sorted
/// by file name; an error when the folder cannot be read or has none.
pub fn list_images(dir: &Path) -> Result<Vec<PathBuf>> {
    let io = |source| Error::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(|e| e.to_ascii_lowercase());
        if matches!(ext.as_deref(), Some("png" | "jpg" | "jpeg")) && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(Error::BadInput(format!(
            "{} holds no .png / .jpg / .jpeg images",
            dir.display()
        )));
    }
    Ok(files)
}

/// The `frames` stage kind.
#[derive(Debug)]
pub struct FramesKind;

impl StageFactory for FramesKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "frames",
            doc: "Reads a folder of PNG / JPEG images in file-name order and emits each as an RGB8 image frame, stamped with its capture time (when it was due at `rate_hz`, else when it was read); with `loop`, starts over at the end. Records `frame_decode_us`.",
            params: vec![
                ParamInfo::required("dir", ParamType::InputPath, "folder of .png / .jpg / .jpeg files"),
                ParamInfo::optional("rate_hz", ParamType::Float, "frames per second (0 < rate <= 1000); absent: as fast as the output edge takes them"),
                ParamInfo::new("loop", ParamType::Bool, false, "start over after the last image (runs until stopped)"),
                ParamInfo::new("max_side", ParamType::Int, 8192, "refuse images wider or taller than this many pixels"),
            ],
            ports: Ports {
                inputs: vec![],
                outputs: vec![PortSpec::new("out", PortType::Image, "RGB8 frames")],
            },
            source: true,
        }
    }

    fn build(&self, p: &Params, env: &BuildEnv) -> std::result::Result<Box<dyn Stage>, StageError> {
        let dir = p
            .path("dir", env)?
            .ok_or_else(|| p.error("dir", "is required"))?;
        let period = match p.opt::<f64>("rate_hz")? {
            Some(r) if r > 0.0 && r <= 1000.0 => Some(Duration::from_secs_f64(1.0 / r)),
            Some(r) => {
                return Err(p
                    .error("rate_hz", format!("must be in (0, 1000], got {r}"))
                    .into())
            }
            None => None,
        };
        let max_side: u32 = p.get_or("max_side", 8192)?;
        if max_side == 0 {
            return Err(p.error("max_side", "must be at least 1").into());
        }
        let files = list_images(&dir).map_err(|e| p.error("dir", e.to_string()))?;
        Ok(Box::new(FramesSource {
            files,
            next: 0,
            repeat: p.get_or("loop", false)?,
            period,
            due: None,
            limits: DecodeLimits {
                max_width: max_side,
                max_height: max_side,
                ..DecodeLimits::default()
            },
        }))
    }
}

/// The `frames` source.
#[derive(Debug)]
pub struct FramesSource {
    files: Vec<PathBuf>,
    next: usize,
    repeat: bool,
    period: Option<Duration>,
    due: Option<Instant>,
    limits: DecodeLimits,
}

impl Stage for FramesSource {
    fn poll(&mut self, ctx: &mut StageCtx) -> StageResult<Poll> {
        if self.next >= self.files.len() {
            if !self.repeat {
                return Ok(Poll::Done);
            }
            self.next = 0;
        }
        let captured = match self.period {
            Some(period) => {
                let due = *self.due.get_or_insert_with(Instant::now);
                if !ctx.sleep_until(due) {
                    return Ok(if ctx.should_stop() {
                        Poll::Done
                    } else {
                        Poll::Idle
                    });
                }
                // Late frames keep their own slot: no burst to catch up.
                self.due = Some((due + period).max(Instant::now()));
                due
            }
            None => Instant::now(),
        };
        let path = &self.files[self.next];
        let t0 = Instant::now();
        let img = open(path, &self.limits)?;
        ctx.record("frame_decode_us", t0.elapsed().as_secs_f64() * 1e6);
        self.next += 1;
        let msg = Message {
            epoch: ctx.current_epoch(),
            seq: 0,
            timestamp: Timestamp::from_instant(captured),
            deadline: None,
            payload: Payload::Image(Arc::new(rgb_to_frame(img))),
        };
        ctx.emit_msg(0, msg)?;
        Ok(Poll::Continue)
    }
}
