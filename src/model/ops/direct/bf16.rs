//! The direct passes with bf16 products, on CPUs with AVX512-BF16: operands multiplied in bf16
//! (bf16 tensors as they are, f32 ones rounded as the ring is filled), sums kept in f32
//! (`vdpbf16ps`: two products a lane each step, twice the f32 rate), each result stored once
//! (rounded to bf16 for bf16 tensors). The forward pass and the input gradient pair source
//! channels (a lane holds channels 2k and 2k + 1 of one position, and the weights of both);
//! the weight gradient pairs neighbouring positions of one channel. Where the CPU has AMX-BF16
//! the forward pass and the input gradient run the same ring through AMX tiles (`amx.rs`).

use std::arch::x86_64::*;

use half::bf16;

use super::amx::Tiles;
use super::kernels::Engine;
use super::phases::by_phases;
use super::weights::{sums, Kept, Sweep};
use super::{
    forward_weight, input_gradient_weight, interleave_scalar, Operand, Output, Pass, Workspace,
    TILE,
};
use crate::model::ops::geometry::ConvGeom;
use crate::util::simd::{allows, Cap};

/// Whether this CPU runs the bf16 kernels (and `VOXCACHE_SIMD` does not cap them off).
pub(super) fn available() -> bool {
    allows(Cap::Avx512)
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bf16")
}

/// `y = conv3d(x, w) + bias` of a convolution padded less than its kernel, at any stride, the
/// source channels given by `channel(n, i)`, by AMX tiles where `tiles`; the CPU must be
/// [`available`] (and have the tiles).
pub(super) fn forward<'a, S: Operand + 'a, O: Output>(
    tiles: bool,
    g: &ConvGeom,
    channel: impl Fn(usize, usize) -> &'a [S] + Sync,
    w: &[S],
    bias: Option<&[f32]>,
) -> Vec<O> {
    let pass = Pass::forward(g);
    let engine = Pairs::new(&pass, tiles, |o, i, t| forward_weight(g, w, o, i, t).bf16());
    pass.run_biased(&engine, pass.pair_fill(channel), bias)
}

/// `dx` from `dy` of a convolution padded less than its kernel: at stride 1 one pass, else one
/// per stride phase (None where a phase cannot be padded), by AMX tiles where `tiles`; the CPU
/// must be [`available`] (and have the tiles).
pub(super) fn grad_input<S: Operand, O: Output>(
    tiles: bool,
    g: &ConvGeom,
    dy: &[S],
    w: &[S],
) -> Option<Vec<O>> {
    let vo = g.output_voxels();
    let channel = |n: usize, i: usize| &dy[(n * g.cout + i) * vo..][..vo];
    if g.stride == [1; 3] {
        let pass = Pass::input_gradient(g);
        let engine = Pairs::new(&pass, tiles, |o, i, t| {
            input_gradient_weight(g, w, o, i, t).bf16()
        });
        return Some(pass.run_filled(&engine, pass.pair_fill(channel)));
    }
    by_phases(g, |phase| {
        let pass = &phase.pass;
        let engine = Pairs::new(pass, tiles, |o, i, t| phase.weight(g, w, o, i, t).bf16());
        pass.run_filled(&engine, pass.pair_fill(channel))
    })
}

/// `dw` (f32 sums) from `x` (its channels given by `channel(n, i)`) and `dy` of a convolution
/// padded less than its kernel, at any stride, whose kernel is 1 to 3 wide (None otherwise);
/// by AMX tiles where `tiles`; the CPU must be [`available`] (and have the tiles).
pub(super) fn grad_weight<'a, S: Operand + 'a>(
    tiles: bool,
    g: &ConvGeom,
    channel: impl Fn(usize, usize) -> &'a [S] + Sync,
    dy: &[S],
) -> Option<Vec<f32>> {
    if tiles {
        return super::amx::grad_weight(g, channel, dy);
    }
    if !(1..=3).contains(&g.kernel[2]) {
        return None;
    }
    let pass = Pass::forward(g);
    let fill = |n, i, s, slot: &mut [bf16]| pass.fill_plane(channel(n, i), s, slot);
    // SAFETY: the caller checked the CPU; the sweep holds what the pass reads.
    let kernel =
        |sweep: &Sweep<bf16>, co, out: &mut [f32]| unsafe { weight_plane(&pass, sweep, co, out) };
    Some(pass.weight_sweeps((g.cin, super::CO_MAX), fill, dy, kernel))
}

