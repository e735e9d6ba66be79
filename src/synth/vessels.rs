//! Vessel geometry: tubes along smooth random 3D curves in micrometers, and their
//! rasterization (signal and label) onto the voxel grid.

use crate::util::rng::xoshiro::Xoshiro;

/// Step of the curve random walk in micrometers.
const WALK_STEP: f64 = 1.0;

/// What kind of vessels a case has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum VesselStyle {
    /// Capillaries to larger vessels (radius 2 to 8 um), unbranched: the MiniVess-like presets.
    #[default]
    Mixed,
    /// Thin, tortuous, branching vessels (radius 0.9 to 1.5 um: one to three voxels across at
    /// 1 um; never under sqrt(3)/2 voxel, so a rasterized vessel stays connected), a few
    /// branches off each: the structures topology-aware losses are for.
    Thin,
}

impl VesselStyle {
    /// Radius range in micrometers.
    fn radii(self) -> (f64, f64) {
        match self {
            VesselStyle::Mixed => (2.0, 8.0),
            VesselStyle::Thin => (0.9, 1.5),
        }
    }

    /// Range of the persistence length (how straight a vessel runs), micrometers.
    fn persistence(self) -> (f64, f64) {
        match self {
            VesselStyle::Mixed => (60.0, 250.0),
            VesselStyle::Thin => (25.0, 90.0),
        }
    }

    /// Range of the vessel volume fraction a case aims for.
    pub(super) fn fraction(self) -> (f64, f64) {
        match self {
            VesselStyle::Mixed => (0.02, 0.08),
            VesselStyle::Thin => (0.006, 0.02),
        }
    }

    /// Range of the number of branches off each vessel.
    pub(super) fn branches(self) -> (usize, usize) {
        match self {
            VesselStyle::Mixed => (0, 0),
            VesselStyle::Thin => (1, 4),
        }
    }
}

/// The voxel grid in physical space: voxel (i, j, k) has its center at (i*sx, j*sy, k*sz).
pub(super) struct Grid {
    pub(super) n: [usize; 3],
    pub(super) sp: [f64; 3],
}

impl Grid {
    /// Lower and upper physical bounds of the field of view along `axis` (voxel edges).
    fn bounds(&self, axis: usize) -> (f64, f64) {
        let s = self.sp[axis];
        (-0.5 * s, (self.n[axis] as f64 - 0.5) * s)
    }

    pub(super) fn volume_um3(&self) -> f64 {
        (0..3).map(|a| self.n[a] as f64 * self.sp[a]).product()
    }

    fn contains(&self, p: [f64; 3], margin: f64) -> bool {
        (0..3).all(|a| {
            let (lo, hi) = self.bounds(a);
            p[a] >= lo - margin && p[a] <= hi + margin
        })
    }
}

/// A random walk of a vessel's course: direction and radius drift, a vertex every few steps.
struct Walk {
    style: VesselStyle,
    /// Nominal radius (um).
    r0: f64,
    /// Persistence length (um).
    persistence: f64,
    /// Longest course (um); it also ends when it leaves the field of view.
    max_len: f64,
}

impl Walk {
    /// The vertices (position, radius) from `start` (excluded) heading along `dir`.
    fn run(
        &self,
        grid: &Grid,
        start: [f64; 3],
        dir: [f64; 3],
        rng: &mut Xoshiro,
    ) -> Vec<([f64; 3], f64)> {
        let (rmin, rmax) = self.style.radii();
        let r0 = self.r0;
        let kick = (WALK_STEP / self.persistence).sqrt();
        // Vertices every `emit_every` walk steps: about one radius apart, which keeps the
        // rasterization bounding boxes tight while the capsules still join smoothly.
        let emit_every = (r0.clamp(2.0, 6.0) / WALK_STEP).round().max(1.0) as usize;
        let diag = (0..3)
            .map(|a| (grid.n[a] as f64 * grid.sp[a]).powi(2))
            .sum::<f64>()
            .sqrt();
        let max_len = (3.0 * diag + 10.0 * rmax).min(self.max_len);
        let margin = 1.5 * rmax;
        let mut out = Vec::new();
        let mut p = start;
        let mut d = dir;
        let mut r = r0;
        let mut len = 0.0;
        let mut step = 0usize;
        while grid.contains(p, margin) && len < max_len {
            step += 1;
            let g = [rng.gaussian(), rng.gaussian(), rng.gaussian()];
            d = normalize([d[0] + kick * g[0], d[1] + kick * g[1], d[2] + kick * g[2]])
                .unwrap_or(d);
            // Radius drifts slowly around its nominal value.
            r += 0.02 * (r0 - r) + 0.01 * r0 * rng.gaussian();
            r = r.clamp((0.8 * r0).max(rmin), (1.2 * r0).min(rmax));
            p = [
                p[0] + WALK_STEP * d[0],
                p[1] + WALK_STEP * d[1],
                p[2] + WALK_STEP * d[2],
            ];
            len += WALK_STEP;
            if step.is_multiple_of(emit_every) {
                out.push((p, r));
            }
        }
        out.push((p, r));
        out
    }
}

