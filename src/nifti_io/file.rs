//! A file's bytes: whole reads with their blake3 hash, gzip detection, and multi-member gzip
//! inflation with readable error messages.

use std::io::Read;
use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::error::{Error, Result};

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Open an input file for reading, refusing anything but a regular file by its type first:
/// opening a named pipe blocks until a writer appears, and a device may never end.
pub fn open_input(path: &Path) -> Result<std::fs::File> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        let what = file_kind(&meta.file_type());
        return Err(Error::nifti(
            path,
            format!("not a regular file ({what}): refused before reading"),
        ));
    }
    std::fs::File::open(path).map_err(|e| Error::io(path, e))
}

/// What a non-regular file is, in words.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a named pipe";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "a device";
        }
    }
    if t.is_dir() {
        "a folder"
    } else {
        "not a plain file"
    }
}

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

/// Read a whole input file (a regular file only) and hash it.
pub fn read_file_hashed(path: &Path) -> Result<FileBytes> {
    let mut bytes = Vec::new();
    open_input(path)?
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    let hash = blake3::hash(&bytes);
    Ok(FileBytes { bytes, hash })
}
