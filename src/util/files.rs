//! Reading a small metadata file (a JSON record) defensively: a regular file of bounded size,
//! so a record pointed at /dev/zero, a FIFO or a folder is an error naming it, not an unbounded
//! read or a hang.

use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// [`read_capped`] of a file that must be itself, not a symbolic link (a cache's own
/// metadata: a link would make the cache read a file outside it).
pub fn read_capped_unlinked(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    if std::fs::symlink_metadata(path)?.file_type().is_symlink() {
        return Err(Error::new(
            ErrorKind::InvalidData,
            "a symbolic link, where the cache's own metadata file was expected",
        ));
    }
    read_capped(path, cap)
}

/// The bytes of `path`, a regular file of at most `cap` bytes. `NotFound` passes through (the
/// callers treat a missing record apart); anything else that is not such a file is an
/// `InvalidData` error saying what it is.
pub fn read_capped(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "a folder"
        } else {
            "not a regular file (a device, a pipe or a socket)"
        };
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("{what}, where a metadata file was expected"),
        ));
    }
    let too_big = |n: u64| {
        Error::new(
            ErrorKind::InvalidData,
            format!("{n} bytes, over the {cap} a metadata file of this kind may have"),
        )
    };
    if meta.len() > cap {
        return Err(too_big(meta.len()));
    }
    // The size may change under us (or be reported as 0 by a special file system): read at
    // most one byte more than allowed.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)?
        .take(cap + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_folders_and_large_files_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let e = read_capped(t.path(), 10).unwrap_err();
        assert!(e.to_string().contains("a folder"), "{e}");
        let e = read_capped(Path::new("/dev/zero"), 10).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let f = t.path().join("r.json");
        std::fs::write(&f, b"0123456789abc").unwrap();
        let e = read_capped(&f, 10).unwrap_err();
        assert!(e.to_string().contains("13 bytes"), "{e}");
        assert_eq!(read_capped(&f, 13).unwrap().len(), 13);
        let e = read_capped(&t.path().join("none"), 10).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }
}
