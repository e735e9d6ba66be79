//! Exact Euclidean distance transforms with per-axis spacing: the label-derived arrays of the
//! topology and boundary losses (issue 13) start here.
//!
//! Felzenszwalb and Huttenlocher's transform is separable: squared distances are computed one
//! axis at a time, each line on its own by the lower envelope of parabolas `f(q) + w (p - q)^2`
//! (`w` the squared spacing of that axis), in time linear in the line's length. A pass needs
//! whole lines along its axis and nothing else, so a volume can be transformed a pencil of
//! chunks at a time ([`transform_axis`] over any (z, y, x) block holding whole lines of that
//! axis); [`distance_to`] and [`signed_distance`] do a whole block.
//!
//! The results are scipy's `distance_transform_edt(..., sampling=spacing)`: the distance between
//! voxel centres in physical units to the nearest feature voxel (tests compare with a brute-force
//! search).

/// Squared distances of a line after one pass: `out[p] = min_q f[q] + w (p - q)^2` over the
/// `q` with finite `f[q]`; infinite where there is none. `v` and `z` are scratch buffers.
pub fn lower_envelope(f: &[f64], w: f64, out: &mut [f64], v: &mut Vec<usize>, z: &mut Vec<f64>) {
    v.clear();
    z.clear();
    for (q, &fq) in f.iter().enumerate() {
        if !fq.is_finite() {
            continue;
        }
        // Drop parabolas that the new one hides everywhere to the right of their start.
        let mut s;
        loop {
            let Some(&last) = v.last() else {
                s = f64::NEG_INFINITY;
                break;
            };
            let (qf, lf) = (q as f64, last as f64);
            s = ((fq + w * qf * qf) - (f[last] + w * lf * lf)) / (2.0 * w * (qf - lf));
            if s <= *z.last().unwrap_or(&f64::NEG_INFINITY) {
                v.pop();
                z.pop();
            } else {
                break;
            }
        }
        v.push(q);
        z.push(s);
    }
    if v.is_empty() {
        out.iter_mut().for_each(|o| *o = f64::INFINITY);
        return;
    }
    let mut k = 0;
    for (p, o) in out.iter_mut().enumerate() {
        let pf = p as f64;
        while k + 1 < v.len() && z[k + 1] < pf {
            k += 1;
        }
        let d = pf - v[k] as f64;
        *o = f[v[k]] + w * d * d;
    }
}

/// Lines gathered at once by [`transform_axis`] along a strided axis: neighbouring lines are
/// neighbours in memory, so each step along the axis reads one run of them instead of one
/// value per cache line.
const LINES: usize = 16;

/// One pass of the transform over a (z, y, x) block of squared distances, along `axis`
/// (0 = z, 1 = y, 2 = x) with that axis's `spacing`, in place. The block must hold whole lines
/// of that axis.
pub fn transform_axis(d: &mut [f64], shape: [usize; 3], axis: usize, spacing: f64) {
    let len = shape[axis];
    if len == 0 {
        return;
    }
    let stride: usize = shape[axis + 1..].iter().product();
    let w = spacing * spacing;
    let group = LINES.min(stride.max(1));
    // `lines` holds `group` lines one after the other.
    let (mut lines, mut out) = (vec![0f64; len * group], vec![0f64; len]);
    let (mut v, mut z) = (Vec::with_capacity(len), Vec::with_capacity(len));
    for block in d.chunks_exact_mut(len * stride) {
        for i0 in (0..stride).step_by(group) {
            let g = group.min(stride - i0);
            for k in 0..len {
                let row = &block[k * stride + i0..k * stride + i0 + g];
                for (j, &x) in row.iter().enumerate() {
                    lines[j * len + k] = x;
                }
            }
            for j in 0..g {
                let line = &mut lines[j * len..(j + 1) * len];
                lower_envelope(line, w, &mut out, &mut v, &mut z);
                line.copy_from_slice(&out);
            }
            for k in 0..len {
                let row = &mut block[k * stride + i0..k * stride + i0 + g];
                for (j, x) in row.iter_mut().enumerate() {
                    *x = lines[j * len + k];
                }
            }
        }
    }
}

