//! nnU-Net's export of a predicted case, out of core: the logits (float16, as its predictor
//! leaves them) averaged over folds, resampled to the cropped grid as the plans'
//! `resampling_fn_probabilities` says (kept in float16, as nnU-Net's array is), turned into
//! labels (argmax over classes, or each region's sigmoid over 0.5 in `regions_class_order`),
//! put back into the uncropped grid and transposed back to the file's axes.

use std::path::Path;

use half::f16;

use super::model::NnunetModel;
use crate::error::Result;
use crate::format::nnunet::Outputs;
use crate::nifti_io::{LabelType, LabelWriter};
use crate::prep::nnunet::resample::{is_identity, resample};
use crate::prep::nnunet::volume::Scratch;
use crate::prep::nnunet::{plan_resampling, CaseGeometry};

/// Divide the summed logits of `members` folds by their number, in float16 (nnU-Net's
/// `prediction /= len(folds)` on a half tensor).
fn mean_of_folds(logits: &Scratch<f16>, members: usize) -> Result<()> {
    if members <= 1 {
        return Ok(());
    }
    let n = members as f32;
    for c in 0..logits.shape[0] {
        for z in 0..logits.shape[1] {
            let mut s = logits.slice(c, z)?;
            s.iter_mut()
                .for_each(|v| *v = f16::from_f32(f32::from(*v) / n));
            logits.write_rows(c, z, 0, &s)?;
        }
    }
    Ok(())
}

/// The label of one voxel from its heads' logits.
fn label(outputs: &Outputs, v: &[f16]) -> u16 {
    match outputs {
        Outputs::Classes { values, .. } => {
            // numpy's argmax: the first of equal maxima.
            let mut best = 0;
            for (i, x) in v.iter().enumerate() {
                if f32::from(*x) > f32::from(v[best]) {
                    best = i;
                }
            }
            values[best]
        }
        Outputs::Regions { order, .. } => {
            let mut out = 0;
            for (i, x) in v.iter().enumerate() {
                let p = 1.0f32 / (1.0 + (-f32::from(*x)).exp());
                if p > 0.5 {
                    out = order[i];
                }
            }
            out
        }
    }
}

/// Export `logits` (heads, preprocessed grid; the sum over `members` folds) of a case of
/// geometry `geo` to `out`, a NIfTI with `input`'s header.
pub fn export(
    model: &NnunetModel,
    logits: Scratch<f16>,
    members: usize,
    geo: &CaseGeometry,
    input: &Path,
    out: &Path,
    tmp: &Path,
) -> Result<()> {
    mean_of_folds(&logits, members)?;
    let heads = logits.shape[0];
    let (axes, clip) = plan_resampling(
        &model.plans.configuration.resampling_probabilities,
        geo.new_shape,
        geo.shape_after_cropping,
        geo.target_spacing,
        geo.spacing_transposed,
    );
    let cropped = if is_identity(&axes) {
        logits
    } else {
        let [d, h, w] = geo.shape_after_cropping;
        let r: Scratch<f16> = Scratch::new(tmp, [heads, d, h, w])?;
        resample(&logits, &r, axes, clip, tmp)?;
        r
    };
    // Labels over the box.
    let [dc, hc, wc] = geo.shape_after_cropping;
    let seg: Scratch<u16> = Scratch::new(tmp, [1, dc, hc, wc])?;
    let outputs = &model.dataset.outputs;
    let mut v = vec![f16::ZERO; heads];
    for z in 0..dc {
        let slices: Vec<Vec<f16>> = (0..heads)
            .map(|c| cropped.slice(c, z))
            .collect::<Result<_>>()?;
        let labels: Vec<u16> = (0..hc * wc)
            .map(|i| {
                for (c, s) in slices.iter().enumerate() {
                    v[c] = s[i];
                }
                label(outputs, &v)
            })
            .collect();
        seg.write_rows(0, z, 0, &labels)?;
    }
    drop(cropped);
    write_uncropped(
        &seg,
        geo,
        model.plans.transpose_forward,
        outputs.max_value(),
        input,
        out,
    )
}

/// The labels of the box written into the file's grid: zeros outside it, axes transposed back.
fn write_uncropped(
    seg: &Scratch<u16>,
    geo: &CaseGeometry,
    tf: [usize; 3],
    max: u16,
    input: &Path,
    out: &Path,
) -> Result<()> {
    let [d, h, w] = geo.shape_zyx;
    let mut writer = LabelWriter::create(out, input, (d * h * w) as u64, LabelType::for_max(max))?;
    let inside = |t: [usize; 3]| (0..3).all(|a| t[a] >= geo.bbox[a][0] && t[a] < geo.bbox[a][1]);
    let mut slice = vec![0u16; h * w];
    let identity = tf == [0, 1, 2];
    for z in 0..d {
        slice.iter_mut().for_each(|v| *v = 0);
        if identity {
            let [bz, by, bx] = geo.bbox;
            if z >= bz[0] && z < bz[1] {
                let mut row = vec![0u16; bx[1] - bx[0]];
                for y in by[0]..by[1] {
                    seg.read_run(0, z - bz[0], y - by[0], 0, &mut row)?;
                    slice[y * w + bx[0]..y * w + bx[1]].copy_from_slice(&row);
                }
            }
        } else {
            for y in 0..h {
                for x in 0..w {
                    let o = [z, y, x];
                    // Transposed axis a is the file's axis tf[a].
                    let t = tf.map(|a| o[a]);
                    if inside(t) {
                        let mut v = [0u16];
                        seg.read_run(
                            0,
                            t[0] - geo.bbox[0][0],
                            t[1] - geo.bbox[1][0],
                            t[2] - geo.bbox[2][0],
                            &mut v,
                        )?;
                        slice[y * w + x] = v[0];
                    }
                }
            }
        }
        writer.write(&slice)?;
    }
    writer.finish()
}
