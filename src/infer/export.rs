//! Export: a predicted volume's class probabilities (on the model's grid) resampled back to the
//! input's grid, linearly, then argmax (nnU-Net's order: interpolating labels would mix
//! classes) or each region over 0.5 in `regions_class_order`, mapped to the label files' values and written as a NIfTI in the input's own
//! geometry. Slabs of z rows of the input grid are computed in parallel and written in order,
//! so memory holds a few slabs, whatever the volume size.

use std::path::Path;

use rayon::prelude::*;

use super::prob_zarr::ProbabilityZarr;
use super::probs::ProbVolume;
use crate::error::Result;
use crate::format::labels::Labels;
use crate::geometry::Block;
use crate::nifti_io::{LabelType, LabelWriter};
use crate::prep::resample::LinearResampler;

/// Voxels of the input grid computed per slab (whole z rows).
const SLAB_VOXELS: usize = 1 << 21;

/// What to export.
pub struct Export<'a> {
    /// Per class, its probabilities on the model's grid (z, y, x) of `model_shape_zyx`.
    pub probs: &'a [ProbVolume],
    /// The model's grid.
    pub model_shape_zyx: [usize; 3],
    /// The input's grid (z, y, x): the output's.
    pub input_shape_zyx: [usize; 3],
    /// What each output stands for: classes (argmax) or regions (over 0.5, in order).
    pub outputs: &'a Labels,
    /// The input file whose header (geometry) the output takes.
    pub input: &'a Path,
    /// Where the resampled probabilities go too (`--save-probabilities`).
    pub probabilities: Option<&'a ProbabilityZarr>,
}

/// Slices of the input grid per slab: about [`SLAB_VOXELS`] voxels of whole slices.
pub fn slab_rows(input_shape_zyx: [usize; 3]) -> usize {
    (SLAB_VOXELS / (input_shape_zyx[1] * input_shape_zyx[2]).max(1)).max(1)
}

/// Write the segmentation to `out` (.nii.gz).
pub fn write_segmentation(e: &Export, out: &Path) -> Result<()> {
    write_in_slabs(e, out, SLAB_VOXELS)
}

/// [`write_segmentation`], computing about `slab_voxels` voxels (whole z rows) at a time.
fn write_in_slabs(e: &Export, out: &Path, slab_voxels: usize) -> Result<()> {
    let [nz, ny, nx] = e.input_shape_zyx;
    let plane = ny * nx;
    let max = e.outputs.max_value();
    let total = (nz * plane) as u64;
    let mut w = LabelWriter::create(out, e.input, total, LabelType::for_max(max))?;
    let resampler = LinearResampler::new(e.model_shape_zyx, e.input_shape_zyx);
    // Slabs match the probabilities' chunks when those are written.
    let rows = match e.probabilities {
        Some(p) => p.rows(),
        None => (slab_voxels / plane.max(1)).max(1),
    };
    let threads = rayon::current_num_threads().max(1);
    let slabs: Vec<Block> = (0..nz)
        .step_by(rows)
        .map(|z| Block {
            start: [z, 0, 0],
            size: [rows.min(nz - z), ny, nx],
        })
        .collect();
    // A few slabs at a time in parallel, written in order.
    for group in slabs.chunks(threads) {
        let labels: Vec<Result<Vec<u16>>> = group
            .par_iter()
            .map(|b| slab_labels(e, &resampler, *b))
            .collect();
        for l in labels {
            w.write(&l?)?;
        }
    }
    w.finish()
}

