//! [`SimNpu`]: the in-tree NPU simulator behind the [`edgeflow_runtime::Backend`] trait.

use super::kernels::{exec_f32, exec_int8, ActIn, Kind};
use super::quant::{ActivationScheme, QParams, QWeight, RangeObserver};
use super::report::{ErrorBook, NpuCounters, NpuErrorReport};
use edgeflow_runtime::candle_core::{self, quantized::QTensor};
use edgeflow_runtime::{
    Backend, DType, DeviceBuffer, DeviceKind, Error, Op, Result, Storage, Tensor,
};
use std::any::Any;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

/// Adapter string of the simulator (shown by `edgeflow devices`).
pub const SIM_ADAPTER: &str = "edgeflow NPU simulator (int8)";

/// Producer tag of data that came from the host (stage inputs, weights).
const HOST_PRODUCER: u64 = 0;

/// Settings of the simulator.
#[derive(Debug, Clone, PartialEq)]
pub struct SimNpuConfig {
    /// Executions per op site that observe min/max before the site's int8
    /// parameters freeze (the site is "compiled"). These warm-up calls already
    /// compute in int8, with provisional parameters from the ranges seen so
    /// far including the call itself (dynamic quantization); afterwards the
    /// parameters are static, as in a compiled NPU binary (ignored inside [`SimNpu::calibrate`], which compiles
    /// when its closure returns). Default 4: one call rarely covers the
    /// range of later ones, and values past the calibrated range saturate.
    /// For best accuracy run [`SimNpu::calibrate`] on representative inputs.
    pub calibration_runs: usize,
    /// How many *extra* input shapes one op site may be compiled for after
    /// its first (each is a counted recompile). An op at a site whose budget
    /// is spent is refused by `supports()` and the dispatcher runs it on the
    /// CPU (counted fallback). Default 3.
    pub recompile_budget: usize,
    /// Upper bound on op sites held at once (guards against models that
    /// build fresh weight tensors every call). Beyond it ops fall back. Default 4096.
    pub max_sites: usize,
    /// How activation ranges become int8 parameters. Default asymmetric.
    pub scheme: ActivationScheme,
    /// Compute an f32 shadow of every int8 op and record the error
    /// ([`SimNpu::error_report`]). Roughly doubles the cost. Default on.
    pub shadow: bool,
}

impl Default for SimNpuConfig {
    fn default() -> Self {
        SimNpuConfig {
            calibration_runs: 4,
            recompile_budget: 3,
            max_sites: 4096,
            scheme: ActivationScheme::Asymmetric,
            shadow: true,
        }
    }
}

/// A tensor resident on the simulated NPU.
///
/// It carries f32 values; when it is the output of an int8 op every value
/// lies on the int8 grid of [`NpuBuffer::qparams`] (the simulator stores
/// `scale * (q - zero_point)` rather than `q`, which is exact and lets the
/// next op take the codes without requantization). Weights are quantized per
/// output channel once, the first time they are used as a weight, and the
/// int8 copy is cached here.
#[derive(Debug)]
pub struct NpuBuffer {
    backend: Arc<str>,
    data: Arc<Vec<f32>>,
    dims: Vec<usize>,
    q: Option<QParams>,
    shadow: Option<Arc<Vec<f32>>>,
    producer: u64,
    ident: u64,
    weight: OnceLock<Arc<QWeight>>,
}

impl NpuBuffer {
    /// The values (dequantized when the buffer is int8).
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// Dims.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// int8 parameters when the values are int8 codes; `None` for f32 data
    /// (uploaded from the host or produced during calibration).
    pub fn qparams(&self) -> Option<QParams> {
        self.q
    }

    /// The f32 shadow value (what an all-f32 run would hold here), when
    /// shadow computation is on and it differs from the data.
    pub fn shadow(&self) -> Option<&[f32]> {
        self.shadow.as_deref().map(|v| v.as_slice())
    }

    fn quantized_weight(&self) -> Arc<QWeight> {
        self.weight
            .get_or_init(|| Arc::new(QWeight::quantize(&self.data, &self.dims)))
            .clone()
    }
}

