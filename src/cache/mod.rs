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
pub mod writer;

pub use key::content_key;
pub use layout::CacheDir;
pub use source::PatchSource;

/// The folder a build writes the cache at `location` in: the cache folder itself, or for
/// `s3://` a staging folder that commits each entry to the bucket. Staging holds only the
/// build's temporary entries (each removed once uploaded), nothing from the bucket, so one
/// folder may stage for several caches.
pub fn open_for_build(
    location: &std::path::Path,
    remote: &s3::RemoteOptions,
) -> crate::Result<CacheDir> {
    Ok(match crate::remote::Location::parse(location)? {
        crate::remote::Location::Local(p) => CacheDir::new(p),
        crate::remote::Location::S3(url) => {
            let bucket = s3::RemoteCache::connect(&url, remote.endpoint.as_deref())?;
            CacheDir::with_backend(remote.staging_for(&url), std::sync::Arc::new(bucket))
        }
    })
}
