//! An entry array's `zarr.json`, read through zarrs' own metadata types, reduced to what the
//! reader needs: shape, element type, chunking and whether chunks are raw bytes it can map.

use std::path::Path;

use zarrs::metadata::v3::{ArrayMetadataV3, MetadataV3};
use zarrs::metadata::{ChunkKeySeparator, Endianness};
use zarrs::metadata_ext::chunk_grid::regular::RegularChunkGridConfiguration;
use zarrs::metadata_ext::chunk_key_encoding::default::DefaultChunkKeyEncodingConfiguration;
use zarrs::metadata_ext::codec::bytes::BytesCodecConfiguration;
use zarrs::metadata_ext::codec::sharding::{ShardingCodecConfiguration, ShardingIndexLocation};

use super::dims3;
use super::dtype::Dtype;
use crate::error::{Error, Result};

/// The metadata file of every Zarr v3 node (an entry's group, each of its arrays).
pub const ZARR_JSON: &str = "zarr.json";

/// How chunk bytes sit in the files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Each chunk file holds the chunk's little-endian elements, nothing else.
    Raw,
    /// Shard files with a little-endian `bytes` index (optionally followed by its CRC-32C) at
    /// the start or the end, of raw inner chunks or of inner chunks encoded on their own.
    Sharded {
        /// The index follows the inner chunks (else it precedes them).
        index_at_end: bool,
        /// The index is followed by its CRC-32C (4 bytes).
        index_crc32c: bool,
        /// Inner chunks are their little-endian elements, nothing else (else compressed:
        /// each decoded on its own by the inner codecs).
        inner_raw: bool,
    },
    /// Anything else (compressed chunks unsharded, big-endian...): only zarrs can decode it.
    Encoded,
}

/// The facts of one array's metadata: a 3-D (z, y, x) array, or a 4-D (c, z, y, x) one
/// chunked one channel per chunk (the image), which reads as `channels` 3-D arrays.
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayLayout {
    /// Length of the leading channel axis of a 4-D array; `None` for a 3-D array.
    pub channels: Option<usize>,
    /// Array shape (z, y, x) in elements (after the channel axis).
    pub shape: [usize; 3],
    /// Element type.
    pub dtype: Dtype,
    /// The chunk grid's cell: the shard when sharded, else the chunk.
    pub block: [usize; 3],
    /// The unit elements are stored in: the inner chunk of a shard, else the chunk.
    pub chunk: [usize; 3],
    /// Whether chunk keys use the `default` encoding (`c/z/y/x`).
    pub default_keys: bool,
    /// The separator between a chunk key's indices: '/' or '.'.
    pub separator: char,
    /// Whether the fill value is zero (what voxcache writes).
    pub zero_fill: bool,
    /// How chunk bytes sit in the files.
    pub encoding: Encoding,
}

/// `bytes` writing little-endian (any byte order is fine for one-byte elements).
fn is_le_bytes(codec: &MetadataV3, elem_size: usize) -> bool {
    codec.name() == "bytes"
        && match codec.to_typed_configuration::<BytesCodecConfiguration>() {
            Ok(BytesCodecConfiguration::V1(c)) => match c.endian {
                Some(Endianness::Little) => true,
                Some(Endianness::Big) | None => elem_size == 1,
            },
            _ => false,
        }
}

/// Parse any Zarr v3 array's `zarr.json` with zarrs' type (`path` names it in errors).
pub fn parse_metadata(path: &Path, bytes: &[u8]) -> Result<ArrayMetadataV3> {
    serde_json::from_slice(bytes).map_err(|e| {
        let what = if e.is_eof() {
            "truncated"
        } else {
            "not a Zarr v3 array's"
        };
        Error::cache(path, format!("{what} metadata ({e})"))
    })
}