impl DeviceBuffer for NpuBuffer {
    fn backend(&self) -> &str {
        &self.backend
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    /// Bytes on the simulated device: one per int8 element, plus the
    /// per-channel scales once the buffer has been quantized as a weight.
    fn size_bytes(&self) -> usize {
        match self.weight.get() {
            Some(w) => w.size_bytes(),
            None => self.data.len(),
        }
    }
}

#[derive(Debug, Clone)]
enum SiteState {
    Calibrating {
        runs: usize,
        inputs: Vec<RangeObserver>,
        output: RangeObserver,
    },
    Compiled {
        inputs: Vec<QParams>,
        output: QParams,
    },
}

#[derive(Debug)]
struct Site {
    family: u64,
    state: SiteState,
}

#[derive(Debug, Default)]
struct Family {
    /// Input shapes admitted (calibrating or compiled).
    shapes: usize,
    /// Shapes compiled.
    compiled: usize,
}

#[derive(Debug, Default)]
struct State {
    sites: HashMap<u64, Site>,
    families: HashMap<u64, Family>,
    counters: NpuCounters,
}

/// The in-tree **simulated** NPU: an int8, static-shape accelerator model
/// that runs on the host CPU. It is not hardware and is not fast; it shows
/// what a model loses (accuracy, fallbacks, recompiles) when placed on an NPU.
///
/// # What it imposes
/// - **Limited op set** (int8): `linear`, `matmul`, `conv1d`, `conv2d`,
///   `add`, `sub`, `mul`, `relu`, `leaky_relu`, `sigmoid`, `tanh`, `gelu`,
///   `gelu_erf`, `silu` (lookup tables), `softmax` (dequantize, compute,
///   requantize to a fixed `[0, 1)` scale) and `reshape` (metadata only).
///   Everything else — norms, attention, rope, conv-transpose, reductions,
///   exp/log/…, data movement, casts — is refused by `supports()` and runs on
///   the CPU through the dispatcher's counted fallback. Inputs must be float
///   (f32/f16/bf16, converted at upload; Linear weights may also be GGML
///   block-quantized: they are dequantized and re-quantized to int8).
/// - **int8 weights**, symmetric, one scale per output channel, quantized
///   once per weight buffer (on first use; `Device::place` your weights).
/// - **int8 activations**, per-tensor, asymmetric by default
///   ([`ActivationScheme`]), with scales from calibration: the first
///   [`SimNpuConfig::calibration_runs`] executions of an op site record each
///   activation input's and the output's min/max (computing in int8 with
///   provisional parameters meanwhile); the site is then compiled with those
///   fixed parameters. Later values outside the calibrated range saturate,
///   as on hardware. No supported op ever returns an f32-exact result.
/// - **int32 accumulation** and fixed-point requantization (Q31 multiplier
///   and shift per output channel); int32 bias at scale `s_x * s_w[c]`.
/// - **Static shapes**: a site is compiled for its exact input shapes. A new
///   shape is a new compilation (calibrate again, counted as a recompile);
///   past [`SimNpuConfig::recompile_budget`] the op falls back to the CPU.
///
/// # Op-site identity
/// An eager op has no graph node id, so the simulator derives one from the
/// dataflow: the *family* of an op is a hash of the op with its attributes,
/// the identity of its weight inputs (the host tensor they were uploaded
/// from), and the family of the op that produced each activation input
/// (host data has a fixed tag). The *site* adds the exact input shapes.
/// This is the op's position in the stage's graph, independent of call
/// order, of tensor addresses and of how many other ops ran before, so
/// interleaved stages or a skipped branch do not shift identities. Two ops
/// with the same family compute the same function of the same data and
/// share their calibration.
///
/// # Explicit calibration and graph compile
/// [`SimNpu::calibrate`] runs a closure (a model over calibration samples)
/// with automatic compilation held back, then compiles every site it saw.
/// For ahead-of-time compilation of a captured static graph, see
/// [`super::NpuDelegate`] (implemented by `SimNpu`).
#[derive(Debug)]
pub struct SimNpu {
    name: Arc<str>,
    config: SimNpuConfig,
    shadow: Arc<AtomicBool>,
    manual_calibration: AtomicBool,
    state: Arc<Mutex<State>>,
    book: Arc<Mutex<ErrorBook>>,
}

/// What the process-wide registry keeps of a live simulator (weakly, so a
/// dropped simulator disappears from it).
struct Registered {
    name: Arc<str>,
    shadow: Weak<AtomicBool>,
    state: Weak<Mutex<State>>,
    book: Weak<Mutex<ErrorBook>>,
}

static REGISTRY: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

fn report_of(
    name: &str,
    shadow: &AtomicBool,
    state: &Mutex<State>,
    book: &Mutex<ErrorBook>,
) -> NpuErrorReport {
    let counters = {
        let st = state.lock().unwrap_or_else(|p| p.into_inner());
        let mut c = st.counters;
        c.sites = st.sites.len() as u64;
        c
    };
    let book = book.lock().map(|b| b.clone()).unwrap_or_default();
    book.report(name, shadow.load(Ordering::Relaxed), counters)
}

/// Error reports of every live [`SimNpu`] in the process, in creation order.
///
/// Placement code holds simulators as `Arc<dyn Backend>`, which cannot be
/// downcast; this is how the CLI and stage metrics reach their reports.
pub fn live_error_reports() -> Vec<NpuErrorReport> {
    let mut reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    reg.retain(|r| r.state.strong_count() > 0);
    reg.iter()
        .filter_map(|r| {
            let (shadow, state, book) =
                (r.shadow.upgrade()?, r.state.upgrade()?, r.book.upgrade()?);
            Some(report_of(&r.name, &shadow, &state, &book))
        })
        .collect()
}

fn hash_of<T: Hash + ?Sized>(v: &T) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

impl SimNpu {
    /// Simulated NPU number `index` (`npu-sim:<index>`) with default settings.
    pub fn new(index: usize) -> Result<SimNpu> {
        Self::with_config(index, SimNpuConfig::default())
    }

