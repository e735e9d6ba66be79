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

use std::arch::x86_64::*;

use super::first_n;
use super::gather::PlaneRow;
use super::label::weighed4;

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
    /// Whether the CPU has AVX-512 (F, VL, DQ) and the reader takes it: the image's lerps
    /// then run 16 planes a vector where the columns hold a multiple of 16.
    pub w512: bool,
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
            if job.w512 && lanes.is_multiple_of(16) {
                lerp_rows_avx512(job, &self.offsets, cols, out);
            } else {
                lerp_rows(job, &self.offsets, cols, out);
            }
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

/// [`lerp_rows`] 16 planes a vector (the same operations lane by lane), each block turned
/// back as two of 8.
///
/// # Safety
/// As for [`lerp_rows`], and the CPU must have AVX-512 F, VL and DQ; the columns hold a
/// multiple of 16 planes.
#[inline(never)]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512dq")]
unsafe fn lerp_rows_avx512(job: &Job, offsets: &[usize], cols: &[f32], out: &mut [f32]) {
    let lanes = job.lanes();
    debug_assert!(lanes.is_multiple_of(16));
    let sy = job.bs[2] * lanes;
    let c = cols.as_ptr();
    let lerp16 =
        |a: __m512, b: __m512, t: __m512| _mm512_add_ps(a, _mm512_mul_ps(_mm512_sub_ps(b, a), t));
    for (r, row) in job.rows.iter().enumerate() {
        let (at, w) = row_at(job, r);
        let mut fy = [0f32; 8];
        let mut fx = [0f32; 8];
        _mm256_storeu_ps(fy.as_mut_ptr(), row.fy);
        _mm256_storeu_ps(fx.as_mut_ptr(), row.fx);
        for kb in (0..lanes).step_by(16) {
            let mut col = [_mm512_setzero_ps(); 8];
            for (j, v) in col.iter_mut().enumerate() {
                // SAFETY: as in `lerp_rows`.
                let p = c.add(row.base[j] as usize * lanes + kb);
                let (tx, ty) = (_mm512_set1_ps(fx[j]), _mm512_set1_ps(fy[j]));
                let top = lerp16(_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(lanes)), tx);
                let bottom = lerp16(
                    _mm512_loadu_ps(p.add(sy)),
                    _mm512_loadu_ps(p.add(sy + lanes)),
                    tx,
                );
                *v = _mm512_maskz_mov_ps(
                    if row.inside & (1 << j) != 0 {
                        0xffff
                    } else {
                        0
                    },
                    lerp16(top, bottom, ty),
                );
            }
            let low = transpose_f32(col.map(|v| _mm512_castps512_ps256(v)));
            put_block(&low, offsets, kb, out, at, w, |p, v| _mm256_storeu_ps(p, v));
            let high = transpose_f32(col.map(|v| _mm512_extractf32x8_ps::<1>(v)));
            put_block(&high, offsets, kb + 8, out, at, w, |p, v| {
                _mm256_storeu_ps(p, v)
            });
        }
    }
}

/// A label column's vector lanes: bytes (16 planes a vector) or u16 (8).
trait Lanes {
    /// The columns' element.
    type Elem: Copy + Into<u16>;
    /// Planes a vector.
    const PER: usize;
    unsafe fn eq(a: __m128i, b: __m128i) -> __m128i;
    unsafe fn min(a: __m128i, b: __m128i) -> __m128i;
    unsafe fn splat(v: u8) -> __m128i;
    /// Added to a pattern of lanes 0..8 so that a byte shuffle reads each lane's table entry
    /// (u16 lanes: their upper byte reads 0).
    unsafe fn high() -> __m128i;
    /// Bit i set where lane i of `m` is all ones.
    unsafe fn bits(m: __m128i) -> u32;
    /// Block `kb`'s 8 columns (`col[j]` lane i: plane kb + i) into their patch planes.
    unsafe fn put(
        col: &[__m128i; 8],
        offsets: &[usize],
        kb: usize,
        out: &mut [u16],
        at: usize,
        w: usize,
    );
}

/// Byte labels' lanes.
struct Bytes;

