//! A Piper voice config (`<voice>.onnx.json`), the part of it edgeflow uses.

use crate::{Error, Result};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

/// Piper's beginning-of-sentence symbol.
pub const BOS: &str = "^";
/// Piper's end-of-sentence symbol.
pub const EOS: &str = "$";
/// Piper's padding symbol, inserted after every phoneme.
pub const PAD: &str = "_";

/// Synthesis scales; Piper's defaults are the voice's `inference` section.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct InferenceScales {
    /// Scale of the prior noise (expressiveness); 0 makes the output deterministic.
    #[serde(default = "default_noise_scale")]
    pub noise_scale: f32,
    /// Phoneme length multiplier (> 1 speaks slower).
    #[serde(default = "default_length_scale")]
    pub length_scale: f32,
    /// Scale of the duration predictor's noise; 0 gives its mean durations.
    #[serde(default = "default_noise_w")]
    pub noise_w: f32,
}

fn default_noise_scale() -> f32 {
    0.667
}
fn default_length_scale() -> f32 {
    1.0
}
fn default_noise_w() -> f32 {
    0.8
}

impl Default for InferenceScales {
    fn default() -> Self {
        InferenceScales {
            noise_scale: default_noise_scale(),
            length_scale: default_length_scale(),
            noise_w: default_noise_w(),
        }
    }
}

#[derive(Debug, Deserialize)]
struct RawConfig {
    audio: RawAudio,
    espeak: Option<RawEspeak>,
    #[serde(default)]
    inference: Option<InferenceScales>,
    #[serde(default)]
    phoneme_type: Option<String>,
    phoneme_id_map: HashMap<String, Vec<i64>>,
    num_symbols: usize,
    #[serde(default)]
    num_speakers: Option<usize>,
    #[serde(default)]
    hop_length: Option<usize>,
}

#[derive(Debug, Deserialize)]
struct RawAudio {
    sample_rate: u32,
}

#[derive(Debug, Deserialize)]
struct RawEspeak {
    voice: String,
}

/// What edgeflow needs from a Piper voice config.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceConfig {
    /// Output sample rate (Hz).
    pub sample_rate: u32,
    /// espeak-ng voice for phonemization, e.g. `en-us`.
    pub espeak_voice: String,
    /// Default synthesis scales.
    pub scales: InferenceScales,
    /// Phoneme (one or more code points) to ids.
    pub phoneme_id_map: HashMap<String, Vec<i64>>,
    /// Size of the text embedding table.
    pub num_symbols: usize,
    /// Number of speakers (1 for single-speaker voices).
    pub num_speakers: usize,
    /// Audio samples per latent frame.
    pub hop_length: usize,
}

impl VoiceConfig {
    /// Read a `.onnx.json` voice config.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::parse(&text).map_err(|msg| Error::bad_file(path, msg))
    }

    /// Parse the JSON text of a voice config.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| format!("not a Piper voice config: {e}"))?;
        if let Some(t) = raw.phoneme_type.as_deref() {
            if t != "espeak" {
                return Err(format!(
                    "phoneme_type `{t}` is not supported (only espeak voices)"
                ));
            }
        }
        let espeak_voice = raw
            .espeak
            .map(|e| e.voice)
            .ok_or_else(|| "no `espeak.voice`".to_string())?;
        for sym in [BOS, EOS, PAD] {
            if !raw.phoneme_id_map.contains_key(sym) {
                return Err(format!("phoneme_id_map has no `{sym}`"));
            }
        }
        if let Some((p, ids)) = raw
            .phoneme_id_map
            .iter()
            .find(|(_, ids)| ids.iter().any(|&i| i < 0 || i as usize >= raw.num_symbols))
        {
            return Err(format!(
                "phoneme `{p}` maps to {ids:?}, outside 0..{}",
                raw.num_symbols
            ));
        }
        Ok(VoiceConfig {
            sample_rate: raw.audio.sample_rate,
            espeak_voice,
            scales: raw.inference.unwrap_or_default(),
            phoneme_id_map: raw.phoneme_id_map,
            num_symbols: raw.num_symbols,
            num_speakers: raw.num_speakers.unwrap_or(1),
            hop_length: raw.hop_length.unwrap_or(256),
        })
    }

    /// Phonemes to ids as Piper does: `^`, then each known phoneme followed
    /// by `_`, then `$`. Phonemes missing from the map are skipped (and
    /// returned, so the caller can report them).
    pub fn phonemes_to_ids(&self, phonemes: &[String]) -> (Vec<i64>, Vec<String>) {
        let map = &self.phoneme_id_map;
        let get = |s: &str| map.get(s).map(Vec::as_slice).unwrap_or(&[]);
        let mut ids = Vec::with_capacity(phonemes.len() * 2 + 3);
        let mut missing = Vec::new();
        ids.extend_from_slice(get(BOS));
        ids.extend_from_slice(get(PAD));
        for p in phonemes {
            match map.get(p.as_str()) {
                Some(v) => {
                    ids.extend_from_slice(v);
                    ids.extend_from_slice(get(PAD));
                }
                None => missing.push(p.clone()),
            }
        }
        ids.extend_from_slice(get(EOS));
        (ids, missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINI: &str = r#"{"audio":{"sample_rate":22050},"espeak":{"voice":"en-us"},
        "inference":{"noise_scale":0.5,"length_scale":1.1,"noise_w":0.7},
        "phoneme_type":"espeak","phoneme_id_map":{"_":[0],"^":[1],"$":[2]," ":[3],"a":[14]},
        "num_symbols":256,"num_speakers":1}"#;

    #[test]
    fn parses_and_maps_ids_like_piper() {
        let c = VoiceConfig::parse(MINI).expect("parse");
        assert_eq!(c.sample_rate, 22050);
        assert_eq!(c.scales.length_scale, 1.1);
        assert_eq!(c.hop_length, 256);
        let ph: Vec<String> = ["a", " ", "x", "a"].iter().map(|s| s.to_string()).collect();
        let (ids, missing) = c.phonemes_to_ids(&ph);
        assert_eq!(ids, vec![1, 0, 14, 0, 3, 0, 14, 0, 2]);
        assert_eq!(missing, vec!["x".to_string()]);
    }

    #[test]
    fn rejects_non_espeak_and_bad_ids() {
        let t = MINI.replace("\"espeak\",", "\"text\",");
        assert!(VoiceConfig::parse(&t)
            .expect_err("must fail")
            .contains("not supported"));
        let t = MINI.replace("[14]", "[999]");
        assert!(VoiceConfig::parse(&t)
            .expect_err("must fail")
            .contains("outside"));
    }
}
