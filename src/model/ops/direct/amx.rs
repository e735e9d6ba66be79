//! The bf16 passes by AMX tiles (`tdpbf16ps`): a tile multiply adds to a 16 x 16 block of f32
//! sums (destination channels x positions) the products of 16 pairs of source channels, 32
//! products a sum in one instruction.
//!
//! It reads the ring the dot-product kernels read (`bf16.rs`): a pair's slot holds, per
//! position, the two channels side by side, which is the layout a tile's second operand wants
//! (rows of pairs, 16 positions a row). So a tap's operand is 16 rows of 64 bytes, one from
//! each pair's slot, at the tap's offset: loaded by one `tileloadd` with the distance between
//! the pairs' slots as its stride, with no copy. The first operand is the weights of one tap,
//! packed per block (channel x pair). Sums stay in the tile registers over every pair and tap
//! of a group of positions, then are stored once into the block's planes.
//!
//! Tile instructions are written as inline assembly: the compiler never uses the tile
//! registers, so they keep their values between the statements of one block.

use std::arch::asm;

use half::bf16;

use super::weights::Sweep;
use super::{block, block_count, Operand, Pass, Workspace, CO_MAX, TILE_OUT_FLOATS};
use crate::model::ops::geometry::ConvGeom;
use crate::util::simd::amx_bf16;

/// Destination channels of one block: two tiles of 16 rows.
const WIDTH: usize = 32;
/// Rows of a tile, and pairs of one multiply.
const ROWS: usize = 16;

/// The weights of one pass packed for the tiles, and how its pairs split into multiplies.
pub(super) struct Tiles {
    /// Pairs of one multiply (at most [`ROWS`]); the ring's units past the last pair are zero.
    rows: usize,
    /// Multiplies over the pairs, per tap.
    steps: usize,
    /// Per block of destination channels (from its first channel on, `steps * taps * rows`
    /// per channel): per step and tap, the block's channels x `rows` pairs.
    packed: Vec<u32>,
}

impl Tiles {
    /// The tiles of `p` with the weights `pair(o, k, t)` of pair `k` (channels 2k, 2k + 1 in
    /// its low and high halves). Made only where [`amx_bf16`] holds.
    pub(super) fn new(p: &Pass, pair: impl Fn(usize, usize, usize) -> u32) -> Self {
        assert!(amx_bf16(), "the tile kernels need AMX-BF16");
        let pairs = p.src_ch.div_ceil(2);
        let steps = pairs.div_ceil(ROWS);
        let rows = pairs.div_ceil(steps);
        let taps = p.taps();
        let per_channel = steps * taps * rows;
        let mut packed = vec![0u32; p.dst_ch * per_channel];
        let width = Self::width_at(p);
        for (o0, co) in (0..block_count(p.dst_ch, width)).map(|b| block(p.dst_ch, width, b)) {
            let region = &mut packed[o0 * per_channel..][..co * per_channel];
            // Read in the weight tensor's order (pair, tap) per channel.
            for r in 0..co {
                for k in 0..pairs {
                    let (s, j) = (k / rows, k % rows);
                    for t in 0..taps {
                        region[((s * taps + t) * co + r) * rows + j] = pair(o0 + r, k, t);
                    }
                }
            }
        }
        Self {
            rows,
            steps,
            packed,
        }
    }

    /// Destination channels of one block: [`WIDTH`] where its sums fit [`TILE_OUT_FLOATS`],
    /// else [`CO_MAX`] (planes larger than 256 x 256).
    fn width_at(p: &Pass) -> usize {
        match WIDTH * p.q_pad <= TILE_OUT_FLOATS {
            true => WIDTH,
            false => CO_MAX,
        }
    }

    /// [`Self::width_at`] for the pass.
    pub(super) fn width(&self, p: &Pass) -> usize {
        Self::width_at(p)
    }

    /// The sums of destination channels `o0..o0 + co` over every position of the plane whose
    /// pairs the ring holds, into `ws.out` (`q_pad` apart).
    pub(super) fn block(&self, p: &Pass, ws: &mut Workspace<bf16>, o0: usize, co: usize) {
        // A tile has at most 16 rows: a wider block would fault.
        assert!((1..=Self::width_at(p)).contains(&co) && o0 + co <= p.dst_ch);
        let (rows, steps) = (self.rows, self.steps);
        ws.ring.reserve(steps * rows);
        if ws.out.len() < co * p.q_pad {
            ws.out.resize(co * p.q_pad, 0.0);
        }
        let taps = p.taps();
        let weights = &self.packed[o0 * steps * taps * rows..][..co * steps * taps * rows];
        // SAFETY: `new` checked that this process may run the tiles; the ring holds
        // `steps * rows` units of `kd` slots, `ws.out` holds `co` planes of `q_pad`, the
        // weights `co` rows per step and tap, and every read stays inside them (see `run`).
        unsafe { self.run(p, ws, weights, co) }
    }

