//! Affines, spacing and the output-grid convention; connected components ([`components`]).
//!
//! Convention (see docs/usage.md, "Coordinate convention"): for an axis with `n` input voxels of
//! spacing `s` and a target spacing `t`, the output has `m = max(1, round(n * s / t))` voxels and
//! output voxel `j` samples input coordinate `x = (j + 0.5) * n / m - 0.5`. The outer edges of the
//! volume stay where they were (like nnU-Net and scipy `zoom(grid_mode=True)`), so the true output
//! spacing is `s * n / m`. Axes are always given as (x, y, z) = NIfTI (i, j, k) in this module.

use serde::{Deserialize, Serialize};

mod blocks;
pub mod components;
mod mirror;

pub use blocks::{blocks, Block, VoxelRead};
pub use mirror::mirror;

/// A 4x4 voxel-to-world matrix: world = A * (i, j, k, 1), with i the fastest-varying voxel axis.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Affine(pub [[f64; 4]; 4]);

impl Affine {
    /// An axis-aligned affine: voxel sizes `spacing_xyz` on the diagonal, origin at voxel 0.
    pub fn diagonal(spacing_xyz: [f64; 3]) -> Self {
        let mut m = [[0.0; 4]; 4];
        for (a, s) in spacing_xyz.iter().enumerate() {
            m[a][a] = *s;
        }
        m[3][3] = 1.0;
        Affine(m)
    }

    /// World coordinates of a (possibly fractional) voxel index (i, j, k).
    pub fn apply(&self, ijk: [f64; 3]) -> [f64; 3] {
        let m = &self.0;
        let mut out = [0.0; 3];
        for (r, o) in out.iter_mut().enumerate() {
            *o = m[r][0] * ijk[0] + m[r][1] * ijk[1] + m[r][2] * ijk[2] + m[r][3];
        }
        out
    }

    /// Length of each voxel axis in world units (norms of the first three columns).
    pub fn column_norms(&self) -> [f64; 3] {
        let m = &self.0;
        let mut out = [0.0; 3];
        for (c, o) in out.iter_mut().enumerate() {
            *o = (m[0][c].powi(2) + m[1][c].powi(2) + m[2][c].powi(2)).sqrt();
        }
        out
    }

    /// The affine of the output grid: voxel `j` of the output sits at input coordinate
    /// `(j + 0.5) * n / m - 0.5` on every axis.
    pub fn for_output_grid(&self, in_shape_xyz: [usize; 3], out_shape_xyz: [usize; 3]) -> Self {
        let m = &self.0;
        let mut out = *m;
        for c in 0..3 {
            let scale = in_shape_xyz[c] as f64 / out_shape_xyz[c] as f64;
            let shift = 0.5 * scale - 0.5;
            for r in 0..3 {
                out[r][c] = m[r][c] * scale;
                out[r][3] += m[r][c] * shift;
            }
        }
        Affine(out)
    }

    /// Orientation codes such as "RAS" or "LPS": for each voxel axis, the world direction it
    /// mostly points to (NIfTI world is RAS+).
    pub fn axis_codes(&self) -> String {
        let m = &self.0;
        (0..3)
            .map(|c| {
                let col = [m[0][c], m[1][c], m[2][c]];
                let (r, v) = col
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                    .map(|(r, v)| (r, *v))
                    .unwrap_or((c, 1.0));
                match (r, v >= 0.0) {
                    (0, true) => 'R',
                    (0, false) => 'L',
                    (1, true) => 'A',
                    (1, false) => 'P',
                    (_, true) => 'S',
                    (_, false) => 'I',
                }
            })
            .collect()
    }

    /// Whether every element is finite (a header with a NaN or infinite affine is refused).
    pub fn is_finite(&self) -> bool {
        self.0.iter().flatten().all(|v| v.is_finite())
    }

    /// Largest absolute difference between two affines (for "same geometry" checks).
    pub fn max_abs_diff(&self, other: &Affine) -> f64 {
        self.0
            .iter()
            .flatten()
            .zip(other.0.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max)
    }
}

