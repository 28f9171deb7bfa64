//! Run N scripted-expert episodes of the Push-T-like task, print the success
//! rate, optionally record them for training and save a frame as PNG.
//!
//! ```text
//! cargo run -p edgeflow-sim --example expert_episodes -- \
//!     [--episodes 20] [--seed 0] [--horizon 16] [--image-size 96] \
//!     [--record DIR] [--png frame.png]
//! ```
//!
//! Episode `seed` is recorded to `DIR/episode_<seed, 6 digits>`; the PNG is
//! the first episode's frame after its first chunk.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use edgeflow_sim::record::record_expert_episode;
use edgeflow_sim::{Expert, Image, PushConfig, PushSim};

struct Args {
    episodes: u64,
    seed: u64,
    horizon: usize,
    image_size: u32,
    record: Option<PathBuf>,
    png: Option<PathBuf>,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        episodes: 20,
        seed: 0,
        horizon: 16,
        image_size: 96,
        record: None,
        png: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--episodes" => a.episodes = value()?.parse().context("--episodes")?,
            "--seed" => a.seed = value()?.parse().context("--seed")?,
            "--horizon" => a.horizon = value()?.parse().context("--horizon")?,
            "--image-size" => a.image_size = value()?.parse().context("--image-size")?,
            "--record" => a.record = Some(value()?.into()),
            "--png" => a.png = Some(value()?.into()),
            "-h" | "--help" => {
                println!(
                    "expert_episodes [--episodes N] [--seed S] [--horizon H] [--image-size PX] [--record DIR] [--png FILE]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    if a.horizon == 0 {
        bail!("--horizon must be at least 1");
    }
    Ok(a)
}

fn save_png(img: &Image, path: &PathBuf) -> Result<()> {
    let buf = image::RgbImage::from_raw(img.width, img.height, img.rgb.clone())
        .context("image buffer size")?;
    buf.save(path)
        .with_context(|| format!("writing {}", path.display()))
}

fn main() -> Result<()> {
    let args = parse()?;
    let cfg = PushConfig {
        image_size: args.image_size,
        ..PushConfig::default()
    };
    let mut sim = PushSim::new(cfg.clone())?;
    let mut expert = Expert::new(&cfg);
    let mut successes = 0;
    let mut total_steps = 0;
    let start = Instant::now();
    for seed in args.seed..args.seed + args.episodes {
        if seed == args.seed {
            if let Some(p) = &args.png {
                // The first episode's frame after its first chunk.
                sim.reset(seed);
                expert.reset();
                for target in expert.chunk(&sim.true_state(), args.horizon) {
                    sim.step(target);
                }
                save_png(&sim.render(), p)?;
            }
        }
        let info = match &args.record {
            Some(dir) => record_expert_episode(
                &mut sim,
                &mut expert,
                seed,
                args.horizon,
                args.horizon,
                &dir.join(format!("episode_{seed:06}")),
            )?,
            None => expert.run_episode(&mut sim, seed, args.horizon, args.horizon, |_, _| {
                anyhow::Ok(())
            })?,
        };
        let s = sim.true_state();
        successes += sim.success() as u64;
        total_steps += s.step;
        println!(
            "seed {seed:4}  {:<44} {}  {:5.2} s  final distance {:.3} m",
            info.instruction,
            if sim.success() { "success" } else { "FAIL   " },
            s.time,
            s.goal_distance()
        );
    }
    println!(
        "success {successes}/{} ({:.1} %), {total_steps} control steps in {:.2} s wall",
        args.episodes,
        100.0 * successes as f64 / args.episodes.max(1) as f64,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
