//! Labels through the spatial transform: the class with the largest summed linear weight
//! among a coordinate's 8 neighbours (4 for in-plane maps), ties to the lower value, and the
//! box-wide table that answers most voxels with one load.

use crate::cache::PatchSource;
use crate::error::Result;

/// A label box's element: `u8` when the case stores its labels as uint8 (half the bytes to
/// read and to keep in cache), else `u16`.
pub(super) trait LabelValue:
    Copy + Eq + Default + Into<u16> + std::ops::BitXor<Output = Self> + std::ops::BitOr<Output = Self>
{
    /// [`uniform_cells`]' mark for a cell whose corners differ (or hold this value): the
    /// voxel's neighbours are weighed one by one.
    const MIXED: Self;
}

impl LabelValue for u8 {
    const MIXED: u8 = u8::MAX;
}

impl LabelValue for u16 {
    const MIXED: u16 = u16::MAX;
}

/// A transformed patch's label box, in the type the case stores (one byte a voxel for uint8
/// labels), with its table of uniform cells.
#[derive(Default)]
pub(super) struct LabelBox {
    bytes: Vec<u8>,
    bytes_uniform: Vec<u8>,
    wide: Vec<u16>,
    wide_uniform: Vec<u16>,
    /// Whether the current box is in `bytes`.
    is_bytes: bool,
}

impl LabelBox {
    /// Read the box `start .. start + bs` of the case's label.
    pub(super) fn read(
        &mut self,
        src: &dyn PatchSource,
        start: [i64; 3],
        bs: [usize; 3],
    ) -> Result<()> {
        let bn: usize = bs.iter().product();
        self.is_bytes = src.label_bytes();
        if self.is_bytes {
            self.bytes.resize(bn, 0);
            src.read_label_u8(start, bs, &mut self.bytes)
        } else {
            self.wide.resize(bn, 0);
            src.read_label(start, bs, &mut self.wide)
        }
    }

    /// [`LabelBox::read`] of only the x range of each box row that `spans` give (the rest as
    /// it was: see [`PatchSource::read_spans`]).
    pub(super) fn read_spans(
        &mut self,
        src: &dyn PatchSource,
        start: [i64; 3],
        bs: [usize; 3],
        spans: &[(u32, u32)],
    ) -> Result<()> {
        use crate::cache::source::SpanOut;
        let bn: usize = bs.iter().product();
        self.is_bytes = src.label_bytes();
        if self.is_bytes {
            self.bytes.resize(bn, 0);
            src.read_spans(start, bs, spans, SpanOut::LabelBytes(&mut self.bytes))
        } else {
            self.wide.resize(bn, 0);
            src.read_spans(start, bs, spans, SpanOut::Label(&mut self.wide))
        }
    }

    /// The table of uniform cells ([`uniform_cells`]) of the box just read.
    #[inline(always)]
    pub(super) fn prepare<const FLAT_Z: bool>(&mut self, bs: [usize; 3]) {
        if self.is_bytes {
            uniform_cells::<FLAT_Z, u8>(&self.bytes, bs, &mut self.bytes_uniform);
        } else {
            uniform_cells::<FLAT_Z, u16>(&self.wide, bs, &mut self.wide_uniform);
        }
    }