/// The first pass along x straight from the feature mask: the squared distance to the
/// nearest feature of the line, `w (p - q)^2`, by one sweep each way (what the lower envelope
/// computes from zeros and infinities, to the bit, in a fraction of its time).
fn first_pass_x(feature: &[bool], len: usize, w: f64) -> Vec<f64> {
    let mut d = vec![f64::INFINITY; feature.len()];
    for (f, o) in feature.chunks_exact(len).zip(d.chunks_exact_mut(len)) {
        let mut last: Option<usize> = None;
        for (p, (&is, o)) in f.iter().zip(o.iter_mut()).enumerate() {
            if is {
                last = Some(p);
            }
            if let Some(q) = last {
                let t = (p - q) as f64;
                *o = w * t * t;
            }
        }
        let mut next: Option<usize> = None;
        for p in (0..len).rev() {
            if f[p] {
                next = Some(p);
            }
            if let Some(q) = next {
                let t = (q - p) as f64;
                o[p] = o[p].min(w * t * t);
            }
        }
    }
    d
}

/// Distance from every voxel of a (z, y, x) block to the nearest voxel where `feature` is true,
/// with per-axis spacing (z, y, x); infinite everywhere when no voxel is a feature. scipy's
/// `distance_transform_edt(~feature, sampling=spacing)`.
pub fn distance_to(feature: &[bool], shape: [usize; 3], spacing_zyx: [f64; 3]) -> Vec<f64> {
    let mut d = squared_distance_to(feature, shape, spacing_zyx);
    d.iter_mut().for_each(|v| *v = v.sqrt());
    d
}

/// [`distance_to`] squared (no square root taken).
pub fn squared_distance_to(feature: &[bool], shape: [usize; 3], spacing_zyx: [f64; 3]) -> Vec<f64> {
    if shape[2] == 0 || feature.is_empty() {
        return vec![f64::INFINITY; feature.len()];
    }
    let w = spacing_zyx[2] * spacing_zyx[2];
    let mut d = first_pass_x(feature, shape[2], w);
    for axis in [1, 0] {
        transform_axis(&mut d, shape, axis, spacing_zyx[axis]);
    }
    d
}

