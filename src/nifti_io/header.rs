//! The header: read and validate a NIfTI-1 header, or a NIfTI-2 one read into the same fields
//! (dimensions, datatype, spacing, offset, scaling), and derive its affine from sform, qform or
//! pixdim.

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use nifti::{NiftiHeader, NiftiType};
use serde::Serialize;

use super::file::{gz_message, is_gzip, open_input, read_up_to};
use super::nifti2::{is_nifti2, to_nifti1, NIFTI2_HEADER_BYTES};
use crate::error::{Error, Result};
use crate::geometry::Affine;

pub(super) const NIFTI1_HEADER_BYTES: usize = 348;

/// The validated facts of a NIfTI-1 or NIfTI-2 header.
#[derive(Clone, Debug, Serialize)]
pub struct HeaderInfo {
    /// The file the header was read from.
    pub path: PathBuf,
    /// Voxel counts along NIfTI axes (i, j, k) = (x, y, z).
    pub shape_xyz: [usize; 3],
    /// pixdim[1..=3], validated finite and positive.
    pub spacing_xyz: [f64; 3],
    /// Voxel-to-world affine: sform when its code is set, else qform, else pixdim scaling.
    pub affine: Affine,
    /// Which of "sform", "qform", "pixdim" the affine came from.
    pub affine_source: &'static str,
    /// Why the header's preferred transform was passed over for `affine_source`, if it was
    /// (an unusable sform with a usable qform): shown as a warning and kept in the entry.
    pub affine_warning: Option<String>,
    /// qform_code as stored (0: no qform).
    pub qform_code: i16,
    /// sform_code as stored (0: no sform).
    pub sform_code: i16,
    /// Datatype name, e.g. "int16".
    pub datatype: &'static str,
    /// Bytes of one stored voxel.
    pub bytes_per_voxel: usize,
    /// Byte offset of the voxel data in the (inflated) file.
    pub vox_offset: usize,
    /// The header and voxels are big-endian.
    pub big_endian: bool,
    /// The file is gzip-compressed.
    pub gzip: bool,
    /// Spatial unit from xyzt_units ("mm", "um", "m" or "unknown").
    pub unit: &'static str,
    /// Volumes along the 4th dimension, one after the other in the file: 1 for a 3-D image;
    /// more only where they were asked for ([`read_header_frames`]): the channels of a Medical
    /// Segmentation Decathlon multi-modal file. Everything else describes one volume.
    pub frames: usize,
    #[serde(skip)]
    pub(super) raw: NiftiHeader,
}

impl HeaderInfo {
    /// Voxels of one volume.
    pub fn voxel_count(&self) -> u64 {
        crate::geometry::voxels(self.shape_xyz)
    }

    /// pixdim[1..=3] widened exactly from single precision (0.99 reads 0.9900000095367432):
    /// what ITK, hence SimpleITK and nnU-Net, compute with. `spacing_xyz` is the decimal a
    /// person typed; planning uses these so that a ratio of exactly 3 (0.8 and 2.4) falls on
    /// the same side of nnU-Net's anisotropy threshold as in nnU-Net.
    pub fn spacing_exact_xyz(&self) -> [f64; 3] {
        std::array::from_fn(|a| f64::from(self.raw.pixdim[a + 1]).abs())
    }

    /// Bytes of voxel data of one volume (all the file's for a 3-D image).
    pub fn data_bytes(&self) -> u64 {
        self.voxel_count() * self.bytes_per_voxel as u64
    }

    /// Bytes of voxel data the file must hold after `vox_offset`: every volume's.
    pub fn file_data_bytes(&self) -> u64 {
        self.data_bytes().saturating_mul(self.frames as u64)
    }
}

fn datatype_facts(t: NiftiType) -> Option<(&'static str, usize)> {
    Some(match t {
        NiftiType::Uint8 => ("uint8", 1),
        NiftiType::Int8 => ("int8", 1),
        NiftiType::Int16 => ("int16", 2),
        NiftiType::Uint16 => ("uint16", 2),
        NiftiType::Int32 => ("int32", 4),
        NiftiType::Uint32 => ("uint32", 4),
        NiftiType::Float32 => ("float32", 4),
        NiftiType::Int64 => ("int64", 8),
        NiftiType::Uint64 => ("uint64", 8),
        NiftiType::Float64 => ("float64", 8),
        _ => return None,
    })
}

/// Read and validate only the header (cheap: for .nii.gz only the first bytes are inflated),
/// and check that the file is large enough for the voxel data the header declares.
pub fn read_header(path: &Path) -> Result<HeaderInfo> {
    read_header_with(path, false)
}

