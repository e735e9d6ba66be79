//! voxcache: turn folders of NIfTI image/label pairs into a chunked, content-addressed Zarr v3
//! cache without ever holding a resampled volume in memory, train a 3D U-Net from it, and
//! segment new volumes under the same promise.
//!
//! Modules in layers, bottom to top: a module imports only the modules listed before it. This
//! numbered list is the one `tests/suite/layers.rs` reads and enforces, and README's "Code
//! map" follows it row for row (the test checks that too).
//! 1. [`error`]: typed errors.
//! 2. [`util`]: the random generators, vector dispatch, fast math, atomic file writes, memory
//!    figures, progress bars.
//! 3. [`remote`]: where a cache lives (a folder, or `s3://`), and a blocking S3 client.
//! 4. [`format`](mod@format): the on-disk schema (entry attributes, manifest, run records and
//!    the training options they hold, dataset.json), the only code that names the files.
//! 5. [`geometry`]: affines, the output-grid convention, blocks, `VoxelRead`, mirroring.
//! 6. [`nifti_io`]: read, stream and write NIfTI.
//! 7. [`cache`]: store, content keys, array writing pieces, reader, manifest, fg index.
//! 8. [`prep`]: dataset discovery, settings, planning, normalization, resampling, derived
//!    arrays, the build job.
//! 9. [`synth`]: the synthetic dataset generator (bundled data, benchmarks).
//! 10. [`model`]: the U-Net, its ops (CPU and CUDA), devices, checkpoints.
//! 11. [`planner`]: patch, batch and network per configuration from a dataset's fingerprint
//!     (nnU-Net's experiment planner).
//! 12. [`infer`]: sliding windows, probabilities, export, `predict`.
//! 13. [`evaluate`]: Dice, surface distances, clDice, reports.
//! 14. [`train`]: sampler, loader, augmentation, losses, optimizer, the training session.
//! 15. [`inspect`]: `prep inspect`: dataset forecast, cache report, verify, previews.
//! 16. [`config`]: pipelines and flags merged into the settings of every command; run folders;
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
