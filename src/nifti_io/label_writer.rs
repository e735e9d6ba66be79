//! Writing a label volume (a segmentation) in the geometry of an input file: the input's own
//! header bytes, NIfTI-1 or NIfTI-2, with only what describes the voxels changed (3 dimensions,
//! the label datatype, no scaling, the voxel offset), so dims, pixdim, qform, sform, their codes
//! and units are the input's exactly. Voxels are gzip-streamed a slab of z rows at a time: no
//! whole volume is ever held.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

use super::file::{gz_message, is_gzip, open_input, read_up_to};
use super::header::read_head;
use super::nifti2::is_nifti2;
use crate::error::{Error, Result};

/// Element type of a written label volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelType {
    /// Values 0..=255 (NIfTI datatype 2).
    Uint8,
    /// Values 0..=65535 (NIfTI datatype 512).
    Uint16,
}

impl LabelType {
    /// The smallest type that holds `max`.
    pub fn for_max(max: u16) -> LabelType {
        if max <= u8::MAX as u16 {
            LabelType::Uint8
        } else {
            LabelType::Uint16
        }
    }

    fn code_and_bits(self) -> (i16, i16) {
        match self {
            LabelType::Uint8 => (2, 8),
            LabelType::Uint16 => (512, 16),
        }
    }
}

/// A label volume being written, slab by slab, in the order NIfTI stores voxels (x fastest,
/// then y, then z).
pub struct LabelWriter {
    out: GzEncoder<BufWriter<File>>,
    path: PathBuf,
    dtype: LabelType,
    big_endian: bool,
    expected: u64,
    written: u64,
}

fn put<const N: usize>(h: &mut [u8], at: usize, le: [u8; N], be: [u8; N], big: bool) {
    h[at..at + N].copy_from_slice(if big { &be } else { &le });
}

impl LabelWriter {
    /// Start `path` (a .nii.gz) with the header of `input` (its first volume's geometry),
    /// for `voxels` label values of type `dtype`.
    pub fn create(path: &Path, input: &Path, voxels: u64, dtype: LabelType) -> Result<LabelWriter> {
        let mut head = {
            let mut f = open_input(input)?;
            let mut magic = [0u8; 2];
            let n = read_up_to(&mut f, &mut magic).map_err(|e| Error::io(input, e))?;
            let gzip = is_gzip(&magic[..n]);
            let f = open_input(input)?;
            let r = if gzip {
                read_head(&mut MultiGzDecoder::new(f))
            } else {
                read_head(&mut std::io::BufReader::new(f))
            };
            r.map_err(|e| Error::nifti(input, format!("cannot read header: {}", gz_message(e))))?
        };
        let nifti2 = is_nifti2(&head);
        let size = if nifti2 { 540 } else { 348 };
        if head.len() < size {
            return Err(Error::nifti(input, "truncated header"));
        }
        head.truncate(size);
        // The header's byte order as the reader decides it, by dim[0] (nibabel's and the nifti
        // crate's rule); sizeof_hdr is rewritten in that order, so a mixed-order input gives a
        // header of one byte order throughout.
        let dim0_le = if nifti2 {
            i64::from_le_bytes(head[16..24].try_into().unwrap_or_default())
        } else {
            i16::from_le_bytes([head[40], head[41]]) as i64
        };
        let big = !(1..=7).contains(&dim0_le);
        put(
            &mut head,
            0,
            (size as i32).to_le_bytes(),
            (size as i32).to_be_bytes(),
            big,
        );
        let (code, bits) = dtype.code_and_bits();
        if nifti2 {
            put(&mut head, 12, code.to_le_bytes(), code.to_be_bytes(), big);
            put(&mut head, 14, bits.to_le_bytes(), bits.to_be_bytes(), big);
            put(&mut head, 16, 3i64.to_le_bytes(), 3i64.to_be_bytes(), big);
            for d in 4..8 {
                put(
                    &mut head,
                    16 + 8 * d,
                    1i64.to_le_bytes(),
                    1i64.to_be_bytes(),
                    big,
                );
            }
            put(
                &mut head,
                168,
                544i64.to_le_bytes(),
                544i64.to_be_bytes(),
                big,
            );
            for at in [176, 184, 192, 200] {
                // scl_slope, scl_inter, cal_max, cal_min
                let v = if at == 176 { 1.0f64 } else { 0.0 };
                put(&mut head, at, v.to_le_bytes(), v.to_be_bytes(), big);
            }
        } else {
            put(&mut head, 40, 3i16.to_le_bytes(), 3i16.to_be_bytes(), big);
            for d in 4..8 {
                put(
                    &mut head,
                    40 + 2 * d,
                    1i16.to_le_bytes(),
                    1i16.to_be_bytes(),
                    big,
                );
            }
            put(&mut head, 70, code.to_le_bytes(), code.to_be_bytes(), big);
            put(&mut head, 72, bits.to_le_bytes(), bits.to_be_bytes(), big);
            put(
                &mut head,
                108,
                352f32.to_le_bytes(),
                352f32.to_be_bytes(),
                big,
            );
            for at in [112, 116, 124, 128] {
                let v = if at == 112 { 1.0f32 } else { 0.0 };
                put(&mut head, at, v.to_le_bytes(), v.to_be_bytes(), big);
            }
        }
        // No extensions.
        head.extend_from_slice(&[0u8; 4]);
        let file = File::create(path).map_err(|e| Error::io(path, e))?;
        let mut out = GzEncoder::new(BufWriter::with_capacity(1 << 20, file), Compression::new(4));
        out.write_all(&head).map_err(|e| Error::io(path, e))?;
        Ok(LabelWriter {
            out,
            path: path.to_path_buf(),
            dtype,
            big_endian: big,
            expected: voxels,
            written: 0,
        })
    }

    /// Append label values (the next voxels in file order).
    pub fn write(&mut self, values: &[u16]) -> Result<()> {
        let mut bytes = Vec::with_capacity(values.len() * 2);
        match self.dtype {
            LabelType::Uint8 => bytes.extend(values.iter().map(|&v| v as u8)),
            LabelType::Uint16 => {
                for v in values {
                    bytes.extend_from_slice(&if self.big_endian {
                        v.to_be_bytes()
                    } else {
                        v.to_le_bytes()
                    });
                }
            }
        }
        self.out
            .write_all(&bytes)
            .map_err(|e| Error::io(&self.path, e))?;
        self.written += values.len() as u64;
        Ok(())
    }

    /// Every voxel written: finish the gzip stream and make the file durable.
    pub fn finish(self) -> Result<()> {
        if self.written != self.expected {
            return Err(Error::nifti(
                &self.path,
                format!(
                    "{} voxels written of the {} the header declares",
                    self.written, self.expected
                ),
            ));
        }
        let buf = self.out.finish().map_err(|e| Error::io(&self.path, e))?;
        let file = buf
            .into_inner()
            .map_err(|e| Error::io(&self.path, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.path, e))
    }
}
