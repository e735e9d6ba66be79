//! A label volume written plane by plane into an unlinked scratch file and read back a box at a
//! time: what the centreline metrics thin, when the labels arrive a slab or a slice at a time
//! (a prediction being inferred, a NIfTI file being streamed). Two bytes a voxel of disk, none
//! of memory; the file disappears when the volume is dropped.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::prep::derived::LabelBoxes;

/// A (z, y, x) u16 volume on disk.
pub struct ScratchLabels {
    file: File,
    path: PathBuf,
    shape: [usize; 3],
}

impl ScratchLabels {
    /// A zeroed volume of `shape` in a new scratch file in `dir` (its disk reserved up front,
    /// so a full disk fails here rather than midway).
    pub fn create(dir: &Path, shape: [usize; 3]) -> Result<Self> {
        let (file, path) = crate::nifti_io::scratch_file(dir)?;
        let bytes = shape.iter().product::<usize>() as u64 * 2;
        crate::nifti_io::reserve(&file, bytes).map_err(|e| Error::io(&path, e))?;
        file.set_len(bytes).map_err(|e| Error::io(&path, e))?;
        Ok(ScratchLabels { file, path, shape })
    }

    /// The volume's shape (z, y, x).
    pub fn shape(&self) -> [usize; 3] {
        self.shape
    }

    /// Write whole planes from `z0` on (`voxels`: a multiple of a plane, C order).
    pub fn write_planes(&self, z0: usize, voxels: &[u16]) -> Result<()> {
        let plane = self.shape[1] * self.shape[2];
        if plane == 0
            || !voxels.len().is_multiple_of(plane)
            || z0 + voxels.len() / plane > self.shape[0]
        {
            return Err(Error::Config(format!(
                "{} voxels from plane {z0} do not fit a scratch volume of {:?}",
                voxels.len(),
                self.shape
            )));
        }
        let bytes: Vec<u8> = voxels.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.file
            .write_all_at(&bytes, (z0 * plane * 2) as u64)
            .map_err(|e| Error::io(&self.path, e))
    }
}

impl LabelBoxes for ScratchLabels {
    fn read(&self, lo: [usize; 3], hi: [usize; 3]) -> Result<Vec<u16>> {
        let s = self.shape;
        let width = hi[2] - lo[2];
        let mut out = Vec::with_capacity((0..3).map(|a| hi[a] - lo[a]).product());
        let mut row = vec![0u8; width * 2];
        for z in lo[0]..hi[0] {
            for y in lo[1]..hi[1] {
                let at = ((z * s[1] + y) * s[2] + lo[2]) * 2;
                self.file
                    .read_exact_at(&mut row, at as u64)
                    .map_err(|e| Error::io(&self.path, e))?;
                out.extend(
                    row.chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]])),
                );
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prep::derived::LabelVolume;

    #[test]
    fn boxes_read_back_what_planes_wrote() {
        let shape = [3, 4, 5];
        let voxels: Vec<u16> = (0..60).collect();
        let dir = std::env::temp_dir();
        let s = ScratchLabels::create(&dir, shape).unwrap();
        s.write_planes(0, &voxels[..20]).unwrap();
        s.write_planes(1, &voxels[20..]).unwrap();
        let whole = LabelVolume {
            voxels: &voxels,
            shape,
        };
        for (lo, hi) in [([0, 0, 0], [3, 4, 5]), ([1, 1, 2], [3, 3, 4])] {
            assert_eq!(s.read(lo, hi).unwrap(), whole.read(lo, hi).unwrap());
        }
        assert!(s.write_planes(2, &voxels[..40]).is_err());
        assert!(s.write_planes(0, &voxels[..7]).is_err());
    }
}
