//! The `train` command: a 3D U-Net in candle fed by memory-mapped patches from the cache.
//!
//! Module map (one job each); the network, its ops, devices and checkpoints are in
//! [`crate::model`], the sliding window in [`crate::infer`], the metrics in [`crate::evaluate`]:
//! - [`config`]: training options from the pipeline file and the command line.
//! - [`data`]: the run's cases opened from the cache (dataset, classes, case weights, split).
//! - [`classes`]: file label values to training classes, the ignore label.
//! - [`split`]: the deterministic train/validation split by case id.
//! - [`folds`]: nnU-Net's five cross-validation folds, or its splits_final.json.
//! - [`fold_validation`]: a fold's held-out cases predicted in their own geometry and scored.
//! - [`sampler`]: which case and which box each patch of a batch comes from.
//! - [`spatial`]: rotation, scaling, elastic deformation: one coordinate map, one interpolation.
//! - [`intensity`]: nnU-Net's intensity transforms (noise, blur, brightness, contrast, low
//!   resolution, gamma).
//! - [`augment`]: the augmentation options; intensity, then mirroring, of a read patch.
//! - [`loader`]: worker threads filling a bounded, ordered queue of batches.
//! - [`batches`]: a run's batches: its training cases and the trainer's loader over them.
//! - [`cascade`]: the previous stage's segmentation as input channels, perturbed as nnU-Net's
//!   cascade perturbs it.
//! - [`deep_supervision`]: the label patch pooled down to each supervised resolution.
//! - [`skeleton_target`]: the tubed skeleton of a label patch (Skeleton Recall's target).
//! - [`loss`]: the training objective: Dice + cross-entropy at each supervised output, and the
//!   Skeleton Recall, clDice, boundary and surface terms their weights add.
//! - [`surface_fused`]: the surface loss's fused softmax-and-distance op.
//! - [`optim`]: AdamW and SGD with Nesterov momentum, poly learning rate, state for checkpoints.
//! - [`validate`]: sliding-window inference over cached volumes, Dice per class.
//! - [`metrics`]: the JSONL metrics log; [`plot`]: its PNG curves.
//! - [`trainer`]: the session (setup, step, validation, checkpoints) and the loop.
//! - [`benchmark`]: `train --benchmark`: step time, data wait and memory of a configuration.

pub mod augment;
pub mod batches;
pub mod benchmark;
pub mod cascade;
pub mod classes;
pub mod config;
pub mod data;
pub mod deep_supervision;
pub mod fold_validation;
pub mod folds;
pub mod intensity;
pub mod loader;
pub mod loss;
pub mod metrics;
mod norm_mask;
pub mod optim;
pub mod plot;
pub mod sampler;
pub mod skeleton_target;
pub mod spatial;
pub mod split;
pub mod surface_fused;
pub mod trainer;
pub mod validate;
