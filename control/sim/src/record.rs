//! Episode recording for training: one folder per episode, raw little-endian
//! arrays described by `meta.json` (see the crate README for the format and
//! a numpy reader). Written atomically: into a hidden temporary folder next
//! to the destination, renamed into place by [`EpisodeWriter::finish`].

use std::fs::{self, File};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Result, SimError};
use crate::render::Image;
use crate::task::{EpisodeInfo, PushConfig};

/// `meta.json`'s `format` value.
pub const FORMAT: &str = "edgeflow-sim-episode";
/// `meta.json`'s `version` value this crate writes and reads.
pub const VERSION: u32 = 1;
/// Columns of `state.f32` (the robot state: pusher position and velocity).
pub const STATE_FIELDS: [&str; 4] = ["x", "y", "vx", "vy"];
/// Columns of `actions.f32` (the commanded pusher position target).
pub const ACTION_FIELDS: [&str; 2] = ["target_x", "target_y"];

const META: &str = "meta.json";
const FRAMES: &str = "frames.u8";
const STATE: &str = "state.f32";
const ACTIONS: &str = "actions.f32";
const TIMES: &str = "t.f64";
const LABELS: &str = "labels.f32";
/// Longest label chunk the reader accepts (targets per row).
const MAX_LABEL_HORIZON: u64 = 1024;
/// `meta.json` larger than this is refused unread.
const META_MAX_BYTES: u64 = 1 << 20;
/// Largest image side accepted by the reader.
const MAX_SIDE: u64 = 4096;

/// One raw array file as described in `meta.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArrayMeta {
    /// File name inside the episode folder.
    pub file: String,
    /// numpy dtype string: `"|u1"`, `"<f4"` or `"<f8"`.
    pub dtype: String,
    /// Shape, row-major (C order).
    pub shape: Vec<u64>,
}

/// The content of `meta.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeMeta {
    /// Always [`FORMAT`].
    pub format: String,
    /// Format version, [`VERSION`].
    pub version: u32,
    /// The episode's seed.
    pub seed: u64,
    /// The goal variant's name, e.g. `"red-green"`.
    pub variant: String,
    /// The text instruction.
    pub instruction: String,
    /// Whether the episode succeeded.
    pub success: bool,
    /// Control rate, Hz (one row per control step).
    pub control_hz: f64,
    /// Physics rate, Hz.
    pub physics_hz: f64,
    /// Number of recorded control steps N (rows of every array).
    pub steps: u64,
    /// Image height, pixels.
    pub height: u32,
    /// Image width, pixels.
    pub width: u32,
    /// Columns of `state`.
    pub state_fields: Vec<String>,
    /// Columns of `actions`.
    pub action_fields: Vec<String>,
    /// `frames.u8`: N x H x W x 3 RGB8.
    pub frames: ArrayMeta,
    /// `state.f32`: N x 4.
    pub state: ArrayMeta,
    /// `actions.f32`: N x 2.
    pub actions: ArrayMeta,
    /// `t.f64`: N timestamps, seconds since reset.
    pub t: ArrayMeta,
    /// `labels.f32`: N x L x 2, present in episodes driven by a policy or
    /// a perturbed expert and labelled by the scripted expert (DAgger,
    /// DART): row `i` is the chunk of `L` pusher targets the expert plans
    /// from the true state at step `i` alone (`Expert::label`), which is
    /// what a policy should have sent there; `actions` holds what was
    /// sent. Absent in the expert's own plain recordings, where the
    /// actions are the expert's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<ArrayMeta>,
}

fn array(file: &str, dtype: &str, shape: Vec<u64>) -> ArrayMeta {
    ArrayMeta {
        file: file.to_string(),
        dtype: dtype.to_string(),
        shape,
    }
}

struct Sinks {
    frames: BufWriter<File>,
    state: BufWriter<File>,
    actions: BufWriter<File>,
    t: BufWriter<File>,
    labels: Option<BufWriter<File>>,
}

/// Writes one episode folder. Row `i` holds what was observed at control
/// step `i` (time `t[i]`, frame, robot state) and the action then sent.
pub struct EpisodeWriter {
    dest: PathBuf,
    tmp: PathBuf,
    sinks: Option<Sinks>,
    meta: EpisodeMeta,
    finished: bool,
}