/// [`read_header`] of a file that may hold several volumes along its 4th dimension (the
/// Decathlon's channels): [`HeaderInfo::frames`] says how many.
pub fn read_header_frames(path: &Path) -> Result<HeaderInfo> {
    read_header_with(path, true)
}

/// The header of volume `frame` of a 4-D file (checked to exist), or of a 3-D file when
/// `frame` is `None`.
pub fn read_frame_header(path: &Path, frame: Option<usize>) -> Result<HeaderInfo> {
    match frame {
        None => read_header(path),
        Some(k) => {
            let h = read_header_frames(path)?;
            check_frame(&h, k)?;
            Ok(h)
        }
    }
}

/// Volume `k` is one the file holds.
pub(super) fn check_frame(h: &HeaderInfo, k: usize) -> Result<()> {
    if k >= h.frames {
        return Err(Error::nifti(
            &h.path,
            format!(
                "volume {k} asked for, but the file holds {} volume{}",
                h.frames,
                if h.frames == 1 { "" } else { "s" }
            ),
        ));
    }
    Ok(())
}

fn read_header_with(path: &Path, allow_frames: bool) -> Result<HeaderInfo> {
    let mut file = open_input(path)?;
    let mut magic = [0u8; 2];
    let n = read_up_to(&mut file, &mut magic).map_err(|e| Error::io(path, e))?;
    let gzip = is_gzip(&magic[..n]);
    drop(file);
    let file = open_input(path)?;
    let stored = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let res = if gzip {
        read_head(&mut MultiGzDecoder::new(file))
    } else {
        read_head(&mut std::io::BufReader::new(file))
    };
    let head =
        res.map_err(|e| Error::nifti(path, format!("cannot read header: {}", gz_message(e))))?;
    let header = parse_header_with(path, &head, gzip, allow_frames)?;
    check_stored_size(&header, stored)?;
    Ok(header)
}

/// Read and validate the header of a file already in memory, as stored (gzip or not, told
/// from its first two bytes), the way [`read_header`] does from disk: only the header's bytes
/// are inflated, so a stream that is corrupt or huge past them costs nothing here. `path` only
/// names the file in errors; nothing is read from it.
///
/// # Errors
///
/// [`Error::Nifti`], naming `path`, for bytes that are not a valid NIfTI-1 or NIfTI-2 header
/// (too short, a gzip stream that breaks inside the header, a bad magic, dimensions, datatype,
/// spacing, offset or geometry), or bytes too few for the voxel data it declares.
pub fn parse_header_bytes(path: &Path, bytes: &[u8]) -> Result<HeaderInfo> {
    let gzip = is_gzip(bytes);
    let res = if gzip {
        read_head(&mut MultiGzDecoder::new(bytes))
    } else {
        read_head(&mut &bytes[..])
    };
    let head =
        res.map_err(|e| Error::nifti(path, format!("cannot read header: {}", gz_message(e))))?;
    let header = parse_header(path, &head, gzip)?;
    check_stored_size(&header, bytes.len() as u64)?;
    Ok(header)
}

/// The most one byte of a deflate stream inflates to: a 258-byte match coded in two bits.
const DEFLATE_MAX_RATIO: u64 = 1032;

/// Refuse a header whose voxel data cannot fit in the `stored` bytes of its file: a plain file
/// shorter than `vox_offset` plus the data, or a gzip file too small to inflate to them even
/// at deflate's best ratio. Checked with the header, so that a header lying about its
/// dimensions fails its case at once (in `prep inspect --headers-only` too), before any plan
/// counts its forecast against the disk's free space.
fn check_stored_size(h: &HeaderInfo, stored: u64) -> Result<()> {
    let need = (h.vox_offset as u64).saturating_add(h.file_data_bytes());
    let room = if h.gzip {
        stored.saturating_mul(DEFLATE_MAX_RATIO)
    } else {
        stored
    };
    if room >= need {
        return Ok(());
    }
    let [x, y, z] = h.shape_xyz;
    let frames = match h.frames {
        1 => String::new(),
        n => format!("{n} volumes of "),
    };
    let declared = format!(
        "truncated: the header declares {frames}{x}x{y}x{z} {} voxels ({} bytes)",
        h.datatype,
        h.file_data_bytes()
    );
    Err(Error::nifti(
        &h.path,
        if h.gzip {
            format!(
                "{declared} but a gzip file of {stored} bytes cannot hold them (one byte inflates to {DEFLATE_MAX_RATIO} at most)"
            )
        } else {
            format!(
                "{declared} but the file holds {} bytes of voxel data",
                stored.saturating_sub(h.vox_offset as u64)
            )
        },
    ))
}

