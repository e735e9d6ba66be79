//! Fixtures and probes shared by the integration tests (each test binary uses a subset, hence
//! the `dead_code` allowance):
//! - [`nii`]: a NIfTI-1 and NIfTI-2 writer written from the spec, independent of the nifti
//!   crate, so the reader is checked against bytes we control (datatypes, endianness, odd
//!   headers);
//! - here: nnU-Net style cases and a deterministic random stream;
//! - [`fixtures`]: running `prep build-cache` into caches, and walking and copying them;
//! - [`probe`]: this process's memory use, read from `/proc/self/status`;
//! - [`bounded`]: a binary run under a time limit and an address-space cap;
//! - `zarr_read`: zarrs' own reads, the reference for the patch readers.
// Each test crate uses a subset of these helpers, reached through `pub`.
#![allow(dead_code, unreachable_pub)]

pub mod bounded;
pub mod fixtures;
pub mod nii;
pub mod probe;
mod zarr_read;
#[allow(unused_imports)] // not every test crate names the element trait
pub use nii::{Elem, Nii};
#[allow(unused_imports)] // not every test crate reads zarr arrays
pub use zarr_read::zarrs_box;

use std::path::Path;

/// A deterministic pseudo-random stream for fixtures.
pub struct Lcg(pub u64);
impl Lcg {
    fn step(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }

    /// Uniform in [0, 1), 24 bits.
    pub fn next_f32(&mut self) -> f32 {
        ((self.step() >> 40) as f32) / (1u64 << 24) as f32
    }

    /// In 0..n (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        (self.step() >> 33) % n.max(1)
    }

    /// In lo..hi (lo when the range is empty).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo) as u64) as i64
    }
}

/// Write an nnU-Net style case (image int16 with a blob, label 0/1) into `dir`.
pub fn write_case(dir: &Path, id: &str, shape: [usize; 3], spacing: [f32; 3], seed: u64) {
    std::fs::create_dir_all(dir.join("imagesTr")).unwrap();
    std::fs::create_dir_all(dir.join("labelsTr")).unwrap();
    let mut rng = Lcg(seed);
    let n = shape.iter().product::<usize>();
    let mut img = Vec::with_capacity(n);
    let mut lab = Vec::with_capacity(n);
    for z in 0..shape[2] {
        for y in 0..shape[1] {
            for x in 0..shape[0] {
                let d = ((x as f32 - shape[0] as f32 / 2.0).powi(2)
                    + (y as f32 - shape[1] as f32 / 2.0).powi(2))
                .sqrt();
                let inside = d < shape[0].min(shape[1]) as f32 / 4.0 && z > 0;
                lab.push(inside as u8);
                img.push((100.0 + 50.0 * rng.next_f32() + if inside { 300.0 } else { 0.0 }) as i16);
            }
        }
    }
    Nii::new(shape, spacing, &img, false).write(&dir.join(format!("imagesTr/{id}_0000.nii.gz")));
    Nii::new(shape, spacing, &lab, false).write(&dir.join(format!("labelsTr/{id}.nii.gz")));
}

/// blake3 of every file under `dir`, by relative path.
pub fn tree_hashes(dir: &Path) -> std::collections::BTreeMap<String, String> {
    fixtures::files_under(dir)
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().to_string();
            let hash = blake3::hash(&std::fs::read(&p).unwrap());
            (rel, hash.to_hex().to_string())
        })
        .collect()
}

/// The 26-connected components of `mask` (x fastest), each as its voxels' indices: a flood
/// fill written for the tests, the reference for the postprocessing filters.
pub fn components(mask: &[bool], [nx, ny, nz]: [usize; 3]) -> Vec<Vec<usize>> {
    let mut seen = vec![false; mask.len()];
    let mut out = Vec::new();
    for start in 0..mask.len() {
        if !mask[start] || seen[start] {
            continue;
        }
        seen[start] = true;
        let (mut stack, mut members) = (vec![start], Vec::new());
        while let Some(i) = stack.pop() {
            members.push(i);
            let (x, y, z) = (i % nx, (i / nx) % ny, i / (nx * ny));
            for dz in -1i64..=1 {
                for dy in -1i64..=1 {
                    for dx in -1i64..=1 {
                        let (a, b, c) = (x as i64 + dx, y as i64 + dy, z as i64 + dz);
                        if a < 0
                            || b < 0
                            || c < 0
                            || a >= nx as i64
                            || b >= ny as i64
                            || c >= nz as i64
                        {
                            continue;
                        }
                        let j = a as usize + nx * (b as usize + ny * c as usize);
                        if mask[j] && !seen[j] {
                            seen[j] = true;
                            stack.push(j);
                        }
                    }
                }
            }
        }
        out.push(members);
    }
    out
}
