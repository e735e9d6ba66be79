//! Spatial augmentation: rotation, scaling and elastic deformation as one map from patch voxels
//! to source coordinates, and one interpolation of every array of the case at those coordinates.
//!
//! nnU-Net crops an enlarged patch, then rotates and scales it; we compute where each patch voxel
//! comes from in the cached volume and read only the box those coordinates need (memory-mapped
//! chunks under it), so nothing depends on the volume's size and nothing is interpolated twice.
//!
//! The map, in voxel coordinates (z, y, x) of the cached volume, for patch voxel `p`:
//!
//! ```text
//! source(p) = centre + scale * R * (p - (size - 1) / 2) + elastic(p)
//! ```
//!
//! `centre = start + (size - 1) / 2` is the centre of the box the sampler chose (so the identity
//! map reads exactly that box, and a foreground-centred patch stays centred on its voxel);
//! `R = Rz * Ry * Rx` rotates by the angles about the z, y and x axes (`Rz` turns the (y, x)
//! plane); a scale above 1 samples a wider region (structures look smaller), as in nnU-Net.
//! `elastic` is a displacement interpolated trilinearly from a coarse grid of random control
//! displacements. Rotation happens in voxel space, as nnU-Net does; patches much thinner in z
//! than in-plane (nnU-Net's "dummy 2D" rule, largest side over 3 times z) are rotated, scaled
//! and deformed in-plane only.
//!
//! Interpolation: images linearly (what scipy's `map_coordinates(order=1,
//! mode="grid-constant")` computes over the zero-padded volume); labels by the class with the
//! largest summed linear weight among the 8 neighbours (nnU-Net's per-class interpolation,
//! which never invents a value between two classes), ties to the lower value. Outside the
//! volume images read 0 (after normalization) and labels background, like nnU-Net's padding.
//!
//! Paths, all giving the same bits: the general tile loop (`sample`, and its vector build over
//! rows of 8 voxels with `gather`); maps without rotation or deformation through three 1D
//! passes (`separable`); in-plane maps of several planes through the box turned on its side,
//! reading only their footprint (`in_plane`, `columns`); labels' majorities in `label`. Vector
//! builds are picked by [`crate::util::simd`]; AVX-512 CPUs take the AVX2 paths (wider twins
//! measured only a few percent on their own loops, short of what the end-to-end rule asks).
//!
//! Files: `draw` (the draw of one patch's map from the options of
//! [`crate::format::training::augmentation`]), `transform` (the map),
//! `footprint` (the source box and the parts of it a map reads), `reader` (the reader and its
//! choice of path), `sample`, `in_plane`, `columns`, `separable` and `gather` (the paths),
//! `label` (the label's majority), `derived` (distance maps and skeleton through the same
//! map).

#[cfg(target_arch = "x86_64")]
mod columns;
mod derived;
mod draw;
mod footprint;
#[cfg(target_arch = "x86_64")]
mod gather;
#[cfg(target_arch = "x86_64")]
mod in_plane;
mod label;
mod reader;
mod sample;
mod separable;
#[cfg(test)]
mod tests;
mod transform;

pub use draw::{SpatialConfig, IN_PLANE_RATIO};
pub use reader::TransformedReader;
pub use transform::{rotation_zyx, ElasticField, Transform};

/// The first `n` elements of `buf`, which only ever grows: boxes change size from patch to
/// patch, and a `Vec` resized down and up again zero-fills the regrown part each time, though
/// every read overwrites what is used of it (2% of a 16x128x128 `default` patch).
pub(super) fn first_n<T: Copy + Default>(buf: &mut Vec<T>, n: usize) -> &mut [T] {
    if buf.len() < n {
        buf.resize(n, T::default());
    }
    &mut buf[..n]
}

/// The first `w` of a row of 8 labels into `l` at `at`: a full row as one fixed-size move
/// (a copy of variable length is a call to `memcpy`, a fortieth of a rotated patch's time).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn put_row(l: &mut [u16], at: usize, vals: &[u16; 8], w: usize) {
    if w == 8 {
        l[at..at + 8].copy_from_slice(vals);
    } else {
        l[at..at + w].copy_from_slice(&vals[..w]);
    }
}
