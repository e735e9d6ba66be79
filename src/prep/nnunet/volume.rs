//! A scratch volume on disk, (c, z, y, x) in C order, read and written a run of rows at a time
//! with positioned I/O: nothing of it is mapped or held, so it adds nothing to the process's
//! memory however large it is. The file is unlinked as soon as it is created.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytemuck::Pod;

use crate::error::{Error, Result};

/// A stored element: converts to and from f64 for arithmetic.
pub trait Elem: Pod + Default + Send + Sync {
    /// As f64.
    fn to_f64(self) -> f64;
    /// From f64, rounded to nearest.
    fn from_f64(v: f64) -> Self;
}

impl Elem for f32 {
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Elem for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

impl Elem for half::f16 {
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(v: f64) -> Self {
        half::f16::from_f64(v)
    }
}

impl Elem for u8 {
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(v: f64) -> Self {
        v as u8
    }
}

impl Elem for u16 {
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(v: f64) -> Self {
        v as u16
    }
}

/// A volume of `T` in an unlinked scratch file.
pub struct Scratch<T: Elem> {
    file: File,
    path: PathBuf,
    /// (c, z, y, x).
    pub shape: [usize; 4],
    _t: std::marker::PhantomData<T>,
}

impl<T: Elem> Scratch<T> {
    /// A new volume of zeros in `dir`.
    pub fn new(dir: &Path, shape: [usize; 4]) -> Result<Scratch<T>> {
        let (file, path) = crate::nifti_io::scratch_file(dir)?;
        let bytes = shape.iter().product::<usize>() * std::mem::size_of::<T>();
        file.set_len(bytes as u64)
            .map_err(|e| Error::io(&path, e))?;
        Ok(Scratch {
            file,
            path,
            shape,
            _t: std::marker::PhantomData,
        })
    }

    /// Spatial shape (z, y, x).
    pub fn zyx(&self) -> [usize; 3] {
        [self.shape[1], self.shape[2], self.shape[3]]
    }

    fn offset(&self, c: usize, z: usize, y: usize) -> u64 {
        let [_, d, h, w] = self.shape;
        (((c * d + z) * h + y) * w * std::mem::size_of::<T>()) as u64
    }

    /// Rows `y0..` of slice `z` of channel `c` (whole rows: `out.len()` a multiple of x).
    pub fn read_rows(&self, c: usize, z: usize, y0: usize, out: &mut [T]) -> Result<()> {
        self.file
            .read_exact_at(bytemuck::cast_slice_mut(out), self.offset(c, z, y0))
            .map_err(|e| Error::io(&self.path, e))
    }

    /// Write rows `y0..` of slice `z` of channel `c`.
    pub fn write_rows(&self, c: usize, z: usize, y0: usize, data: &[T]) -> Result<()> {
        self.file
            .write_all_at(bytemuck::cast_slice(data), self.offset(c, z, y0))
            .map_err(|e| Error::io(&self.path, e))
    }

    /// `out.len()` values of row `y` of slice `z` of channel `c` from `x0`.
    pub fn read_run(&self, c: usize, z: usize, y: usize, x0: usize, out: &mut [T]) -> Result<()> {
        let at = self.offset(c, z, y) + (x0 * std::mem::size_of::<T>()) as u64;
        self.file
            .read_exact_at(bytemuck::cast_slice_mut(out), at)
            .map_err(|e| Error::io(&self.path, e))
    }

    /// Write `data` into row `y` of slice `z` of channel `c` from `x0`.
    pub fn write_run(&self, c: usize, z: usize, y: usize, x0: usize, data: &[T]) -> Result<()> {
        let at = self.offset(c, z, y) + (x0 * std::mem::size_of::<T>()) as u64;
        self.file
            .write_all_at(bytemuck::cast_slice(data), at)
            .map_err(|e| Error::io(&self.path, e))
    }

    /// One whole slice.
    pub fn slice(&self, c: usize, z: usize) -> Result<Vec<T>> {
        let mut v = vec![T::default(); self.shape[2] * self.shape[3]];
        self.read_rows(c, z, 0, &mut v)?;
        Ok(v)
    }
}
