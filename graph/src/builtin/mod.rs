//! Built-in stage kinds that need no model: timers, text in/out, host ports,
//! passthrough and a discarding sink. Each file holds one role; this one
//! registers them all.

mod io;
mod misc;
mod text;
mod time;

pub(crate) use io::{HostIn, HostOut};

use crate::port::{PortSpec, PortType, Ports};
use crate::registry::Registry;

/// Kind name of the host input stage.
pub const HOST_IN: &str = "host_in";
/// Kind name of the host output stage.
pub const HOST_OUT: &str = "host_out";

impl Registry {
    /// The engine's built-in kinds (timer, text, stdout, passthrough, host ports...).
    pub fn builtin() -> Self {
        let mut r = Self::empty();
        register(&mut r);
        r
    }
}

/// Add every built-in kind to `r`.
fn register(r: &mut Registry) {
    r.register(time::TimerKind);
    r.register(text::TextKind);
    r.register(io::StdoutKind);
    r.register(misc::PassthroughKind);
    r.register(misc::NullKind);
    r.register(io::HostInKind);
    r.register(io::HostOutKind);
    r.register(text::SentenceChunkerKind);
}

fn out_port(ty: PortType, doc: &str) -> Ports {
    Ports {
        inputs: vec![],
        outputs: vec![PortSpec::new("out", ty, doc)],
    }
}

fn in_port(ty: PortType, doc: &str) -> Ports {
    Ports {
        inputs: vec![PortSpec::new("in", ty, doc)],
        outputs: vec![],
    }
}
