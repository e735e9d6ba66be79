//! voxcache: turn folders of NIfTI image/label pairs into a chunked, content-addressed Zarr v3
//! cache without ever holding a resampled volume in memory, and train from it.
//!
//! Module map (one job each):
//! - [`nifti_io`]: read and validate NIfTI-1 headers and volumes (into f32, any datatype).
//! - [`geometry`]: affines, spacing, the output grid convention.
//! - [`dataset`]: find image/label pairs, name cases, scan and check their headers.
//! - [`plan`]: target spacing, output shapes, memory cost, outliers, dataset statistics.
//! - [`distance`]: exact Euclidean distance transforms with spacing (label-derived arrays).
//! - [`skeleton`]: topology-preserving thinning of masks to their centre lines.
//! - [`centreline`]: centreline Dice (clDice) of a segmentation against a reference, block by block.
//! - [`resample`]: fill one output block from the input (linear for images, nearest for labels).
//! - [`normalize`]: intensity normalization schemes.
//! - [`config`]: defaults, bundled pipelines and flags merged into the settings of every command;
//!   run folders; exit statuses.
//! - [`format`](mod@format): the on-disk schema (entry attributes, manifest, checksums, array metadata).
//! - [`cache`]: content keys, entry writer, manifest merging, reader.
//! - [`build`]: the `build-cache` job: an orchestrator over the stages above.
//! - [`inspect`]: `prep inspect`: dataset fingerprint and cost forecast, cache report and verify.
//! - [`synth`]: the synthetic vessel dataset generator (bundled data, benchmarks).
//! - [`sysinfo`]: peak memory and host facts for reports.
//! - [`progress`]: the progress bars of the long commands.
//! - [`infer`]: inference on cached volumes (sliding window), shared by validation and predict.
//! - [`evaluate`]: segmentations against references: Dice, IoU, surface distances, volumes.
//! - [`train`]: the `train` command: 3D ops, U-Net, patch loader, optimizer, checkpoints.

pub mod cache;
pub mod config;
pub mod error;
pub mod evaluate;
pub mod format;
pub mod geometry;
pub mod infer;
pub mod inspect;
pub mod model;
pub mod nifti_io;
pub mod prep;
pub mod synth;
#[allow(missing_docs)]
pub mod train;
pub mod util;

pub use error::{Error, Result};
