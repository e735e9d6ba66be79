//! `prep build-cache`'s modes and the options each refuses (exit 2, naming the option and the
//! mode):
//!
//! - `--dry-run` writes nothing: `--part` (it plans every case), `-q` (there is no progress to
//!   quiet), `--s3-endpoint` and `--local-cache` (nothing is staged or uploaded) are refused;
//! - a cache in a local folder refuses the S3 options, and every build `--local-cache-gb` (it
//!   bounds the tier that reads go through):
//!   [`crate::config::location::S3Flags::options_for`].
//!
//! The cache options (pipeline, spacing, layout...), DATA or `--images`/`--labels`, `--name`,
//! `--previous-stage`, `-j` and `--json` apply to every mode. `prep plan` and `prep synth` have
//! one mode each, which takes all of their options.

use super::Given;
use crate::error::Result;

/// The mode `--dry-run` names in its refusals.
pub const DRY_RUN: &str = "prep build-cache --dry-run";

/// Refuse the first option typed that the build `dry_run` chose does not take.
pub fn check(given: &Given, dry_run: bool) -> Result<()> {
    if !dry_run {
        return Ok(());
    }
    given.refuse(
        &["part", "quiet", "s3_endpoint", "local_cache"],
        DRY_RUN,
        |id| {
            Some(
                match id {
                    "part" => "it plans every case",
                    "quiet" => "it shows no progress to quiet",
                    _ => "it writes nothing, so nothing is staged or uploaded",
                }
                .into(),
            )
        },
    )
}
