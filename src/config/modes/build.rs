//! `prep build-cache`'s modes and the options each refuses (exit 2, naming the option and the
//! mode):
//!
//! - `--dry-run` writes nothing: `--part` (it plans every case), `-q` (there is no progress to
//!   quiet), `--s3-endpoint` and `--local-cache` (nothing is staged or uploaded) are refused;
//! - a cache in a local folder refuses the S3 options, and every build `--local-cache-gb` (it
//!   bounds the tier that reads go through):
//!   [`crate::config::location::S3Flags::options_for`].
//!
//! - `--nnunet-plans` preprocesses as nnU-Net does for its plans: `--pipeline`, `--spacing`
//!   and `--normalization` (the plans give them), `--previous-stage` (a cascade's second stage
//!   is not built from plans yet) and a cache on S3 are refused; `--configuration` names the
//!   plans' configuration.
//!
//! The cache options (pipeline, spacing, layout...), DATA or `--images`/`--labels`, `--name`,
//! `--previous-stage`, `-j` and `--json` apply to every mode. `prep plan` and `prep synth` have
//! one mode each, which takes all of their options.

use super::Given;
use crate::error::Result;

/// The mode `--dry-run` names in its refusals.
pub const DRY_RUN: &str = "prep build-cache --dry-run";

/// The mode `--nnunet-plans` names in its refusals.
pub const NNUNET: &str = "prep build-cache --nnunet-plans";

/// The mode a cache on S3 names when `--nnunet-plans` is refused.
pub const S3_CACHE: &str = "a cache on S3";

/// Refuse the first option typed that the build chose (`dry_run`, `nnunet` plans, a cache on
/// S3) does not take.
pub fn check(given: &Given, dry_run: bool, nnunet: bool, s3: bool) -> Result<()> {
    if dry_run {
        given.refuse(
            &[
                "part",
                "quiet",
                "s3_endpoint",
                "local_cache",
                "nnunet_plans",
            ],
            DRY_RUN,
            |id| {
                Some(
                    match id {
                        "part" => "it plans every case",
                        "quiet" => "it shows no progress to quiet",
                        "nnunet_plans" => {
                            "nnU-Net's grid of a case is known only once it is cropped"
                        }
                        _ => "it writes nothing, so nothing is staged or uploaded",
                    }
                    .into(),
                )
            },
        )?;
    }
    if !nnunet {
        return Ok(());
    }
    if s3 {
        given.refuse(&["nnunet_plans"], S3_CACHE, |_| {
            Some("it builds into a local cache folder for now".into())
        })?;
    }
    given.refuse(
        &["pipeline", "spacing", "normalization", "previous_stage"],
        NNUNET,
        |id| {
            Some(
                match id {
                    "previous_stage" => "a cascade's second stage is not built from plans yet",
                    _ => "the plans give the spacing and each channel's normalization",
                }
                .into(),
            )
        },
    )
}

/// The plans and configuration `--nnunet-plans` names (`--configuration` taken out of
/// `flags`: with plans it names one of theirs, default `3d_fullres`).
pub fn nnunet_source(
    plans: Option<std::path::PathBuf>,
    flags: &mut crate::config::settings::PrepFlags,
) -> Option<crate::prep::cache_build::nnunet::NnunetSource> {
    let plans = plans?;
    Some(crate::prep::cache_build::nnunet::NnunetSource {
        plans,
        configuration: flags
            .configuration
            .take()
            .unwrap_or_else(|| "3d_fullres".into()),
    })
}
