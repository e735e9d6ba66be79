//! The zip archive `torch.save` writes: `NAME/data.pkl` (the pickle, read by [`super::pickle`])
//! and one `NAME/data/KEY` entry per storage. A tensor's bytes are read only when asked for,
//! after its shape, strides and offset are checked against its storage's size in the pickle,
//! and that size against the zip entry's declared length. Each entry is then read through
//! `Read::take` to one byte past its declared length (so the zip reader checks its CRC) and
//! must hold exactly that length. Nothing is allocated from a claimed size: buffers grow with
//! the bytes that actually come.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use super::pickle::{Limits, Pickle, TensorRef, TorchDtype};
use crate::error::{Error, Result};

/// Bounds of one archive.
#[derive(Clone, Debug)]
pub struct ArchiveLimits {
    /// The pickle's own bounds.
    pub pickle: Limits,
    /// Largest `data.pkl` (a checkpoint's is a few MB: optimizer state, logs, plans).
    pub max_pickle_bytes: u64,
    /// Tensor bytes read from one archive, all tensors together.
    pub max_tensor_bytes: u64,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        ArchiveLimits {
            pickle: Limits::default(),
            max_pickle_bytes: 256 << 20,
            max_tensor_bytes: 64 << 30,
        }
    }
}

/// A tensor's elements, contiguous (outermost dimension first), little-endian.
#[derive(Clone, Debug, PartialEq)]
pub struct RawTensor {
    /// Element type.
    pub dtype: TorchDtype,
    /// Sizes, outermost first.
    pub shape: Vec<usize>,
    /// `shape`'s product times the element size, in bytes.
    pub bytes: Vec<u8>,
}

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::Model {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// What a file type is, for a path that is not a regular file.
fn kind(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Open `path` for reading if it is a regular file (links followed), naming what it is
/// otherwise. A FIFO is never opened (its metadata is read first), and the file is opened
/// without blocking and checked again, so a path swapped in between is caught too.
pub fn open_regular(path: &Path) -> Result<File> {
    let refuse = |t: std::fs::FileType| {
        let link = std::fs::read_link(path)
            .map(|to| format!(" (a link to {})", to.display()))
            .unwrap_or_default();
        Err(bad(path, format!("not a regular file: {}{link}", kind(t))))
    };
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return refuse(meta.file_type());
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return refuse(meta.file_type());
    }
    Ok(file)
}

/// An open torch.save archive and its parsed pickle.
pub struct TorchArchive<R> {
    path: PathBuf,
    zip: zip::ZipArchive<R>,
    /// The archive's folder (`NAME/`, or empty for entries at the root).
    prefix: String,
    pickle: Pickle,
    limits: ArchiveLimits,
    tensor_bytes: u64,
}

impl TorchArchive<BufReader<File>> {
    /// Open the checkpoint at `path` (a regular file: see [`open_regular`]).
    pub fn open(path: &Path, limits: ArchiveLimits) -> Result<Self> {
        let file = open_regular(path)?;
        TorchArchive::new(path, BufReader::new(file), limits)
    }
}

impl<R: Read + Seek> TorchArchive<R> {
    /// Read the archive in `reader` (named `path` in messages) and parse its pickle.
    pub fn new(path: &Path, reader: R, limits: ArchiveLimits) -> Result<Self> {
        let mut zip = zip::ZipArchive::new(reader).map_err(|e| {
            bad(
                path,
                format!("not a PyTorch checkpoint (a zip archive written by torch.save): {e}"),
            )
        })?;
        let mut pickles = Vec::new();
        for i in 0..zip.len() {
            let Some(Ok(name)) = zip.name_for_index(i) else {
                continue;
            };
            if name == "data.pkl" {
                pickles.push(String::new());
            } else if let Some(p) = name.strip_suffix("/data.pkl") {
                if !p.contains('/') {
                    pickles.push(format!("{p}/"));
                }
            }
        }
        let prefix = match &pickles[..] {
            [p] => p.clone(),
            [] => {
                return Err(bad(
                    path,
                    "no data.pkl inside: not a checkpoint written by torch.save",
                ))
            }
            _ => return Err(bad(path, "several data.pkl inside: not one checkpoint")),
        };
        check_byteorder(&mut zip, path, &prefix)?;
        let name = format!("{prefix}data.pkl");
        let bytes = read_entry(&mut zip, path, &name, limits.max_pickle_bytes)?;
        let pickle = Pickle::parse(&bytes, &limits.pickle)
            .map_err(|e| bad(path, format!("its pickle ({name}) does not read: {e}")))?;
        Ok(TorchArchive {
            path: path.to_path_buf(),
            zip,
            prefix,
            pickle,
            limits,
            tensor_bytes: 0,
        })
    }

    /// The parsed `data.pkl`.
    pub fn pickle(&self) -> &Pickle {
        &self.pickle
    }

    /// The archive's path (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bytes of tensor `t` (named `name` in messages), contiguous.
    pub fn read_tensor(&mut self, name: &str, t: &TensorRef) -> Result<RawTensor> {
        let path = self.path.clone();
        let fail = |m: String| bad(&path, format!("parameter {name}: {m}"));
        let s = &t.storage;
        let esize = s.dtype.size() as u64;
        let elems = t
            .shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| fail(format!("shape {:?} has more than 2^64 elements", t.shape)))?;
        // The storage elements the view spans: offset .. offset + 1 + sum((size-1) * stride).
        let span = if elems == 0 {
            0
        } else {
            t.shape
                .iter()
                .zip(&t.strides)
                .try_fold(1u64, |a, (&d, &st)| a.checked_add((d - 1).checked_mul(st)?))
                .ok_or_else(|| fail(format!("strides {:?} overflow", t.strides)))?
        };
        let end = t.offset.checked_add(span).filter(|&e| e <= s.numel).ok_or_else(|| {
            fail(format!(
                "shape {:?} (strides {:?}, offset {}) reaches beyond storage {}, which holds {} elements",
                t.shape, t.strides, t.offset, s.key, s.numel
            ))
        })?;
        if elems > span {
            return Err(fail(format!(
                "shape {:?} with strides {:?} repeats elements: not a layer's weights",
                t.shape, t.strides
            )));
        }
        let storage_bytes = s.numel.checked_mul(esize).ok_or_else(|| {
            fail(format!(
                "storage {} of {} elements overflows",
                s.key, s.numel
            ))
        })?;
        let entry_name = format!("{}data/{}", self.prefix, s.key);
        let entry = self
            .zip
            .by_name(&entry_name)
            .map_err(|e| fail(format!("its storage {entry_name}: {e}")))?;
        if entry.size() != storage_bytes {
            return Err(fail(format!(
                "its storage {entry_name} is {} bytes in the archive, but the pickle says {} elements of {} ({storage_bytes} bytes)",
                entry.size(),
                s.numel,
                s.dtype.storage_name()
            )));
        }
        if self.tensor_bytes.saturating_add(storage_bytes) > self.limits.max_tensor_bytes {
            return Err(fail(format!(
                "more than {} bytes of tensors in one checkpoint (limit)",
                self.limits.max_tensor_bytes
            )));
        }
        // The whole entry, to its end, so the zip reader checks its CRC.
        let mut bytes = Vec::new();
        entry
            .take(storage_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| fail(format!("{entry_name} does not read: {e}")))?;
        if bytes.len() as u64 != storage_bytes {
            return Err(fail(format!(
                "{entry_name} holds {} bytes, its zip entry declares {storage_bytes}",
                bytes.len()
            )));
        }
        self.tensor_bytes += storage_bytes;
        // In bounds: offset + span = end <= numel, and bytes holds numel elements.
        let bytes = bytes
            .get((t.offset * esize) as usize..(end * esize) as usize)
            .unwrap_or(&[])
            .to_vec();
        let shape: Vec<usize> = t
            .shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| fail("a size beyond this machine's address space".into()))?;
        let bytes = if contiguous(&t.shape, &t.strides) {
            bytes
        } else {
            gather(&bytes, &shape, &t.strides, esize as usize)
        };
        Ok(RawTensor {
            dtype: s.dtype,
            shape,
            bytes,
        })
    }
}

