//! The draw of one patch's [`Transform`] from the spatial augmentation's options (nnU-Net's
//! probabilities and ranges; the options and their checks are
//! [`crate::format::training::augmentation`]).

use super::transform::{rotation_zyx, ElasticField, Transform, IDENTITY};
pub use crate::format::training::augmentation::SpatialConfig;
use crate::util::rng::Rng;

/// Patches whose largest side is more than this many times their z side are augmented in-plane
/// only (nnU-Net's `ANISO_THRESHOLD`).
pub const IN_PLANE_RATIO: f64 = 3.0;

impl SpatialConfig {
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
