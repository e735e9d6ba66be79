//! The spatial augmentation's options (`[train.augmentation]` keys), their validation, and
//! the draw of one patch's [`Transform`] from them (nnU-Net's probabilities and ranges).

use serde::{Deserialize, Serialize};

use super::transform::{rotation_zyx, ElasticField, Transform, IDENTITY};
use crate::error::{Error, Result};
use crate::util::rng::Rng;

/// Patches whose largest side is more than this many times their z side are augmented in-plane
/// only (nnU-Net's `ANISO_THRESHOLD`).
pub const IN_PLANE_RATIO: f64 = 3.0;

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

    /// Whether a patch of this size is augmented in-plane only.
    pub fn in_plane_for(&self, patch_zyx: [usize; 3]) -> bool {
        self.in_plane.unwrap_or_else(|| {
            let largest = patch_zyx.iter().copied().max().unwrap_or(1) as f64;
            largest / patch_zyx[0].max(1) as f64 > IN_PLANE_RATIO
        })
    }

    /// The largest angles (z, y, x axes) in degrees for a patch of this size.
    pub fn degrees_for(&self, patch_zyx: [usize; 3]) -> [f64; 3] {
        match (self.rotation_degrees, self.in_plane_for(patch_zyx)) {
            (Some([z, _, _]), true) => [z, 0.0, 0.0],
            (Some(d), false) => d,
            (None, true) => [180.0, 0.0, 0.0],
            (None, false) => [30.0; 3],
        }
    }

    /// Draw the transform of one patch. A fixed number of draws is taken from `rng` whatever
    /// is applied (the elastic field comes from a generator seeded by one of them), so the
    /// draws that follow do not depend on these settings.
    pub fn draw(&self, patch_zyx: [usize; 3], rng: &mut Rng) -> Transform {
        let in_plane = self.in_plane_for(patch_zyx);
        let degrees = self.degrees_for(patch_zyx);
        let rotate = rng.chance(self.rotation_prob);
        let angles = degrees.map(|d| rng.range(-d, d).to_radians());
        let scale = rng.chance(self.scale_prob);
        let factor = rng.range(self.scale_range[0], self.scale_range[1]);
        let elastic = rng.chance(self.elastic_prob);
        let elastic_seed = rng.next_u64();

        let rotation = if rotate {
            rotation_zyx(angles)
        } else {
            IDENTITY
        };
        let s = if scale { factor } else { 1.0 };
        let mut matrix = rotation.map(|row| row.map(|v| v * s));
        if in_plane {
            // z stays put: only the (y, x) block of the map acts.
            matrix[0] = [1.0, 0.0, 0.0];
            matrix[1][0] = 0.0;
            matrix[2][0] = 0.0;
        }
        let field = (elastic && self.elastic_magnitude > 0.0).then(|| {
            ElasticField::random(
                patch_zyx,
                self.elastic_grid,
                self.elastic_magnitude,
                in_plane,
                &mut Rng::new(elastic_seed),
            )
        });
        Transform {
            matrix,
            scale: s,
            elastic: field,
        }
    }
}
