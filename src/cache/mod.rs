//! The cache: a folder of content-addressed Zarr v3 entries plus a manifest.
//!
//! ```text
//! CACHE/
//!   manifest.json            dataset name -> parameters + case id -> entry key
//!   entries/ab/abcdef.../    one Zarr v3 group per case, named by its content key
//!   tmp/                     entries being written (renamed into entries/ when complete)
//! ```

pub mod fg_index;
pub mod key;
pub mod layout;
pub mod manifest;
pub mod probabilities;
pub mod reader;
pub mod s3;
pub mod source;
pub mod store;
pub mod tier;
pub mod writer;

pub use key::content_key;
pub use layout::CacheDir;
pub use source::PatchSource;
