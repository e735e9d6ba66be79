//! Which source voxels a transformed patch reads: the box around its coordinates cut to the
//! volume ([`needed_box`]), and within it the x range of each box row that its cells read
//! (in-plane maps from the patch plane's corners, 3D maps through the inverse matrix), so
//! that rotations bring in only their footprint.

use crate::error::{Error, Result};

use super::sample::Cell;
use super::transform::Transform;

/// The x range (start, end) of each row of a box of sides `bs` that an in-plane map's cells
/// read, into `spans`: a cell at (y, x) reads x and x + 1 of rows y and y + 1, so row Y
/// serves the coordinates with y in [Y - 1, Y + 1), whose x range is that of the patch
/// plane's parallelogram (`corners`, (y, x) in box coordinates, in order around it) within
/// that band. Widened by a voxel each way against rounding (the cells' coordinates are
/// computed by another sum), cut to the box; (0, 0) for rows no cell reads.
#[cfg(target_arch = "x86_64")]
pub(super) fn footprint_spans(corners: [[f64; 2]; 4], bs: [usize; 3], spans: &mut Vec<(u32, u32)>) {
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
pub(super) fn footprint_spans_3d(
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

/// The box of source voxels a transformed patch needs: [`Transform::source_box`] cut at one
/// voxel beyond the volume on each side (past it every neighbour reads 0, which
/// [`super::sample::cell`] answers without a box), so the box, its memory and its
/// zero-filling never exceed the volume plus a border whatever the rotation and scale.
/// `None`: nothing of the volume is within reach. An error for a box too large to index
/// (2^32 voxels or more).
pub(super) fn needed_box(
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
