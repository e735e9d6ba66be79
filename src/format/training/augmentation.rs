//! The augmentation options (`[train.augmentation]` with its `spatial` and `intensity`
//! tables), nnU-Net v2's defaults where nothing is said, and their checks: what pipeline files
//! and run records hold. `train` draws and applies the transforms.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Every augmentation option: the `[train.augmentation]` table of a pipeline file (with its
/// `spatial` and `intensity` sub-tables), nnU-Net v2's defaults where nothing is said.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AugmentConfig {
    /// Probability of mirroring each axis (z, y, x independently; nnU-Net: 0.5).
    pub mirror_prob: f64,
    /// Rotate by k * 90 degrees in the (y, x) plane, k uniform in 0..4, when the patch is
    /// square in-plane; by 0 or 180 degrees otherwise. Off in nnU-Net's defaults.
    pub rot90: bool,
    /// Rotation, scaling and elastic deformation.
    pub spatial: SpatialConfig,
    /// Noise, blur, brightness, contrast, low resolution and gamma.
    pub intensity: IntensityConfig,
}

impl AugmentConfig {
    /// No augmentation at all: patches come out exactly as read.
    pub fn none() -> Self {
        AugmentConfig {
            mirror_prob: 0.0,
            rot90: false,
            spatial: SpatialConfig::none(),
            intensity: IntensityConfig::none(),
        }
    }

    /// Every transform of nnU-Net's list on every patch (mirroring each axis, rotation,
    /// scaling, every intensity transform), ranges as in the defaults: for benchmarks and tests.
    pub fn every() -> Self {
        let d = AugmentConfig::default();
        AugmentConfig {
            mirror_prob: 1.0,
            spatial: d.spatial.every(),
            intensity: d.intensity.every(),
            ..d
        }
    }

    /// Check every probability and range.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.mirror_prob) {
            return Err(Error::Config(format!(
                "augmentation: mirror_prob {} is not between 0 and 1",
                self.mirror_prob
            )));
        }
        self.spatial.validate()?;
        self.intensity.validate()
    }

    /// Whether the model learns mirrored patches (then test-time mirroring makes sense).
    pub fn mirrors(&self) -> bool {
        self.mirror_prob > 0.0
    }
}

impl Default for AugmentConfig {
    fn default() -> Self {
        AugmentConfig {
            mirror_prob: 0.5,
            rot90: false,
            spatial: SpatialConfig::default(),
            intensity: IntensityConfig::default(),
        }
    }
}

/// The spatial part of the augmentation options (keys of `[train.augmentation]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpatialConfig {
    /// Probability that a patch is rotated (nnU-Net: 0.2).
    pub rotation_prob: f64,
    /// Largest rotation in degrees about the z, y and x axes. Unset: nnU-Net's choice, 30
    /// about each axis, or 180 about z alone for in-plane patches.
    pub rotation_degrees: Option<[f64; 3]>,
    /// Probability that a patch is scaled (nnU-Net: 0.2), by one factor for every axis.
    pub scale_prob: f64,
    /// Scale factor range (nnU-Net: 0.7 to 1.4); above 1 samples a wider region.
    pub scale_range: [f64; 2],
    /// Probability of an elastic deformation (nnU-Net: 0, off).
    pub elastic_prob: f64,
    /// Standard deviation of the control displacements, in voxels.
    pub elastic_magnitude: f64,
    /// Voxels between elastic control points.
    pub elastic_grid: usize,
    /// Rotate, scale and deform in the (y, x) plane only. Unset: when the patch is more than
    /// 3 times wider than deep (nnU-Net's rule).
    pub in_plane: Option<bool>,
}

impl Default for SpatialConfig {
    fn default() -> Self {
        SpatialConfig {
            rotation_prob: 0.2,
            rotation_degrees: None,
            scale_prob: 0.2,
            scale_range: [0.7, 1.4],
            elastic_prob: 0.0,
            elastic_magnitude: 3.0,
            elastic_grid: 16,
            in_plane: None,
        }
    }
}

impl SpatialConfig {
    /// No spatial transform at all.
    pub fn none() -> Self {
        SpatialConfig {
            rotation_prob: 0.0,
            scale_prob: 0.0,
            elastic_prob: 0.0,
            ..SpatialConfig::default()
        }
    }

    /// Rotation and scaling on every patch (elastic stays as configured): for benchmarks.
    pub fn every(&self) -> Self {
        SpatialConfig {
            rotation_prob: 1.0,
            scale_prob: 1.0,
            ..self.clone()
        }
    }

    /// An error naming the first option out of its range (probabilities, angles, scales,
    /// elastic magnitude and grid).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("augmentation.spatial: {m}")));
        for (name, p) in [
            ("rotation_prob", self.rotation_prob),
            ("scale_prob", self.scale_prob),
            ("elastic_prob", self.elastic_prob),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return bad(format!("{name} {p} is not between 0 and 1"));
            }
        }
        if let Some(d) = self.rotation_degrees {
            if d.iter()
                .any(|a| !(a.is_finite() && (0.0..=180.0).contains(a)))
            {
                return bad(format!(
                    "rotation_degrees {d:?}: each must be between 0 and 180"
                ));
            }
        }
        let [lo, hi] = self.scale_range;
        if !(lo.is_finite() && hi.is_finite() && 0.25 <= lo && lo <= hi && hi <= 4.0) {
            return bad(format!(
                "scale_range [{lo}, {hi}] must be ordered and within 0.25..4"
            ));
        }
        if !(self.elastic_magnitude.is_finite() && (0.0..=32.0).contains(&self.elastic_magnitude)) {
            return bad(format!(
                "elastic_magnitude {} must be between 0 and 32 voxels",
                self.elastic_magnitude
            ));
        }
        if !(2..=256).contains(&self.elastic_grid) {
            return bad(format!(
                "elastic_grid {} must be between 2 and 256 voxels",
                self.elastic_grid
            ));
        }
        Ok(())
    }
}

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
