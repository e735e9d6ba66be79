//! Intensity normalization as recorded: the scheme of each channel, the statistics it was
//! computed from, and the transform that was applied ([`crate::prep::normalize`] computes them).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How image intensities are normalized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Normalization {
    /// z-score with mean and standard deviation of the nonzero voxels; zero voxels stay zero
    /// (nnU-Net's behaviour when the nonzero region is the mask). The default.
    ZscoreNonzero,
    /// z-score over all voxels.
    Zscore,
    /// Clip to the dataset's foreground 0.5 and 99.5 percentiles, then z-score with the dataset
    /// foreground mean and standard deviation (nnU-Net's CT scheme).
    Ct,
    /// Keep the intensities as they are.
    None,
    /// 1 where the voxel holds this label value, else 0: a cascade's previous-stage
    /// segmentation, one channel per label.
    Indicator(u16),
}

impl std::str::FromStr for Normalization {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "zscore-nonzero" => Normalization::ZscoreNonzero,
            "zscore" => Normalization::Zscore,
            "ct" => Normalization::Ct,
            "none" => Normalization::None,
            _ => {
                return Err(Error::Config(format!(
                    "unknown normalization {s:?} (choose zscore-nonzero, zscore, ct or none)"
                )))
            }
        })
    }
}

impl Normalization {
    /// The scheme nnU-Net gives a channel of this dataset.json name, when the name picks one:
    /// "CT" the CT scheme, "noNorm" none, "zscore" z-score over all voxels (any case). Other
    /// names (MRI sequences...) get the configured scheme.
    pub fn for_channel_name(name: &str) -> Option<Normalization> {
        match name.to_ascii_lowercase().as_str() {
            "ct" => Some(Normalization::Ct),
            "nonorm" => Some(Normalization::None),
            "zscore" => Some(Normalization::Zscore),
            _ => None,
        }
    }

    /// The spelling used by flags, pipeline files and entries (`zscore-nonzero`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Normalization::ZscoreNonzero => "zscore-nonzero",
            Normalization::Zscore => "zscore",
            Normalization::Ct => "ct",
            Normalization::None => "none",
            Normalization::Indicator(_) => "indicator",
        }
    }
}

/// Dataset-wide foreground statistics for CT normalization.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForegroundStats {
    /// 0.5 percentile of the pooled foreground intensities: the lower clip.
    pub lower: f64,
    /// 99.5 percentile: the upper clip.
    pub upper: f64,
    /// Mean of the pooled foreground intensities (subtracted).
    pub mean: f64,
    /// Their standard deviation (divided by).
    pub std: f64,
}

/// Intensity statistics of one input image, recorded in the entry.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct IntensityStats {
    /// Smallest finite voxel value (0 when there is none).
    pub min: f64,
    /// Largest finite voxel value (0 when there is none).
    pub max: f64,
    /// Mean of the finite voxels.
    pub mean: f64,
    /// Standard deviation (population) of the finite voxels.
    pub std: f64,
    /// Finite voxels that are not zero.
    pub nonzero_voxels: u64,
    /// Mean of the nonzero voxels (what zscore-nonzero subtracts).
    pub nonzero_mean: f64,
    /// Their standard deviation (what zscore-nonzero divides by).
    pub nonzero_std: f64,
    /// NaN or infinite voxels (an image with any is refused).
    pub nonfinite_voxels: u64,
}

/// What was applied: out = (clamp(v, clip) - shift) / scale, on `only_nonzero` voxels or all.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppliedNormalization {
    /// The scheme this transform came from.
    pub scheme: Normalization,
    /// Subtracted after clipping: a mean (0 for `none`).
    pub shift: f64,
    /// Divided by after the shift: a standard deviation, at least 1e-8 (1 for `none`).
    pub scale: f64,
    /// Range [low, high] values are clamped to first (the CT scheme only).
    pub clip: Option<[f64; 2]>,
    /// Leave zero voxels at zero (zscore-nonzero).
    pub only_nonzero: bool,
}
