//! Reading NIfTI-1 headers and volumes.
//!
//! Everything a header says is checked before anything is allocated from it: dimensions,
//! datatype, spacing and the voxel data's byte count against what the file really holds. Gzip
//! files may have several members (as nibabel and some pipelines write them), so they are read
//! through a multi-member decoder. Values always come out as f32 with scl_slope/scl_inter applied.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use nifti::{InMemNiftiVolume, IntoNdArray, NiftiHeader, NiftiType};
use rayon::prelude::*;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::geometry::Affine;

const NIFTI1_HEADER_BYTES: usize = 348;
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The validated facts of a NIfTI-1 header.
#[derive(Clone, Debug, Serialize)]
pub struct HeaderInfo {
    pub path: PathBuf,
    /// Voxel counts along NIfTI axes (i, j, k) = (x, y, z).
    pub shape_xyz: [usize; 3],
    /// pixdim[1..=3], validated finite and positive.
    pub spacing_xyz: [f64; 3],
    /// Voxel-to-world affine: sform when its code is set, else qform, else pixdim scaling.
    pub affine: Affine,
    /// Which of "sform", "qform", "pixdim" the affine came from.
    pub affine_source: &'static str,
    pub qform_code: i16,
    pub sform_code: i16,
    /// Datatype name, e.g. "int16".
    pub datatype: &'static str,
    pub bytes_per_voxel: usize,
    pub vox_offset: usize,
    pub big_endian: bool,
    pub gzip: bool,
    /// Spatial unit from xyzt_units ("mm", "um", "m" or "unknown").
    pub unit: &'static str,
    #[serde(skip)]
    raw: NiftiHeader,
}

impl HeaderInfo {
    pub fn voxel_count(&self) -> u64 {
        crate::geometry::voxels(self.shape_xyz)
    }

    /// Bytes of voxel data the file must hold after `vox_offset`.
    pub fn data_bytes(&self) -> u64 {
        self.voxel_count() * self.bytes_per_voxel as u64
    }
}

/// A volume read into memory as f32, in C order with axes (z, y, x) (x fastest, as on disk).
#[derive(Debug)]
pub struct Volume {
    pub header: HeaderInfo,
    pub data: Vec<f32>,
    /// blake3 of the file's bytes as stored (compressed or not).
    pub file_hash: blake3::Hash,
    pub file_bytes: u64,
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

fn is_gzip(prefix: &[u8]) -> bool {
    prefix.len() >= 2 && prefix[..2] == GZIP_MAGIC
}

/// Read and validate only the header (cheap: for .nii.gz only the first bytes are inflated).
pub fn read_header(path: &Path) -> Result<HeaderInfo> {
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut magic = [0u8; 2];
    let n = read_up_to(&mut file, &mut magic).map_err(|e| Error::io(path, e))?;
    let gzip = is_gzip(&magic[..n]);
    drop(file);
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut head = Vec::with_capacity(NIFTI1_HEADER_BYTES);
    let res = if gzip {
        MultiGzDecoder::new(file)
            .take(NIFTI1_HEADER_BYTES as u64)
            .read_to_end(&mut head)
    } else {
        file.take(NIFTI1_HEADER_BYTES as u64).read_to_end(&mut head)
    };
    res.map_err(|e| Error::nifti(path, format!("cannot read header: {}", gz_message(e))))?;
    parse_header(path, &head, gzip)
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..])? {
            0 => break,
            k => filled += k,
        }
    }
    Ok(filled)
}

fn gz_message(e: std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            "truncated file (the gzip stream ends early)".to_string()
        }
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
            format!("corrupt gzip data ({e})")
        }
        _ => e.to_string(),
    }
}

