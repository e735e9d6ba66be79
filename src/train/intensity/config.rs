//! The intensity part of the augmentation options and their check.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The intensity part of the augmentation options (`[train.augmentation.intensity]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IntensityConfig {
    /// Gaussian noise: probability a patch gets it.
    pub noise_prob: f64,
    /// Gaussian noise: the range its variance is drawn from (one draw the channels share).
    pub noise_variance: [f64; 2],
    /// Gaussian blur: probability a patch gets it.
    pub blur_prob: f64,
    /// Gaussian blur: probability each channel of such a patch gets it.
    pub blur_channel_prob: f64,
    /// Gaussian blur: sigma range in voxels (one draw per axis).
    pub blur_sigma: [f64; 2],
    /// Multiplicative brightness: probability.
    pub brightness_prob: f64,
    /// Multiplicative brightness: factor range (either side of 1).
    pub brightness_range: [f64; 2],
    /// Contrast around the mean, clipped to the patch's range: probability.
    pub contrast_prob: f64,
    /// Contrast: factor range (either side of 1).
    pub contrast_range: [f64; 2],
    /// Low resolution (down by nearest, back up linearly; z untouched for in-plane patches):
    /// probability a patch gets it.
    pub lowres_prob: f64,
    /// Low resolution: probability each channel of such a patch gets it.
    pub lowres_channel_prob: f64,
    /// Low resolution: zoom range.
    pub lowres_zoom: [f64; 2],
    /// Gamma with the mean and standard deviation kept, applied to the negated image:
    /// probability.
    pub inverted_gamma_prob: f64,
    /// Gamma with the mean and standard deviation kept: probability.
    pub gamma_prob: f64,
    /// Gamma range of both variants (either side of 1).
    pub gamma_range: [f64; 2],
}

impl Default for IntensityConfig {
    fn default() -> Self {
        IntensityConfig {
            noise_prob: 0.1,
            noise_variance: [0.0, 0.1],
            blur_prob: 0.2,
            blur_channel_prob: 0.5,
            blur_sigma: [0.5, 1.0],
            brightness_prob: 0.15,
            brightness_range: [0.75, 1.25],
            contrast_prob: 0.15,
            contrast_range: [0.75, 1.25],
            lowres_prob: 0.25,
            lowres_channel_prob: 0.5,
            lowres_zoom: [0.5, 1.0],
            inverted_gamma_prob: 0.1,
            gamma_prob: 0.3,
            gamma_range: [0.7, 1.5],
        }
    }
}

impl IntensityConfig {
    /// Nothing applied.
    pub fn none() -> Self {
        IntensityConfig {
            noise_prob: 0.0,
            blur_prob: 0.0,
            brightness_prob: 0.0,
            contrast_prob: 0.0,
            lowres_prob: 0.0,
            inverted_gamma_prob: 0.0,
            gamma_prob: 0.0,
            ..IntensityConfig::default()
        }
    }

    /// Every transform on every patch and channel, ranges as configured: for benchmarks.
    pub fn every(&self) -> Self {
        IntensityConfig {
            noise_prob: 1.0,
            blur_prob: 1.0,
            blur_channel_prob: 1.0,
            brightness_prob: 1.0,
            contrast_prob: 1.0,
            lowres_prob: 1.0,
            lowres_channel_prob: 1.0,
            inverted_gamma_prob: 1.0,
            gamma_prob: 1.0,
            ..self.clone()
        }
    }

    /// Every probability within 0..1, every range ordered and within its bounds.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("augmentation.intensity: {m}")));
        for (name, p) in [
            ("noise_prob", self.noise_prob),
            ("blur_prob", self.blur_prob),
            ("blur_channel_prob", self.blur_channel_prob),
            ("brightness_prob", self.brightness_prob),
            ("contrast_prob", self.contrast_prob),
            ("lowres_prob", self.lowres_prob),
            ("lowres_channel_prob", self.lowres_channel_prob),
            ("inverted_gamma_prob", self.inverted_gamma_prob),
            ("gamma_prob", self.gamma_prob),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return bad(format!("{name} {p} is not between 0 and 1"));
            }
        }
        for (name, [lo, hi], min, max) in [
            ("noise_variance", self.noise_variance, 0.0, 10.0),
            ("blur_sigma", self.blur_sigma, 0.0, 8.0),
            ("brightness_range", self.brightness_range, 1e-3, 10.0),
            ("contrast_range", self.contrast_range, 1e-3, 10.0),
            ("lowres_zoom", self.lowres_zoom, 0.05, 1.0),
            ("gamma_range", self.gamma_range, 1e-2, 10.0),
        ] {
            if !(lo.is_finite() && hi.is_finite() && min <= lo && lo <= hi && hi <= max) {
                return bad(format!(
                    "{name} [{lo}, {hi}] must be ordered and within {min}..{max}"
                ));
            }
        }
        Ok(())
    }
}
