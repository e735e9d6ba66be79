//! A file's bytes: whole reads with their blake3 hash, gzip detection, and multi-member gzip
//! inflation with readable error messages.

use std::io::Read;
use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::error::{Error, Result};

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

pub(super) fn is_gzip(prefix: &[u8]) -> bool {
    prefix.len() >= 2 && prefix[..2] == GZIP_MAGIC
}

pub(super) fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..])? {
            0 => break,
            k => filled += k,
        }
    }
    Ok(filled)
}

pub(super) fn gz_message(e: std::io::Error) -> String {
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

pub(super) fn inflate_prefix(path: &Path, bytes: &[u8], n: usize) -> Result<Vec<u8>> {
    let mut head = Vec::with_capacity(n);
    MultiGzDecoder::new(bytes)
        .take(n as u64)
        .read_to_end(&mut head)
        .map_err(|e| Error::nifti(path, format!("cannot read header: {}", gz_message(e))))?;
    Ok(head)
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