/// Validate a header from its first bytes.
fn parse_header(path: &Path, head: &[u8], gzip: bool) -> Result<HeaderInfo> {
    if head.len() < NIFTI1_HEADER_BYTES {
        return Err(Error::nifti(
            path,
            format!(
                "not a NIfTI-1 file: only {} bytes, a header needs {NIFTI1_HEADER_BYTES}",
                head.len()
            ),
        ));
    }
    let sizeof_le = i32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let sizeof_be = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    if sizeof_le == 540 || sizeof_be == 540 {
        return Err(Error::nifti(
            path,
            "NIfTI-2 files are not supported yet (convert to NIfTI-1, e.g. with nibabel)",
        ));
    }
    if sizeof_le != 348 && sizeof_be != 348 {
        return Err(Error::nifti(
            path,
            "not a NIfTI-1 file (sizeof_hdr is not 348)",
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
    let mut raw = NiftiHeader::from_reader(head)
        .map_err(|e| Error::nifti(path, format!("invalid header: {e}")))?;
    let big_endian = sizeof_be == 348 && sizeof_le != 348;

    let ndim = raw.dim[0];
    if !(1..=7).contains(&ndim) {
        return Err(Error::nifti(
            path,
            format!("invalid dim[0] = {ndim} (must be 1..7)"),
        ));
    }
    let ndim = ndim as usize;
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
    if ndim > 3 {
        let extra: Vec<u16> = raw.dim[4..=ndim].to_vec();
        if extra.iter().any(|&d| d != 1) {
            return Err(Error::nifti(
                path,
                format!(
                    "{ndim}D volume with extra dimensions {extra:?}: only 3D volumes (or 4D with one frame) are supported"
                ),
            ));
        }
    }
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
    let (affine, affine_source) = header_affine(&raw, spacing);
    if !affine.is_finite() {
        return Err(Error::nifti(
            path,
            format!("the {affine_source} affine holds non-finite numbers"),
        ));
    }
    let unit = match raw.xyzt_units & 0x07 {
        1 => "m",
        2 => "mm",
        3 => "um",
        _ => "unknown",
    };
    Ok(HeaderInfo {
        path: path.to_path_buf(),
        shape_xyz: shape,
        spacing_xyz: spacing,
        affine,
        affine_source,
        qform_code: raw.qform_code,
        sform_code: raw.sform_code,
        datatype,
        bytes_per_voxel,
        vox_offset,
        big_endian,
        gzip,
        unit,
        raw,
    })
}

/// Widen an f32 header field through its shortest decimal form, so 0.99f32 becomes 0.99 and
/// not 0.9900000095367432 (headers store what a person typed, in single precision).
pub fn f32_to_f64_decimal(v: f32) -> f64 {
    format!("{v}").parse().unwrap_or(v as f64)
}

/// The voxel-to-world affine per the NIfTI-1 rules (sform first, then qform, then pixdim),
/// computed here because the nifti crate's qform helper panics on some legal headers.
fn header_affine(h: &NiftiHeader, spacing: [f64; 3]) -> (Affine, &'static str) {
    if h.sform_code > 0 {
        let mut m = [[0.0; 4]; 4];
        for (r, row) in [h.srow_x, h.srow_y, h.srow_z].iter().enumerate() {
            for c in 0..4 {
                m[r][c] = f32_to_f64_decimal(row[c]);
            }
        }
        m[3][3] = 1.0;
        let a = Affine(m);
        // A sform of all zeros is a broken header; fall through to qform.
        if a.column_norms().iter().all(|&n| n > 0.0) {
            return (a, "sform");
        }
    }
    if h.qform_code > 0 {
        let (b, c, d) = (h.quatern_b as f64, h.quatern_c as f64, h.quatern_d as f64);
        let a = (1.0 - (b * b + c * c + d * d)).max(0.0).sqrt();
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
        return (Affine(m), "qform");
    }
    (Affine::diagonal(spacing), "pixdim")
}

/// A file's bytes as stored, with their blake3 hash (the content key's input).
pub struct FileBytes {
    pub bytes: Vec<u8>,
    pub hash: blake3::Hash,
}

pub fn read_file_hashed(path: &Path) -> Result<FileBytes> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let hash = blake3::hash(&bytes);
    Ok(FileBytes { bytes, hash })
}

/// Read a whole volume as f32 (z, y, x), hashing the file bytes on the way.
pub fn read_volume(path: &Path) -> Result<Volume> {
    decode_volume(path, read_file_hashed(path)?)
}

/// The validated header and exactly the voxel bytes of a file (inflated if gzipped).
fn voxel_bytes(path: &Path, bytes: Vec<u8>) -> Result<(HeaderInfo, Vec<u8>)> {
    let gzip = is_gzip(&bytes);
    let mut raw = if gzip {
        // Inflate at most what the header can ask for plus one byte, so a lying header cannot
        // make us allocate more than the stream really holds.
        let head = inflate_prefix(path, &bytes, NIFTI1_HEADER_BYTES)?;
        let header = parse_header(path, &head, true)?;
        let want = header.vox_offset as u64 + header.data_bytes();
        let mut out = Vec::new();
        MultiGzDecoder::new(&bytes[..])
            .take(want)
            .read_to_end(&mut out)
            .map_err(|e| Error::nifti(path, gz_message(e)))?;
        drop(bytes);
        out
    } else {
        bytes
    };
    let header = parse_header(path, &raw, gzip)?;
    let need = header.vox_offset as u64 + header.data_bytes();
    if (raw.len() as u64) < need {
        let have = (raw.len() as u64).saturating_sub(header.vox_offset as u64);
        return Err(Error::nifti(
            path,
            format!(
                "truncated: the header declares {}x{}x{} {} voxels ({} bytes) but the file holds {} bytes of voxel data",
                header.shape_xyz[0], header.shape_xyz[1], header.shape_xyz[2], header.datatype,
                header.data_bytes(), have
            ),
        ));
    }
    raw.truncate(need as usize);
    raw.drain(..header.vox_offset);
    Ok((header, raw))
}

/// Decode a volume from a file's bytes.
pub fn decode_volume(path: &Path, file: FileBytes) -> Result<Volume> {
    let FileBytes {
        bytes,
        hash: file_hash,
    } = file;
    let file_bytes = bytes.len() as u64;
    let (header, raw) = voxel_bytes(path, bytes)?;
    let data = to_f32(path, &header, raw)?;
    Ok(Volume {
        header,
        data,
        file_hash,
        file_bytes,
    })
}

fn to_f32(path: &Path, header: &HeaderInfo, raw: Vec<u8>) -> Result<Vec<f32>> {
    let volume = InMemNiftiVolume::from_raw_data(&header.raw, raw)
        .map_err(|e| Error::nifti(path, format!("cannot decode voxel data: {e}")))?;
    let array = volume
        .into_ndarray::<f32>()
        .map_err(|e| Error::nifti(path, format!("cannot convert voxel data to float32: {e}")))?;
    // nifti gives a Fortran-ordered [x, y, z] array: its memory is exactly C order (z, y, x).
    if !array.t().is_standard_layout() {
        return Err(Error::nifti(
            path,
            "unexpected memory layout from the NIfTI decoder",
        ));
    }
    let (data, offset) = array.into_raw_vec_and_offset();
    if offset.unwrap_or(0) != 0 || data.len() as u64 != header.voxel_count() {
        return Err(Error::nifti(
            path,
            "unexpected voxel count from the NIfTI decoder",
        ));
    }
    Ok(data)
}

/// A label volume as read from disk.
#[derive(Debug)]
pub struct LabelVolume {
    pub header: HeaderInfo,
    pub data: LabelData,
    pub file_hash: blake3::Hash,
    pub file_bytes: u64,
}

/// Read a label: integer files without scaling go straight to u8/u16 (no float copy, a quarter
/// of the memory); anything else goes through f32 and must hold whole numbers.
pub fn read_label(path: &Path) -> Result<LabelVolume> {
    let FileBytes { bytes, hash } = read_file_hashed(path)?;
    let file_bytes = bytes.len() as u64;
    let (header, raw) = voxel_bytes(path, bytes)?;
    let unscaled =
        header.raw.scl_slope == 0.0 || (header.raw.scl_slope == 1.0 && header.raw.scl_inter == 0.0);
    let fast = if unscaled {
        int_labels(path, &raw, header.datatype, header.big_endian)
    } else {
        None
    };
    let data = match fast {
        Some(r) => r?,
        None => label_from_f32(path, to_f32(path, &header, raw)?)?,
    };
    Ok(LabelVolume {
        header,
        data,
        file_hash: hash,
        file_bytes,
    })
}

/// Integer voxel types a label file may hold.
trait RawInt: Copy + Send + Sync {
    const SIZE: usize;
    fn read(b: &[u8], big: bool) -> i64;
}

macro_rules! raw_int {
    ($($t:ty),*) => {$(
        impl RawInt for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn read(b: &[u8], big: bool) -> i64 {
                let a = b.try_into().unwrap_or_default();
                (if big { <$t>::from_be_bytes(a) } else { <$t>::from_le_bytes(a) }) as i64
            }
        }
    )*};
}
raw_int!(u8, i8, i16, u16, i32, u32, i64);

impl RawInt for u64 {
    const SIZE: usize = 8;
    #[inline(always)]
    fn read(b: &[u8], big: bool) -> i64 {
        let a = b.try_into().unwrap_or_default();
        let v = if big {
            u64::from_be_bytes(a)
        } else {
            u64::from_le_bytes(a)
        };
        i64::try_from(v).unwrap_or(i64::MAX)
    }
}

/// Integer labels without scaling: validate and narrow straight from the file's bytes.
fn int_labels(path: &Path, raw: &[u8], datatype: &str, big: bool) -> Option<Result<LabelData>> {
    Some(match datatype {
        "uint8" => narrow_labels::<u8>(path, raw, big),
        "int8" => narrow_labels::<i8>(path, raw, big),
        "int16" => narrow_labels::<i16>(path, raw, big),
        "uint16" => narrow_labels::<u16>(path, raw, big),
        "int32" => narrow_labels::<i32>(path, raw, big),
        "uint32" => narrow_labels::<u32>(path, raw, big),
        "int64" => narrow_labels::<i64>(path, raw, big),
        "uint64" => narrow_labels::<u64>(path, raw, big),
        _ => return None,
    })
}

/// Range-check integer label values and store them in the smallest unsigned type: one pass for
/// validity and the maximum, one to convert, and no intermediate wider than the result.
fn narrow_labels<T: RawInt>(path: &Path, raw: &[u8], big: bool) -> Result<LabelData> {
    const PIECE: usize = 1 << 16;
    let size = T::SIZE;
    let pieces: Vec<std::result::Result<i64, (usize, i64)>> = raw
        .par_chunks(PIECE * size)
        .enumerate()
        .map(|(p, c)| {
            let mut max = 0i64;
            let mut bad = false;
            for b in c.chunks_exact(size) {
                let v = T::read(b, big);
                bad |= !(0..=65535).contains(&v);
                max = max.max(v);
            }
            if !bad {
                return Ok(max);
            }
            let (i, v) = c
                .chunks_exact(size)
                .map(|b| T::read(b, big))
                .enumerate()
                .find(|(_, v)| !(0..=65535).contains(v))
                .unwrap_or((0, -1));
            Err((p * PIECE + i, v))
        })
        .collect();
    let mut max = 0i64;
    for piece in pieces {
        match piece {
            Ok(m) => max = max.max(m),
            Err((i, v)) => {
                return Err(Error::nifti(
                    path,
                    format!(
                    "label voxel {i} has value {v}: labels must be whole numbers from 0 to 65535"
                ),
                ))
            }
        }
    }
    Ok(if max <= 255 {
        LabelData::U8(
            raw.par_chunks_exact(size)
                .map(|b| T::read(b, big) as u8)
                .collect(),
        )
    } else {
        LabelData::U16(
            raw.par_chunks_exact(size)
                .map(|b| T::read(b, big) as u16)
                .collect(),
        )
    })
}

fn inflate_prefix(path: &Path, bytes: &[u8], n: usize) -> Result<Vec<u8>> {
    let mut head = Vec::with_capacity(n);
    MultiGzDecoder::new(bytes)
        .take(n as u64)
        .read_to_end(&mut head)
        .map_err(|e| Error::nifti(path, format!("cannot read header: {}", gz_message(e))))?;
    Ok(head)
}

/// A label volume converted to the smallest unsigned type that holds its values.
#[derive(Clone, Debug)]
pub enum LabelData {
    U8(Vec<u8>),
    U16(Vec<u16>),
}

impl LabelData {
    pub fn len(&self) -> usize {
        match self {
            LabelData::U8(v) => v.len(),
            LabelData::U16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type it is stored as.
    pub fn stored_dtype(&self) -> crate::format::Dtype {
        match self {
            LabelData::U8(_) => crate::format::Dtype::Uint8,
            LabelData::U16(_) => crate::format::Dtype::Uint16,
        }
    }
}

/// Check that label voxels are whole numbers in 0..=65535 and narrow them.
pub fn label_from_f32(path: &Path, data: Vec<f32>) -> Result<LabelData> {
    let valid = |v: f32| v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= 65535.0;
    if let Some(i) = data.par_iter().position_first(|&v| !valid(v)) {
        return Err(Error::nifti(
            path,
            format!(
                "label voxel {i} has value {}: labels must be whole numbers from 0 to 65535",
                data[i]
            ),
        ));
    }
    let max = data.par_iter().cloned().reduce(|| 0.0f32, f32::max);
    Ok(if max <= 255.0 {
        LabelData::U8(data.par_iter().map(|&v| v as u8).collect())
    } else {
        LabelData::U16(data.par_iter().map(|&v| v as u16).collect())
    })
}