impl std::fmt::Debug for EpisodeWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpisodeWriter")
            .field("dest", &self.dest)
            .field("steps", &self.meta.steps)
            .finish()
    }
}

impl EpisodeWriter {
    /// Start recording the episode `info` (run with `cfg`) into folder
    /// `dest`, which must not exist yet; its parent is created if needed.
    pub fn create(dest: impl AsRef<Path>, info: &EpisodeInfo, cfg: &PushConfig) -> Result<Self> {
        let dest = dest.as_ref().to_path_buf();
        if dest.exists() {
            return Err(SimError::Argument {
                what: format!(
                    "episode folder {} already exists; choose a new name or remove it",
                    dest.display()
                ),
            });
        }
        let name = dest
            .file_name()
            .ok_or_else(|| SimError::Argument {
                what: format!("episode path {} has no folder name", dest.display()),
            })?
            .to_string_lossy()
            .into_owned();
        let parent = dest.parent().map(Path::to_path_buf).unwrap_or_default();
        if !parent.as_os_str().is_empty() {
            fs::create_dir_all(&parent).map_err(|e| SimError::io("create", &parent, e))?;
        }
        let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(|e| SimError::io("remove stale", &tmp, e))?;
        }
        fs::create_dir(&tmp).map_err(|e| SimError::io("create", &tmp, e))?;
        let open = |f: &str| -> Result<BufWriter<File>> {
            let p = tmp.join(f);
            File::create(&p)
                .map(BufWriter::new)
                .map_err(|e| SimError::io("create", p, e))
        };
        let sinks = Sinks {
            frames: open(FRAMES)?,
            state: open(STATE)?,
            actions: open(ACTIONS)?,
            t: open(TIMES)?,
            labels: None,
        };
        let (h, w) = (cfg.image_size, cfg.image_size);
        let meta = EpisodeMeta {
            format: FORMAT.to_string(),
            version: VERSION,
            seed: info.seed,
            variant: info.variant.name(),
            instruction: info.instruction.clone(),
            success: false,
            control_hz: cfg.control_hz,
            physics_hz: cfg.physics_hz,
            steps: 0,
            height: h,
            width: w,
            state_fields: STATE_FIELDS.iter().map(|s| s.to_string()).collect(),
            action_fields: ACTION_FIELDS.iter().map(|s| s.to_string()).collect(),
            frames: array(FRAMES, "|u1", vec![0, h as u64, w as u64, 3]),
            state: array(STATE, "<f4", vec![0, 4]),
            actions: array(ACTIONS, "<f4", vec![0, 2]),
            t: array(TIMES, "<f8", vec![0]),
            labels: None,
        };
        Ok(Self {
            dest,
            tmp,
            sinks: Some(sinks),
            meta,
            finished: false,
        })
    }

    /// Rows written so far.
    pub fn len(&self) -> u64 {
        self.meta.steps
    }

    /// Whether no row has been written.
    pub fn is_empty(&self) -> bool {
        self.meta.steps == 0
    }

    /// Record an expert label with every row (see [`EpisodeMeta::labels`]):
    /// `horizon` targets per row, written by [`EpisodeWriter::push_labelled`].
    /// Call before the first row.
    pub fn with_labels(mut self, horizon: usize) -> Result<Self> {
        if !self.is_empty() || horizon == 0 || horizon as u64 > MAX_LABEL_HORIZON {
            return Err(SimError::Argument {
                what: format!(
                    "labels of {horizon} targets after {} rows: choose 1..={MAX_LABEL_HORIZON} targets before the first row",
                    self.meta.steps
                ),
            });
        }
        let p = self.tmp.join(LABELS);
        let f = File::create(&p).map_err(|e| SimError::io("create", &p, e))?;
        if let Some(s) = self.sinks.as_mut() {
            s.labels = Some(BufWriter::new(f));
        }
        self.meta.labels = Some(array(LABELS, "<f4", vec![0, horizon as u64, 2]));
        Ok(self)
    }

    /// Append one row: time `t` (seconds since reset), the camera `frame`
    /// (must be the episode's size), the robot `state` and the `action`.
    /// A writer made [`EpisodeWriter::with_labels`] takes
    /// [`EpisodeWriter::push_labelled`] instead.
    pub fn push(&mut self, t: f64, frame: &Image, state: [f32; 4], action: [f32; 2]) -> Result<()> {
        self.push_row(t, frame, state, action, None)
    }

    /// [`EpisodeWriter::push`] with the row's expert `label` (the writer's
    /// label horizon of targets).
    pub fn push_labelled(
        &mut self,
        t: f64,
        frame: &Image,
        state: [f32; 4],
        action: [f32; 2],
        label: &[[f32; 2]],
    ) -> Result<()> {
        self.push_row(t, frame, state, action, Some(label))
    }

    fn push_row(
        &mut self,
        t: f64,
        frame: &Image,
        state: [f32; 4],
        action: [f32; 2],
        label: Option<&[[f32; 2]]>,
    ) -> Result<()> {
        let want = self.meta.labels.as_ref().map(|a| a.shape[1] as usize);
        if want != label.map(<[_]>::len) {
            return Err(SimError::Argument {
                what: format!(
                    "row with {} label targets; this episode records {}",
                    label.map_or("no".to_string(), |l| l.len().to_string()),
                    want.map_or("none (create it with_labels)".to_string(), |h| h
                        .to_string())
                ),
            });
        }
        if frame.width != self.meta.width
            || frame.height != self.meta.height
            || frame.rgb.len() != frame.width as usize * frame.height as usize * 3
        {
            return Err(SimError::Argument {
                what: format!(
                    "frame is {}x{} with {} bytes; this episode records {}x{} RGB8 ({} bytes)",
                    frame.width,
                    frame.height,
                    frame.rgb.len(),
                    self.meta.width,
                    self.meta.height,
                    self.meta.width as usize * self.meta.height as usize * 3
                ),
            });
        }
        let tmp = &self.tmp;
        let Some(s) = self.sinks.as_mut() else {
            return Err(SimError::Argument {
                what: "episode writer already finished".into(),
            });
        };
        let w = |f: &mut BufWriter<File>, name: &str, bytes: &[u8]| {
            f.write_all(bytes)
                .map_err(|e| SimError::io("write", tmp.join(name), e))
        };
        w(&mut s.frames, FRAMES, &frame.rgb)?;
        let st: Vec<u8> = state.iter().flat_map(|x| x.to_le_bytes()).collect();
        w(&mut s.state, STATE, &st)?;
        let ac: Vec<u8> = action.iter().flat_map(|x| x.to_le_bytes()).collect();
        w(&mut s.actions, ACTIONS, &ac)?;
        w(&mut s.t, TIMES, &t.to_le_bytes())?;
        if let (Some(f), Some(label)) = (s.labels.as_mut(), label) {
            let b: Vec<u8> = label
                .iter()
                .flatten()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            w(f, LABELS, &b)?;
        }
        self.meta.steps += 1;
        Ok(())
    }

    /// Flush, write `meta.json` (with `success`) and move the folder into
    /// place. Returns the episode's folder.
    pub fn finish(mut self, success: bool) -> Result<PathBuf> {
        let Some(sinks) = self.sinks.take() else {
            return Err(SimError::Argument {
                what: "episode writer already finished".into(),
            });
        };
        let mut files = vec![
            (sinks.frames, FRAMES),
            (sinks.state, STATE),
            (sinks.actions, ACTIONS),
            (sinks.t, TIMES),
        ];
        files.extend(sinks.labels.map(|f| (f, LABELS)));
        for (mut f, name) in files {
            let p = self.tmp.join(name);
            f.flush().map_err(|e| SimError::io("write", &p, e))?;
            f.get_ref()
                .sync_all()
                .map_err(|e| SimError::io("sync", &p, e))?;
        }
        let n = self.meta.steps;
        let m = &mut self.meta;
        m.success = success;
        m.frames.shape[0] = n;
        m.state.shape[0] = n;
        m.actions.shape[0] = n;
        m.t.shape[0] = n;
        if let Some(l) = m.labels.as_mut() {
            l.shape[0] = n;
        }
        let json = serde_json::to_vec_pretty(&self.meta).map_err(|e| SimError::Argument {
            what: format!("cannot encode meta.json: {e}"),
        })?;
        let mp = self.tmp.join(META);
        fs::write(&mp, json).map_err(|e| SimError::io("write", &mp, e))?;
        if self.dest.exists() {
            return Err(SimError::Argument {
                what: format!(
                    "episode folder {} appeared while recording; the recording is left in {}",
                    self.dest.display(),
                    self.tmp.display()
                ),
            });
        }
        fs::rename(&self.tmp, &self.dest).map_err(|e| SimError::io("rename", &self.tmp, e))?;
        self.finished = true;
        Ok(self.dest.clone())
    }
}

