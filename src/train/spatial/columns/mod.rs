//! In-plane maps without deformation through the box turned on its side. Every patch plane of
//! such a map samples the same (y, x) coordinates in its own box plane, so a patch voxel's
//! four neighbours are the same four box columns in every plane. With the box's planes
//! innermost (each column's planes contiguous), one patch column's lerps are four vector
//! loads and six operations per 8 planes, its fractions broadcast, where the plane-by-plane
//! loop gathers four scalar pairs per voxel. Patch rows of 8 columns are turned back to planes
//! by 8x8 transposes in registers; the box is turned on its side the same way.
//!
//! The same operations in the same order as the scalar path (`trilinear` with a zero z
//! fraction; labels equal where the four neighbours agree, weighed as there where they do
//! not), so the same bits.
//!
//! Files: this one (the image's lerps, the skeleton's nearest voxel), `label` (the label's
//! majority over columns), `turn` (planes to columns and back by transposes in registers).

use std::arch::x86_64::*;

mod label;
#[cfg(test)]
mod tests;
mod turn;

use super::first_n;
use super::gather::PlaneRow;
use label::{label_rows, Bytes, Wide};
use turn::{columns, put_block, transpose_f32, transpose_u16};

/// A box's planes as columns (`lanes` planes, padded to a multiple of 8), kept between
/// patches.
#[derive(Default)]
pub(super) struct Columns {
    image: Vec<f32>,
    label: Vec<u16>,
    /// Byte labels' columns (16 planes a vector).
    bytes: Vec<u8>,
    /// Each column lane's patch plane as an offset into a patch (`z * plane`).
    offsets: Vec<usize>,
}

/// What one in-plane patch reads: its rows' cells at box plane 0 (y, then rows of 8 along x),
/// and for each column lane k the patch plane it fills (the box plane `lo + k`).
pub(super) struct Job<'a> {
    pub rows: &'a [PlaneRow],
    /// The rows' y and x fractions in f64 (the label's weights).
    pub frac: &'a [[[f64; 8]; 2]],
    pub lo: usize,
    pub planes: &'a [usize],
    /// The x range of each box row that the rows' cells read (the rest of the box may hold
    /// anything).
    pub spans: &'a [(u32, u32)],
    pub size: [usize; 3],
    pub bs: [usize; 3],
    pub channels: usize,
}

impl Job<'_> {
    /// Column lanes, a multiple of 8.
    fn lanes(&self) -> usize {
        self.planes.len().div_ceil(8) * 8
    }
}

/// The planes' labels, widened to u16 (a label box's elements, one plane after another from
/// `lo`).
pub(super) enum LabelPlanes<'a> {
    Bytes(&'a [u8]),
    Wide(&'a [u16]),
}

impl Columns {
    /// Fill each channel of `image` (and `label`) for the patch planes of `job`; planes
    /// outside are the caller's.
    ///
    /// # Safety
    /// The CPU must have AVX2; each row's cells must lie in the box (inside lanes at most
    /// one voxel before its y and x ends, the others at 0), `lo + planes.len() <= bs[0]`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) unsafe fn sample(
        &mut self,
        job: &Job,
        image_box: &[f32],
        image: &mut [f32],
        label: Option<(LabelPlanes, &mut [u16])>,
    ) {
        let [_, by, bx] = job.bs;
        let p_len = by * bx;
        let bn = job.bs[0] * p_len;
        let lanes = job.lanes();
        let k = job.planes.len();
        let n: usize = job.size.iter().product();
        assert!(k > 0 && job.lo + k <= job.bs[0] && image_box.len() >= job.channels * bn);
        assert!(image.len() >= job.channels * n);
        let plane = job.size[1] * job.size[2];
        assert!(job.planes.iter().all(|&z| z < job.size[0]));
        self.offsets.clear();
        self.offsets.extend(job.planes.iter().map(|&z| z * plane));
        let cols = first_n_lines(&mut self.image, p_len * lanes);
        for ch in 0..job.channels {
            let planes = &image_box[ch * bn + job.lo * p_len..][..k * p_len];
            columns(planes, p_len, k, lanes, job.spans, bx, cols);
            let out = &mut image[ch * n..][..n];
            lerp_rows(job, &self.offsets, cols, out);
        }
        if let Some((planes, out)) = label {
            assert!(out.len() >= n);
            match planes {
                LabelPlanes::Bytes(b) => {
                    // Columns of 16 planes a vector: half the work of widened ones.
                    let lanes = k.div_ceil(16) * 16;
                    let cols = first_n(&mut self.bytes, p_len * lanes);
                    let planes = &b[job.lo * p_len..][..k * p_len];
                    columns(planes, p_len, k, lanes, job.spans, bx, cols);
                    label_rows::<Bytes>(job, lanes, &self.offsets, cols, &mut out[..n]);
                }
                LabelPlanes::Wide(w) => {
                    let cols = first_n(&mut self.label, p_len * lanes);
                    let planes = &w[job.lo * p_len..][..k * p_len];
                    columns(planes, p_len, k, lanes, job.spans, bx, cols);
                    label_rows::<Wide>(job, lanes, &self.offsets, cols, &mut out[..n]);
                }
            }
        }
    }
}