/// Number of output voxels along one axis.
pub fn output_len(n: usize, spacing: f64, target: f64) -> usize {
    let m = (n as f64 * spacing / target).round();
    if m.is_finite() && m >= 1.0 {
        m as usize
    } else {
        1
    }
}

/// Output shape (x, y, z) for an input shape and spacing at a target spacing.
pub fn output_shape(
    shape_xyz: [usize; 3],
    spacing_xyz: [f64; 3],
    target_xyz: [f64; 3],
) -> [usize; 3] {
    [0, 1, 2].map(|a| output_len(shape_xyz[a], spacing_xyz[a], target_xyz[a]))
}

/// The spacing the output actually has: `s * n / m` per axis.
pub fn true_output_spacing(
    shape_xyz: [usize; 3],
    spacing_xyz: [f64; 3],
    out_shape_xyz: [usize; 3],
) -> [f64; 3] {
    [0, 1, 2].map(|a| spacing_xyz[a] * shape_xyz[a] as f64 / out_shape_xyz[a] as f64)
}

/// Input coordinate sampled by output voxel `j` (before clamping to [0, n-1]).
pub fn source_coordinate(j: usize, n: usize, m: usize) -> f64 {
    (j as f64 + 0.5) * n as f64 / m as f64 - 0.5
}

/// Voxel count of a shape.
pub fn voxels(shape: [usize; 3]) -> u64 {
    // Saturating: a header with an absurd spacing must give an absurd count, not a wrapped one.
    shape
        .iter()
        .fold(1u64, |acc, &v| acc.saturating_mul(v as u64))
}

/// The (z, y, x) shape of an (x, y, z) one: arrays in the cache are stored with z slowest.
pub fn zyx(shape_xyz: [usize; 3]) -> [usize; 3] {
    [shape_xyz[2], shape_xyz[1], shape_xyz[0]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_affine_keeps_the_outer_edges() {
        let a = Affine([
            [0.0, -2.0, 0.0, 10.0],
            [1.5, 0.0, 0.0, -4.0],
            [0.0, 0.0, 3.0, 7.0],
            [0.0, 0.0, 0.0, 1.0],
        ]);
        let n = [10, 7, 5];
        let m = [23, 3, 15];
        let b = a.for_output_grid(n, m);
        // The corner of the first voxel (-0.5) and of the last (n - 0.5) map to the same place.
        for (lo_in, lo_out) in [([-0.5; 3], [-0.5; 3])] {
            let p = a.apply(lo_in);
            let q = b.apply(lo_out);
            for k in 0..3 {
                assert!((p[k] - q[k]).abs() < 1e-9);
            }
        }
        let hi_in = [0, 1, 2].map(|k| n[k] as f64 - 0.5);
        let hi_out = [0, 1, 2].map(|k| m[k] as f64 - 0.5);
        let (p, q) = (a.apply(hi_in), b.apply(hi_out));
        for k in 0..3 {
            assert!((p[k] - q[k]).abs() < 1e-9);
        }
    }

    #[test]
    fn output_shape_rounds_and_never_vanishes() {
        assert_eq!(
            output_shape([512, 512, 61], [4.97, 4.97, 5.0], [1.0; 3]),
            [2545, 2545, 305]
        );
        assert_eq!(output_len(3, 0.1, 10.0), 1);
        assert_eq!(
            true_output_spacing([512, 512, 61], [4.97, 4.97, 5.0], [2545, 2545, 305]),
            [4.97 * 512.0 / 2545.0, 4.97 * 512.0 / 2545.0, 1.0]
        );
    }

    #[test]
    fn axis_codes_follow_the_dominant_direction() {
        assert_eq!(Affine::diagonal([1.0, 1.0, 1.0]).axis_codes(), "RAS");
        let mut a = Affine::diagonal([-1.0, -1.0, 1.0]);
        assert_eq!(a.axis_codes(), "LPS");
        a.0[0][0] = 0.0;
        a.0[1][0] = 1.0;
        a.0[1][1] = 0.0;
        a.0[0][1] = -1.0;
        assert_eq!(a.axis_codes(), "ALS");
    }
}