/// The header's bytes from the start of a (decompressed) stream: 348, or 540 when sizeof_hdr
/// announces NIfTI-2; fewer when the stream ends first (the parser says so). Never more, so
/// what follows is the extension or voxel data.
pub(super) fn read_head(r: &mut (impl Read + ?Sized)) -> std::io::Result<Vec<u8>> {
    let mut head = vec![0u8; NIFTI1_HEADER_BYTES];
    let n = read_up_to(r, &mut head)?;
    head.truncate(n);
    if is_nifti2(&head) {
        head.resize(NIFTI2_HEADER_BYTES, 0);
        let m = read_up_to(r, &mut head[NIFTI1_HEADER_BYTES..])?;
        head.truncate(NIFTI1_HEADER_BYTES + m);
    }
    Ok(head)
}

/// Validate a header from its first bytes: a 3-D image (or 4-D of one volume).
pub(super) fn parse_header(path: &Path, head: &[u8], gzip: bool) -> Result<HeaderInfo> {
    parse_header_with(path, head, gzip, false)
}

/// [`parse_header`], accepting several volumes along the 4th dimension when `allow_frames`.
pub(super) fn parse_header_with(
    path: &Path,
    head: &[u8],
    gzip: bool,
    allow_frames: bool,
) -> Result<HeaderInfo> {
    let mut raw = decode_raw(path, head)?;
    // The byte order is the header's as a whole, decided by dim[0] (the nifti crate's rule and
    // nibabel's): a sizeof_hdr written the other way round must not flip the voxels' order.
    let big_endian = raw.endianness == nifti::Endianness::Big;

    let ndim = raw.dim[0];
    if !(1..=7).contains(&ndim) {
        return Err(Error::nifti(
            path,
            format!("invalid dim[0] = {ndim} (must be 1..7)"),
        ));
    }
    let ndim = ndim as usize;
    let shape = spatial_shape(path, &raw, ndim)?;
    let frames = frame_count(path, &raw, ndim, allow_frames)?;
    let datatype = raw
        .data_type()
        .ok()
        .and_then(|t| datatype_facts(t).map(|f| (t, f)));
    let Some((_, (datatype, bytes_per_voxel))) = datatype else {
        return Err(Error::nifti(
            path,
            format!(
                "unsupported NIfTI datatype code {} (supported: integer and float scalars)",
                raw.datatype
            ),
        ));
    };
    let spacing = voxel_spacing(path, &raw, ndim)?;
    if !raw.vox_offset.is_finite() || raw.vox_offset < 352.0 || raw.vox_offset > 1e9 {
        return Err(Error::nifti(
            path,
            format!("invalid vox_offset {}", raw.vox_offset),
        ));
    }
    let vox_offset = raw.vox_offset as usize;
    // NIfTI: slope 0 means "no scaling"; a non-finite slope or intercept is treated the same
    // rather than turning every voxel into NaN.
    if !raw.scl_slope.is_finite() || !raw.scl_inter.is_finite() || raw.scl_slope == 0.0 {
        raw.scl_slope = 0.0;
        raw.scl_inter = 0.0;
    }
    let (affine, affine_source, affine_warning) =
        header_affine(&raw, spacing).map_err(|m| Error::nifti(path, m))?;
    if !affine.is_finite() {
        return Err(Error::nifti(
            path,
            format!("the {affine_source} affine holds non-finite numbers"),
        ));
    }
    Ok(HeaderInfo {
        path: path.to_path_buf(),
        shape_xyz: shape,
        spacing_xyz: spacing,
        affine,
        affine_source,
        affine_warning,
        qform_code: raw.qform_code,
        sform_code: raw.sform_code,
        datatype,
        bytes_per_voxel,
        vox_offset,
        big_endian,
        gzip,
        unit: spatial_unit(raw.xyzt_units),
        frames,
        raw,
    })
}

