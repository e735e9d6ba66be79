//! The manifest of a cache folder (the schema lives in [`crate::format::manifest`]; builds
//! merge into it through the cache's [`super::store::Backend`]).

use super::layout::CacheDir;
use crate::error::Result;
pub use crate::format::manifest::params_key;
pub use crate::format::{Manifest, ManifestCase, ManifestDataset};

/// The manifest of a cache folder, or an empty one when no build has finished there yet.
pub fn load_or_empty(cache: &CacheDir) -> Result<Manifest> {
    Ok(Manifest::read(&cache.manifest_path())?.unwrap_or_default())
}
