//! Preprocessing: from a folder of NIfTI volumes to cache entries (nnU-Net's experiment
//! planning and preprocessing).
//!
//! - [`dataset`]: find image/label pairs, name cases, scan and check their headers.
//! - [`settings`]: the parameters of a build (defaults; `config` merges pipelines and flags).
//! - [`plan`]: target spacing, output shapes, memory cost, outliers, dataset statistics.
//! - [`normalize`]: intensity normalization schemes.
//! - [`resample`]: fill one output block from the input (linear for images, nearest for labels).
//! - [`derived`]: label-derived arrays (distance maps, skeletons), built chunk by chunk.
//! - [`cache_build`]: the `build-cache` job, an orchestrator over the steps above.
//! - [`nnunet`]: nnU-Net v2's own inference preprocessing, for its trained models.

pub mod cache_build;
pub mod dataset;
pub mod derived;
pub mod nnunet;
pub mod normalize;
pub mod plan;
pub mod resample;
pub mod settings;
