//! Reading NIfTI-1 headers and volumes.
//!
//! Everything a header says is checked before anything is allocated from it: dimensions,
//! datatype, spacing and the voxel data's byte count against what the file really holds. Gzip
//! files may have several members (as nibabel and some pipelines write them), so they are read
//! through a multi-member decoder. Values always come out as f32 with scl_slope/scl_inter applied.
//!
//! Stages (one job each): `file` reads a file's bytes (hashed) and inflates gzip; `header`
//! parses and validates the header and derives the affine; `voxels` decodes the voxel data to
//! f32; `labels` turns label volumes into u8/u16 (integer files directly, others through f32).

mod file;
mod header;
mod labels;
mod voxels;

pub use file::{open_input, read_file_hashed, FileBytes};
pub use header::{f32_to_f64_decimal, read_header, HeaderInfo};
pub use labels::{label_from_f32, read_label, LabelData, LabelVolume};
pub use voxels::{decode_volume, read_volume, Volume};