    /// The uniform table's answers for a row of 8 lanes from their cells' box indices (0
    /// outside) and the bits of the mixed lanes, for [`LabelBox::weighed_at`] later. Callers
    /// that look up a whole row this way before weighing any lane keep the gathers going
    /// back to back (a branch on each row's mixed lanes, mispredicted, stalled them).
    ///
    /// # Safety
    /// The CPU must have AVX2; [`LabelBox::prepare`] must have run on this box.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn uniform_row8(&self, base: &[i32; 8], inside: u32) -> ([u16; 8], u32) {
        // SAFETY: the caller's AVX2; the tables are `prepare`'s, padded.
        unsafe {
            if self.is_bytes {
                uniform8(&self.bytes_uniform, self.bytes.len(), base, inside)
            } else {
                uniform8(&self.wide_uniform, self.wide.len(), base, inside)
            }
        }
    }

    /// The weighed neighbours of the cell at box voxel `base` (a lane
    /// [`LabelBox::uniform_row8`] marked mixed): 3D cells in vectors ([`weighed8`]).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn weighed_at<const FLAT_Z: bool>(
        &self,
        base: usize,
        sy: usize,
        sz: usize,
        f: [f64; 3],
    ) -> u16 {
        // SAFETY: the caller's AVX2.
        unsafe {
            match (FLAT_Z, self.is_bytes) {
                (false, true) => weighed8(&self.bytes, base, sy, sz, f),
                (false, false) => weighed8(&self.wide, base, sy, sz, f),
                (true, true) => weighed::<true, u8>(&self.bytes, base, sy, sz, f),
                (true, false) => weighed::<true, u16>(&self.wide, base, sy, sz, f),
            }
        }
    }

    /// Hint the CPU to fetch the neighbours of the cells `lanes` of `base` (box indices;
    /// strides `sy`, `sz`) for [`LabelBox::weighed_at`] later; never faults.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) fn prefetch_cells(&self, base: &[i32; 8], lanes: u32, sy: usize, sz: usize) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let (p, es) = if self.is_bytes {
            (self.bytes.as_ptr(), 1)
        } else {
            (self.wide.as_ptr().cast::<u8>(), 2)
        };
        let mut m = lanes;
        while m != 0 {
            let j = m.trailing_zeros() as usize;
            m &= m - 1;
            let b = base[j] as usize;
            for off in [0, sy, sz, sz + sy] {
                // SAFETY: a prefetch is only a hint (wrapping: no pointer arithmetic past
                // the allocation is relied on).
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add((b + off) * es).cast()) };
            }
        }
    }

    /// The box's elements, for [`super::columns`] (which widens them itself).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn planes(&self) -> super::columns::LabelPlanes<'_> {
        if self.is_bytes {
            super::columns::LabelPlanes::Bytes(&self.bytes)
        } else {
            super::columns::LabelPlanes::Wide(&self.wide)
        }
    }

    /// [`label_at`] over this box.
    #[inline(always)]
    pub(super) fn at<const FLAT_Z: bool>(
        &self,
        base: usize,
        sy: usize,
        sz: usize,
        f: [f64; 3],
    ) -> u16 {
        if self.is_bytes {
            label_at::<FLAT_Z, u8>(&self.bytes_uniform, &self.bytes, base, sy, sz, f)
        } else {
            label_at::<FLAT_Z, u16>(&self.wide_uniform, &self.wide, base, sy, sz, f)
        }
    }
}

/// Entries past the box's end in [`uniform_cells`]' table (all [`LabelValue::MIXED`]), so
/// that a 4-byte read at any entry stays inside it.
pub(super) const UNIFORM_PAD: usize = 4;

/// For each voxel `v` of a label box of sides `bs` (C order), the value of the cell from `v`
/// (its 8 corners, or the 4 of its plane when `FLAT_Z`) when all corners hold it,
/// [`LabelValue::MIXED`] otherwise, into `out`. Most cells of a label lie inside one
/// structure: one load from this table replaces their 8 loads and compares in the per-voxel
/// loop, and this pass reads the box in 8 sequential streams, which the compiler vectorizes.
#[inline(always)]
pub(super) fn uniform_cells<const FLAT_Z: bool, L: LabelValue>(
    label: &[L],
    bs: [usize; 3],
    out: &mut Vec<L>,
) {
    let (sy, sz) = (bs[2], bs[1] * bs[2]);
    let n = label.len();
    // Resized, not cleared: the loop below writes the first `m` entries, the tail (and the
    // padding) is filled.
    out.resize(n + UNIFORM_PAD, L::MIXED);
    // Cells start at most one voxel before each axis' end: their farthest corner is in the box.
    let far = if FLAT_Z { sy + 1 } else { sz + sy + 1 };
    let m = n.saturating_sub(far);
    out[m..].fill(L::MIXED);
    if m == 0 {
        return;
    }
    let l = |off: usize| &label[off..off + m];
    let (a, b, c, d) = (l(0), l(1), l(sy), l(sy + 1));
    let o = &mut out[..m];
    if FLAT_Z {
        for i in 0..m {
            let v = a[i];
            let same = (b[i] == v) & (c[i] == v) & (d[i] == v);
            o[i] = if same { v } else { L::MIXED };
        }
        return;
    }
    let (e, f, g, h) = (l(sz), l(sz + 1), l(sz + sy), l(sz + sy + 1));
    for i in 0..m {
        let v = a[i];
        let same = (b[i] == v)
            & (c[i] == v)
            & (d[i] == v)
            & (e[i] == v)
            & (f[i] == v)
            & (g[i] == v)
            & (h[i] == v);
        o[i] = if same { v } else { L::MIXED };
    }
}