/// Signed distance map of one class (the boundary loss's `phi`): outside the class, the
/// distance to its nearest voxel; inside, minus the distance to the nearest voxel outside it.
/// A class absent from the block, or filling it, gives 0 everywhere (nothing to measure from,
/// as in Kervadec et al.'s code).
pub fn signed_distance(inside: &[bool], shape: [usize; 3], spacing_zyx: [f64; 3]) -> Vec<f32> {
    let any_in = inside.iter().any(|&b| b);
    let any_out = inside.iter().any(|&b| !b);
    if !(any_in && any_out) {
        return vec![0.0; inside.len()];
    }
    let outside: Vec<bool> = inside.iter().map(|&b| !b).collect();
    let (to_inside, to_outside) = rayon::join(
        || distance_to(inside, shape, spacing_zyx),
        || distance_to(&outside, shape, spacing_zyx),
    );
    inside
        .iter()
        .zip(to_inside.iter().zip(&to_outside))
        .map(|(&i, (&a, &b))| if i { -b as f32 } else { a as f32 })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every voxel against every feature voxel.
    fn brute(feature: &[bool], shape: [usize; 3], sp: [f64; 3]) -> Vec<f64> {
        let idx = |i: usize| {
            [
                i / (shape[1] * shape[2]),
                (i / shape[2]) % shape[1],
                i % shape[2],
            ]
        };
        let feats: Vec<[usize; 3]> = (0..feature.len())
            .filter(|&i| feature[i])
            .map(idx)
            .collect();
        (0..feature.len())
            .map(|i| {
                let p = idx(i);
                feats
                    .iter()
                    .map(|q| {
                        (0..3)
                            .map(|a| {
                                let d = (p[a] as f64 - q[a] as f64) * sp[a];
                                d * d
                            })
                            .sum::<f64>()
                    })
                    .fold(f64::INFINITY, f64::min)
                    .sqrt()
            })
            .collect()
    }

    fn random_mask(n: usize, density: u64, seed: u64) -> Vec<bool> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s % 100 < density
            })
            .collect()
    }

    #[test]
    fn equals_brute_force_on_random_masks_with_anisotropic_spacing() {
        for (k, (shape, sp, density)) in [
            ([6, 7, 9], [1.0, 1.0, 1.0], 5),
            ([5, 11, 8], [2.9, 0.99, 0.99], 3),
            ([1, 13, 17], [4.0, 0.31, 0.5], 10),
            ([9, 4, 3], [0.7, 1.3, 2.2], 30),
            ([4, 6, 5], [1.0, 1.0, 1.0], 1),
        ]
        .into_iter()
        .enumerate()
        {
            let n: usize = shape.iter().product();
            let m = random_mask(n, density, k as u64 + 1);
            let got = distance_to(&m, shape, sp);
            let want = brute(&m, shape, sp);
            for i in 0..n {
                let (a, b) = (got[i], want[i]);
                assert!(
                    a == b || (a - b).abs() <= 1e-12 * b.max(1.0),
                    "case {k} voxel {i}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn empty_and_full_masks() {
        let shape = [3, 4, 5];
        let none = distance_to(&[false; 60], shape, [1.0; 3]);
        assert!(none.iter().all(|v| v.is_infinite()));
        let all = distance_to(&[true; 60], shape, [1.0; 3]);
        assert!(all.iter().all(|&v| v == 0.0));
        assert!(signed_distance(&[false; 60], shape, [1.0; 3])
            .iter()
            .all(|&v| v == 0.0));
        assert!(signed_distance(&[true; 60], shape, [1.0; 3])
            .iter()
            .all(|&v| v == 0.0));
    }

    #[test]
    fn signed_distance_is_negative_inside_and_positive_outside() {
        // A slab of x = 3..6 in a 1x1x10 line at spacing 0.5.
        let inside: Vec<bool> = (0..10).map(|x| (3..6).contains(&x)).collect();
        let d = signed_distance(&inside, [1, 1, 10], [1.0, 1.0, 0.5]);
        let want = [1.5, 1.0, 0.5, -0.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0];
        for (a, b) in d.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{d:?}");
        }
    }

    #[test]
    fn passes_work_on_blocks_of_whole_lines() {
        // Transforming z over two halves of the (y, x) plane separately equals the whole.
        let shape = [7, 6, 5];
        let n: usize = shape.iter().product();
        let m = random_mask(n, 8, 9);
        let init: Vec<f64> = m
            .iter()
            .map(|&f| if f { 0.0 } else { f64::INFINITY })
            .collect();
        let mut whole = init.clone();
        transform_axis(&mut whole, shape, 0, 1.7);
        // Split along y: each half holds whole z lines.
        for (y0, y1) in [(0, 3), (3, 6)] {
            let mut part: Vec<f64> = Vec::new();
            for z in 0..7 {
                for y in y0..y1 {
                    part.extend_from_slice(&init[(z * 6 + y) * 5..(z * 6 + y + 1) * 5]);
                }
            }
            transform_axis(&mut part, [7, y1 - y0, 5], 0, 1.7);
            for z in 0..7 {
                for y in y0..y1 {
                    for x in 0..5 {
                        let a = part[(z * (y1 - y0) + y - y0) * 5 + x];
                        let b = whole[(z * 6 + y) * 5 + x];
                        assert!(a == b || (a.is_infinite() && b.is_infinite()));
                    }
                }
            }
        }
    }
}
