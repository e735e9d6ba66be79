//! Maps without rotation or deformation (scaling alone, nnU-Net's most common spatial
//! transform after none): each axis's source coordinate depends on that axis's patch index
//! alone, so the trilinear interpolation of the general loop factors into three passes, x
//! then y then z, each over whole rows with fractions from a per-axis table. They are the
//! same lerps in the same order on the same values, so the same bits as the general loop
//! (tested), at a fraction of its work: no coordinates or cells per voxel, no gathers past
//! the x pass. Labels keep the general rule (majority of the weighed neighbours) with cells
//! from the same tables.

use super::label::LabelBox;

/// One axis of the patch: per patch index, whether its coordinate lies inside the box's
/// interpolation range, its lower neighbour in the box and the fraction past it (f64 for the
/// label's weights, f32 for the lerps, rounded as the general loop rounds them).
#[derive(Default)]
pub(super) struct Axis {
    inside: Vec<bool>,
    lower: Vec<usize>,
    frac: Vec<f64>,
    frac32: Vec<f32>,
}

impl Axis {
    /// The table of coordinates `coords` on an axis of `side` box voxels (the rule of
    /// [`super::sample::cell`], axis by axis; indices of coordinates outside are 0).
    fn fill(&mut self, coords: impl Iterator<Item = f64>, side: usize) {
        self.inside.clear();
        self.lower.clear();
        self.frac.clear();
        self.frac32.clear();
        for c in coords {
            let inside = c >= 0.0 && c < (side - 1) as f64;
            let i = if inside { c as usize } else { 0 };
            let f = if inside { c - i as f64 } else { 0.0 };
            self.inside.push(inside);
            self.lower.push(i);
            self.frac.push(f);
            self.frac32.push(f as f32);
        }
    }

    /// The range of lower neighbours of the coordinates inside, and the first index past
    /// their upper neighbours, or past the lower ones when `lower_only` (`None` when no
    /// coordinate is inside).
    fn reach(&self, lower_only: bool) -> Option<(usize, usize)> {
        let mut it = self
            .inside
            .iter()
            .zip(&self.lower)
            .filter(|(&i, _)| i)
            .map(|(_, &l)| l);
        let first = it.next()?;
        let (lo, hi) = it.fold((first, first), |(a, b), l| (a.min(l), b.max(l)));
        Some((lo, hi + if lower_only { 1 } else { 2 }))
    }
}

/// Working memory of [`Separable::sample`], kept by the reader between patches.
#[derive(Default)]
pub(super) struct Separable {
    axes: [Axis; 3],
    /// One box plane's rows interpolated along x (box rows x patch columns).
    along_x: Vec<f32>,
    /// The box planes in reach, each interpolated along x and y (patch rows x columns).
    along_xy: Vec<f32>,
    /// The label's rows of 8 (vector builds): per block of 8 patch columns, their lower x
    /// neighbours in the box (0 outside) and the bits of those inside.
    x_blocks: Vec<([i32; 8], u32)>,
    /// A patch row's mixed lanes, per block of 8 (vector builds).
    #[cfg(target_arch = "x86_64")]
    mixed: Vec<u32>,
}

/// The x pass of one box row: each patch column's lerp between its two neighbours.
#[inline(always)]
fn x_row(row: &[f32], dst: &mut [f32], lower: &[usize], frac: &[f32]) {
    for ((d, &i), &f) in dst.iter_mut().zip(lower).zip(frac) {
        *d = lerp(row[i], row[i + 1], f);
    }
}

/// `a + (b - a) * t`: the general loop's lerp.
#[inline(always)]
fn lerp(a: f32, b: f32, t: f32) -> f32 {
    a + (b - a) * t
}

impl Separable {
    /// Fill the tables from each axis's coordinates (`coords[a]`: patch index to source
    /// coordinate relative to a box of sides `bs`).
    pub(super) fn prepare(&mut self, coords: [Vec<f64>; 3], bs: [usize; 3]) {
        for (a, c) in coords.into_iter().enumerate() {
            self.axes[a].fill(c.into_iter(), bs[a]);
        }
    }

