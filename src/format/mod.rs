//! The on-disk format: the only code that reads or writes voxcache's own JSON (entry
//! attributes, the manifest, chunk checksums) and parses array metadata (through zarrs' types).
//! Every other module goes through these typed structs, so a field is spelt, checked and
//! versioned in one place.
//!
//! - [`entry`]: an entry's group attributes ([`EntryAttrs`]).
//! - [`manifest`]: `manifest.json` ([`Manifest`]).
//! - [`dataset_json`]: the `dataset.json` that `prep synth` writes ([`dataset_json::DatasetJson`]).
//! - [`checksums`]: the chunk checksums in an entry's attributes ([`ChunkChecksums`]).
//! - [`params`]: the parameters that shape an entry's bytes ([`OutputParams`]).
//! - [`array`](mod@array): an array's `zarr.json` reduced to what the reader needs ([`ArrayLayout`]).
//! - [`dtype`]: the one table of stored element types ([`Dtype`]).
//! - [`labels`]: classes or regions and the ignore label, as every command reads them ([`Labels`]).
//! - [`run`]: a training run folder's `run.json` and checkpoints' `state.json`.
//! - [`crossval`]: a fold's validation folder, cross-validation summaries, postprocessing.
//! - [`probabilities`]: the class probabilities `predict --save-probabilities` writes.
//! - [`nnunet`]: nnU-Net v2's results folders (plans, dataset.json, folds).
//!
//! A cache written by another format version is refused with one sentence that says what to do.

pub mod array;
pub mod checksums;
pub mod crossval;
pub mod dataset_json;
pub mod dtype;
pub mod entry;
pub mod labels;
pub mod manifest;
pub mod nnunet;
pub mod normalization;
mod ome;
pub mod params;
pub mod probabilities;
pub mod run;
pub mod training;

use std::path::Path;

use serde::{Deserialize, Deserializer};

pub use array::{ArrayLayout, Encoding, ZARR_JSON};
pub use checksums::{ChunkChecksums, CHECKSUMS_AT};
pub use dtype::Dtype;
pub use entry::{
    EntryAttrs, DISTANCE_ARRAY, FG_ARRAY, IMAGE_ARRAY, LABEL_ARRAY, NORM_MASK_ARRAY, SKELETON_ARRAY,
};
pub use labels::Labels;
pub use manifest::{
    entry_rel, key_is_valid, rel_path_is_plain, Manifest, ManifestCase, ManifestDataset,
    ENTRIES_DIR, MANIFEST_FILE, MANIFEST_LOCK, SPLITS_FILE, TMP_DIR,
};
pub use normalization::{
    AppliedNormalization, ForegroundStats, IntensityStats, Normalization, SchemeStatistics,
};
pub use params::{
    ChannelParams, ChunkLayout, Compression, DerivedArrays, ImageDtype, NnunetPreprocessing,
    OutputParams,
};

/// Bumped whenever the bytes or the schema of an entry change for the same parameters.
/// 1: the first release. 2: typed schema (sources record sizes, label classes keyed by value).
/// 3: image channels: the image array is (c, z, y, x), one channel per chunk; sources,
/// statistics and normalization per channel. 4: label-derived arrays (`distance`, `skeleton`)
/// and the parameters that ask for them. 5: the chunk checksums in the group's attributes
/// (`chunk_checksums`), no longer a `voxcache_chunks.json` file inside the Zarr group. 6:
/// compressed chunks (each inner chunk of a shard) end with a CRC-32C of their stored bytes
/// (Zarr's `crc32c` codec), checked whenever one is decoded.
pub const FORMAT_VERSION: u32 = 6;

/// Refuse anything but this version, with one sentence that says what to do.
fn check_version(path: &Path, what: &str, v: Option<&serde_json::Value>) -> crate::Result<()> {
    match v.and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(FORMAT_VERSION) => Ok(()),
        Some(v) if v < u64::from(FORMAT_VERSION) => Err(crate::Error::cache(
            path,
            format!(
                "this {what} was written in voxcache format version {v}, which this voxcache (format version {FORMAT_VERSION}) no longer reads: rebuild the cache with prep build-cache into a new cache folder"
            ),
        )),
        Some(v) => Err(crate::Error::cache(
            path,
            format!(
                "this {what} was written in voxcache format version {v} by a newer voxcache than this one (format version {FORMAT_VERSION}): upgrade voxcache to read it"
            ),
        )),
        None => Err(crate::Error::cache(
            path,
            format!("not a voxcache {what}: no format_version"),
        )),
    }
}

/// Three sides from a list of numbers (`positive`: none may be zero); `None` otherwise.
pub fn dims3<T: Copy + TryInto<u64>>(v: &[T], positive: bool) -> Option<[usize; 3]> {
    let [a, b, c] = v else { return None };
    let one = |x: T| -> Option<usize> {
        let n = usize::try_from(x.try_into().ok()?).ok()?;
        (!positive || n > 0).then_some(n)
    };
    Some([one(*a)?, one(*b)?, one(*c)?])
}

/// serde: three positive whole numbers (shapes, chunk sides).
fn positive3<'de, D: Deserializer<'de>>(d: D) -> Result<[usize; 3], D::Error> {
    let v = <[u64; 3]>::deserialize(d)?;
    dims3(&v, true).ok_or_else(|| serde::de::Error::custom(format!("{v:?} has a zero side")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims3_checks_length_range_and_zero() {
        assert_eq!(dims3(&[1u64, 2, 3], true), Some([1, 2, 3]));
        assert_eq!(dims3(&[1u64, 0, 3], true), None);
        assert_eq!(dims3(&[1u64, 0, 3], false), Some([1, 0, 3]));
        assert_eq!(dims3(&[1u64, 2], false), None);
        let nz = std::num::NonZeroU64::new(5).unwrap();
        assert_eq!(dims3(&[nz, nz, nz], true), Some([5, 5, 5]));
    }

    #[test]
    fn other_versions_get_one_clear_sentence() {
        let p = Path::new("cache/manifest.json");
        let old = check_version(p, "cache", Some(&serde_json::json!(1)))
            .unwrap_err()
            .to_string();
        assert!(
            old.contains("format version 1") && old.contains("rebuild"),
            "{old}"
        );
        assert!(check_version(p, "cache", Some(&serde_json::json!(FORMAT_VERSION))).is_ok());
        assert!(check_version(p, "cache", None).is_err());
    }
}