impl Lanes for Bytes {
    type Elem = u8;
    const PER: usize = 16;
    #[inline(always)]
    unsafe fn eq(a: __m128i, b: __m128i) -> __m128i {
        _mm_cmpeq_epi8(a, b)
    }
    #[inline(always)]
    unsafe fn min(a: __m128i, b: __m128i) -> __m128i {
        _mm_min_epu8(a, b)
    }
    #[inline(always)]
    unsafe fn splat(v: u8) -> __m128i {
        _mm_set1_epi8(v as i8)
    }
    #[inline(always)]
    unsafe fn high() -> __m128i {
        _mm_setzero_si128()
    }
    #[inline(always)]
    unsafe fn bits(m: __m128i) -> u32 {
        _mm_movemask_epi8(m) as u32
    }
    /// Widened, as two blocks of 8 planes.
    #[inline(always)]
    unsafe fn put(
        col: &[__m128i; 8],
        offsets: &[usize],
        kb: usize,
        out: &mut [u16],
        at: usize,
        w: usize,
    ) {
        for half in 0..2 {
            let rows =
                col.map(|v| _mm_cvtepu8_epi16(if half == 0 { v } else { _mm_srli_si128::<8>(v) }));
            let t = transpose_u16(rows);
            put_block(&t, offsets, kb + 8 * half, out, at, w, |p, v| {
                _mm_storeu_si128(p.cast(), v)
            });
        }
    }
}

/// Wide (u16) labels' lanes.
struct Wide;

impl Lanes for Wide {
    type Elem = u16;
    const PER: usize = 8;
    #[inline(always)]
    unsafe fn eq(a: __m128i, b: __m128i) -> __m128i {
        _mm_cmpeq_epi16(a, b)
    }
    #[inline(always)]
    unsafe fn min(a: __m128i, b: __m128i) -> __m128i {
        _mm_min_epu16(a, b)
    }
    #[inline(always)]
    unsafe fn splat(v: u8) -> __m128i {
        _mm_set1_epi16(i16::from(v))
    }
    #[inline(always)]
    unsafe fn high() -> __m128i {
        _mm_set1_epi16(0x8000u16 as i16)
    }
    #[inline(always)]
    unsafe fn bits(m: __m128i) -> u32 {
        _mm_movemask_epi8(_mm_packs_epi16(m, _mm_setzero_si128())) as u32
    }
    #[inline(always)]
    unsafe fn put(
        col: &[__m128i; 8],
        offsets: &[usize],
        kb: usize,
        out: &mut [u16],
        at: usize,
        w: usize,
    ) {
        let t = transpose_u16(*col);
        put_block(&t, offsets, kb, out, at, w, |p, v| {
            _mm_storeu_si128(p.cast(), v)
        });
    }
}

