//! Vessel geometry: tubes along smooth random 3D curves in micrometers, and their
//! rasterization (signal and label) onto the voxel grid.

use super::rng::Rng;

/// Tube radius range in micrometers.
const RADIUS_MIN: f64 = 2.0;
const RADIUS_MAX: f64 = 8.0;
/// Step of the curve random walk in micrometers.
const WALK_STEP: f64 = 1.0;

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

/// A vessel: a polyline through the field of view with a radius and brightness per vertex.
pub(super) struct Tube {
    points: Vec<[f64; 3]>,
    radii: Vec<f64>,
    amplitude: f64,
}

impl Tube {
    /// A smooth random curve through a random point of the field of view, walked both ways until
    /// it leaves the field of view. All lengths are in micrometers.
    pub(super) fn random(grid: &Grid, rng: &mut Rng) -> Tube {
        let u = rng.uniform();
        // Mostly capillary-sized, sometimes larger vessels.
        let r0 = RADIUS_MIN + (RADIUS_MAX - RADIUS_MIN) * u * u;
        let amplitude = rng.range_f64(220.0, 380.0);
        // Persistence length of the direction random walk: how straight the vessel runs.
        let persistence = rng.range_f64(60.0, 250.0);
        let kick = (WALK_STEP / persistence).sqrt();
        // Vertices every `emit_every` walk steps: about one radius apart, which keeps the
        // rasterization bounding boxes tight while the capsules still join smoothly.
        let emit_every = (r0.clamp(2.0, 6.0) / WALK_STEP).round().max(1.0) as usize;

        let start = [0, 1, 2].map(|a| {
            let (lo, hi) = grid.bounds(a);
            rng.range_f64(lo, hi)
        });
        let dir0 = rng.unit_vector();
        let diag = (0..3)
            .map(|a| (grid.n[a] as f64 * grid.sp[a]).powi(2))
            .sum::<f64>()
            .sqrt();
        let max_len = 3.0 * diag + 10.0 * RADIUS_MAX;
        let margin = 1.5 * RADIUS_MAX;

        let walk = |dir: [f64; 3], rng: &mut Rng| -> Vec<([f64; 3], f64)> {
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
                r = r.clamp((0.8 * r0).max(RADIUS_MIN), (1.2 * r0).min(RADIUS_MAX));
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
        };
        let forward = walk(dir0, rng);
        let backward = walk([-dir0[0], -dir0[1], -dir0[2]], rng);

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

fn dist(a: [f64; 3], b: [f64; 3]) -> f64 {
    let d = [b[0] - a[0], b[1] - a[1], b[2] - a[2]];
    dot(d, d).sqrt()
}

pub(super) fn normalize(v: [f64; 3]) -> Option<[f64; 3]> {
    let n = dot(v, v).sqrt();
    (n > 1e-12).then(|| [v[0] / n, v[1] / n, v[2] / n])
}
