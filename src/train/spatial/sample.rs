//! The general path: output tiles of 8x8x8 voxels, each voxel's cell and fractions from its
//! source coordinate, then each array interpolated there (`sample`); in the vector builds
//! rows of 8 voxels at once through [`super::gather`] (`sample_rows`, which also serves the
//! derived arrays). Any map takes it: rotations in 3D, elastic deformations.

use super::reader::{Sampling, TransformedReader};
#[cfg(target_arch = "x86_64")]
use super::{gather, put_row};

/// Output tile (z, y, x) of the interpolation loop.
pub(super) const TILE: [usize; 3] = [8, 8, 8];
// A tile row is one 8-lane vector in the AVX2 path.
const _: () = assert!(TILE[2] == 8);

impl TransformedReader {
    /// [`TransformedReader::sample`] in vectors, compiled for AVX2 (without FMA: the same
    /// operations, so the same values).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sample_avx2(
        &mut self,
        flat: bool,
        job: &Sampling,
        image: &mut [f32],
        label: Option<&mut [u16]>,
    ) {
        // Cells are computed in i32 lanes: boxes past that take the portable path's loop.
        let vectors = job.bs.iter().product::<usize>() < i32::MAX as usize;
        match (vectors, flat) {
            (true, true) => self.sample_rows::<true, false>(job, image, label),
            (true, false) => self.sample_rows::<false, false>(job, image, label),
            (false, true) => self.sample::<true>(job, image, label),
            (false, false) => self.sample::<false>(job, image, label),
        }
    }

    /// [`TransformedReader::sample`] in vectors: the same tiles, each row of 8 voxels
    /// interpolated 8 lanes wide ([`gather::row8`]; a shorter row through a buffer); the
    /// label's majority per voxel as there, or with `NEAREST` the skeleton box's nearest voxel
    /// ([`TransformedReader::read_derived`]). The same values as the portable path. Inlined
    /// into its callers, compiled for AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn sample_rows<const FLAT_Z: bool, const NEAREST: bool>(
        &mut self,
        job: &Sampling,
        image: &mut [f32],
        mut label: Option<&mut [u16]>,
    ) {
        let Sampling {
            t,
            local_centre,
            size,
            bs,
            channels,
        } = *job;
        let n: usize = size.iter().product();
        let bn: usize = bs.iter().product();
        let (sy, sz) = (bs[2], bs[1] * bs[2]);
        if label.is_some() && !NEAREST {
            self.labels.prepare::<FLAT_Z>(bs);
        }
        self.row.resize(TILE[2], [0.0; 3]);
        for tz in (0..size[0]).step_by(TILE[0]) {
            for ty in (0..size[1]).step_by(TILE[1]) {
                for tx in (0..size[2]).step_by(TILE[2]) {
                    let w = (tx + TILE[2]).min(size[2]) - tx;
                    for z in tz..(tz + TILE[0]).min(size[0]) {
                        for y in ty..(ty + TILE[1]).min(size[1]) {
                            let at = (z * size[1] + y) * size[2] + tx;
                            // Lanes past a short row's end hold coordinates past the patch:
                            // computed, then dropped (into `short_row`, copied out for the
                            // first `w`).
                            let coords = match &t.elastic {
                                None => t.row8(local_centre, size, (z, y), tx),
                                Some(_) => {
                                    t.row(
                                        local_centre,
                                        size,
                                        (z, y),
                                        tx,
                                        &mut self.row[..w],
                                        &mut self.scratch,
                                    );
                                    std::array::from_fn(|a| std::array::from_fn(|k| self.row[k][a]))
                                }
                            };
                            let (out, out_n, out_at) = if w == TILE[2] {
                                (&mut *image, n, at)
                            } else {
                                self.short_row.resize(channels * TILE[2], 0.0);
                                (&mut self.short_row[..], TILE[2], 0)
                            };
                            // SAFETY: AVX2 is enabled here; the box is under 2^31 voxels
                            // (checked by the caller) and the buffers are the job's.
                            let cells = gather::row8::<FLAT_Z>(
                                &coords,
                                bs,
                                &self.image_box,
                                bn,
                                channels,
                                out,
                                out_n,
                                out_at,
                            );
                            if w < TILE[2] {
                                for ch in 0..channels {
                                    image[ch * n + at..][..w]
                                        .copy_from_slice(&self.short_row[ch * TILE[2]..][..w]);
                                }
                            }
                            if let Some(l) = label.as_deref_mut() {
                                if NEAREST {
                                    for k in 0..w {
                                        l[at + k] = if cells.inside & (1 << k) == 0 {
                                            0
                                        } else {
                                            let near =
                                                |a: usize| usize::from(cells.frac[a][k] >= 0.5);
                                            self.skeleton_box[cells.base[k] as usize
                                                + near(0) * sz
                                                + near(1) * sy
                                                + near(2)]
                                        };
                                    }
                                } else {
                                    let (vals, mixed) =
                                        self.labels.uniform_row8(&cells.base, cells.inside);
                                    put_row(l, at, &vals, w);
                                    // (Lanes past a short row's end are dropped.)
                                    let mixed = mixed & ((1u32 << w) - 1);
                                    if mixed != 0 {
                                        // Their neighbours fetched while the tile goes on:
                                        // weighed after it, they were a third of a 3D
                                        // rotation's time waiting on memory.
                                        self.labels.prefetch_cells(&cells.base, mixed, sy, sz);
                                        let mut m = mixed;
                                        while m != 0 {
                                            let j = m.trailing_zeros() as usize;
                                            m &= m - 1;
                                            self.deferred_cells.push((
                                                at + j,
                                                cells.base[j] as usize,
                                                [0, 1, 2].map(|a| cells.frac[a][j]),
                                            ));
                                        }
                                    }
                                }
                            }
                        }
                    }
                    // The tile's mixed label lanes, after its table lookups (see
                    // `uniform_row8`).
                    if let Some(l) = label.as_deref_mut() {
                        for &(at, base, f) in &self.deferred_cells {
                            l[at] = self.labels.weighed_at::<FLAT_Z>(base, sy, sz, f);
                        }
                        self.deferred_cells.clear();
                    }
                }
            }
        }
    }

    /// The interpolation loop of [`TransformedReader::read`] over the box already read.
    #[inline(always)]
    pub(super) fn sample<const FLAT_Z: bool>(
        &mut self,
        job: &Sampling,
        image: &mut [f32],
        mut label: Option<&mut [u16]>,
    ) {
        let Sampling {
            t,
            local_centre,
            size,
            bs,
            channels,
        } = *job;
        let n: usize = size.iter().product();
        let bn: usize = bs.iter().product();
        let (sy, sz) = (bs[2], bs[1] * bs[2]);
        if label.is_some() {
            self.labels.prepare::<FLAT_Z>(bs);
        }
        // Output tiles, so that the source voxels one tile reads are few and stay in cache
        // (the box of a rotated patch is many times the patch and far larger than the cache).
        // Per tile, first every voxel's cell and fractions, then each array in a loop of
        // loads and lerps alone (measured as fast as one loop doing both; it keeps each
        // array's loop short).
        for tz in (0..size[0]).step_by(TILE[0]) {
            for ty in (0..size[1]).step_by(TILE[1]) {
                for tx in (0..size[2]).step_by(TILE[2]) {
                    let x_end = (tx + TILE[2]).min(size[2]);
                    self.row.resize(x_end - tx, [0.0; 3]);
                    self.cells.clear();
                    for z in tz..(tz + TILE[0]).min(size[0]) {
                        for y in ty..(ty + TILE[1]).min(size[1]) {
                            t.row(
                                local_centre,
                                size,
                                (z, y),
                                tx,
                                &mut self.row,
                                &mut self.scratch,
                            );
                            let at = (z * size[1] + y) * size[2] + tx;
                            // The label right away (its rare mixed case wants the fractions
                            // in f64); the image's cells kept for the loops below.
                            match label.as_deref_mut() {
                                Some(l) => {
                                    for (x, c) in self.row.iter().enumerate() {
                                        let Some((base, f)) = cell(c, bs) else {
                                            l[at + x] = 0;
                                            self.cells.push(Cell::outside(at + x));
                                            continue;
                                        };
                                        l[at + x] = self.labels.at::<FLAT_Z>(base, sy, sz, f);
                                        self.cells.push(Cell::new(at + x, base, f));
                                    }
                                }
                                None => {
                                    for (x, c) in self.row.iter().enumerate() {
                                        self.cells.push(match cell(c, bs) {
                                            Some((base, f)) => Cell::new(at + x, base, f),
                                            None => Cell::outside(at + x),
                                        });
                                    }
                                }
                            }
                        }
                    }
                    for ch in 0..channels {
                        let b = &self.image_box[ch * bn..(ch + 1) * bn];
                        let out = &mut image[ch * n..(ch + 1) * n];
                        for c in &self.cells {
                            out[c.at as usize] = if c.base == Cell::OUTSIDE {
                                0.0
                            } else {
                                trilinear::<FLAT_Z>(b, c.base as usize, sy, sz, c.f)
                            };
                        }
                    }
                }
            }
        }
    }
}

