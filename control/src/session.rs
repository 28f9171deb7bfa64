//! zenoh sessions from pipeline params, shared by every stage of a process
//! that asks for the same settings.
//!
//! Defaults are loopback only: peer mode, listening on `tcp/127.0.0.1:0`
//! (an ephemeral port; zenoh's own default is every interface), no connect
//! endpoints, multicast and gossip scouting off. Nothing is sent anywhere
//! the pipeline file does not name. The link lease is 1 s so a peer that
//! hangs without closing its socket is noticed within about a second (a
//! killed process closes its socket and is noticed at once).

use crate::error::{Error, Result};
use edgeflow_graph::{ParamInfo, ParamType, Params};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::OnceLock;
use zenoh::Wait;

/// How a process joins zenoh.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionConfig {
    /// `peer` or `client`.
    pub mode: String,
    /// Endpoints to connect to (e.g. `tcp/127.0.0.1:7447`).
    pub connect: Vec<String>,
    /// Endpoints to listen on.
    pub listen: Vec<String>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            mode: "peer".into(),
            connect: vec![],
            listen: vec!["tcp/127.0.0.1:0".into()],
        }
    }
}

impl SessionConfig {
    /// A peer that listens on `listen` and connects to `connect`.
    pub fn peer(listen: &[&str], connect: &[&str]) -> Self {
        SessionConfig {
            mode: "peer".into(),
            connect: connect.iter().map(|s| s.to_string()).collect(),
            listen: if listen.is_empty() {
                vec!["tcp/127.0.0.1:0".into()]
            } else {
                listen.iter().map(|s| s.to_string()).collect()
            },
        }
    }

    /// The params every zenoh stage takes for its session.
    pub fn param_infos() -> Vec<ParamInfo> {
        vec![
            ParamInfo::new(
                "mode",
                ParamType::String,
                "peer",
                "zenoh mode: peer or client",
            ),
            ParamInfo::new(
                "connect",
                ParamType::Any,
                serde_json::json!([]),
                "endpoints to connect to, e.g. [\"tcp/127.0.0.1:7447\"]",
            ),
            ParamInfo::new(
                "listen",
                ParamType::Any,
                serde_json::json!(["tcp/127.0.0.1:0"]),
                "endpoints to listen on (default: loopback, ephemeral port)",
            ),
        ]
    }

    /// Read `mode`, `connect`, `listen` from stage params.
    pub fn from_params(p: &Params) -> std::result::Result<Self, edgeflow_graph::ParamError> {
        let mode: String = p.get_or("mode", "peer".to_string())?;
        if mode != "peer" && mode != "client" {
            return Err(p.error("mode", format!("`{mode}` is not peer or client")));
        }
        let list = |key: &str, default: Vec<String>| -> std::result::Result<Vec<String>, _> {
            match p.values().get(key) {
                None | Some(serde_json::Value::Null) => Ok(default),
                Some(serde_json::Value::String(s)) => Ok(vec![s.clone()]),
                Some(_) => p.get::<Vec<String>>(key),
            }
        };
        let connect = list("connect", vec![])?;
        let listen = list("listen", vec!["tcp/127.0.0.1:0".into()])?;
        for e in connect.iter().chain(&listen) {
            if !e.starts_with("tcp/") {
                return Err(p.error(
                    if connect.contains(e) {
                        "connect"
                    } else {
                        "listen"
                    },
                    format!(
                        "endpoint `{e}`: this build has the TCP link only; write tcp/HOST:PORT"
                    ),
                ));
            }
        }
        if mode == "client" && connect.is_empty() {
            return Err(p.error(
                "connect",
                "client mode needs an endpoint to connect to (a router or peer)",
            ));
        }
        Ok(SessionConfig {
            mode,
            connect,
            listen,
        })
    }

    /// The zenoh config.
    pub fn to_zenoh(&self) -> Result<zenoh::Config> {
        let mut c = zenoh::Config::default();
        let mut set = |k: &str, v: serde_json::Value| {
            c.insert_json5(k, &v.to_string())
                .map_err(|e| Error::Zenoh(format!("config `{k}` = {v}: {e}")))
        };
        set("mode", serde_json::json!(self.mode))?;
        set("connect/endpoints", serde_json::json!(self.connect))?;
        set(
            "listen/endpoints",
            serde_json::json!(if self.mode == "client" {
                vec![]
            } else {
                self.listen.clone()
            }),
        )?;
        set("scouting/multicast/enabled", serde_json::json!(false))?;
        set("scouting/gossip/enabled", serde_json::json!(false))?;
        set("transport/link/tx/lease", serde_json::json!(1000))?;
        set(
            "connect/retry",
            serde_json::json!({ "period_init_ms": 100, "period_max_ms": 500, "period_increase_factor": 2.0 }),
        )?;
        Ok(c)
    }
}

type Sessions = Mutex<HashMap<SessionConfig, (zenoh::Session, usize)>>;

fn sessions() -> &'static Sessions {
    static S: OnceLock<Sessions> = OnceLock::new();
    S.get_or_init(Default::default)
}

/// A session shared by every holder with the same [`SessionConfig`]; the
/// last holder's drop closes it.
#[derive(Debug)]
pub struct SharedSession {
    cfg: SessionConfig,
    session: zenoh::Session,
}

impl SharedSession {
    /// Open (or join) the session for `cfg`.
    pub fn open(cfg: &SessionConfig) -> Result<Self> {
        let mut m = sessions().lock();
        if let Some((s, n)) = m.get_mut(cfg) {
            *n += 1;
            return Ok(SharedSession {
                cfg: cfg.clone(),
                session: s.clone(),
            });
        }
        let session = zenoh::open(cfg.to_zenoh()?).wait().map_err(|e| {
            Error::Zenoh(format!(
                "cannot open a zenoh session (mode {}, listen {:?}, connect {:?}): {e}; \
                 is another process already listening on that port?",
                cfg.mode, cfg.listen, cfg.connect
            ))
        })?;
        m.insert(cfg.clone(), (session.clone(), 1));
        Ok(SharedSession {
            cfg: cfg.clone(),
            session,
        })
    }

    /// The zenoh session.
    pub fn session(&self) -> &zenoh::Session {
        &self.session
    }
}

impl Drop for SharedSession {
    fn drop(&mut self) {
        let mut m = sessions().lock();
        let last = match m.get_mut(&self.cfg) {
            Some((_, n)) => {
                *n -= 1;
                *n == 0
            }
            None => false,
        };
        if last {
            if let Some((s, _)) = m.remove(&self.cfg) {
                let _ = s.close().wait();
            }
        }
    }
}
