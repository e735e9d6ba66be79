//! nnU-Net v2's inference preprocessing (its `DefaultPreprocessor.run_case`), step by step as
//! its code does it and out of core: the channels read in (z, y, x) order as its readers give
//! them, `transpose_forward`, the crop to the bounding box of the nonzero voxels (their mask
//! with holes filled, for schemes normalized inside it), the normalization scheme of each
//! channel, and the resampling to the configuration's spacing (cubic B-spline with clipping,
//! or per-slice in the plane and order 0 along an anisotropic axis).
//!
//! Every stage reads and writes scratch volumes a slice or a block of lines at a time.
//!
//! - [`spline`]: one axis's resampling, and the rules for shapes and the separate axis.
//! - [`resample`]: a volume resampled axis by axis, out of core.
//! - [`sizes`]: a case's grids and scratch disk, from its header, before anything is made.
//! - [`volume`]: scratch volumes on disk.

mod crop;
pub mod resample;
pub mod seg;
pub mod sizes;
pub mod spline;
pub mod volume;

use std::path::Path;

use crate::error::{Error, Result};
use crate::format::nnunet::{Plans, Resampling};
use crate::format::{AppliedNormalization, Dtype, IntensityStats};
use crate::nifti_io::{HeaderInfo, LabelCheck, SourceOptions, VoxelSource};
use crate::prep::dataset::CaseSource;
use crate::prep::normalize::IntensityAccumulator;

pub use crop::Cropped;
use resample::Clip;
use volume::Scratch;

/// Input voxel bytes held in memory before an input goes to a scratch file.
const INPUT_RAM_BYTES: u64 = 256 << 20;

/// Where a case's arrays went on the way: what nnU-Net keeps in its `properties` dict, and
/// what the export needs to go back.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseGeometry {
    /// The file's grid (z, y, x).
    pub shape_zyx: [usize; 3],
    /// Its spacing (z, y, x), as nnU-Net's readers give it.
    pub spacing_zyx: [f64; 3],
    /// The grid after `transpose_forward` (nnU-Net's `shape_before_cropping`).
    pub shape_before_cropping: [usize; 3],
    /// The spacing after `transpose_forward`.
    pub spacing_transposed: [f64; 3],
    /// The nonzero bounding box in transposed axes, half open (`bbox_used_for_cropping`).
    pub bbox: [[usize; 2]; 3],
    /// `shape_after_cropping_and_before_resampling`.
    pub shape_after_cropping: [usize; 3],
    /// The spacing resampled to (2d: the case's own along the first axis).
    pub target_spacing: [f64; 3],
    /// The preprocessed grid.
    pub new_shape: [usize; 3],
}

/// A preprocessed case: the network's input volume and where it came from.
pub struct Preprocessed {
    /// (channels, z, y, x) in the transposed, cropped, resampled grid.
    pub data: Scratch<f32>,
    /// The way there.
    pub geometry: CaseGeometry,
    /// Each channel's file: its blake3 and size as stored.
    pub files: Vec<(blake3::Hash, u64)>,
    /// Each channel's statistics before normalization (the whole file).
    pub intensity: Vec<IntensityStats>,
    /// Each channel's normalization as applied.
    pub normalization: Vec<AppliedNormalization>,
}

/// A training case's segmentation as nnU-Net preprocesses it.
pub struct PreprocessedLabel {
    /// (1, z, y, x) on the preprocessed grid: the label values, -1 for background outside
    /// the normalization mask (nnU-Net's `seg`).
    pub voxels: Scratch<f32>,
    /// The type it is cached as (u8 when every value fits).
    pub dtype: Dtype,
    /// The file's blake3 and size as stored.
    pub file: (blake3::Hash, u64),
}

/// The configuration's target spacing for a case of transposed spacing `spacing` (a 2d
/// configuration keeps the case's first axis).
pub fn target_spacing(plans: &Plans, spacing: [f64; 3]) -> [f64; 3] {
    match plans.configuration.spacing[..] {
        [y, x] => [spacing[0], y, x],
        [z, y, x] => [z, y, x],
        _ => spacing,
    }
}