/// The label's rows: per row of 8 columns and a vector of planes, first whether every
/// plane's four neighbours agree (most blocks, away from a structure's border: then the
/// value is the first neighbour's); if not, each plane of two values gets the weighed winner
/// from its column's table of outcomes ([`outcome_tables`], computed once per row) in
/// vectors. Each block is turned back to planes' rows, then the rare planes of three or more
/// values are weighed one by one. `lanes`: the columns' length, a multiple of `L::PER`.
#[inline(never)]
#[target_feature(enable = "avx2")]
unsafe fn label_rows<L: Lanes>(
    job: &Job,
    lanes: usize,
    offsets: &[usize],
    cols: &[L::Elem],
    out: &mut [u16],
) {
    let sy = job.bs[2] * lanes;
    let c = cols.as_ptr();
    let (one, two, four) = (L::splat(1), L::splat(2), L::splat(4));
    let ones = _mm_set1_epi8(-1);
    let all = (1u32 << L::PER) - 1;
    for (r, row) in job.rows.iter().enumerate() {
        let (at, w) = row_at(job, r);
        let inside: [__m128i; 8] = std::array::from_fn(|j| {
            if row.inside & (1 << j) != 0 {
                ones
            } else {
                _mm_setzero_si128()
            }
        });
        // SAFETY (of every load): each lane's column (an inside cell's, or column 0 for
        // lanes outside) and its +x, +y, +x+y neighbours are columns of the box (the
        // caller's), each `lanes` long.
        let load = |j: usize, kb: usize, off: usize| {
            _mm_loadu_si128(c.add(row.base[j] as usize * lanes + kb + off).cast())
        };
        let mut tables = None;
        for kb in (0..lanes).step_by(L::PER) {
            let mut col = [_mm_setzero_si128(); 8];
            let mut uniform = ones;
            for (j, v) in col.iter_mut().enumerate() {
                let a = load(j, kb, 0);
                let same = _mm_and_si128(
                    L::eq(a, load(j, kb, lanes)),
                    _mm_and_si128(L::eq(a, load(j, kb, sy)), L::eq(a, load(j, kb, sy + lanes))),
                );
                uniform =
                    _mm_and_si128(uniform, _mm_or_si128(same, _mm_xor_si128(inside[j], ones)));
                *v = _mm_and_si128(a, inside[j]);
            }
            // Bit i of lane j's entry: plane kb + i's neighbours hold three values or more.
            let mut odd = [0u32; 8];
            if _mm_movemask_epi8(uniform) != 0xffff {
                let tables: &[u64; 8] = tables.get_or_insert_with(|| outcome_tables(&job.frac[r]));
                for (j, v) in col.iter_mut().enumerate() {
                    let (a, b) = (load(j, kb, 0), load(j, kb, lanes));
                    let (c, d) = (load(j, kb, sy), load(j, kb, sy + lanes));
                    let (eb, ec, ed) = (L::eq(a, b), L::eq(a, c), L::eq(a, d));
                    // The other value: the last neighbour that differs from the first (as
                    // `mixed_majority` picks it).
                    let other = _mm_blendv_epi8(
                        _mm_blendv_epi8(b, c, _mm_xor_si128(ec, ones)),
                        d,
                        _mm_xor_si128(ed, ones),
                    );
                    let two_values = _mm_and_si128(
                        _mm_or_si128(eb, L::eq(b, other)),
                        _mm_and_si128(
                            _mm_or_si128(ec, L::eq(c, other)),
                            _mm_or_si128(ed, L::eq(d, other)),
                        ),
                    );
                    let pattern = _mm_or_si128(
                        _mm_or_si128(_mm_andnot_si128(eb, one), _mm_andnot_si128(ec, two)),
                        _mm_or_si128(_mm_andnot_si128(ed, four), L::high()),
                    );
                    let outcome = _mm_shuffle_epi8(_mm_cvtsi64_si128(tables[j] as i64), pattern);
                    let won = _mm_blendv_epi8(a, other, L::eq(outcome, one));
                    let won = _mm_blendv_epi8(won, L::min(a, other), L::eq(outcome, two));
                    *v = _mm_and_si128(won, inside[j]);
                    let plain = _mm_or_si128(two_values, _mm_xor_si128(inside[j], ones));
                    odd[j] = !L::bits(plain) & all;
                }
            }
            L::put(&col, offsets, kb, out, at, w);
            for (j, &m) in odd.iter().enumerate().take(w) {
                let mut m = m;
                while m != 0 {
                    let i = m.trailing_zeros() as usize;
                    m &= m - 1;
                    let Some(&o) = offsets.get(kb + i) else {
                        break;
                    };
                    let q = row.base[j] as usize * lanes + kb + i;
                    let v = [cols[q], cols[q + lanes], cols[q + sy], cols[q + sy + lanes]]
                        .map(Into::into);
                    let f = [0.0, job.frac[r][0][j], job.frac[r][1][j]];
                    out[o + at + j] = weighed4(v, f);
                }
            }
        }
    }
}

/// [`super::label`]'s `two_value_outcomes` of each of a row's 8 columns (fractions y, x per lane), byte p of
/// entry j for pattern p, in f64 vectors (the same operations lane by lane, so the same
/// outcomes).
#[inline(always)]
unsafe fn outcome_tables(frac: &[[f64; 8]; 2]) -> [u64; 8] {
    let mut out = [0u64; 8];
    let one = _mm256_set1_pd(1.0);
    for half in 0..2 {
        let fy = _mm256_loadu_pd(frac[0].as_ptr().add(4 * half));
        let fx = _mm256_loadu_pd(frac[1].as_ptr().add(4 * half));
        let (wy0, wx0) = (_mm256_sub_pd(one, fy), _mm256_sub_pd(one, fx));
        // (The 1.0 of the z weight times these is exact.)
        let w = [
            _mm256_mul_pd(wy0, wx0),
            _mm256_mul_pd(wy0, fx),
            _mm256_mul_pd(fy, wx0),
            _mm256_mul_pd(fy, fx),
        ];
        let neg = w.map(|v| _mm256_sub_pd(_mm256_setzero_pd(), v));
        let mut table = _mm256_setzero_si256();
        for p in 1..8 {
            let d = |k: usize| {
                if p & (1 << (k - 1)) != 0 {
                    neg[k]
                } else {
                    w[k]
                }
            };
            let total = _mm256_add_pd(_mm256_add_pd(w[0], d(2)), _mm256_add_pd(d(1), d(3)));
            let gt = _mm256_castpd_si256(_mm256_cmp_pd::<_CMP_GT_OQ>(total, _mm256_setzero_pd()));
            let eq = _mm256_castpd_si256(_mm256_cmp_pd::<_CMP_EQ_OQ>(total, _mm256_setzero_pd()));
            // 0 where the first wins, else 2 for a tie (eq is -1), 1 for the other.
            let code = _mm256_andnot_si256(gt, _mm256_sub_epi64(_mm256_set1_epi64x(1), eq));
            table = _mm256_or_si256(
                table,
                _mm256_sllv_epi64(code, _mm256_set1_epi64x(8 * p as i64)),
            );
        }
        _mm256_storeu_si256(out.as_mut_ptr().add(4 * half).cast(), table);
    }
    out
}