/// The raw header fields of a single-file NIfTI-1 or NIfTI-2 header (NIfTI-2 read into
/// NIfTI-1's), after its length, sizeof_hdr and magic are checked.
fn decode_raw(path: &Path, head: &[u8]) -> Result<NiftiHeader> {
    if head.len() < NIFTI1_HEADER_BYTES {
        return Err(Error::nifti(
            path,
            format!(
                "not a NIfTI file: only {} bytes, a header needs {NIFTI1_HEADER_BYTES}",
                head.len()
            ),
        ));
    }
    if is_nifti2(head) {
        return to_nifti1(head).map_err(|m| Error::nifti(path, m));
    }
    let sizeof_le = i32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let sizeof_be = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    if sizeof_le != 348 && sizeof_be != 348 {
        return Err(Error::nifti(
            path,
            "not a NIfTI file (sizeof_hdr is neither 348 nor 540)",
        ));
    }
    let magic = &head[344..348];
    if magic == b"ni1\0" {
        return Err(Error::nifti(
            path,
            "NIfTI-1 .hdr/.img pairs are not supported; use single-file .nii or .nii.gz",
        ));
    }
    if magic != b"n+1\0" {
        return Err(Error::nifti(
            path,
            format!(
                "bad NIfTI-1 magic {:?} (expected \"n+1\")",
                String::from_utf8_lossy(magic)
            ),
        ));
    }
    NiftiHeader::from_reader(head).map_err(|e| Error::nifti(path, format!("invalid header: {e}")))
}

/// Voxel counts along x, y, z: dim[1..=3] up to `ndim`, each in 1..=i16::MAX; 1 past it.
fn spatial_shape(path: &Path, raw: &NiftiHeader, ndim: usize) -> Result<[usize; 3]> {
    let mut shape = [1usize; 3];
    for (a, s) in shape.iter_mut().enumerate() {
        if a < ndim {
            let d = raw.dim[a + 1];
            if d == 0 || d > i16::MAX as u16 {
                return Err(Error::nifti(
                    path,
                    format!("invalid dim[{}] = {}", a + 1, d as i16),
                ));
            }
            *s = d as usize;
        }
    }
    Ok(shape)
}

/// Volumes along the 4th dimension: 1, or dim[4] where `allow_frames` and the dimensions past
/// it are 1. Any other extra dimension is refused.
fn frame_count(path: &Path, raw: &NiftiHeader, ndim: usize, allow_frames: bool) -> Result<usize> {
    let mut frames = 1usize;
    if ndim > 3 {
        let extra: Vec<u16> = raw.dim[4..=ndim].to_vec();
        let volumes = match extra.as_slice() {
            [n, rest @ ..] if *n >= 1 && *n <= i16::MAX as u16 && rest.iter().all(|&d| d == 1) => {
                Some(*n as usize)
            }
            _ => None,
        };
        if let (true, Some(n)) = (allow_frames, volumes) {
            frames = n;
        } else if extra.iter().any(|&d| d != 1) {
            // The Decathlon stores a case's modalities as the 4th dimension of one file.
            let hint = match extra.as_slice() {
                [n, rest @ ..] if *n > 1 && rest.iter().all(|&d| d == 1) => format!(
                    "; if these are {n} channels (the Decathlon's multi-modal layout), name the file after its case and declare the {n} channels in the folder's dataset.json (\"modality\" or \"channel_names\"), or split them into CASE_0000 to CASE_{:04}",
                    n - 1
                ),
                _ => String::new(),
            };
            return Err(Error::nifti(
                path,
                format!(
                    "{ndim}D volume with extra dimensions {extra:?}: only 3D volumes (or 4D with one frame) are supported{hint}"
                ),
            ));
        }
    }
    Ok(frames)
}

/// pixdim[1..=3] as decimals, each positive and finite where its axis exists or it is set;
/// 1 for an absent axis left at 0.
fn voxel_spacing(path: &Path, raw: &NiftiHeader, ndim: usize) -> Result<[f64; 3]> {
    let mut spacing = [1.0f64; 3];
    for (a, s) in spacing.iter_mut().enumerate() {
        let p = raw.pixdim[a + 1];
        if a < ndim || p != 0.0 {
            if !p.is_finite() || p <= 0.0 {
                return Err(Error::nifti(
                    path,
                    format!(
                        "invalid voxel spacing pixdim[{}] = {p} (must be a positive number)",
                        a + 1
                    ),
                ));
            }
            *s = f32_to_f64_decimal(p);
        }
    }
    Ok(spacing)
}

/// The spatial unit coded in xyzt_units' low three bits.
fn spatial_unit(xyzt_units: u8) -> &'static str {
    match xyzt_units & 0x07 {
        1 => "m",
        2 => "mm",
        3 => "um",
        _ => "unknown",
    }
}

