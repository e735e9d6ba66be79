//! Shards of compressed inner chunks read without zarrs' store: the shard is mapped (once, in
//! the shared map cache), its index validated, and each inner chunk a patch touches decoded on
//! its own by the array's inner codecs (the compressor, then the CRC-32C of the stored bytes,
//! checked on every decode) straight from the mapped bytes. A patch decodes only the inner
//! chunks its footprint covers; no system call once the shard is mapped.

use std::borrow::Cow;
use std::num::NonZeroU64;
use std::path::Path;

use zarrs::array::codec::CodecChain;
use zarrs::array::{Array, ArrayBytes, ArrayToBytesCodecTraits, CodecOptions, DataType, FillValue};
use zarrs::metadata::v3::MetadataV3;
use zarrs::metadata_ext::codec::sharding::ShardingCodecConfiguration;

use super::{ArrayReader, Decoded, MappedBlock, Source, EMPTY};
use crate::cache::store::ReadStore;
use crate::error::{Error, Result};

/// What decoding one inner chunk needs: the codecs inside the shard and the chunk's
/// representation.
pub(crate) struct InnerCodecs {
    chain: CodecChain,
    /// The inner chunk's shape as zarrs sees it (with the channel side of 1 of a 4-D array).
    shape: Vec<NonZeroU64>,
    data_type: DataType,
    fill_value: FillValue,
}

impl InnerCodecs {
    /// The inner codecs of `array`'s sharding codec (`meta_path` names it in errors).
    pub(crate) fn of(array: &Array<ReadStore>, meta_path: &Path) -> Result<InnerCodecs> {
        let bad = |m: String| Error::cache(meta_path, m);
        let codecs: Vec<MetadataV3> = match array.metadata() {
            zarrs::array::ArrayMetadata::V3(m) => m.codecs.clone(),
            _ => return Err(bad("not a Zarr v3 array".into())),
        };
        let cfg = match codecs.as_slice() {
            [c] if c.name() == "sharding_indexed" => c
                .to_typed_configuration::<ShardingCodecConfiguration>()
                .map_err(|e| bad(format!("sharding configuration: {e}")))?,
            _ => return Err(bad("the array is not sharded".into())),
        };
        let ShardingCodecConfiguration::V1(cfg) = cfg else {
            return Err(bad("unknown sharding configuration version".into()));
        };
        let chain = CodecChain::from_metadata(&cfg.codecs)
            .map_err(|e| bad(format!("inner codecs: {e}")))?;
        Ok(InnerCodecs {
            chain,
            shape: cfg.chunk_shape.clone(),
            data_type: array.data_type().clone(),
            fill_value: array.fill_value().clone(),
        })
    }
}

impl ArrayReader {
    /// Decode inner chunk `inner` (its place in the shard) of the mapped shard `block`, or
    /// `None` when the shard does not hold it (all fill value).
    pub(crate) fn decode_inner(
        &self,
        block: &MappedBlock,
        b: [usize; 3],
        inner: [usize; 3],
    ) -> Result<Option<Decoded>> {
        let Source::Packed { inner: codecs, .. } = &self.source else {
            return Err(Error::cache(
                &self.dir,
                "array is not a mapped compressed one",
            ));
        };
        let offsets = block.inner.as_deref().unwrap_or_default();
        let Some(&[off, len]) = offsets.get(super::ravel(inner, self.per_block)) else {
            return Err(Error::cache(&self.dir, "shard without an index"));
        };
        if off == EMPTY {
            return Ok(None);
        }
        // map_block checked that the range lies inside the shard's data.
        let stored = &block.map[off as usize..(off + len) as usize];
        let damaged = |e: String| {
            Error::cache(
                self.block_path(b),
                format!(
                    "cannot decode {} inner chunk {inner:?}: {e}: the cache is damaged (prep inspect --verify)",
                    self.what
                ),
            )
        };
        let bytes = codecs
            .chain
            .decode(
                Cow::Borrowed(stored),
                &codecs.shape,
                &codecs.data_type,
                &codecs.fill_value,
                &CodecOptions::default(),
            )
            .map_err(|e| damaged(e.to_string()))?;
        let mut bytes = match bytes {
            ArrayBytes::Fixed(b) => b.into_owned(),
            _ => return Err(damaged("not fixed-size elements".into())),
        };
        if bytes.len() != self.chunk_bytes {
            return Err(damaged(format!(
                "decoded to {} bytes, expected {}",
                bytes.len(),
                self.chunk_bytes
            )));
        }
        // zarrs decodes to native byte order; rows are copied out as little-endian.
        let es = self.dtype.size();
        if cfg!(target_endian = "big") && es > 1 {
            bytes.chunks_exact_mut(es).for_each(|e| e.reverse());
        }
        Ok(Some(Decoded {
            bytes,
            dims: self.chunk,
        }))
    }
}
