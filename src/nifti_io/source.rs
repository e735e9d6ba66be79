//! An input volume's voxels kept for random access while its case is resampled. A small volume
//! is held in memory as stored (one to eight bytes a voxel, not four as f32); a large one is
//! written once, inflated, to a scratch file that is read through a memory map whose pages are
//! handed back as reading goes on. Either way memory does not grow with the input's size.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{Mmap, UncheckedAdvice};

use super::header::HeaderInfo;
use super::stream::{stream_frame, Streamed};
use super::voxels::{decode_f32, decode_with, decoder, Decoder};
use crate::error::{Error, Result};

/// Mapped bytes read between two hand-backs of a scratch file's pages: what the map may add to
/// the process's resident memory.
const RELEASE_EVERY: u64 = 64 << 20;

/// Where a large input's voxels go, and what counts as large.
#[derive(Clone, Debug)]
pub struct SourceOptions {
    /// Inputs with more voxel bytes than this (as stored, inflated) go to a scratch file.
    pub ram_limit_bytes: u64,
    /// Folder for scratch files (the cache's `tmp/` in a build). A scratch file is unlinked as
    /// soon as it is created, so nothing is left behind even by a killed process.
    pub scratch_dir: PathBuf,
}

/// An input's voxels, in the stored datatype, readable as f32 a run at a time.
pub struct VoxelSource {
    header: HeaderInfo,
    decode: Decoder,
    held: Held,
}

enum Held {
    Memory(Vec<u8>),
    Mapped {
        map: Mmap,
        /// Bytes read since the map's pages were last handed back.
        touched: AtomicU64,
    },
}

impl std::fmt::Debug for VoxelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VoxelSource")
            .field("path", &self.header.path)
            .field("on_disk", &self.on_disk())
            .finish()
    }
}

/// Where the voxel bytes go while the file streams.
enum Filling {
    Nothing,
    Memory(Vec<u8>),
    Scratch { file: File, path: PathBuf },
}

impl VoxelSource {
    /// Read `path` once (hashing it, checking gzip to the end), keeping its voxel bytes in
    /// memory or in a scratch file as `opts` says; `on_block` sees every voxel as f32, in order,
    /// in blocks of whole statistics pieces (for statistics computed on the way).
    pub fn open(
        path: &Path,
        opts: &SourceOptions,
        on_block: &mut dyn FnMut(&[f32]) -> Result<()>,
    ) -> Result<(VoxelSource, Streamed)> {
        Self::open_frame(path, None, opts, on_block)
    }