/// The resampling of a volume of `from` at spacing `current` to `to` at `new` as `how` says:
/// per-axis kinds, and the clipping skimage applies.
pub fn plan_resampling(
    how: &Resampling,
    from: [usize; 3],
    to: [usize; 3],
    current: [f64; 3],
    new: [f64; 3],
) -> ([spline::Axis; 3], Clip) {
    let sep = spline::separate_axis(how.force_separate_z, current, new);
    let axes = spline::axes(from, to, how.order, how.order_z, sep);
    let clip = if !resample::needs_clip(&axes) {
        Clip::None
    } else {
        match sep {
            Some(a) => Clip::Plane(a),
            None => Clip::Channel,
        }
    };
    (axes, clip)
}

/// Preprocess `case` as nnU-Net would for `plans`' configuration, into scratch files in `tmp`.
/// The scale from the header's spatial unit to what nnU-Net's `reader` gives: SimpleITK (ITK's
/// NIfTI reader) converts to mm (um x 1e-3, m x 1e3; mm and an unknown unit as stored);
/// nibabel gives pixdim as stored.
pub fn reader_unit_scale(h: &HeaderInfo, reader: &str) -> f64 {
    match (reader, h.unit) {
        ("SimpleITKIO", "um") => 1e-3,
        ("SimpleITKIO", "m") => 1e3,
        _ => 1.0,
    }
}

/// The spacing (z, y, x) nnU-Net's `reader` gives for the header `h`
/// ([`reader_unit_scale`]).
pub fn reader_spacing_zyx(h: &HeaderInfo, reader: &str) -> [f64; 3] {
    let k = reader_unit_scale(h, reader);
    let s = h.spacing_xyz;
    [s[2] * k, s[1] * k, s[0] * k]
}

/// `reader`: nnU-Net's image reader the model was trained with (its spacing,
/// [`reader_spacing_zyx`]).
pub fn preprocess(
    case: &CaseSource,
    plans: &Plans,
    reader: &str,
    tmp: &Path,
) -> Result<Preprocessed> {
    run(case, plans, reader, None, INPUT_RAM_BYTES, tmp).map(|(p, _)| p)
}

/// [`preprocess`] of a training case with its segmentation (`case.label`, checked by `check`
/// as it is read): the label cropped with the image, in the normalization mask where it is
/// foreground, and resampled with the plans' `resampling_fn_seg_kwargs` ([`seg`]). Inputs whose
/// voxels pass `ram_bytes` are inflated into scratch files.
pub fn preprocess_training(
    case: &CaseSource,
    plans: &Plans,
    reader: &str,
    check: LabelCheck,
    ram_bytes: u64,
    tmp: &Path,
) -> Result<(Preprocessed, Option<PreprocessedLabel>)> {
    run(case, plans, reader, Some(check), ram_bytes, tmp)
}