/// Run one scripted-expert episode from `seed` on `sim` (plan `horizon`
/// targets, execute `execute`, replan; see [`crate::Expert::run_episode`])
/// and record it into the episode folder `dest`, finished (renamed into
/// place) with its success. Returns the episode's info.
pub fn record_expert_episode(
    sim: &mut crate::PushSim,
    expert: &mut crate::Expert,
    seed: u64,
    horizon: usize,
    execute: usize,
    dest: &Path,
) -> Result<EpisodeInfo> {
    let cfg = sim.config().clone();
    let mut writer: Option<EpisodeWriter> = None;
    let info = expert.run_episode(sim, seed, horizon, execute, |sim, target| {
        if writer.is_none() {
            writer = Some(EpisodeWriter::create(dest, sim.episode(), &cfg)?);
        }
        if let Some(w) = writer.as_mut() {
            w.push(
                sim.true_state().time,
                &sim.render(),
                sim.robot_state(),
                target,
            )?;
        }
        Result::Ok(())
    })?;
    if let Some(w) = writer {
        w.finish(sim.success())?;
    }
    Ok(info)
}

impl Drop for EpisodeWriter {
    fn drop(&mut self) {
        if !self.finished && self.sinks.is_some() {
            // An abandoned recording leaves nothing behind.
            self.sinks = None;
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}

/// Reads one episode folder written by [`EpisodeWriter`]. `open` checks
/// `meta.json` and every file's size before anything large is allocated.
#[derive(Debug)]
pub struct EpisodeReader {
    dir: PathBuf,
    meta: EpisodeMeta,
}

fn expect_array(dir: &Path, a: &ArrayMeta, name: &str, dtype: &str, shape: &[u64]) -> Result<u64> {
    if a.file != name || a.dtype != dtype || a.shape != shape {
        return Err(SimError::format(
            dir.join(META),
            format!(
                "array {name}: meta says file {:?} dtype {:?} shape {:?}; expected file {name:?} dtype {dtype:?} shape {shape:?}",
                a.file, a.dtype, a.shape
            ),
        ));
    }
    let item = match dtype {
        "|u1" => 1u64,
        "<f4" => 4,
        _ => 8,
    };
    let bytes = shape
        .iter()
        .try_fold(item, |acc, d| acc.checked_mul(*d))
        .ok_or_else(|| {
            SimError::format(
                dir.join(META),
                format!("array {name}: shape {shape:?} overflows 64 bits"),
            )
        })?;
    let p = dir.join(name);
    let actual = fs::metadata(&p)
        .map_err(|e| SimError::io("stat", &p, e))?
        .len();
    if actual != bytes {
        return Err(SimError::format(
            &p,
            format!(
                "is {actual} bytes but meta.json's shape {shape:?} of {dtype} needs {bytes} (truncated or corrupt file, or wrong meta.json)"
            ),
        ));
    }
    Ok(bytes)
}

impl EpisodeReader {
    /// Open and validate the episode folder `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let mp = dir.join(META);
        let len = fs::metadata(&mp)
            .map_err(|e| SimError::io("stat", &mp, e))?
            .len();
        if len > META_MAX_BYTES {
            return Err(SimError::format(
                &mp,
                format!("is {len} bytes, over the {META_MAX_BYTES}-byte limit"),
            ));
        }
        let text = fs::read(&mp).map_err(|e| SimError::io("read", &mp, e))?;
        let meta: EpisodeMeta = serde_json::from_slice(&text)
            .map_err(|e| SimError::format(&mp, format!("not a valid episode meta.json: {e}")))?;
        if meta.format != FORMAT || meta.version != VERSION {
            return Err(SimError::format(
                &mp,
                format!(
                    "format {:?} version {}; this reader reads {FORMAT:?} version {VERSION}",
                    meta.format, meta.version
                ),
            ));
        }
        let (h, w, n) = (meta.height as u64, meta.width as u64, meta.steps);
        if !(1..=MAX_SIDE).contains(&h) || !(1..=MAX_SIDE).contains(&w) {
            return Err(SimError::format(
                &mp,
                format!("image {w}x{h} is outside 1..={MAX_SIDE} pixels a side"),
            ));
        }
        if meta.state_fields.len() != 4 || meta.action_fields.len() != 2 {
            return Err(SimError::format(
                &mp,
                "state_fields must have 4 names and action_fields 2",
            ));
        }
        expect_array(&dir, &meta.frames, FRAMES, "|u1", &[n, h, w, 3])?;
        expect_array(&dir, &meta.state, STATE, "<f4", &[n, 4])?;
        expect_array(&dir, &meta.actions, ACTIONS, "<f4", &[n, 2])?;
        expect_array(&dir, &meta.t, TIMES, "<f8", &[n])?;
        if let Some(l) = &meta.labels {
            let h = l.shape.get(1).copied().unwrap_or(0);
            if !(1..=MAX_LABEL_HORIZON).contains(&h) {
                return Err(SimError::format(
                    &mp,
                    format!("labels of {h} targets per row; expected 1..={MAX_LABEL_HORIZON}"),
                ));
            }
            expect_array(&dir, l, LABELS, "<f4", &[n, h, 2])?;
        }
        Ok(Self { dir, meta })
    }

    /// The episode's `meta.json`.
    pub fn meta(&self) -> &EpisodeMeta {
        &self.meta
    }

    /// Number of rows.
    pub fn len(&self) -> u64 {
        self.meta.steps
    }

    /// Whether the episode has no rows.
    pub fn is_empty(&self) -> bool {
        self.meta.steps == 0
    }

    fn read_all(&self, name: &str) -> Result<Vec<u8>> {
        let p = self.dir.join(name);
        let mut f = File::open(&p).map_err(|e| SimError::io("open", &p, e))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)
            .map_err(|e| SimError::io("read", &p, e))?;
        Ok(buf)
    }