    /// [`VoxelSource::open`] of volume `frame` of a 4-D file (a Decathlon channel); `None`:
    /// a 3-D file.
    pub fn open_frame(
        path: &Path,
        frame: Option<usize>,
        opts: &SourceOptions,
        on_block: &mut dyn FnMut(&[f32]) -> Result<()>,
    ) -> Result<(VoxelSource, Streamed)> {
        let mut filling = Filling::Nothing;
        let mut values: Vec<f32> = Vec::new();
        let streamed = stream_frame(path, frame, &mut |h, raw| {
            if matches!(filling, Filling::Nothing) {
                filling = start_filling(path, h, opts)?;
            }
            match &mut filling {
                Filling::Memory(v) => v.extend_from_slice(raw),
                Filling::Scratch { file, path: sp } => file.write_all(raw).map_err(|e| {
                    Error::nifti(
                        path,
                        format!("spilling its voxels to {}: {e}", sp.display()),
                    )
                })?,
                Filling::Nothing => {}
            }
            values.resize(raw.len() / h.bytes_per_voxel, 0.0);
            decode_f32(h, raw, &mut values);
            on_block(&values)
        })?;
        let held = match filling {
            Filling::Memory(v) => Held::Memory(v),
            Filling::Scratch { file, path: sp } => {
                // SAFETY: the scratch file is ours alone (created new, unlinked on unix) and
                // nothing writes to it once mapped, so the mapped bytes cannot change under us.
                let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&sp, e))?;
                Held::Mapped {
                    map,
                    touched: AtomicU64::new(0),
                }
            }
            Filling::Nothing => Held::Memory(Vec::new()),
        };
        let source = VoxelSource {
            header: streamed.header.clone(),
            decode: decoder(streamed.header.datatype),
            held,
        };
        if source.bytes().len() as u64 != source.header.data_bytes() {
            return Err(Error::nifti(path, "the voxel data changed size while read"));
        }
        Ok((source, streamed))
    }

    /// The file's validated header.
    pub fn header(&self) -> &HeaderInfo {
        &self.header
    }

    /// Whether the voxels live in a scratch file rather than in memory.
    pub fn on_disk(&self) -> bool {
        matches!(self.held, Held::Mapped { .. })
    }

    /// Voxels in C order (z, y, x).
    pub fn len(&self) -> usize {
        self.bytes().len() / self.header.bytes_per_voxel
    }

    /// Whether the volume has no voxels (never, for a valid header).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bytes(&self) -> &[u8] {
        match &self.held {
            Held::Memory(v) => v,
            Held::Mapped { map, .. } => map,
        }
    }

    /// Voxels `start..start + out.len()` (C order) as f32, scaled as the header says.
    pub fn read_f32(&self, start: usize, out: &mut [f32]) -> Result<()> {
        let bpv = self.header.bytes_per_voxel;
        let end = start.checked_add(out.len()).filter(|&e| e <= self.len());
        let Some(end) = end else {
            return Err(Error::nifti(
                &self.header.path,
                format!(
                    "voxels {start}..{} asked of a volume of {}",
                    start.saturating_add(out.len()),
                    self.len()
                ),
            ));
        };
        decode_with(
            self.decode,
            &self.header,
            &self.bytes()[start * bpv..end * bpv],
            out,
        );
        if let Held::Mapped { map, touched } = &self.held {
            // A short read still maps a whole page: count at least one.
            let n = ((out.len() * bpv) as u64).max(4096);
            if touched.fetch_add(n, Ordering::Relaxed) + n > RELEASE_EVERY {
                touched.store(0, Ordering::Relaxed);
                // SAFETY: a shared, read-only file mapping: pages handed back are read again
                // from the file (unchanged) on the next access, by any thread.
                let _ = unsafe { map.unchecked_advise(UncheckedAdvice::DontNeed) };
            }
        }
        Ok(())
    }
}

impl crate::geometry::VoxelRead for VoxelSource {
    fn read(&self, start: usize, out: &mut [f32]) -> Result<()> {
        self.read_f32(start, out)
    }
}

/// Decide, from the validated header, where this file's voxel bytes go.
fn start_filling(path: &Path, h: &HeaderInfo, opts: &SourceOptions) -> Result<Filling> {
    let bytes = h.data_bytes();
    if bytes <= opts.ram_limit_bytes {
        let mut v = Vec::new();
        v.try_reserve_exact(bytes as usize).map_err(|_| {
            Error::nifti(path, format!("cannot allocate {bytes} bytes of voxel data"))
        })?;
        return Ok(Filling::Memory(v));
    }
    // The spill is checked against the disk before a byte is written, so an input that
    // inflates past the free space (a gzip bomb) fails alone, named, and leaves the disk to the
    // other cases.
    let dir = &opts.scratch_dir;
    let no_room = |why: String| {
        Error::nifti(
            path,
            format!(
                "its voxels need {} of scratch space in {} to be read, {why}",
                crate::util::sysinfo::human_bytes(bytes),
                dir.display()
            ),
        )
    };
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    if let Some(free) = crate::util::sysinfo::free_bytes(dir).filter(|&f| f < bytes) {
        return Err(no_room(format!(
            "and the disk has {} free",
            crate::util::sysinfo::human_bytes(free)
        )));
    }
    let (file, sp) = scratch_file(dir)?;
    reserve(&file, bytes).map_err(|e| no_room(format!("which the disk refused: {e}")))?;
    Ok(Filling::Scratch { file, path: sp })
}

/// A new scratch file in `dir`, unlinked at once where the OS allows (it lives until closed).
pub(crate) fn scratch_file(dir: &Path) -> Result<(File, PathBuf)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("voxels.{}.{n}.scratch", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    #[cfg(unix)]
    let _ = std::fs::remove_file(&path);
    Ok((file, path))
}

/// Reserve `bytes` of disk for a scratch file, so a full disk fails the case before inflating
/// rather than midway; a filesystem that cannot reserve is simply written to.
#[cfg(target_os = "linux")]
pub(crate) fn reserve(file: &File, bytes: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(bytes).unwrap_or(libc::off_t::MAX);
    // SAFETY: a valid open file descriptor and a non-negative length.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        code => Err(std::io::Error::from_raw_os_error(code)),
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn reserve(_file: &File, _bytes: u64) -> std::io::Result<()> {
    Ok(())
}
