//! The crop to the nonzero box at prediction, as nnU-Net crops every case before its sliding
//! window: windows run only over the box of voxels where the input is not zero (a brain MRI's
//! head, not the air around it), and every voxel outside it is background.
//!
//! The box is found on the preprocessed grid: the voxels where any image channel differs
//! from what a raw zero became under that channel's normalization, one voxel wider on each
//! side for the resampling's spread. A window that reaches past the box reads what lies
//! there, as over the whole volume.

use super::probs::ProbWriter;
use super::sliding::Predictor;
use crate::cache::reader::EntryReader;
use crate::cache::PatchSource;
use crate::error::{Error, Result};
use crate::format::labels::Labels;

/// A box of the entry's grid: `origin .. origin + size` (z, y, x).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Box3 {
    /// First voxel.
    pub origin: [usize; 3],
    /// Voxels along each axis.
    pub size: [usize; 3],
}

/// Voxels read at a time while the box is looked for.
const SCAN_VOXELS: usize = 4 << 20;

/// The box of the voxels where any image channel is not what a raw zero became, one voxel
/// wider on each side; `None` when that is the whole volume or nothing, or when the entry
/// does not record a normalization for each channel.
pub fn nonzero_box(entry: &EntryReader) -> Result<Option<Box3>> {
    let ch = entry.channels();
    let norm = entry.normalization();
    let shape = entry.shape_zyx();
    let [nz, ny, nx] = shape;
    let plane = ny * nx;
    if norm.len() != ch || plane == 0 || nz == 0 {
        return Ok(None);
    }
    let zero: Vec<f32> = norm.iter().map(|n| n.zero_value()).collect();
    let slab = (SCAN_VOXELS / (plane * ch)).clamp(1, nz);
    let mut buf = vec![0f32; slab * plane * ch];
    let (mut lo, mut hi) = ([usize::MAX; 3], [0usize; 3]);
    let mut z0 = 0;
    while z0 < nz {
        let rows = slab.min(nz - z0);
        let n = rows * plane;
        PatchSource::read_image(entry, [z0 as i64, 0, 0], [rows, ny, nx], &mut buf[..n * ch])?;
        for (c, &zv) in zero.iter().enumerate() {
            let tol = 1e-4 * zv.abs().max(1.0);
            for (i, v) in buf[c * n..(c + 1) * n].iter().enumerate() {
                if (v - zv).abs() > tol {
                    let p = [z0 + i / plane, (i / nx) % ny, i % nx];
                    for a in 0..3 {
                        lo[a] = lo[a].min(p[a]);
                        hi[a] = hi[a].max(p[a]);
                    }
                }
            }
        }
        z0 += rows;
    }
    if lo[0] == usize::MAX {
        return Ok(None);
    }
    let origin = [0, 1, 2].map(|a| lo[a].saturating_sub(1));
    let size = [0, 1, 2].map(|a| (hi[a] + 2).min(shape[a]) - origin[a]);
    Ok((size != shape).then_some(Box3 { origin, size }))
}

/// An entry seen through a box of it.
struct CropView<'a> {
    entry: &'a EntryReader,
    b: Box3,
}

impl PatchSource for CropView<'_> {
    fn name(&self) -> String {
        PatchSource::name(self.entry)
    }
    fn shape_zyx(&self) -> [usize; 3] {
        self.b.size
    }
    fn has_label(&self) -> bool {
        false
    }
    fn channels(&self) -> usize {
        self.entry.channels()
    }
    fn image_reads_checked(&self) -> bool {
        self.entry.image_reads_checked()
    }
    fn classes(&self) -> Vec<u16> {
        Vec::new()
    }
    fn fg_coords(&self, _class: u16) -> Result<Vec<[u32; 3]>> {
        Ok(Vec::new())
    }
    fn read_image(&self, start_zyx: [i64; 3], size_zyx: [usize; 3], out: &mut [f32]) -> Result<()> {
        let s = [0, 1, 2].map(|a| start_zyx[a] + self.b.origin[a] as i64);
        PatchSource::read_image(self.entry, s, size_zyx, out)
    }
    fn read_label(&self, _start: [i64; 3], _size: [usize; 3], _out: &mut [u16]) -> Result<()> {
        Err(Error::Config(format!(
            "{}: a prediction's input has no label",
            self.name()
        )))
    }
}

/// Where one case's windows run, and what the rest of it holds.
pub struct Crop {
    /// `None`: the whole volume.
    pub within: Option<Box3>,
    background: Vec<f32>,
}

impl Crop {
    /// The nonzero box of `entry` ([`nonzero_box`]) for a model with `outputs`.
    pub fn of(entry: &EntryReader, outputs: &Labels) -> Result<Crop> {
        Ok(Crop {
            within: nonzero_box(entry)?,
            background: outputs.background_probabilities(),
        })
    }

    /// The size of what its windows run over, in an entry of `shape` (z, y, x).
    pub fn extent(&self, shape: [usize; 3]) -> [usize; 3] {
        self.within.map_or(shape, |b| b.size)
    }

    /// One model's sliding window over `entry` into `probs` (a slab of about `budget`
    /// bytes): within the box, every voxel outside it background.
    pub fn predict(
        &self,
        predictor: &Predictor<'_>,
        entry: &EntryReader,
        budget: usize,
        probs: &mut ProbWriter,
    ) -> Result<()> {
        let Some(b) = self.within else {
            return predictor.predict_tiled(entry, budget, &mut |t, p| probs.write_tile(t, p));
        };
        let view = CropView { entry, b };
        predictor.predict_tiled(&view, budget, &mut |t, p| {
            probs.write_box(t, p, b.origin, b.size[2])
        })?;
        probs.fill_outside(b.origin, b.size, &self.background)
    }
}
