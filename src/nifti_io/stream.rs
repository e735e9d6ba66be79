//! One sequential pass over a file: its stored bytes are hashed as they are read, a gzip stream
//! is inflated to the end of its last member (so every CRC and length is checked), and the voxel
//! bytes go to a sink a block at a time. Nothing here holds more than a block: a volume of any
//! size streams in the same memory.

use std::io::{BufReader, Cursor, Read};
use std::path::Path;

use flate2::bufread::MultiGzDecoder;

use super::file::{gz_message, is_gzip, open_input, read_up_to};
use super::header::{check_frame, parse_header_with, read_head, HeaderInfo};
use crate::error::{Error, Result};

/// Voxels per block handed to a sink: a whole number of the statistics' pieces (2^16 voxels),
/// so block-wise statistics equal whole-volume ones bit for bit.
pub const BLOCK_VOXELS: usize = 1 << 20;

/// What one pass learned about the file besides its voxels.
#[derive(Debug)]
pub struct Streamed {
    /// The validated header.
    pub header: HeaderInfo,
    /// blake3 of the file's bytes as stored (compressed or not): the content key's input.
    pub file_hash: blake3::Hash,
    /// The file's size as stored.
    pub file_bytes: u64,
}

/// A reader that hashes and counts every byte read through it.
struct Hashing<R> {
    inner: R,
    hasher: blake3::Hasher,
    count: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// Read `path` once from start to end. The header is validated before anything is allocated
/// from it; `sink` then receives the voxel bytes in order, in blocks of at most
/// [`BLOCK_VOXELS`] voxels (each a whole number of voxels).
pub fn stream_voxels(
    path: &Path,
    sink: &mut dyn FnMut(&HeaderInfo, &[u8]) -> Result<()>,
) -> Result<Streamed> {
    stream_frame(path, None, sink)
}

/// [`stream_voxels`] of volume `frame` of a file holding several along its 4th dimension (the
/// Decathlon's channels): the other volumes are read past (and hashed, and checked to be
/// there), only that one reaches `sink`. `None`: a 3-D file, as [`stream_voxels`].
pub fn stream_frame(
    path: &Path,
    frame: Option<usize>,
    sink: &mut dyn FnMut(&HeaderInfo, &[u8]) -> Result<()>,
) -> Result<Streamed> {
    let mut raw = Hashing {
        inner: open_input(path)?,
        hasher: blake3::Hasher::new(),
        count: 0,
    };
    // Sniff the first bytes for gzip, then read on through them as if nothing had been taken.
    let mut prefix = [0u8; 2];
    let n = read_up_to(&mut raw, &mut prefix).map_err(|e| Error::io(path, e))?;
    let gzip = is_gzip(&prefix[..n]);
    let stored = BufReader::with_capacity(1 << 18, Cursor::new(prefix[..n].to_vec()).chain(raw));
    let raw = if gzip {
        let mut inflated = MultiGzDecoder::new(stored);
        let header = voxels_from(path, &mut inflated, true, frame, sink)?;
        // gzip checks a member's CRC and length only at its end: inflate what follows the
        // voxels too, or a corrupt stream would go unnoticed.
        std::io::copy(&mut inflated, &mut std::io::sink())
            .map_err(|e| Error::nifti(path, gz_message(e)))?;
        (header, inflated.into_inner())
    } else {
        let mut stored = stored;
        let header = voxels_from(path, &mut stored, false, frame, sink)?;
        (header, stored)
    };
    let (header, rest) = raw;
    // Whatever follows (bytes after the voxels of a .nii) is part of the file's hash.
    let (_, mut raw) = rest.into_inner().into_inner();
    std::io::copy(&mut raw, &mut std::io::sink()).map_err(|e| Error::io(path, e))?;
    Ok(Streamed {
        header,
        file_hash: raw.hasher.finalize(),
        file_bytes: raw.count,
    })
}

/// Parse the header from `r`, skip to the voxels and hand them to `sink` block by block.
fn voxels_from(
    path: &Path,
    r: &mut dyn Read,
    gzip: bool,
    frame: Option<usize>,
    sink: &mut dyn FnMut(&HeaderInfo, &[u8]) -> Result<()>,
) -> Result<HeaderInfo> {
    let read_err = |e: std::io::Error| {
        if gzip {
            Error::nifti(path, gz_message(e))
        } else {
            Error::io(path, e)
        }
    };
    let head = read_head(r)
        .map_err(|e| Error::nifti(path, format!("cannot read header: {}", gz_message(e))))?;
    let header = parse_header_with(path, &head, gzip, frame.is_some())?;
    let k = frame.unwrap_or(0);
    check_frame(&header, k)?;
    // Extensions between the header and the voxels are skipped, and so are the volumes
    // before the one asked for.
    let gap = header.vox_offset.saturating_sub(head.len()) as u64;
    let skip = gap.saturating_add(header.data_bytes().saturating_mul(k as u64));
    let skipped = std::io::copy(&mut r.take(skip), &mut std::io::sink()).map_err(read_err)?;
    let truncated = |have: u64| {
        Error::nifti(
            path,
            format!(
                "truncated: the header declares {}x{}x{} {} voxels ({} bytes) but the file holds {} bytes of voxel data",
                header.shape_xyz[0], header.shape_xyz[1], header.shape_xyz[2], header.datatype,
                header.file_data_bytes(), have
            ),
        )
    };
    if skipped < skip {
        return Err(truncated(skipped.saturating_sub(gap)));
    }
    let total = header.data_bytes();
    let block = (BLOCK_VOXELS * header.bytes_per_voxel) as u64;
    let mut buf = vec![0u8; block.min(total) as usize];
    let mut done = 0u64;
    while done < total {
        let want = (total - done).min(block) as usize;
        let got = read_up_to(r, &mut buf[..want]).map_err(read_err)?;
        if got < want {
            return Err(truncated(done + got as u64));
        }
        sink(&header, &buf[..want])?;
        done += want as u64;
    }
    // The volumes after it must be there too (a file cut short is damaged, whichever volume
    // was asked for).
    let after = header
        .data_bytes()
        .saturating_mul((header.frames - k - 1) as u64);
    let read = std::io::copy(&mut r.take(after), &mut std::io::sink()).map_err(read_err)?;
    if read < after {
        let before = header.data_bytes().saturating_mul(k as u64 + 1);
        return Err(truncated(before + read));
    }
    Ok(header)
}
