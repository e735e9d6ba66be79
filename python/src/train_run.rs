//! `PatchLoader.for_train`: the batches a `train` run draws, from `train`'s own options. The
//! arguments are parsed by the same flags and resolved by the same code as the binary's (the
//! pipeline file, its configuration, the overrides), the cases chosen by the run's fold or
//! split, and the loader started by the library's [`run_batches`], which the trainer starts
//! its own from: the same cases, patches, augmentation draws, derived arrays and cascade
//! channels, batch for batch.

use clap::Parser;
use voxcache::config::autoplan::plan_from_cache;
use voxcache::config::train::{folds, resolve_planned};
use voxcache::config::TrainFlags;
use voxcache::train::batches::{run_batches, RunBatches};
use voxcache::{Error, Result};

use crate::cache::Cache;

/// `train`'s training options, without the binary's name.
#[derive(Parser, Debug)]
#[command(name = "train", no_binary_name = true)]
struct Flags {
    #[command(flatten)]
    options: TrainFlags,
}

/// A run's batches, with the shape they come in.
pub(crate) struct TrainRun {
    pub(crate) batches: RunBatches,
    pub(crate) patch: [usize; 3],
    pub(crate) batch_size: usize,
    /// Batches the run draws in all (its steps times `accumulate`).
    pub(crate) total: u64,
}

/// The run `args` (train's options: `--pipeline`, `--configuration`, `--fold`, `--seed`...)
/// would make on `cache`, its batches from batch `first` on. `threads`: the loader's threads
/// (default: the run's `workers`); `device`: what a planned patch is planned for.
pub(crate) fn open(
    cache: &Cache,
    args: &[String],
    threads: Option<usize>,
    first: u64,
    device: &str,
) -> Result<TrainRun> {
    let flags = Flags::try_parse_from(args).map_err(|e| {
        let text = e.render().to_string();
        let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        Error::Config(format!(
            "train options {args:?}: {}",
            line.trim_start_matches("error: ").trim()
        ))
    })?;
    let (mut config, plan) = resolve_planned(&flags.options)?;
    match folds(&flags.options, &config).as_slice() {
        [one] => config.fold = *one,
        many => {
            return Err(Error::Config(format!(
                "train options {args:?}: {} folds; a loader gives one run's batches: give one fold",
                many.len()
            )))
        }
    }
    if let Some(t) = threads {
        config.workers = t.max(1);
    }
    if plan {
        plan_from_cache(&mut config, cache.local_dir(), device, None, cache.blocks())?;
    }
    let batches = run_batches(cache.local_dir(), &config, first, cache.blocks())?;
    Ok(TrainRun {
        batches,
        patch: config.network.patch,
        batch_size: config.batch_size,
        total: config.steps * config.accumulate as u64,
    })
}
