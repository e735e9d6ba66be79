//! The coordinate map of one patch (see the module doc of [`super`]): rotation and scaling as
//! one matrix, the elastic field's displacements, and the source coordinates of patch rows
//! that every path interpolates at.

use crate::util::rng::Rng;

pub(super) const IDENTITY: [[f64; 3]; 3] = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];

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
    pub(super) nodes: [usize; 3],
    pub(super) grid: f64,
    /// (z, y, x) displacement per control point, C order over `nodes`.
    pub(super) disp: Vec<[f64; 3]>,
}

impl ElasticField {
    pub(super) fn random(
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
    pub(super) fn at(&self, p: [usize; 3]) -> [f64; 3] {
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

/// One patch's map from patch voxels to source coordinates (see the module doc of [`super`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Transform {
    /// `scale * R`, acting on (z, y, x) offsets from the patch centre.
    pub matrix: [[f64; 3]; 3],
    /// The scale factor alone (distance maps sampled through the map shrink by it).
    pub scale: f64,
    /// The elastic deformation's displacements, if any, added after the affine part.
    pub elastic: Option<ElasticField>,
}

impl Transform {
    /// The plain crop: every patch voxel reads the voxel it lies on.
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

    /// An in-plane map (what [`super::SpatialConfig::draw`] gives anisotropic patches): rotation by
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
    pub(super) fn axis_coordinates(&self, centre: [f64; 3], size: [usize; 3]) -> [Vec<f64>; 3] {
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
    pub(super) fn row(
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
    pub(super) fn row8(
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

pub(super) fn centre_of(start_zyx: [i64; 3], size: [usize; 3]) -> [f64; 3] {
    [0, 1, 2].map(|a| start_zyx[a] as f64 + (size[a] as f64 - 1.0) / 2.0)
}
