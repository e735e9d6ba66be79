//! Class probabilities of one predicted volume, on disk: one scratch file per class of float16
//! values in C order (z, y, x), written a block of rows at a time (at their place in the file)
//! as the sliding window makes them final, then read back through a memory map for export. The files are unlinked as soon
//! as created (nothing is left by a kill) and the map's pages are handed back as they are read,
//! so memory stays flat whatever the volume size.
//!
//! An ensemble of models writes its members one after the other into the same files, each
//! adding its share (1/members) to what is there: one accumulator on disk whatever the number
//! of models. Its files hold float32 while they add up, so the mean is not rounded per member.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{Mmap, UncheckedAdvice};

use super::sliding::Tile;
use crate::error::{Error, Result};
use crate::geometry::VoxelRead;

/// Mapped bytes read between two hand-backs of a map's pages.
const RELEASE_EVERY: u64 = 64 << 20;

/// Probabilities being written, class by class.
pub struct ProbWriter {
    shape: [usize; 3],
    files: Vec<(File, PathBuf)>,
    written: usize,
    /// Models averaged (1: a single model).
    members: usize,
    /// The member being written (0-based).
    member: usize,
}

impl ProbWriter {
    /// Scratch files for `classes` classes of a volume of `shape` (z, y, x), in `dir`.
    pub fn new(classes: usize, shape: [usize; 3], dir: &Path) -> Result<ProbWriter> {
        Self::ensemble(classes, shape, dir, 1)
    }

    /// [`ProbWriter::new`] for the mean of `members` models, written one after the other
    /// ([`ProbWriter::next_member`] between them).
    pub fn ensemble(
        classes: usize,
        shape: [usize; 3],
        dir: &Path,
        members: usize,
    ) -> Result<ProbWriter> {
        let mut files = Vec::with_capacity(classes);
        for _ in 0..classes {
            files.push(crate::nifti_io::scratch_file(dir)?);
        }
        Ok(ProbWriter {
            shape,
            files,
            written: 0,
            members: members.max(1),
            member: 0,
        })
    }

    /// Bytes a stored value.
    fn elem(&self) -> usize {
        if self.members > 1 {
            4
        } else {
            2
        }
    }

    /// The current member wrote every voxel: the next one starts.
    pub fn next_member(&mut self) -> Result<()> {
        let n: usize = self.shape.iter().product();
        if self.written != n * (self.member + 1) || self.member + 1 >= self.members {
            return Err(Error::Config(format!(
                "ensemble member {} of {} ended after {} of {n} voxels",
                self.member + 1,
                self.members,
                self.written - n * self.member
            )));
        }
        self.member += 1;
        Ok(())
    }

    /// Append voxels in C order, `classes` values a voxel (the sliding window's rows).
    pub fn append(&mut self, probs: &[f32]) -> Result<()> {
        let classes = self.files.len().max(1);
        let n = probs.len() / classes;
        if self.written + n > self.shape.iter().product::<usize>() * (self.member + 1) {
            return Err(Error::Config(format!(
                "probabilities past the end of a volume of {:?}",
                self.shape
            )));
        }
        let at = self.written - self.member * self.shape.iter().product::<usize>();
        self.write_run(at, probs)?;
        self.written += n;
        Ok(())
    }

    /// Write a run of voxels starting at voxel `at`, `classes` values a voxel (an ensemble's
    /// member adds its share to what the members before it wrote).
    fn write_run(&self, at: usize, probs: &[f32]) -> Result<()> {
        let classes = self.files.len().max(1);
        let n = probs.len() / classes;
        let elem = self.elem();
        let mut buf = Vec::with_capacity(elem * n);
        let mut old = vec![0u8; if self.member > 0 { elem * n } else { 0 }];
        let share = 1.0 / self.members as f32;
        for (c, (file, path)) in self.files.iter().enumerate() {
            buf.clear();
            let values = probs.iter().skip(c).step_by(classes);
            if elem == 2 {
                for v in values {
                    buf.extend_from_slice(&half::f16::from_f32(*v).to_le_bytes());
                }
            } else {
                if self.member > 0 {
                    file.read_exact_at(&mut old, (elem * at) as u64)
                        .map_err(|e| Error::io(path.as_path(), e))?;
                }
                for (i, v) in values.enumerate() {
                    let before = match self.member {
                        0 => 0.0,
                        _ => {
                            f32::from_le_bytes(old[4 * i..4 * i + 4].try_into().unwrap_or_default())
                        }
                    };
                    buf.extend_from_slice(&(before + v * share).to_le_bytes());
                }
            }
            file.write_all_at(&buf, (elem * at) as u64)
                .map_err(|e| Error::io(path.as_path(), e))?;
        }
        Ok(())
    }

