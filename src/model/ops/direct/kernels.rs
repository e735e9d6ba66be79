//! The register-tiled inner loops of the direct convolution, and the choice of instruction set.

#[cfg(target_arch = "x86_64")]
use super::weights::{sums, Kept, Sweep};
use super::{Pass, Workspace, TILE};

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
    pub(super) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
                return Self::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
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
            Self::Portable => by_width!(block_tiles),
        }
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
    /// All tiles of the destination planes `o0..o0 + co` (`co <= CO_MAX`) into `ws.out`.
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

/// Adds one sweep's weight gradient of `CO` channels to `dw`, laid out (channel of the block,
/// source channel, tap): for every source channel, segment of the sweep and tap row (a, b),
/// `CO x KW` vector accumulators swept along the segment and kept between segments, then each
/// summed across its lanes once per source channel. Written with AVX-512
/// intrinsics: the compiler left the portable form of this loop scalar (23x slower), so other
/// CPUs keep the column path for this gradient.
///
/// # Safety
/// The CPU has AVX-512F; `sw` holds `CO` rows and planes readable as [`Sweep`] says.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn grad_weight_avx512<const CO: usize, const KW: usize>(
    p: &Pass,
    sw: &Sweep<f32>,
    dw: &mut [f32],
) {
    use std::arch::x86_64::*;
    let [kd, kh, _] = p.kernel;
    let taps = p.taps();
    let (rows, len) = (sw.rows.as_ptr(), sw.len);
    // Per tap row (a, b): the lanes of its accumulators between segments of the sweep.
    let mut lanes: Vec<Kept<CO, KW>> = vec![[[[0f32; 16]; KW]; CO]; kd * kh];
    for i in 0..p.src_ch {
        lanes.iter_mut().for_each(|l| *l = [[[0f32; 16]; KW]; CO]);
        for s0 in (0..len).step_by(SWEEP_SEGMENT) {
            let s1 = len.min(s0 + SWEEP_SEGMENT);
            for a in 0..kd {
                let plane = sw.planes[i * kd + a];
                for b in 0..kh {
                    let kept = &mut lanes[a * kh + b];
                    // Reads reach len - 1 + the last offset, inside what the sweep holds.
                    let reads: [*const f32; KW] =
                        std::array::from_fn(|c| plane.add(sw.offsets[b * KW + c]));
                    let mut acc = sums::load(kept);
                    for q in (s0..s1).step_by(16) {
                        // The taps' inputs first, then one row of dy at a time: 22 registers
                        // live.
                        let x: [__m512; KW] =
                            std::array::from_fn(|c| _mm512_loadu_ps(reads[c].add(q)));
                        for (k, acc) in acc.iter_mut().enumerate() {
                            let d = _mm512_loadu_ps(rows.add(k * len + q));
                            for (a, &x) in acc.iter_mut().zip(&x) {
                                *a = _mm512_fmadd_ps(d, x, *a);
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

/// [`grad_weight_avx512`] for `co` channels of a kernel `p.kernel[2]` (1 to 3) wide.
///
/// # Safety
/// As [`grad_weight_avx512`].
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn grad_weight_plane(p: &Pass, sw: &Sweep<f32>, co: usize, dw: &mut [f32]) {
    macro_rules! by_width {
        ($kw:literal) => {
            match co {
                1 => grad_weight_avx512::<1, $kw>(p, sw, dw),
                2 => grad_weight_avx512::<2, $kw>(p, sw, dw),
                3 => grad_weight_avx512::<3, $kw>(p, sw, dw),
                4 => grad_weight_avx512::<4, $kw>(p, sw, dw),
                5 => grad_weight_avx512::<5, $kw>(p, sw, dw),
                _ => grad_weight_avx512::<6, $kw>(p, sw, dw),
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
    block_tiles::<CO>(p, ws, chunk, w, o0)
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
    block_tiles::<CO>(p, ws, chunk, w, o0)
}

/// Every tile of one block, chunk by chunk of source channels (a chunk's weights stay in L1).
#[inline(always)]
fn block_tiles<const CO: usize>(
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
            tile::<CO>(p, ws, i0..i1, q0, weights, i0 > 0);
        }
    }
}

/// `CO` output channels x [`TILE`] positions from `q0`, summed over source channels `chans`
/// and every tap, added to `ws.out` when `accumulate` (later chunks) or written.
#[inline(always)]
fn tile<const CO: usize>(
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
                        *s = wv.mul_add(v, *s);
                    }
                }
            }
        }
    }
    for (co, a) in acc.iter().enumerate() {
        ws.out[co * p.q_pad + q0..][..TILE].copy_from_slice(a);
    }
}
