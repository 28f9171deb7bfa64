//! Helpers shared by the control integration tests.
#![allow(dead_code)]

use edgeflow_graph::Registry;
use std::path::PathBuf;

/// Builtin kinds plus the control kinds.
pub(crate) fn registry() -> Registry {
    let mut r = Registry::builtin();
    edgeflow_control::register(&mut r);
    r
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// The repository root.
pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Python of the zenoh venv, or a panic that names the script to run.
pub(crate) fn zenoh_python() -> PathBuf {
    let venv = std::env::var_os("EDGEFLOW_ZENOH_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
                });
            cache.join("edgeflow/venvs/zenoh")
        });
    let py = venv.join("bin/python");
    assert!(
        py.exists(),
        "the Python zenoh venv is missing ({} not found): create it with scripts/python_zenoh_env.sh \
         (pinned eclipse-zenoh from examples/python/requirements.txt); scripts/test.sh does this",
        py.display()
    );
    py
}
