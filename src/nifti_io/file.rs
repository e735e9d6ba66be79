//! Input files: opened only when they are regular files, gzip detection, and readable messages
//! for gzip errors.

use std::io::Read;
use std::path::Path;

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

pub(super) fn read_up_to(r: &mut (impl Read + ?Sized), buf: &mut [u8]) -> std::io::Result<usize> {
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