    /// [`Self::block`]: two tiles of channels x two of positions (32 a step) where the
    /// block has more than 16 channels, else one x four (64 a step).
    ///
    /// # Safety
    /// As [`Self::block`] says.
    unsafe fn run(&self, p: &Pass, ws: &mut Workspace<bf16>, weights: &[u32], co: usize) {
        let rows = self.rows;
        let (m0, m1) = (co.min(ROWS), co.saturating_sub(ROWS));
        let config = Config::new(m0, m1, rows);
        asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, preserves_flags, readonly));
        let kd = p.kernel[0];
        let slot_bytes = 2 * ws.ring.slot;
        let pair_stride = kd * slot_bytes;
        let a_stride = 4 * rows;
        let c_stride = 4 * p.q_pad;
        let ring = ws.ring.data.as_ptr() as *const u8;
        let out = ws.out.as_mut_ptr() as *mut u8;
        let step = if m1 > 0 { 32 } else { 64 };
        for q0 in (0..p.q_pad).step_by(step) {
            // Sums: tmm0 to tmm3 in both forms.
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nomem, nostack, preserves_flags)
            );
            let mut a = weights.as_ptr() as *const u8;
            for s in 0..self.steps {
                for &slot in &ws.ring.order {
                    // Pair `s * rows`'s slot, at position q0: each pair's is `pair_stride` on.
                    let base = ring.add((s * rows * kd + slot) * slot_bytes + 4 * q0);
                    for &off in &p.offsets {
                        // Reads reach 4 * (q0 + step - 1 + off) + 3 < 4 * plane in each of the
                        // `rows` slots (q0 + step <= q_pad).
                        let b = base.add(4 * off);
                        if m1 > 0 {
                            asm!(
                                "tileloadd tmm6, [{b} + {bs}]",
                                "tileloadd tmm7, [{b} + {bs} + 64]",
                                "tileloadd tmm4, [{a} + {as}]",
                                "tileloadd tmm5, [{a1} + {as}]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm1, tmm4, tmm7",
                                "tdpbf16ps tmm2, tmm5, tmm6",
                                "tdpbf16ps tmm3, tmm5, tmm7",
                                b = in(reg) b,
                                bs = in(reg) pair_stride,
                                a = in(reg) a,
                                a1 = in(reg) a.add(m0 * a_stride),
                                as = in(reg) a_stride,
                                options(nostack, preserves_flags, readonly)
                            );
                        } else {
                            asm!(
                                "tileloadd tmm4, [{a} + {as}]",
                                "tileloadd tmm5, [{b} + {bs}]",
                                "tdpbf16ps tmm0, tmm4, tmm5",
                                "tileloadd tmm6, [{b} + {bs} + 64]",
                                "tdpbf16ps tmm1, tmm4, tmm6",
                                "tileloadd tmm7, [{b} + {bs} + 128]",
                                "tdpbf16ps tmm2, tmm4, tmm7",
                                "tileloadd tmm5, [{b} + {bs} + 192]",
                                "tdpbf16ps tmm3, tmm4, tmm5",
                                b = in(reg) b,
                                bs = in(reg) pair_stride,
                                a = in(reg) a,
                                as = in(reg) a_stride,
                                options(nostack, preserves_flags, readonly)
                            );
                        }
                        a = a.add(co * a_stride);
                    }
                }
            }
            // Sums of tmm2, tmm3: the second tile of channels, or positions 32-63.
            let c = out.add(4 * q0);
            let c2 = match m1 > 0 {
                true => c.add(ROWS * c_stride),
                false => c.add(128),
            };
            asm!(
                "tilestored [{c} + {cs}], tmm0",
                "tilestored [{c} + {cs} + 64], tmm1",
                "tilestored [{c2} + {cs}], tmm2",
                "tilestored [{c2} + {cs} + 64], tmm3",
                c = in(reg) c,
                c2 = in(reg) c2,
                cs = in(reg) c_stride,
                options(nostack, preserves_flags)
            );
        }
        asm!("tilerelease", options(nomem, nostack, preserves_flags));
    }
}

