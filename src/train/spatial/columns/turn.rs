//! Planes turned into columns and back: a box's planes as columns (each column's planes
//! contiguous, `BLOCK` columns at a time by one transpose in registers), and blocks of
//! computed columns put back into their patch planes' rows.

use std::arch::x86_64::*;

/// An element of a box turned into columns: `BLOCK` columns of `BLOCK` planes at a time, by
/// one transpose in registers.
pub(super) trait Turn: Copy {
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
pub(super) unsafe fn columns<E: Turn>(
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
pub(super) unsafe fn put_block<V: Copy, T: Copy + Default>(
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
pub(super) unsafe fn transpose_f32(r: [__m256; 8]) -> [__m256; 8] {
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
pub(super) unsafe fn transpose_u8(r: [__m128i; 16]) -> [__m128i; 16] {
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
pub(super) unsafe fn transpose_u16(r: [__m128i; 8]) -> [__m128i; 8] {
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
