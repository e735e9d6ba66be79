//! The register-tiled inner loops of the direct convolution, and the choice of instruction set.

#[cfg(target_arch = "x86_64")]
use super::weights::Sweep;
use super::{block, block_count, Pass, Workspace, CHUNK_BYTES, CO_MAX, TILE};
#[cfg(target_arch = "x86_64")]
use crate::util::simd::{allows, Cap};

/// The instruction set the kernel was compiled for, chosen once per pass.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

impl Kernel {
    /// The widest this CPU runs within `VOXCACHE_SIMD`'s cap.
    pub(super) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let fma = is_x86_feature_detected!("fma");
            if allows(Cap::Avx512) && fma && is_x86_feature_detected!("avx512f") {
                return Self::Avx512;
            }
            if allows(Cap::Avx2) && fma && is_x86_feature_detected!("avx2") {
                return Self::Avx2;
            }
        }
        Self::Portable
    }

    /// All tiles of the output planes `o0..o0 + co` (`co <= CO_MAX`) into `ws.out`.
    fn block(
        self,
        p: &Pass,
        ws: &mut Workspace<f32>,
        chunk: usize,
        packed: &[f32],
        o0: usize,
        co: usize,
    ) {
        macro_rules! by_width {
            ($f:ident) => {
                match co {
                    1 => $f::<1>(p, ws, chunk, packed, o0),
                    2 => $f::<2>(p, ws, chunk, packed, o0),
                    3 => $f::<3>(p, ws, chunk, packed, o0),
                    4 => $f::<4>(p, ws, chunk, packed, o0),
                    5 => $f::<5>(p, ws, chunk, packed, o0),
                    _ => $f::<6>(p, ws, chunk, packed, o0),
                }
            };
        }
        match self {
            // SAFETY: the CPU has the features these were compiled for (detected above).
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => unsafe { by_width!(block_avx512) },
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => unsafe { by_width!(block_avx2) },
            Self::Portable => by_width!(block_portable),
        }
    }
}

impl Pass {
    /// Source units (channels, or pairs of them) per chunk: as many as keep a chunk's packed
    /// weights and the slot rows its tiles share within [`CHUNK_BYTES`], in chunks of equal
    /// size. Every engine's unit is 4 bytes a weight and a position (an f32, or a bf16 pair).
    pub(super) fn chunk(&self, units: usize) -> usize {
        let per_unit = 4 * (self.taps() * CO_MAX + self.kernel[0] * self.tile_window());
        let chunks = units.div_ceil((CHUNK_BYTES / per_unit).max(1)).max(1);
        units.div_ceil(chunks)
    }

    /// Positions of one slot that a tile and the next tiles reuse: per phase plane, from its
    /// first tap's offset to a tile past its last (stride 1: two rows and a tile).
    pub(super) fn tile_window(&self) -> usize {
        let mut window = 0;
        let mut phase_taps = self.offsets.clone();
        phase_taps.sort_unstable();
        for run in phase_taps.chunk_by(|a, b| a / self.phase == b / self.phase) {
            window += run[run.len() - 1] - run[0] + TILE;
        }
        window
    }

    /// The weights `weight(o, u, t)` of `units` source units per block of destination
    /// channels, laid out (unit, tap, channel of the block).
    ///
    /// A channel's weights are read in (unit, tap) order, their order in the weight tensor
    /// (forward), and written `co` apart into the block's region, which stays in L2 (read in
    /// packed order, six rows a tensor row apart, this took 7% of a small plan's predict).
    pub(super) fn pack<T: Copy + Default>(
        &self,
        units: usize,
        weight: impl Fn(usize, usize, usize) -> T,
    ) -> Vec<T> {
        let taps = self.taps();
        let mut packed = vec![T::default(); self.dst_ch * units * taps];
        let mut at = 0;
        for (o0, co) in (0..block_count(self.dst_ch, CO_MAX)).map(|b| block(self.dst_ch, CO_MAX, b))
        {
            let region = &mut packed[at..at + co * units * taps];
            for k in 0..co {
                for u in 0..units {
                    let run = &mut region[u * taps * co..][..taps * co];
                    for t in 0..taps {
                        run[t * co + k] = weight(o0 + k, u, t);
                    }
                }
            }
            at += co * units * taps;
        }
        packed
    }
}