/// Widen an f32 header field through its shortest decimal form, so 0.99f32 becomes 0.99 and
/// not 0.9900000095367432 (headers store what a person typed, in single precision).
pub fn f32_to_f64_decimal(v: f32) -> f64 {
    format!("{v}").parse().unwrap_or(v as f64)
}

/// The 3x3 part of an affine is a usable grid: finite, and no axis collapsed onto the others
/// (|det| above 1e-6 of the product of the column lengths).
fn usable(a: &Affine) -> std::result::Result<(), &'static str> {
    if !a.is_finite() {
        return Err("holds NaN or infinite numbers");
    }
    let m = &a.0;
    let det = m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
    let scale: f64 = a.column_norms().iter().product();
    if scale == 0.0 || det.abs() <= 1e-6 * scale {
        return Err("is singular (its axes do not span 3-D space)");
    }
    Ok(())
}

/// The voxel-to-world affine per the NIfTI-1 rules as nibabel applies them: the sform when
/// its code is set, else the qform when its code is set, else the pixdim diagonal. An unusable
/// sform falls back to a usable qform with a warning (the third value); an unusable transform
/// with nothing to fall back on, and a qform quaternion that is not a rotation, are refused.
/// Computed here because the nifti crate's qform helper panics on some legal headers.
type HeaderAffine = (Affine, &'static str, Option<String>);
fn header_affine(h: &NiftiHeader, spacing: [f64; 3]) -> std::result::Result<HeaderAffine, String> {
    let mut warning = None;
    if h.sform_code > 0 {
        let mut m = [[0.0; 4]; 4];
        for (r, row) in [h.srow_x, h.srow_y, h.srow_z].iter().enumerate() {
            for c in 0..4 {
                m[r][c] = f32_to_f64_decimal(row[c]);
            }
        }
        m[3][3] = 1.0;
        let a = Affine(m);
        match usable(&a) {
            Ok(()) => return Ok((a, "sform", None)),
            Err(why) if h.qform_code > 0 => {
                warning = Some(format!(
                    "the sform (code {}) {why}: the qform (code {}) is used instead",
                    h.sform_code, h.qform_code
                ));
            }
            Err(why) => {
                return Err(format!(
                    "the sform (code {}) {why}, and there is no qform to fall back on (qform_code 0): fix the header's srow_x/y/z",
                    h.sform_code
                ))
            }
        }
    }
    if h.qform_code > 0 {
        let (b, c, d) = (h.quatern_b as f64, h.quatern_c as f64, h.quatern_d as f64);
        let bcd = b * b + c * c + d * d;
        // nibabel's tolerance: a rounding error of a few float32 ulps, no more.
        if !bcd.is_finite() || bcd > 1.0 + 3.0 * f32::EPSILON as f64 {
            return Err(format!(
                "the qform quaternion (b, c, d) = ({b}, {c}, {d}) has b²+c²+d² = {bcd} > 1: it is not a rotation (nibabel refuses it too)"
            ));
        }
        let a = (1.0 - bcd).max(0.0).sqrt();
        let r = [
            [
                a * a + b * b - c * c - d * d,
                2.0 * (b * c - a * d),
                2.0 * (b * d + a * c),
            ],
            [
                2.0 * (b * c + a * d),
                a * a + c * c - b * b - d * d,
                2.0 * (c * d - a * b),
            ],
            [
                2.0 * (b * d - a * c),
                2.0 * (c * d + a * b),
                a * a + d * d - c * c - b * b,
            ],
        ];
        let qfac = if h.pixdim[0] < 0.0 { -1.0 } else { 1.0 };
        let scale = [spacing[0], spacing[1], spacing[2] * qfac];
        let mut m = [[0.0; 4]; 4];
        for i in 0..3 {
            for j in 0..3 {
                m[i][j] = r[i][j] * scale[j];
            }
        }
        m[0][3] = f32_to_f64_decimal(h.quatern_x);
        m[1][3] = f32_to_f64_decimal(h.quatern_y);
        m[2][3] = f32_to_f64_decimal(h.quatern_z);
        m[3][3] = 1.0;
        return Ok((Affine(m), "qform", warning));
    }
    Ok((Affine::diagonal(spacing), "pixdim", None))
}

/// Millimetres in one of a header's spatial units ("mm", "um", "m"); `None` for "unknown".
pub fn unit_in_mm(unit: &str) -> Option<f64> {
    match unit {
        "mm" => Some(1.0),
        "um" => Some(1e-3),
        "m" => Some(1e3),
        _ => None,
    }
}
