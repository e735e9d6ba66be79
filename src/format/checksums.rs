//! The chunk checksums: one blake3 per written block (chunk, or shard when sharded) of the
//! image, label and label-derived arrays, over the block's decoded little-endian bytes, edge
//! blocks padded with the fill value. They live in the entry's group attributes
//! ([`CHECKSUMS_AT`]), so the entry folder holds nothing but Zarr nodes (a file of our own
//! there made zarr-python warn that it is not part of the hierarchy). The reader checks each
//! block against them on first use; `prep inspect --verify` re-hashes every block.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::positive3;

/// Where an entry records its checksums, for messages: the `chunk_checksums` field of
/// voxcache's record in the group's attributes.
pub const CHECKSUMS_AT: &str = "zarr.json attributes.voxcache.chunk_checksums";

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
    /// Normalization-mask block name -> hash; empty when the entry has none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub norm_mask: BTreeMap<String, String>,
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
            norm_mask: BTreeMap::new(),
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
            super::entry::NORM_MASK_ARRAY => Some(&self.norm_mask),
            _ => None,
        }
    }
}
