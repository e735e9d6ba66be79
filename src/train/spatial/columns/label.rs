//! The label through the columns: where a column's four neighbours agree in every plane the
//! value is theirs; planes of two values take the weighed winner from a per-column table of
//! outcomes, computed in vectors with the scalar path's weights and sums; planes of three or
//! more values are weighed one by one ([`weighed4`]).

use std::arch::x86_64::*;

use super::turn::{put_block, transpose_u16};
use super::{row_at, Job};
use crate::train::spatial::label::weighed4;

/// A label column's vector lanes: bytes (16 planes a vector) or u16 (8).
pub(super) trait Lanes {
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
pub(super) struct Bytes;

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
pub(super) struct Wide;

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
pub(super) unsafe fn label_rows<L: Lanes>(
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

/// [`crate::train::spatial::label`]'s `two_value_outcomes` of each of a row's 8 columns
/// (fractions y, x per lane), byte p of entry j for pattern p, in f64 vectors (the same
/// operations lane by lane, so the same outcomes).
#[inline(always)]
pub(super) unsafe fn outcome_tables(frac: &[[f64; 8]; 2]) -> [u64; 8] {
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
