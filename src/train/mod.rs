//! The `train` command: a 3D U-Net in candle fed by memory-mapped patches from the cache.
//!
//! Module map (one job each):
//! - [`ops`]: 3D convolution, transposed convolution, pooling and upsampling with gradients.
//! - [`model`]: the U-Net (depth, width, norm, up-sampling mode).
//! - [`loss`]: the training objective: Dice + cross-entropy at each supervised output, and the
//!   Skeleton Recall, clDice, boundary and surface terms their weights add.
//! - [`deep_supervision`]: the label patch pooled down to each supervised resolution.
//! - [`skeleton_target`]: the tubed skeleton of a label patch (Skeleton Recall's target).
//! - [`optim`]: AdamW and SGD with Nesterov momentum, poly learning rate, state for checkpoints.
//! - [`rng`]: the seeded, checkpointable random generator every draw comes from.
//! - [`sampler`]: which case and which box each patch of a batch comes from.
//! - [`spatial`]: rotation, scaling, elastic deformation: one coordinate map, one interpolation.
//! - [`intensity`]: nnU-Net's intensity transforms (noise, blur, brightness, contrast, low
//!   resolution, gamma).
//! - [`simd`]: which vector build (AVX-512, AVX2, portable) the augmentation loops take.
//! - [`augment`]: the augmentation options; intensity, then mirroring, of a read patch.
//! - [`loader`]: worker threads filling a bounded, ordered queue of batches.
//! - [`validate`]: sliding-window inference over cached volumes, Dice per class.
//! - [`checkpoint`]: atomic checkpoints (safetensors + JSON state), keep last K and best.
//! - [`metrics`]: the JSONL metrics log; [`plot`]: its PNG curves.
//! - [`device`]: CPU or CUDA, the one place that knows.
//! - [`config`]: training options from the pipeline file and the command line.
//! - [`data`]: the run's cases opened from the cache (dataset, classes, case weights, split).
//! - [`split`]: the deterministic train/validation split by case id.
//! - [`trainer`]: the loop that ties them together.

pub mod augment;
pub mod benchmark;
pub mod classes;
pub mod config;
pub mod data;
pub mod deep_supervision;
pub mod intensity;
pub mod loader;
pub mod loss;
pub mod metrics;
pub mod optim;
pub mod plot;
pub mod sampler;
pub mod skeleton_target;
pub mod spatial;
pub mod split;
pub mod surface_fused;
pub mod trainer;
pub mod validate;
