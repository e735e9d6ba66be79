//! The signed distance map of one class, streamed: three passes of the exact separable
//! transform ([`crate::prep::derived::edt`]), each over whole lines of one axis, with the squared
//! distances in between kept in an unlinked scratch file (two f64 a voxel: to the class, and to
//! the rest). The x pass reads the label a chunk row at a time and writes line by line; the
//! y pass works on one plane's strip of a chunk's width; the z pass on one chunk column, which
//! it hands out as finished blocks. Memory: a chunk row of label, a strip, and a column of f32,
//! whatever the volume's size. Each line sees the same arithmetic in the same order as the
//! whole-volume [`crate::prep::derived::edt::signed_distance`], so the result is the same to the bit.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rayon::prelude::*;

use super::LabelBoxes;
use crate::error::{Error, Result};
use crate::prep::derived::edt::lower_envelope;

/// Where the scratch's squared distances of voxel `(z, y, x)` start (two f64 a voxel).
fn offset(shape: [usize; 3], z: usize, y: usize, x: usize) -> u64 {
    (((z * shape[1] + y) * shape[2] + x) * 16) as u64
}

/// The scratch file of one transform: reads and writes runs of voxel pairs.
struct Scratch<'a> {
    file: File,
    path: &'a Path,
}

impl Scratch<'_> {
    fn write(&self, at: u64, v: &[f64]) -> Result<()> {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.file
            .write_all_at(&bytes, at)
            .map_err(|e| Error::io(self.path, e))
    }

    fn read(&self, at: u64, v: &mut [f64]) -> Result<()> {
        let mut bytes = vec![0u8; v.len() * 8];
        self.file
            .read_exact_at(&mut bytes, at)
            .map_err(|e| Error::io(self.path, e))?;
        for (o, b) in v.iter_mut().zip(bytes.chunks_exact(8)) {
            *o = f64::from_le_bytes(b.try_into().unwrap_or_default());
        }
        Ok(())
    }
}

/// Transform the pairs `line[k * 2 + f]` (feature `f` of position `k`) along the line.
fn envelope_pairs(line: &mut [f64], w: f64, bufs: &mut Bufs) {
    let n = line.len() / 2;
    for f in 0..2 {
        bufs.f.clear();
        bufs.f.extend((0..n).map(|k| line[k * 2 + f]));
        bufs.out.resize(n, 0.0);
        lower_envelope(&bufs.f, w, &mut bufs.out, &mut bufs.v, &mut bufs.z);
        for k in 0..n {
            line[k * 2 + f] = bufs.out[k];
        }
    }
}

#[derive(Default)]
struct Bufs {
    f: Vec<f64>,
    out: Vec<f64>,
    v: Vec<usize>,
    z: Vec<f64>,
}

/// Receives each finished block: its index in the block grid, its size, its values.
pub type BlockSink<'a> = dyn Fn([u64; 3], [usize; 3], &[f32]) -> Result<()> + Sync + 'a;

/// Block `(bz, by, bx)` of a grid of `block` over `shape`: its start and size.
fn block_span(shape: [usize; 3], block: [usize; 3], a: usize, i: usize) -> (usize, usize) {
    let s = i * block[a];
    (s, block[a].min(shape[a] - s))
}

