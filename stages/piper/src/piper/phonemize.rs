//! Phonemes from the `espeak-ng` program, assembled the way Piper does, and
//! the whole front end: text -> sentences of phoneme ids.
//!
//! espeak-ng is GPL-3, so it is called as a separate program (never linked
//! or vendored). Piper's phonemizer (piper-tts 1.8, `phonemize_espeak.py`)
//! asks libespeak-ng for IPA phonemes clause by clause, together with each
//! clause's terminator; it removes language-switch flags like `(en)`,
//! appends the terminator (plus a space after `,` `:` `;`), starts a new
//! sentence after `.` `?` `!`, and splits the result into NFD code points.
//! The espeak-ng command line prints one line per clause but drops the
//! terminators, so the clauses come from [`super::text::split`] and are sent
//! in one call, separated by blank lines (a paragraph break ends a clause in
//! espeak-ng); when espeak-ng splits a clause further, that clause is
//! phonemized on its own instead.

use super::config::VoiceConfig;
use super::text::{self, Sentence};
use crate::{Error, Result};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use unicode_normalization::UnicodeNormalization;

/// Longest text accepted in one call (characters); longer input is an error
/// rather than minutes of synthesis.
pub const MAX_TEXT_CHARS: usize = 100_000;

/// Calls `espeak-ng` for IPA phonemes.
#[derive(Debug, Clone)]
pub struct EspeakPhonemizer {
    program: PathBuf,
    voice: String,
}

