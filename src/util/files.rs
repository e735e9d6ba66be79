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

/// Create `path` with `bytes` and fsync it (a file inside a folder that is itself renamed into
/// place when complete, so the file needs no rename of its own).
pub fn write_synced(path: &Path, bytes: &[u8]) -> crate::error::Result<()> {
    use std::io::Write;
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(bytes).and_then(|_| f.sync_all()))
        .map_err(|e| crate::error::Error::io(path, e))
}

/// fsync a file written by another writer (a library that takes a path).
pub fn sync_file(path: &Path) -> crate::error::Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| crate::error::Error::io(path, e))
}

/// fsync a folder so a rename or a new entry in it survives a power cut. Only possible (and
/// only needed) on Unix.
pub fn sync_dir(path: &Path) -> crate::error::Result<()> {
    #[cfg(unix)]
    {
        sync_file(path)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

/// Write a file atomically: a temporary sibling unique to this process and call, fsync,
/// rename, fsync of the folder (so the rename itself survives a power cut). A failed write
/// removes its temporary file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> crate::error::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp.{}.{n}", std::process::id()));
    replace_via(&tmp, path, bytes)
}

/// [`write_atomic`] through the temporary file `tmp` the caller names (one its sweeps know).
pub fn replace_via(tmp: &Path, path: &Path, bytes: &[u8]) -> crate::error::Result<()> {
    if let Err(e) = write_synced(tmp, bytes) {
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    std::fs::rename(tmp, path).map_err(|e| crate::error::Error::io(path, e))?;
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => sync_dir(p),
        _ => Ok(()),
    }
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
