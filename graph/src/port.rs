//! Typed ports. A pipeline is valid only when every edge joins ports of
//! compatible types; a mismatch names the stage to insert.

use serde::Serialize;
use std::fmt;

/// The type of data a port carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PortType {
    /// f32 audio. `None` fields accept any rate / channel count.
    Audio {
        /// Required sample rate, if fixed.
        sample_rate: Option<u32>,
        /// Required channel count, if fixed.
        channels: Option<u16>,
    },
    /// UTF-8 text.
    Text,
    /// Token ids.
    Tokens,
    /// Runtime tensors.
    Tensor,
    /// Image frames.
    Image,
    /// Robot action chunks.
    Actions,
    /// Events (ticks, speech start/end, flush...).
    Control,
    /// Anything (generic stages: passthrough, recorders, host ports).
    Any,
}

impl PortType {
    /// Audio of any format.
    pub const AUDIO_ANY: PortType = PortType::Audio {
        sample_rate: None,
        channels: None,
    };

    /// Audio at a fixed rate, any channels.
    pub fn audio_at(rate: u32) -> PortType {
        PortType::Audio {
            sample_rate: Some(rate),
            channels: None,
        }
    }

    /// Whether data of type `self` (an output) may flow into `to` (an input).
    /// On mismatch, returns a hint saying what to insert.
    pub fn check_into(&self, to: &PortType) -> Result<(), String> {
        use PortType::*;
        match (self, to) {
            (Any, _) | (_, Any) => Ok(()),
            (
                Audio {
                    sample_rate: r1,
                    channels: c1,
                },
                Audio {
                    sample_rate: r2,
                    channels: c2,
                },
            ) => {
                if let (Some(a), Some(b)) = (r1, r2) {
                    if a != b {
                        return Err(format!(
                            "sample rate {a} Hz does not match {b} Hz: insert a `resample` stage \
                             (kind: resample, params: {{ to: {b} }}) between them"
                        ));
                    }
                }
                if let (Some(a), Some(b)) = (c1, c2) {
                    if a != b {
                        return Err(format!(
                            "{a} channel(s) do not match {b}: insert a `channel_mix` stage \
                             (kind: channel_mix, params: {{ channels: {b} }}) between them"
                        ));
                    }
                }
                Ok(())
            }
            (a, b) if std::mem::discriminant(a) == std::mem::discriminant(b) => Ok(()),
            (Tokens, Text) => Err(
                "tokens cannot feed a text input: insert a detokenizer stage, or take the stage's text output".into(),
            ),
            (Text, Tokens) => Err(
                "text cannot feed a tokens input: insert a tokenizer / text front-end stage".into(),
            ),
            (a, b) => Err(format!("{a} output cannot feed a {b} input")),
        }
    }
}

impl fmt::Display for PortType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortType::Audio {
                sample_rate,
                channels,
            } => {
                f.write_str("audio")?;
                match (sample_rate, channels) {
                    (None, None) => Ok(()),
                    (Some(r), None) => write!(f, "({r} Hz)"),
                    (None, Some(c)) => write!(f, "({c} ch)"),
                    (Some(r), Some(c)) => write!(f, "({r} Hz, {c} ch)"),
                }
            }
            PortType::Text => f.write_str("text"),
            PortType::Tokens => f.write_str("tokens"),
            PortType::Tensor => f.write_str("tensor"),
            PortType::Image => f.write_str("image"),
            PortType::Actions => f.write_str("actions"),
            PortType::Control => f.write_str("control"),
            PortType::Any => f.write_str("any"),
        }
    }
}

/// One named port of a stage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortSpec {
    /// Name used in YAML (`stage.port`).
    pub name: String,
    /// Data type.
    pub ty: PortType,
    /// For inputs: the pipeline is invalid when nothing feeds it.
    pub required: bool,
    /// One line of documentation.
    pub doc: String,
}

impl PortSpec {
    /// A required port.
    pub fn new(name: &str, ty: PortType, doc: &str) -> Self {
        PortSpec {
            name: name.into(),
            ty,
            required: true,
            doc: doc.into(),
        }
    }

    /// An optional port.
    pub fn optional(name: &str, ty: PortType, doc: &str) -> Self {
        PortSpec {
            required: false,
            ..Self::new(name, ty, doc)
        }
    }
}

/// A stage instance's inputs and outputs, in index order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Ports {
    /// Input ports; `Input::port` indexes this.
    pub inputs: Vec<PortSpec>,
    /// Output ports; `StageCtx::emit` takes an index into this.
    pub outputs: Vec<PortSpec>,
}

impl Ports {
    /// Index of an input port by name.
    pub fn input(&self, name: &str) -> Option<usize> {
        self.inputs.iter().position(|p| p.name == name)
    }

    /// Index of an output port by name.
    pub fn output(&self, name: &str) -> Option<usize> {
        self.outputs.iter().position(|p| p.name == name)
    }
}