impl Columns {
    /// The nearest voxel's value of `planes` (u16, a box's planes one after another from
    /// `lo`, as the label's) for each patch voxel of `job`'s rows (the skeleton of
    /// [`super::TransformedReader::read_derived`]): per patch column the box column of the
    /// cell's corner nearer along y and x (fractions at 0.5 and up go up, as there), the same
    /// in every plane; lanes outside the box read 0.
    ///
    /// # Safety
    /// As for [`Columns::sample`].
    #[inline(always)]
    pub(super) unsafe fn nearest(&mut self, job: &Job, planes: &[u16], out: &mut [u16]) {
        let [_, by, bx] = job.bs;
        let p_len = by * bx;
        let k = job.planes.len();
        let lanes = job.lanes();
        let n: usize = job.size.iter().product();
        assert!(k > 0 && job.lo + k <= job.bs[0] && planes.len() >= job.bs[0] * p_len);
        assert!(out.len() >= n && job.planes.iter().all(|&z| z < job.size[0]));
        let plane = job.size[1] * job.size[2];
        self.offsets.clear();
        self.offsets.extend(job.planes.iter().map(|&z| z * plane));
        let cols = first_n(&mut self.label, p_len * lanes);
        let planes = &planes[job.lo * p_len..][..k * p_len];
        columns(planes, p_len, k, lanes, job.spans, bx, cols);
        let c = cols.as_ptr();
        for (r, row) in job.rows.iter().enumerate() {
            let (at, w) = row_at(job, r);
            let [fy, fx] = &job.frac[r];
            let cell: [usize; 8] = std::array::from_fn(|j| {
                row.base[j] as usize + usize::from(fx[j] >= 0.5) + if fy[j] >= 0.5 { bx } else { 0 }
            });
            for kb in (0..lanes).step_by(8) {
                let col: [__m128i; 8] = std::array::from_fn(|j| {
                    if row.inside & (1 << j) != 0 {
                        // SAFETY: an inside lane's cell and its +x, +y neighbours are
                        // columns of the box (the caller's), each `lanes` long.
                        _mm_loadu_si128(c.add(cell[j] * lanes + kb).cast())
                    } else {
                        _mm_setzero_si128()
                    }
                });
                let t = transpose_u16(col);
                put_block(&t, &self.offsets, kb, out, at, w, |p, v| {
                    _mm_storeu_si128(p.cast(), v)
                });
            }
        }
    }
}

/// The first `n` values of `buf` from a 64-byte boundary on (grown as needed): a column of 16
/// floats is then one cache line, where a buffer 16 bytes off (as the allocator hands out
/// large ones) split every column's load and store across two (rotated 16x128x128 patches
/// +2%, within this host's noise but in every round).
fn first_n_lines(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    const PER_LINE: usize = 16;
    if buf.len() < n + PER_LINE {
        buf.resize(n + PER_LINE, 0.0);
    }
    let skip = buf.as_ptr().align_offset(64).min(PER_LINE);
    &mut buf[skip..skip + n]
}

/// Where row `r` of the job's rows writes in a patch plane, and its length (the last row of
/// 8 along x may be shorter).
#[inline(always)]
fn row_at(job: &Job, r: usize) -> (usize, usize) {
    let per_y = job.size[2].div_ceil(8);
    let (y, tx) = (r / per_y, r % per_y * 8);
    (y * job.size[2] + tx, (job.size[2] - tx).min(8))
}

/// `a + (b - a) * t`, lane by lane (the scalar path's lerp).
#[inline(always)]
unsafe fn lerp(a: __m256, b: __m256, t: __m256) -> __m256 {
    _mm256_add_ps(a, _mm256_mul_ps(_mm256_sub_ps(b, a), t))
}

/// The image's rows: per row of 8 patch columns and 8 planes, each column's lerps over the
/// planes, then the 8x8 block turned back to 8 planes' rows.
#[inline(never)]
#[target_feature(enable = "avx2")]
unsafe fn lerp_rows(job: &Job, offsets: &[usize], cols: &[f32], out: &mut [f32]) {
    let lanes = job.lanes();
    let sy = job.bs[2] * lanes;
    let c = cols.as_ptr();
    for (r, row) in job.rows.iter().enumerate() {
        let (at, w) = row_at(job, r);
        let mut fy = [0f32; 8];
        let mut fx = [0f32; 8];
        _mm256_storeu_ps(fy.as_mut_ptr(), row.fy);
        _mm256_storeu_ps(fx.as_mut_ptr(), row.fx);
        let inside: [__m256; 8] = std::array::from_fn(|j| {
            _mm256_castsi256_ps(_mm256_set1_epi32(-i32::from(row.inside & (1 << j) != 0)))
        });
        for kb in (0..lanes).step_by(8) {
            let mut col = [_mm256_setzero_ps(); 8];
            for (j, v) in col.iter_mut().enumerate() {
                // SAFETY: each lane's column (an inside cell's, or column 0 for lanes
                // outside) and its +x, +y, +x+y neighbours are columns of the box (the
                // caller's), each `lanes` long.
                let p = c.add(row.base[j] as usize * lanes + kb);
                let (tx, ty) = (_mm256_set1_ps(fx[j]), _mm256_set1_ps(fy[j]));
                let top = lerp(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(lanes)), tx);
                let bottom = lerp(
                    _mm256_loadu_ps(p.add(sy)),
                    _mm256_loadu_ps(p.add(sy + lanes)),
                    tx,
                );
                *v = _mm256_and_ps(lerp(top, bottom, ty), inside[j]);
            }
            let t = transpose_f32(col);
            put_block(&t, offsets, kb, out, at, w, |p, v| _mm256_storeu_ps(p, v));
        }
    }
}