/// The labels of one slab of the input grid.
fn slab_labels(e: &Export, resampler: &LinearResampler, b: Block) -> Result<Vec<u16>> {
    let n = b.len();
    let mut best = vec![f32::NEG_INFINITY; n];
    let mut label = vec![0u16; n];
    let mut p = vec![0f32; n];
    for (c, probs) in e.probs.iter().enumerate() {
        resampler.fill_from(probs, b, &mut p)?;
        if let Some(out) = e.probabilities {
            out.write_slab(c, b.start[0], &p)?;
        }
        for i in 0..n {
            e.outputs.vote(c, p[i], &mut best[i], &mut label[i]);
        }
    }
    Ok(label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::probs::ProbWriter;

    /// Slab by slab from the scratch probabilities equals a whole-volume export in memory:
    /// every class resampled at once, then argmax.
    #[test]
    fn slabs_equal_a_whole_volume_export() {
        let dir = tempfile::tempdir().unwrap();
        let (model, input) = ([5, 7, 6], [9, 4, 11]);
        let n: usize = model.iter().product();
        let classes = 3;
        // Smooth-ish, seeded probabilities (normalized per voxel).
        let mut probs = Vec::with_capacity(n * classes);
        for i in 0..n {
            let raw: Vec<f32> = (0..classes)
                .map(|c| (((i * 7 + c * 13) % 17) as f32 + 1.0) / 17.0)
                .collect();
            let s: f32 = raw.iter().sum();
            probs.extend(raw.iter().map(|v| half::f16::from_f32(v / s).to_f32()));
        }
        let mut w = ProbWriter::new(classes, model, dir.path()).unwrap();
        w.append(&probs).unwrap();
        let volumes = w.finish().unwrap();
        // The input whose header the output takes: any NIfTI of the input's shape.
        let src = dir.path().join("in.nii.gz");
        crate::nifti_io::write_nifti_u8(
            &src,
            [input[2], input[1], input[0]],
            [1.0, 1.0, 1.0],
            &vec![0u8; input.iter().product()],
        )
        .unwrap();
        let values = [0u16, 3, 7];
        let class = |value| crate::format::labels::ClassInfo {
            value,
            name: String::new(),
        };
        let outputs = Labels::of_classes(values.map(class).to_vec(), None).unwrap();
        let e = Export {
            probs: &volumes,
            model_shape_zyx: model,
            input_shape_zyx: input,
            outputs: &outputs,
            input: &src,
            probabilities: None,
        };
        let out = dir.path().join("out.nii.gz");
        write_in_slabs(&e, &out, 50).unwrap();
        let got = crate::nifti_io::read_volume(&out).unwrap().data;
        // Reference: whole volumes in memory.
        let r = LinearResampler::new(model, input);
        let whole = Block {
            start: [0, 0, 0],
            size: input,
        };
        let m: usize = input.iter().product();
        let per_class: Vec<Vec<f32>> = (0..classes)
            .map(|c| {
                let v: Vec<f32> = probs.iter().skip(c).step_by(classes).copied().collect();
                let mut out = vec![0f32; m];
                r.fill(&v, whole, &mut out);
                out
            })
            .collect();
        for i in 0..m {
            let scores: Vec<f32> = per_class.iter().map(|p| p[i]).collect();
            let want = values[crate::infer::sliding::argmax(&scores)];
            assert_eq!(got[i], want as f32, "voxel {i}");
        }
        // The same heads as regions (scaled so that several pass 0.5): the last region in
        // order over 0.5 is written, background where none is.
        let scaled: Vec<f32> = probs.iter().map(|p| (p * 2.2).min(1.0)).collect();
        let mut w = ProbWriter::new(classes, model, dir.path()).unwrap();
        w.append(&scaled).unwrap();
        let volumes = w.finish().unwrap();
        let order = [4u16, 2, 9];
        let region = |values: &[u16]| crate::format::dataset_json::LabelClass {
            name: String::new(),
            values: values.to_vec(),
        };
        let sets = vec![region(&[2, 4, 9]), region(&[2, 9]), region(&[9])];
        let regions = Labels::of_regions(sets, order.to_vec(), None).unwrap();
        let e = Export {
            probs: &volumes,
            outputs: &regions,
            ..e
        };
        write_in_slabs(&e, &out, 50).unwrap();
        let got = crate::nifti_io::read_volume(&out).unwrap().data;
        let mut passed = [0usize; 3];
        for i in 0..m {
            let mut want = 0;
            for (c, &o) in order.iter().enumerate() {
                let v: Vec<f32> = scaled.iter().skip(c).step_by(classes).copied().collect();
                let mut p = vec![0f32; m];
                r.fill(&v, whole, &mut p);
                if p[i] > 0.5 {
                    want = o;
                    passed[c] += 1;
                }
            }
            assert_eq!(got[i], want as f32, "voxel {i}");
        }
        assert!(passed.iter().all(|&k| k > 0), "{passed:?}");
    }
}