/// Entry `name` whole, if its declared size is at most `max` bytes.
fn read_entry<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    path: &Path,
    name: &str,
    max: u64,
) -> Result<Vec<u8>> {
    let entry = zip
        .by_name(name)
        .map_err(|e| bad(path, format!("{name}: {e}")))?;
    let declared = entry.size();
    if declared > max {
        return Err(bad(
            path,
            format!("{name} is {declared} bytes: more than {max} (limit)"),
        ));
    }
    // To the entry's end (one byte past the declared size), so the zip reader checks its CRC.
    let mut bytes = Vec::new();
    entry
        .take(declared + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(path, format!("{name} does not read: {e}")))?;
    if bytes.len() as u64 != declared {
        return Err(bad(
            path,
            format!(
                "{name} holds {} bytes, its zip entry declares {declared}",
                bytes.len()
            ),
        ));
    }
    Ok(bytes)
}

/// Storages are read as little-endian: refuse an archive written on a big-endian machine.
fn check_byteorder<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    path: &Path,
    prefix: &str,
) -> Result<()> {
    let name = format!("{prefix}byteorder");
    if zip.index_for_name(&name).is_none() {
        return Ok(()); // archives before torch 1.12 have none, all little-endian
    }
    let order = read_entry(zip, path, &name, 16)?;
    if order != b"little" {
        return Err(bad(
            path,
            format!(
                "{name} says {:?}: only little-endian checkpoints are read",
                String::from_utf8_lossy(&order)
            ),
        ));
    }
    Ok(())
}

/// Whether `strides` are the row-major strides of `shape` (sizes of 1 take any stride).
fn contiguous(shape: &[u64], strides: &[u64]) -> bool {
    let mut want = 1u64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != want {
            return false;
        }
        want = want.saturating_mul(d);
    }
    true
}

/// The elements of a strided view of `span` (which starts at the view's offset), row-major.
/// The caller checked that every index lies inside `span`.
fn gather(span: &[u8], shape: &[usize], strides: &[u64], esize: usize) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n * esize);
    let mut index = vec![0usize; shape.len()];
    for _ in 0..n {
        let at: u64 = index.iter().zip(strides).map(|(&i, &s)| i as u64 * s).sum();
        let at = at as usize * esize;
        out.extend_from_slice(span.get(at..at + esize).unwrap_or(&[]));
        for a in (0..shape.len()).rev() {
            index[a] += 1;
            if index[a] < shape[a] {
                break;
            }
            index[a] = 0;
        }
    }
    out
}