impl ArrayLayout {
    /// Parse `bytes` of an array's `zarr.json` (`path` names it in errors).
    pub fn from_json(path: &Path, bytes: &[u8]) -> Result<ArrayLayout> {
        let bad = |m: String| Error::cache(path, m);
        let meta = parse_metadata(path, bytes)?;
        // A leading channel axis: split off here, and each chunk must hold one channel.
        let (channels, spatial) = match meta.shape.as_slice() {
            [c, rest @ ..] if rest.len() == 3 => (
                Some(usize::try_from(*c).map_err(|_| bad(format!("{c} channels")))?),
                rest,
            ),
            all => (None, all),
        };
        let shape = dims3(spatial, false).ok_or_else(|| {
            bad(format!(
                "shape {:?} is neither (z, y, x) nor (c, z, y, x)",
                meta.shape
            ))
        })?;
        let lead = channels.is_some() as usize;
        // The spatial part of a chunk shape, the channel side (1) checked off.
        let spatial3 = |v: &[std::num::NonZeroU64]| -> Option<[usize; 3]> {
            if lead == 1 && v.first().map(|n| n.get()) != Some(1) {
                return None;
            }
            dims3(v.get(lead..)?, true)
        };
        let dtype = Dtype::from_zarr(meta.data_type.name()).ok_or_else(|| {
            bad(format!(
                "data type {:?} is not one voxcache writes (float32, float16, uint8, uint16, uint32)",
                meta.data_type.name()
            ))
        })?;
        let es = dtype.size();
        let block = match meta.chunk_grid.name() {
            "regular" => meta
                .chunk_grid
                .to_typed_configuration::<RegularChunkGridConfiguration>()
                .ok()
                .and_then(|c| spatial3(&c.chunk_shape)),
            _ => None,
        }
        .ok_or_else(|| {
            bad(
                "the chunk grid is not regular with three positive sides (after a channel side of 1)"
                    .into(),
            )
        })?;
        let (default_keys, separator) = match meta.chunk_key_encoding.name() {
            "default" => {
                // No configuration: the spec's "/"; one that does not read is refused, not
                // taken as "/".
                let sep = match meta.chunk_key_encoding.configuration() {
                    None => ChunkKeySeparator::Slash,
                    Some(_) => meta
                        .chunk_key_encoding
                        .to_typed_configuration::<DefaultChunkKeyEncodingConfiguration>()
                        .map(|c| c.separator)
                        .map_err(|e| bad(format!("chunk_key_encoding: {e}")))?,
                };
                (true, sep)
            }
            _ => (false, ChunkKeySeparator::Slash),
        };
        let separator = match separator {
            ChunkKeySeparator::Dot => '.',
            _ => '/',
        };
        let zero_fill = meta.fill_value.as_f64().is_some_and(|v| v == 0.0)
            || meta.fill_value.as_u64() == Some(0);

        let sharding = match meta.codecs.as_slice() {
            [c] if c.name() == "sharding_indexed" => Some(
                c.to_typed_configuration::<ShardingCodecConfiguration>()
                    .map_err(|e| bad(format!("sharding configuration: {e}")))?,
            ),
            _ => None,
        };
        let (chunk, encoding) = match sharding {
            None => {
                let raw = matches!(meta.codecs.as_slice(), [c] if is_le_bytes(c, es));
                (
                    block,
                    if raw {
                        Encoding::Raw
                    } else {
                        Encoding::Encoded
                    },
                )
            }
            Some(ShardingCodecConfiguration::V1(cfg)) => {
                let inner = spatial3(&cfg.chunk_shape).ok_or_else(|| {
                    bad("sharding chunk_shape is not three positive sides (after a channel side of 1)".into())
                })?;
                let inner_raw = matches!(cfg.codecs.as_slice(), [c] if is_le_bytes(c, es));
                let crc = match cfg.index_codecs.as_slice() {
                    [b] if is_le_bytes(b, 8) => Some(false),
                    [b, c] if is_le_bytes(b, 8) && c.name() == "crc32c" => Some(true),
                    _ => None,
                };
                let at_end = cfg.index_location == ShardingIndexLocation::End;
                let encoding = match crc {
                    Some(index_crc32c) => Encoding::Sharded {
                        index_at_end: at_end,
                        index_crc32c,
                        inner_raw,
                    },
                    None => Encoding::Encoded,
                };
                (inner, encoding)
            }
            Some(_) => return Err(bad("unknown sharding configuration version".into())),
        };
        if (0..3).any(|a| block[a] % chunk[a] != 0) {
            return Err(bad(format!(
                "shard shape {block:?} is not a whole multiple of its chunk shape {chunk:?}"
            )));
        }
        Ok(ArrayLayout {
            channels,
            shape,
            dtype,
            block,
            chunk,
            default_keys,
            separator,
            zero_fill,
            encoding,
        })
    }

    /// Read and parse `dir/zarr.json`; `what` names the array in the error when it is missing.
    pub fn read(dir: &Path) -> Result<ArrayLayout> {
        let path = dir.join(ZARR_JSON);
        // A regular file of bounded size: a link (to /etc/passwd, /dev/zero) is refused.
        let bytes = crate::util::files::read_capped_unlinked(&path, 16 << 20).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::cache(&path, "the array's metadata is missing")
            } else {
                Error::io(&path, e)
            }
        })?;
        ArrayLayout::from_json(&path, &bytes)
    }

    /// Whether files can be memory-mapped and chunks found in them without zarrs: plain raw
    /// chunk files, or shards (whose inner chunks are copied from, or decoded on their own).
    pub fn mappable(&self) -> bool {
        self.encoding != Encoding::Encoded && self.zero_fill && self.default_keys
    }

    /// Chunks per block (shard) along each axis.
    pub fn per_block(&self) -> [usize; 3] {
        [0, 1, 2].map(|a| self.block[a] / self.chunk[a])
    }

    /// Blocks (files) per axis.
    pub fn block_grid(&self) -> [usize; 3] {
        [0, 1, 2].map(|a| self.shape[a].div_ceil(self.block[a]))
    }

    /// The file of block `b` (of channel `channel` of a 4-D array), relative to the array's
    /// folder.
    pub fn block_key(&self, channel: Option<usize>, b: [usize; 3]) -> String {
        let s = self.separator;
        match channel {
            Some(c) => format!("c{s}{c}{s}{}{s}{}{s}{}", b[0], b[1], b[2]),
            None => format!("c{s}{}{s}{}{s}{}", b[0], b[1], b[2]),
        }
    }
}
