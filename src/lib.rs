//! voxcache: turn folders of NIfTI image/label pairs into a chunked, content-addressed Zarr v3
//! cache without ever holding a resampled volume in memory, train a 3D U-Net from it, and
//! segment new volumes under the same promise.
//!
//! Modules in layers, bottom to top; a module imports only modules of lower layers
//! (`tests/layers.rs` checks it, README "Code map" explains it):
//! 1. [`error`], [`util`]: typed errors; the seeded generator, vector dispatch, fast math,
//!    memory figures, progress bars.
//! 2. [`remote`]: where a cache lives (a folder, or `s3://`), and a blocking S3 client.
//! 3. [`format`](mod@format): the on-disk schema (entry attributes, manifest, run records,
//!    dataset.json), the only code that names the files.
//! 4. [`geometry`]: affines, the output-grid convention, blocks, `VoxelRead`, mirroring.
//! 5. [`nifti_io`]: read, stream and write NIfTI.
//! 6. [`cache`]: store, content keys, array writing pieces, reader, manifest, fg index.
//! 7. [`prep`]: dataset discovery, settings, planning, normalization, resampling, derived
//!    arrays, the build job.
//! 8. [`synth`]: the synthetic vessel dataset generator (bundled data, benchmarks).
//! 9. [`model`]: the U-Net, its ops (CPU and CUDA), devices, checkpoints.
//! 10. [`planner`]: patch, batch and network per configuration from a dataset's fingerprint
//!     (nnU-Net's experiment planner).
//! 11. [`infer`]: sliding windows, probabilities, export, `predict`.
//! 12. [`evaluate`]: Dice, surface distances, clDice, reports.
//! 13. [`train`]: sampler, loader, augmentation, losses, optimizer, the training session.
//! 14. [`inspect`]: `prep inspect`: dataset forecast, cache report, verify, previews.
//! 15. [`config`]: pipelines and flags merged into the settings of every command; run folders;
//!     exit statuses.

pub mod error;
pub mod util;

pub mod remote;

pub mod format;
pub mod geometry;

pub mod cache;
pub mod nifti_io;

pub mod prep;
pub mod synth;

pub mod model;
pub mod planner;

pub mod evaluate;
pub mod infer;
pub mod train;

pub mod inspect;

pub mod config;

pub use error::{Error, Result};
