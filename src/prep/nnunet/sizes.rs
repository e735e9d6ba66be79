//! The sizes a case takes on its way through nnU-Net's preprocessing and prediction, computed
//! from its header before a voxel is read or a scratch file made: the grid at the model's
//! spacing (checked arithmetic, no cast from a huge float), the scratch disk it needs (the one
//! forecast `prep inspect --nnunet-model` prints and predict checks against the free space).

use std::path::Path;

use super::{spline, target_spacing};
use crate::error::{Error, Result};
use crate::format::nnunet::Plans;
use crate::util::sysinfo::human_bytes;

/// One case's sizes (axes transposed as the plans say).
#[derive(Clone, Debug, PartialEq)]
pub struct CaseSizes {
    /// The file's grid after `transpose_forward`.
    pub shape: [usize; 3],
    /// Its spacing after `transpose_forward`.
    pub spacing: [f64; 3],
    /// The spacing resampled to.
    pub target: [f64; 3],
    /// The network's grid (the whole image resampled: the crop to the nonzero region can only
    /// shrink it).
    pub new_shape: [usize; 3],
    /// Scratch disk used on the way, bytes (an upper bound: the whole image, every scratch
    /// file at once).
    pub scratch_bytes: u64,
    /// Memory of resampling it a slice at a time, there and back, bytes (every worker thread
    /// holding its planes in float64).
    pub memory_bytes: u64,
}

/// The sizes of `file` (grid `shape_zyx` at `spacing_zyx`, the header's pixdim in z, y, x
/// order) predicted by `plans`' configuration with `heads` outputs. An error names the file's
/// pixdim and the plans' spacing field when the resampled grid is not a sane size.
pub fn case_sizes(
    plans: &Plans,
    file: &Path,
    shape_zyx: [usize; 3],
    spacing_zyx: [f64; 3],
    heads: usize,
) -> Result<CaseSizes> {
    let tf = plans.transpose_forward;
    let (shape, spacing) = (tf.map(|a| shape_zyx[a]), tf.map(|a| spacing_zyx[a]));
    let target = target_spacing(plans, spacing);
    let new_shape = spline::new_shape(shape, spacing, target).map_err(|(a, v)| {
        Error::nifti(
            file,
            format!(
                "pixdim (x, y, z) {:?} resampled to the model's spacing {:?} (configurations.{}.spacing in {}) gives {v:e} voxels along axis {a} of {:?}, over the {} a grid may have: one of the two spacings is wrong",
                [spacing_zyx[2], spacing_zyx[1], spacing_zyx[0]],
                plans.configuration.spacing,
                plans.configuration.name,
                plans.path.display(),
                shape,
                spline::MAX_SIDE
            ),
        )
    })?;
    let voxels = |v: [usize; 3]| -> u128 { v.iter().map(|&s| s as u128).product() };
    let c = plans.channels() as u128;
    let h = heads as u128;
    // The inputs as float64 lines, the normalized and resampled channels and the float16
    // logits on the network's grid, the logits and labels back on the input's grid.
    let bytes =
        voxels(shape) * c * 8 + voxels(new_shape) * (c * 4 + h * 2) + voxels(shape) * (h * 2 + 2);
    // Resampling holds, per worker, a slice's planes before and after (in float64, a few
    // copies: the transposed input, the resized columns, the output) and a block of at least
    // one row of every z-line; the export goes the other way with every head.
    let plane = |[_, h, w]: [usize; 3], [_, hn, wn]: [usize; 3]| -> u128 {
        let (h, w, hn, wn) = (h as u128, w as u128, hn as u128, wn as u128);
        8 * (2 * h * w + 2 * h * wn + 2 * hn * wn)
            + 8 * 3 * (shape[0] as u128 + new_shape[0] as u128 + 30) * wn.max(w)
    };
    let threads = rayon::current_num_threads().max(1) as u128;
    let memory = threads * plane(shape, new_shape).max(plane(new_shape, shape) * h.max(1));
    Ok(CaseSizes {
        shape,
        spacing,
        target,
        new_shape,
        scratch_bytes: u64::try_from(bytes).unwrap_or(u64::MAX),
        memory_bytes: u64::try_from(memory).unwrap_or(u64::MAX),
    })
}

/// Refuse a case whose scratch files would not fit in the free space of `dir`, or whose
/// resampling would not fit in the memory this process may use, before any is made: the error
/// names the file, its pixdim, the plans' spacing and both sizes.
pub fn check_case(
    plans: &Plans,
    file: &Path,
    spacing_zyx: [f64; 3],
    sizes: &CaseSizes,
    dir: &Path,
) -> Result<()> {
    let why = |what: String| {
        Error::nifti(
            file,
            format!(
                "{what} (its grid {:?} at pixdim (x, y, z) {:?} becomes {:?} at the model's spacing {:?}, configurations.{}.spacing in {}): check the two spacings",
                sizes.shape,
                [spacing_zyx[2], spacing_zyx[1], spacing_zyx[0]],
                sizes.new_shape,
                plans.configuration.spacing,
                plans.configuration.name,
                plans.path.display(),
            ),
        )
    };
    if let Some(free) = crate::util::sysinfo::free_bytes(dir) {
        if sizes.scratch_bytes > free {
            return Err(why(format!(
                "predicting it needs about {} of scratch space in {}, but {} are free (free some, or give --out on a larger disk)",
                human_bytes(sizes.scratch_bytes),
                dir.display(),
                human_bytes(free)
            )));
        }
    }
    if let Some(limit) = crate::util::sysinfo::memory_limit_bytes() {
        if sizes.memory_bytes > limit {
            return Err(why(format!(
                "resampling it needs about {} of memory, over the {} this process may use",
                human_bytes(sizes.memory_bytes),
                human_bytes(limit)
            )));
        }
    }
    Ok(())
}
