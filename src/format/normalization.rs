//! Intensity normalization as recorded: the scheme of each channel, the statistics it was
//! computed from, and the transform that was applied ([`crate::prep::normalize`] computes them).
//!
//! One scheme type covers ours and nnU-Net's five, so each concern is answered once for all:
//! the spellings ([`Normalization::name`] ours, [`Normalization::nnunet_name`] plans.json's),
//! what a transform is computed from ([`Normalization::statistics`]) and what a raw zero
//! becomes ([`AppliedNormalization::zero_value`]).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How image intensities are normalized: our schemes and nnU-Net's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Normalization {
    /// z-score with mean and standard deviation of the nonzero voxels; zero voxels stay zero
    /// (nnU-Net's behaviour when the nonzero region is the mask). The default.
    ZscoreNonzero,
    /// z-score over all voxels (nnU-Net's `ZScoreNormalization`; its plans'
    /// `use_mask_for_norm` says whether inside the nonzero mask only).
    Zscore,
    /// Clip to the dataset's foreground 0.5 and 99.5 percentiles, then z-score with the dataset
    /// foreground mean and standard deviation (nnU-Net's `CTNormalization`).
    Ct,
    /// Keep the intensities as they are (nnU-Net's `NoNormalization`).
    None,
    /// Subtract the image's minimum, divide by its range (nnU-Net's
    /// `RescaleTo01Normalization`): applied to nnU-Net models' inputs only, not in our builds.
    #[serde(rename = "rescale-to-01")]
    RescaleTo01,
    /// Divide by 255, the values in 0..=255 (nnU-Net's `RGBTo01Normalization`): nnU-Net
    /// models' inputs only.
    #[serde(rename = "rgb-to-01")]
    RgbTo01,
    /// 1 where the voxel holds this label value, else 0: a cascade's previous-stage
    /// segmentation, one channel per label.
    Indicator(u16),
}

/// What a scheme's transform is computed from: the one answer our cache build, nnU-Net's
/// preprocessing and the checks of plans and cache parameters all follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemeStatistics {
    /// Nothing: the transform is fixed (`none`, an indicator).
    Fixed,
    /// The image's own mean and standard deviation (the z-score schemes).
    ImageMoments,
    /// The image's own minimum and maximum: rescale to 0..1 divides by them, RGB's division
    /// by 255 holds only for values in 0..=255 (nnU-Net asserts it).
    ImageRange,
    /// The dataset's foreground intensities: 0.5 and 99.5 percentiles, mean, standard
    /// deviation (the CT scheme; nnU-Net's plans hold them per channel).
    DatasetForeground,
}

/// The schemes flags and pipeline files may pick, by [`Normalization::name`] (an indicator is
/// set by a cascade's build, never picked).
const OURS: [Normalization; 4] = [
    Normalization::ZscoreNonzero,
    Normalization::Zscore,
    Normalization::Ct,
    Normalization::None,
];

/// nnU-Net's five schemes, by [`Normalization::nnunet_name`].
pub const NNUNET_SCHEMES: [Normalization; 5] = [
    Normalization::Ct,
    Normalization::Zscore,
    Normalization::None,
    Normalization::RescaleTo01,
    Normalization::RgbTo01,
];

impl std::str::FromStr for Normalization {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if let Some(n) = OURS.into_iter().find(|n| n.name() == s) {
            return Ok(n);
        }
        // "zscore-nonzero, zscore, ct or none", as the message has always read.
        let names = OURS.map(|n| n.name());
        let choose = format!("{} or {}", names[..3].join(", "), names[3]);
        Err(Error::Config(
            match NNUNET_SCHEMES.into_iter().find(|n| n.name() == s) {
                Some(n) => format!(
                    "normalization {s:?} is nnU-Net's {}, applied to nnU-Net models' inputs only (choose {choose})",
                    n.nnunet_name().unwrap_or_default()
                ),
                None => format!("unknown normalization {s:?} (choose {choose})"),
            },
        ))
    }
}