/// bf16 products summed in f32, the ring holding pairs of source channels side by side and
/// the weights packed per pair: by `vdpbf16ps`, or by AMX tiles. Made only where the CPU is
/// [`available`].
pub(super) struct Pairs {
    chunk: usize,
    packed: Vec<u32>,
    tiles: Option<Tiles>,
}

impl Pairs {
    /// The engine of `p` with weights `weight(o, i, t)`, by AMX tiles where `tiles`.
    pub(super) fn new(p: &Pass, tiles: bool, weight: impl Fn(usize, usize, usize) -> bf16) -> Self {
        assert!(available(), "the bf16 kernels need AVX512-BF16");
        let pairs = p.src_ch.div_ceil(2);
        let pair = |o, k, t| {
            let hi = match 2 * k + 1 < p.src_ch {
                true => weight(o, 2 * k + 1, t).to_bits(),
                false => 0,
            };
            u32::from(weight(o, 2 * k, t).to_bits()) | u32::from(hi) << 16
        };
        if tiles {
            return Self {
                chunk: 0,
                packed: Vec::new(),
                tiles: Some(Tiles::new(p, pair)),
            };
        }
        Self {
            chunk: p.chunk(pairs),
            packed: p.pack(pairs, pair),
            tiles: None,
        }
    }
}

impl Engine for Pairs {
    type Elem = bf16;

    fn units(&self, p: &Pass) -> usize {
        p.src_ch.div_ceil(2)
    }

    fn slot(&self, p: &Pass) -> usize {
        2 * p.plane
    }

    fn width(&self, p: &Pass) -> usize {
        self.tiles.as_ref().map_or(super::CO_MAX, |t| t.width(p))
    }

    fn block(&self, p: &Pass, ws: &mut Workspace<bf16>, o0: usize, co: usize) {
        if let Some(tiles) = &self.tiles {
            return tiles.block(p, ws, o0, co);
        }
        // SAFETY: `new` checked the CPU; the pass loaded the ring with this plane's pairs.
        unsafe { block_pairs(p, ws, self.chunk, &self.packed, o0, co) }
    }
}