/// What a pass multiplies in: the elements of its ring, the ring units its sources make
/// (channels, or pairs of them) and the kernel that sums a block of destination channels. The
/// same passes (into a new buffer, written over their source) run every engine.
pub(super) trait Engine: Sync {
    type Elem: Copy + Default + Send;
    /// Ring units of `p`'s sources.
    fn units(&self, p: &Pass) -> usize;
    /// Elements of one ring slot.
    fn slot(&self, p: &Pass) -> usize;
    /// Destination channels of one block at most.
    fn width(&self, _p: &Pass) -> usize {
        CO_MAX
    }
    /// All tiles of the destination planes `o0..o0 + co` (`co <= width`) into `ws.out`.
    fn block(&self, p: &Pass, ws: &mut Workspace<Self::Elem>, o0: usize, co: usize);
}

/// f32 products and sums, the weights packed per source channel.
pub(super) struct F32 {
    kernel: Kernel,
    chunk: usize,
    packed: Vec<f32>,
}

impl F32 {
    /// The engine of `p` with weights `weight(o, i, t)`.
    pub(super) fn new(
        kernel: Kernel,
        p: &Pass,
        weight: impl Fn(usize, usize, usize) -> f32,
    ) -> Self {
        Self {
            kernel,
            chunk: p.chunk(p.src_ch),
            packed: p.pack(p.src_ch, weight),
        }
    }
}

impl Engine for F32 {
    type Elem = f32;

    fn units(&self, p: &Pass) -> usize {
        p.src_ch
    }

    fn slot(&self, p: &Pass) -> usize {
        p.plane
    }

    fn block(&self, p: &Pass, ws: &mut Workspace<f32>, o0: usize, co: usize) {
        self.kernel.block(p, ws, self.chunk, &self.packed, o0, co)
    }
}

/// Positions of the output gradient a weight-gradient sweep covers per source channel before
/// it moves to the next tap row: `CO` rows of this many (12 KiB at six channels) stay in L1
/// across the channel's taps. Swept whole, the rows of a first-level plane (100 KiB at six
/// channels) came from L2 once per tap row.
#[cfg(target_arch = "x86_64")]
const SWEEP_SEGMENT: usize = 512;

/// The weight-gradient sweep at one vector width: `$name::<CO, KW>(p, sw, rows, dw)` adds
/// one sweep's weight gradient of `CO` channels (their dy rows from `rows`, `sw.len` apart)
/// to `dw`, laid out (channel of the block, source channel, tap). For every source channel,
/// segment of the sweep and tap row (a, b): `CO x KW` vector accumulators swept along the
/// segment and kept between segments, then each summed across its lanes (`$reduce`) once per
/// source channel. Written with intrinsics: the compiler left the portable form of this loop
/// scalar (23x slower), so CPUs without AVX2 keep the column path for this gradient.
///
/// Safety of the functions made: the CPU has `$feature`; `rows` holds `CO` rows of `sw.len`
/// and `sw` planes readable as [`Sweep`] says.
#[cfg(target_arch = "x86_64")]
macro_rules! sweep_kernel {
    ($name:ident, $feature:literal, $vec:ty, $lanes:literal, $load:ident, $store:ident,
     $fmadd:ident, $reduce:expr) => {
        #[target_feature(enable = $feature)]
        unsafe fn $name<const CO: usize, const KW: usize>(
            p: &Pass,
            sw: &Sweep<f32>,
            rows: *const f32,
            dw: &mut [f32],
        ) {
            use std::arch::x86_64::*;
            let [kd, kh, _] = p.kernel;
            let taps = p.taps();
            let len = sw.len;
            // Per tap row (a, b): the lanes of its accumulators between segments.
            let mut lanes = vec![[[[0f32; $lanes]; KW]; CO]; kd * kh];
            for i in 0..p.src_ch {
                lanes
                    .iter_mut()
                    .for_each(|l| *l = [[[0f32; $lanes]; KW]; CO]);
                for s0 in (0..len).step_by(SWEEP_SEGMENT) {
                    let s1 = len.min(s0 + SWEEP_SEGMENT);
                    for a in 0..kd {
                        let plane = sw.planes[i * kd + a];
                        for b in 0..kh {
                            let kept = &mut lanes[a * kh + b];
                            // Reads reach len - 1 + the last offset, inside the sweep.
                            let reads: [*const f32; KW] =
                                std::array::from_fn(|c| plane.add(sw.offsets[b * KW + c]));
                            let mut acc: [[$vec; KW]; CO] = std::array::from_fn(|k| {
                                std::array::from_fn(|c| $load(kept[k][c].as_ptr()))
                            });
                            for q in (s0..s1).step_by($lanes) {
                                // The taps' inputs first, then one row of dy at a time.
                                let x: [$vec; KW] = std::array::from_fn(|c| $load(reads[c].add(q)));
                                for (k, acc) in acc.iter_mut().enumerate() {
                                    let d = $load(rows.add(k * len + q));
                                    for (a, &x) in acc.iter_mut().zip(&x) {
                                        *a = $fmadd(d, x, *a);
                                    }
                                }
                            }
                            for (kept, acc) in kept.iter_mut().zip(&acc) {
                                for (kept, &acc) in kept.iter_mut().zip(acc) {
                                    $store(kept.as_mut_ptr(), acc);
                                }
                            }
                        }
                    }
                }
                for (ab, kept) in lanes.iter().enumerate() {
                    for (k, row) in kept.iter().enumerate() {
                        let at = (k * p.src_ch + i) * taps + ab * KW;
                        for (d, l) in dw[at..at + KW].iter_mut().zip(row) {
                            *d += $reduce(l);
                        }
                    }
                }
            }
        }
    };
}