/// A vessel: a polyline through the field of view with a radius and brightness per vertex.
pub(super) struct Tube {
    points: Vec<[f64; 3]>,
    radii: Vec<f64>,
    amplitude: f64,
}

impl Tube {
    /// A smooth random curve through a random point of the field of view, walked both ways until
    /// it leaves the field of view. All lengths are in micrometers.
    pub(super) fn random(grid: &Grid, rng: &mut Xoshiro, style: VesselStyle) -> Tube {
        let (rmin, rmax) = style.radii();
        let u = rng.uniform();
        // Mostly capillary-sized, sometimes larger vessels.
        let r0 = rmin + (rmax - rmin) * u * u;
        let amplitude = rng.range_f64(220.0, 380.0);
        // Persistence length of the direction random walk: how straight the vessel runs.
        // (The order of the draws keeps the Mixed cases, the bundled data, as they were.)
        let (lo, hi) = style.persistence();
        let walk = Walk {
            style,
            r0,
            persistence: rng.range_f64(lo, hi),
            max_len: f64::INFINITY,
        };
        let start = [0, 1, 2].map(|a| {
            let (lo, hi) = grid.bounds(a);
            rng.range_f64(lo, hi)
        });
        let dir0 = rng.unit_vector();
        let forward = walk.run(grid, start, dir0, rng);
        let backward = walk.run(grid, start, [-dir0[0], -dir0[1], -dir0[2]], rng);
        let n = forward.len() + backward.len() + 1;
        let mut points = Vec::with_capacity(n);
        let mut radii = Vec::with_capacity(n);
        for &(p, r) in backward.iter().rev() {
            points.push(p);
            radii.push(r);
        }
        points.push(start);
        radii.push(r0);
        for &(p, r) in &forward {
            points.push(p);
            radii.push(r);
        }
        Tube {
            points,
            radii,
            amplitude,
        }
    }

    /// A branch: leaves this vessel at one of its vertices inside the field of view, at 30 to
    /// 80 degrees from its course, no thicker than it, and runs one way for 15 to 60 um.
    pub(super) fn branch(
        &self,
        grid: &Grid,
        rng: &mut Xoshiro,
        style: VesselStyle,
    ) -> Option<Tube> {
        let inside: Vec<usize> = (1..self.points.len())
            .filter(|&i| grid.contains(self.points[i], 0.0))
            .collect();
        if inside.is_empty() {
            return None;
        }
        let i = inside[rng.range_usize(0, inside.len() - 1)];
        let start = self.points[i];
        let course = normalize(sub(self.points[i], self.points[i - 1]))?;
        // A direction at angle `a` from the course: rotate toward a random perpendicular.
        let side = normalize(cross(course, rng.unit_vector()))?;
        let a = rng.range_f64(30.0, 80.0).to_radians();
        let dir0 = [0, 1, 2].map(|k| a.cos() * course[k] + a.sin() * side[k]);
        let (rmin, _) = style.radii();
        let r0 = (self.radii[i] * rng.range_f64(0.7, 1.0)).max(rmin);
        let walk = Walk {
            style,
            r0,
            persistence: {
                let (lo, hi) = style.persistence();
                rng.range_f64(lo, hi)
            },
            max_len: rng.range_f64(15.0, 60.0),
        };
        let path = walk.run(grid, start, dir0, rng);
        let mut points = vec![start];
        let mut radii = vec![r0];
        for (p, r) in path {
            points.push(p);
            radii.push(r);
        }
        Some(Tube {
            points,
            radii,
            amplitude: self.amplitude * rng.range_f64(0.8, 1.0),
        })
    }

