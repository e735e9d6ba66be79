//! A cascade's previous stage from its class probabilities, as nnU-Net's training does it: when
//! `CASE.probabilities.zarr` lies beside the first stage's segmentation (fold validation always
//! keeps it; `predict --save-probabilities` writes it), each class's probability is resampled
//! linearly to the cache's grid and the argmax is taken there, instead of resampling the label
//! map. nnU-Net's lowres validation does the same with its logits, straight from the lowres
//! grid; ours start from the case's own grid, where the first stage's export put them. A
//! region model's probabilities (sigmoids, written in order) keep the label-map route.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::cache::probabilities::ProbabilityReader;
use crate::error::{Error, Result};
use crate::format::probabilities::PROBABILITIES_SUFFIX;
use crate::geometry::{Block, VoxelRead};
use crate::prep::resample::LinearResampler;

/// Slabs of one class held at once, shared by the build's threads: enough for the blocks in
/// flight, bounded whatever the case's size (a slab is a few whole slices).
const SLABS_KEPT: usize = 16;

/// The probabilities array beside a segmentation `CASE.nii.gz` (or `CASE.nii`), if there is one.
pub fn beside(segmentation: &Path) -> Option<PathBuf> {
    let name = segmentation.file_name()?.to_str()?;
    let id = name
        .strip_suffix(".nii.gz")
        .or_else(|| name.strip_suffix(".nii"))?;
    let p = segmentation.with_file_name(format!("{id}{PROBABILITIES_SUFFIX}"));
    p.is_dir().then_some(p)
}

/// The blake3 of a probabilities array (every file of its folder, names and contents, in name
/// order: a changed first stage gives the case a new key) and its bytes.
pub fn hash(dir: &Path) -> Result<(blake3::Hash, u64)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
            let p = e.map_err(|e| Error::io(dir, e))?.path();
            if p.is_dir() {
                walk(&p, out)?;
            } else {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    files.sort();
    let mut h = blake3::Hasher::new();
    let mut bytes = 0;
    for f in files {
        let rel = f.strip_prefix(dir).unwrap_or(&f);
        h.update(rel.to_string_lossy().as_bytes());
        h.update(b"\n");
        let file = std::fs::File::open(&f).map_err(|e| Error::io(&f, e))?;
        bytes += file.metadata().map_err(|e| Error::io(&f, e))?.len();
        h.update_reader(file).map_err(|e| Error::io(&f, e))?;
    }
    Ok((h.finalize(), bytes))
}

/// Slabs held: (class, first slice) and the slab's values.
type Slabs = VecDeque<((usize, usize), Arc<Vec<f32>>)>;

/// A first stage's class probabilities on a case's grid, read a slab at a time.
pub struct PreviousProbabilities {
    reader: ProbabilityReader,
    path: PathBuf,
    /// Recently read slabs.
    slabs: Mutex<Slabs>,
}

impl PreviousProbabilities {
    /// Open `path` for a case whose image has `shape_zyx` and `affine`: `None` for a region
    /// model's probabilities; an error naming the array when it is not on that grid.
    pub fn open(
        path: &Path,
        image: &Path,
        shape_zyx: [usize; 3],
        affine: &[[f64; 4]; 4],
    ) -> Result<Option<PreviousProbabilities>> {
        let reader = ProbabilityReader::open(path)?;
        if !reader.attrs.regions.is_empty() {
            return Ok(None);
        }
        let [_, nz, ny, nx] = reader.shape;
        let off = reader
            .attrs
            .affine
            .iter()
            .flatten()
            .zip(affine.iter().flatten())
            .map(|(a, b)| (a - b).abs() / a.abs().max(b.abs()).max(1.0))
            .fold(0.0f64, f64::max);
        if [nz, ny, nx] != shape_zyx || off > 1e-4 {
            return Err(Error::cache(
                path,
                format!(
                    "the previous stage's probabilities are on another grid than {} (shape z, y, x {:?} against {:?}; affines differ by {off:.2e}): they were made for another input",
                    image.display(),
                    [nz, ny, nx],
                    shape_zyx
                ),
            ));
        }
        Ok(Some(PreviousProbabilities {
            reader,
            path: path.to_path_buf(),
            slabs: Mutex::new(VecDeque::new()),
        }))
    }

    /// The array's folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn slab(&self, class: usize, z0: usize) -> Result<Arc<Vec<f32>>> {
        let key = (class, z0);
        let mut held = self.slabs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, v)) = held.iter().find(|(k, _)| *k == key) {
            return Ok(v.clone());
        }
        // Read outside the lock: other threads go on with the slabs held.
        drop(held);
        let v = Arc::new(self.reader.read_slab(class, z0, self.reader.rows)?);
        held = self.slabs.lock().unwrap_or_else(|p| p.into_inner());
        if held.len() >= SLABS_KEPT * self.reader.shape[0] {
            held.pop_front();
        }
        held.push_back((key, v.clone()));
        Ok(v)
    }

    /// The label values of the argmax of the probabilities resampled by `linear` onto block `b`
    /// of the cache's grid (the first class wins a tie, as numpy's argmax).
    pub fn labels(&self, linear: &LinearResampler, b: Block) -> Result<Vec<f32>> {
        let n = b.len();
        let mut best = vec![f32::NEG_INFINITY; n];
        let mut label = vec![0.0f32; n];
        let mut p = vec![0.0f32; n];
        for (class, &value) in self.reader.attrs.values.iter().enumerate() {
            linear.fill_from(&ClassView { of: self, class }, b, &mut p)?;
            for ((bst, lab), &v) in best.iter_mut().zip(label.iter_mut()).zip(&p) {
                if v > *bst {
                    *bst = v;
                    *lab = value as f32;
                }
            }
        }
        Ok(label)
    }
}

/// One class of the array as voxels in C order (z, y, x).
struct ClassView<'a> {
    of: &'a PreviousProbabilities,
    class: usize,
}

impl VoxelRead for ClassView<'_> {
    fn read(&self, start: usize, out: &mut [f32]) -> Result<()> {
        let [_, _, ny, nx] = self.of.reader.shape;
        let rows = self.of.reader.rows;
        let mut done = 0;
        while done < out.len() {
            let at = start + done;
            let z = at / (ny * nx);
            let z0 = z / rows * rows;
            let slab = self.of.slab(self.class, z0)?;
            let off = at - z0 * ny * nx;
            let take = (out.len() - done).min(slab.len().saturating_sub(off));
            if take == 0 {
                return Err(Error::cache(
                    &self.of.path,
                    format!("voxel {at} is past the array's end"),
                ));
            }
            out[done..done + take].copy_from_slice(&slab[off..off + take]);
            done += take;
        }
        Ok(())
    }
}