// Six channels a sweep: 18 accumulators, 3 inputs and a dy row of the 32 registers.
#[cfg(target_arch = "x86_64")]
sweep_kernel!(
    grad_weight_avx512,
    "avx512f",
    __m512,
    16,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_fmadd_ps,
    |l: &[f32; 16]| _mm512_reduce_add_ps(_mm512_loadu_ps(l.as_ptr()))
);
// Three channels a sweep (CO <= 3): 9 accumulators, 3 inputs and a dy row of the 16.
#[cfg(target_arch = "x86_64")]
sweep_kernel!(
    grad_weight_avx2,
    "avx2,fma",
    __m256,
    8,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_fmadd_ps,
    |l: &[f32; 8]| l.iter().sum::<f32>()
);

/// [`grad_weight_avx2`] for `co` channels of a kernel `p.kernel[2]` (1 to 3) wide, three
/// channels at a time.
///
/// # Safety
/// The CPU has AVX2 and FMA; `sw` holds `co` rows and planes readable as [`Sweep`] says.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn grad_weight_plane_avx2(p: &Pass, sw: &Sweep<f32>, co: usize, dw: &mut [f32]) {
    let per_channel = p.src_ch * p.taps();
    for k0 in (0..co).step_by(3) {
        let rows = sw.rows.as_ptr().add(k0 * sw.len);
        let dw = &mut dw[k0 * per_channel..];
        macro_rules! by_width {
            ($kw:literal) => {
                match co - k0 {
                    1 => grad_weight_avx2::<1, $kw>(p, sw, rows, dw),
                    2 => grad_weight_avx2::<2, $kw>(p, sw, rows, dw),
                    _ => grad_weight_avx2::<3, $kw>(p, sw, rows, dw),
                }
            };
        }
        match p.kernel[2] {
            1 => by_width!(1),
            2 => by_width!(2),
            _ => by_width!(3),
        }
    }
}