    fn read_checked(&self, a: &ArrayMeta, item: usize) -> Result<Vec<u8>> {
        let buf = self.read_all(&a.file)?;
        let want = a.shape.iter().product::<u64>() as usize * item;
        if buf.len() != want {
            return Err(SimError::format(
                self.dir.join(&a.file),
                format!("changed since open: {} bytes, expected {want}", buf.len()),
            ));
        }
        Ok(buf)
    }

    /// Frame `i` (row `i` of `frames.u8`).
    pub fn frame(&self, i: u64) -> Result<Image> {
        if i >= self.meta.steps {
            return Err(SimError::Argument {
                what: format!(
                    "frame {i} out of range: episode has {} frames",
                    self.meta.steps
                ),
            });
        }
        let n = self.meta.width as usize * self.meta.height as usize * 3;
        let p = self.dir.join(FRAMES);
        let mut f = File::open(&p).map_err(|e| SimError::io("open", &p, e))?;
        f.seek(SeekFrom::Start(i * n as u64))
            .map_err(|e| SimError::io("seek", &p, e))?;
        let mut rgb = vec![0u8; n];
        f.read_exact(&mut rgb)
            .map_err(|e| SimError::io("read", &p, e))?;
        Ok(Image {
            width: self.meta.width,
            height: self.meta.height,
            rgb,
        })
    }