/// An element of a box turned into columns: `BLOCK` columns of `BLOCK` planes at a time, by
/// one transpose in registers.
trait Turn: Copy {
    const BLOCK: usize;
    /// Columns `p .. p + BLOCK`, planes `kb .. kb + BLOCK` (clamped below `k`), from `src`
    /// (planes `p_len` apart) into `dst` (columns `lanes` apart).
    unsafe fn block(
        src: *const Self,
        p_len: usize,
        k: usize,
        kb: usize,
        p: usize,
        dst: *mut Self,
        lanes: usize,
    );
}

impl Turn for f32 {
    const BLOCK: usize = 8;
    #[inline(always)]
    unsafe fn block(
        src: *const f32,
        p_len: usize,
        k: usize,
        kb: usize,
        p: usize,
        dst: *mut f32,
        lanes: usize,
    ) {
        let rows =
            std::array::from_fn(|i| _mm256_loadu_ps(src.add((kb + i).min(k - 1) * p_len + p)));
        for (j, v) in transpose_f32(rows).iter().enumerate() {
            _mm256_storeu_ps(dst.add((p + j) * lanes + kb), *v);
        }
    }
}

impl Turn for u16 {
    const BLOCK: usize = 8;
    #[inline(always)]
    unsafe fn block(
        src: *const u16,
        p_len: usize,
        k: usize,
        kb: usize,
        p: usize,
        dst: *mut u16,
        lanes: usize,
    ) {
        let rows = std::array::from_fn(|i| {
            _mm_loadu_si128(src.add((kb + i).min(k - 1) * p_len + p).cast())
        });
        for (j, v) in transpose_u16(rows).iter().enumerate() {
            _mm_storeu_si128(dst.add((p + j) * lanes + kb).cast(), *v);
        }
    }
}

impl Turn for u8 {
    const BLOCK: usize = 16;
    #[inline(always)]
    unsafe fn block(
        src: *const u8,
        p_len: usize,
        k: usize,
        kb: usize,
        p: usize,
        dst: *mut u8,
        lanes: usize,
    ) {
        let rows = std::array::from_fn(|i| {
            _mm_loadu_si128(src.add((kb + i).min(k - 1) * p_len + p).cast())
        });
        for (j, v) in transpose_u8(rows).iter().enumerate() {
            _mm_storeu_si128(dst.add((p + j) * lanes + kb).cast(), *v);
        }
    }
}

/// `k` planes of `p_len` values each (one after another; rows of `bx`) as `p_len` columns
/// of `lanes` values (a multiple of `E::BLOCK`) into `out`, for the x range `spans[y]` of
/// each row y (and up to a block's width past each); lanes past `k` repeat plane `k - 1`
/// (read, never written out).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
#[target_feature(enable = "avx2")]
unsafe fn columns<E: Turn>(
    planes: &[E],
    p_len: usize,
    k: usize,
    lanes: usize,
    spans: &[(u32, u32)],
    bx: usize,
    out: &mut [E],
) {
    assert!(k > 0 && planes.len() >= k * p_len && out.len() >= p_len * lanes);
    assert!(spans.len() * bx == p_len && spans.iter().all(|s| s.1 as usize <= bx));
    assert!(lanes.is_multiple_of(E::BLOCK));
    let (src, dst) = (planes.as_ptr(), out.as_mut_ptr());
    for (y, &(a, b)) in spans.iter().enumerate() {
        let (mut p, end) = (y * bx + a as usize, y * bx + b as usize);
        while p < end {
            if p + E::BLOCK <= p_len {
                for kb in (0..lanes).step_by(E::BLOCK) {
                    // SAFETY: plane indices are clamped below `k`; a block of columns from
                    // `p` lies in a plane, and in `out` (asserted above).
                    E::block(src, p_len, k, kb, p, dst, lanes);
                }
                p += E::BLOCK;
            } else {
                // The plane's last few columns one by one.
                for i in 0..lanes {
                    out[p * lanes + i] = planes[i.min(k - 1) * p_len + p];
                }
                p += 1;
            }
        }
    }
}