    /// Write a block of rows (`tile`), `classes` values a voxel, voxels in C order over
    /// (rows, height, x): each slice's rows go to their place in each class's file.
    pub fn write_tile(&mut self, tile: Tile, probs: &[f32]) -> Result<()> {
        let [nz, ny, nx] = self.shape;
        let classes = self.files.len();
        let run = tile.height * nx;
        if tile.z0 + tile.rows > nz
            || tile.y0 + tile.height > ny
            || probs.len() != tile.rows * run * classes
        {
            return Err(Error::Config(format!(
                "probabilities of {tile:?} do not fit a volume of {:?}",
                self.shape
            )));
        }
        for z in 0..tile.rows {
            let block = &probs[z * run * classes..(z + 1) * run * classes];
            self.write_run(((tile.z0 + z) * ny + tile.y0) * nx, block)?;
        }
        self.written += tile.rows * run;
        Ok(())
    }

    /// A block of a box's rows: `tile` in the box's coordinates (its origin `origin`), each row
    /// `width` voxels from x `origin[2]`, `classes` values a voxel in C order over (rows,
    /// height, width).
    pub fn write_box(
        &mut self,
        tile: Tile,
        probs: &[f32],
        origin: [usize; 3],
        width: usize,
    ) -> Result<()> {
        let [nz, ny, nx] = self.shape;
        let classes = self.files.len();
        let (z0, y0, x0) = (tile.z0 + origin[0], tile.y0 + origin[1], origin[2]);
        if z0 + tile.rows > nz
            || y0 + tile.height > ny
            || x0 + width > nx
            || probs.len() != tile.rows * tile.height * width * classes
        {
            return Err(Error::Config(format!(
                "probabilities of {tile:?} at {origin:?} do not fit a volume of {:?}",
                self.shape
            )));
        }
        let run = width * classes;
        for (i, row) in probs.chunks_exact(run.max(1)).enumerate() {
            let (z, y) = (i / tile.height, i % tile.height);
            self.write_run(((z0 + z) * ny + y0 + y) * nx + x0, row)?;
        }
        self.written += tile.rows * tile.height * width;
        Ok(())
    }

    /// Every voxel outside the box `origin .. origin + size` set to `background` (one value
    /// a class).
    pub fn fill_outside(
        &mut self,
        origin: [usize; 3],
        size: [usize; 3],
        background: &[f32],
    ) -> Result<()> {
        let [nz, ny, nx] = self.shape;
        if background.len() != self.files.len()
            || (0..3).any(|a| origin[a] + size[a] > self.shape[a])
        {
            return Err(Error::Config(format!(
                "a box {size:?} at {origin:?} with {} background values for a volume of {:?} of {} classes",
                background.len(),
                self.shape,
                self.files.len()
            )));
        }
        let row = background.repeat(nx);
        let plane = background.repeat(nx * ny);
        let inside = |a: usize, v: usize| (origin[a]..origin[a] + size[a]).contains(&v);
        let classes = background.len();
        let mut n = 0;
        for z in 0..nz {
            if !inside(0, z) {
                self.write_run(z * ny * nx, &plane)?;
                n += ny * nx;
                continue;
            }
            for y in 0..ny {
                let at = (z * ny + y) * nx;
                if !inside(1, y) {
                    self.write_run(at, &row)?;
                    n += nx;
                    continue;
                }
                let end = origin[2] + size[2];
                if origin[2] > 0 {
                    self.write_run(at, &row[..origin[2] * classes])?;
                }
                if end < nx {
                    self.write_run(at + end, &row[..(nx - end) * classes])?;
                }
                n += nx - size[2];
            }
        }
        self.written += n;
        Ok(())
    }

