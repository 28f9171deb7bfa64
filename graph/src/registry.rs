//! Stage kinds: what a `kind:` in YAML names, the params it takes, the ports
//! it exposes, and how to build an instance.

use crate::port::Ports;
use crate::stage::{Stage, StageError};
use edgeflow_runtime::{Device, DeviceSpec};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Type of a stage parameter, for validation and `edgeflow stages`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamType {
    /// true / false.
    Bool,
    /// Whole number.
    Int,
    /// Number.
    Float,
    /// String.
    String,
    /// File path (relative paths resolve against the pipeline file's folder).
    /// Not checked at validation: use it for outputs and optional caches.
    Path,
    /// A path the stage reads (model weights, an input WAV...): like `Path`,
    /// and validation fails, naming the resolved path, when it does not exist.
    InputPath,
    /// Duration: a number of seconds or a string like `20ms`, `1.5s`.
    Duration,
    /// List or map (free-form).
    Any,
}

/// One documented parameter of a stage kind.
#[derive(Debug, Clone, Serialize)]
pub struct ParamInfo {
    /// Name under `params:`.
    pub name: &'static str,
    /// Type.
    pub ty: ParamType,
    /// Default when absent (`None` = required, unless `optional`).
    pub default: Option<Value>,
    /// May be absent with no default.
    pub optional: bool,
    /// One line of documentation.
    pub doc: &'static str,
}

impl ParamInfo {
    /// A parameter with a default.
    pub fn new(
        name: &'static str,
        ty: ParamType,
        default: impl Into<Value>,
        doc: &'static str,
    ) -> Self {
        ParamInfo {
            name,
            ty,
            default: Some(default.into()),
            optional: false,
            doc,
        }
    }

    /// A required parameter.
    pub fn required(name: &'static str, ty: ParamType, doc: &'static str) -> Self {
        ParamInfo {
            name,
            ty,
            default: None,
            optional: false,
            doc,
        }
    }

    /// An optional parameter without default.
    pub fn optional(name: &'static str, ty: ParamType, doc: &'static str) -> Self {
        ParamInfo {
            name,
            ty,
            default: None,
            optional: true,
            doc,
        }
    }
}

/// Static description of a stage kind (`edgeflow stages` prints it).
#[derive(Debug, Clone, Serialize)]
pub struct StageInfo {
    /// The `kind:` name.
    pub kind: &'static str,
    /// What it does, one or two sentences.
    pub doc: &'static str,
    /// Parameters.
    pub params: Vec<ParamInfo>,
    /// Ports with default params (actual types may depend on params).
    pub ports: Ports,
    /// Produces messages without inputs (sources are polled).
    pub source: bool,
}

/// A stage's parameters, after defaults and `--set` overrides.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Params {
    stage: String,
    values: BTreeMap<String, Value>,
}

impl Params {
    /// Parameters of stage `stage`.
    pub fn new(stage: impl Into<String>, values: BTreeMap<String, Value>) -> Self {
        Params {
            stage: stage.into(),
            values,
        }
    }

    /// The stage id these belong to (for error messages).
    pub fn stage(&self) -> &str {
        &self.stage
    }

    /// Raw values.
    pub fn values(&self) -> &BTreeMap<String, Value> {
        &self.values
    }

    /// Set a value.
    pub fn set(&mut self, key: &str, v: Value) {
        self.values.insert(key.to_string(), v);
    }

    /// Whether a key is present.
    pub fn contains(&self, key: &str) -> bool {
        self.values.get(key).is_some_and(|v| !v.is_null())
    }

    /// Typed value, or `None` when absent / null.
    pub fn opt<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ParamError> {
        match self.values.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => serde_json::from_value(v.clone())
                .map(Some)
                .map_err(|e| ParamError {
                    stage: self.stage.clone(),
                    param: key.to_string(),
                    msg: format!("has the wrong type ({e}); got {v}"),
                }),
        }
    }

    /// Typed required value.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Result<T, ParamError> {
        self.opt(key)?.ok_or_else(|| ParamError {
            stage: self.stage.clone(),
            param: key.to_string(),
            msg: "is required: add it under `params:` or pass --set STAGE.PARAM=VALUE".into(),
        })
    }

    /// Typed value with a default.
    pub fn get_or<T: DeserializeOwned>(&self, key: &str, default: T) -> Result<T, ParamError> {
        Ok(self.opt(key)?.unwrap_or(default))
    }

    /// A duration: a number (seconds) or a string with unit (`20ms`, `1.5s`, `2m`).
    pub fn duration(&self, key: &str) -> Result<Option<std::time::Duration>, ParamError> {
        match self.values.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => crate::spec::parse_duration_value(v)
                .map(Some)
                .map_err(|msg| ParamError {
                    stage: self.stage.clone(),
                    param: key.to_string(),
                    msg,
                }),
        }
    }

    /// A path param resolved against `env.base_dir`.
    pub fn path(&self, key: &str, env: &BuildEnv) -> Result<Option<PathBuf>, ParamError> {
        Ok(self.opt::<String>(key)?.map(|p| env.resolve(&p)))
    }

    /// A typed error about `key`, for stage-specific checks.
    pub fn error(&self, key: &str, msg: impl Into<String>) -> ParamError {
        ParamError {
            stage: self.stage.clone(),
            param: key.to_string(),
            msg: msg.into(),
        }
    }
}