thread_local! {
    /// Two f32 slots per worker, where [`Pass::paired`] fills a pair's channels.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Pass {
    /// The ring's fill of pair `k` from the source channels `channel(n, i)`.
    pub(super) fn pair_fill<'p, 'a: 'p, S: Operand + 'a>(
        &'p self,
        channel: impl Fn(usize, usize) -> &'a [S] + Sync + 'p,
    ) -> impl Fn(usize, usize, Option<usize>, &mut [bf16]) + Sync + 'p {
        let strided = self.stride[1..] != [1, 1];
        move |n, k, source, slot| {
            if strided {
                // Phase planes: each channel laid out as the f32 pass lays it, then paired.
                let fill = |n, i, s, to: &mut [f32]| self.fill_plane(channel(n, i), s, to);
                return self.paired(fill)(n, k, source, slot);
            }
            let second = (2 * k + 1 < self.src_ch).then(|| channel(n, 2 * k + 1));
            self.fill_pair(channel(n, 2 * k), second, source, slot)
        }
    }

    /// The ring's fill of pair `k` from an f32 pass's fill of one channel's slot: both
    /// channels filled in f32, then interleaved and rounded as [`Self::fill_pair`] does, so
    /// that any f32 pass (written over its source, computing its planes) has a bf16 form
    /// with the same bits as the bf16 pass over the tensor it reads.
    pub(super) fn paired<'p>(
        &'p self,
        fill: impl Fn(usize, usize, Option<usize>, &mut [f32]) + Sync + 'p,
    ) -> impl Fn(usize, usize, Option<usize>, &mut [bf16]) + Sync + 'p {
        move |n, k, source, slot| {
            SCRATCH.with_borrow_mut(|buf| {
                buf.resize(2 * self.plane, 0.0);
                let (a, b) = buf.split_at_mut(self.plane);
                fill(n, 2 * k, source, a);
                let second = 2 * k + 1 < self.src_ch;
                if second {
                    fill(n, 2 * k + 1, source, b);
                }
                f32::interleave(a, second.then_some(&*b), slot)
            })
        }
    }

    /// Source plane `source` of channels `a` and `b` (absent: zero) interleaved into a slot, at
    /// an in-plane stride of 1.
    pub(super) fn fill_pair<S: Operand>(
        &self,
        a: &[S],
        b: Option<&[S]>,
        source: Option<usize>,
        slot: &mut [bf16],
    ) {
        slot.fill(bf16::ZERO);
        let Some(s) = source else { return };
        let [_, sh, sw] = self.src;
        for r in 0..sh {
            let start = 2 * ((self.pad[1] + r) * self.wp + self.pad[2]);
            let row = (s * sh + r) * sw..(s * sh + r + 1) * sw;
            S::interleave(
                &a[row.clone()],
                b.map(|b| &b[row]),
                &mut slot[start..start + 2 * sw],
            );
        }
    }
}

/// `dst[j] = src[j]` rounded to bf16 (as `bf16::from_f32`), sixteen at a time where the CPU
/// has AVX512-BF16.
pub(super) fn round_row(src: &[f32], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len());
    match available() {
        // SAFETY: AVX512-BF16 checked; the lengths are equal.
        true => unsafe { round_row_avx512(src, dst) },
        false => dst
            .iter_mut()
            .zip(src)
            .for_each(|(d, &s)| *d = bf16::from_f32(s)),
    }
}

#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn round_row_avx512(src: &[f32], dst: &mut [bf16]) {
    let whole = src.len() / 16 * 16;
    for j in (0..whole).step_by(16) {
        let h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src.as_ptr().add(j)));
        _mm256_storeu_si256(
            dst.as_mut_ptr().add(j) as *mut __m256i,
            std::mem::transmute::<__m256bh, __m256i>(h),
        );
    }
    for (d, &s) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = bf16::from_f32(s);
    }
}

/// `dst[j] = src[j]` widened to f32, sixteen at a time where the CPU has AVX-512 (the same
/// values as `bf16::to_f32`; a NaN keeps its payload as it is, where `half` also sets its
/// quiet bit).
pub(super) fn widen_row(src: &[bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    match allows(Cap::Avx512) && is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F checked; the lengths are equal.
        true => unsafe { widen_row_avx512(src, dst) },
        false => dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32()),
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn widen_row_avx512(src: &[bf16], dst: &mut [f32]) {
    let whole = src.len() / 16 * 16;
    for j in (0..whole).step_by(16) {
        let h = _mm256_loadu_si256(src.as_ptr().add(j) as *const __m256i);
        let bits = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
        _mm512_storeu_si512(dst.as_mut_ptr().add(j) as *mut __m512i, bits);
    }
    for (d, s) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = s.to_f32();
    }
}

/// `out[2j] = a[j]`, `out[2j + 1] = b[j]` (zero without `b`), rounded to bf16 sixteen at a
/// time (`vcvtneps2bf16`, round to nearest even like `bf16::from_f32`).
pub(super) fn interleave_f32(a: &[f32], b: Option<&[f32]>, out: &mut [bf16]) {
    assert!(out.len() >= 2 * a.len() && b.is_none_or(|b| b.len() == a.len()));
    // SAFETY: AVX512-BF16 checked; the lengths were checked above.
    match available() {
        true => unsafe { interleave_avx512(a, b, out) },
        false => interleave_scalar(a, b, out),
    }
}