/// The uniform table's entries at 8 box indices in one gather (8 loads, bounds checks and
/// lane moves one by one were a tenth of a rotated patch's time): the values, 0 in lanes
/// outside, and the bits of the lanes inside whose entry is [`LabelValue::MIXED`].
///
/// # Safety
/// The CPU must have AVX2; `uniform` must hold `n` entries and [`UNIFORM_PAD`] more.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn uniform8<L: LabelValue>(
    uniform: &[L],
    n: usize,
    base: &[i32; 8],
    inside: u32,
) -> ([u16; 8], u32) {
    use std::arch::x86_64::*;
    assert!(n > 0 && uniform.len() >= n + UNIFORM_PAD);
    let idx = _mm256_loadu_si256(base.as_ptr().cast());
    // Clamped into the box: the cells are inside it, and this keeps every read in bounds
    // whatever they hold. Each lane reads 4 bytes from its entry; the mask keeps the entry.
    let idx = _mm256_min_epu32(idx, _mm256_set1_epi32((n - 1) as i32));
    let ptr = uniform.as_ptr().cast::<i32>();
    let (got, keep) = if std::mem::size_of::<L>() == 1 {
        (_mm256_i32gather_epi32::<1>(ptr, idx), 0xff)
    } else {
        (_mm256_i32gather_epi32::<2>(ptr, idx), 0xffff)
    };
    let got = _mm256_and_si256(got, _mm256_set1_epi32(keep));
    let lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let lanes = _mm256_cmpeq_epi32(
        _mm256_and_si256(_mm256_set1_epi32(inside as i32), lane_bit),
        lane_bit,
    );
    let mixed = _mm256_and_si256(
        lanes,
        _mm256_cmpeq_epi32(got, _mm256_set1_epi32(i32::from(L::MIXED.into()))),
    );
    let got = _mm256_and_si256(got, lanes);
    let packed = _mm_packus_epi32(
        _mm256_castsi256_si128(got),
        _mm256_extracti128_si256::<1>(got),
    );
    let mut vals = [0u16; 8];
    _mm_storeu_si128(vals.as_mut_ptr().cast(), packed);
    (vals, _mm256_movemask_ps(_mm256_castsi256_ps(mixed)) as u32)
}

/// The label at a coordinate whose cell starts at box voxel `base` with fractions `f`:
/// [`uniform_cells`]' answer, or the weighed neighbours when it says [`LabelValue::MIXED`].
#[inline(always)]
pub(super) fn label_at<const FLAT_Z: bool, L: LabelValue>(
    uniform: &[L],
    b: &[L],
    base: usize,
    sy: usize,
    sz: usize,
    f: [f64; 3],
) -> u16 {
    let u = uniform[base];
    if u != L::MIXED {
        return u.into();
    }
    weighed::<FLAT_Z, L>(b, base, sy, sz, f)
}