    /// Simulated NPU with explicit settings.
    pub fn with_config(index: usize, config: SimNpuConfig) -> Result<SimNpu> {
        if config.calibration_runs == 0 {
            return Err(Error::Backend {
                backend: format!("npu-sim:{index}"),
                msg: "calibration_runs must be at least 1".into(),
            });
        }
        let npu = SimNpu {
            name: format!("npu-sim:{index}").into(),
            shadow: Arc::new(AtomicBool::new(config.shadow)),
            config,
            manual_calibration: AtomicBool::new(false),
            state: Arc::new(Mutex::new(State::default())),
            book: Arc::new(Mutex::new(ErrorBook::default())),
        };
        let mut reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        reg.retain(|r| r.state.strong_count() > 0);
        reg.push(Registered {
            name: npu.name.clone(),
            shadow: Arc::downgrade(&npu.shadow),
            state: Arc::downgrade(&npu.state),
            book: Arc::downgrade(&npu.book),
        });
        Ok(npu)
    }

    /// The settings.
    pub fn config(&self) -> &SimNpuConfig {
        &self.config
    }

    /// Turn the f32 shadow computation (and error recording) on or off.
    pub fn set_shadow(&self, on: bool) {
        self.shadow.store(on, Ordering::Relaxed);
    }

    /// Whether the f32 shadow computation is on.
    pub fn shadow_enabled(&self) -> bool {
        self.shadow.load(Ordering::Relaxed)
    }

    /// Compilation and calibration counters.
    pub fn counters(&self) -> NpuCounters {
        let st = self.lock();
        let mut c = st.counters;
        c.sites = st.sites.len() as u64;
        c
    }

    /// Error against f32 per op kind, with the counters.
    pub fn error_report(&self) -> NpuErrorReport {
        report_of(&self.name, &self.shadow, &self.state, &self.book)
    }

    /// Forget the recorded error figures.
    pub fn reset_error_stats(&self) {
        if let Ok(mut b) = self.book.lock() {
            *b = ErrorBook::default();
        }
    }

    /// Forget every compiled site (the next calls calibrate again).
    /// Counters other than `sites` are kept.
    pub fn reset_sites(&self) {
        let mut st = self.lock();
        st.sites.clear();
        st.families.clear();
    }