    /// Every voxel written: the volumes, mapped for reading.
    pub fn finish(self) -> Result<Vec<ProbVolume>> {
        let n: usize = self.shape.iter().product();
        if self.written != n * self.members {
            return Err(Error::Config(format!(
                "probabilities of {} voxels written for {} model(s) of a volume of {n}",
                self.written, self.members
            )));
        }
        let elem = self.elem();
        let mut out = Vec::with_capacity(self.files.len());
        for (file, path) in self.files {
            // SAFETY: the scratch file is ours alone (created new, unlinked) and nothing writes
            // to it once mapped.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path.as_path(), e))?;
            if map.len() != elem * n {
                return Err(Error::io(
                    path.as_path(),
                    std::io::Error::other("scratch file of the wrong size"),
                ));
            }
            out.push(ProbVolume {
                map,
                elem,
                touched: AtomicU64::new(0),
            });
        }
        Ok(out)
    }
}

/// One class's probabilities, read as f32 a run at a time.
pub struct ProbVolume {
    map: Mmap,
    /// Bytes a value: 2 (float16), 4 (an ensemble's float32).
    elem: usize,
    touched: AtomicU64,
}

impl VoxelRead for ProbVolume {
    fn read(&self, start: usize, out: &mut [f32]) -> Result<()> {
        let e = self.elem;
        let bytes = self
            .map
            .get(e * start..e * (start + out.len()))
            .ok_or_else(|| Error::Config(format!("probabilities {start}.. out of range")))?;
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(e)) {
            *o = match e {
                2 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
                _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            };
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

    /// Two members' tiles average into the same files.
    #[test]
    fn an_ensemble_is_the_mean_of_its_members() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ProbWriter::ensemble(2, [1, 1, 2], dir.path(), 2).unwrap();
        let t = Tile {
            z0: 0,
            rows: 1,
            y0: 0,
            height: 1,
        };
        w.write_tile(t, &[0.25, 0.75, 1.0, 0.0]).unwrap();
        w.next_member().unwrap();
        w.append(&[0.75, 0.25, 0.5, 0.5]).unwrap();
        assert!(w.next_member().is_err(), "no third member");
        let v = w.finish().unwrap();
        let mut out = [0f32; 2];
        v[0].read(0, &mut out).unwrap();
        assert_eq!(out, [0.5, 0.75]);
        v[1].read(0, &mut out).unwrap();
        assert_eq!(out, [0.5, 0.25]);
    }

    /// Bands of rows written out of order land where whole slices appended would.
    #[test]
    fn tiles_land_where_slices_would() {
        let dir = tempfile::tempdir().unwrap();
        let shape = [3, 4, 2];
        let n = 24;
        let probs: Vec<f32> = (0..2 * n).map(|i| i as f32 / 64.0).collect();
        let mut whole = ProbWriter::new(2, shape, dir.path()).unwrap();
        whole.append(&probs[..16]).unwrap();
        whole.append(&probs[16..]).unwrap();
        let whole = whole.finish().unwrap();
        let mut tiled = ProbWriter::new(2, shape, dir.path()).unwrap();
        // Rows 3.. of every slice first, then rows 0..3.
        let band = |y0: usize, h: usize| -> Vec<f32> {
            (0..3)
                .flat_map(|z| (y0..y0 + h).flat_map(move |y| (0..2).map(move |x| (z, y, x))))
                .flat_map(|(z, y, x)| {
                    let v = (z * 4 + y) * 2 + x;
                    [probs[2 * v], probs[2 * v + 1]]
                })
                .collect()
        };
        let t = |y0, height| Tile {
            z0: 0,
            rows: 3,
            y0,
            height,
        };
        tiled.write_tile(t(3, 1), &band(3, 1)).unwrap();
        tiled.write_tile(t(0, 3), &band(0, 3)).unwrap();
        let tiled = tiled.finish().unwrap();
        for c in 0..2 {
            let (mut a, mut b) = ([0f32; 24], [0f32; 24]);
            whole[c].read(0, &mut a).unwrap();
            tiled[c].read(0, &mut b).unwrap();
            assert_eq!(a, b, "class {c}");
        }
        // A tile outside the volume is refused.
        let mut w = ProbWriter::new(2, shape, dir.path()).unwrap();
        assert!(w.write_tile(t(3, 2), &band(3, 1)).is_err());
    }
}
