//! nnU-Net's export of a predicted case, out of core: the logits (float16, as its predictor
//! leaves them) averaged over folds, resampled to the cropped grid as the plans'
//! `resampling_fn_probabilities` says (kept in float16, as nnU-Net's array is), turned into
//! labels (argmax over classes, or each region's sigmoid over 0.5 in `regions_class_order`),
//! put back into the uncropped grid and transposed back to the file's axes; on request, the
//! probabilities (softmax or sigmoid in float32) as nnU-Net's `CASE.npz` and `CASE.pkl`.

use std::path::Path;

use half::f16;

use super::model::NnunetModel;
use crate::error::Result;
use crate::format::nnunet::output::{write_npz, write_pickle, PyValue};
use crate::nifti_io::{LabelType, LabelWriter};
use crate::prep::nnunet::resample::{is_identity, resample};
use crate::prep::nnunet::volume::{Elem, Scratch};
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

/// Where the probabilities go (`--save-probabilities`): nnU-Net's `CASE.npz` and `CASE.pkl`.
pub struct ProbabilityFiles<'a> {
    /// `CASE.npz`.
    pub npz: &'a Path,
    /// `CASE.pkl`.
    pub pkl: &'a Path,
}

/// Export `logits` (heads, preprocessed grid; the sum over `members` folds) of a case of
/// geometry `geo` to `out`, a NIfTI with `input`'s header, and the probabilities to `probs`.
#[allow(clippy::too_many_arguments)]
pub fn export(
    model: &NnunetModel,
    logits: Scratch<f16>,
    members: usize,
    geo: &CaseGeometry,
    input: &Path,
    out: &Path,
    probs: Option<ProbabilityFiles>,
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
    // Labels (and probabilities) over the box.
    let [dc, hc, wc] = geo.shape_after_cropping;
    let seg: Scratch<u16> = Scratch::new(tmp, [1, dc, hc, wc])?;
    let prob: Option<Scratch<f32>> = match probs {
        Some(_) => Some(Scratch::new(tmp, [heads, dc, hc, wc])?),
        None => None,
    };
    let labels = &model.dataset.labels;
    // Each voxel's logits, exactly as float32 (the labels' rules take float32).
    let mut v = vec![0f32; heads];
    let mut p = vec![0f32; heads];
    for z in 0..dc {
        let slices: Vec<Vec<f16>> = (0..heads)
            .map(|c| cropped.slice(c, z))
            .collect::<Result<_>>()?;
        let mut ps = vec![vec![0f32; hc * wc]; if prob.is_some() { heads } else { 0 }];
        let labels: Vec<u16> = (0..hc * wc)
            .map(|i| {
                for (c, s) in slices.iter().enumerate() {
                    v[c] = f32::from(s[i]);
                }
                if !ps.is_empty() {
                    labels.probabilities_of_logits(&v, &mut p);
                    for (c, s) in ps.iter_mut().enumerate() {
                        s[i] = p[c];
                    }
                }
                labels.label_of_logits(&v)
            })
            .collect();
        seg.write_rows(0, z, 0, &labels)?;
        if let Some(prob) = &prob {
            for (c, s) in ps.iter().enumerate() {
                prob.write_rows(c, z, 0, s)?;
            }
        }
    }
    drop(cropped);
    let tf = model.plans.transpose_forward;
    if let (Some(files), Some(prob)) = (probs, &prob) {
        let [d, h, w] = geo.shape_zyx;
        let classes = !labels.is_regions();
        write_npz(files.npz, [heads, d, h, w], |c, z, s| {
            // Outside the box nnU-Net's probabilities say background for classes, 0 for regions.
            let fill = if classes && c == 0 { 1.0 } else { 0.0 };
            file_slice(prob, c, z, geo, tf, fill, s)
        })?;
        write_pickle(files.pkl, &properties(&model.reader, geo, input)?)?;
    }
    let [d, h, w] = geo.shape_zyx;
    let mut writer = LabelWriter::create(
        out,
        input,
        (d * h * w) as u64,
        LabelType::for_max(labels.max_value()),
    )?;
    let mut slice = vec![0u16; h * w];
    for z in 0..d {
        file_slice(&seg, 0, z, geo, tf, 0, &mut slice)?;
        writer.write(&slice)?;
    }
    writer.finish()
}