    /// Interpolate each channel of `image_box` (`bn` voxels each, sides `bs`) into `image`
    /// (channels x patch of `size`), and the label (when given) from `labels`. `flat`: the z
    /// coordinates are whole planes (in-plane maps), only the lower plane is read, as in the
    /// general loop.
    #[allow(clippy::too_many_arguments)]
    /// `VECTORS`: compiled for AVX2 (the label's rows of 8 gather).
    #[inline(always)]
    pub(super) fn sample<const FLAT_Z: bool, const VECTORS: bool>(
        &mut self,
        image_box: &[f32],
        bs: [usize; 3],
        channels: usize,
        size: [usize; 3],
        image: &mut [f32],
        labels: Option<(&mut LabelBox, &mut [u16])>,
    ) {
        let n: usize = size.iter().product();
        let bn: usize = bs.iter().product();
        let [az, ay, ax] = &self.axes;
        let reach = (az.reach(FLAT_Z), ay.reach(false), ax.reach(false));
        let (Some((z_lo, z_hi)), Some((y_lo, y_hi)), Some(_)) = reach else {
            // No coordinate inside on some axis: every voxel reads 0.
            image.fill(0.0);
            if let Some((_, l)) = labels {
                l.fill(0);
            }
            return;
        };
        let (ny, nx) = (size[1], size[2]);
        let plane = ny * nx;
        let rows = y_hi - y_lo;
        self.along_x.resize(rows * nx, 0.0);
        if !FLAT_Z {
            self.along_xy.resize((z_hi - z_lo) * plane, 0.0);
        }
        for ch in 0..channels {
            let b = &image_box[ch * bn..(ch + 1) * bn];
            let out = &mut image[ch * n..(ch + 1) * n];
            if FLAT_Z {
                // Each patch plane reads one box plane: its y pass writes the plane itself
                // (through a buffer of planes, then copied, it was a tenth of the time).
                for (z, dst) in out.chunks_exact_mut(plane).enumerate() {
                    if !az.inside[z] {
                        dst.fill(0.0);
                        continue;
                    }
                    let rows = &b[(az.lower[z] * bs[1] + y_lo) * bs[2]..];
                    along_x_rows(ax, &mut self.along_x, rows, bs[2]);
                    along_y(ay, &self.along_x, dst, y_lo, nx);
                    zero_outside(dst, &ay.inside, &ax.inside);
                }
                continue;
            }
            for zs in z_lo..z_hi {
                let rows = &b[(zs * bs[1] + y_lo) * bs[2]..];
                along_x_rows(ax, &mut self.along_x, rows, bs[2]);
                let xy = &mut self.along_xy[(zs - z_lo) * plane..][..plane];
                along_y(ay, &self.along_x, xy, y_lo, nx);
            }
            // z: each patch plane from its two planes (in-plane maps: the lower one).
            for (z, dst) in out.chunks_exact_mut(plane).enumerate() {
                if !az.inside[z] {
                    dst.fill(0.0);
                    continue;
                }
                let i = az.lower[z] - z_lo;
                let lo = &self.along_xy[i * plane..][..plane];
                if FLAT_Z {
                    dst.copy_from_slice(lo);
                } else {
                    let hi = &self.along_xy[(i + 1) * plane..][..plane];
                    let f = az.frac32[z];
                    for ((d, &a), &c) in dst.iter_mut().zip(lo).zip(hi) {
                        *d = lerp(a, c, f);
                    }
                }
                zero_outside(dst, &ay.inside, &ax.inside);
            }
        }
        if let Some((labels, l)) = labels {
            let (sy, sz) = (bs[2], bs[1] * bs[2]);
            labels.prepare::<FLAT_Z>(bs);
            // Rows of 8 through the uniform table's gathers where the build has them (box
            // indices in i32 lanes: boxes past that go voxel by voxel).
            #[cfg(target_arch = "x86_64")]
            let by_eight = VECTORS && bn < i32::MAX as usize;
            #[cfg(not(target_arch = "x86_64"))]
            let by_eight = false;
            if by_eight {
                self.x_blocks.clear();
                for x0 in (0..nx).step_by(8) {
                    let mut lower = [0i32; 8];
                    let mut inside = 0u32;
                    for (k, low) in lower.iter_mut().enumerate().take(nx - x0) {
                        if ax.inside[x0 + k] {
                            *low = ax.lower[x0 + k] as i32;
                            inside |= 1 << k;
                        }
                    }
                    self.x_blocks.push((lower, inside));
                }
            }
            for (z, lz) in l.chunks_exact_mut(plane).enumerate() {
                if !az.inside[z] {
                    lz.fill(0);
                    continue;
                }
                for (y, row) in lz.chunks_exact_mut(nx).enumerate() {
                    if !ay.inside[y] {
                        row.fill(0);
                        continue;
                    }
                    let zy = az.lower[z] * sz + ay.lower[y] * sy;
                    let (fz, fy) = (az.frac[z], ay.frac[y]);
                    #[cfg(target_arch = "x86_64")]
                    if by_eight {
                        // The table's answers for the whole row first, then the mixed lanes.
                        self.mixed.clear();
                        for (x0, (lower, inside)) in (0..nx).step_by(8).zip(&self.x_blocks) {
                            let base = lower.map(|i| i + zy as i32);
                            // SAFETY: `VECTORS` builds have AVX2; the table was prepared above.
                            let (vals, mixed) = unsafe { labels.uniform_row8(&base, *inside) };
                            super::put_row(row, x0, &vals, (nx - x0).min(8));
                            self.mixed.push(mixed);
                        }
                        for (x0, &mixed) in (0..nx).step_by(8).zip(&self.mixed) {
                            let mut m = mixed;
                            while m != 0 {
                                let x = x0 + m.trailing_zeros() as usize;
                                m &= m - 1;
                                let f = [fz, fy, ax.frac[x]];
                                // SAFETY: as above.
                                row[x] = unsafe {
                                    labels.weighed_at::<FLAT_Z>(zy + ax.lower[x], sy, sz, f)
                                };
                            }
                        }
                        continue;
                    }
                    for (x, v) in row.iter_mut().enumerate() {
                        *v = if ax.inside[x] {
                            labels.at::<FLAT_Z>(zy + ax.lower[x], sy, sz, [fz, fy, ax.frac[x]])
                        } else {
                            0
                        };
                    }
                }
            }
        }
    }
}

