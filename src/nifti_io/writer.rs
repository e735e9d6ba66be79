//! Writing a whole volume (int16 image or uint8 label) as NIfTI-1 on an axis-aligned grid of
//! the given spacing in micrometers: the synthetic datasets and test fixtures. A segmentation in
//! an input's own geometry is streamed by [`super::LabelWriter`] instead.

use std::path::Path;

use ndarray::ArrayView3;
use nifti::writer::WriterOptions;
use nifti::{NiftiError, NiftiHeader};

use crate::error::{Error, Result};

/// Write one volume as NIfTI-1 (.nii or .nii.gz decided by the file name) with the given spacing;
/// data in (z, y, x) C order (x fastest).
pub fn write_nifti_i16(
    path: &Path,
    shape_xyz: [usize; 3],
    spacing_xyz: [f64; 3],
    data: &[i16],
) -> Result<()> {
    write_volume(path, shape_xyz, spacing_xyz, data)
}

/// Write one label volume as NIfTI-1 (.nii or .nii.gz decided by the file name) with the given
/// spacing; data in (z, y, x) C order (x fastest).
pub fn write_nifti_u8(
    path: &Path,
    shape_xyz: [usize; 3],
    spacing_xyz: [f64; 3],
    data: &[u8],
) -> Result<()> {
    write_volume(path, shape_xyz, spacing_xyz, data)
}

/// Voxel types the writer accepts (the nifti writer's bounds, without naming `bytemuck`).
trait Voxel: Sized {
    const DESCRIPTION: &'static str;
    fn write(options: &WriterOptions<'_>, array: &ArrayView3<'_, Self>) -> nifti::Result<()>;
}

impl Voxel for i16 {
    const DESCRIPTION: &'static str = "voxcache synthetic two-photon vessels: image";
    fn write(options: &WriterOptions<'_>, array: &ArrayView3<'_, Self>) -> nifti::Result<()> {
        options.write_nifti(array)
    }
}

impl Voxel for u8 {
    const DESCRIPTION: &'static str = "voxcache synthetic two-photon vessels: label";
    fn write(options: &WriterOptions<'_>, array: &ArrayView3<'_, Self>) -> nifti::Result<()> {
        options.write_nifti(array)
    }
}

fn write_volume<T: Voxel>(
    path: &Path,
    shape_xyz: [usize; 3],
    spacing_xyz: [f64; 3],
    data: &[T],
) -> Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if !(name.ends_with(".nii") || name.ends_with(".nii.gz")) || name.starts_with(".nii") {
        return Err(Error::nifti(
            path,
            "output file name must end with .nii or .nii.gz",
        ));
    }
    if shape_xyz.iter().any(|&n| n == 0 || n > i16::MAX as usize) {
        return Err(Error::nifti(
            path,
            format!(
                "shape {shape_xyz:?} must be between 1 and {} along each axis",
                i16::MAX
            ),
        ));
    }
    if spacing_xyz.iter().any(|v| !v.is_finite() || *v <= 0.0) {
        return Err(Error::nifti(
            path,
            format!("spacing {spacing_xyz:?} must be finite and positive"),
        ));
    }
    let [nx, ny, nz] = shape_xyz;
    if data.len() != nx * ny * nz {
        return Err(Error::nifti(
            path,
            format!(
                "{} voxels given for shape {shape_xyz:?} ({} expected)",
                data.len(),
                nx * ny * nz
            ),
        ));
    }

    let header = nifti_header(spacing_xyz, T::DESCRIPTION);
    // (z, y, x) C order reversed is an [nx, ny, nz] Fortran-order view: x fastest on disk.
    let array = ArrayView3::from_shape((nz, ny, nx), data)
        .map_err(|e| Error::nifti(path, e.to_string()))?
        .reversed_axes();
    let options = WriterOptions::new(path).reference_header(&header);
    T::write(&options, &array).map_err(|e| match e {
        NiftiError::Io(io) => Error::io(path, io),
        other => Error::nifti(path, other.to_string()),
    })
}

/// Header fields the writer copies: geometry, units and description (dim, datatype, bitpix,
/// vox_offset, scaling and magic are filled in by the writer).
fn nifti_header(spacing_xyz: [f64; 3], description: &str) -> NiftiHeader {
    let [sx, sy, sz] = spacing_xyz.map(|v| v as f32);
    let mut descrip = description.as_bytes().to_vec();
    descrip.resize(80, 0);
    NiftiHeader {
        pixdim: [1.0, sx, sy, sz, 1.0, 1.0, 1.0, 1.0],
        // NIFTI_UNITS_MICRON, no time unit.
        xyzt_units: 3,
        qform_code: 1,
        sform_code: 1,
        quatern_b: 0.0,
        quatern_c: 0.0,
        quatern_d: 0.0,
        quatern_x: 0.0,
        quatern_y: 0.0,
        quatern_z: 0.0,
        srow_x: [sx, 0.0, 0.0, 0.0],
        srow_y: [0.0, sy, 0.0, 0.0],
        srow_z: [0.0, 0.0, sz, 0.0],
        descrip,
        ..NiftiHeader::default()
    }
}
