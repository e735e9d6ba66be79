//! The configuration layer: the one place where defaults, pipelines and command-line flags
//! become the settings of `prep build-cache`, `prep inspect` and `train`. The binaries parse
//! arguments into the flag structs defined here, call [`settings::resolve`] or
//! [`train::resolve`], and print.
//!
//! Precedence, lowest first: built-in defaults, the pipeline (`--pipeline NAME` for a bundled
//! one, `--pipeline FILE.toml` for a file; `default` when none is named), then flags. A pipeline
//! file and the flags are layers of the same kind and share their parsers, so an option is
//! spelled the same way in both: `spacing = "auto"` / `--spacing auto`, `norm = "group:8"` /
//! `--norm group:8`, `optimizer = "sgd"` / `--optimizer sgd`. Three numbers are a TOML array in
//! a file (`chunk = [32, 128, 128]`) and `z,y,x` on the command line (`--chunk 32,128,128`);
//! spacing, which also takes `auto`, is a string in both.
//!
//! Modules (one job each):
//! - [`pipeline`]: the bundled pipelines (compiled in) and pipeline files, loaded and checked.
//! - [`configurations`]: planned configurations in a pipeline file (`prep plan` writes them).
//! - [`autoplan`]: `train` with no patch given plans it, and the network, from the cache.
//! - [`settings`]: the cache parameters ([`Settings`]) and their flags ([`PrepFlags`]).
//! - [`train`]: the training flags ([`TrainFlags`]) over the pipeline's `[train]` table.
//! - [`values`]: the text parsers both layers use (three numbers, shard, part).
//! - [`location`]: where a path given on the command line lives (a local folder or `s3://`),
//!   the flags of caches on S3 and the local folder that serves their reads.
//! - [`run_dir`]: where a training run's folder goes.
//! - [`exit`]: the exit statuses of both binaries.
//! - [`modes`]: options that apply to one mode of a command, refused in the others.

pub mod autoplan;
pub mod configurations;
pub mod exit;
pub mod location;
pub mod modes;
pub mod pipeline;
pub mod run_dir;
pub mod settings;
pub mod train;
pub mod values;

pub use exit::Exit;
pub use pipeline::{Pipeline, PipelineFile, BUNDLED, DEFAULT_PIPELINE};
pub use settings::{PrepFlags, Settings, SpacingChoice};
pub use train::TrainFlags;
