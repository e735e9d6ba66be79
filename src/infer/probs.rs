//! Class probabilities of one predicted volume, on disk: one scratch file per class of float16
//! values in C order (z, y, x), appended a slab of rows at a time as the sliding window makes
//! them final, then read back through a memory map for export. The files are unlinked as soon
//! as created (nothing is left by a kill) and the map's pages are handed back as they are read,
//! so memory stays flat whatever the volume size.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{Mmap, UncheckedAdvice};

use crate::error::{Error, Result};
use crate::resample::VoxelRead;

/// Mapped bytes read between two hand-backs of a map's pages.
const RELEASE_EVERY: u64 = 64 << 20;

/// Probabilities being written, class by class.
pub struct ProbWriter {
    shape: [usize; 3],
    files: Vec<(BufWriter<File>, PathBuf)>,
    written: usize,
}

impl ProbWriter {
    /// Scratch files for `classes` classes of a volume of `shape` (z, y, x), in `dir`.
    pub fn new(classes: usize, shape: [usize; 3], dir: &Path) -> Result<ProbWriter> {
        let mut files = Vec::with_capacity(classes);
        for _ in 0..classes {
            let (file, path) = crate::nifti_io::scratch_file(dir)?;
            files.push((BufWriter::with_capacity(1 << 20, file), path));
        }
        Ok(ProbWriter {
            shape,
            files,
            written: 0,
        })
    }

    /// Append voxels in C order, `classes` values a voxel (the sliding window's rows).
    pub fn append(&mut self, probs: &[f32]) -> Result<()> {
        let classes = self.files.len();
        let mut buf = Vec::with_capacity(2 * probs.len() / classes.max(1));
        for (c, (w, path)) in self.files.iter_mut().enumerate() {
            buf.clear();
            for v in probs.iter().skip(c).step_by(classes) {
                buf.extend_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
            w.write_all(&buf)
                .map_err(|e| Error::io(path.as_path(), e))?;
        }
        self.written += probs.len() / classes.max(1);
        Ok(())
    }

    /// Every voxel written: the volumes, mapped for reading.
    pub fn finish(self) -> Result<Vec<ProbVolume>> {
        let n: usize = self.shape.iter().product();
        if self.written != n {
            return Err(Error::Config(format!(
                "probabilities of {} voxels written for a volume of {n}",
                self.written
            )));
        }
        let mut out = Vec::with_capacity(self.files.len());
        for (w, path) in self.files {
            let file = w
                .into_inner()
                .map_err(|e| Error::io(path.as_path(), e.into_error()))?;
            // SAFETY: the scratch file is ours alone (created new, unlinked) and nothing writes
            // to it once mapped.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path.as_path(), e))?;
            if map.len() != 2 * n {
                return Err(Error::io(
                    path.as_path(),
                    std::io::Error::other("scratch file of the wrong size"),
                ));
            }
            out.push(ProbVolume {
                map,
                touched: AtomicU64::new(0),
            });
        }
        Ok(out)
    }
}

/// One class's probabilities, read as f32 a run at a time.
pub struct ProbVolume {
    map: Mmap,
    touched: AtomicU64,
}

impl VoxelRead for ProbVolume {
    fn read(&self, start: usize, out: &mut [f32]) -> Result<()> {
        let bytes = self
            .map
            .get(2 * start..2 * (start + out.len()))
            .ok_or_else(|| Error::Config(format!("probabilities {start}.. out of range")))?;
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        }
        let n = (bytes.len() as u64).max(4096);
        if self.touched.fetch_add(n, Ordering::Relaxed) + n > RELEASE_EVERY {
            self.touched.store(0, Ordering::Relaxed);
            // SAFETY: a read-only map of a file nothing writes: dropped pages are read again.
            let _ = unsafe { self.map.unchecked_advise(UncheckedAdvice::DontNeed) };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_come_back_per_class() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ProbWriter::new(2, [1, 2, 2], dir.path()).unwrap();
        w.append(&[0.25, 0.75, 1.0, 0.0]).unwrap();
        w.append(&[0.5, 0.5, 0.125, 0.875]).unwrap();
        let v = w.finish().unwrap();
        let mut out = [0f32; 4];
        v[1].read(0, &mut out).unwrap();
        assert_eq!(out, [0.75, 0.0, 0.5, 0.875]);
        v[0].read(1, &mut out[..2]).unwrap();
        assert_eq!(&out[..2], &[1.0, 0.5]);
        assert!(v[0].read(3, &mut out[..2]).is_err());
    }
}