impl Normalization {
    /// The scheme nnU-Net gives a channel of this dataset.json name, when the name picks one:
    /// "CT" the CT scheme, "noNorm" none, "zscore" z-score over all voxels, "rescale_to_0_1"
    /// the image's range to [0, 1], "rgb_to_0_1" 8-bit values to [0, 1] (any case). Other
    /// names (MRI sequences...) get the configured scheme.
    pub fn for_channel_name(name: &str) -> Option<Normalization> {
        match name.to_ascii_lowercase().as_str() {
            "ct" => Some(Normalization::Ct),
            "nonorm" => Some(Normalization::None),
            "zscore" => Some(Normalization::Zscore),
            "rescale_to_0_1" => Some(Normalization::RescaleTo01),
            "rgb_to_0_1" => Some(Normalization::RgbTo01),
            _ => None,
        }
    }

    /// The spelling used by flags, pipeline files and entries (`zscore-nonzero`, ...); serde
    /// writes the same (a test holds them together), so cache keys never move.
    pub fn name(&self) -> &'static str {
        match self {
            Normalization::ZscoreNonzero => "zscore-nonzero",
            Normalization::Zscore => "zscore",
            Normalization::Ct => "ct",
            Normalization::None => "none",
            Normalization::RescaleTo01 => "rescale-to-01",
            Normalization::RgbTo01 => "rgb-to-01",
            Normalization::Indicator(_) => "indicator",
        }
    }

    /// The class name nnU-Net's plans.json gives this scheme in `normalization_schemes`;
    /// `None` for ours alone (nnU-Net writes z-score in the nonzero mask as
    /// `ZScoreNormalization` with `use_mask_for_norm`, and a previous stage's segmentation is
    /// no normalization of its).
    pub fn nnunet_name(&self) -> Option<&'static str> {
        Some(match self {
            Normalization::Ct => "CTNormalization",
            Normalization::Zscore => "ZScoreNormalization",
            Normalization::None => "NoNormalization",
            Normalization::RescaleTo01 => "RescaleTo01Normalization",
            Normalization::RgbTo01 => "RGBTo01Normalization",
            Normalization::ZscoreNonzero | Normalization::Indicator(_) => return Option::None,
        })
    }

    /// The scheme plans.json names `name` (exactly, as nnU-Net looks its class up); `None`
    /// for a name that is not one of nnU-Net's five.
    pub fn from_nnunet(name: &str) -> Option<Normalization> {
        NNUNET_SCHEMES
            .into_iter()
            .find(|n| n.nnunet_name() == Some(name))
    }

    /// nnU-Net's five names, for messages.
    pub fn nnunet_names() -> String {
        NNUNET_SCHEMES
            .map(|n| n.nnunet_name().unwrap_or_default())
            .join(", ")
    }

    /// Whether a cache build applies this scheme (nnU-Net's rescale and RGB schemes are
    /// reproduced for its models' inputs only).
    pub fn built(&self) -> bool {
        match self {
            Normalization::RescaleTo01 | Normalization::RgbTo01 => false,
            Normalization::ZscoreNonzero
            | Normalization::Zscore
            | Normalization::Ct
            | Normalization::None
            | Normalization::Indicator(_) => true,
        }
    }

    /// What the transform is computed from.
    pub fn statistics(&self) -> SchemeStatistics {
        match self {
            Normalization::ZscoreNonzero | Normalization::Zscore => SchemeStatistics::ImageMoments,
            Normalization::Ct => SchemeStatistics::DatasetForeground,
            Normalization::RescaleTo01 | Normalization::RgbTo01 => SchemeStatistics::ImageRange,
            Normalization::None | Normalization::Indicator(_) => SchemeStatistics::Fixed,
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

impl AppliedNormalization {
    /// The value a raw zero has after this transform: what prediction's crop takes for
    /// "nothing here" in a normalized channel (in f64, then rounded once).
    pub fn zero_value(&self) -> f32 {
        if let Normalization::Indicator(v) = self.scheme {
            return f32::from(u8::from(v == 0));
        }
        if self.only_nonzero {
            return 0.0;
        }
        let x = self.clip.map_or(0.0, |[lo, hi]| 0.0f64.clamp(lo, hi));
        ((x - self.shift) / self.scale) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: [Normalization; 8] = [
        Normalization::ZscoreNonzero,
        Normalization::Zscore,
        Normalization::Ct,
        Normalization::None,
        Normalization::RescaleTo01,
        Normalization::RgbTo01,
        Normalization::Indicator(0),
        Normalization::Indicator(3),
    ];

    #[test]
    fn every_nnunet_name_round_trips_and_an_unknown_one_is_refused() {
        let names = [
            "CTNormalization",
            "ZScoreNormalization",
            "NoNormalization",
            "RescaleTo01Normalization",
            "RGBTo01Normalization",
        ];
        for name in names {
            let s = Normalization::from_nnunet(name).unwrap();
            assert_eq!(s.nnunet_name(), Some(name));
            assert!(Normalization::nnunet_names().contains(name));
        }
        for s in EVERY {
            if let Some(name) = s.nnunet_name() {
                assert_eq!(Normalization::from_nnunet(name), Some(s), "{s:?}");
            }
        }
        // nnU-Net looks its classes up by their exact name.
        for unknown in [
            "ctnormalization",
            "CT",
            "ZScoreNormalization ",
            "",
            "zscore",
        ] {
            assert_eq!(Normalization::from_nnunet(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn our_spelling_is_the_one_serde_writes_and_flags_read() {
        for s in EVERY {
            let json = serde_json::to_string(&s).unwrap();
            match s {
                Normalization::Indicator(v) => {
                    assert_eq!(json, format!("{{\"{}\":{v}}}", s.name()))
                }
                _ => assert_eq!(json, format!("\"{}\"", s.name())),
            }
            assert_eq!(serde_json::from_str::<Normalization>(&json).unwrap(), s);
            let parsed = s.name().parse::<Normalization>();
            match s {
                Normalization::Indicator(_) => assert!(parsed.is_err()),
                _ if s.built() => assert_eq!(parsed.unwrap(), s),
                _ => {
                    let e = parsed.unwrap_err().to_string();
                    assert!(e.contains(s.nnunet_name().unwrap()), "{e}");
                }
            }
        }
        let e = "zscore-everything".parse::<Normalization>().unwrap_err();
        let e = e.to_string();
        assert!(e.contains("\"zscore-everything\""), "{e}");
        assert!(
            e.contains("choose zscore-nonzero, zscore, ct or none"),
            "{e}"
        );
    }

    #[test]
    fn a_raw_zero_becomes_what_the_transform_makes_of_it() {
        let t = |scheme, shift, scale, clip, only_nonzero| AppliedNormalization {
            scheme,
            shift,
            scale,
            clip,
            only_nonzero,
        };
        let zero = |a: AppliedNormalization| a.zero_value();
        assert_eq!(
            zero(t(Normalization::ZscoreNonzero, 5.0, 2.0, None, true)),
            0.0
        );
        assert_eq!(zero(t(Normalization::Zscore, 5.0, 2.0, None, false)), -2.5);
        let ct = t(Normalization::Ct, 50.0, 10.0, Some([20.0, 80.0]), false);
        assert_eq!(zero(ct), -3.0);
        assert_eq!(zero(t(Normalization::None, 0.0, 1.0, None, false)), 0.0);
        assert_eq!(
            zero(t(Normalization::Indicator(2), 0.0, 1.0, None, false)),
            0.0
        );
        assert_eq!(
            zero(t(Normalization::Indicator(0), 0.0, 1.0, None, false)),
            1.0
        );
    }
}
