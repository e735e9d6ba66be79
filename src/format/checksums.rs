//! `voxcache_chunks.json`: one blake3 per written block (chunk, or shard when sharded) of the
//! image, label and label-derived arrays, over the block's decoded little-endian bytes, edge blocks padded with
//! the fill value. `prep inspect --verify` re-hashes against it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::positive3;
use crate::error::{Error, Result};

/// The checksums file's name inside an entry.
pub const CHECKSUMS_FILE: &str = "voxcache_chunks.json";

/// What the algorithm field says (for readers of the file).
const ALGORITHM: &str =
    "blake3-128 of each block's decoded little-endian bytes (edge blocks padded with the fill value)";

/// The checksums of one entry's blocks, keyed `"z.y.x"` (block indices).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChunkChecksums {
    /// The hash and what it covers, in words, for people reading the file.
    pub algorithm: String,
    /// Shape (z, y, x) of the blocks hashed: the chunk, or the shard when sharded.
    #[serde(deserialize_with = "positive3")]
    pub block_shape_zyx: [usize; 3],
    /// Image block name (`"z.y.x"`) -> hash.
    pub image: BTreeMap<String, String>,
    /// Label block name -> hash; empty for an unlabelled entry.
    #[serde(default)]
    pub label: BTreeMap<String, String>,
    /// Signed distance block name (`"c.z.y.x"`) -> hash; empty when not built.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub distance: BTreeMap<String, String>,
    /// Skeleton block name -> hash; empty when not built.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub skeleton: BTreeMap<String, String>,
}

impl ChunkChecksums {
    /// No hashes yet, for blocks of `block_shape_zyx`.
    pub fn new(block_shape_zyx: [usize; 3]) -> Self {
        ChunkChecksums {
            algorithm: ALGORITHM.into(),
            block_shape_zyx,
            image: BTreeMap::new(),
            label: BTreeMap::new(),
            distance: BTreeMap::new(),
            skeleton: BTreeMap::new(),
        }
    }

    /// The hash recorded for a block's bytes: the first 128 bits of blake3, hex.
    pub fn hash(bytes: &[u8]) -> String {
        blake3::hash(bytes).to_hex()[..32].to_string()
    }

    /// The name a block is recorded under.
    pub fn block_name(idx: [u64; 3]) -> String {
        format!("{}.{}.{}", idx[0], idx[1], idx[2])
    }

    /// The recorded hashes of one array (`image` or `label`).
    pub fn of(&self, array: &str) -> Option<&BTreeMap<String, String>> {
        match array {
            super::entry::IMAGE_ARRAY => Some(&self.image),
            super::entry::LABEL_ARRAY => Some(&self.label),
            super::entry::DISTANCE_ARRAY => Some(&self.distance),
            super::entry::SKELETON_ARRAY => Some(&self.skeleton),
            _ => None,
        }
    }

    /// Pretty JSON, as written into the entry.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Parse the file's bytes (`path` names it in errors).
    pub fn from_json(path: &std::path::Path, bytes: &[u8]) -> Result<ChunkChecksums> {
        serde_json::from_slice(bytes).map_err(|e| {
            let what = if e.is_eof() { "truncated" } else { "malformed" };
            Error::cache(path, format!("{what} checksums file ({e})"))
        })
    }
}
