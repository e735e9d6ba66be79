//! The voxels: stored bytes decoded to f32 with scl_slope/scl_inter applied, a run at a time,
//! and (for tests and small tools) a whole volume read into memory.

use std::path::Path;

use super::header::HeaderInfo;
use super::stream::{stream_voxels, Streamed};
use crate::error::{Error, Result};

/// A volume read into memory as f32, in C order with axes (z, y, x) (x fastest, as on disk).
#[derive(Debug)]
pub struct Volume {
    /// The file's validated header.
    pub header: HeaderInfo,
    /// Voxel values with scl_slope/scl_inter applied.
    pub data: Vec<f32>,
    /// blake3 of the file's bytes as stored (compressed or not).
    pub file_hash: blake3::Hash,
    /// Bytes of the file as stored.
    pub file_bytes: u64,
}

/// Read a whole volume as f32 (z, y, x), hashing the file bytes on the way. Its memory is
/// four bytes a voxel: the build and inspect stream instead ([`super::VoxelSource`]).
pub fn read_volume(path: &Path) -> Result<Volume> {
    let mut data: Vec<f32> = Vec::new();
    let Streamed {
        header,
        file_hash,
        file_bytes,
    } = stream_voxels(path, &mut |h, raw| {
        if data.capacity() == 0 {
            let n = usize::try_from(h.voxel_count())
                .map_err(|_| Error::nifti(path, "too many voxels for this machine"))?;
            data.try_reserve_exact(n)
                .map_err(|_| Error::nifti(path, format!("cannot allocate {n} voxels")))?;
        }
        let at = data.len();
        data.resize(at + raw.len() / h.bytes_per_voxel, 0.0);
        decode_f32(h, raw, &mut data[at..]);
        Ok(())
    })?;
    Ok(Volume {
        header,
        data,
        file_hash,
        file_bytes,
    })
}

/// Decodes stored voxel bytes (whole voxels; the flag: big-endian) to f32, one value a voxel.
pub(crate) type Decoder = fn(&[u8], bool, &mut [f32]);

macro_rules! decoder {
    ($t:ty) => {{
        fn decode(raw: &[u8], big: bool, out: &mut [f32]) {
            const N: usize = std::mem::size_of::<$t>();
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(N)) {
                let a: [u8; N] = b.try_into().unwrap_or([0; N]);
                let v = if big {
                    <$t>::from_be_bytes(a)
                } else {
                    <$t>::from_le_bytes(a)
                };
                *o = v as f32;
            }
        }
        decode as Decoder
    }};
}

/// The decoder of a datatype the header parser admits.
pub(crate) fn decoder(datatype: &str) -> Decoder {
    match datatype {
        "uint8" => decoder!(u8),
        "int8" => decoder!(i8),
        "int16" => decoder!(i16),
        "uint16" => decoder!(u16),
        "int32" => decoder!(i32),
        "uint32" => decoder!(u32),
        "int64" => decoder!(i64),
        "uint64" => decoder!(u64),
        "float64" => decoder!(f64),
        _ => decoder!(f32),
    }
}

/// Decode stored voxel bytes (`raw`, whole voxels in the header's datatype and byte order) to
/// f32 in `out` (one value per voxel). Values are converted to f32 first, then scaled in f32
/// when scl_slope is set: the nifti crate's order, so results match it bit for bit.
pub(crate) fn decode_f32(header: &HeaderInfo, raw: &[u8], out: &mut [f32]) {
    decode_with(decoder(header.datatype), header, raw, out)
}

/// [`decode_f32`] with the decoder chosen once (hot loops decode many short runs).
pub(crate) fn decode_with(decode: Decoder, header: &HeaderInfo, raw: &[u8], out: &mut [f32]) {
    decode(raw, header.big_endian, out);
    let (slope, inter) = (header.raw.scl_slope, header.raw.scl_inter);
    if slope != 0.0 {
        for v in out.iter_mut() {
            *v = *v * slope + inter;
        }
    }
}

/// Read `path` once, handing its voxels to `on_block` as f32 in C order, a block at a time
/// (`start` is the block's first voxel): statistics of a volume of any size in bounded memory.
pub fn stream_f32(
    path: &Path,
    on_block: &mut dyn FnMut(usize, &[f32]) -> Result<()>,
) -> Result<Streamed> {
    stream_f32_frame(path, None, on_block)
}

/// [`stream_f32`] of volume `frame` of a 4-D file (`None`: a 3-D file).
pub fn stream_f32_frame(
    path: &Path,
    frame: Option<usize>,
    on_block: &mut dyn FnMut(usize, &[f32]) -> Result<()>,
) -> Result<Streamed> {
    let mut values: Vec<f32> = Vec::new();
    let mut start = 0usize;
    super::stream::stream_frame(path, frame, &mut |h, raw| {
        values.resize(raw.len() / h.bytes_per_voxel, 0.0);
        decode_f32(h, raw, &mut values);
        on_block(start, &values)?;
        start += values.len();
        Ok(())
    })
}