/// The label value with the largest summed linear weight among the 8 voxels from `base`
/// (ties to the lower value); most voxels have 8 equal neighbours and skip the weights.
/// `FLAT_Z` as for [`super::trilinear`] (the upper plane's weights are 0, so it never counts).
/// The tests' reference for the table's answers.
#[cfg(test)]
pub(super) fn majority<const FLAT_Z: bool, L: LabelValue>(
    b: &[L],
    base: usize,
    sy: usize,
    sz: usize,
    f: [f64; 3],
) -> u16 {
    // The equality test in registers: an array of the values here would be stored to the
    // stack and read back for every voxel.
    let zero = L::default();
    if FLAT_Z {
        let b = &b[base..=base + sy + 1];
        let v = b[0];
        if (b[1] ^ v) | (b[sy] ^ v) | (b[sy + 1] ^ v) == zero {
            return v.into();
        }
        return weighed::<FLAT_Z, L>(b, 0, sy, sz, f);
    }
    let b = &b[base..=base + sz + sy + 1];
    let v = b[0];
    let diff = (b[1] ^ v)
        | (b[sy] ^ v)
        | (b[sy + 1] ^ v)
        | (b[sz] ^ v)
        | (b[sz + 1] ^ v)
        | (b[sz + sy] ^ v)
        | (b[sz + sy + 1] ^ v);
    if diff == zero {
        return v.into();
    }
    weighed::<FLAT_Z, L>(b, 0, sy, sz, f)
}

/// [`majority`] without its test for equal neighbours, for cells the uniform table marks
/// mixed (a cell whose corners all hold [`LabelValue::MIXED`] weighs to that value too).
#[inline(always)]
fn weighed<const FLAT_Z: bool, L: LabelValue>(
    b: &[L],
    base: usize,
    sy: usize,
    sz: usize,
    f: [f64; 3],
) -> u16 {
    if FLAT_Z {
        let b = &b[base..=base + sy + 1];
        let (c0, c1, c2, c3) = (b[0].into(), b[1].into(), b[sy].into(), b[sy + 1].into());
        return mixed_majority([c0, c1, c2, c3, c0, c1, c2, c3], true, f);
    }
    let b = &b[base..=base + sz + sy + 1];
    mixed_majority(
        [
            b[0],
            b[1],
            b[sy],
            b[sy + 1],
            b[sz],
            b[sz + 1],
            b[sz + sy],
            b[sz + sy + 1],
        ]
        .map(Into::into),
        false,
        f,
    )
}

/// A label element that [`weighed8`] reads two at a time.
#[cfg(target_arch = "x86_64")]
trait PairLoad: LabelValue {
    /// The 8 neighbours of the cell at `b[0]` (z, y, x order, as [`weighed`] lists them) as
    /// 16-bit lanes, from four loads of two adjacent elements.
    ///
    /// # Safety
    /// The CPU must have AVX2; `b` must point at a cell whose farthest neighbour, at
    /// `sz + sy + 1`, is in the same allocation.
    unsafe fn neighbours(b: *const Self, sy: usize, sz: usize) -> std::arch::x86_64::__m128i;
}

#[cfg(target_arch = "x86_64")]
impl PairLoad for u8 {
    #[inline(always)]
    unsafe fn neighbours(b: *const u8, sy: usize, sz: usize) -> std::arch::x86_64::__m128i {
        use std::arch::x86_64::*;
        // SAFETY: the caller's bounds; unaligned 2-byte reads.
        let pair = |off: usize| u64::from(unsafe { b.add(off).cast::<u16>().read_unaligned() });
        let all = pair(0) | pair(sy) << 16 | pair(sz) << 32 | pair(sz + sy) << 48;
        _mm_cvtepu8_epi16(_mm_cvtsi64_si128(all as i64))
    }
}

#[cfg(target_arch = "x86_64")]
impl PairLoad for u16 {
    #[inline(always)]
    unsafe fn neighbours(b: *const u16, sy: usize, sz: usize) -> std::arch::x86_64::__m128i {
        use std::arch::x86_64::*;
        // SAFETY: the caller's bounds; unaligned 4-byte reads.
        let pair = |off: usize| unsafe { b.add(off).cast::<i32>().read_unaligned() };
        _mm_setr_epi32(pair(0), pair(sy), pair(sz), pair(sz + sy))
    }
}