/// The x pass of one box plane: each of its rows in reach (`rows`: from the first of them,
/// `row_len` apart) at the patch's x coordinates (`ax`), into `along_x`.
#[inline(always)]
fn along_x_rows(ax: &Axis, along_x: &mut [f32], rows: &[f32], row_len: usize) {
    let nx = ax.lower.len();
    for (r, dst) in along_x.chunks_exact_mut(nx).enumerate() {
        let row = &rows[r * row_len..][..row_len];
        x_row(row, dst, &ax.lower, &ax.frac32);
    }
}

/// The y pass: each patch row of `plane` from its two rows of `along_x` (whose first is box
/// row `y_lo`) at the coordinates of `ay`.
#[inline(always)]
fn along_y(ay: &Axis, along_x: &[f32], plane: &mut [f32], y_lo: usize, nx: usize) {
    for ((dst, &i), &f) in plane.chunks_exact_mut(nx).zip(&ay.lower).zip(&ay.frac32) {
        let i = i.max(y_lo) - y_lo;
        let (lo, hi) = (&along_x[i * nx..][..nx], &along_x[(i + 1) * nx..][..nx]);
        for ((d, &a), &c) in dst.iter_mut().zip(lo).zip(hi) {
            *d = lerp(a, c, f);
        }
    }
}

/// Zero the voxels of a patch plane whose y or x coordinate lies outside the box's range.
#[inline(always)]
fn zero_outside(plane: &mut [f32], inside_y: &[bool], inside_x: &[bool]) {
    let all_x = inside_x.iter().all(|&i| i);
    for (row, &iy) in plane.chunks_exact_mut(inside_x.len()).zip(inside_y) {
        if !iy {
            row.fill(0.0);
        } else if !all_x {
            for (v, &ix) in row.iter_mut().zip(inside_x) {
                *v = if ix { *v } else { 0.0 };
            }
        }
    }
}

/// [`Separable::sample`] in the widest build `simd` allows (the passes are plain loops the
/// compiler vectorizes: 8 lanes instead of 4).
#[allow(clippy::too_many_arguments)]
pub(super) fn sample_in(
    simd: crate::util::simd::Simd,
    sep: &mut Separable,
    flat: bool,
    image_box: &[f32],
    bs: [usize; 3],
    channels: usize,
    size: [usize; 3],
    image: &mut [f32],
    labels: Option<(&mut LabelBox, &mut [u16])>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::util::simd::Simd;
        #[target_feature(enable = "avx2")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn avx2(
            sep: &mut Separable,
            flat: bool,
            image_box: &[f32],
            bs: [usize; 3],
            channels: usize,
            size: [usize; 3],
            image: &mut [f32],
            labels: Option<(&mut LabelBox, &mut [u16])>,
        ) {
            sep.sample_either::<true>(flat, image_box, bs, channels, size, image, labels);
        }
        // SAFETY: the caller's `simd` is one the CPU runs.
        match simd {
            Simd::Avx2 => {
                return unsafe { avx2(sep, flat, image_box, bs, channels, size, image, labels) }
            }
            Simd::Portable => {}
        }
    }
    let _ = simd;
    sep.sample_either::<false>(flat, image_box, bs, channels, size, image, labels);
}

impl Separable {
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn sample_either<const VECTORS: bool>(
        &mut self,
        flat: bool,
        image_box: &[f32],
        bs: [usize; 3],
        channels: usize,
        size: [usize; 3],
        image: &mut [f32],
        labels: Option<(&mut LabelBox, &mut [u16])>,
    ) {
        if flat {
            self.sample::<true, VECTORS>(image_box, bs, channels, size, image, labels);
        } else {
            self.sample::<false, VECTORS>(image_box, bs, channels, size, image, labels);
        }
    }
}