    /// Run `f` (typically a model over a few representative inputs) as a
    /// calibration pass: every op site it reaches runs in f32 and records its
    /// ranges, however many times it runs; when `f` returns, all those sites
    /// are compiled. Sites compiled earlier are left as they are (call
    /// [`SimNpu::reset_sites`] first to recalibrate them).
    pub fn calibrate<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        self.manual_calibration.store(true, Ordering::SeqCst);
        let r = f();
        self.manual_calibration.store(false, Ordering::SeqCst);
        let mut st = self.lock();
        let keys: Vec<u64> = st
            .sites
            .iter()
            .filter(|(_, s)| matches!(s.state, SiteState::Calibrating { runs, .. } if runs > 0))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            self.compile_site(&mut st, k);
        }
        r
    }

    pub(crate) fn book(&self) -> Arc<Mutex<ErrorBook>> {
        self.book.clone()
    }

    pub(crate) fn count_subgraph_compile(&self) {
        self.lock().counters.subgraphs_compiled += 1;
    }

    pub(crate) fn scheme(&self) -> ActivationScheme {
        self.config.scheme
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every
        // update is a single assignment), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn err(&self, msg: impl Into<String>) -> Error {
        Error::Backend {
            backend: self.name.to_string(),
            msg: msg.into(),
        }
    }

    fn buffer<'a>(&self, t: &'a Tensor) -> Option<&'a NpuBuffer> {
        match t.storage() {
            Storage::Device(b) if b.backend() == &*self.name => b.as_any().downcast_ref(),
            _ => None,
        }
    }

    /// Identity of a tensor used as a weight: stable for the same host
    /// tensor and for every upload of it.
    fn ident_of(&self, t: &Tensor) -> u64 {
        match t.storage() {
            Storage::Host(c) => hash_of(&("host", c.id())),
            Storage::Quantized(q) => hash_of(&("q", Arc::as_ptr(q) as *const u8 as usize)),
            Storage::Device(_) => self.buffer(t).map(|b| b.ident).unwrap_or(u64::MAX),
        }
    }

    fn producer_of(&self, t: &Tensor) -> u64 {
        self.buffer(t).map(|b| b.producer).unwrap_or(HOST_PRODUCER)
    }

    /// (family, site) keys of an op on these inputs.
    fn keys(&self, kind: &Kind, op: &Op, inputs: &[&Tensor]) -> (u64, u64) {
        let mut h = DefaultHasher::new();
        format!("{op:?}").hash(&mut h);
        for (i, t) in inputs.iter().enumerate() {
            if kind.is_weight_input(i) {
                (1u8, self.ident_of(t)).hash(&mut h);
            } else {
                (0u8, self.producer_of(t)).hash(&mut h);
            }
        }
        let family = h.finish().max(1);
        let mut h = DefaultHasher::new();
        family.hash(&mut h);
        for t in inputs {
            t.dims().hash(&mut h);
        }
        (family, h.finish())
    }

    fn dtype_ok(kind: &Kind, i: usize, d: DType) -> bool {
        matches!(d, DType::F32 | DType::F16 | DType::BF16)
            || (d.is_quantized() && matches!(kind, Kind::Linear) && i == 1)
    }

    fn compile_site(&self, st: &mut State, key: u64) {
        let scheme = self.config.scheme;
        let Some(site) = st.sites.get_mut(&key) else {
            return;
        };
        let SiteState::Calibrating { inputs, output, .. } = &site.state else {
            return;
        };
        let in_q = inputs.iter().map(|o| o.qparams(scheme)).collect();
        let out_q = output.qparams(scheme);
        let fam = site.family;
        site.state = SiteState::Compiled {
            inputs: in_q,
            output: out_q,
        };
        let f = st.families.entry(fam).or_default();
        f.compiled += 1;
        let re = f.compiled > 1;
        st.counters.compiles += 1;
        if re {
            st.counters.recompiles += 1;
        }
    }

    fn new_buffer(
        &self,
        data: Vec<f32>,
        dims: Vec<usize>,
        q: Option<QParams>,
        shadow: Option<Arc<Vec<f32>>>,
        producer: u64,
        ident: u64,
    ) -> Tensor {
        let buf = NpuBuffer {
            backend: self.name.clone(),
            data: Arc::new(data),
            dims: dims.clone(),
            q,
            shadow,
            producer,
            ident,
            weight: OnceLock::new(),
        };
        Tensor::from_device(Arc::new(buf), &dims, DType::F32)
    }
}

