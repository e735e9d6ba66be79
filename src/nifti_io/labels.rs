//! Labels: a label volume narrowed to u8/u16, straight from the bytes for unscaled integer
//! files, through f32 (whole numbers only) otherwise.

use std::path::Path;

use rayon::prelude::*;

use super::file::{read_file_hashed, FileBytes};
use super::voxels::{to_f32, voxel_bytes};
use super::HeaderInfo;
use crate::error::{Error, Result};

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