/// Signed distance of label value `class` over a (z, y, x) volume of `shape` (spacing
/// `spacing_zyx`), negative inside. `full`: the class fills the volume (then, as for an absent
/// class, the map is 0: there is no boundary to measure from). Each finished block of the grid
/// `block` goes to `sink(block index, block size, values)` (C order, its own size), from
/// several threads at once. The scratch file goes in `scratch_dir`.
#[allow(clippy::too_many_arguments)]
pub fn streamed_signed_distance(
    label: &dyn LabelBoxes,
    class: u16,
    full: bool,
    shape: [usize; 3],
    block: [usize; 3],
    spacing_zyx: [f64; 3],
    scratch_dir: &Path,
    sink: &BlockSink<'_>,
) -> Result<()> {
    let grid = [0, 1, 2].map(|a| shape[a].div_ceil(block[a]));
    if full {
        return (0..grid.iter().product::<usize>())
            .into_par_iter()
            .try_for_each(|i| {
                let b = [
                    i / (grid[1] * grid[2]),
                    (i / grid[2]) % grid[1],
                    i % grid[2],
                ];
                let size = [0, 1, 2].map(|a| block_span(shape, block, a, b[a]).1);
                let zeros = vec![0f32; size.iter().product()];
                sink(b.map(|v| v as u64), size, &zeros)
            });
    }
    let (file, path) = crate::nifti_io::scratch_file(scratch_dir)?;
    let bytes = shape.iter().product::<usize>() as u64 * 16;
    crate::nifti_io::reserve(&file, bytes).map_err(|e| Error::io(&path, e))?;
    file.set_len(bytes).map_err(|e| Error::io(&path, e))?;
    let scratch = Scratch { file, path: &path };
    let [nz, ny, nx] = shape;
    let w = spacing_zyx.map(|s| s * s);

    // x: a chunk row of label (all of x) at a time, written line by line.
    (0..grid[0] * grid[1])
        .into_par_iter()
        .try_for_each(|i| -> Result<()> {
            let (z0, dz) = block_span(shape, block, 0, i / grid[1]);
            let (y0, dy) = block_span(shape, block, 1, i % grid[1]);
            let lab = label.read([z0, y0, 0], [z0 + dz, y0 + dy, nx])?;
            let mut bufs = Bufs::default();
            let mut line = vec![0f64; nx * 2];
            for (r, row) in lab.chunks_exact(nx).enumerate() {
                for (k, &l) in row.iter().enumerate() {
                    let inside = l == class;
                    // Feature 0: the class (distance to it); feature 1: the rest.
                    line[k * 2] = if inside { 0.0 } else { f64::INFINITY };
                    line[k * 2 + 1] = if inside { f64::INFINITY } else { 0.0 };
                }
                envelope_pairs(&mut line, w[2], &mut bufs);
                scratch.write(offset(shape, z0 + r / dy, y0 + r % dy, 0), &line)?;
            }
            Ok(())
        })?;

    // y: one plane's strip of a chunk's width at a time.
    (0..nz * grid[2])
        .into_par_iter()
        .try_for_each(|i| -> Result<()> {
            let z = i / grid[2];
            let (x0, dx) = block_span(shape, block, 2, i % grid[2]);
            let mut strip = vec![0f64; ny * dx * 2];
            for (y, row) in strip.chunks_exact_mut(dx * 2).enumerate() {
                scratch.read(offset(shape, z, y, x0), row)?;
            }
            transpose_pass(&mut strip, ny, dx, w[1]);
            for (y, row) in strip.chunks_exact(dx * 2).enumerate() {
                scratch.write(offset(shape, z, y, x0), row)?;
            }
            Ok(())
        })?;

    // z: one chunk column at a time, finished into signed distances and handed out by block.
    (0..grid[1] * grid[2])
        .into_par_iter()
        .try_for_each(|i| -> Result<()> {
            let (by, bx) = (i / grid[2], i % grid[2]);
            let (y0, dy) = block_span(shape, block, 1, by);
            let (x0, dx) = block_span(shape, block, 2, bx);
            let mut column = vec![0f32; nz * dy * dx];
            let mut strip = vec![0f64; nz * dx * 2];
            for y in 0..dy {
                for (z, row) in strip.chunks_exact_mut(dx * 2).enumerate() {
                    scratch.read(offset(shape, z, y0 + y, x0), row)?;
                }
                transpose_pass(&mut strip, nz, dx, w[0]);
                for z in 0..nz {
                    for x in 0..dx {
                        let (to_class, to_rest) =
                            (strip[(z * dx + x) * 2], strip[(z * dx + x) * 2 + 1]);
                        // Inside exactly where the distance to the class is 0.
                        column[(z * dy + y) * dx + x] = if to_class == 0.0 {
                            -to_rest.sqrt() as f32
                        } else {
                            to_class.sqrt() as f32
                        };
                    }
                }
            }
            for bz in 0..grid[0] {
                let (z0, dz) = block_span(shape, block, 0, bz);
                sink(
                    [bz as u64, by as u64, bx as u64],
                    [dz, dy, dx],
                    &column[z0 * dy * dx..(z0 + dz) * dy * dx],
                )?;
            }
            Ok(())
        })?;
    Ok(())
}

/// Transform a `(len, width, 2)` strip along its first axis, every (column, feature) line.
fn transpose_pass(strip: &mut [f64], len: usize, width: usize, w: f64) {
    let mut bufs = Bufs::default();
    let mut line = vec![0f64; len * 2];
    for x in 0..width {
        for k in 0..len {
            line[k * 2] = strip[(k * width + x) * 2];
            line[k * 2 + 1] = strip[(k * width + x) * 2 + 1];
        }
        envelope_pairs(&mut line, w, &mut bufs);
        for k in 0..len {
            strip[(k * width + x) * 2] = line[k * 2];
            strip[(k * width + x) * 2 + 1] = line[k * 2 + 1];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prep::derived::LabelVolume;
    use std::sync::Mutex;

    fn streamed(l: &LabelVolume, class: u16, block: [usize; 3], sp: [f64; 3]) -> Vec<f32> {
        let shape = l.shape;
        let out = Mutex::new(vec![f32::NAN; shape.iter().product()]);
        let dir = std::env::temp_dir();
        streamed_signed_distance(l, class, false, shape, block, sp, &dir, &|b, size, v| {
            let mut o = out.lock().unwrap();
            for z in 0..size[0] {
                for y in 0..size[1] {
                    for x in 0..size[2] {
                        let g = [
                            b[0] as usize * block[0] + z,
                            b[1] as usize * block[1] + y,
                            b[2] as usize * block[2] + x,
                        ];
                        o[(g[0] * shape[1] + g[1]) * shape[2] + g[2]] =
                            v[(z * size[1] + y) * size[2] + x];
                    }
                }
            }
            Ok(())
        })
        .unwrap();
        out.into_inner().unwrap()
    }

    #[test]
    fn streamed_equals_whole_volume_to_the_bit() {
        let shape = [9, 13, 11];
        let mut state = 7u64;
        let v: Vec<u16> = (0..shape.iter().product::<usize>())
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                match state >> 60 {
                    0..=1 => 1,
                    2 => 2,
                    _ => 0,
                }
            })
            .collect();
        let l = LabelVolume { voxels: &v, shape };
        let sp = [2.5, 0.7, 0.31];
        for class in [1u16, 2] {
            let inside: Vec<bool> = l.voxels.iter().map(|&x| x == class).collect();
            let whole = crate::prep::derived::edt::signed_distance(&inside, shape, sp);
            for block in [[4, 5, 3], [9, 13, 11], [1, 1, 1], [2, 13, 4]] {
                let s = streamed(&l, class, block, sp);
                assert_eq!(
                    s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "class {class}, block {block:?}"
                );
            }
        }
    }
}