/// [`weighed`] of a 3D cell with its arithmetic in vectors: the same weights, products, signs
/// and sums in the same order as [`mixed_majority`]'s two-value case (so the same winner in
/// every build), the 8 weights in two vectors of 4; three values or more by the list.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn weighed8<L: PairLoad>(b: &[L], base: usize, sy: usize, sz: usize, f: [f64; 3]) -> u16 {
    use std::arch::x86_64::*;
    assert!(base + sz + sy + 1 < b.len());
    // SAFETY: the caller's AVX2; the farthest neighbour is in `b` (asserted).
    unsafe {
        let v = L::neighbours(b.as_ptr().add(base), sy, sz);
        let mut lanes = [0u16; 8];
        _mm_storeu_si128(lanes.as_mut_ptr().cast(), v);
        let first = lanes[0];
        let same = _mm_cmpeq_epi16(v, _mm_set1_epi16(first as i16));
        // The other value: the last neighbour that differs from the first.
        let differ = !_mm_movemask_epi8(same) as u32 & 0xffff;
        if differ == 0 {
            return first;
        }
        let other = lanes[(31 - differ.leading_zeros()) as usize / 2];
        let either = _mm_or_si128(same, _mm_cmpeq_epi16(v, _mm_set1_epi16(other as i16)));
        if _mm_movemask_epi8(either) != 0xffff {
            let wz = [1.0 - f[0], f[0]];
            let (wy, wx) = ([1.0 - f[1], f[1]], [1.0 - f[2], f[2]]);
            return majority_by_list(&lanes, wz, wy, wx);
        }
        // Neighbour k's weight `wz[k >> 2] * wy[(k >> 1) & 1] * wx[k & 1]`: k < 4 in `lo`,
        // the others in `hi`; negated (sign flipped) where it holds the other value.
        let wy = _mm256_setr_pd(1.0 - f[1], 1.0 - f[1], f[1], f[1]);
        let wx = _mm256_setr_pd(1.0 - f[2], f[2], 1.0 - f[2], f[2]);
        let lo = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(1.0 - f[0]), wy), wx);
        let hi = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(f[0]), wy), wx);
        let sign = _mm256_set1_pd(-0.0);
        let flip = |m: __m128i| _mm256_and_pd(_mm256_castsi256_pd(_mm256_cvtepi16_epi64(m)), sign);
        let not_first = _mm_xor_si128(same, _mm_set1_epi8(-1));
        let lo = _mm256_xor_pd(lo, flip(not_first));
        let hi = _mm256_xor_pd(hi, flip(_mm_srli_si128::<8>(not_first)));
        // (d0 + d4, .., d3 + d7), then (q0 + q2, q1 + q3), then their sum.
        let q = _mm256_add_pd(lo, hi);
        let r = _mm_add_pd(_mm256_castpd256_pd128(q), _mm256_extractf128_pd::<1>(q));
        let total = _mm_cvtsd_f64(_mm_add_sd(r, _mm_unpackhi_pd(r, r)));
        let first_wins = (total > 0.0) | ((total == 0.0) & (first < other));
        if first_wins {
            first
        } else {
            other
        }
    }
}

/// [`weighed`] of an in-plane cell from its 4 neighbours (x, then y) already read.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn weighed4(c: [u16; 4], f: [f64; 3]) -> u16 {
    mixed_majority([c[0], c[1], c[2], c[3], c[0], c[1], c[2], c[3]], true, f)
}

