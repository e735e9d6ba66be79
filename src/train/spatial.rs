//! Spatial augmentation: rotation, scaling and elastic deformation as one map from patch voxels
//! to source coordinates, and one interpolation of every array of the case at those coordinates.
//!
//! nnU-Net crops an enlarged patch, then rotates and scales it; we compute where each patch voxel
//! comes from in the cached volume and read only the box those coordinates need (memory-mapped
//! chunks under it), so nothing depends on the volume's size and nothing is interpolated twice.
//!
//! The map, in voxel coordinates (z, y, x) of the cached volume, for patch voxel `p`:
//!
//! ```text
//! source(p) = centre + scale * R * (p - (size - 1) / 2) + elastic(p)
//! ```
//!
//! `centre = start + (size - 1) / 2` is the centre of the box the sampler chose (so the identity
//! map reads exactly that box, and a foreground-centred patch stays centred on its voxel);
//! `R = Rz * Ry * Rx` rotates by the angles about the z, y and x axes (`Rz` turns the (y, x)
//! plane); a scale above 1 samples a wider region (structures look smaller), as in nnU-Net.
//! `elastic` is a displacement interpolated trilinearly from a coarse grid of random control
//! displacements. Rotation happens in voxel space, as nnU-Net does; patches much thinner in z
//! than in-plane (nnU-Net's "dummy 2D" rule, largest side over 3 times z) are rotated, scaled
//! and deformed in-plane only.
//!
//! Interpolation: images linearly (what scipy's `map_coordinates(order=1,
//! mode="grid-constant")` computes over the zero-padded volume); labels by the class with the
//! largest summed linear weight among the 8 neighbours (nnU-Net's per-class interpolation,
//! which never invents a value between two classes), ties to the lower value. Outside the
//! volume images read 0 (after normalization) and labels background, like nnU-Net's padding.
//!
//! Paths, all giving the same bits: the general tile loop (`sample`, and its vector build over
//! rows of 8 voxels with `gather`); maps without rotation or deformation through three 1D
//! passes (`separable`); in-plane maps of several planes through the box turned on its side,
//! reading only their footprint (`columns`); labels' majorities in `label`. Vector builds are
//! picked by [`crate::util::simd`].

use serde::{Deserialize, Serialize};

use crate::cache::source::SpanOut;
use crate::cache::PatchSource;
use crate::geometry::mirror;
#[cfg(target_arch = "x86_64")]
mod columns;
#[cfg(target_arch = "x86_64")]
mod gather;
mod label;
mod separable;

use crate::error::{Error, Result};
use crate::util::rng::Rng;
use crate::util::simd::{self, Simd};

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

const IDENTITY: [[f64; 3]; 3] = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];

/// `Rz * Ry * Rx` in (z, y, x) coordinates, angles in radians about the z, y and x axes.
pub fn rotation_zyx(angles: [f64; 3]) -> [[f64; 3]; 3] {
    let [az, ay, ax] = angles;
    // About z: turns (y, x). About y: turns (z, x). About x: turns (z, y).
    let rz = [
        [1.0, 0.0, 0.0],
        [0.0, az.cos(), -az.sin()],
        [0.0, az.sin(), az.cos()],
    ];
    let ry = [
        [ay.cos(), 0.0, ay.sin()],
        [0.0, 1.0, 0.0],
        [-ay.sin(), 0.0, ay.cos()],
    ];
    let rx = [
        [ax.cos(), -ax.sin(), 0.0],
        [ax.sin(), ax.cos(), 0.0],
        [0.0, 0.0, 1.0],
    ];
    mat_mul(&mat_mul(&rz, &ry), &rx)
}

fn mat_mul(a: &[[f64; 3]; 3], b: &[[f64; 3]; 3]) -> [[f64; 3]; 3] {
    std::array::from_fn(|i| std::array::from_fn(|j| (0..3).map(|k| a[i][k] * b[k][j]).sum()))
}

/// Random displacements on a coarse grid over the patch, interpolated trilinearly in between.
#[derive(Clone, Debug, PartialEq)]
pub struct ElasticField {
    /// Control points per axis (z, y, x).
    nodes: [usize; 3],
    grid: f64,
    /// (z, y, x) displacement per control point, C order over `nodes`.
    disp: Vec<[f64; 3]>,
}

impl ElasticField {
    fn random(
        size: [usize; 3],
        grid: usize,
        magnitude: f64,
        in_plane: bool,
        rng: &mut Rng,
    ) -> Self {
        let nodes = size.map(|n| (n.saturating_sub(1)).div_ceil(grid) + 1);
        let count: usize = nodes.iter().product();
        let disp = (0..count)
            .map(|_| {
                let d = [0, 1, 2].map(|_| rng.normal() * magnitude);
                if in_plane {
                    [0.0, d[1], d[2]]
                } else {
                    d
                }
            })
            .collect();
        ElasticField {
            nodes,
            grid: grid as f64,
            disp,
        }
    }

    /// The largest displacement magnitude per axis (the interpolated field never exceeds it).
    fn bound(&self) -> [f64; 3] {
        let mut b = [0f64; 3];
        for d in &self.disp {
            for a in 0..3 {
                b[a] = b[a].max(d[a].abs());
            }
        }
        b
    }

    /// The displacements along patch row `(z, y)` from `x0`, one per x, added to `out`: the
    /// field is interpolated in (z, y) once per control column, then along x.
    fn add_row(
        &self,
        z: usize,
        y: usize,
        x0: usize,
        out: &mut [[f64; 3]],
        columns: &mut Vec<[f64; 3]>,
    ) {
        let nx = self.nodes[2];
        columns.clear();
        for ix in 0..nx {
            // The (z, y) interpolation at control column ix (x exactly on a node).
            columns.push(self.at([z, y, (ix as f64 * self.grid) as usize]));
        }
        for (k, o) in out.iter_mut().enumerate() {
            let g = (x0 + k) as f64 / self.grid;
            let i = (g as usize).min(nx.saturating_sub(2));
            let f = if nx > 1 { g - i as f64 } else { 0.0 };
            let (a, b) = (columns[i], columns[(i + 1).min(nx - 1)]);
            for k in 0..3 {
                o[k] += a[k] + (b[k] - a[k]) * f;
            }
        }
    }

    /// The displacement at patch voxel `p`.
    fn at(&self, p: [usize; 3]) -> [f64; 3] {
        let mut i0 = [0usize; 3];
        let mut f = [0f64; 3];
        for a in 0..3 {
            let g = p[a] as f64 / self.grid;
            let i = (g.floor() as usize).min(self.nodes[a].saturating_sub(2));
            i0[a] = i;
            f[a] = if self.nodes[a] > 1 { g - i as f64 } else { 0.0 };
        }
        let mut out = [0f64; 3];
        for corner in 0..8 {
            let mut w = 1.0;
            let mut idx = [0usize; 3];
            for a in 0..3 {
                let up = (corner >> (2 - a)) & 1;
                w *= if up == 1 { f[a] } else { 1.0 - f[a] };
                idx[a] = (i0[a] + up).min(self.nodes[a] - 1);
            }
            if w == 0.0 {
                continue;
            }
            let d = &self.disp[(idx[0] * self.nodes[1] + idx[1]) * self.nodes[2] + idx[2]];
            for a in 0..3 {
                out[a] += w * d[a];
            }
        }
        out
    }
}

/// One patch's map from patch voxels to source coordinates (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Transform {
    /// `scale * R`, acting on (z, y, x) offsets from the patch centre.
    pub matrix: [[f64; 3]; 3],
    /// The scale factor alone (distance maps sampled through the map shrink by it).
    pub scale: f64,
    pub elastic: Option<ElasticField>,
}

impl Transform {
    pub fn identity() -> Self {
        Transform {
            matrix: IDENTITY,
            scale: 1.0,
            elastic: None,
        }
    }

    /// A rotation (radians about z, y, x) and scale, without elastic deformation.
    pub fn rotate_scale(angles: [f64; 3], scale: f64) -> Self {
        Transform {
            matrix: rotation_zyx(angles).map(|row| row.map(|v| v * scale)),
            scale,
            elastic: None,
        }
    }

    /// An in-plane map (what [`SpatialConfig::draw`] gives anisotropic patches): rotation by
    /// `angle` radians about z and scaling of y and x by `scale`; z stays put.
    pub fn in_plane(angle: f64, scale: f64) -> Self {
        let mut t = Transform::rotate_scale([angle, 0.0, 0.0], scale);
        t.matrix[0] = [1.0, 0.0, 0.0];
        t
    }

    /// Whether this map is the plain crop (then nothing needs interpolating).
    pub fn is_identity(&self) -> bool {
        self.matrix == IDENTITY && self.elastic.is_none()
    }

    /// The same map with the patch mirrored along each axis of `flips` (z, y, x): that axis's
    /// column negated, so that patch voxel `p` samples where `size - 1 - p` did (the same
    /// coordinates bit for bit: the offsets from the centre only change sign). Not for maps
    /// with an elastic field, whose displacements are laid out on the patch.
    pub fn mirrored(&self, flips: [bool; 3]) -> Transform {
        debug_assert!(self.elastic.is_none());
        let mut t = self.clone();
        for row in &mut t.matrix {
            for (v, &f) in row.iter_mut().zip(&flips) {
                if f {
                    *v = -*v;
                }
            }
        }
        t
    }

    /// Whether every patch voxel's source z is a whole voxel: z maps to itself or to its
    /// mirror (in-plane maps) and the elastic field, if any, never moves along z.
    pub fn keeps_z_planes(&self) -> bool {
        let m = &self.matrix;
        (m[0] == [1.0, 0.0, 0.0] || m[0] == [-1.0, 0.0, 0.0])
            && m[1][0] == 0.0
            && m[2][0] == 0.0
            && self
                .elastic
                .as_ref()
                .is_none_or(|e| e.disp.iter().all(|d| d[0] == 0.0))
    }

    /// Whether each axis's source coordinate depends on that axis's patch index alone (no
    /// rotation, no deformation: a scaling, or nothing), so that interpolation separates.
    pub fn axis_aligned(&self) -> bool {
        let m = &self.matrix;
        self.elastic.is_none() && (0..3).all(|a| (0..3).all(|b| a == b || m[a][b] == 0.0))
    }

    /// Each axis's source coordinates of an [`Transform::axis_aligned`] map, per patch index:
    /// the coordinates [`Transform::row`] gives along the patch's first row, column and pillar
    /// (its other terms are zeros, so every voxel has these, bit for bit).
    fn axis_coordinates(&self, centre: [f64; 3], size: [usize; 3]) -> [Vec<f64>; 3] {
        let mut scratch = Vec::new();
        let mut row = vec![[0.0; 3]; size[2]];
        let mut pillar = |a: usize| -> Vec<f64> {
            (0..size[a])
                .map(|i| {
                    let (z, y) = match a {
                        0 => (i, 0),
                        _ => (0, i),
                    };
                    self.row(centre, size, (z, y), 0, &mut row[..1], &mut scratch);
                    row[0][a]
                })
                .collect()
        };
        let (z, y) = (pillar(0), pillar(1));
        self.row(centre, size, (0, 0), 0, &mut row, &mut scratch);
        [z, y, row.iter().map(|c| c[2]).collect()]
    }

    /// The affine part's source coordinate of patch voxel `(z, y, x)` before its x term:
    /// `centre + m * (dz, dy, 0)`, summed left to right as [`Transform::row`] does.
    #[inline(always)]
    fn row_start(&self, centre: [f64; 3], size: [usize; 3], (z, y): (usize, usize)) -> [f64; 3] {
        let half = size.map(|n| (n as f64 - 1.0) / 2.0);
        let (dz, dy) = (z as f64 - half[0], y as f64 - half[1]);
        let m = &self.matrix;
        // Written out: `[0, 1, 2].map(..)` stayed a call per row (1.5% of a rotated patch).
        let at = |a: usize| centre[a] + m[a][0] * dz + m[a][1] * dy;
        [at(0), at(1), at(2)]
    }

    /// Source coordinates (z, y, x) of the patch row `(z, y)`, one per x, into `out`
    /// (`scratch` holds the elastic field's control columns).
    #[inline(always)]
    fn row(
        &self,
        centre: [f64; 3],
        size: [usize; 3],
        (z, y): (usize, usize),
        x0: usize,
        out: &mut [[f64; 3]],
        scratch: &mut Vec<[f64; 3]>,
    ) {
        let start = self.row_start(centre, size, (z, y));
        let half_x = (size[2] as f64 - 1.0) / 2.0;
        let m = &self.matrix;
        for (k, o) in out.iter_mut().enumerate() {
            let dx = (x0 + k) as f64 - half_x;
            for a in 0..3 {
                o[a] = start[a] + m[a][2] * dx;
            }
        }
        if let Some(e) = &self.elastic {
            e.add_row(z, y, x0, out, scratch);
        }
    }

    /// [`Transform::row`] for the 8 voxels from `x0` of a map without elastic deformation, axis
    /// by axis (the lanes the vector loop wants; the same sums, so the same bits).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn row8(
        &self,
        centre: [f64; 3],
        size: [usize; 3],
        (z, y): (usize, usize),
        x0: usize,
    ) -> [[f64; 8]; 3] {
        debug_assert!(self.elastic.is_none());
        let start = self.row_start(centre, size, (z, y));
        let half_x = (size[2] as f64 - 1.0) / 2.0;
        let m = &self.matrix;
        // Plain loops: nested `array::from_fn` closures were left as calls in some builds of
        // the caller (12% slower 3D rotations, depending on unrelated code).
        let mut out = [[0f64; 8]; 3];
        for (a, lanes) in out.iter_mut().enumerate() {
            for (k, c) in lanes.iter_mut().enumerate() {
                *c = start[a] + m[a][2] * ((x0 + k) as f64 - half_x);
            }
        }
        out
    }

    /// Every source coordinate of a patch, C order (for tests and reference implementations).
    pub fn coordinates(&self, start_zyx: [i64; 3], size: [usize; 3]) -> Vec<[f64; 3]> {
        let centre = centre_of(start_zyx, size);
        let mut out = vec![[0.0; 3]; size.iter().product()];
        let mut scratch = Vec::new();
        for (r, row) in out.chunks_exact_mut(size[2]).enumerate() {
            self.row(
                centre,
                size,
                (r / size[1], r % size[1]),
                0,
                row,
                &mut scratch,
            );
        }
        out
    }

    /// The box (start, size) of source voxels that linear interpolation at every coordinate
    /// of the patch reads: the map is affine plus a bounded displacement, so its extremes are
    /// at the patch's corners; one voxel of margin on each side absorbs rounding.
    pub fn source_box(&self, start_zyx: [i64; 3], size: [usize; 3]) -> ([i64; 3], [usize; 3]) {
        let centre = centre_of(start_zyx, size);
        let half = size.map(|n| (n as f64 - 1.0) / 2.0);
        let bound = self.elastic.as_ref().map_or([0.0; 3], ElasticField::bound);
        let mut lo = [f64::INFINITY; 3];
        let mut hi = [f64::NEG_INFINITY; 3];
        for corner in 0..8 {
            let d = [0, 1, 2].map(|a| {
                if (corner >> (2 - a)) & 1 == 1 {
                    half[a]
                } else {
                    -half[a]
                }
            });
            for a in 0..3 {
                let m = &self.matrix[a];
                let c = centre[a] + m[0] * d[0] + m[1] * d[1] + m[2] * d[2];
                lo[a] = lo[a].min(c - bound[a]);
                hi[a] = hi[a].max(c + bound[a]);
            }
        }
        let start = lo.map(|v| v.floor() as i64 - 1);
        let end = hi.map(|v| v.floor() as i64 + 2);
        (start, [0, 1, 2].map(|a| (end[a] - start[a] + 1) as usize))
    }
}

