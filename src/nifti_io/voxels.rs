//! The voxels: exactly the voxel bytes a header declares (inflated if gzipped, checked against
//! what the file holds), decoded to f32 with scl_slope/scl_inter applied.

use std::io::Read;
use std::path::Path;

use flate2::read::MultiGzDecoder;
use nifti::{InMemNiftiVolume, IntoNdArray};

use super::file::{gz_message, inflate_prefix, is_gzip, read_file_hashed, FileBytes};
use super::header::{parse_header, HeaderInfo, NIFTI1_HEADER_BYTES};
use crate::error::{Error, Result};

/// A volume read into memory as f32, in C order with axes (z, y, x) (x fastest, as on disk).
#[derive(Debug)]
pub struct Volume {
    pub header: HeaderInfo,
    pub data: Vec<f32>,
    /// blake3 of the file's bytes as stored (compressed or not).
    pub file_hash: blake3::Hash,
    pub file_bytes: u64,
}

/// Read a whole volume as f32 (z, y, x), hashing the file bytes on the way.
pub fn read_volume(path: &Path) -> Result<Volume> {
    decode_volume(path, read_file_hashed(path)?)
}

/// The validated header and exactly the voxel bytes of a file (inflated if gzipped).
pub(super) fn voxel_bytes(path: &Path, bytes: Vec<u8>) -> Result<(HeaderInfo, Vec<u8>)> {
    let gzip = is_gzip(&bytes);
    let mut raw = if gzip {
        // Inflate at most what the header can ask for plus one byte, so a lying header cannot
        // make us allocate more than the stream really holds.
        let head = inflate_prefix(path, &bytes, NIFTI1_HEADER_BYTES)?;
        let header = parse_header(path, &head, true)?;
        let want = header.vox_offset as u64 + header.data_bytes();
        let mut out = Vec::new();
        let mut stream = MultiGzDecoder::new(&bytes[..]);
        (&mut stream)
            .take(want)
            .read_to_end(&mut out)
            .map_err(|e| Error::nifti(path, gz_message(e)))?;
        // gzip checks a member's CRC and length only at its end: inflate what follows the
        // voxels too, or a corrupt stream would go unnoticed.
        std::io::copy(&mut stream, &mut std::io::sink())
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

pub(super) fn to_f32(path: &Path, header: &HeaderInfo, raw: Vec<u8>) -> Result<Vec<f32>> {
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