/// Slice `z` of the file's grid of channel `c` of `src` (a volume over the crop box in
/// transposed axes) into `out`: `fill` outside the box. Read a run along `src`'s last axis at a
/// time, which lies along one of the slice's axes unless the transpose maps the file's first
/// axis there (nnU-Net's plans never do: they move the coarsest axis first).
fn file_slice<T: Elem>(
    src: &Scratch<T>,
    c: usize,
    z: usize,
    geo: &CaseGeometry,
    tf: [usize; 3],
    fill: T,
    out: &mut [T],
) -> Result<()> {
    let [_, h, w] = geo.shape_zyx;
    let b = geo.bbox;
    out.iter_mut().for_each(|v| *v = fill);
    // Transposed axis a is the file's axis tf[a].
    let az = (0..3).find(|&a| tf[a] == 0).unwrap_or(0);
    if z < b[az][0] || z >= b[az][1] {
        return Ok(());
    }
    let at = |file: [usize; 3]| file[1] * w + file[2];
    if tf[2] == 0 {
        let mut one = [T::default()];
        for y in 0..h {
            for x in 0..w {
                let o = [z, y, x];
                let t = tf.map(|a| o[a]);
                if (0..3).all(|a| t[a] >= b[a][0] && t[a] < b[a][1]) {
                    src.read_run(c, t[0] - b[0][0], t[1] - b[1][0], t[2] - b[2][0], &mut one)?;
                    out[at(o)] = one[0];
                }
            }
        }
        return Ok(());
    }
    // The other transposed axis before the last, and the file axes of both.
    let ao = 1 - az;
    let mut run = vec![T::default(); b[2][1] - b[2][0]];
    for v in b[ao][0]..b[ao][1] {
        let mut t = [0usize; 3];
        t[az] = z;
        t[ao] = v;
        src.read_run(c, t[0] - b[0][0], t[1] - b[1][0], 0, &mut run)?;
        for (i, r) in run.iter().enumerate() {
            t[2] = b[2][0] + i;
            let mut o = [0usize; 3];
            for a in 0..3 {
                o[tf[a]] = t[a];
            }
            out[at(o)] = *r;
        }
    }
    Ok(())
}

/// nnU-Net's properties of a case, as its predictor pickles them beside the probabilities:
/// the reader's geometry, the spacing (z, y, x) and the crop.
fn properties(reader: &str, geo: &CaseGeometry, input: &Path) -> Result<PyValue> {
    let header = crate::nifti_io::read_header(input)?;
    let m = header.affine.0;
    // SimpleITK gives the spacing in mm whatever the header's unit; the origin as stored.
    let k = crate::prep::nnunet::reader_unit_scale(&header, reader);
    let spacing = header.spacing_exact_xyz().map(|s| s * k);
    let reader_geometry = if reader == "NibabelIO" {
        let affine = m.iter().map(|r| PyValue::floats(r)).collect();
        (
            "nibabel_stuff",
            PyValue::Dict(vec![("original_affine".into(), PyValue::List(affine))]),
        )
    } else {
        // SimpleITK's view of the same header: LPS world axes, unit direction columns.
        let lps = [-1.0, -1.0, 1.0];
        let norms = header.affine.column_norms();
        let mut direction = Vec::with_capacity(9);
        for r in 0..3 {
            for (col, n) in norms.iter().enumerate() {
                direction.push(lps[r] * m[r][col] / n.max(f64::MIN_POSITIVE));
            }
        }
        let origin: Vec<f64> = (0..3).map(|r| lps[r] * m[r][3]).collect();
        (
            "sitk_stuff",
            PyValue::Dict(vec![
                ("spacing".into(), PyValue::float_tuple(&spacing)),
                ("origin".into(), PyValue::float_tuple(&origin)),
                ("direction".into(), PyValue::float_tuple(&direction)),
            ]),
        )
    };
    let tuple = |s: [usize; 3]| PyValue::Tuple(s.iter().map(|&v| PyValue::Int(v as i64)).collect());
    Ok(PyValue::Dict(vec![
        (reader_geometry.0.into(), reader_geometry.1),
        // The reader's spacing (z, y, x): the header's float32 pixdim widened, as ITK and
        // nibabel give it.
        (
            "spacing".into(),
            PyValue::floats(&[spacing[2], spacing[1], spacing[0]]),
        ),
        (
            "shape_before_cropping".into(),
            tuple(geo.shape_before_cropping),
        ),
        (
            "bbox_used_for_cropping".into(),
            PyValue::List(geo.bbox.iter().map(|r| PyValue::ints(r)).collect()),
        ),
        (
            "shape_after_cropping_and_before_resampling".into(),
            tuple(geo.shape_after_cropping),
        ),
    ]))
}