    /// Every robot state row.
    pub fn states(&self) -> Result<Vec<[f32; 4]>> {
        let buf = self.read_checked(&self.meta.state, 4)?;
        Ok(buf
            .chunks_exact(16)
            .map(|r| std::array::from_fn(|k| f32_at(r, k)))
            .collect())
    }

    /// The expert's labels (see [`EpisodeMeta::labels`]): targets per row
    /// and every row's targets flattened (`N * L * 2` values), or `None`
    /// for an episode without labels.
    pub fn labels(&self) -> Result<Option<(usize, Vec<f32>)>> {
        let Some(l) = &self.meta.labels else {
            return Ok(None);
        };
        let buf = self.read_checked(l, 4)?;
        let v = buf
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(Some((l.shape[1] as usize, v)))
    }

    /// Every action row.
    pub fn actions(&self) -> Result<Vec<[f32; 2]>> {
        let buf = self.read_checked(&self.meta.actions, 4)?;
        Ok(buf
            .chunks_exact(8)
            .map(|r| std::array::from_fn(|k| f32_at(r, k)))
            .collect())
    }

    /// The simulator's full state at every recorded step, recovered by
    /// re-running the episode: reset to the recorded seed, then each
    /// recorded action in turn. The simulator is deterministic, so this is
    /// the world the frames show; each replayed robot state is checked
    /// against the recorded one, and a mismatch (a recording made with
    /// another simulator configuration or version) is an error naming the
    /// step. Row `i` is the state observed at step `i`, before its action.
    /// Training uses it for auxiliary targets the policy never sees at run
    /// time (where the blocks and zones are).
    pub fn true_states(&self, cfg: &crate::PushConfig) -> Result<Vec<crate::TrueState>> {
        let states = self.states()?;
        let actions = self.actions()?;
        let mut sim = crate::PushSim::new(cfg.clone())?;
        sim.reset(self.meta.seed);
        let mut out = Vec::with_capacity(actions.len());
        for (i, (s, a)) in states.iter().zip(&actions).enumerate() {
            let r = sim.robot_state();
            if r != *s {
                return Err(SimError::format(
                    self.dir.join(STATE),
                    format!(
                        "step {i}: replaying seed {} gives robot state {r:?}, the recording has {s:?}; \
                         it was recorded with another simulator configuration or version",
                        self.meta.seed
                    ),
                ));
            }
            out.push(sim.true_state());
            sim.step(*a);
        }
        Ok(out)
    }

