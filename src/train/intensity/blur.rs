//! Separable Gaussian blur: z and y passes over whole planes, the x pass over padded lines,
//! symmetric taps summed in blocks held in registers.

use super::scratch::{put_scratch, take_scratch};

/// Separable Gaussian blur with per-axis sigma (voxels), kernels cut at 4 sigma, the edges
/// mirrored (scipy's `gaussian_filter` defaults).
#[inline(always)]
pub fn gaussian_blur(c: &mut [f32], size: [usize; 3], sigma: [f64; 3]) {
    let n: usize = size.iter().product();
    let active = |axis: usize| sigma[axis] > 0.0 && size[axis] >= 2;
    // The volume (the z and y passes write there and back) and one padded line (x pass).
    let pad = size[2] + 2 * (4.0 * sigma[2] + 0.5) as usize + 1;
    let mut buf = take_scratch(n + pad);
    let (tmp, line) = buf.split_at_mut(n);
    // Whether the values are in `tmp` (each plane pass moves them across: no copies).
    let mut in_tmp = false;
    for axis in (0..2).filter(|&a| active(a)) {
        let kernel = gaussian_kernel(sigma[axis]);
        if in_tmp {
            blur_planes(tmp, c, size, axis, &kernel);
        } else {
            blur_planes(c, tmp, size, axis, &kernel);
        }
        in_tmp = !in_tmp;
    }
    if active(2) {
        let from = in_tmp.then_some(&*tmp);
        blur_lines(from, c, line, size[2], &gaussian_kernel(sigma[2]));
    } else if in_tmp {
        c.copy_from_slice(tmp);
    }
    put_scratch(buf);
}

/// The z (`axis` 0) or y (1) pass of [`gaussian_blur`] from `src` into `dst`: whole rows
/// (planes) at a time, contiguous and vectorizable.
#[inline(always)]
fn blur_planes(src: &[f32], dst: &mut [f32], size: [usize; 3], axis: usize, kernel: &[f32]) {
    let len = size[axis];
    let stride: usize = size[axis + 1..].iter().product();
    let r = kernel.len() / 2;
    // Source index of each tap position (-r .. len + r), reflected into the line.
    let source: Vec<usize> = (0..len + 2 * r)
        .map(|p| reflect(p as i64 - r as i64, len))
        .collect();
    // Rows r .. len - r read no mirrored row: tap k of output t is source t + (k - r) rows,
    // so they are one call over consecutive rows (one per row was a call per 128 voxels in
    // the y pass); the 2r rows at the ends one by one.
    let inner = r..len.saturating_sub(r).max(r);
    for (block, src) in dst
        .chunks_exact_mut(len * stride)
        .zip(src.chunks_exact(len * stride))
    {
        if !inner.is_empty() {
            let out = &mut block[inner.start * stride..inner.end * stride];
            taps_into(out, kernel, |k| &src[k * stride..]);
        }
        for i in (0..len).filter(|i| !inner.contains(i)) {
            let out = &mut block[i * stride..][..stride];
            taps_into(out, kernel, |k| &src[source[i + k] * stride..]);
        }
    }
}
/// The x pass of [`gaussian_blur`]: each line of `len` from `src` (or with `None`, from
/// `dst` itself) padded by reflection into `pad`, then the taps summed over it into `dst`'s
/// line. The line's own values copied whole, only the 2r mirrored ends one by one (a copy
/// through an index table, voxel by voxel, was most of this pass).
#[inline(always)]
fn blur_lines(src: Option<&[f32]>, dst: &mut [f32], pad: &mut [f32], len: usize, kernel: &[f32]) {
    let r = kernel.len() / 2;
    let source: Vec<usize> = (0..len + 2 * r)
        .map(|p| reflect(p as i64 - r as i64, len))
        .collect();
    let pad = &mut pad[..len + 2 * r];
    for (i, line) in dst.chunks_exact_mut(len).enumerate() {
        match src {
            Some(s) => pad[r..r + len].copy_from_slice(&s[i * len..][..len]),
            None => pad[r..r + len].copy_from_slice(line),
        }
        for p in (0..r).chain(r + len..len + 2 * r) {
            pad[p] = pad[r + source[p]];
        }
        taps_into(line, kernel, |k| &pad[k..]);
    }
}

/// The most taps [`taps_into`] holds its rows for at once: a kernel of sigma up to 8 (the
/// configuration's limit) cut at 4 sigma.
const MAX_TAPS: usize = 65;