impl EspeakPhonemizer {
    /// A phonemizer for an espeak-ng voice (e.g. `en-us`). The program is
    /// `$EDGEFLOW_ESPEAK_NG` or `espeak-ng` on the `PATH`.
    pub fn new(voice: &str) -> Self {
        let program = std::env::var_os("EDGEFLOW_ESPEAK_NG")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("espeak-ng"));
        EspeakPhonemizer {
            program,
            voice: voice.to_string(),
        }
    }

    /// The espeak-ng voice.
    pub fn voice(&self) -> &str {
        &self.voice
    }

    fn program_error(&self, msg: String) -> Error {
        Error::Program {
            program: self.program.display().to_string(),
            msg,
        }
    }

    /// Raw IPA output lines (one per clause espeak-ng found) for `input`.
    pub fn ipa_lines(&self, input: &str) -> Result<Vec<String>> {
        let mut child = Command::new(&self.program)
            .args(["-q", "-b", "1", "--ipa", "--stdin", "-v", &self.voice])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                self.program_error(format!(
                    "{e}; install espeak-ng (Debian: `apt-get install espeak-ng`) or set EDGEFLOW_ESPEAK_NG"
                ))
            })?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input.as_bytes())
                .map_err(|e| self.program_error(format!("writing its input: {e}")))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| self.program_error(format!("waiting for it: {e}")))?;
        if !out.status.success() {
            return Err(self.program_error(format!(
                "{} ({})",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let stdout = String::from_utf8(out.stdout)
            .map_err(|_| self.program_error("its output is not UTF-8".into()))?;
        Ok(stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// Phonemes of each sentence, as Piper assembles them (NFD code points,
    /// terminators kept).
    pub fn phonemize(&self, sentences: &[Sentence]) -> Result<Vec<Vec<String>>> {
        let clauses: Vec<&text::Clause> = sentences.iter().flat_map(|s| &s.clauses).collect();
        if clauses.is_empty() {
            return Ok(Vec::new());
        }
        let joined = clauses
            .iter()
            .map(|c| c.text.as_str())
            .collect::<Vec<_>>()
            .join("\n\n");
        let mut lines = self.ipa_lines(&joined)?;
        if lines.len() != clauses.len() {
            lines = clauses
                .iter()
                .map(|c| self.ipa_lines(&c.text).map(|l| l.join(" ")))
                .collect::<Result<_>>()?;
        }
        let mut lines = lines.into_iter();
        let mut out = Vec::with_capacity(sentences.len());
        for s in sentences {
            let mut phonemes = String::new();
            for c in &s.clauses {
                let line = lines.next().unwrap_or_default();
                phonemes.push_str(&strip_language_flags(&line));
                if let Some(t) = c.terminator {
                    phonemes.push(t);
                    if matches!(t, ',' | ':' | ';') {
                        phonemes.push(' ');
                    }
                }
            }
            out.push(phonemes.nfd().map(String::from).collect());
        }
        Ok(out)
    }
}

/// Remove espeak-ng's language-switch flags such as `(en)` / `(fr)`.
fn strip_language_flags(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find('(') {
        match rest[open..].find(')') {
            Some(close) if close > 1 => {
                out.push_str(&rest[..open]);
                rest = &rest[open + close + 1..];
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// One sentence ready for the model.
#[derive(Debug, Clone, PartialEq)]
pub struct PhonemizedSentence {
    /// The (normalized) sentence text.
    pub text: String,
    /// Its phonemes (code points).
    pub phonemes: Vec<String>,
    /// Its phoneme ids, with Piper's BOS / padding / EOS.
    pub ids: Vec<i64>,
}

/// Text to phoneme ids: normalization, sentence splitting, espeak-ng, the
/// voice's id map.
#[derive(Debug, Clone)]
pub struct FrontEnd {
    config: VoiceConfig,
    espeak: EspeakPhonemizer,
    normalize: bool,
}

impl FrontEnd {
    /// A front end for a voice; `normalize` turns text normalization on.
    pub fn new(config: VoiceConfig, normalize: bool) -> Self {
        let espeak = EspeakPhonemizer::new(&config.espeak_voice);
        FrontEnd {
            config,
            espeak,
            normalize,
        }
    }

    /// The voice config.
    pub fn config(&self) -> &VoiceConfig {
        &self.config
    }

    /// Sentences of `text`, phonemized. Empty or blank text gives none.
    pub fn sentences(&self, text: &str) -> Result<Vec<PhonemizedSentence>> {
        let mut out = Vec::new();
        self.for_each_sentence(text, &mut |s| {
            out.push(s);
            Ok(true)
        })?;
        Ok(out)
    }

    /// Phonemize `text` sentence by sentence into `f`, for streaming: the
    /// first sentence goes through espeak-ng alone and reaches `f` before
    /// the rest are phonemized (in one more espeak-ng run), so time to first
    /// audio does not grow with the length of the text. The sentences equal
    /// [`Self::sentences`]'s. `f` returns `false` to stop early.
    pub fn for_each_sentence(
        &self,
        text: &str,
        f: &mut dyn FnMut(PhonemizedSentence) -> Result<bool>,
    ) -> Result<()> {
        let n = text.chars().count();
        if n > MAX_TEXT_CHARS {
            return Err(Error::Text(format!(
                "text of {n} characters is longer than {MAX_TEXT_CHARS}; split it into several messages"
            )));
        }
        let normalized = if self.normalize {
            text::normalize(text)
        } else {
            text.split_whitespace().collect::<Vec<_>>().join(" ")
        };
        let sentences = text::split(&normalized);
        let cut = sentences.len().min(1);
        for part in [&sentences[..cut], &sentences[cut..]] {
            if part.is_empty() {
                continue;
            }
            let phonemes = self.espeak.phonemize(part)?;
            for (s, phonemes) in part.iter().zip(phonemes) {
                if phonemes.is_empty() {
                    continue;
                }
                let (ids, _missing) = self.config.phonemes_to_ids(&phonemes);
                let keep_going = f(PhonemizedSentence {
                    text: s.text(),
                    phonemes,
                    ids,
                })?;
                if !keep_going {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_language_flags_only() {
        assert_eq!(strip_language_flags("(en)hɛloʊ(fr) bɔ̃"), "hɛloʊ bɔ̃");
        assert_eq!(strip_language_flags("a () b ("), "a () b (");
    }
}