    /// Every timestamp; checked finite and non-decreasing.
    pub fn times(&self) -> Result<Vec<f64>> {
        let buf = self.read_checked(&self.meta.t, 8)?;
        let t: Vec<f64> = buf
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        for (i, w) in t.windows(2).enumerate() {
            if !(w[0].is_finite() && w[1].is_finite() && w[1] >= w[0]) {
                return Err(SimError::format(
                    self.dir.join(TIMES),
                    format!(
                        "timestamps {i} and {} are not finite and non-decreasing",
                        i + 1
                    ),
                ));
            }
        }
        Ok(t)
    }
}

fn f32_at(row: &[u8], k: usize) -> f32 {
    f32::from_le_bytes([row[4 * k], row[4 * k + 1], row[4 * k + 2], row[4 * k + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PushConfig, PushSim};

    fn small_cfg() -> PushConfig {
        PushConfig {
            image_size: 16,
            ..PushConfig::default()
        }
    }

    /// What a test recorded: frames, states, actions, times.
    type Recorded = (Vec<Image>, Vec<[f32; 4]>, Vec<[f32; 2]>, Vec<f64>);

    /// Record `n` steps of seed 5 into `dir`; return what was written.
    fn record(dir: &Path, n: usize) -> Recorded {
        let cfg = small_cfg();
        let mut sim = PushSim::new(cfg.clone()).unwrap();
        let info = sim.reset(5);
        let mut w = EpisodeWriter::create(dir, &info, &cfg).unwrap();
        let (mut f, mut s, mut a, mut t) = (vec![], vec![], vec![], vec![]);
        for k in 0..n {
            let img = sim.render();
            let st = sim.robot_state();
            let act = [0.01 * k as f32, -0.1];
            let time = sim.true_state().time;
            w.push(time, &img, st, act).unwrap();
            sim.step(act);
            f.push(img);
            s.push(st);
            a.push(act);
            t.push(time);
        }
        assert_eq!(w.len(), n as u64);
        assert_eq!(w.finish(true).unwrap(), dir);
        (f, s, a, t)
    }

    #[test]
    fn round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("eps").join("episode_000000");
        let (f, s, a, t) = record(&dir, 7);
        let r = EpisodeReader::open(&dir).unwrap();
        assert_eq!(r.len(), 7);
        let m = r.meta();
        assert!(m.success && m.seed == 5 && m.height == 16 && m.width == 16);
        assert_eq!(m.frames.shape, vec![7, 16, 16, 3]);
        assert_eq!(r.states().unwrap(), s);
        assert_eq!(r.actions().unwrap(), a);
        assert_eq!(r.times().unwrap(), t);
        for (i, img) in f.iter().enumerate() {
            assert_eq!(&r.frame(i as u64).unwrap(), img);
        }
        assert!(r.frame(7).is_err());
        // Nothing but the episode folder is left in the parent.
        let names: Vec<_> = fs::read_dir(dir.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn true_states_replay_the_recording() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ep");
        record(&dir, 6);
        let r = EpisodeReader::open(&dir).unwrap();
        // The same seed and actions, run again, give every state.
        let cfg = small_cfg();
        let mut sim = PushSim::new(cfg.clone()).unwrap();
        sim.reset(5);
        let truth = r.true_states(&cfg).unwrap();
        assert_eq!(truth.len(), 6);
        for (k, (s, a)) in truth.iter().zip(r.actions().unwrap()).enumerate() {
            assert_eq!(*s, sim.true_state(), "step {k}");
            sim.step(a);
        }
        // Another simulator configuration does not replay to the recorded
        // robot states: an error naming the step, not wrong targets.
        let other = PushConfig {
            control_hz: cfg.control_hz * 2.0,
            ..cfg
        };
        let e = r.true_states(&other).unwrap_err().to_string();
        assert!(
            e.contains("step ") && e.contains("another simulator"),
            "{e}"
        );
    }

    #[test]
    fn truncated_or_corrupt_files_are_clear_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ep");
        record(&dir, 4);
        // Truncated frames.
        let fp = dir.join(FRAMES);
        let full = fs::read(&fp).unwrap();
        fs::write(&fp, &full[..full.len() - 5]).unwrap();
        let e = EpisodeReader::open(&dir).unwrap_err().to_string();
        assert!(e.contains("frames.u8") && e.contains("truncated"), "{e}");
        fs::write(&fp, &full).unwrap();
        EpisodeReader::open(&dir).unwrap();
        // Missing state file.
        let sp = dir.join(STATE);
        let st = fs::read(&sp).unwrap();
        fs::remove_file(&sp).unwrap();
        let e = EpisodeReader::open(&dir).unwrap_err().to_string();
        assert!(e.contains("state.f32"), "{e}");
        fs::write(&sp, &st).unwrap();
        // Garbage meta.json.
        let mp = dir.join(META);
        let meta = fs::read_to_string(&mp).unwrap();
        fs::write(&mp, "{ not json").unwrap();
        let e = EpisodeReader::open(&dir).unwrap_err().to_string();
        assert!(e.contains("meta.json") && e.contains("not a valid"), "{e}");
        // Wrong version.
        fs::write(&mp, meta.replace("\"version\": 1", "\"version\": 99")).unwrap();
        let e = EpisodeReader::open(&dir).unwrap_err().to_string();
        assert!(e.contains("version 99"), "{e}");
        fs::write(&mp, &meta).unwrap();
        // Non-monotonic timestamps.
        let tp = dir.join(TIMES);
        let mut tb = fs::read(&tp).unwrap();
        tb[8..16].copy_from_slice(&(-1.0f64).to_le_bytes());
        fs::write(&tp, &tb).unwrap();
        let r = EpisodeReader::open(&dir).unwrap();
        assert!(r
            .times()
            .unwrap_err()
            .to_string()
            .contains("non-decreasing"));
    }

    #[test]
    fn hostile_meta_is_refused_before_allocating() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ep");
        record(&dir, 2);
        let mp = dir.join(META);
        let mut m: EpisodeMeta = serde_json::from_slice(&fs::read(&mp).unwrap()).unwrap();
        // Claims a trillion steps: sizes disagree with the files, refused.
        let n = 1u64 << 40;
        m.steps = n;
        m.frames.shape[0] = n;
        m.state.shape[0] = n;
        m.actions.shape[0] = n;
        m.t.shape[0] = n;
        if let Some(l) = m.labels.as_mut() {
            l.shape[0] = n;
        }
        fs::write(&mp, serde_json::to_vec(&m).unwrap()).unwrap();
        let e = EpisodeReader::open(&dir).unwrap_err().to_string();
        assert!(e.contains("needs"), "{e}");
        // A shape that overflows 64 bits.
        m.steps = u64::MAX / 2;
        m.frames.shape = vec![m.steps, 16, 16, 3];
        fs::write(&mp, serde_json::to_vec(&m).unwrap()).unwrap();
        let e = EpisodeReader::open(&dir).unwrap_err().to_string();
        assert!(e.contains("overflows"), "{e}");
        // A giant image.
        m.height = 1 << 30;
        fs::write(&mp, serde_json::to_vec(&m).unwrap()).unwrap();
        let e = EpisodeReader::open(&dir).unwrap_err().to_string();
        assert!(e.contains("pixels a side"), "{e}");
        // A huge meta.json is not even read.
        fs::write(&mp, vec![b' '; (META_MAX_BYTES + 1) as usize]).unwrap();
        let e = EpisodeReader::open(&dir).unwrap_err().to_string();
        assert!(e.contains("limit"), "{e}");
    }

    #[test]
    fn writer_rejects_bad_input_and_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = small_cfg();
        let mut sim = PushSim::new(cfg.clone()).unwrap();
        let info = sim.reset(1);
        let dir = tmp.path().join("ep");
        {
            let mut w = EpisodeWriter::create(&dir, &info, &cfg).unwrap();
            let wrong = Image {
                width: 8,
                height: 8,
                rgb: vec![0; 192],
            };
            let e = w
                .push(0.0, &wrong, [0.0; 4], [0.0; 2])
                .unwrap_err()
                .to_string();
            assert!(e.contains("8x8") && e.contains("16x16"), "{e}");
            w.push(0.0, &sim.render(), [0.0; 4], [0.0; 2]).unwrap();
            // Dropped unfinished: nothing is left behind.
        }
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
        fs::create_dir(&dir).unwrap();
        let e = EpisodeWriter::create(&dir, &info, &cfg)
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists"), "{e}");
    }

    #[test]
    fn expert_labels_round_trip_and_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = small_cfg();
        let mut sim = PushSim::new(cfg.clone()).unwrap();
        let info = sim.reset(2);
        let dir = tmp.path().join("ep");
        let mut w = EpisodeWriter::create(&dir, &info, &cfg)
            .unwrap()
            .with_labels(3)
            .unwrap();
        let img = sim.render();
        let e = w
            .push(0.0, &img, [0.0; 4], [0.0; 2])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no label targets") && e.contains('3'), "{e}");
        let e = w
            .push_labelled(0.0, &img, [0.0; 4], [0.0; 2], &[[0.0; 2]; 2])
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 label targets"), "{e}");
        let mut want = Vec::new();
        for k in 0..4 {
            let label = [[k as f32, 0.5], [1.0, -1.0], [0.25, k as f32]];
            w.push_labelled(0.02 * k as f64, &img, [0.0; 4], [0.1; 2], &label)
                .unwrap();
            want.extend(label.iter().flatten());
        }
        w.finish(false).unwrap();
        let r = EpisodeReader::open(&dir).unwrap();
        assert_eq!(r.labels().unwrap(), Some((3, want)));
        assert_eq!(r.meta().labels.as_ref().unwrap().shape, vec![4, 3, 2]);
        // A truncated labels file is refused at open, naming it.
        let lp = dir.join(LABELS);
        let bytes = fs::read(&lp).unwrap();
        fs::write(&lp, &bytes[..bytes.len() - 4]).unwrap();
        let e = EpisodeReader::open(&dir).unwrap_err().to_string();
        assert!(e.contains("labels.f32") && e.contains("truncated"), "{e}");
        // An expert recording has none, and its meta.json no `labels` key.
        let plain = tmp.path().join("plain");
        record(&plain, 2);
        assert_eq!(EpisodeReader::open(&plain).unwrap().labels().unwrap(), None);
        let meta = fs::read_to_string(plain.join(META)).unwrap();
        assert!(!meta.contains("labels"), "{meta}");
        // Labels are chosen before the first row.
        let mut w = EpisodeWriter::create(tmp.path().join("late"), &info, &cfg).unwrap();
        w.push(0.0, &img, [0.0; 4], [0.0; 2]).unwrap();
        assert!(w.with_labels(3).is_err());
    }
}
