//! Reading NIfTI-1 and NIfTI-2 headers and volumes.
//!
//! Everything a header says is checked before anything is allocated from it: dimensions,
//! datatype, spacing and the voxel data's byte count against what the file really holds. Gzip
//! files may have several members (as nibabel and some pipelines write them), so they are read
//! through a multi-member decoder, to the end (every CRC checked). Values always come out as f32
//! with scl_slope/scl_inter applied. No stage holds a whole volume unless asked to
//! ([`read_volume`], for tests and small tools): memory does not grow with the input.
//!
//! Stages (one job each): `file` opens input files (regular files only) and inflates gzip;
//! `header` parses and validates the header and derives the affine (`nifti2` reads a NIfTI-2
//! header into the same fields); `stream` reads a file once,
//! hashing it and handing its voxel bytes on a block at a time; `voxels` decodes stored bytes
//! to f32; `source` keeps a volume's voxels for random access (in memory, or in a scratch
//! file); `labels` checks label values.

mod file;
mod header;
mod label_writer;
mod labels;
mod nifti2;
mod source;
mod stream;
mod voxels;
mod writer;

pub use file::open_input;
pub use header::{
    f32_to_f64_decimal, parse_header_bytes, read_frame_header, read_header, read_header_frames,
    unit_in_mm, HeaderInfo,
};
pub use label_writer::{LabelType, LabelWriter};
pub use labels::{label_from_f32, stream_label_slices, LabelCheck, LabelData};
pub(crate) use source::{reserve, scratch_file};
pub use source::{SourceOptions, VoxelSource};
pub use stream::{stream_frame, stream_voxels, Streamed, BLOCK_VOXELS};
pub use voxels::{read_volume, stream_f32, stream_f32_frame, Volume};
pub use writer::{write_nifti_i16, write_nifti_u8};
