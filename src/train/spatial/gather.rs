//! One row of 8 output voxels of the spatial transform with AVX2: the 8 source cells from the
//! coordinates in vector registers, the image's neighbours gathered into vectors, the lerps
//! 8 lanes wide. The operations and their order are the scalar path's (no fused
//! multiply-add), so the values are the same bit for bit. The label's majority stays with the
//! caller (it branches on the values), from the cells returned here.
//!
//! The neighbours are gathered by scalar loads, each pair of x neighbours in one: AVX2's
//! gather instruction measured 15% slower than the scalar path on this machine's CPU (AMD
//! EPYC).

use std::arch::x86_64::*;

/// One row's 8 cells: which lanes lie inside the box's interpolation range (bit k for voxel
/// k), each one's box index (0 outside) and fractions past it (z, y, x; unspecified outside).
#[derive(Clone)]
pub(super) struct Cells8 {
    pub inside: u32,
    pub base: [i32; 8],
    pub frac: [[f64; 8]; 3],
}

/// The 8 cells of `coords` (source coordinates relative to a box of sides `bs`, axis by axis:
/// `coords[a][k]` is voxel k's coordinate on axis a), and each
/// channel of `image_box` (`bn` voxels each) interpolated there into `image[ch * n + at..][..8]`
/// (0 outside).
///
/// # Safety
/// The CPU must have AVX2 (inlined into callers compiled for it); `bs` must
/// multiply to `bn < 2^31`, `image_box` must hold `channels * bn` voxels and `image` at least
/// `(channels - 1) * n + at + 8`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn row8<const FLAT_Z: bool>(
    coords: &[[f64; 8]; 3],
    bs: [usize; 3],
    image_box: &[f32],
    bn: usize,
    channels: usize,
    image: &mut [f32],
    n: usize,
    at: usize,
) -> Cells8 {
    let cells = cells8(coords, bs);
    lerp8::<FLAT_Z>(&cells, bs, image_box, bn, channels, image, n, at);
    cells
}

/// The cells of 8 coordinates (as for [`row8`]).
///
/// # Safety
/// The CPU must have AVX2; `bs` must multiply to under 2^31.
#[inline(always)]
pub(super) unsafe fn cells8(coords: &[[f64; 8]; 3], bs: [usize; 3]) -> Cells8 {
    let axis = coords;
    let zero = _mm256_setzero_pd();
    let mut inside = 0i32;
    // Per half of the lanes, each axis's truncated coordinates.
    let mut trunc = [[_mm_setzero_si128(); 3]; 2];
    let mut frac = [[0f64; 8]; 3];
    for (half, tr) in trunc.iter_mut().enumerate() {
        let mut ok = _mm256_castsi256_pd(_mm256_set1_epi32(-1));
        for a in 0..3 {
            let c = _mm256_loadu_pd(axis[a].as_ptr().add(4 * half));
            let lim = _mm256_set1_pd((bs[a] - 1) as f64);
            // Ordered compares: NaN is outside, as in the scalar `cell`.
            ok = _mm256_and_pd(
                ok,
                _mm256_and_pd(
                    _mm256_cmp_pd::<_CMP_GE_OQ>(c, zero),
                    _mm256_cmp_pd::<_CMP_LT_OQ>(c, lim),
                ),
            );
            // Truncation is the floor inside; lanes outside are masked off below.
            let t = _mm256_cvttpd_epi32(c);
            let f = _mm256_sub_pd(c, _mm256_cvtepi32_pd(t));
            _mm256_storeu_pd(frac[a].as_mut_ptr().add(4 * half), f);
            tr[a] = t;
        }
        inside |= _mm256_movemask_pd(ok) << (4 * half);
    }
    let iz = _mm256_set_m128i(trunc[1][0], trunc[0][0]);
    let iy = _mm256_set_m128i(trunc[1][1], trunc[0][1]);
    let ix = _mm256_set_m128i(trunc[1][2], trunc[0][2]);
    let plane_rows = _mm256_add_epi32(_mm256_mullo_epi32(iz, _mm256_set1_epi32(bs[1] as i32)), iy);
    let base = _mm256_add_epi32(
        _mm256_mullo_epi32(plane_rows, _mm256_set1_epi32(bs[2] as i32)),
        ix,
    );
    // Lanes outside read voxel 0 (always in the box) and are zeroed after.
    let base = _mm256_and_si256(base, lane_mask(inside as u32));
    let mut cells = [0i32; 8];
    _mm256_storeu_si256(cells.as_mut_ptr().cast(), base);
    Cells8 {
        inside: inside as u32,
        base: cells,
        frac,
    }
}

/// 8 fractions in f64 rounded to f32 (to nearest, as the scalar loop's `as f32`).
#[inline(always)]
unsafe fn f32x8(f: &[f64; 8]) -> __m256 {
    _mm256_set_m128(
        _mm256_cvtpd_ps(_mm256_loadu_pd(f.as_ptr().add(4))),
        _mm256_cvtpd_ps(_mm256_loadu_pd(f.as_ptr())),
    )
}

/// All bits of lane k set where bit k of `inside` is.
#[inline(always)]
unsafe fn lane_mask(inside: u32) -> __m256i {
    let lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    _mm256_cmpeq_epi32(
        _mm256_and_si256(_mm256_set1_epi32(inside as i32), lane_bit),
        lane_bit,
    )
}

