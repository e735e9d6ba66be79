//! nnU-Net's training segmentation (`run_case_npy` with a `seg`): cropped with the image's box
//! on the transposed grid, the background outside the (filled) nonzero mask marked -1, then
//! resampled as batchgenerators' `resize_segmentation` does: each label's indicator (-1 and 0
//! included) resized at the plans' segmentation order, each voxel taking the label of the
//! largest score, an exact tie going to the nearest-neighbour label when it is one of the tied
//! labels (else the smallest tied label). Scores are kept in f64 between passes, as skimage
//! computes them, since exact ties decide voxels.
//!
//! nnU-Net's training transforms turn -1 into 0 after augmentation; the cache stores 0 there,
//! and where -1 lay in its normalization mask array (nnU-Net zeroes the channels it normalizes
//! within the mask there first).

use std::path::Path;

use super::crop::Cropped;
use super::resample::{self, Clip};
use super::spline::{Axis, Kind};
use super::volume::Scratch;
use crate::error::Result;
use crate::nifti_io::VoxelSource;

/// A case's label over the crop box.
pub struct CroppedLabel {
    /// (1, box) on the transposed grid: the label values, -1 for background outside the
    /// nonzero mask.
    pub voxels: Scratch<f32>,
    /// The values present, ascending (-1 and 0 included when present).
    pub values: Vec<f32>,
}

/// Crop `label` (values already checked to be whole numbers in u16) to the box of `c`, whose
/// filled nonzero mask must have been made; the labelled voxels join that mask, as nnU-Net's
/// normalization mask `seg >= 0` has them.
pub(super) fn crop_label(label: &VoxelSource, c: &mut Cropped, tmp: &Path) -> Result<CroppedLabel> {
    let [dc, hc, wc] = c.shape;
    let voxels: Scratch<f32> = Scratch::new(tmp, [1, dc, hc, wc])?;
    let mut present = std::collections::BTreeSet::new();
    for k in 0..dc {
        let mut row = c.slice(label, k)?;
        if let Some(mask) = &c.mask {
            let mut m = mask.slice(0, k)?;
            let mut changed = false;
            for (m, l) in m.iter_mut().zip(row.iter_mut()) {
                if *l == 0.0 && *m == 0 {
                    *l = -1.0;
                } else if *l != 0.0 && *m == 0 {
                    *m = 1;
                    changed = true;
                }
            }
            if changed {
                mask.write_rows(0, k, 0, &m)?;
            }
        }
        present.extend(row.iter().map(|&v| v as i32));
        voxels.write_rows(0, k, 0, &row)?;
    }
    Ok(CroppedLabel {
        voxels,
        values: present.into_iter().map(|v| v as f32).collect(),
    })
}

/// Resample the cropped label with `axes` (the segmentation's orders; a separate axis at
/// order 0) and `clip` (skimage's), into nnU-Net's preprocessed values (-1 kept).
pub(super) fn resample_label(
    label: CroppedLabel,
    axes: [Axis; 3],
    clip: Clip,
    tmp: &Path,
) -> Result<Scratch<f32>> {
    let [d, h, w] = label.voxels.zyx();
    let to = [axes[0].m, axes[1].m, axes[2].m];
    let out: Scratch<f32> = Scratch::new(tmp, [1, to[0], to[1], to[2]])?;
    if resample::is_identity(&axes) || label.values.len() < 2 {
        // nnU-Net returns the array untouched when the shapes agree; one label stays one label.
        let only = label.values.first().copied();
        for z in 0..to[0] {
            let row: Vec<f32> = match (resample::is_identity(&axes), only) {
                (true, _) | (false, None) => label.voxels.slice(0, z)?,
                (false, Some(v)) => vec![v; to[1] * to[2]],
            };
            out.write_rows(0, z, 0, &row)?;
        }
        return Ok(out);
    }
    // The values are sorted: an order-0 sample is always one of them.
    let index_of = |v: f64| -> u16 {
        label
            .values
            .partition_point(|&x| f64::from(x) < v)
            .min(label.values.len() - 1) as u16
    };
    // The nearest-neighbour label of every output voxel (skimage's order 0 on every axis).
    let nearest_axes = axes.map(|a| Axis {
        kind: Kind::Nearest,
        ..a
    });
    let nn_value: Scratch<f64> = Scratch::new(tmp, [1, to[0], to[1], to[2]])?;
    resample::resample_via::<f32, f64, f64>(
        &label.voxels,
        &nn_value,
        nearest_axes,
        Clip::None,
        tmp,
    )?;
    let nn: Scratch<u16> = Scratch::new(tmp, [1, to[0], to[1], to[2]])?;
    for z in 0..to[0] {
        let row: Vec<u16> = nn_value.slice(0, z)?.into_iter().map(index_of).collect();
        nn.write_rows(0, z, 0, &row)?;
    }
    drop(nn_value);
    let best: Scratch<f64> = Scratch::new(tmp, [1, to[0], to[1], to[2]])?;
    let win: Scratch<u16> = Scratch::new(tmp, [1, to[0], to[1], to[2]])?;
    // Whether the nearest neighbour's label holds the top score (so far).
    let nn_top: Scratch<u8> = Scratch::new(tmp, [1, to[0], to[1], to[2]])?;
    for (i, &v) in label.values.iter().enumerate() {
        let indicator: Scratch<f32> = Scratch::new(tmp, [1, d, h, w])?;
        for z in 0..d {
            let s: Vec<f32> = label
                .voxels
                .slice(0, z)?
                .into_iter()
                .map(|l| f32::from(u8::from(l == v)))
                .collect();
            indicator.write_rows(0, z, 0, &s)?;
        }
        let score: Scratch<f64> = Scratch::new(tmp, [1, to[0], to[1], to[2]])?;
        resample::resample_via::<f32, f64, f64>(&indicator, &score, axes, clip, tmp)?;
        drop(indicator);
        let i = i as u16;
        for z in 0..to[0] {
            let s = score.slice(0, z)?;
            let nz = nn.slice(0, z)?;
            if i == 0 {
                let top: Vec<u8> = s
                    .iter()
                    .zip(&nz)
                    .map(|(&s, &n)| u8::from(n == 0 && s > 0.0))
                    .collect();
                best.write_rows(0, z, 0, &s)?;
                win.write_rows(0, z, 0, &vec![0u16; s.len()])?;
                nn_top.write_rows(0, z, 0, &top)?;
                continue;
            }
            let mut b = best.slice(0, z)?;
            let mut wv = win.slice(0, z)?;
            let mut top = nn_top.slice(0, z)?;
            for k in 0..s.len() {
                let is_nn = nz[k] == i;
                if is_nn && s[k] == b[k] && s[k] > 0.0 {
                    top[k] = 1;
                }
                if s[k] > b[k] {
                    top[k] = u8::from(is_nn);
                    wv[k] = i;
                    b[k] = s[k];
                }
            }
            best.write_rows(0, z, 0, &b)?;
            win.write_rows(0, z, 0, &wv)?;
            nn_top.write_rows(0, z, 0, &top)?;
        }
    }
    for z in 0..to[0] {
        let wv = win.slice(0, z)?;
        let top = nn_top.slice(0, z)?;
        let nz = nn.slice(0, z)?;
        let row: Vec<f32> = (0..wv.len())
            .map(|k| {
                let idx = if top[k] != 0 { nz[k] } else { wv[k] };
                label.values[idx as usize]
            })
            .collect();
        out.write_rows(0, z, 0, &row)?;
    }
    Ok(out)
}