/// The first `n` elements of `buf`, which only ever grows: boxes change size from patch to
/// patch, and a `Vec` resized down and up again zero-fills the regrown part each time, though
/// every read overwrites what is used of it (2% of a 16x128x128 `default` patch).
pub(super) fn first_n<T: Copy + Default>(buf: &mut Vec<T>, n: usize) -> &mut [T] {
    if buf.len() < n {
        buf.resize(n, T::default());
    }
    &mut buf[..n]
}

fn centre_of(start_zyx: [i64; 3], size: [usize; 3]) -> [f64; 3] {
    [0, 1, 2].map(|a| start_zyx[a] as f64 + (size[a] as f64 - 1.0) / 2.0)
}

/// Reads patches through a transform: the source box once, then one interpolation per array.
/// Holds the box buffers between patches (a loader worker keeps one).
#[derive(Default)]
pub struct TransformedReader {
    image_box: Vec<f32>,
    labels: label::LabelBox,
    /// The skeleton's box ([`TransformedReader::read_derived`]).
    skeleton_box: Vec<u16>,
    row: Vec<[f64; 3]>,
    scratch: Vec<[f64; 3]>,
    /// One tile's voxels (see [`Cell`]).
    cells: Vec<Cell>,
    /// The vector build to take instead of the widest ([`simd::best`]; tests compare them).
    build: Option<Simd>,
    /// A short tile row's 8-lane output, channel after channel (vector paths).
    #[cfg(target_arch = "x86_64")]
    short_row: Vec<f32>,
    /// The cells of one patch plane's rows of 8 within a box plane (in-plane maps), and
    /// their fractions in f64 (y, x) for the label's mixed lanes.
    #[cfg(target_arch = "x86_64")]
    plane_rows: Vec<gather::PlaneRow>,
    #[cfg(target_arch = "x86_64")]
    plane_frac: Vec<[[f64; 8]; 2]>,
    /// Label lanes left to weigh (in-plane maps: plane row index, patch index and mixed lanes
    /// of a row of 8; 3D maps: each lane's patch index, box index and fractions, the lanes
    /// alone: a row's whole cells, copied for each row with a mixed lane, were a tenth of a
    /// 3D rotation's time).
    #[cfg(target_arch = "x86_64")]
    deferred: Vec<(usize, usize, u32)>,
    #[cfg(target_arch = "x86_64")]
    deferred_cells: Vec<(usize, usize, [f64; 3])>,
    /// In-plane maps' box as columns of planes ([`columns`]), and for each column lane the
    /// patch plane it fills.
    #[cfg(target_arch = "x86_64")]
    columns: columns::Columns,
    #[cfg(target_arch = "x86_64")]
    column_planes: Vec<usize>,
    /// The x range of each box row the cells need (in-plane maps: the same in every plane).
    spans: Vec<(u32, u32)>,
    /// Tables and planes of maps without rotation ([`separable`]).
    separable: separable::Separable,
    /// Take the general loop for maps without rotation too (tests compare the two).
    #[cfg(test)]
    general_only: bool,
}

impl TransformedReader {
    /// A reader that takes the given vector build (or, on a CPU without it, the widest it
    /// has): for tests and benchmarks comparing builds.
    pub fn with_build(build: Simd) -> Self {
        TransformedReader {
            build: Some(build),
            ..TransformedReader::default()
        }
    }

    /// [`TransformedReader::read`] with the patch mirrored along each axis of `flips` (as
    /// [`crate::geometry::mirror`] after reading would, bit for bit): plain crops are
    /// read mirrored, other maps mirrored in their matrix, at no cost either way.
    #[allow(clippy::too_many_arguments)]
    pub fn read_mirrored(
        &mut self,
        src: &dyn PatchSource,
        start_zyx: [i64; 3],
        size: [usize; 3],
        t: &Transform,
        flips: [bool; 3],
        image: &mut [f32],
        mut label: Option<&mut [u16]>,
    ) -> Result<()> {
        if flips == [false; 3] {
            return self.read(src, start_zyx, size, t, image, label);
        }
        if t.is_identity() {
            return src.read_patch_mirrored(start_zyx, size, flips, image, label);
        }
        if t.elastic.is_some() {
            // Read, then mirrored (the field is laid out on the patch).
            self.read(src, start_zyx, size, t, image, label.as_deref_mut())?;
            let n: usize = size.iter().product();
            for c in image.chunks_exact_mut(n.max(1)) {
                mirror(c, size, flips);
            }
            if let Some(l) = label {
                mirror(l, size, flips);
            }
            return Ok(());
        }
        self.read(src, start_zyx, size, &t.mirrored(flips), image, label)
    }