/// Each channel of `image_box` interpolated at `cells` into `image[ch * n + at..][..8]` (0 in
/// lanes outside); the fractions rounded to f32 as the scalar loop rounds them.
///
/// # Safety
/// As for [`row8`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn lerp8<const FLAT_Z: bool>(
    cells: &Cells8,
    bs: [usize; 3],
    image_box: &[f32],
    bn: usize,
    channels: usize,
    image: &mut [f32],
    n: usize,
    at: usize,
) {
    let fz = if FLAT_Z {
        _mm256_setzero_ps()
    } else {
        f32x8(&cells.frac[0])
    };
    let fractions = [fz, f32x8(&cells.frac[1]), f32x8(&cells.frac[2])];
    lerp8_at::<FLAT_Z>(
        &cells.base,
        cells.inside,
        fractions,
        bs,
        image_box,
        bn,
        channels,
        image,
        n,
        at,
    );
}

/// [`lerp8`] from the lanes' box indices, inside bits and f32 fractions (z, y, x).
///
/// # Safety
/// As for [`row8`]; every lane's base is a cell inside the box (or any voxel of it for lanes
/// outside) whose farthest neighbour read lies in the box.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn lerp8_at<const FLAT_Z: bool>(
    base: &[i32; 8],
    inside: u32,
    [fz, fy, fx]: [__m256; 3],
    bs: [usize; 3],
    image_box: &[f32],
    bn: usize,
    channels: usize,
    image: &mut [f32],
    n: usize,
    at: usize,
) {
    let (sy, sz) = (bs[2], bs[1] * bs[2]);
    let lanes = lane_mask(inside);
    for ch in 0..channels {
        let b = &image_box[ch * bn..(ch + 1) * bn];
        // SAFETY (of each gather): every lane's index is a cell inside the box (or a voxel
        // of it), whose farthest neighbour read, + sz + sy + 1 (+ sy + 1 when flat), lies
        // inside the box too (boxes have at least 2 voxels a side, `needed_box`).
        let (v00, v01) = gather_pairs(b, base, 0);
        let (v10, v11) = gather_pairs(b, base, sy);
        let z0 = lerp(lerp(v00, v01, fx), lerp(v10, v11, fx), fy);
        let v = if FLAT_Z {
            z0
        } else {
            let (v20, v21) = gather_pairs(b, base, sz);
            let (v30, v31) = gather_pairs(b, base, sz + sy);
            let z1 = lerp(lerp(v20, v21, fx), lerp(v30, v31, fx), fy);
            lerp(z0, z1, fz)
        };
        let v = _mm256_and_ps(v, _mm256_castsi256_ps(lanes));
        let out = &mut image[ch * n + at..ch * n + at + 8];
        _mm256_storeu_ps(out.as_mut_ptr(), v);
    }
}

/// The cells of one row of 8 within a box plane, for in-plane maps (whose patch planes all
/// share them): box indices within the plane, inside bits, the y and x fractions in f32 for
/// the lerps and in f64 for the label's weights.
#[derive(Clone, Copy)]
pub(super) struct PlaneRow {
    pub base: [i32; 8],
    pub inside: u32,
    pub fy: __m256,
    pub fx: __m256,
}

impl PlaneRow {
    /// From the cells of a row computed at box plane 0.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline(always)]
    pub(super) unsafe fn new(cells: &Cells8) -> Self {
        PlaneRow {
            base: cells.base,
            inside: cells.inside,
            fy: f32x8(&cells.frac[1]),
            fx: f32x8(&cells.frac[2]),
        }
    }
}

/// `a + (b - a) * t`, lane by lane (the scalar path's lerp).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lerp(a: __m256, b: __m256, t: __m256) -> __m256 {
    _mm256_add_ps(a, _mm256_mul_ps(_mm256_sub_ps(b, a), t))
}

/// `b[base[k] + off]` and `b[base[k] + off + 1]` for each lane k: each pair of x neighbours
/// in one 8-byte load (they are adjacent), then split into the lower and the upper voxels'
/// vectors. Half the loads of one per voxel; AVX2's gather instruction measured slower than
/// scalar loads on this machine's CPU.
///
/// # Safety
/// Every `base[k] + off + 1` must be an index of `b` (checked in debug builds).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn gather_pairs(b: &[f32], base: &[i32; 8], off: usize) -> (__m256, __m256) {
    let at = |k: usize| {
        let i = base[k] as usize + off;
        debug_assert!(i + 1 < b.len(), "box index {} of {}", i + 1, b.len());
        b.as_ptr().add(i) as *const f64
    };
    // Pairs of lanes (0, 1 | 4, 5) in one vector and (2, 3 | 6, 7) in the other, so that
    // taking the even and the odd floats of both gives lanes 0..8 in order.
    // (8-byte moves of the two floats' bits, through the f64 loads: no arithmetic.)
    let two = |k: usize, j: usize| {
        _mm_castpd_ps(_mm_loadh_pd(_mm_loadl_pd(_mm_setzero_pd(), at(k)), at(j)))
    };
    let a = _mm256_set_m128(two(4, 5), two(0, 1));
    let c = _mm256_set_m128(two(6, 7), two(2, 3));
    (
        _mm256_shuffle_ps::<0b10_00_10_00>(a, c),
        _mm256_shuffle_ps::<0b11_01_11_01>(a, c),
    )
}