/// Which value [`weighed4`] gives a cell of two values from the pattern of its neighbours
/// that differ from the first (bit 0: the +x one, bit 1: +y, bit 2: +x+y) at fractions
/// (y, x): 0 the first value, 1 the other, 2 the lower of the two (an exact tie). The same
/// weights and sums as [`mixed_majority`]'s two-value case (its upper plane's weights are
/// zeros, which change no sum's comparison with 0), so the same winner; one table serves
/// every plane of an in-plane column. The reference of the vector tables
/// (`columns::outcome_tables`).
#[cfg(all(test, target_arch = "x86_64"))]
pub(super) fn two_value_outcomes(fy: f64, fx: f64) -> [u8; 8] {
    let (wy, wx) = ([1.0 - fy, fy], [1.0 - fx, fx]);
    let w: [f64; 4] = std::array::from_fn(|k| 1.0 * wy[(k >> 1) & 1] * wx[k & 1]);
    std::array::from_fn(|p| {
        let d = |k: usize| if p & (1 << (k - 1)) != 0 { -w[k] } else { w[k] };
        let total = (w[0] + d(2)) + (d(1) + d(3));
        if total > 0.0 {
            0
        } else if total == 0.0 {
            2
        } else {
            1
        }
    })
}

/// [`majority`] where the neighbours differ: weights in f64, as the reference computes them.
/// `v`: the 8 neighbours (z, y, x order), or with `four` the lower plane's 4 twice (the z
/// fraction is then 0 and `f[0]` is not read). Inlined, so the values stay in registers
/// (passed through memory to a call, the narrow stores and wide loads stalled).
#[inline(always)]
fn mixed_majority(v: [u16; 8], four: bool, f: [f64; 3]) -> u16 {
    // Weights of the lower and upper neighbour per axis.
    let wz = if four { [1.0, 0.0] } else { [1.0 - f[0], f[0]] };
    let wy = [1.0 - f[1], f[1]];
    let wx = [1.0 - f[2], f[2]];
    // Two values (a structure's border, nine in ten mixed voxels here): the sign of the
    // summed weights of one minus those of the other decides, summed as a tree (lanes k and
    // k + 4, then k and k + 2, then the two halves: three dependent additions where two
    // running sums took eight). Rounding differs from the list's sums only when the two
    // weights agree to within an ulp or so, a tie in all but name (the reference check
    // treats differences under 1e-9 as ties); exact ties (fractions of 1/2, 1/4) go to the
    // lower value as there. The same operations in every build, so the same winner.
    let first = v[0];
    let mut other = first;
    for &x in &v {
        other = if x != first { x } else { other };
    }
    let mut two = true;
    for &x in &v {
        two &= (x == first) | (x == other);
    }
    if two {
        let mut d = [0f64; 8];
        for (k, d) in d.iter_mut().enumerate() {
            let w = wz[k >> 2] * wy[(k >> 1) & 1] * wx[k & 1];
            *d = if v[k] == first { w } else { -w };
        }
        let q = [d[0] + d[4], d[1] + d[5], d[2] + d[6], d[3] + d[7]];
        let total = (q[0] + q[2]) + (q[1] + q[3]);
        let first_wins = (total > 0.0) | ((total == 0.0) & (first < other));
        return if first_wins { first } else { other };
    }
    majority_by_list(&v[..if four { 4 } else { 8 }], wz, wy, wx)
}

/// The general case of [`mixed_majority`]: each distinct value's summed weight in a list.
#[inline(never)]
fn majority_by_list(values: &[u16], wz: [f64; 2], wy: [f64; 2], wx: [f64; 2]) -> u16 {
    let mut seen: [(u16, f64); 8] = [(0, 0.0); 8];
    let mut len = 0;
    for (k, &v) in values.iter().enumerate() {
        let w = wz[(k >> 2) & 1] * wy[(k >> 1) & 1] * wx[k & 1];
        if w == 0.0 {
            continue;
        }
        match seen[..len].iter_mut().find(|s| s.0 == v) {
            Some(s) => s.1 += w,
            None => {
                seen[len] = (v, w);
                len += 1;
            }
        }
    }
    let mut best = (0u16, -1.0f64);
    for &(v, w) in &seen[..len] {
        if w > best.1 || (w == best.1 && v < best.0) {
            best = (v, w);
        }
    }
    best.0
}

#[cfg(test)]
mod tests;
