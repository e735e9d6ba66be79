//! The batches a training run draws: the run's training cases (its fold, or its split) and the
//! trainer's loader over them (the sampler with its foreground share and case weights, the
//! augmentation, the derived arrays its loss needs, a cascade's previous-stage channels). The
//! trainer starts its loader here, and so does any other consumer of a run's batches (the Python
//! package), so both get the same batches for the same options.

use std::path::Path;

use crate::cache::reader::EntryReader;
use crate::cache::store::Blocks;
use crate::error::Result;
use crate::train::augment::AugmentConfig;
use crate::train::cascade::CascadeAugment;
use crate::train::classes::ClassMap;
use crate::train::config::TrainConfig;
use crate::train::data::{open_data, Data};
use crate::train::loader::{CascadeInput, Loader, LoaderConfig};
use crate::train::sampler::{Sampler, SamplerConfig};

/// A run's batches and what they hold.
pub struct RunBatches {
    /// The batches, from the one asked for; `accumulate` batches make one optimizer step.
    pub loader: Loader,
    /// The dataset drawn from.
    pub dataset: String,
    /// The training cases, in the order the batches' patch choices index them.
    pub train_ids: Vec<String>,
    /// The image channels' names, in order (a cascade's previous-stage channels last).
    pub channels: Vec<String>,
    /// Label-file values to training classes (or regions), the ignore label.
    pub classes: ClassMap,
    /// The label values whose signed distance maps each batch carries, in order.
    pub distance: Vec<u16>,
}

/// The batches a run of `cfg` on the cache at `cache_dir` draws, from batch `first_batch` on
/// (optimizer step `s` takes batches `s * accumulate ..`). `cfg.fold` or its split chooses the
/// cases; `cfg.network.patch` must be set (a planned run plans it first).
pub fn run_batches(
    cache_dir: &Path,
    cfg: &TrainConfig,
    first_batch: u64,
    blocks: Blocks,
) -> Result<RunBatches> {
    let data = open_data(cache_dir, cfg, None, blocks)?;
    let loader = start_loader(cfg, &data, first_batch)?;
    Ok(RunBatches {
        loader,
        train_ids: data.train.iter().map(|c| c.0.clone()).collect(),
        distance: distance_values(cfg, &data),
        dataset: data.dataset,
        channels: data.channels,
        classes: data.classes,
    })
}

/// The label values whose distance maps the run's loss needs (every foreground class).
fn distance_values(cfg: &TrainConfig, data: &Data) -> Vec<u16> {
    if cfg.loss.needs_distance() {
        data.classes.classes()[1..]
            .iter()
            .map(|c| c.value)
            .collect()
    } else {
        Vec::new()
    }
}

/// The loader's workers over the training cases, positioned at batch `first_batch`.
pub(crate) fn start_loader(cfg: &TrainConfig, data: &Data, first_batch: u64) -> Result<Loader> {
    let train_entries: Vec<EntryReader> = data.train.iter().map(|c| c.1.clone()).collect();
    let weights: Vec<f64> = data
        .train
        .iter()
        .map(|(id, _)| cfg.case_weights.get(id).copied().unwrap_or(1.0))
        .collect();
    let sampler = Sampler::new(
        &train_entries,
        weights,
        SamplerConfig {
            patch_zyx: cfg.network.patch,
            batch_size: cfg.batch_size,
            fg_fraction: cfg.fg_fraction,
            seed: cfg.network.seed,
            skip_class: data.classes.labels().ignore(),
            shard: Default::default(),
        },
    )?;
    let augment = if cfg.augment {
        cfg.augmentation.clone()
    } else {
        AugmentConfig::none()
    };
    Loader::start(
        train_entries,
        sampler,
        LoaderConfig {
            workers: cfg.workers,
            queue_depth: cfg.queue_depth,
            augment,
            skeleton: cfg.loss.skeleton_recall > 0.0,
            centreline: cfg.loss.cldice > 0.0,
            distance: distance_values(cfg, data),
            cascade: match data.previous_stage_channels() {
                0 => None,
                channels => Some(CascadeInput {
                    channels,
                    augment: cfg.augment.then(CascadeAugment::default),
                }),
            },
        },
        first_batch,
    )
}

/// A batch's fingerprint: BLAKE3 of its image's f32 values, then its label's u16 values, each
/// little-endian in the batch's (B, C, z, y, x) and (B, z, y, x) order; what `train
/// --batch-hashes` records, so another loader's batches can be checked against the trainer's.
pub fn batch_hash(image: &[f32], label: &[u16]) -> String {
    let mut h = blake3::Hasher::new();
    let mut buf = Vec::with_capacity(4 * image.len().min(1 << 16));
    for part in image.chunks(1 << 16) {
        buf.clear();
        part.iter()
            .for_each(|v| buf.extend_from_slice(&v.to_le_bytes()));
        h.update(&buf);
    }
    for part in label.chunks(1 << 16) {
        buf.clear();
        part.iter()
            .for_each(|v| buf.extend_from_slice(&v.to_le_bytes()));
        h.update(&buf);
    }
    h.finalize().to_hex().to_string()
}
