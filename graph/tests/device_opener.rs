//! Devices handed to factories by the engine: `BuildEnv::open_device` uses
//! the registry's opener, and says which registry to use without one.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use edgeflow_graph::{
    BuildEnv, Params, Pipeline, PortSpec, PortType, Ports, Registry, Stage, StageError,
    StageFactory, StageInfo,
};
use edgeflow_runtime::DeviceSpec;
use std::sync::{Arc, Mutex};

/// A sink whose build opens its device, as model stages do.
struct NeedsDevice;

impl StageFactory for NeedsDevice {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "needs_device",
            doc: "opens its device at build",
            params: vec![],
            ports: Ports {
                inputs: vec![PortSpec::new("in", PortType::Any, "")],
                outputs: vec![],
            },
            source: false,
        }
    }
    fn build(&self, _p: &Params, env: &BuildEnv) -> Result<Box<dyn Stage>, StageError> {
        let dev = env.open_device()?;
        Err(StageError::msg(format!(
            "opened {dev:?}; not expected here"
        )))
    }
}

const YAML: &str = "
name: dev
stages:
  - { id: t, kind: text, params: { text: hi } }
  - { id: m, kind: needs_device, device: gpu:1 }
edges:
  - { from: t.out, to: m.in }
";

fn registry() -> Registry {
    let mut r = Registry::builtin();
    r.register(NeedsDevice);
    r
}

#[test]
fn without_an_opener_the_error_names_the_registry_to_use() {
    let r = registry();
    assert!(r.device_opener().is_none());
    let p = Pipeline::from_yaml(YAML, &r).unwrap();
    let Err(e) = p.start() else {
        panic!("no opener")
    };
    let msg = e.to_string();
    assert!(
        msg.contains("stage `m`: cannot open device `gpu:1`"),
        "{msg}"
    );
    assert!(msg.contains("`edgeflow::registry()`"), "{msg}");
    assert!(msg.contains("Registry::set_device_opener"), "{msg}");
}

#[test]
fn the_registry_opener_gets_the_stage_placement() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut r = registry();
    let log = seen.clone();
    r.set_device_opener(move |spec| {
        log.lock().unwrap().push(spec);
        Err(edgeflow_runtime::Error::DeviceUnavailable {
            device: spec.to_string(),
            reason: "the test opener opens nothing".into(),
        })
    });
    // A clone of the registry carries the opener too.
    let p = Pipeline::from_yaml(YAML, &r.clone()).unwrap();
    let Err(e) = p.start() else {
        panic!("test opener fails")
    };
    assert!(
        e.to_string().contains("the test opener opens nothing"),
        "{e}"
    );
    assert_eq!(*seen.lock().unwrap(), [DeviceSpec::Gpu(1)]);
}