/// One output voxel of a tile: where it goes, its cell in the box, its fractions.
#[derive(Clone, Copy)]
pub(super) struct Cell {
    at: u32,
    base: u32,
    f: [f32; 3],
}

impl Cell {
    /// `base` of a voxel whose coordinate lies more than a voxel outside the volume: it
    /// reads 0. Box indices stay below it ([`super::footprint::needed_box`] refuses larger boxes).
    pub(super) const OUTSIDE: u32 = u32::MAX;

    #[inline(always)]
    fn outside(at: usize) -> Self {
        Cell {
            at: at as u32,
            base: Self::OUTSIDE,
            f: [0.0; 3],
        }
    }

    #[inline(always)]
    fn new(at: usize, base: usize, f: [f64; 3]) -> Self {
        Cell {
            at: at as u32,
            base: base as u32,
            f: [f[0] as f32, f[1] as f32, f[2] as f32],
        }
    }
}

/// The box voxel below a source coordinate (its flat index in a box of `bs`) and the
/// fractions past it; `None` when the coordinate lies outside the box's interpolation range
/// (only where [`super::footprint::needed_box`] cut the box at one plane beyond the volume:
/// everything there reads 0). Written out per axis (no closures over arrays) so that it
/// inlines into the per-voxel loop.
#[inline(always)]
pub(super) fn cell(c: &[f64; 3], bs: [usize; 3]) -> Option<(usize, [f64; 3])> {
    let inside = |a: usize| c[a] >= 0.0 && c[a] < (bs[a] - 1) as f64;
    if !(inside(0) && inside(1) && inside(2)) {
        return None;
    }
    // Truncation is the floor of these non-negative values. Unchecked: `as` saturates and
    // maps NaN to 0, a compare and two selects a value in the loop, none of which can happen
    // to a coordinate in 0..side with box sides far below 2^31.
    // SAFETY: each value is finite and in [0, bs - 1) (tested above), so it fits an i32.
    let (iz, iy, ix) = unsafe {
        (
            c[0].to_int_unchecked::<i32>() as usize,
            c[1].to_int_unchecked::<i32>() as usize,
            c[2].to_int_unchecked::<i32>() as usize,
        )
    };
    Some((
        (iz * bs[1] + iy) * bs[2] + ix,
        [c[0] - iz as f64, c[1] - iy as f64, c[2] - ix as f64],
    ))
}

/// Linear interpolation between the 8 voxels from `base` (x, then y, then z), in f32: the
/// values are f32 and the fractions' rounding (under 1e-7) is far below the tests' 1e-5.
/// `FLAT_Z`: the z fraction is 0, only the lower plane's 4 voxels are read.
#[inline(always)]
pub(super) fn trilinear<const FLAT_Z: bool>(
    b: &[f32],
    base: usize,
    sy: usize,
    sz: usize,
    f: [f32; 3],
) -> f32 {
    let lerp = |a: f32, b: f32, t: f32| a + (b - a) * t;
    let [fz, fy, fx] = f;
    if FLAT_Z {
        let b = &b[base..=base + sy + 1];
        return lerp(lerp(b[0], b[1], fx), lerp(b[sy], b[sy + 1], fx), fy);
    }
    // One bounds check for the farthest voxel; the other seven lie before it.
    let b = &b[base..=base + sz + sy + 1];
    let z0 = lerp(lerp(b[0], b[1], fx), lerp(b[sy], b[sy + 1], fx), fy);
    let z1 = lerp(
        lerp(b[sz], b[sz + 1], fx),
        lerp(b[sz + sy], b[sz + sy + 1], fx),
        fy,
    );
    lerp(z0, z1, fz)
}