/// A bad parameter value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("stage `{stage}`: param `{param}` {msg}")]
pub struct ParamError {
    /// Stage id.
    pub stage: String,
    /// Parameter name.
    pub param: String,
    /// What is wrong and how to fix it.
    pub msg: String,
}

/// Opens the device a placement names: the backends crate's `open`, which
/// the facade (`edgeflow::registry()`) installs with
/// [`Registry::set_device_opener`]. The engine hands it to factories through
/// [`BuildEnv::open_device`], so model crates need no concrete backend.
#[derive(Clone)]
pub struct DeviceOpener(Arc<dyn Fn(DeviceSpec) -> edgeflow_runtime::Result<Device> + Send + Sync>);

impl DeviceOpener {
    /// Wrap an opening function (e.g. `edgeflow_backends::open`).
    pub fn new(
        open: impl Fn(DeviceSpec) -> edgeflow_runtime::Result<Device> + Send + Sync + 'static,
    ) -> Self {
        DeviceOpener(Arc::new(open))
    }

    /// Open the device `spec` names.
    pub fn open(&self, spec: DeviceSpec) -> edgeflow_runtime::Result<Device> {
        (self.0)(spec)
    }
}

impl fmt::Debug for DeviceOpener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DeviceOpener")
    }
}

/// What a factory gets besides params when building a stage.
#[derive(Debug, Clone)]
pub struct BuildEnv {
    /// Stage id.
    pub stage_id: String,
    /// Placement from YAML `device:`.
    pub device: DeviceSpec,
    /// Thread budget from YAML `threads:`.
    pub threads: usize,
    /// Folder of the pipeline file; relative paths resolve against it.
    pub base_dir: PathBuf,
    /// The registry's device opener ([`Registry::set_device_opener`]);
    /// factories call [`BuildEnv::open_device`] rather than this.
    pub device_opener: Option<DeviceOpener>,
}

impl BuildEnv {
    /// Open this stage's device (`device:` in YAML) with the registry's
    /// opener. Fails with what to do when the registry has none.
    pub fn open_device(&self) -> Result<Device, StageError> {
        match &self.device_opener {
            Some(o) => Ok(o.open(self.device)?),
            None => Err(StageError::msg(format!(
                "stage `{}`: cannot open device `{}`: this registry has no device opener; \
                 build the pipeline with `edgeflow::registry()`, or call \
                 `Registry::set_device_opener(edgeflow_backends::open)` on your own registry",
                self.stage_id, self.device
            ))),
        }
    }

    /// Resolve a path against the pipeline's folder.
    pub fn resolve(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }
}

/// A stage kind: describes itself and builds instances.
pub trait StageFactory: Send + Sync {
    /// Static description: kind name, doc, params, default ports.
    fn info(&self) -> StageInfo;
    /// The ports of an instance with these params (types may depend on them,
    /// e.g. a WAV source's sample rate). Errors are validation errors; this
    /// must be cheap and must not load models.
    fn ports(&self, params: &Params, env: &BuildEnv) -> Result<Ports, StageError> {
        let _ = (params, env);
        Ok(self.info().ports)
    }
    /// Build an instance (may load weights, open devices).
    fn build(&self, params: &Params, env: &BuildEnv) -> Result<Box<dyn Stage>, StageError>;
}

/// The set of stage kinds a pipeline may use.
#[derive(Clone, Default)]
pub struct Registry {
    kinds: BTreeMap<&'static str, Arc<dyn StageFactory>>,
    device_opener: Option<DeviceOpener>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.kinds.keys()).finish()
    }
}

impl Registry {
    /// An empty registry. [`Registry::builtin`] (in `builtin/`) holds the
    /// engine's own kinds.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Add (or replace) a kind.
    pub fn register(&mut self, f: impl StageFactory + 'static) -> &mut Self {
        let info = f.info();
        self.kinds.insert(info.kind, Arc::new(f));
        self
    }

    /// Install the function that opens devices for the stages this registry
    /// builds ([`BuildEnv::open_device`]); the facade installs
    /// `edgeflow_backends::open`.
    pub fn set_device_opener(
        &mut self,
        open: impl Fn(DeviceSpec) -> edgeflow_runtime::Result<Device> + Send + Sync + 'static,
    ) -> &mut Self {
        self.device_opener = Some(DeviceOpener::new(open));
        self
    }

    /// The installed device opener, if any.
    pub fn device_opener(&self) -> Option<&DeviceOpener> {
        self.device_opener.as_ref()
    }

    /// Look a kind up.
    pub fn get(&self, kind: &str) -> Option<&Arc<dyn StageFactory>> {
        self.kinds.get(kind)
    }

    /// All kind names, sorted.
    pub fn kinds(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.kinds.keys().copied()
    }

    /// Descriptions of every kind, sorted by name.
    pub fn infos(&self) -> Vec<StageInfo> {
        self.kinds.values().map(|f| f.info()).collect()
    }
}