/// [`grad_weight_avx512`] for `co` channels of a kernel `p.kernel[2]` (1 to 3) wide.
///
/// # Safety
/// The CPU has AVX-512F; `sw` holds `co` rows and planes readable as [`Sweep`] says.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn grad_weight_plane_avx512(
    p: &Pass,
    sw: &Sweep<f32>,
    co: usize,
    dw: &mut [f32],
) {
    let rows = sw.rows.as_ptr();
    macro_rules! by_width {
        ($kw:literal) => {
            match co {
                1 => grad_weight_avx512::<1, $kw>(p, sw, rows, dw),
                2 => grad_weight_avx512::<2, $kw>(p, sw, rows, dw),
                3 => grad_weight_avx512::<3, $kw>(p, sw, rows, dw),
                4 => grad_weight_avx512::<4, $kw>(p, sw, rows, dw),
                5 => grad_weight_avx512::<5, $kw>(p, sw, rows, dw),
                _ => grad_weight_avx512::<6, $kw>(p, sw, rows, dw),
            }
        };
    }
    match p.kernel[2] {
        1 => by_width!(1),
        2 => by_width!(2),
        _ => by_width!(3),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn block_avx512<const CO: usize>(
    p: &Pass,
    ws: &mut Workspace<f32>,
    chunk: usize,
    w: &[f32],
    o0: usize,
) {
    block_tiles::<CO, true>(p, ws, chunk, w, o0)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2<const CO: usize>(
    p: &Pass,
    ws: &mut Workspace<f32>,
    chunk: usize,
    w: &[f32],
    o0: usize,
) {
    block_tiles::<CO, true>(p, ws, chunk, w, o0)
}

/// Whether the portable build fuses its multiply-adds: where the target has the instruction
/// (aarch64; x86 only when built for FMA). Without it `f32::mul_add` is a library call, which
/// made the portable training step 110x the AVX-512 one (33.7 s) on x86; a multiply and an
/// add round twice instead, within the tests' tolerance of the naive sums.
pub(super) const PORTABLE_FUSED: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));

/// `a * b + c`, fused if `FUSED`.
#[inline(always)]
pub(super) fn madd<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    match FUSED {
        true => a.mul_add(b, c),
        false => a * b + c,
    }
}

fn block_portable<const CO: usize>(
    p: &Pass,
    ws: &mut Workspace<f32>,
    chunk: usize,
    w: &[f32],
    o0: usize,
) {
    block_tiles::<CO, PORTABLE_FUSED>(p, ws, chunk, w, o0)
}

/// Every tile of one block, chunk by chunk of source channels (a chunk's weights stay in L1).
#[inline(always)]
fn block_tiles<const CO: usize, const FUSED: bool>(
    p: &Pass,
    ws: &mut Workspace<f32>,
    chunk: usize,
    packed: &[f32],
    o0: usize,
) {
    let taps = p.taps();
    let block = &packed[o0 * p.src_ch * taps..][..CO * p.src_ch * taps];
    for i0 in (0..p.src_ch).step_by(chunk) {
        let i1 = (i0 + chunk).min(p.src_ch);
        let weights = &block[i0 * taps * CO..i1 * taps * CO];
        for q0 in (0..p.q_pad).step_by(TILE) {
            tile::<CO, FUSED>(p, ws, i0..i1, q0, weights, i0 > 0);
        }
    }
}

/// `CO` output channels x [`TILE`] positions from `q0`, summed over source channels `chans`
/// and every tap, added to `ws.out` when `accumulate` (later chunks) or written.
#[inline(always)]
fn tile<const CO: usize, const FUSED: bool>(
    p: &Pass,
    ws: &mut Workspace<f32>,
    chans: std::ops::Range<usize>,
    q0: usize,
    weights: &[f32],
    accumulate: bool,
) {
    let mut acc = [[0f32; TILE]; CO];
    if accumulate {
        for (co, a) in acc.iter_mut().enumerate() {
            a.copy_from_slice(&ws.out[co * p.q_pad + q0..][..TILE]);
        }
    }
    let mut w = weights.chunks_exact(CO);
    for i in chans {
        for &slot in &ws.ring.order {
            let plane = &ws.ring.at(i, slot)[q0..];
            for &off in &p.offsets {
                let x: &[f32; TILE] = plane[off..][..TILE].try_into().unwrap();
                let wt = w.next().unwrap();
                for (a, &wv) in acc.iter_mut().zip(wt) {
                    for (s, &v) in a.iter_mut().zip(x) {
                        *s = madd::<FUSED>(wv, v, *s);
                    }
                }
            }
        }
    }
    for (co, a) in acc.iter().enumerate() {
        ws.out[co * p.q_pad + q0..][..TILE].copy_from_slice(a);
    }
}