impl Backend for SimNpu {
    fn name(&self) -> &str {
        &self.name
    }

    fn precision_error(&self) -> Option<edgeflow_runtime::PrecisionError> {
        let r = self.error_report();
        let o = &r.overall_local;
        (r.shadow && o.elements > 0).then_some(edgeflow_runtime::PrecisionError {
            elements: o.elements,
            sqnr_db: o.sqnr_db,
            max_err_over_range: o.max_err_over_range,
        })
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Npu
    }

    fn adapter(&self) -> String {
        SIM_ADAPTER.to_string()
    }

    fn supports(&self, op: &Op, inputs: &[&Tensor]) -> bool {
        let Some(kind) = Kind::of(op) else {
            return false;
        };
        for (i, t) in inputs.iter().enumerate() {
            if !Self::dtype_ok(&kind, i, t.dtype()) {
                return false;
            }
            if let Storage::Device(b) = t.storage() {
                if b.backend() != &*self.name {
                    return false;
                }
            }
        }
        let dims: Vec<&[usize]> = inputs.iter().map(|t| t.dims()).collect();
        if kind.out_dims(op.name(), &dims).is_err() {
            return false;
        }
        if matches!(kind, Kind::Reshape { .. }) {
            return true;
        }
        let (family, site) = self.keys(&kind, op, inputs);
        let mut st = self.lock();
        if st.sites.contains_key(&site) {
            return true;
        }
        let admitted = st.families.get(&family).map(|f| f.shapes).unwrap_or(0);
        if admitted > self.config.recompile_budget || st.sites.len() >= self.config.max_sites {
            st.counters.budget_rejections += 1;
            return false;
        }
        true
    }