/// `dw` (f32 sums) from `x` (its channels given by `channel(n, i)`) and `dy` of a convolution
/// padded less than its kernel, at any stride, whose kernel is 1 to 3 wide (None otherwise);
/// only where [`amx_bf16`] holds.
///
/// Per sweep (`weights.rs`), a block of destination channels and a block of 16 source
/// channels: the output gradient's rows laid out as the tiles' second operand (rows of 16
/// pairs of neighbouring positions, one pair per channel), then per depth tap and group of up
/// to four in-plane taps, one tile of sums per tap (source x destination channels) swept over
/// the positions 32 at a time, the source rows at each tap's offset loaded in place.
pub(super) fn grad_weight<'a, S: Operand + 'a>(
    g: &ConvGeom,
    channel: impl Fn(usize, usize) -> &'a [S] + Sync,
    dy: &[S],
) -> Option<Vec<f32>> {
    assert!(amx_bf16(), "the tile kernels need AMX-BF16");
    if !(1..=3).contains(&g.kernel[2]) {
        return None;
    }
    let pass = Pass::forward(g);
    let fill = |n, i, s, slot: &mut [bf16]| pass.fill_plane(channel(n, i), s, slot);
    // Blocks of 16 destination channels, narrower where a block per worker needs it (the
    // sweep's items split samples and blocks).
    let groups = rayon::current_num_threads().div_ceil(g.batch);
    let width = g.cout.div_ceil(groups).clamp(1, ROWS);
    // SAFETY: checked above; the sweep holds what `weight_tiles` reads.
    let kernel =
        |sweep: &Sweep<bf16>, co, out: &mut [f32]| unsafe { weight_tiles(&pass, sweep, co, out) };
    Some(pass.weight_sweeps((g.cin, width), fill, dy, kernel))
}

thread_local! {
    /// Per worker: the output gradient's rows as a tile operand, and one tile's sums.
    static ROWS_T: std::cell::RefCell<(Vec<u32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Adds one sweep's weight gradient of `co` (at most 16) destination channels to `dw` (channel
/// of the block, source channel, tap).
///
/// # Safety
/// [`amx_bf16`] holds; `sw` holds `co` rows of `sw.len` (a multiple of 32) and planes readable
/// as [`Sweep`] says, one source channel's planes a fixed distance from the last's.
unsafe fn weight_tiles(p: &Pass, sw: &Sweep<bf16>, co: usize, dw: &mut [f32]) {
    let (kd, taps, len) = (p.kernel[0], p.taps(), sw.len);
    debug_assert!((1..=ROWS).contains(&co) && len % 32 == 0);
    let inplane = sw.offsets.len();
    let src_ch = p.src_ch;
    ROWS_T.with_borrow_mut(|(rows_t, sums)| {
        // Row j: the positions 2j, 2j + 1 of each channel side by side.
        let half = len / 2;
        rows_t.clear();
        rows_t.resize(half * co, 0);
        // Written in order, read 16 rows at once: the other way round (each value's write a
        // cache line past the last) this took a fifth of the weight gradient.
        let pairs = sw.rows.as_ptr() as *const u32;
        for (j, row) in rows_t.chunks_exact_mut(co).enumerate() {
            for (k, v) in row.iter_mut().enumerate() {
                *v = pairs.add(k * half + j).read_unaligned();
            }
        }
        sums.resize(4 * ROWS * ROWS, 0.0);
        let b_stride = 4 * co;
        let unit_stride = match src_ch > 1 {
            true => (sw.planes[kd] as usize).wrapping_sub(sw.planes[0] as usize),
            false => 0,
        };
        debug_assert!((0..src_ch * kd).all(|u| {
            let (i, a) = (u / kd, u % kd);
            sw.planes[u] as usize == (sw.planes[a] as usize).wrapping_add(i * unit_stride)
        }));
        for i0 in (0..src_ch).step_by(ROWS) {
            let mi = ROWS.min(src_ch - i0);
            let config = Config::weights(mi, co);
            asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, preserves_flags, readonly));
            for a in 0..kd {
                let x = sw.planes[i0 * kd + a] as *const u8;
                for (g0, group) in sw.offsets.chunks(4).enumerate() {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        options(nomem, nostack, preserves_flags)
                    );
                    for q in (0..len).step_by(32) {
                        asm!(
                            "tileloadd tmm7, [{b} + {bs}]",
                            b = in(reg) rows_t.as_ptr().add(q / 2 * co),
                            bs = in(reg) b_stride,
                            options(nostack, preserves_flags, readonly)
                        );
                        for (j, &off) in group.iter().enumerate() {
                            // Reads reach len - 1 + the last offset, inside the sweep.
                            let at = x.add(2 * (q + off));
                            tap_product(j, at, unit_stride);
                        }
                    }
                    asm!(
                        "tilestored [{s} + {ss}], tmm0",
                        "tilestored [{s} + {ss} + 1024], tmm1",
                        "tilestored [{s} + {ss} + 2048], tmm2",
                        "tilestored [{s} + {ss} + 3072], tmm3",
                        s = in(reg) sums.as_mut_ptr(),
                        ss = in(reg) 64usize,
                        options(nostack, preserves_flags)
                    );
                    for j in 0..group.len() {
                        let t = a * inplane + 4 * g0 + j;
                        for r in 0..mi {
                            let row = &sums[(j * ROWS + r) * ROWS..][..co];
                            for (k, &v) in row.iter().enumerate() {
                                dw[(k * src_ch + i0 + r) * taps + t] += v;
                            }
                        }
                    }
                }
            }
        }
        asm!("tilerelease", options(nomem, nostack, preserves_flags));
    })
}