#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn interleave_avx512(a: &[f32], b: Option<&[f32]>, out: &mut [bf16]) {
    let whole = a.len() / 16 * 16;
    for j in (0..whole).step_by(16) {
        let bits = |v: &[f32]| {
            let h = _mm512_cvtneps_pbh(_mm512_loadu_ps(v.as_ptr().add(j)));
            _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(h))
        };
        let high = b.map_or(_mm512_setzero_si512(), |b| _mm512_slli_epi32(bits(b), 16));
        let pairs = _mm512_or_si512(bits(a), high);
        _mm512_storeu_si512(out.as_mut_ptr().add(2 * j) as *mut __m512i, pairs);
    }
    interleave_scalar(&a[whole..], b.map(|b| &b[whole..]), &mut out[2 * whole..]);
}

/// [`tiles`] for a block of `co` channels.
///
/// # Safety
/// The CPU is [`available`]; the ring holds the current plane's pairs.
unsafe fn block_pairs(
    p: &Pass,
    ws: &mut Workspace<bf16>,
    chunk: usize,
    packed: &[u32],
    o0: usize,
    co: usize,
) {
    match co {
        1 => tiles::<1>(p, ws, chunk, packed, o0),
        2 => tiles::<2>(p, ws, chunk, packed, o0),
        3 => tiles::<3>(p, ws, chunk, packed, o0),
        4 => tiles::<4>(p, ws, chunk, packed, o0),
        5 => tiles::<5>(p, ws, chunk, packed, o0),
        _ => tiles::<6>(p, ws, chunk, packed, o0),
    }
}

fn as_bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 64 bytes of plain lanes.
    unsafe { std::mem::transmute(v) }
}

/// Every tile of one block: `CO` channels x [`TILE`] positions, summed over the pairs of a
/// chunk (weights in L1) and every tap, into `ws.out` (f32).
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tiles<const CO: usize>(
    p: &Pass,
    ws: &mut Workspace<bf16>,
    chunk: usize,
    packed: &[u32],
    o0: usize,
) {
    let [kd, kh, kw] = p.kernel;
    let (taps, pairs) = (p.taps(), p.src_ch.div_ceil(2));
    let block = &packed[o0 * pairs * taps..][..CO * pairs * taps];
    let ring = ws.ring.data.as_ptr() as *const u16;
    let out = ws.out.as_mut_ptr();
    for k0 in (0..pairs).step_by(chunk) {
        let k1 = (k0 + chunk).min(pairs);
        for q0 in (0..p.q_pad).step_by(TILE) {
            let mut acc = [[_mm512_setzero_ps(); 4]; CO];
            if k0 > 0 {
                for (c, acc) in acc.iter_mut().enumerate() {
                    for (v, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_loadu_ps(out.add(c * p.q_pad + q0 + 16 * v));
                    }
                }
            }
            let mut w = block.as_ptr().add(k0 * taps * CO);
            for k in k0..k1 {
                for &slot in &ws.ring.order {
                    // Reads reach 2 * (q_pad + the last offset) < 2 * plane.
                    let base = ring.add((k * kd + slot) * ws.ring.slot + 2 * q0);
                    for b in 0..kh {
                        for &off in &p.offsets[b * kw..][..kw] {
                            let src = base.add(2 * off) as *const __m512i;
                            let x = [0, 1, 2, 3].map(|v| as_bh(_mm512_loadu_si512(src.add(v))));
                            for (co, acc) in acc.iter_mut().enumerate() {
                                let wv = as_bh(_mm512_set1_epi32(*w.add(co) as i32));
                                for (a, &xv) in acc.iter_mut().zip(&x) {
                                    *a = _mm512_dpbf16_ps(*a, xv, wv);
                                }
                            }
                            w = w.add(CO);
                        }
                    }
                }
            }
            for (c, acc) in acc.iter().enumerate() {
                for (v, &a) in acc.iter().enumerate() {
                    _mm512_storeu_ps(out.add(c * p.q_pad + q0 + 16 * v), a);
                }
            }
        }
    }
}