fn run(
    case: &CaseSource,
    plans: &Plans,
    reader: &str,
    check: Option<LabelCheck>,
    ram_bytes: u64,
    tmp: &Path,
) -> Result<(Preprocessed, Option<PreprocessedLabel>)> {
    let channels = plans.channels();
    if case.images.len() != channels {
        return Err(Error::case(
            &case.id,
            format!(
                "{} image channel(s) but the model takes {channels}",
                case.images.len()
            ),
        ));
    }
    let opts = SourceOptions {
        ram_limit_bytes: ram_bytes,
        scratch_dir: tmp.to_path_buf(),
    };
    let mut sources = Vec::with_capacity(channels);
    let mut files = Vec::with_capacity(channels);
    let mut intensity = Vec::with_capacity(channels);
    for k in 0..channels {
        let (path, frame) = case.channel(k);
        let mut acc = IntensityAccumulator::default();
        let (src, streamed) = VoxelSource::open_frame(path, frame, &opts, &mut |b| {
            acc.add(b);
            Ok(())
        })?;
        let stats = acc.finish();
        crate::prep::normalize::refuse_nonfinite(path, stats.nonfinite_voxels)?;
        sources.push(src);
        files.push((streamed.file_hash, streamed.file_bytes));
        intensity.push(stats);
    }
    let h0 = sources[0].header().clone();
    for s in &sources[1..] {
        if s.header().shape_xyz != h0.shape_xyz {
            return Err(Error::case(
                &case.id,
                format!(
                    "{} has shape {:?} but {} has {:?}: every channel must share one grid",
                    s.header().path.display(),
                    s.header().shape_xyz,
                    h0.path.display(),
                    h0.shape_xyz
                ),
            ));
        }
    }
    let shape_zyx = crate::geometry::zyx(h0.shape_xyz);
    let spacing_zyx = reader_spacing_zyx(&h0, reader);
    let tf = plans.transpose_forward;
    // A training case's label needs the filled nonzero mask (its -1 background) whatever the
    // channels' normalization.
    let mask_for = match check {
        Some(_) => vec![true],
        None => plans.configuration.use_mask_for_norm.clone(),
    };
    let mut cropped = crop::crop(&case.id, &sources, shape_zyx, tf, &mask_for, tmp)?;
    let label = match (check, &case.label) {
        (Some(mut check), Some(path)) => {
            let (src, streamed) = VoxelSource::open(path, &opts, &mut |b| check.block(b))?;
            if src.header().shape_xyz != h0.shape_xyz {
                return Err(Error::case(
                    &case.id,
                    format!(
                        "{} has shape {:?} but {} has {:?}: the label must share the image's grid",
                        path.display(),
                        src.header().shape_xyz,
                        h0.path.display(),
                        h0.shape_xyz
                    ),
                ));
            }
            let cropped_label = seg::crop_label(&src, &mut cropped, tmp)?;
            Some((
                cropped_label,
                check.dtype(),
                (streamed.file_hash, streamed.file_bytes),
            ))
        }
        _ => None,
    };
    let shape_before_cropping = tf.map(|a| shape_zyx[a]);
    let spacing_transposed = tf.map(|a| spacing_zyx[a]);
    let shape_after_cropping = cropped.shape;
    let target = target_spacing(plans, spacing_transposed);
    // The whole image's grid was checked first (sizes::case_sizes): the crop's is no larger.
    let new_shape = spline::new_shape(shape_after_cropping, spacing_transposed, target)
        .map_err(|(a, v)| Error::case(&case.id, format!("its nonzero region {shape_after_cropping:?} at spacing {spacing_transposed:?} gives {v:e} voxels along axis {a} at the model's spacing {target:?}")))?;
    if new_shape.contains(&0) {
        return Err(Error::case(&case.id, format!("its nonzero region {shape_after_cropping:?} at spacing {spacing_transposed:?} has no voxel at the model's spacing {target:?}")));
    }
    let (normalized, normalization) = crop::normalize(&case.id, &sources, &cropped, plans, tmp)?;
    drop(sources);
    let (axes, clip) = plan_resampling(
        &plans.configuration.resampling_data,
        shape_after_cropping,
        new_shape,
        spacing_transposed,
        target,
    );
    let data = if resample::is_identity(&axes) {
        normalized
    } else {
        let out = Scratch::new(tmp, [channels, new_shape[0], new_shape[1], new_shape[2]])?;
        resample::resample(&normalized, &out, axes, clip, tmp)?;
        out
    };
    let label = match label {
        None => None,
        Some((cropped_label, dtype, file)) => {
            let how = plans.configuration.resampling_seg.as_ref().ok_or_else(|| Error::Model {
                path: plans.path.clone(),
                message: format!(
                    "configuration {}: no resampling_fn_seg_kwargs: nnU-Net's training preprocessing cannot be reproduced",
                    plans.configuration.name
                ),
            })?;
            let sep = spline::separate_axis(how.force_separate_z, spacing_transposed, target);
            // nnU-Net's other path (per-label rounding along the separate axis) is taken only
            // where that axis changes size.
            let other_path =
                sep.is_some_and(|a| how.order_z != 0 && shape_after_cropping[a] != new_shape[a]);
            if other_path || how.order == 2 {
                return Err(Error::Model {
                    path: plans.path.clone(),
                    message: format!(
                        "configuration {}: segmentations resampled at order {} (order_z {}) are not reproduced (nnU-Net plans order 1, order_z 0)",
                        plans.configuration.name, how.order, how.order_z
                    ),
                });
            }
            let (axes, clip) = plan_resampling(
                how,
                shape_after_cropping,
                new_shape,
                spacing_transposed,
                target,
            );
            let voxels = seg::resample_label(cropped_label, axes, clip, tmp)?;
            Some(PreprocessedLabel {
                voxels,
                dtype,
                file,
            })
        }
    };
    let pre = Preprocessed {
        data,
        geometry: CaseGeometry {
            shape_zyx,
            spacing_zyx,
            shape_before_cropping,
            spacing_transposed,
            bbox: cropped.bbox,
            shape_after_cropping,
            target_spacing: target,
            new_shape,
        },
        files,
        intensity,
        normalization,
    };
    Ok((pre, label))
}