    /// Rough tube volume inside the field of view (segments whose midpoint is inside).
    pub(super) fn volume_inside_um3(&self, grid: &Grid) -> f64 {
        let mut v = 0.0;
        for i in 1..self.points.len() {
            let (a, b) = (self.points[i - 1], self.points[i]);
            let mid = [0, 1, 2].map(|k| 0.5 * (a[k] + b[k]));
            if grid.contains(mid, 0.0) {
                let r = 0.5 * (self.radii[i - 1] + self.radii[i]);
                v += std::f64::consts::PI * r * r * dist(a, b);
            }
        }
        v
    }

    /// Burn the tube into `signal` (max of vessel brightness) and `label`; returns the number of
    /// voxels that became foreground.
    pub(super) fn rasterize(&self, grid: &Grid, signal: &mut [i16], label: &mut [u8]) -> usize {
        let mut newly = 0;
        for i in 1..self.points.len() {
            newly += self.rasterize_segment(grid, i - 1, i, signal, label);
        }
        newly
    }

    /// One capsule (a cone frustum with rounded ends): voxels whose center lies within the
    /// interpolated radius of the segment. Only the segment's bounding box is visited.
    fn rasterize_segment(
        &self,
        grid: &Grid,
        ia: usize,
        ib: usize,
        signal: &mut [i16],
        label: &mut [u8],
    ) -> usize {
        let (a, b) = (self.points[ia], self.points[ib]);
        let (ra, rb) = (self.radii[ia], self.radii[ib]);
        let rmax = ra.max(rb);
        let [nx, ny, _] = grid.n;
        let sp = grid.sp;

        let mut lo = [0usize; 3];
        let mut hi = [0usize; 3];
        for k in 0..3 {
            let pmin = a[k].min(b[k]) - rmax;
            let pmax = a[k].max(b[k]) + rmax;
            let last = grid.n[k] as f64 - 1.0;
            let l = (pmin / sp[k]).ceil().max(0.0);
            let h = (pmax / sp[k]).floor().min(last);
            if l > h {
                return 0;
            }
            lo[k] = l as usize;
            hi[k] = h as usize;
        }

        let ab = [b[0] - a[0], b[1] - a[1], b[2] - a[2]];
        let len2 = dot(ab, ab);
        let inv_len2 = if len2 > 0.0 { 1.0 / len2 } else { 0.0 };
        let dr = rb - ra;
        let amp = self.amplitude;

        let mut newly = 0;
        for z in lo[2]..=hi[2] {
            let wz = z as f64 * sp[2] - a[2];
            for y in lo[1]..=hi[1] {
                let wy = y as f64 * sp[1] - a[1];
                let row = (z * ny + y) * nx;
                let base_t = wy * ab[1] + wz * ab[2];
                for x in lo[0]..=hi[0] {
                    let wx = x as f64 * sp[0] - a[0];
                    let t = ((wx * ab[0] + base_t) * inv_len2).clamp(0.0, 1.0);
                    let dx = wx - t * ab[0];
                    let dy = wy - t * ab[1];
                    let dz = wz - t * ab[2];
                    let d2 = dx * dx + dy * dy + dz * dz;
                    let r = ra + t * dr;
                    let r2 = r * r;
                    if d2 <= r2 {
                        let idx = row + x;
                        // Brightest on the axis, falling off smoothly toward the wall.
                        let s = 1.0 - d2 / r2;
                        let v = (amp * (0.3 + 0.7 * s)).round() as i16;
                        if v > signal[idx] {
                            signal[idx] = v;
                        }
                        if label[idx] == 0 {
                            label[idx] = 1;
                            newly += 1;
                        }
                    }
                }
            }
        }
        newly
    }
}

fn dot(a: [f64; 3], b: [f64; 3]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

fn sub(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

fn dist(a: [f64; 3], b: [f64; 3]) -> f64 {
    let d = [b[0] - a[0], b[1] - a[1], b[2] - a[2]];
    dot(d, d).sqrt()
}

pub(super) fn normalize(v: [f64; 3]) -> Option<[f64; 3]> {
    let n = dot(v, v).sqrt();
    (n > 1e-12).then(|| [v[0] / n, v[1] / n, v[2] / n])
}