/// `out[t] = sum over k of kernel[k] * row(k)[t]` for a symmetric kernel of odd length
/// 2r + 1, as `kernel[r] * row(r)[t]` plus, for j from 1 to r in turn,
/// `kernel[r + j] * (row(r - j)[t] + row(r + j)[t])` (each pair of taps the kernel weighs
/// alike summed first: r + 1 multiplies where there were 2r + 1). Blocks of 64 outputs are
/// summed in registers over every tap before one store (adding each tap to the whole output
/// instead stored and reloaded the output once per tap); each tap's row is looked up once per
/// call, not once per block.
#[inline(always)]
fn taps_into<'a>(out: &mut [f32], kernel: &[f32], row: impl Fn(usize) -> &'a [f32]) {
    const BLOCK: usize = 64;
    let len = out.len();
    if kernel.len() > MAX_TAPS {
        // Wider than any configuration allows: the same sums, a tap at a time.
        let r = kernel.len() / 2;
        for (o, v) in out.iter_mut().zip(&row(r)[..len]) {
            *o = kernel[r] * v;
        }
        for j in 1..=r {
            let (a, b) = (&row(r - j)[..len], &row(r + j)[..len]);
            for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
                *o += kernel[r + j] * (x + y);
            }
        }
        return;
    }
    // Uninitialized past the kernel's length: setting all 65 entries (a kilobyte) was a
    // third of the x pass, which calls this once per line.
    let mut rows = [std::mem::MaybeUninit::<&[f32]>::uninit(); MAX_TAPS];
    for (k, r) in rows.iter_mut().enumerate().take(kernel.len()) {
        r.write(&row(k)[..len]);
    }
    // SAFETY: the first `kernel.len()` entries were written just above, and
    // `MaybeUninit<T>` has the layout of `T`.
    let rows: &[&[f32]] = unsafe { std::slice::from_raw_parts(rows.as_ptr().cast(), kernel.len()) };
    // Blocks of 64, then one of 32 (rows of 96 are common), then the rest.
    let full = len / BLOCK * BLOCK;
    sum_blocks::<BLOCK>(&mut out[..full], 0, kernel, rows);
    let half = full + (len - full) / (BLOCK / 2) * (BLOCK / 2);
    sum_blocks::<{ BLOCK / 2 }>(&mut out[full..half], full, kernel, rows);
    let r = kernel.len() / 2;
    let rest = &mut out[half..];
    for (o, v) in rest.iter_mut().zip(&rows[r][half..]) {
        *o = kernel[r] * v;
    }
    for j in 1..=r {
        let (a, b) = (&rows[r - j][half..], &rows[r + j][half..]);
        for ((o, x), y) in rest.iter_mut().zip(a).zip(b) {
            *o += kernel[r + j] * (x + y);
        }
    }
}

/// [`taps_into`]'s blocks of `B` outputs (`out` starts at output `from`; its length a
/// multiple of `B`), each summed in registers over every tap.
#[inline(always)]
fn sum_blocks<const B: usize>(out: &mut [f32], from: usize, kernel: &[f32], rows: &[&[f32]]) {
    let r = kernel.len() / 2;
    for (b, o) in out.chunks_exact_mut(B).enumerate() {
        let at = from + b * B;
        let mut acc = [0f32; B];
        let centre = &rows[r][at..][..B];
        for t in 0..B {
            acc[t] = kernel[r] * centre[t];
        }
        for j in 1..=r {
            let (x, y, w) = (
                &rows[r - j][at..][..B],
                &rows[r + j][at..][..B],
                kernel[r + j],
            );
            for t in 0..B {
                acc[t] += w * (x[t] + y[t]);
            }
        }
        o.copy_from_slice(&acc);
    }
}

/// Position `p` of a line of `n` mirrored into it (d c b a | a b c d | d c b a).
pub(super) fn reflect(mut p: i64, n: usize) -> usize {
    let n = n as i64;
    loop {
        if p < 0 {
            p = -p - 1;
        } else if p >= n {
            p = 2 * n - p - 1;
        } else {
            return p as usize;
        }
    }
}

/// Symmetric bit for bit (`x` and `-x` give the same square), as [`taps_into`] needs.
pub(super) fn gaussian_kernel(sigma: f64) -> Vec<f32> {
    let r = (4.0 * sigma + 0.5) as i64;
    let w: Vec<f64> = (-r..=r)
        .map(|x| (-0.5 * (x as f64 / sigma).powi(2)).exp())
        .collect();
    let s: f64 = w.iter().sum();
    w.iter().map(|v| (v / s) as f32).collect()
}