    /// Fill `image` (channels x patch, C order) and `label` (patch) with the case's arrays
    /// sampled through `t` for the patch whose untransformed box starts at `start_zyx`.
    pub fn read(
        &mut self,
        src: &dyn PatchSource,
        start_zyx: [i64; 3],
        size: [usize; 3],
        t: &Transform,
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) -> Result<()> {
        if t.is_identity() {
            return src.read_patch(start_zyx, size, image, label);
        }
        let channels = src.channels();
        let Some((box_start, bs)) = needed_box(t, start_zyx, size, src.shape_zyx())? else {
            // The whole patch lies more than a voxel outside the volume.
            image.fill(0.0);
            if let Some(l) = label {
                l.fill(0);
            }
            return Ok(());
        };
        let bn: usize = bs.iter().product();
        let centre = centre_of(start_zyx, size);
        // Coordinates relative to the box: the map's centre moved by the box's start.
        let local_centre = [0, 1, 2].map(|a| centre[a] - box_start[a] as f64);
        let job = Sampling {
            t,
            local_centre,
            size,
            bs,
            channels,
        };
        // In-plane maps keep z on whole voxels: 4 neighbours instead of 8 (the same values,
        // since the upper plane's weight is exactly 0).
        let flat = t.keeps_z_planes();
        // In-plane maps without deformation in the vector builds: `in_plane` (which reads
        // what it needs itself). Scalings of 8 planes or more too: their label through the
        // columns is faster than the separable path's (the whole patch measured 19% faster
        // for 8 planes, 23% for 16, 13% slower for 4); their image takes the separable passes
        // there.
        #[cfg(target_arch = "x86_64")]
        if flat
            && t.elastic.is_none()
            && (!t.axis_aligned() || size[0] >= 2 * COLUMN_PLANES)
            && self.simd() != Simd::Portable
            && bn < i32::MAX as usize
        {
            // SAFETY: the CPU has AVX2 (`simd` checked it); the box is under 2^31 voxels.
            return unsafe {
                if self.simd() == Simd::Avx512 {
                    self.in_plane_avx512(src, box_start, &job, image, label)
                } else {
                    self.in_plane_avx2(src, box_start, &job, image, label)
                }
            };
        }
        #[cfg(test)]
        let separable = t.axis_aligned() && !self.general_only;
        #[cfg(not(test))]
        let separable = t.axis_aligned();
        // Rotations read only their footprint (36% of the box of a 32x96x96 patch at
        // nnU-Net's ranges, fewer pages to bring in); the separable passes read all of theirs.
        if !separable
            && t.elastic.is_none()
            && footprint_spans_3d(t, local_centre, size, bs, &mut self.spans)
        {
            self.read_box_spans(src, box_start, bs, channels, label.is_some())?;
        } else {
            src.read_image(box_start, bs, first_n(&mut self.image_box, channels * bn))?;
            if label.is_some() {
                self.labels.read(src, box_start, bs)?;
            }
        }
        if separable {
            let coords = t.axis_coordinates(local_centre, size);
            self.separable.prepare(coords, bs);
            separable::sample_in(
                self.simd(),
                &mut self.separable,
                flat,
                &self.image_box,
                bs,
                channels,
                size,
                image,
                label.map(|l| (&mut self.labels, l)),
            );
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        match self.simd() {
            Simd::Portable => {}
            // SAFETY: the CPU has these features (`simd` checked them).
            simd => {
                unsafe {
                    if simd == Simd::Avx512 {
                        self.sample_avx512(flat, &job, image, label);
                    } else {
                        self.sample_avx2(flat, &job, image, label);
                    }
                }
                return Ok(());
            }
        }
        if flat {
            self.sample::<true>(&job, image, label);
        } else {
            self.sample::<false>(&job, image, label);
        }
        Ok(())
    }

    /// The parts of the box that `spans` name (see [`PatchSource::read_spans`]) into
    /// `image_box`, and of the label box when `label`.
    fn read_box_spans(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        bs: [usize; 3],
        channels: usize,
        label: bool,
    ) -> Result<()> {
        let n = channels * bs.iter().product::<usize>();
        src.read_spans(
            box_start,
            bs,
            &self.spans,
            SpanOut::Image(first_n(&mut self.image_box, n)),
        )?;
        if label {
            self.labels.read_spans(src, box_start, bs, &self.spans)?;
        }
        Ok(())
    }

    /// The vector build this reader takes: its `build` if set, else the widest; never one the
    /// CPU lacks.
    fn simd(&self) -> Simd {
        self.build.unwrap_or_else(simd::best).min(simd::detected())
    }

    /// [`TransformedReader::sample`] in vectors (the caller compiles it for AVX2 or AVX-512,
    /// without FMA: the same operations, so the same values).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn sample_vectors<const W512: bool>(
        &mut self,
        flat: bool,
        job: &Sampling,
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) {
        // Cells are computed in i32 lanes: boxes past that take the portable path's loop.
        let vectors = job.bs.iter().product::<usize>() < i32::MAX as usize;
        match (vectors, flat) {
            (true, true) => self.sample_rows::<true, false, W512>(job, image, label),
            (true, false) => self.sample_rows::<false, false, W512>(job, image, label),
            (false, true) => self.sample::<true>(job, image, label),
            (false, false) => self.sample::<false>(job, image, label),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn sample_avx2(
        &mut self,
        flat: bool,
        job: &Sampling,
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) {
        self.sample_vectors::<false>(flat, job, image, label);
    }

    /// AVX-512's 32 vector registers and 8 f64 lanes (the coordinates) make the same loop
    /// about 8% faster for 3D rotations.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512dq")]
    unsafe fn sample_avx512(
        &mut self,
        flat: bool,
        job: &Sampling,
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) {
        self.sample_vectors::<true>(flat, job, image, label);
    }

    /// [`TransformedReader::read_derived`]'s interpolation in vectors: the distance maps
    /// (the channels of `job`) linearly as images are, the skeleton by the nearest voxel; the
    /// same values as its scalar loop (in-plane maps read 4 neighbours instead of 8, whose
    /// upper plane weighs exactly 0). The caller checks the CPU and the box's size.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn derived_vectors<const W512: bool>(
        &mut self,
        flat: bool,
        job: &Sampling,
        distance: &mut [f32],
        skeleton: Option<&mut [u16]>,
    ) {
        if flat {
            self.sample_rows::<true, true, W512>(job, distance, skeleton);
        } else {
            self.sample_rows::<false, true, W512>(job, distance, skeleton);
        }
    }

    /// [`TransformedReader::read_derived`] of an in-plane map without deformation through the
    /// box's columns ([`columns`]): the distance maps (the channels of `job`, their boxes in
    /// `image_box`) as the image is read there, the skeleton (`skeleton_box`) by the nearest
    /// voxel, the same values as [`TransformedReader::derived_vectors`] (before the scale's
    /// division). `false` (nothing written) when fewer than [`COLUMN_PLANES`] patch planes lie
    /// in the box.
    ///
    /// # Safety
    /// The CPU must have AVX2; the box must be under 2^31 voxels.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn derived_in_plane(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        job: &Sampling,
        classes: &[u16],
        distance: &mut [f32],
        skeleton: Option<&mut [u16]>,
    ) -> Result<bool> {
        let Sampling {
            t,
            local_centre,
            size,
            bs,
            channels,
        } = *job;
        let lo = self.plane_cells(t, local_centre, size, bs);
        if self.column_planes.len() < COLUMN_PLANES {
            return Ok(false);
        }
        // Only the box rows' x ranges that the cells read (`plane_cells` set them), of the
        // planes the patch planes lie in, as the image's.
        let (box_start, bs, lo) = self.column_box(box_start, bs, lo);
        self.read_derived_boxes(src, box_start, bs, classes, skeleton.is_some(), true)?;
        let mut skeleton = skeleton;
        self.zero_planes_outside(size, channels, distance, skeleton.as_deref_mut());
        let cj = columns::Job {
            rows: &self.plane_rows,
            frac: &self.plane_frac,
            lo,
            planes: &self.column_planes,
            spans: &self.spans,
            w512: self.simd() == Simd::Avx512,
            size,
            bs,
            channels,
        };
        // SAFETY: AVX2 is enabled here (the caller's); the rows' cells are of box plane 0,
        // inside lanes at most one voxel before the plane's y and x ends, within the spans
        // read.
        if channels > 0 {
            self.columns.sample(&cj, &self.image_box, distance, None);
        }
        if let Some(sk) = skeleton {
            self.columns.nearest(&cj, &self.skeleton_box, sk);
        }
        Ok(true)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn derived_in_plane_avx2(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        job: &Sampling,
        classes: &[u16],
        distance: &mut [f32],
        skeleton: Option<&mut [u16]>,
    ) -> Result<bool> {
        self.derived_in_plane(src, box_start, job, classes, distance, skeleton)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512dq")]
    unsafe fn derived_in_plane_avx512(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        job: &Sampling,
        classes: &[u16],
        distance: &mut [f32],
        skeleton: Option<&mut [u16]>,
    ) -> Result<bool> {
        self.derived_in_plane(src, box_start, job, classes, distance, skeleton)
    }

    /// Whether `t` reads only its footprint of the box (rotations without deformation, as
    /// in [`TransformedReader::read`]): then its rows' x ranges are in `spans`.
    fn rotation_spans(
        &mut self,
        t: &Transform,
        local_centre: [f64; 3],
        size: [usize; 3],
        bs: [usize; 3],
    ) -> bool {
        !t.axis_aligned()
            && t.elastic.is_none()
            && footprint_spans_3d(t, local_centre, size, bs, &mut self.spans)
    }

    /// The boxes of the distance maps of `classes` (one after the other in `image_box`) and
    /// of the skeleton (`skeleton_box`, when `skeleton`): with `spans`, only the x ranges of
    /// `spans` (see [`PatchSource::read_spans`]), else whole.
    fn read_derived_boxes(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        bs: [usize; 3],
        classes: &[u16],
        skeleton: bool,
        spans: bool,
    ) -> Result<()> {
        let bn: usize = bs.iter().product();
        let boxes = first_n(&mut self.image_box, classes.len() * bn);
        for (&c, b) in classes.iter().zip(boxes.chunks_exact_mut(bn)) {
            if spans {
                src.read_spans(box_start, bs, &self.spans, SpanOut::Distance(c, b))?;
            } else {
                src.read_distance(c, box_start, bs, b)?;
            }
        }
        if skeleton {
            let b = first_n(&mut self.skeleton_box, bn);
            if spans {
                src.read_spans(box_start, bs, &self.spans, SpanOut::Skeleton(b))?;
            } else {
                src.read_skeleton(box_start, bs, b)?;
            }
        }
        Ok(())
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn derived_avx2(
        &mut self,
        flat: bool,
        job: &Sampling,
        distance: &mut [f32],
        skeleton: Option<&mut [u16]>,
    ) {
        self.derived_vectors::<false>(flat, job, distance, skeleton);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512dq")]
    unsafe fn derived_avx512(
        &mut self,
        flat: bool,
        job: &Sampling,
        distance: &mut [f32],
        skeleton: Option<&mut [u16]>,
    ) {
        self.derived_vectors::<true>(flat, job, distance, skeleton);
    }

    /// [`TransformedReader::read`] for in-plane maps without deformation: every patch plane
    /// has the same (y, x) coordinates (the z terms of those axes are zero), so the cells of
    /// one plane's rows within a box plane are computed once for all planes. Patches of
    /// [`COLUMN_PLANES`] planes or more in the box go through its columns ([`columns`]),
    /// reading only the rows' parts their cells need (a rotated patch's footprint is down to
    /// half its box); fewer plane by plane, each reading one box plane (which stays in
    /// cache). The same values as the portable path.
    ///
    /// # Safety
    /// The CPU must have AVX2; the box must be under 2^31 voxels.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn in_plane_avx2(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        job: &Sampling,
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) -> Result<()> {
        self.in_plane(src, box_start, job, image, label)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512dq")]
    unsafe fn in_plane_avx512(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        job: &Sampling,
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) -> Result<()> {
        self.in_plane(src, box_start, job, image, label)
    }

    /// An in-plane map's cells of box plane 0 for the first patch plane's rows (z coordinate
    /// 0, inside: boxes have at least 2 planes) into `plane_rows` and `plane_frac`, each box
    /// row's x range they read (from the patch plane's corners) into `spans`, and the patch
    /// planes inside the box's range into `column_planes` (one run of them, in the order their
    /// box planes run: the columns' lanes); returns the first of those box planes.
    ///
    /// # Safety
    /// The CPU must have AVX2 (inlined into callers compiled for it); the box must be under
    /// 2^31 voxels.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn plane_cells(
        &mut self,
        t: &Transform,
        local_centre: [f64; 3],
        size: [usize; 3],
        bs: [usize; 3],
    ) -> usize {
        self.plane_rows.clear();
        self.plane_frac.clear();
        let corner = |y: usize, x: usize| {
            let c = t.row8(local_centre, size, (0, y), x);
            [c[1][0], c[2][0]]
        };
        let (ye, xe) = (size[1] - 1, size[2] - 1);
        let corners = [corner(0, 0), corner(0, xe), corner(ye, xe), corner(ye, 0)];
        footprint_spans(corners, bs, &mut self.spans);
        for y in 0..size[1] {
            for tx in (0..size[2]).step_by(TILE[2]) {
                let mut coords = t.row8(local_centre, size, (0, y), tx);
                coords[0] = [0.0; 8];
                let cells = gather::cells8(&coords, bs);
                self.plane_rows.push(gather::PlaneRow::new(&cells));
                self.plane_frac.push([cells.frac[1], cells.frac[2]]);
            }
        }
        // Each patch plane's box plane is whole; those inside the box's range run along
        // consecutive box planes (z maps to itself or its mirror), the others read 0.
        self.column_planes.clear();
        let mut lo = usize::MAX;
        for z in 0..size[0] {
            let cz = t.row8(local_centre, size, (z, 0), 0)[0][0];
            if cz >= 0.0 && cz < (bs[0] - 1) as f64 {
                lo = lo.min(cz as usize);
                self.column_planes.push(z);
            }
        }
        if t.matrix[0][0] < 0.0 {
            self.column_planes.reverse();
        }
        lo
    }

    /// The part of the box (start, sides) that holds the box planes of `column_planes` (from
    /// `lo`, as [`TransformedReader::plane_cells`] gives it), and their first plane in it (0).
    /// An in-plane map's cells lie in those planes; its upper z neighbours weigh 0 and are
    /// not read by the columns.
    #[cfg(target_arch = "x86_64")]
    fn column_box(
        &self,
        box_start: [i64; 3],
        bs: [usize; 3],
        lo: usize,
    ) -> ([i64; 3], [usize; 3], usize) {
        let k = self.column_planes.len();
        debug_assert!(lo + k <= bs[0]);
        (
            [box_start[0] + lo as i64, box_start[1], box_start[2]],
            [k, bs[1], bs[2]],
            0,
        )
    }

    /// Zeros in the patch planes outside the run of `column_planes` (every channel of
    /// `image`, and `label`).
    #[cfg(target_arch = "x86_64")]
    fn zero_planes_outside(
        &self,
        size: [usize; 3],
        channels: usize,
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) {
        let n: usize = size.iter().product();
        let plane = size[1] * size[2];
        let (a, b) = (
            self.column_planes[0],
            self.column_planes[self.column_planes.len() - 1],
        );
        let inside = a.min(b)..=a.max(b);
        let mut label = label;
        for z in (0..size[0]).filter(|z| !inside.contains(z)) {
            for ch in 0..channels {
                image[ch * n + z * plane..][..plane].fill(0.0);
            }
            if let Some(l) = label.as_deref_mut() {
                l[z * plane..][..plane].fill(0);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn in_plane(
        &mut self,
        src: &dyn PatchSource,
        box_start: [i64; 3],
        job: &Sampling,
        image: &mut [f32],
        mut label: Option<&mut [u16]>,
    ) -> Result<()> {
        let Sampling {
            t,
            local_centre,
            size,
            bs,
            channels,
        } = *job;
        let n: usize = size.iter().product();
        let bn: usize = bs.iter().product();
        let (sy, sz) = (bs[2], bs[1] * bs[2]);
        let plane = size[1] * size[2];
        let lo = self.plane_cells(t, local_centre, size, bs);
        if self.column_planes.len() >= COLUMN_PLANES {
            self.zero_planes_outside(size, channels, image, label.as_deref_mut());
            // Scalings: the image by two passes over whole box rows ([`separable`]: the same
            // lerps, so the same bits), which stream where turning the box into columns and
            // the columns' lerps wait on the cache (scaled 16x128x128 patches +7%); the label
            // still through the columns, whose outcome tables weigh a mixed column once for
            // every plane.
            let separable_image = t.axis_aligned();
            // Rotations read only the box planes their patch planes lie in (the columns'),
            // not the plane below and the two above that the box holds for maps that mix
            // planes: 16 of 19 for a 16-plane patch.
            let (box_start, bs, lo) = if separable_image {
                (box_start, bs, lo)
            } else {
                self.column_box(box_start, bs, lo)
            };
            self.read_box_spans(src, box_start, bs, channels, label.is_some())?;
            if separable_image {
                self.separable
                    .prepare(t.axis_coordinates(local_centre, size), bs);
                separable::sample_in(
                    self.simd(),
                    &mut self.separable,
                    true,
                    &self.image_box,
                    bs,
                    channels,
                    size,
                    image,
                    None,
                );
                if label.is_none() {
                    return Ok(());
                }
            }
            let job = columns::Job {
                rows: &self.plane_rows,
                frac: &self.plane_frac,
                lo,
                planes: &self.column_planes,
                spans: &self.spans,
                w512: self.simd() == Simd::Avx512,
                size,
                bs,
                channels: if separable_image { 0 } else { channels },
            };
            // SAFETY: AVX2 is enabled here; the rows' cells are of box plane 0, inside lanes
            // at most one voxel before the plane's y and x ends, and within the spans read;
            // the planes from `lo` are box planes below its last.
            self.columns.sample(
                &job,
                &self.image_box,
                image,
                label.map(|l| (self.labels.planes(), l)),
            );
            return Ok(());
        }
        src.read_image(box_start, bs, first_n(&mut self.image_box, channels * bn))?;
        if label.is_some() {
            self.labels.read(src, box_start, bs)?;
            self.labels.prepare::<true>(bs);
        }
        for z in 0..size[0] {
            // The plane's z coordinate, whole (in-plane maps), and its box plane.
            let cz = t.row8(local_centre, size, (z, 0), 0)[0][0];
            if !(cz >= 0.0 && cz < (bs[0] - 1) as f64) {
                for ch in 0..channels {
                    image[ch * n + z * plane..][..plane].fill(0.0);
                }
                if let Some(l) = label.as_deref_mut() {
                    l[z * plane..][..plane].fill(0);
                }
                continue;
            }
            let plane_at = (cz as usize * sz) as i32;
            let mut k = 0;
            for y in 0..size[1] {
                for tx in (0..size[2]).step_by(TILE[2]) {
                    let row = &self.plane_rows[k];
                    k += 1;
                    let base = row.base.map(|b| b + plane_at);
                    let w = (tx + TILE[2]).min(size[2]) - tx;
                    let at = z * plane + y * size[2] + tx;
                    let (out, out_n, out_at) = if w == TILE[2] {
                        (&mut *image, n, at)
                    } else {
                        self.short_row.resize(channels * TILE[2], 0.0);
                        (&mut self.short_row[..], TILE[2], 0)
                    };
                    // SAFETY: AVX2 is enabled here; the box is under 2^31 voxels (checked by
                    // the caller), each base is a cell of this box plane or its first voxel.
                    gather::lerp8_at::<true>(
                        &base,
                        row.inside,
                        [std::arch::x86_64::_mm256_setzero_ps(), row.fy, row.fx],
                        bs,
                        &self.image_box,
                        bn,
                        channels,
                        out,
                        out_n,
                        out_at,
                    );
                    if w < TILE[2] {
                        for ch in 0..channels {
                            image[ch * n + at..][..w]
                                .copy_from_slice(&self.short_row[ch * TILE[2]..][..w]);
                        }
                    }
                    if let Some(l) = label.as_deref_mut() {
                        let (vals, mixed) = self.labels.uniform_row8(&base, row.inside);
                        put_row(l, at, &vals, w);
                        // (Lanes past a short row's end are dropped.)
                        let mixed = mixed & ((1u32 << w) - 1);
                        if mixed != 0 {
                            self.deferred.push((k - 1, at, mixed));
                        }
                    }
                }
            }
            // The plane's mixed label lanes, after its table lookups (see `uniform_row8`).
            if let Some(l) = label.as_deref_mut() {
                for &(k, at, mut mixed) in &self.deferred {
                    let (row, frac) = (&self.plane_rows[k], &self.plane_frac[k]);
                    while mixed != 0 {
                        let j = mixed.trailing_zeros() as usize;
                        mixed &= mixed - 1;
                        let base = (row.base[j] + plane_at) as usize;
                        let f = [0.0, frac[0][j], frac[1][j]];
                        l[at + j] = self.labels.weighed_at::<true>(base, sy, sz, f);
                    }
                }
                self.deferred.clear();
            }
        }
        Ok(())
    }

    /// [`TransformedReader::sample`] in vectors: the same tiles, each row of 8 voxels
    /// interpolated 8 lanes wide ([`gather::row8`]; a shorter row through a buffer); the
    /// label's majority per voxel as there, or with `NEAREST` the skeleton box's nearest voxel
    /// ([`TransformedReader::read_derived`]). The same values as the portable path. Inlined
    /// into its callers, each compiled for AVX2 or AVX-512.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn sample_rows<const FLAT_Z: bool, const NEAREST: bool, const W512: bool>(
        &mut self,
        job: &Sampling,
        image: &mut [f32],
        mut label: Option<&mut [u16]>,
    ) {
        let Sampling {
            t,
            local_centre,
            size,
            bs,
            channels,
        } = *job;
        let n: usize = size.iter().product();
        let bn: usize = bs.iter().product();
        let (sy, sz) = (bs[2], bs[1] * bs[2]);
        if label.is_some() && !NEAREST {
            self.labels.prepare::<FLAT_Z>(bs);
        }
        self.row.resize(TILE[2], [0.0; 3]);
        for tz in (0..size[0]).step_by(TILE[0]) {
            for ty in (0..size[1]).step_by(TILE[1]) {
                for tx in (0..size[2]).step_by(TILE[2]) {
                    let w = (tx + TILE[2]).min(size[2]) - tx;
                    for z in tz..(tz + TILE[0]).min(size[0]) {
                        for y in ty..(ty + TILE[1]).min(size[1]) {
                            let at = (z * size[1] + y) * size[2] + tx;
                            // Lanes past a short row's end hold coordinates past the patch:
                            // computed, then dropped (into `short_row`, copied out for the
                            // first `w`).
                            let coords = match &t.elastic {
                                None => t.row8(local_centre, size, (z, y), tx),
                                Some(_) => {
                                    t.row(
                                        local_centre,
                                        size,
                                        (z, y),
                                        tx,
                                        &mut self.row[..w],
                                        &mut self.scratch,
                                    );
                                    std::array::from_fn(|a| std::array::from_fn(|k| self.row[k][a]))
                                }
                            };
                            let (out, out_n, out_at) = if w == TILE[2] {
                                (&mut *image, n, at)
                            } else {
                                self.short_row.resize(channels * TILE[2], 0.0);
                                (&mut self.short_row[..], TILE[2], 0)
                            };
                            // SAFETY: AVX2 is enabled here; the box is under 2^31 voxels
                            // (checked by the caller) and the buffers are the job's.
                            let cells = gather::row8::<FLAT_Z, W512>(
                                &coords,
                                bs,
                                &self.image_box,
                                bn,
                                channels,
                                out,
                                out_n,
                                out_at,
                            );
                            if w < TILE[2] {
                                for ch in 0..channels {
                                    image[ch * n + at..][..w]
                                        .copy_from_slice(&self.short_row[ch * TILE[2]..][..w]);
                                }
                            }
                            if let Some(l) = label.as_deref_mut() {
                                if NEAREST {
                                    for k in 0..w {
                                        l[at + k] = if cells.inside & (1 << k) == 0 {
                                            0
                                        } else {
                                            let near =
                                                |a: usize| usize::from(cells.frac[a][k] >= 0.5);
                                            self.skeleton_box[cells.base[k] as usize
                                                + near(0) * sz
                                                + near(1) * sy
                                                + near(2)]
                                        };
                                    }
                                } else {
                                    let (vals, mixed) =
                                        self.labels.uniform_row8(&cells.base, cells.inside);
                                    put_row(l, at, &vals, w);
                                    // (Lanes past a short row's end are dropped.)
                                    let mixed = mixed & ((1u32 << w) - 1);
                                    if mixed != 0 {
                                        // Their neighbours fetched while the tile goes on:
                                        // weighed after it, they were a third of a 3D
                                        // rotation's time waiting on memory.
                                        self.labels.prefetch_cells(&cells.base, mixed, sy, sz);
                                        let mut m = mixed;
                                        while m != 0 {
                                            let j = m.trailing_zeros() as usize;
                                            m &= m - 1;
                                            self.deferred_cells.push((
                                                at + j,
                                                cells.base[j] as usize,
                                                [0, 1, 2].map(|a| cells.frac[a][j]),
                                            ));
                                        }
                                    }
                                }
                            }
                        }
                    }
                    // The tile's mixed label lanes, after its table lookups (see
                    // `uniform_row8`).
                    if let Some(l) = label.as_deref_mut() {
                        for &(at, base, f) in &self.deferred_cells {
                            l[at] = self.labels.weighed_at::<FLAT_Z>(base, sy, sz, f);
                        }
                        self.deferred_cells.clear();
                    }
                }
            }
        }
    }

    /// The interpolation loop of [`TransformedReader::read`] over the box already read.
    #[inline(always)]
    fn sample<const FLAT_Z: bool>(
        &mut self,
        job: &Sampling,
        image: &mut [f32],
        mut label: Option<&mut [u16]>,
    ) {
        let Sampling {
            t,
            local_centre,
            size,
            bs,
            channels,
        } = *job;
        let n: usize = size.iter().product();
        let bn: usize = bs.iter().product();
        let (sy, sz) = (bs[2], bs[1] * bs[2]);
        if label.is_some() {
            self.labels.prepare::<FLAT_Z>(bs);
        }
        // Output tiles, so that the source voxels one tile reads are few and stay in cache
        // (the box of a rotated patch is many times the patch and far larger than the cache).
        // Per tile, first every voxel's cell and fractions, then each array in a loop of
        // loads and lerps alone (measured as fast as one loop doing both; it keeps each
        // array's loop short).
        for tz in (0..size[0]).step_by(TILE[0]) {
            for ty in (0..size[1]).step_by(TILE[1]) {
                for tx in (0..size[2]).step_by(TILE[2]) {
                    let x_end = (tx + TILE[2]).min(size[2]);
                    self.row.resize(x_end - tx, [0.0; 3]);
                    self.cells.clear();
                    for z in tz..(tz + TILE[0]).min(size[0]) {
                        for y in ty..(ty + TILE[1]).min(size[1]) {
                            t.row(
                                local_centre,
                                size,
                                (z, y),
                                tx,
                                &mut self.row,
                                &mut self.scratch,
                            );
                            let at = (z * size[1] + y) * size[2] + tx;
                            // The label right away (its rare mixed case wants the fractions
                            // in f64); the image's cells kept for the loops below.
                            match label.as_deref_mut() {
                                Some(l) => {
                                    for (x, c) in self.row.iter().enumerate() {
                                        let Some((base, f)) = cell(c, bs) else {
                                            l[at + x] = 0;
                                            self.cells.push(Cell::outside(at + x));
                                            continue;
                                        };
                                        l[at + x] = self.labels.at::<FLAT_Z>(base, sy, sz, f);
                                        self.cells.push(Cell::new(at + x, base, f));
                                    }
                                }
                                None => {
                                    for (x, c) in self.row.iter().enumerate() {
                                        self.cells.push(match cell(c, bs) {
                                            Some((base, f)) => Cell::new(at + x, base, f),
                                            None => Cell::outside(at + x),
                                        });
                                    }
                                }
                            }
                        }
                    }
                    for ch in 0..channels {
                        let b = &self.image_box[ch * bn..(ch + 1) * bn];
                        let out = &mut image[ch * n..(ch + 1) * n];
                        for c in &self.cells {
                            out[c.at as usize] = if c.base == Cell::OUTSIDE {
                                0.0
                            } else {
                                trilinear::<FLAT_Z>(b, c.base as usize, sy, sz, c.f)
                            };
                        }
                    }
                }
            }
        }
    }
}

/// The first `w` of a row of 8 labels into `l` at `at`: a full row as one fixed-size move
/// (a copy of variable length is a call to `memcpy`, a fortieth of a rotated patch's time).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn put_row(l: &mut [u16], at: usize, vals: &[u16; 8], w: usize) {
    if w == 8 {
        l[at..at + 8].copy_from_slice(vals);
    } else {
        l[at..at + w].copy_from_slice(&vals[..w]);
    }
}

/// One output voxel of a tile: where it goes, its cell in the box, its fractions.
#[derive(Clone, Copy)]
struct Cell {
    at: u32,
    base: u32,
    f: [f32; 3],
}

impl Cell {
    /// `base` of a voxel whose coordinate lies more than a voxel outside the volume: it
    /// reads 0. Box indices stay below it ([`needed_box`] refuses larger boxes).
    const OUTSIDE: u32 = u32::MAX;

    #[inline(always)]
    fn outside(at: usize) -> Self {
        Cell {
            at: at as u32,
            base: Self::OUTSIDE,
            f: [0.0; 3],
        }
    }

    #[inline(always)]
    fn new(at: usize, base: usize, f: [f64; 3]) -> Self {
        Cell {
            at: at as u32,
            base: base as u32,
            f: [f[0] as f32, f[1] as f32, f[2] as f32],
        }
    }
}

/// What [`TransformedReader::sample`] interpolates: the map, the centre in box coordinates,
/// the patch and box sizes, the image's channels.
#[derive(Clone, Copy)]
struct Sampling<'a> {
    t: &'a Transform,
    local_centre: [f64; 3],
    size: [usize; 3],
    bs: [usize; 3],
    channels: usize,
}

impl TransformedReader {
    /// The label-derived arrays of the same patch through the same map: the signed distance of
    /// each of `classes` into `distance` (one patch after the other; linear, divided by the
    /// map's scale since the patch shows the source shrunk by it; 0 outside the volume) and the
    /// skeleton into `skeleton` (nearest voxel: a skeleton voxel is never blended).
    #[allow(clippy::too_many_arguments)]
    pub fn read_derived(
        &mut self,
        src: &dyn PatchSource,
        start_zyx: [i64; 3],
        size: [usize; 3],
        t: &Transform,
        classes: &[u16],
        distance: &mut [f32],
        skeleton: Option<&mut [u16]>,
    ) -> Result<()> {
        let n: usize = size.iter().product();
        if t.is_identity() {
            for (&c, out) in classes.iter().zip(distance.chunks_exact_mut(n)) {
                src.read_distance(c, start_zyx, size, out)?;
            }
            if let Some(s) = skeleton {
                src.read_skeleton(start_zyx, size, s)?;
            }
            return Ok(());
        }
        let Some((box_start, bs)) = needed_box(t, start_zyx, size, src.shape_zyx())? else {
            distance.fill(0.0);
            if let Some(s) = skeleton {
                s.fill(0);
            }
            return Ok(());
        };
        let bn: usize = bs.iter().product();
        let mut skeleton = skeleton;
        let inv_scale = 1.0 / t.scale;
        let centre = centre_of(start_zyx, size);
        let local_centre = [0, 1, 2].map(|a| centre[a] - box_start[a] as f64);
        #[cfg(target_arch = "x86_64")]
        {
            let simd = self.simd();
            if simd > Simd::Portable && bn < i32::MAX as usize {
                let job = Sampling {
                    t,
                    local_centre,
                    size,
                    bs,
                    channels: classes.len(),
                };
                let flat = t.keeps_z_planes();
                // In-plane maps of many planes through the box's columns, as the image: the
                // distance maps' lerps and the skeleton's nearest voxel once per patch column
                // for every plane (16x128x128 patches rotated and scaled, read with a distance
                // map and the skeleton: +43%).
                if flat
                    && t.elastic.is_none()
                    && (!t.axis_aligned() || size[0] >= 2 * COLUMN_PLANES)
                {
                    // SAFETY: as below.
                    let done = unsafe {
                        let sk = skeleton.as_deref_mut();
                        if simd == Simd::Avx512 {
                            self.derived_in_plane_avx512(
                                src, box_start, &job, classes, distance, sk,
                            )
                        } else {
                            self.derived_in_plane_avx2(src, box_start, &job, classes, distance, sk)
                        }
                    }?;
                    if done {
                        for v in distance.iter_mut() {
                            *v = (*v as f64 * inv_scale) as f32;
                        }
                        return Ok(());
                    }
                }
                let spans = self.rotation_spans(t, local_centre, size, bs);
                self.read_derived_boxes(src, box_start, bs, classes, skeleton.is_some(), spans)?;
                // SAFETY: the CPU has the build's features (`simd` checked them) and the box is
                // under 2^31 voxels.
                unsafe {
                    if simd == Simd::Avx512 {
                        self.derived_avx512(flat, &job, distance, skeleton);
                    } else {
                        self.derived_avx2(flat, &job, distance, skeleton);
                    }
                }
                // The same product and rounding as the loop below, after the interpolation.
                for v in distance.iter_mut() {
                    *v = (*v as f64 * inv_scale) as f32;
                }
                return Ok(());
            }
        }
        let spans = self.rotation_spans(t, local_centre, size, bs);
        self.read_derived_boxes(src, box_start, bs, classes, skeleton.is_some(), spans)?;
        let (sy, sz) = (bs[2], bs[1] * bs[2]);
        self.row.resize(size[2], [0.0; 3]);
        for z in 0..size[0] {
            for y in 0..size[1] {
                t.row(
                    local_centre,
                    size,
                    (z, y),
                    0,
                    &mut self.row,
                    &mut self.scratch,
                );
                let at = (z * size[1] + y) * size[2];
                for (x, c) in self.row.iter().enumerate() {
                    let Some((base, f)) = cell(c, bs) else {
                        for k in 0..classes.len() {
                            distance[k * n + at + x] = 0.0;
                        }
                        if let Some(s) = skeleton.as_deref_mut() {
                            s[at + x] = 0;
                        }
                        continue;
                    };
                    for k in 0..classes.len() {
                        let b = &self.image_box[k * bn..(k + 1) * bn];
                        distance[k * n + at + x] =
                            (trilinear::<false>(b, base, sy, sz, f.map(|v| v as f32)) as f64
                                * inv_scale) as f32;
                    }
                    if let Some(s) = skeleton.as_deref_mut() {
                        let near = [0, 1, 2].map(|a| usize::from(f[a] >= 0.5));
                        s[at + x] = self.skeleton_box[base + near[0] * sz + near[1] * sy + near[2]];
                    }
                }
            }
        }
        Ok(())
    }
}

/// The x range (start, end) of each row of a box of sides `bs` that an in-plane map's cells
/// read, into `spans`: a cell at (y, x) reads x and x + 1 of rows y and y + 1, so row Y
/// serves the coordinates with y in [Y - 1, Y + 1), whose x range is that of the patch
/// plane's parallelogram (`corners`, (y, x) in box coordinates, in order around it) within
/// that band. Widened by a voxel each way against rounding (the cells' coordinates are
/// computed by another sum), cut to the box; (0, 0) for rows no cell reads.
#[cfg(target_arch = "x86_64")]
fn footprint_spans(corners: [[f64; 2]; 4], bs: [usize; 3], spans: &mut Vec<(u32, u32)>) {
    spans.clear();
    spans.extend((0..bs[1]).map(|row| {
        let (lo, hi) = (row as f64 - 1.0 - 1e-6, row as f64 + 1.0 + 1e-6);
        let (mut x_min, mut x_max) = (f64::INFINITY, f64::NEG_INFINITY);
        let mut take = |x: f64| {
            x_min = x_min.min(x);
            x_max = x_max.max(x);
        };
        for (k, u) in corners.iter().enumerate() {
            if (lo..=hi).contains(&u[0]) {
                take(u[1]);
            }
            // Where the edge to the next corner crosses the band's lines.
            let v = corners[(k + 1) % 4];
            for line in [lo, hi] {
                if (u[0] - line) * (v[0] - line) < 0.0 {
                    take(u[1] + (line - u[0]) * (v[1] - u[1]) / (v[0] - u[0]));
                }
            }
        }
        if x_min > x_max {
            return (0, 0);
        }
        let a = (x_min.floor() - 1.0).clamp(0.0, bs[2] as f64) as u32;
        let b = (x_max.floor() + 3.0).clamp(0.0, bs[2] as f64) as u32;
        if a < b {
            (a, b)
        } else {
            (0, 0)
        }
    }));
}

/// The x range (start, end) of each row (z, y) of a box of sides `bs` that the cells of an
/// affine map read, into `spans` (row (z, y) at `z * bs[1] + y`; (0, 0) for rows no cell
/// reads): a cell reads the voxels less than one voxel from its coordinate along each axis,
/// so box voxel v is read only if v lies in the patch's parallelepiped widened by the cube
/// [-1, 1]^3, that is if `M^-1 (v - centre)` lies in the patch's extent widened by the image
/// of that cube (per axis, the sum of the magnitudes of a row of `M^-1`; a thousandth more
/// against rounding). Along a row that is an interval of x per axis. The patch's x extent
/// runs to the end of its last row of 8 (the vector loops compute those lanes too). Returns
/// `false` (and leaves `spans` empty) for a map it cannot invert.
fn footprint_spans_3d(
    t: &Transform,
    centre: [f64; 3],
    size: [usize; 3],
    bs: [usize; 3],
    spans: &mut Vec<(u32, u32)>,
) -> bool {
    spans.clear();
    let Some(inv) = inverse(&t.matrix) else {
        return false;
    };
    let half = size.map(|n| (n as f64 - 1.0) / 2.0);
    let x_end = (size[2].div_ceil(8) * 8) as f64 - 1.0 - half[2];
    let reach: [f64; 3] =
        std::array::from_fn(|a| inv[a].iter().map(|v| v.abs()).sum::<f64>() * 1.001);
    let lo: [f64; 3] = std::array::from_fn(|a| -half[a] - reach[a]);
    let hi = [half[0] + reach[0], half[1] + reach[1], x_end + reach[2]];
    let last_x = bs[2] as f64 - 1.0;
    spans.reserve(bs[0] * bs[1]);
    for z in 0..bs[0] {
        // Along row (z, y), axis a's patch offset is `d + y * inv[a][1] + x * inv[a][2]`;
        // where it moves with x, its bounds are an x interval whose ends are linear in y
        // (`ends[a]`: start and slope of the lower end, then of the upper); where it does
        // not, a range of rows (`rows`).
        let mut ends = [[0.0f64; 4]; 3];
        let (mut y_lo, mut y_hi) = (0.0f64, bs[1] as f64 - 1.0);
        for a in 0..3 {
            let d =
                inv[a][0] * (z as f64 - centre[0]) - inv[a][1] * centre[1] - inv[a][2] * centre[2];
            let (g, k) = (inv[a][2], inv[a][1]);
            if g.abs() < 1e-12 {
                ends[a] = [f64::NEG_INFINITY, 0.0, f64::INFINITY, 0.0];
                if k.abs() < 1e-12 {
                    if !(lo[a]..=hi[a]).contains(&d) {
                        y_hi = -1.0;
                    }
                } else {
                    let (r0, r1) = ((lo[a] - d) / k, (hi[a] - d) / k);
                    y_lo = y_lo.max(r0.min(r1));
                    y_hi = y_hi.min(r0.max(r1));
                }
                continue;
            }
            let (e0, e1) = ([(lo[a] - d) / g, -k / g], [(hi[a] - d) / g, -k / g]);
            let (l, u) = if g > 0.0 { (e0, e1) } else { (e1, e0) };
            ends[a] = [l[0], l[1], u[0], u[1]];
        }
        // (Compares rather than `max`, `min`, `ceil` and `floor`: those are calls or NaN
        // checks in the portable build, five times the time of the row.)
        spans.extend((0..bs[1]).map(|y| {
            let yf = y as f64;
            let (mut x_lo, mut x_hi) = (0.0f64, last_x);
            for e in &ends {
                let (l, u) = (e[0] + yf * e[1], e[2] + yf * e[3]);
                x_lo = if l > x_lo { l } else { x_lo };
                x_hi = if u < x_hi { u } else { x_hi };
            }
            if x_lo <= x_hi && y_lo <= yf && yf <= y_hi {
                // Both within 0..bs[2] here: truncation is the floor.
                let a = x_lo as u32;
                (a + u32::from((a as f64) < x_lo), x_hi as u32 + 1)
            } else {
                (0, 0)
            }
        }));
    }
    true
}

/// The inverse of a 3x3 matrix, `None` when it is (nearly) singular.
fn inverse(m: &[[f64; 3]; 3]) -> Option<[[f64; 3]; 3]> {
    let cof = |r: usize, c: usize| {
        let (r1, r2) = ((r + 1) % 3, (r + 2) % 3);
        let (c1, c2) = ((c + 1) % 3, (c + 2) % 3);
        m[r1][c1] * m[r2][c2] - m[r1][c2] * m[r2][c1]
    };
    let det = m[0][0] * cof(0, 0) + m[0][1] * cof(0, 1) + m[0][2] * cof(0, 2);
    // (NaN entries fail the test too.)
    if det.is_nan() || det.abs() <= 1e-9 {
        return None;
    }
    // The inverse is the transposed cofactor matrix over the determinant.
    Some(std::array::from_fn(|r| {
        std::array::from_fn(|c| cof(c, r) / det)
    }))
}

/// The box voxel below a source coordinate (its flat index in a box of `bs`) and the
/// fractions past it; `None` when the coordinate lies outside the box's interpolation range
/// (only where [`needed_box`] cut the box at one plane beyond the volume: everything there
/// reads 0). Written out per axis (no closures over arrays) so that it inlines into the
/// per-voxel loop.
#[inline(always)]
fn cell(c: &[f64; 3], bs: [usize; 3]) -> Option<(usize, [f64; 3])> {
    let inside = |a: usize| c[a] >= 0.0 && c[a] < (bs[a] - 1) as f64;
    if !(inside(0) && inside(1) && inside(2)) {
        return None;
    }
    // Truncation is the floor of these non-negative values. Unchecked: `as` saturates and
    // maps NaN to 0, a compare and two selects a value in the loop, none of which can happen
    // to a coordinate in 0..side with box sides far below 2^31.
    // SAFETY: each value is finite and in [0, bs - 1) (tested above), so it fits an i32.
    let (iz, iy, ix) = unsafe {
        (
            c[0].to_int_unchecked::<i32>() as usize,
            c[1].to_int_unchecked::<i32>() as usize,
            c[2].to_int_unchecked::<i32>() as usize,
        )
    };
    Some((
        (iz * bs[1] + iy) * bs[2] + ix,
        [c[0] - iz as f64, c[1] - iy as f64, c[2] - ix as f64],
    ))
}

/// The box of source voxels a transformed patch needs: [`Transform::source_box`] cut at one
/// voxel beyond the volume on each side (past it every neighbour reads 0, which [`cell`]
/// answers without a box), so the box, its memory and its zero-filling never exceed the
/// volume plus a border whatever the rotation and scale. `None`: nothing of the volume is
/// within reach. An error for a box too large to index (2^32 voxels or more).
fn needed_box(
    t: &Transform,
    start_zyx: [i64; 3],
    size: [usize; 3],
    shape: [usize; 3],
) -> Result<Option<([i64; 3], [usize; 3])>> {
    let (start, bs) = t.source_box(start_zyx, size);
    let mut out = ([0i64; 3], [0usize; 3]);
    for a in 0..3 {
        let lo = start[a].max(-1);
        let hi = (start[a] + bs[a] as i64 - 1).min(shape[a] as i64);
        // Fewer than 2 planes: only planes outside the volume are in reach.
        if hi - lo + 1 < 2 {
            return Ok(None);
        }
        out.0[a] = lo;
        out.1[a] = (hi - lo + 1) as usize;
    }
    let voxels = out
        .1
        .iter()
        .try_fold(1u64, |acc, &n| acc.checked_mul(n as u64));
    if voxels.is_none_or(|v| v >= Cell::OUTSIDE as u64) {
        return Err(Error::Config(format!(
            "a {}x{}x{} patch under this rotation and scale needs a source box of {}x{}x{} voxels, more than the sampler can index",
            size[0], size[1], size[2], out.1[0], out.1[1], out.1[2]
        )));
    }
    Ok(Some(out))
}

/// Rotated in-plane patches of at least this many planes take the box as columns of planes
/// ([`columns`]): from 4 planes faster than plane by plane (9% for 4, 46% for 8, 48% for 16
/// planes of 128x128), slower below (25% for 2). Scaled ones from twice as many.
#[cfg(target_arch = "x86_64")]
const COLUMN_PLANES: usize = 4;

/// Output tile (z, y, x) of the interpolation loop.
const TILE: [usize; 3] = [8, 8, 8];
// A tile row is one 8-lane vector in the AVX2 path.
const _: () = assert!(TILE[2] == 8);

/// Linear interpolation between the 8 voxels from `base` (x, then y, then z), in f32: the
/// values are f32 and the fractions' rounding (under 1e-7) is far below the tests' 1e-5.
/// `FLAT_Z`: the z fraction is 0, only the lower plane's 4 voxels are read.
#[inline(always)]
fn trilinear<const FLAT_Z: bool>(b: &[f32], base: usize, sy: usize, sz: usize, f: [f32; 3]) -> f32 {
    let lerp = |a: f32, b: f32, t: f32| a + (b - a) * t;
    let [fz, fy, fx] = f;
    if FLAT_Z {
        let b = &b[base..=base + sy + 1];
        return lerp(lerp(b[0], b[1], fx), lerp(b[sy], b[sy + 1], fx), fy);
    }
    // One bounds check for the farthest voxel; the other seven lie before it.
    let b = &b[base..=base + sz + sy + 1];
    let z0 = lerp(lerp(b[0], b[1], fx), lerp(b[sy], b[sy + 1], fx), fy);
    let z1 = lerp(
        lerp(b[sz], b[sz + 1], fx),
        lerp(b[sz + sy], b[sz + sy + 1], fx),
        fy,
    );
    lerp(z0, z1, fz)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A volume in memory as a patch source (image linear in each axis, label by thresholds).
    struct Volume {
        shape: [usize; 3],
        image: Vec<f32>,
        label: Vec<u16>,
    }

    impl Volume {
        fn new(shape: [usize; 3]) -> Self {
            let n: usize = shape.iter().product();
            let mut image = Vec::with_capacity(n);
            let mut label = Vec::with_capacity(n);
            for i in 0..n {
                let (z, y, x) = (
                    i / (shape[1] * shape[2]),
                    (i / shape[2]) % shape[1],
                    i % shape[2],
                );
                image.push(((z * 31 + y * 7 + x * 3) % 17) as f32 - 8.0 + 0.25 * x as f32);
                label.push(((x / 3 + y / 4 + z / 2) % 3) as u16);
            }
            Volume {
                shape,
                image,
                label,
            }
        }

        fn get<T: Copy + Default>(&self, v: &[T], p: [i64; 3]) -> T {
            if (0..3).any(|a| p[a] < 0 || p[a] >= self.shape[a] as i64) {
                return T::default();
            }
            v[((p[0] as usize) * self.shape[1] + p[1] as usize) * self.shape[2] + p[2] as usize]
        }
    }

    impl PatchSource for Volume {
        fn name(&self) -> String {
            "volume".into()
        }
        fn shape_zyx(&self) -> [usize; 3] {
            self.shape
        }
        fn has_label(&self) -> bool {
            true
        }
        fn classes(&self) -> Vec<u16> {
            vec![1, 2]
        }
        fn fg_coords(&self, _: u16) -> Result<Vec<[u32; 3]>> {
            Ok(vec![])
        }
        fn read_image(&self, s: [i64; 3], size: [usize; 3], out: &mut [f32]) -> Result<()> {
            self.fill(&self.image, s, size, out);
            Ok(())
        }
        fn read_label(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
            self.fill(&self.label, s, size, out);
            Ok(())
        }
        fn has_distance(&self) -> bool {
            true
        }
        fn has_skeleton(&self) -> bool {
            true
        }
        fn read_distance(
            &self,
            class: u16,
            s: [i64; 3],
            size: [usize; 3],
            out: &mut [f32],
        ) -> Result<()> {
            self.fill(&self.distance(class), s, size, out);
            Ok(())
        }
        fn read_skeleton(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
            self.fill(&self.skeleton(), s, size, out);
            Ok(())
        }
    }

    impl Volume {
        /// A stand-in for the signed distance of `class` (any field serves to test the
        /// interpolation): the image scaled per class.
        fn distance(&self, class: u16) -> Vec<f32> {
            self.image.iter().map(|v| v * class as f32 - 1.0).collect()
        }

        /// A stand-in skeleton: the label on a sparse lattice of voxels, 0 elsewhere.
        fn skeleton(&self) -> Vec<u16> {
            let [_, ny, nx] = self.shape;
            (0..self.label.len())
                .map(|i| {
                    let (z, y, x) = (i / (ny * nx), (i / nx) % ny, i % nx);
                    if (x + 2 * y + 3 * z) % 5 == 0 {
                        self.label[i]
                    } else {
                        0
                    }
                })
                .collect()
        }
    }

    /// The volume stored otherwise: with a second image channel (`3 - image / 2`), or with
    /// its label one byte a voxel (as uint8 labels in a cache).
    struct Stored {
        v: Volume,
        two_channels: bool,
        byte_labels: bool,
    }

    /// The test volume stored as it is, with a second channel, and with byte labels.
    fn stored_three_ways() -> [Stored; 3] {
        [(false, false), (true, false), (false, true)].map(|(two, bytes)| Stored {
            v: Volume::new([14, 30, 28]),
            two_channels: two,
            byte_labels: bytes,
        })
    }

    impl PatchSource for Stored {
        fn name(&self) -> String {
            "stored otherwise".into()
        }
        fn shape_zyx(&self) -> [usize; 3] {
            self.v.shape
        }
        fn has_label(&self) -> bool {
            true
        }
        fn channels(&self) -> usize {
            1 + usize::from(self.two_channels)
        }
        fn classes(&self) -> Vec<u16> {
            vec![1, 2]
        }
        fn fg_coords(&self, _: u16) -> Result<Vec<[u32; 3]>> {
            Ok(vec![])
        }
        fn read_image(&self, s: [i64; 3], size: [usize; 3], out: &mut [f32]) -> Result<()> {
            if !self.two_channels {
                return self.v.read_image(s, size, out);
            }
            let (first, second) = out.split_at_mut(out.len() / 2);
            self.v.fill(&self.v.image, s, size, first);
            let other: Vec<f32> = self.v.image.iter().map(|v| 3.0 - v / 2.0).collect();
            self.v.fill(&other, s, size, second);
            Ok(())
        }
        fn read_label(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
            assert!(!self.byte_labels, "a byte label is read as bytes");
            self.v.read_label(s, size, out)
        }
        fn label_bytes(&self) -> bool {
            self.byte_labels
        }
        fn read_label_u8(&self, s: [i64; 3], size: [usize; 3], out: &mut [u8]) -> Result<()> {
            let bytes: Vec<u8> = self.v.label.iter().map(|&l| l as u8).collect();
            self.v.fill(&bytes, s, size, out);
            Ok(())
        }
        fn has_distance(&self) -> bool {
            true
        }
        fn has_skeleton(&self) -> bool {
            true
        }
        fn read_distance(
            &self,
            class: u16,
            s: [i64; 3],
            size: [usize; 3],
            out: &mut [f32],
        ) -> Result<()> {
            self.v.read_distance(class, s, size, out)
        }
        fn read_skeleton(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
            self.v.read_skeleton(s, size, out)
        }
    }

    impl Volume {
        /// The box `s .. s + size` of `v`, zero outside the volume.
        fn fill<T: Copy + Default>(&self, v: &[T], s: [i64; 3], size: [usize; 3], out: &mut [T]) {
            for (i, o) in out.iter_mut().enumerate() {
                let p = [
                    i / (size[1] * size[2]),
                    (i / size[2]) % size[1],
                    i % size[2],
                ];
                *o = self.get(v, [0, 1, 2].map(|a| s[a] + p[a] as i64));
            }
        }
    }

    /// Whole-volume reference: trilinear over the zero-padded volume at a coordinate.
    fn reference_linear(v: &Volume, c: [f64; 3]) -> f64 {
        reference_linear_in(v, &v.image, c)
    }

    /// [`reference_linear`] over another array of the volume's shape.
    fn reference_linear_in(v: &Volume, a: &[f32], c: [f64; 3]) -> f64 {
        let i0 = c.map(|x| x.floor() as i64);
        let f = [0, 1, 2].map(|a| c[a] - i0[a] as f64);
        let mut s = 0.0;
        for k in 0..8 {
            let up = [(k >> 2) & 1, (k >> 1) & 1, k & 1];
            let w: f64 = (0..3)
                .map(|a| if up[a] == 1 { f[a] } else { 1.0 - f[a] })
                .product();
            let p = [0, 1, 2].map(|a| i0[a] + up[a] as i64);
            s += w * v.get(a, p) as f64;
        }
        s
    }

    #[test]
    fn derived_arrays_follow_the_map_linear_over_the_scale_and_nearest() -> Result<()> {
        // Distance maps: linear at the same coordinates as the image, divided by the scale (the
        // patch shows the source shrunk by it); the skeleton: the nearest voxel's value, never a
        // blend; both 0 more than a voxel outside the volume.
        let v = Volume::new([12, 30, 28]);
        let size = [6, 10, 12];
        let n: usize = size.iter().product();
        let classes = [1u16, 2];
        let fields = classes.map(|c| v.distance(c));
        let skeleton = v.skeleton();
        let mut reader = TransformedReader::default();
        let in_plane = Transform::in_plane(0.9, 1.3);
        for (k, t) in [
            Transform::rotate_scale([0.3, -0.2, 0.5], 1.0),
            Transform::rotate_scale([0.0, 0.0, 1.2], 0.7),
            Transform::rotate_scale([-2.5, 0.4, 0.1], 1.4),
            in_plane,
        ]
        .into_iter()
        .enumerate()
        {
            let scale = t.scale;
            let start = [k as i64 * 3 - 3, 6 + k as i64, 15 - 4 * k as i64];
            let mut d = vec![f32::NAN; 2 * n];
            let mut sk = vec![u16::MAX; n];
            reader.read_derived(&v, start, size, &t, &classes, &mut d, Some(&mut sk))?;
            // Every vector build and the portable loop: the same bits.
            for build in vector_builds().into_iter().chain([Simd::Portable]) {
                let mut other = TransformedReader::with_build(build);
                let (mut d2, mut sk2) = (vec![f32::NAN; 2 * n], vec![u16::MAX; n]);
                other.read_derived(&v, start, size, &t, &classes, &mut d2, Some(&mut sk2))?;
                assert_eq!(
                    d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    d2.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{k} {:?}",
                    other.build
                );
                assert_eq!(sk, sk2, "{k} {:?}", other.build);
            }
            // The skeleton alone (no distance classes), and the distances alone.
            let mut sk3 = vec![u16::MAX; n];
            reader.read_derived(&v, start, size, &t, &[], &mut [], Some(&mut sk3))?;
            assert_eq!(sk3, sk, "{k}, skeleton alone");
            let mut d3 = vec![f32::NAN; 2 * n];
            reader.read_derived(&v, start, size, &t, &classes, &mut d3, None)?;
            assert_eq!(d3, d, "{k}, distances alone");
            let mut on_skeleton = 0;
            for (i, c) in t.coordinates(start, size).iter().enumerate() {
                for (j, field) in fields.iter().enumerate() {
                    let want = reference_linear_in(&v, field, *c) / scale;
                    let got = d[j * n + i] as f64;
                    assert!(
                        (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                        "{k} {i}: {got} {want}"
                    );
                }
                let i0 = c.map(|x| x.floor());
                let near = [0, 1, 2].map(|a| i0[a] as i64 + i64::from(c[a] - i0[a] >= 0.5));
                let far_out = (0..3).any(|a| c[a] < -1.0 || c[a] >= v.shape[a] as f64);
                let want = if far_out { 0 } else { v.get(&skeleton, near) };
                assert_eq!(sk[i], want, "{k} {i} at {c:?}");
                on_skeleton += usize::from(want != 0);
            }
            assert!(on_skeleton > 0, "{k}: the patch meets the skeleton");
        }
        Ok(())
    }

    #[test]
    fn in_plane_derived_arrays_through_the_columns_give_the_portable_bits() -> Result<()> {
        // Distance maps and skeleton of patches of many planes through the box's columns:
        // rotated and scaled, scaled alone, mirrored (z too), reaching outside the volume
        // above, below and beside; rows of 21 and 37 (short last rows of 8). Bit for bit the
        // portable loop's.
        let v = Volume::new([30, 30, 28]);
        let classes = [1u16, 2];
        let in_plane = Transform::in_plane;
        let maps = [
            in_plane(0.9, 1.3),
            in_plane(-2.4, 0.75),
            in_plane(0.0, 1.2),
            in_plane(0.5, 1.0).mirrored([true, false, true]),
            in_plane(0.0, 0.8).mirrored([true, true, false]),
        ];
        let mut portable = TransformedReader::with_build(Simd::Portable);
        for (build, size) in vector_builds()
            .into_iter()
            .flat_map(|b| [(b, [16, 10, 21]), (b, [19, 12, 37])])
        {
            let n: usize = size.iter().product();
            let mut fast = TransformedReader::with_build(build);
            for (k, t) in maps.iter().enumerate() {
                for start in [[5, 8, -4], [-12, 3, 2], [20, 10, -20], [27, 20, 5]] {
                    let (mut d, mut sk) = (vec![f32::NAN; 2 * n], vec![u16::MAX; n]);
                    let (mut d2, mut sk2) = (vec![1.5f32; 2 * n], vec![7u16; n]);
                    fast.read_derived(&v, start, size, t, &classes, &mut d, Some(&mut sk))?;
                    portable.read_derived(&v, start, size, t, &classes, &mut d2, Some(&mut sk2))?;
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&d), bits(&d2), "{build:?} map {k} at {start:?}");
                    assert_eq!(sk, sk2, "{build:?} map {k} at {start:?}");
                    let mut sk3 = vec![u16::MAX; n];
                    fast.read_derived(&v, start, size, t, &[], &mut [], Some(&mut sk3))?;
                    assert_eq!(sk3, sk, "{build:?} map {k}, skeleton alone");
                    // Mirrored in the matrix (as the loader reads them): what mirroring after
                    // gives, bit for bit.
                    for f in 1..8u8 {
                        let flips = [f & 4 != 0, f & 2 != 0, f & 1 != 0];
                        let (mut dm, mut skm) = (vec![f32::NAN; 2 * n], vec![u16::MAX; n]);
                        let tm = t.mirrored(flips);
                        fast.read_derived(&v, start, size, &tm, &classes, &mut dm, Some(&mut skm))?;
                        let mut want = d.clone();
                        want.chunks_exact_mut(n)
                            .for_each(|p| mirror(p, size, flips));
                        let mut want_sk = sk.clone();
                        mirror(&mut want_sk, size, flips);
                        assert_eq!(bits(&dm), bits(&want), "{build:?} map {k} {flips:?}");
                        assert_eq!(skm, want_sk, "{build:?} map {k} {flips:?}");
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn identity_reads_the_plain_box() -> Result<()> {
        let v = Volume::new([9, 20, 22]);
        let size = [4, 8, 10];
        let mut a = vec![0.0; 320];
        let mut la = vec![0u16; 320];
        let mut b = a.clone();
        let mut lb = la.clone();
        let start = [-1, 3, 15];
        v.read_patch(start, size, &mut a, Some(&mut la))?;
        // A transform that is the identity but goes through interpolation.
        let t = Transform {
            matrix: IDENTITY,
            scale: 1.0,
            elastic: Some(ElasticField {
                nodes: [2, 2, 2],
                grid: 16.0,
                disp: vec![[0.0; 3]; 8],
            }),
        };
        TransformedReader::default().read(&v, start, size, &t, &mut b, Some(&mut lb))?;
        assert_eq!(a, b);
        assert_eq!(la, lb);
        Ok(())
    }

    #[test]
    fn rotated_scaled_patches_equal_a_whole_volume_reference() -> Result<()> {
        let v = Volume::new([12, 30, 28]);
        let size = [6, 10, 12];
        let n: usize = size.iter().product();
        let mut reader = TransformedReader::default();
        for (k, (angles, scale)) in [
            ([0.3, -0.2, 0.5], 1.0),
            ([0.0, 0.0, 1.2], 0.7),
            ([-2.5, 0.4, 0.1], 1.4),
            ([0.0, 0.0, 0.0], 1.25),
        ]
        .into_iter()
        .enumerate()
        {
            let t = Transform::rotate_scale(angles, scale);
            let start = [k as i64 * 2 - 2, 5 + k as i64, 14 - 3 * k as i64];
            let mut img = vec![0.0; n];
            let mut lab = vec![0u16; n];
            reader.read(&v, start, size, &t, &mut img, Some(&mut lab))?;
            for (i, c) in t.coordinates(start, size).iter().enumerate() {
                let want = reference_linear(&v, *c);
                assert!(
                    (img[i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
                    "{k} {i}: {} vs {want}",
                    img[i]
                );
                // The label is one of the 8 neighbours' values, and the nearest one's when the
                // coordinate lies on a voxel.
                let near = c.map(|x| x.round() as i64);
                if c.iter().all(|x| (x - x.round()).abs() < 1e-9) {
                    assert_eq!(lab[i], v.get(&v.label, near));
                }
                let i0 = c.map(|x| x.floor() as i64);
                let neighbours: Vec<u16> = (0..8)
                    .map(|q| {
                        let up = [(q >> 2) & 1, (q >> 1) & 1, q & 1];
                        v.get(&v.label, [0, 1, 2].map(|a| i0[a] + up[a] as i64))
                    })
                    .collect();
                assert!(neighbours.contains(&lab[i]), "{k} {i}");
            }
        }
        Ok(())
    }

    #[test]
    fn patches_reaching_far_outside_read_zeros_there_and_the_volume_elsewhere() -> Result<()> {
        // The box is cut one voxel beyond the volume; coordinates past the cut read 0 and
        // background without a box, the rest as before.
        let v = Volume::new([12, 30, 28]);
        let size = [6, 10, 12];
        let n: usize = size.iter().product();
        let mut reader = TransformedReader::default();
        for (angles, scale, start) in [
            ([0.3, -0.4, 0.6], 1.4, [-7, -9, 20]),
            ([1.1, 0.2, -0.3], 1.3, [9, 24, -10]),
            ([0.0, 0.0, 0.5], 1.0, [-30, 5, 5]),
            ([0.2, 0.1, 0.0], 0.8, [3, 40, 3]),
        ] {
            let t = Transform::rotate_scale(angles, scale);
            let (mut img, mut lab) = (vec![1.0; n], vec![7u16; n]);
            reader.read(&v, start, size, &t, &mut img, Some(&mut lab))?;
            for (i, c) in t.coordinates(start, size).iter().enumerate() {
                let want = reference_linear(&v, *c);
                assert!((img[i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()));
                let outside = (0..3).any(|a| c[a] < -1.0 || c[a] >= v.shape[a] as f64);
                if outside {
                    assert_eq!((img[i], lab[i]), (0.0, 0), "{start:?} {i}");
                }
                assert_ne!(lab[i], 7);
            }
        }
        Ok(())
    }

    /// The vector builds this CPU runs, each as a forced build.
    fn vector_builds() -> Vec<Simd> {
        [Simd::Avx2, Simd::Avx512]
            .into_iter()
            .filter(|&b| b <= simd::detected())
            .collect()
    }

    /// Box buffers are kept between reads and only grow: a reader that served boxes larger
    /// and smaller before gives each patch what a fresh reader gives (in-plane maps through
    /// the columns, 3D rotations through the spans, scalings through the separable passes).
    #[test]
    fn a_reused_reader_gives_what_a_fresh_one_gives() -> Result<()> {
        let v = Volume::new([20, 40, 36]);
        let size = [8, 12, 14];
        let n: usize = size.iter().product();
        for build in vector_builds().into_iter().chain([Simd::Portable]) {
            let mut reused = TransformedReader::with_build(build);
            for (k, scale) in [1.4, 0.7, 1.3, 0.8, 1.0, 1.4].into_iter().enumerate() {
                let in_plane = Transform::in_plane(0.4 * k as f64, scale);
                let turned = Transform::rotate_scale([0.3, -0.2 * k as f64, 0.5], scale);
                let scaled = Transform::rotate_scale([0.0; 3], scale);
                for t in [in_plane, turned, scaled] {
                    let start = [k as i64 - 2, 3 * k as i64, 20 - 3 * k as i64];
                    let (mut a, mut b) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                    let (mut la, mut lb) = (vec![7u16; n], vec![9u16; n]);
                    reused.read(&v, start, size, &t, &mut a, Some(&mut la))?;
                    TransformedReader::with_build(build).read(
                        &v,
                        start,
                        size,
                        &t,
                        &mut b,
                        Some(&mut lb),
                    )?;
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "{build:?} {k}");
                    assert_eq!(la, lb, "{build:?} {k}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn the_vector_builds_give_the_same_bits() -> Result<()> {
        for build in vector_builds() {
            the_build_gives_the_portable_bits(build)?;
        }
        Ok(())
    }

    fn the_build_gives_the_portable_bits(build: Simd) -> Result<()> {
        let v = Volume::new([14, 30, 28]);
        let size = [6, 12, 14];
        let n: usize = size.iter().product();
        let mut fast = TransformedReader::with_build(build);
        let mut portable = TransformedReader::with_build(Simd::Portable);
        let in_plane = Transform::in_plane(0.9, 1.3);
        assert!(in_plane.keeps_z_planes());
        // In-plane maps share one plane's cells across planes: planes outside the volume
        // (above, below) and rows reaching outside in y and x too.
        for start in [[-4, 7, 6], [11, -9, 20], [-1, 20, -10]] {
            let (mut a, mut b) = (vec![f32::NAN; n], vec![f32::NAN; n]);
            let (mut la, mut lb) = (vec![7u16; n], vec![9u16; n]);
            fast.read(&v, start, size, &in_plane, &mut a, Some(&mut la))?;
            portable.read(&v, start, size, &in_plane, &mut b, Some(&mut lb))?;
            assert_eq!(a, b, "in-plane at {start:?}");
            assert_eq!(la, lb, "in-plane at {start:?}");
        }
        // A deformed map: its coordinates come per voxel, not from the affine lanes.
        let mut elastic = Transform::rotate_scale([0.3, 0.2, -0.4], 1.1);
        elastic.elastic = Some(ElasticField::random(size, 4, 1.5, false, &mut Rng::new(3)));
        for (k, t) in [
            Transform::rotate_scale([0.4, -0.3, 0.2], 1.2),
            Transform::rotate_scale([1.1, 0.0, 0.0], 0.8),
            in_plane,
            Transform::rotate_scale([-0.5, 0.6, 0.1], 1.4),
            elastic,
        ]
        .iter()
        .enumerate()
        {
            let start = [k as i64 * 4 - 2, 7, 6 + 5 * k as i64];
            let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
            let (mut la, mut lb) = (vec![0u16; n], vec![0u16; n]);
            fast.read(&v, start, size, t, &mut a, Some(&mut la))?;
            portable.read(&v, start, size, t, &mut b, Some(&mut lb))?;
            assert_eq!(a, b, "{k}");
            assert_eq!(la, lb, "{k}");
            // Two channels: each the same through both builds, the first the one above.
            let two = Stored {
                v: Volume::new([14, 30, 28]),
                two_channels: true,
                byte_labels: false,
            };
            let (mut a2, mut b2) = (vec![0.0; 2 * n], vec![0.0; 2 * n]);
            fast.read(&two, start, size, t, &mut a2, None)?;
            portable.read(&two, start, size, t, &mut b2, None)?;
            assert_eq!(a2, b2, "{k}, two channels");
            assert_eq!(a2[..n], a[..], "{k}, first channel");
            assert!(a2[n..].iter().zip(&a).any(|(x, y)| x != y));
            // Labels read as bytes: the same values through both builds.
            let bytes = Stored {
                v: Volume::new([14, 30, 28]),
                two_channels: false,
                byte_labels: true,
            };
            let (mut a8, mut b8) = (vec![0.0; n], vec![0.0; n]);
            let (mut la8, mut lb8) = (vec![0u16; n], vec![0u16; n]);
            fast.read(&bytes, start, size, t, &mut a8, Some(&mut la8))?;
            portable.read(&bytes, start, size, t, &mut b8, Some(&mut lb8))?;
            assert_eq!((&a8, &la8), (&a, &la), "{k}, byte labels");
            assert_eq!((&b8, &lb8), (&a, &la), "{k}, byte labels, portable");
        }
        Ok(())
    }

    #[test]
    fn in_plane_columns_give_the_portable_bits() -> Result<()> {
        // Patches of many planes through the box's columns: 19 planes (two blocks of 8 and a
        // part) and 16, rows of 37 (a short last row of 8), rotated and scaled, mirrored (z too:
        // the planes run backwards), reaching outside the volume above and below (fewer
        // planes inside, some patches with fewer than the columns' minimum) and beside; one
        // and two channels, byte and wide labels of three classes (cells of three values).
        // Bit for bit the portable loop's.
        let in_plane = Transform::in_plane;
        let maps = [
            in_plane(0.9, 1.3),
            in_plane(-2.4, 0.75),
            in_plane(0.5, 1.0).mirrored([true, false, true]),
            in_plane(0.0, 1.2),
            in_plane(0.0, 0.8).mirrored([true, true, false]),
        ];
        let sources = [(false, false), (true, false), (false, true)].map(|(two, bytes)| Stored {
            v: Volume::new([30, 30, 28]),
            two_channels: two,
            byte_labels: bytes,
        });
        let mut portable = TransformedReader::with_build(Simd::Portable);
        // (16 planes: AVX-512's lerps of 16 planes a vector.)
        for (build, size) in vector_builds()
            .into_iter()
            .flat_map(|b| [(b, [19, 12, 37]), (b, [16, 10, 21])])
        {
            let n: usize = size.iter().product();
            let mut fast = TransformedReader::with_build(build);
            for (k, t) in maps.iter().enumerate() {
                assert!(t.keeps_z_planes());
                for start in [
                    [5, 8, -4],
                    [-12, 3, 2],
                    [20, 10, -20],
                    [-17, -8, 10],
                    [27, 20, 5],
                ] {
                    for src in &sources {
                        let c = src.channels();
                        let (mut a, mut b) = (vec![f32::NAN; c * n], vec![1.5; c * n]);
                        let (mut la, mut lb) = (vec![7u16; n], vec![9u16; n]);
                        fast.read(src, start, size, t, &mut a, Some(&mut la))?;
                        portable.read(src, start, size, t, &mut b, Some(&mut lb))?;
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&a), bits(&b), "{build:?} map {k} at {start:?}");
                        assert_eq!(la, lb, "{build:?} map {k} at {start:?}");
                        let mut a2 = vec![f32::NAN; c * n];
                        fast.read(src, start, size, t, &mut a2, None)?;
                        assert_eq!(bits(&a2), bits(&a), "{build:?} map {k}, no label");
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn labels_at_the_types_extremes_agree_across_builds() -> Result<()> {
        // The vector builds look the uniform table up 4 bytes a lane and keep the entry's
        // own bytes: labels equal to the table's mixed mark (255, 65535) and above a byte
        // (300) must come out as the portable path gives them, through the general, in-plane
        // and separable loops.
        let in_plane = Transform::in_plane(0.7, 1.2);
        let maps = [
            Transform::rotate_scale([0.4, -0.3, 0.2], 1.2),
            in_plane,
            Transform::rotate_scale([0.0; 3], 1.3),
            Transform::rotate_scale([0.0; 3], 0.7),
        ];
        let size = [6, 12, 21];
        let n: usize = size.iter().product();
        let source = |values: [u16; 3], bytes: bool| {
            let mut v = Volume::new([14, 30, 28]);
            v.label.iter_mut().for_each(|l| *l = values[*l as usize]);
            Stored {
                v,
                two_channels: false,
                byte_labels: bytes,
            }
        };
        let sources = [
            (source([0, 65535, 300], false), [65535, 300]),
            (source([0, 255, 7], true), [255, 7]),
            (source([0, 255, 7], false), [255, 7]),
        ];
        let mut portable = TransformedReader::with_build(Simd::Portable);
        for build in vector_builds() {
            let mut fast = TransformedReader::with_build(build);
            for (k, t) in maps.iter().enumerate() {
                for (src, values) in &sources {
                    let start = [2, 5, 3];
                    let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
                    let (mut la, mut lb) = (vec![1u16; n], vec![2u16; n]);
                    fast.read(src, start, size, t, &mut a, Some(&mut la))?;
                    portable.read(src, start, size, t, &mut b, Some(&mut lb))?;
                    assert_eq!(la, lb, "{build:?} map {k}, values {values:?}");
                    for v in values {
                        assert!(la.contains(v), "{build:?} map {k}: no {v}");
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn mirrored_reads_equal_reads_mirrored_after() -> Result<()> {
        // Mirroring folded into the map (rotations 3D and in-plane, scalings through the
        // separable passes) or done by the source (plain crops) or after (elastic fields):
        // bit for bit what mirroring the read patch gives, in every build, for every set of
        // axes, one and two channels, byte labels.
        let in_plane = Transform::in_plane(0.9, 1.3);
        let in_plane_scale = Transform::in_plane(0.0, 0.8);
        let mut elastic = Transform::rotate_scale([0.3, 0.2, -0.4], 1.1);
        let size = [6, 12, 14];
        elastic.elastic = Some(ElasticField::random(size, 4, 1.5, false, &mut Rng::new(3)));
        let maps = [
            Transform::identity(),
            Transform::rotate_scale([0.4, -0.3, 0.2], 1.2),
            in_plane,
            Transform::rotate_scale([0.0; 3], 1.3),
            in_plane_scale,
            elastic,
        ];
        let n: usize = size.iter().product();
        let sources = stored_three_ways();
        for build in vector_builds().into_iter().chain([Simd::Portable]) {
            let mut reader = TransformedReader::with_build(build);
            for (k, t) in maps.iter().enumerate() {
                for f in 1..8u8 {
                    let flips = [f & 4 != 0, f & 2 != 0, f & 1 != 0];
                    for src in &sources {
                        if k == 0 && src.byte_labels {
                            // (This test source reads bytes only through the transform.)
                            continue;
                        }
                        let c = src.channels();
                        let start = [k as i64 - 3, 7, 4];
                        let (mut a, mut la) = (vec![0.0; c * n], vec![0u16; n]);
                        reader.read(src, start, size, t, &mut a, Some(&mut la))?;
                        a.chunks_exact_mut(n).for_each(|p| mirror(p, size, flips));
                        mirror(&mut la, size, flips);
                        let (mut b, mut lb) = (vec![f32::NAN; c * n], vec![7u16; n]);
                        reader.read_mirrored(src, start, size, t, flips, &mut b, Some(&mut lb))?;
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&a), bits(&b), "{build:?} map {k} {flips:?}");
                        assert_eq!(la, lb, "{build:?} map {k} {flips:?}");
                    }
                }
            }
        }
        // The in-plane map mirrored in z is still in-plane (its 4-neighbour path).
        assert!(maps[2].mirrored([true, false, true]).keeps_z_planes());
        Ok(())
    }

    #[test]
    fn maps_without_rotation_separate_into_the_same_bits() -> Result<()> {
        // Scalings (3D and in-plane, shrinking and growing, patches reaching outside the
        // volume on every side) through the separable passes and through the general loop,
        // in every build: the same image and label bits, for one and two channels and for
        // byte labels.
        let in_plane = Transform::in_plane(0.0, 1.3);
        let maps = [
            Transform::rotate_scale([0.0; 3], 1.4),
            Transform::rotate_scale([0.0; 3], 0.7),
            Transform::rotate_scale([0.0; 3], 1.0 + 1e-9),
            in_plane.clone(),
            // Mirrored (decreasing coordinates).
            Transform::rotate_scale([0.0; 3], 1.2).mirrored([true, false, true]),
            in_plane.mirrored([false, true, true]),
        ];
        for t in &maps {
            assert!(t.axis_aligned() && !t.is_identity());
        }
        assert!(!Transform::rotate_scale([0.1, 0.0, 0.0], 1.2).axis_aligned());
        // Rows of 37: two blocks of 16 (the AVX-512 x pass) and a tail.
        let size = [6, 12, 37];
        let n: usize = size.iter().product();
        let sources = stored_three_ways();
        for build in vector_builds().into_iter().chain([Simd::Portable]) {
            let mut fast = TransformedReader::with_build(build);
            let mut general = TransformedReader {
                general_only: true,
                ..TransformedReader::with_build(build)
            };
            for (k, t) in maps.iter().enumerate() {
                for start in [
                    [-4, -6, -9],
                    [k as i64 * 2, 7, 6],
                    [10, 24, 20],
                    [13, -20, 40],
                ] {
                    for src in &sources {
                        let c = src.channels();
                        let (mut a, mut b) = (vec![f32::NAN; c * n], vec![f32::NAN; c * n]);
                        let (mut la, mut lb) = (vec![7u16; n], vec![9u16; n]);
                        fast.read(src, start, size, t, &mut a, Some(&mut la))?;
                        general.read(src, start, size, t, &mut b, Some(&mut lb))?;
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&a), bits(&b), "{build:?} map {k} at {start:?}");
                        assert_eq!(la, lb, "{build:?} map {k} at {start:?}");
                        // Without a label too.
                        let mut a2 = vec![f32::NAN; c * n];
                        fast.read(src, start, size, t, &mut a2, None)?;
                        assert_eq!(bits(&a2), bits(&a));
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn the_in_plane_path_equals_the_general_one() -> Result<()> {
        // An in-plane rotation and scale takes the 4-neighbour path; the same map with a
        // z coefficient too small to move any coordinate takes the 8-neighbour one. Both must
        // give the same bits (the upper plane's weight is exactly 0).
        let v = Volume::new([12, 30, 28]);
        let size = [5, 12, 14];
        let n: usize = size.iter().product();
        let mut reader = TransformedReader::default();
        for (k, (angle, scale)) in [(0.7, 1.0), (-2.1, 1.3), (0.2, 0.8)]
            .into_iter()
            .enumerate()
        {
            let flat = Transform::in_plane(angle, scale);
            let mut general = flat.clone();
            general.matrix[0][1] = 1e-300;
            assert!(flat.keeps_z_planes() && !general.keeps_z_planes());
            assert_eq!(
                flat.coordinates([2, 4, 3], size),
                general.coordinates([2, 4, 3], size)
            );
            let start = [k as i64 * 3 - 1, 6, 5 - k as i64];
            let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
            let (mut la, mut lb) = (vec![0u16; n], vec![0u16; n]);
            reader.read(&v, start, size, &flat, &mut a, Some(&mut la))?;
            reader.read(&v, start, size, &general, &mut b, Some(&mut lb))?;
            assert_eq!(a, b, "{k}");
            assert_eq!(la, lb, "{k}");
            assert!(
                la.iter().any(|&l| l != la[0]),
                "{k}: the patch crosses labels"
            );
        }
        Ok(())
    }

    #[test]
    fn labels_keep_thin_structures_and_never_mix_values() -> Result<()> {
        // A one-voxel line of value 2 through a background of 0, shifted by half a voxel: per-
        // class weights never produce 1 (the mean of 0 and 2).
        let shape = [5, 16, 16];
        let mut v = Volume::new(shape);
        v.label.iter_mut().for_each(|l| *l = 0);
        for x in 0..16 {
            v.label[(2 * 16 + 8) * 16 + x] = 2;
        }
        let t = Transform::rotate_scale([0.2, 0.0, 0.0], 1.0);
        let size = [5, 16, 16];
        let mut img = vec![0.0; 5 * 256];
        let mut lab = vec![0u16; 5 * 256];
        TransformedReader::default().read(&v, [0, 0, 0], size, &t, &mut img, Some(&mut lab))?;
        assert!(lab.iter().all(|&l| l == 0 || l == 2));
        assert!(lab.iter().filter(|&&l| l == 2).count() >= 10);
        Ok(())
    }

    #[test]
    fn the_source_box_covers_every_coordinate_and_little_more() {
        let size = [8, 16, 16];
        let t = Transform::rotate_scale([0.5, 0.3, 0.2], 1.3);
        let (s, b) = t.source_box([10, 20, 30], size);
        for c in t.coordinates([10, 20, 30], size) {
            for a in 0..3 {
                assert!(c[a].floor() as i64 >= s[a]);
                assert!((c[a].floor() as i64 + 1) < s[a] + b[a] as i64);
            }
        }
        let plain = Transform::identity().source_box([10, 20, 30], size);
        assert_eq!(plain, ([9, 19, 29], [11, 19, 19]));
    }

    /// A source whose span reads leave poison outside the spans (NaN in the image, 200 in the
    /// label): a patch that used a voxel outside them shows it.
    struct Poisoned(Stored);

    impl PatchSource for Poisoned {
        fn name(&self) -> String {
            "poisoned".into()
        }
        fn shape_zyx(&self) -> [usize; 3] {
            self.0.shape_zyx()
        }
        fn has_label(&self) -> bool {
            true
        }
        fn channels(&self) -> usize {
            self.0.channels()
        }
        fn classes(&self) -> Vec<u16> {
            self.0.classes()
        }
        fn fg_coords(&self, c: u16) -> Result<Vec<[u32; 3]>> {
            self.0.fg_coords(c)
        }
        fn read_image(&self, s: [i64; 3], size: [usize; 3], out: &mut [f32]) -> Result<()> {
            self.0.read_image(s, size, out)
        }
        fn read_label(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
            self.0.read_label(s, size, out)
        }
        fn label_bytes(&self) -> bool {
            self.0.label_bytes()
        }
        fn read_label_u8(&self, s: [i64; 3], size: [usize; 3], out: &mut [u8]) -> Result<()> {
            self.0.read_label_u8(s, size, out)
        }
        fn has_distance(&self) -> bool {
            true
        }
        fn has_skeleton(&self) -> bool {
            true
        }
        fn read_distance(
            &self,
            class: u16,
            s: [i64; 3],
            size: [usize; 3],
            out: &mut [f32],
        ) -> Result<()> {
            self.0.read_distance(class, s, size, out)
        }
        fn read_skeleton(&self, s: [i64; 3], size: [usize; 3], out: &mut [u16]) -> Result<()> {
            self.0.read_skeleton(s, size, out)
        }
        fn read_spans(
            &self,
            s: [i64; 3],
            size: [usize; 3],
            spans: &[(u32, u32)],
            out: SpanOut,
        ) -> Result<()> {
            let n: usize = size.iter().product();
            let outside = |i: usize| {
                let (r, x) = ((i % n) / size[2], (i % size[2]) as u32);
                let (a, b) = if spans.len() == size[1] {
                    spans[r % size[1]]
                } else {
                    spans[r]
                };
                !(a..b).contains(&x)
            };
            fn poison<T: Copy>(out: &mut [T], bad: T, outside: impl Fn(usize) -> bool) {
                for (i, v) in out.iter_mut().enumerate() {
                    if outside(i) {
                        *v = bad;
                    }
                }
            }
            match out {
                SpanOut::Image(o) => {
                    self.read_image(s, size, o)?;
                    poison(o, f32::NAN, outside);
                }
                SpanOut::Label(o) => {
                    self.read_label(s, size, o)?;
                    poison(o, 200, outside);
                }
                SpanOut::LabelBytes(o) => {
                    self.read_label_u8(s, size, o)?;
                    poison(o, 200, outside);
                }
                SpanOut::Distance(c, o) => {
                    self.read_distance(c, s, size, o)?;
                    poison(o, f32::NAN, outside);
                }
                SpanOut::Skeleton(o) => {
                    self.read_skeleton(s, size, o)?;
                    poison(o, 200, outside);
                }
            }
            Ok(())
        }
    }

    #[test]
    fn rotations_read_only_their_footprint_in_every_build() -> Result<()> {
        // Read through spans whose outside is poisoned, rotated patches equal those read from
        // whole boxes, in every build, for each way of storing the case, across its edges.
        let mut rng = Rng::new(8);
        let size = [6, 12, 14];
        let n: usize = size.iter().product();
        for build in [Simd::Portable].into_iter().chain(vector_builds()) {
            for stored in stored_three_ways() {
                let poisoned = Poisoned(Stored {
                    v: Volume::new(stored.v.shape),
                    ..stored
                });
                let plain = &poisoned.0;
                let c = plain.channels();
                let (mut spans, mut whole) = (
                    TransformedReader::with_build(build),
                    TransformedReader::with_build(build),
                );
                for k in 0..8 {
                    let angles = [0, 1, 2].map(|_| rng.range(-0.6, 0.6));
                    let mut t = Transform::rotate_scale(angles, rng.range(0.7, 1.4));
                    if k % 3 == 1 {
                        t = t.mirrored([false, true, true]);
                    }
                    let start =
                        [0, 1, 2].map(|a| rng.range(-6.0, 20.0) as i64 - (a == 0) as i64 * 8);
                    let (mut a, mut b) = (vec![0.0; c * n], vec![0.0; c * n]);
                    let (mut la, mut lb) = (vec![0u16; n], vec![0u16; n]);
                    spans.read(&poisoned, start, size, &t, &mut a, Some(&mut la))?;
                    whole.read(plain, start, size, &t, &mut b, Some(&mut lb))?;
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "{build:?}, map {k} at {start:?}");
                    assert_eq!(la, lb, "{build:?}, map {k} at {start:?}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn derived_arrays_read_only_their_footprint_in_every_build() -> Result<()> {
        // Distance maps and skeleton through spans whose outside is poisoned (NaN, 200) equal
        // those read from whole boxes: 3D rotations, in-plane rotations of many planes (the
        // columns) and of few, across the volume's edges, in every build.
        let mut rng = Rng::new(9);
        let classes = [1u16, 2];
        let in_plane = Transform::in_plane;
        for build in [Simd::Portable].into_iter().chain(vector_builds()) {
            let poisoned = Poisoned(Stored {
                v: Volume::new([30, 30, 28]),
                two_channels: false,
                byte_labels: false,
            });
            let plain = &poisoned.0;
            let (mut spans, mut whole) = (
                TransformedReader::with_build(build),
                TransformedReader::with_build(build),
            );
            for k in 0..12 {
                let (t, size) = match k % 3 {
                    0 => {
                        let angles = [0, 1, 2].map(|_| rng.range(-0.6, 0.6));
                        (
                            Transform::rotate_scale(angles, rng.range(0.7, 1.4)),
                            [6, 12, 14],
                        )
                    }
                    1 => (
                        in_plane(rng.range(-3.0, 3.0), rng.range(0.7, 1.4)),
                        [16, 10, 21],
                    ),
                    _ => (in_plane(rng.range(-3.0, 3.0), 1.0), [3, 12, 19]),
                };
                let t = if k % 4 == 3 {
                    t.mirrored([true, false, true])
                } else {
                    t
                };
                let n: usize = size.iter().product();
                let start = [0, 1, 2].map(|a| rng.range(-6.0, 20.0) as i64 - (a == 0) as i64 * 4);
                let (mut a, mut b) = (vec![0.0; 2 * n], vec![0.0; 2 * n]);
                let (mut sa, mut sb) = (vec![0u16; n], vec![0u16; n]);
                spans.read_derived(&poisoned, start, size, &t, &classes, &mut a, Some(&mut sa))?;
                whole.read_derived(plain, start, size, &t, &classes, &mut b, Some(&mut sb))?;
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{build:?}, map {k} at {start:?}");
                assert_eq!(sa, sb, "{build:?}, map {k} at {start:?}");
                assert!(sa.iter().all(|&v| v < 200), "{build:?}, map {k}");
            }
        }
        Ok(())
    }

    #[test]
    fn footprint_spans_cover_every_cell_read_and_little_more() {
        // Every voxel a cell reads (its 8 corners, for each patch coordinate inside the box,
        // lanes past the patch's last row of 8 too) lies in its row's span; the spans hold
        // well under the box and not much over the voxels read.
        let mut rng = Rng::new(21);
        let (mut read_total, mut span_total, mut box_total) = (0usize, 0usize, 0usize);
        for k in 0..60 {
            let size = [[6, 12, 14], [9, 21, 30], [4, 16, 16]][k % 3];
            let angles = [0, 1, 2].map(|_| rng.range(-0.6, 0.6));
            let mut t = Transform::rotate_scale(angles, rng.range(0.7, 1.4));
            if k % 4 == 1 {
                t = t.mirrored([true, false, true]);
            }
            if k % 5 == 2 {
                t.matrix[0] = [1.0, 0.0, 0.0];
                t.matrix[1][0] = 0.0;
                t.matrix[2][0] = 0.0;
            }
            let start = [-3, 5, -2];
            let (box_start, bs) = t.source_box(start, size);
            let centre = centre_of(start, size);
            let local = [0, 1, 2].map(|a| centre[a] - box_start[a] as f64);
            let mut spans = Vec::new();
            assert!(footprint_spans_3d(&t, local, size, bs, &mut spans));
            assert_eq!(spans.len(), bs[0] * bs[1]);
            let mut read = vec![false; bs.iter().product()];
            let mut row = vec![[0.0; 3]; size[2].div_ceil(8) * 8];
            let coords = (0..size[0] * size[1]).flat_map(|r| {
                t.row(
                    local,
                    size,
                    (r / size[1], r % size[1]),
                    0,
                    &mut row,
                    &mut Vec::new(),
                );
                row.clone()
            });
            for c in coords {
                let Some((base, _)) = cell(&c, bs) else {
                    continue;
                };
                for corner in 0..8 {
                    let at = base
                        + (corner >> 2) * bs[1] * bs[2]
                        + ((corner >> 1) & 1) * bs[2]
                        + (corner & 1);
                    read[at] = true;
                }
            }
            for (i, _) in read.iter().enumerate().filter(|(_, &r)| r) {
                let (row, x) = (i / bs[2], (i % bs[2]) as u32);
                let (a, b) = spans[row];
                assert!(
                    a <= x && x < b,
                    "map {k}: voxel {i} (row {row}, x {x}) outside {a}..{b}"
                );
            }
            read_total += read.iter().filter(|&&r| r).count();
            span_total += spans.iter().map(|s| (s.1 - s.0) as usize).sum::<usize>();
            box_total += read.len();
        }
        let (over, of_box) = (
            span_total as f64 / read_total as f64,
            span_total as f64 / box_total as f64,
        );
        // (Measured: 1.11 and 0.32.)
        assert!(
            over < 1.3 && of_box < 0.5,
            "spans {over} x the voxels read, {of_box} of the boxes"
        );
    }

    #[test]
    fn draws_follow_nnunet_rules() {
        let cfg = SpatialConfig::default();
        assert!(cfg.in_plane_for([16, 64, 64]));
        assert!(!cfg.in_plane_for([32, 64, 64]));
        assert_eq!(cfg.degrees_for([16, 64, 64]), [180.0, 0.0, 0.0]);
        assert_eq!(cfg.degrees_for([64, 64, 64]), [30.0; 3]);
        // About 20% rotated, 20% scaled, independently; in-plane patches keep z.
        let mut rotated = 0;
        let mut scaled = 0;
        for seed in 0..2000 {
            let t = cfg.draw([8, 48, 48], &mut Rng::new(seed));
            assert_eq!(t.matrix[0], [1.0, 0.0, 0.0]);
            assert_eq!((t.matrix[1][0], t.matrix[2][0]), (0.0, 0.0));
            scaled += (t.scale != 1.0) as usize;
            let det = t.matrix[1][1] * t.matrix[2][2] - t.matrix[1][2] * t.matrix[2][1];
            assert!((det - t.scale * t.scale).abs() < 1e-9);
            rotated += (t.matrix[1][2].abs() > 1e-12) as usize;
            assert!((0.7..=1.4).contains(&t.scale));
        }
        assert!((330..470).contains(&rotated), "{rotated}");
        assert!((330..470).contains(&scaled), "{scaled}");
        let none = SpatialConfig::none();
        assert!((0..100).all(|s| none.draw([8, 8, 8], &mut Rng::new(s)).is_identity()));
    }

    #[test]
    fn elastic_fields_are_smooth_and_bounded() {
        let cfg = SpatialConfig {
            elastic_prob: 1.0,
            ..SpatialConfig::none()
        };
        let t = cfg.draw([16, 32, 32], &mut Rng::new(5));
        let e = t.elastic.as_ref().expect("a field");
        let max = e
            .disp
            .iter()
            .flat_map(|d| d.iter().map(|v| v.abs()))
            .fold(0.0, f64::max);
        assert!(max > 0.5);
        // Neighbouring voxels move by little more than magnitude / grid each.
        for z in 0..15 {
            let (a, b) = (e.at([z, 7, 9]), e.at([z + 1, 7, 9]));
            let step = (0..3).map(|k| (a[k] - b[k]).abs()).fold(0.0, f64::max);
            assert!(step <= 2.0 * max / 16.0 + 1e-12, "{step}");
        }
        // At a control point the field is that point's displacement.
        assert_eq!(e.at([16, 16, 0]), e.disp[(e.nodes[1] + 1) * e.nodes[2]]);
        let bad = SpatialConfig {
            scale_range: [1.4, 0.7],
            ..SpatialConfig::default()
        };
        assert!(bad.validate().is_err());
        assert!(SpatialConfig::default().validate().is_ok());
    }
}