    fn holds(&self, t: &Tensor) -> bool {
        self.buffer(t).is_some()
    }

    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        if self.holds(t) {
            return Ok(t.clone());
        }
        let ident = self.ident_of(t);
        let data: Vec<f32> = match t.storage() {
            Storage::Host(c) => c
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?,
            Storage::Quantized(q) => dequantize(q)?,
            Storage::Device(b) => {
                return Err(self.err(format!(
                    "cannot upload a tensor held by `{}`; download it to the host first",
                    b.backend()
                )))
            }
        };
        Ok(self.new_buffer(data, t.dims().to_vec(), None, None, HOST_PRODUCER, ident))
    }

    fn download(&self, t: &Tensor) -> Result<Tensor> {
        if t.is_host() {
            return Ok(t.clone());
        }
        let b = self
            .buffer(t)
            .ok_or_else(|| self.err("download: tensor is held by another backend"))?;
        Tensor::from_vec(b.data.to_vec(), &b.dims)
    }

    fn execute(&self, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
        let name = op.name();
        let kind = Kind::of(op).ok_or_else(|| Error::Unsupported {
            backend: self.name.to_string(),
            op: name,
            msg: "outside the simulated NPU's int8 op set".into(),
        })?;
        let bufs: Vec<&NpuBuffer> = inputs
            .iter()
            .map(|t| {
                self.buffer(t).ok_or_else(|| {
                    self.err(format!(
                        "{name}: input not resident on the NPU (upload it first)"
                    ))
                })
            })
            .collect::<Result<_>>()?;
        let dims: Vec<&[usize]> = bufs.iter().map(|b| b.dims.as_slice()).collect();
        let out_dims = kind.out_dims(name, &dims)?;
        let (family, key) = self.keys(&kind, op, inputs);
        let shadow_on = self.shadow_enabled();
        let any_shadow = bufs.iter().any(|b| b.shadow.is_some());
        let shadow_inputs = || -> Vec<(&[f32], &[usize])> {
            bufs.iter()
                .map(|b| (b.shadow().unwrap_or(&b.data), b.dims.as_slice()))
                .collect()
        };
        let plain_inputs: Vec<(&[f32], &[usize])> = bufs
            .iter()
            .map(|b| (b.data.as_slice(), b.dims.as_slice()))
            .collect();

        if let Kind::Reshape { .. } = kind {
            let b = bufs[0];
            return Ok(self.new_buffer(
                b.data.to_vec(),
                out_dims,
                b.q,
                b.shadow.clone(),
                family,
                family,
            ));
        }

        // Find or admit the site.
        let state = {
            let mut st = self.lock();
            if !st.sites.contains_key(&key) {
                let fam = st.families.entry(family).or_default();
                fam.shapes += 1;
                let n_act = kind.activation_inputs();
                st.sites.insert(
                    key,
                    Site {
                        family,
                        state: SiteState::Calibrating {
                            runs: 0,
                            inputs: vec![RangeObserver::default(); n_act],
                            output: RangeObserver::default(),
                        },
                    },
                );
            }
            st.sites
                .get(&key)
                .map(|s| s.state.clone())
                .ok_or_else(|| self.err("internal: site vanished"))?
        };

        let n_act = kind.activation_inputs();
        let scheme = self.config.scheme;
        // Parameters: frozen once compiled; while calibrating, provisional
        // ones from the ranges seen so far *including this call* (dynamic
        // quantization), so even warm-up calls compute in int8.
        let (in_q, out_q, f32_out) = match state {
            SiteState::Compiled { inputs, output } => (inputs, output, None),
            SiteState::Calibrating { .. } => {
                let y32 = exec_f32(&kind, &plain_inputs, &out_dims)?;
                let mut st = self.lock();
                st.counters.calibration_runs += 1;
                let mut compile = false;
                let params = match st.sites.get_mut(&key).map(|s| &mut s.state) {
                    Some(SiteState::Calibrating {
                        runs,
                        inputs: obs,
                        output,
                    }) => {
                        for (o, b) in obs.iter_mut().zip(&bufs[..n_act]) {
                            o.observe(&b.data);
                        }
                        output.observe(&y32);
                        *runs += 1;
                        compile = !self.manual_calibration.load(Ordering::SeqCst)
                            && *runs >= self.config.calibration_runs;
                        Some((
                            obs.iter().map(|o| o.qparams(scheme)).collect::<Vec<_>>(),
                            output.qparams(scheme),
                        ))
                    }
                    // Compiled by a concurrent call in the meantime.
                    Some(SiteState::Compiled { inputs, output }) => Some((inputs.clone(), *output)),
                    // Forgotten by a concurrent `reset_sites`.
                    None => None,
                };
                if compile {
                    self.compile_site(&mut st, key);
                }
                drop(st);
                let (i, o) = params
                    .ok_or_else(|| self.err("op site was reset while running; run the op again"))?;
                (i, o, Some(y32))
            }
        };
        let out_q = kind.fixed_output_q(scheme).unwrap_or(out_q);
        let acts: Vec<ActIn<'_>> = bufs[..n_act]
            .iter()
            .zip(&in_q)
            .map(|(b, q)| ActIn {
                data: &b.data,
                dims: &b.dims,
                // int8 data keeps its producer's codes (no requantization).
                q: b.q.unwrap_or(*q),
            })
            .collect();
        let weight = if kind.is_weight_input(1) {
            Some(bufs[1].quantized_weight())
        } else {
            None
        };
        let bias = if kind.is_weight_input(2) {
            bufs.get(2).map(|b| b.data.as_slice())
        } else {
            None
        };
        let y = exec_int8(&kind, &acts, weight.as_deref(), bias, out_q, &out_dims)?;
        let shadow = if shadow_on {
            let local = match f32_out {
                Some(v) => v,
                None => exec_f32(&kind, &plain_inputs, &out_dims)?,
            };
            let e2e = if any_shadow {
                exec_f32(&kind, &shadow_inputs(), &out_dims)?
            } else {
                local.clone()
            };
            if let Ok(mut book) = self.book.lock() {
                book.record(name, &y, &local, &e2e);
            }
            Some(Arc::new(e2e))
        } else {
            None
        };
        self.lock().counters.int8_runs += 1;
        Ok(self.new_buffer(y, out_dims, Some(out_q), shadow, family, family))
    }
}

fn dequantize(q: &QTensor) -> Result<Vec<f32>> {
    Ok(q.dequantize(&candle_core::Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}