/// Block `kb`'s plane rows `t` (lane i's plane in `t[i]`) into their patch planes
/// (`offsets`) at `at`, `w` long (8 but at a row's end); lanes past the planes are dropped.
///
/// # Safety
/// `at + w` must lie within a patch plane and each offset be a patch plane's (the caller's
/// checks), `out` the whole patch.
#[inline(always)]
unsafe fn put_block<V: Copy, T: Copy + Default>(
    t: &[V; 8],
    offsets: &[usize],
    kb: usize,
    out: &mut [T],
    at: usize,
    w: usize,
    store: impl Fn(*mut T, V),
) {
    let offsets = &offsets[kb.min(offsets.len())..offsets.len().min(kb + 8)];
    if w == 8 {
        for (&o, &v) in offsets.iter().zip(t) {
            debug_assert!(o + at + 8 <= out.len());
            store(out.as_mut_ptr().add(o + at), v);
        }
        return;
    }
    for (&o, &v) in offsets.iter().zip(t) {
        let mut tmp = [T::default(); 8];
        store(tmp.as_mut_ptr(), v);
        out[o + at..][..w].copy_from_slice(&tmp[..w]);
    }
}

/// Rows of 8 floats as columns: `out[j][i] = rows[i][j]`.
#[inline(always)]
unsafe fn transpose_f32(r: [__m256; 8]) -> [__m256; 8] {
    // Pairs of rows interleaved, then pairs of pairs (each 128-bit half a 4x4 block), then
    // the halves swapped across.
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// Rows of 16 bytes as columns: `out[j][i] = rows[i][j]`: pairs of rows interleaved by
/// bytes, then by pairs, fours and eights.
#[inline(always)]
unsafe fn transpose_u8(r: [__m128i; 16]) -> [__m128i; 16] {
    // a[p]: rows 2p, 2p + 1 interleaved; [0] columns 0..8, [1] columns 8..16.
    let a: [[__m128i; 2]; 8] = std::array::from_fn(|p| {
        [
            _mm_unpacklo_epi8(r[2 * p], r[2 * p + 1]),
            _mm_unpackhi_epi8(r[2 * p], r[2 * p + 1]),
        ]
    });
    // b[g][q]: rows 4g..4g + 4 of columns 4q..4q + 4.
    let b: [[__m128i; 4]; 4] = std::array::from_fn(|g| {
        std::array::from_fn(|q| {
            let (x, y) = (a[2 * g][q / 2], a[2 * g + 1][q / 2]);
            if q % 2 == 0 {
                _mm_unpacklo_epi16(x, y)
            } else {
                _mm_unpackhi_epi16(x, y)
            }
        })
    });
    // c[h][s]: rows 8h..8h + 8 of columns 2s, 2s + 1.
    let c: [[__m128i; 8]; 2] = std::array::from_fn(|h| {
        std::array::from_fn(|s| {
            let (x, y) = (b[2 * h][s / 2], b[2 * h + 1][s / 2]);
            if s % 2 == 0 {
                _mm_unpacklo_epi32(x, y)
            } else {
                _mm_unpackhi_epi32(x, y)
            }
        })
    });
    std::array::from_fn(|j| {
        let (x, y) = (c[0][j / 2], c[1][j / 2]);
        if j % 2 == 0 {
            _mm_unpacklo_epi64(x, y)
        } else {
            _mm_unpackhi_epi64(x, y)
        }
    })
}

/// Rows of 8 u16 as columns: `out[j][i] = rows[i][j]`.
#[inline(always)]
unsafe fn transpose_u16(r: [__m128i; 8]) -> [__m128i; 8] {
    let a0 = _mm_unpacklo_epi16(r[0], r[1]);
    let a1 = _mm_unpackhi_epi16(r[0], r[1]);
    let a2 = _mm_unpacklo_epi16(r[2], r[3]);
    let a3 = _mm_unpackhi_epi16(r[2], r[3]);
    let a4 = _mm_unpacklo_epi16(r[4], r[5]);
    let a5 = _mm_unpackhi_epi16(r[4], r[5]);
    let a6 = _mm_unpacklo_epi16(r[6], r[7]);
    let a7 = _mm_unpackhi_epi16(r[6], r[7]);
    let b0 = _mm_unpacklo_epi32(a0, a2);
    let b1 = _mm_unpackhi_epi32(a0, a2);
    let b2 = _mm_unpacklo_epi32(a1, a3);
    let b3 = _mm_unpackhi_epi32(a1, a3);
    let b4 = _mm_unpacklo_epi32(a4, a6);
    let b5 = _mm_unpackhi_epi32(a4, a6);
    let b6 = _mm_unpacklo_epi32(a5, a7);
    let b7 = _mm_unpackhi_epi32(a5, a7);
    [
        _mm_unpacklo_epi64(b0, b4),
        _mm_unpackhi_epi64(b0, b4),
        _mm_unpacklo_epi64(b1, b5),
        _mm_unpackhi_epi64(b1, b5),
        _mm_unpacklo_epi64(b2, b6),
        _mm_unpackhi_epi64(b2, b6),
        _mm_unpacklo_epi64(b3, b7),
        _mm_unpackhi_epi64(b3, b7),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::spatial::label::two_value_outcomes;

    #[test]
    fn transposes_turn_rows_into_columns() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        #[target_feature(enable = "avx2")]
        unsafe fn check() {
            let f: [[f32; 8]; 8] =
                std::array::from_fn(|i| std::array::from_fn(|j| (i * 8 + j) as f32));
            let t = transpose_f32(f.map(|r| _mm256_loadu_ps(r.as_ptr())));
            for (j, v) in t.iter().enumerate() {
                let mut o = [0f32; 8];
                _mm256_storeu_ps(o.as_mut_ptr(), *v);
                assert_eq!(o, std::array::from_fn(|i| f[i][j]));
            }
            let b: [[u8; 16]; 16] =
                std::array::from_fn(|i| std::array::from_fn(|j| (i * 16 + j) as u8));
            let t = transpose_u8(b.map(|r| _mm_loadu_si128(r.as_ptr().cast())));
            for (j, v) in t.iter().enumerate() {
                let mut o = [0u8; 16];
                _mm_storeu_si128(o.as_mut_ptr().cast(), *v);
                assert_eq!(o, std::array::from_fn(|i| b[i][j]));
            }
            let u: [[u16; 8]; 8] =
                std::array::from_fn(|i| std::array::from_fn(|j| (i * 8 + j) as u16));
            let t = transpose_u16(u.map(|r| _mm_loadu_si128(r.as_ptr().cast())));
            for (j, v) in t.iter().enumerate() {
                let mut o = [0u16; 8];
                _mm_storeu_si128(o.as_mut_ptr().cast(), *v);
                assert_eq!(o, std::array::from_fn(|i| u[i][j]));
            }
        }
        // SAFETY: AVX2 checked above.
        unsafe { check() }
    }

    #[test]
    fn outcome_tables_are_the_scalar_ones() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut rng = crate::util::rng::Rng::new(9);
        for _ in 0..5_000 {
            let frac: [[f64; 8]; 2] = std::array::from_fn(|_| {
                std::array::from_fn(|_| match rng.below(4) {
                    0 => 0.5,
                    1 => 0.0,
                    _ => rng.uniform(),
                })
            });
            // SAFETY: AVX2 checked above.
            let got = unsafe { avx2_tables(&frac) };
            for j in 0..8 {
                let want = two_value_outcomes(frac[0][j], frac[1][j]);
                assert_eq!(got[j].to_le_bytes(), want, "{frac:?} lane {j}");
            }
        }
        #[target_feature(enable = "avx2")]
        unsafe fn avx2_tables(frac: &[[f64; 8]; 2]) -> [u64; 8] {
            outcome_tables(frac)
        }
    }
}