/// Sums `j` (tmm0 to tmm3) += the source rows at `at` (`stride` apart) x the output gradient
/// in tmm7, the rows loaded into tmm4, tmm5, tmm6 in turn.
///
/// # Safety
/// The weight-gradient configuration is loaded; `at` holds the tile's rows.
#[inline(always)]
unsafe fn tap_product(j: usize, at: *const u8, stride: usize) {
    macro_rules! product {
        ($a:literal, $c:literal) => {
            asm!(
                concat!("tileloadd ", $a, ", [{x} + {xs}]"),
                concat!("tdpbf16ps ", $c, ", ", $a, ", tmm7"),
                x = in(reg) at,
                xs = in(reg) stride,
                options(nostack, preserves_flags, readonly)
            )
        };
    }
    match j {
        0 => product!("tmm4", "tmm0"),
        1 => product!("tmm5", "tmm1"),
        2 => product!("tmm6", "tmm2"),
        _ => product!("tmm4", "tmm3"),
    }
}

/// A tile configuration (`ldtilecfg`'s 64 bytes, palette 1): per tile register its rows and
/// bytes a row.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl Config {
    /// The weight gradient's: tmm0 to tmm3 sums of `mi` source x `co` destination channels
    /// (one per tap), tmm4 to tmm6 source rows (32 positions), tmm7 the output gradient (16
    /// pairs of positions x `co` channels).
    fn weights(mi: usize, co: usize) -> Self {
        let mut c = Self::new(1, 0, 1);
        for t in 0..4 {
            c.rows[t] = mi as u8;
            c.colsb[t] = (4 * co) as u16;
        }
        for t in 4..7 {
            c.rows[t] = mi as u8;
            c.colsb[t] = 64;
        }
        c.rows[7] = ROWS as u8;
        c.colsb[7] = (4 * co) as u16;
        c
    }

    /// Sums of `m0` (and `m1`: a second tile of channels; none where 0) channels x 16
    /// positions, weights `rows` pairs wide, positions of `rows` pairs.
    ///
    /// Two tiles of channels: tmm0, tmm1 sums of the first (positions 0-15, 16-31), tmm2,
    /// tmm3 of the second; tmm4, tmm5 their weights; tmm6, tmm7 the positions. One: tmm0 to
    /// tmm3 sums of four groups of 16 positions; tmm4 the weights; tmm5 to tmm7 positions.
    fn new(m0: usize, m1: usize, rows: usize) -> Self {
        let mut c = Self {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        let mut set = |t: usize, r: usize, bytes: usize| {
            c.rows[t] = r as u8;
            c.colsb[t] = bytes as u16;
        };
        if m1 > 0 {
            for (t, m) in [(0, m0), (1, m0), (2, m1), (3, m1)] {
                set(t, m, 64);
            }
            set(4, m0, 4 * rows);
            set(5, m1, 4 * rows);
            set(6, rows, 64);
            set(7, rows, 64);
        } else {
            for t in 0..4 {
                set(t, m0, 64);
            }
            set(4, m0, 4 * rows);
            for t in 5..8 {
                set(t, rows, 64);
            }
        }
        c
    }
}