/// [`weight_rows`] for `co` channels of a kernel `p.kernel[2]` (1 to 3) wide.
///
/// # Safety
/// The CPU is [`available`]; `sw` holds `co` rows and planes readable as [`Sweep`] says.
unsafe fn weight_plane(p: &Pass, sw: &Sweep<bf16>, co: usize, dw: &mut [f32]) {
    macro_rules! by_width {
        ($kw:literal) => {
            match co {
                1 => weight_rows::<1, $kw>(p, sw, dw),
                2 => weight_rows::<2, $kw>(p, sw, dw),
                3 => weight_rows::<3, $kw>(p, sw, dw),
                4 => weight_rows::<4, $kw>(p, sw, dw),
                5 => weight_rows::<5, $kw>(p, sw, dw),
                _ => weight_rows::<6, $kw>(p, sw, dw),
            }
        };
    }
    match p.kernel[2] {
        1 => by_width!(1),
        2 => by_width!(2),
        _ => by_width!(3),
    }
}

/// Positions of the output gradient a weight-gradient sweep covers per source channel before
/// it moves to the next tap row: `CO` rows of this many (12 KiB at six channels) stay in L1
/// across the channel's taps. Swept whole, the rows of a first-level plane (50 KiB at six
/// channels) came from L2 once per tap row.
const SWEEP_SEGMENT: usize = 1024;

/// Adds one sweep's weight gradient of `CO` channels to `dw` (channel of the block, source
/// channel, tap): per source channel, segment of the sweep and tap row, `CO x KW` accumulators
/// swept 32 positions a step (pairs of neighbours in each lane) and kept between segments,
/// then summed across lanes once per source channel.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn weight_rows<const CO: usize, const KW: usize>(
    p: &Pass,
    sw: &Sweep<bf16>,
    dw: &mut [f32],
) {
    let [kd, kh, _] = p.kernel;
    let taps = p.taps();
    let (rows, len) = (sw.rows.as_ptr() as *const u16, sw.len);
    // Per tap row (a, b): the lanes of its accumulators between segments.
    let mut lanes: Vec<Kept<CO, KW>> = vec![[[[0f32; 16]; KW]; CO]; kd * kh];
    for i in 0..p.src_ch {
        lanes.iter_mut().for_each(|l| *l = [[[0f32; 16]; KW]; CO]);
        for s0 in (0..len).step_by(SWEEP_SEGMENT) {
            let s1 = len.min(s0 + SWEEP_SEGMENT);
            for a in 0..kd {
                let plane = sw.planes[i * kd + a] as *const u16;
                for b in 0..kh {
                    let kept = &mut lanes[a * kh + b];
                    // Reads reach len - 1 + the last offset, inside what the sweep holds.
                    let reads: [*const u16; KW] =
                        std::array::from_fn(|c| plane.add(sw.offsets[b * KW + c]));
                    let mut acc = sums::load(kept);
                    for q in (s0..s1).step_by(32) {
                        let d: [__m512bh; CO] = std::array::from_fn(|k| {
                            as_bh(_mm512_loadu_si512(rows.add(k * len + q) as *const _))
                        });
                        for (c, read) in reads.iter().enumerate() {
                            let x = as_bh(_mm512_loadu_si512(read.add(q) as *const _));
                            for (acc, &d) in acc.iter_mut().zip(&d) {
                                acc[c] = _mm512_dpbf16_ps(acc[c], d, x);
                            }
                        }
                    }
                    sums::store(kept, &acc);
                }
            }
        }
        sums::add(&lanes, (i, p.src_ch, taps), dw);
    }
}
