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
pub mod sizes;
pub mod spline;
pub mod volume;

use std::path::Path;

use crate::error::{Error, Result};
use crate::format::nnunet::{Plans, Resampling};
use crate::nifti_io::{HeaderInfo, SourceOptions, VoxelSource};
use crate::prep::dataset::CaseSource;

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
        ram_limit_bytes: INPUT_RAM_BYTES,
        scratch_dir: tmp.to_path_buf(),
    };
    let mut sources = Vec::with_capacity(channels);
    for k in 0..channels {
        let (path, frame) = case.channel(k);
        let mut nonfinite = 0u64;
        let (src, _) = VoxelSource::open_frame(path, frame, &opts, &mut |b| {
            nonfinite += crate::prep::normalize::count_nonfinite(b);
            Ok(())
        })?;
        crate::prep::normalize::refuse_nonfinite(path, nonfinite)?;
        sources.push(src);
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
    let cropped = crop::crop(
        &case.id,
        &sources,
        shape_zyx,
        tf,
        &plans.configuration.use_mask_for_norm,
        tmp,
    )?;
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
    let normalized = crop::normalize(&case.id, &sources, &cropped, plans, tmp)?;
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
    Ok(Preprocessed {
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
    })
}
