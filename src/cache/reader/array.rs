//! One array of an entry (`image`, one of its channels, `label`, a derived array): its
//! metadata, where each chunk's bytes live and how to get at them, memory-mapped
//! ([`mapped`]) or decoded through zarrs, each block checked against what the build
//! recorded ([`recorded`]).

mod mapped;
mod packed;
mod recorded;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use zarrs::array::{
    Array, ArrayBytes, ArrayShardedReadableExt, ArrayShardedReadableExtCache, CodecOptions,
};

pub(crate) use self::mapped::MappedBlock;
pub(crate) use self::packed::InnerCodecs;
pub(crate) use self::recorded::Recorded;
use super::sample::StoredDtype;
use super::ReaderOptions;
use crate::cache::store::{Blocks, ReadStore};
use crate::error::{Error, Result};
use crate::format::{ArrayLayout, Encoding, ZARR_JSON};

/// An inner chunk that a shard does not hold (all fill value).
const EMPTY: u64 = u64::MAX;

/// A chunk decoded by zarrs, little-endian, C order over `dims`.
pub(crate) struct Decoded {
    pub(crate) bytes: Vec<u8>,
    pub(crate) dims: [usize; 3],
}

/// A chunk while a patch is copied out of it.
pub(crate) enum Held {
    /// Not stored: every element is the fill value (zero).
    Fill,
    Mapped(Arc<MappedBlock>, [usize; 3]),
    Decoded(Arc<Decoded>),
}

impl Held {
    /// The chunk's bytes and the dimensions they are laid out in.
    pub(crate) fn view(&self, arr: &ArrayReader) -> Option<(&[u8], [usize; 3])> {
        match self {
            Held::Fill => None,
            Held::Mapped(block, inner) => {
                let start = match &block.inner {
                    None => 0,
                    Some(offsets) => {
                        let [o, _] = offsets[ravel(*inner, arr.per_block)];
                        if o == EMPTY {
                            return None;
                        }
                        o as usize
                    }
                };
                Some((&block.map[start..start + arr.chunk_bytes], arr.chunk))
            }
            Held::Decoded(d) => Some((&d.bytes, d.dims)),
        }
    }
}

/// How a shard's index is stored (zarr `sharding_indexed` with a little-endian `bytes` index).
#[derive(Clone, Copy, Debug)]
pub(crate) struct IndexFormat {
    at_end: bool,
    crc32c: bool,
}

pub(crate) enum Source {
    /// Uncompressed little-endian chunks: plain chunk files, or shards of them.
    Mapped { index: Option<IndexFormat> },
    /// Shards of compressed inner chunks: the shard file is mapped and its index read from
    /// the mapping; each inner chunk a read touches is decoded on its own (its CRC-32C
    /// checked) into the decoded-chunk cache. No system call, and nothing else decoded.
    Packed {
        index: IndexFormat,
        inner: Box<InnerCodecs>,
    },
    /// Anything else (compressed, or mapping turned off): decoded chunk by chunk by zarrs.
    Zarrs {
        array: Box<Array<ReadStore>>,
        shards: Box<ArrayShardedReadableExtCache>,
    },
}

/// The whole of what the reader needs to know about one array.
pub(crate) struct ArrayReader {
    /// Distinguishes the arrays of one entry in the shared caches.
    pub(crate) id: u16,
    pub(crate) name: &'static str,
    /// The channel of a (c, z, y, x) array this reader reads; `None` for a 3-D array.
    pub(crate) channel: Option<usize>,
    /// How errors name the array: "image", "image channel 1", "label".
    pub(crate) what: String,
    pub(crate) dir: PathBuf,
    pub(crate) dtype: StoredDtype,
    pub(crate) shape: [usize; 3],
    /// The unit a patch is copied from: the chunk, or the inner chunk of a shard.
    pub(crate) chunk: [usize; 3],
    pub(crate) chunk_bytes: usize,
    /// Chunks per file (shard); [1, 1, 1] when not sharded.
    pub(crate) per_block: [usize; 3],
    /// Files (chunks or shards) per axis.
    pub(crate) block_grid: [usize; 3],
    layout: ArrayLayout,
    pub(crate) source: Source,
    /// What the build recorded per write block (the entry's checksums), to refuse a missing
    /// or altered chunk instead of reading zeros or wrong values.
    recorded: Recorded,
    /// Decoded (compressed) shards already checked against `recorded`.
    verified: std::sync::Mutex<std::collections::HashSet<[usize; 3]>>,
    /// Where a block file the folder lacks comes from.
    pub(crate) blocks: Blocks,
}

pub(crate) fn ravel(idx: [usize; 3], dims: [usize; 3]) -> usize {
    (idx[0] * dims[1] + idx[1]) * dims[2] + idx[2]
}

fn product(dims: [usize; 3]) -> Option<usize> {
    dims[0].checked_mul(dims[1])?.checked_mul(dims[2])
}

impl ArrayReader {
    /// Read `entry/name/zarr.json` and decide how chunks are reached: one reader for a 3-D
    /// array, one per channel for a (c, z, y, x) one (ids `first_id`, `first_id + 1`...).
    /// `channels` is how many the entry records (`None`: the array must be 3-D).
    pub(crate) fn open_channels(
        entry: &Path,
        name: &'static str,
        first_id: u16,
        expect_shape: [usize; 3],
        channels: Option<usize>,
        opts: &ReaderOptions,
    ) -> Result<Vec<ArrayReader>> {
        let meta_path = entry.join(name).join(ZARR_JSON);
        let first = Self::open(
            entry,
            name,
            first_id,
            expect_shape,
            opts,
            channels.map(|_| 0),
        )?;
        let got = first.layout.channels;
        if got != channels {
            let say = |c: Option<usize>| match c {
                None => "3-D (z, y, x)".to_string(),
                Some(c) => format!("(c, z, y, x) with {c} channels"),
            };
            return Err(Error::cache(
                &meta_path,
                format!(
                    "array {name:?} is {} but the entry records {}",
                    say(got),
                    say(channels)
                ),
            ));
        }
        let mut all = vec![first];
        for c in 1..channels.unwrap_or(1) {
            let id = first_id
                .checked_add(u16::try_from(c).unwrap_or(u16::MAX))
                .ok_or_else(|| Error::cache(&meta_path, format!("{name}: too many channels")))?;
            all.push(Self::open(entry, name, id, expect_shape, opts, Some(c))?);
        }
        if all.len() > 1 {
            for (c, a) in all.iter_mut().enumerate() {
                a.what = format!("{name} channel {c}");
            }
        }
        Ok(all)
    }

    /// One reader: of the 3-D array `name`, or of channel `channel` of a 4-D one.
    fn open(
        entry: &Path,
        name: &'static str,
        id: u16,
        expect_shape: [usize; 3],
        opts: &ReaderOptions,
        channel: Option<usize>,
    ) -> Result<ArrayReader> {
        let mmap = opts.mmap;
        let dir = entry.join(name);
        let meta_path = dir.join(ZARR_JSON);
        let layout = ArrayLayout::read(&dir).map_err(|e| match e {
            Error::Cache { message, .. } if !meta_path.exists() => Error::cache(
                &meta_path,
                format!("array {name:?} is missing from the entry ({message})"),
            ),
            e => e,
        })?;
        let bad = |msg: String| Error::cache(&meta_path, msg);
        let shape = layout.shape;
        if shape != expect_shape {
            return Err(bad(format!(
                "array shape {shape:?} differs from the entry's output shape {expect_shape:?}"
            )));
        }
        let dtype = layout.dtype;
        let es = dtype.size();
        let (outer, chunk) = (layout.block, layout.chunk);
        let per_block = layout.per_block();
        let chunk_bytes = product(chunk)
            .and_then(|n| n.checked_mul(es))
            .filter(|&n| n < isize::MAX as usize)
            .ok_or_else(|| bad(format!("chunk shape {chunk:?} is too large")))?;
        product(per_block)
            .and_then(|n| n.checked_mul(16))
            .ok_or_else(|| bad(format!("shard shape {outer:?} is too large")))?;

        let source = match layout.encoding {
            Encoding::Raw if mmap && layout.mappable() => Source::Mapped { index: None },
            Encoding::Sharded {
                index_at_end,
                index_crc32c,
                inner_raw,
            } if mmap && layout.mappable() => {
                let index = IndexFormat {
                    at_end: index_at_end,
                    crc32c: index_crc32c,
                };
                if inner_raw {
                    Source::Mapped { index: Some(index) }
                } else {
                    let array = Array::open(
                        super::super::store::open_readable(entry)?,
                        &format!("/{name}"),
                    )
                    .map_err(|e| Error::zarr(&dir, e))?;
                    Source::Packed {
                        index,
                        inner: Box::new(InnerCodecs::of(&array, &meta_path)?),
                    }
                }
            }
            _ => {
                let array = Array::open(
                    super::super::store::open_readable(entry)?,
                    &format!("/{name}"),
                )
                .map_err(|e| Error::zarr(&dir, e))?;
                let shards = ArrayShardedReadableExtCache::new(&array);
                Source::Zarrs {
                    array: Box::new(array),
                    shards: Box::new(shards),
                }
            }
        };
        Ok(ArrayReader {
            id,
            name,
            channel,
            what: name.to_string(),
            dir,
            dtype,
            shape,
            chunk,
            chunk_bytes,
            per_block,
            block_grid: layout.block_grid(),
            layout,
            source,
            recorded: Recorded::default(),
            verified: Default::default(),
            blocks: opts.blocks.clone(),
        })
    }

    /// The array's write block and chunk shapes (z, y, x) as its metadata says.
    pub(crate) fn block_and_chunk(&self) -> ([usize; 3], [usize; 3]) {
        (self.layout.block, self.layout.chunk)
    }

    /// Bytes of one write block (chunk, or whole shard) decoded, as the checksums hash them.
    pub(crate) fn block_bytes(&self) -> usize {
        self.layout.block.iter().product::<usize>() * self.dtype.size()
    }

    /// Check blocks against what the build recorded from now on.
    pub(crate) fn set_recorded(&mut self, recorded: Recorded) {
        self.recorded = recorded;
    }

    /// zarrs' index of chunk (or block) `c`: with the channel first for a 4-D array.
    fn zarr_index(&self, c: [usize; 3]) -> Vec<u64> {
        self.channel
            .map(|ch| ch as u64)
            .into_iter()
            .chain(c.map(|v| v as u64))
            .collect()
    }

    /// The file holding block (chunk or shard) `b`.
    pub(crate) fn block_path(&self, b: [usize; 3]) -> PathBuf {
        self.dir.join(self.layout.block_key(self.channel, b))
    }

    /// The block (file) holding chunk `c`, and the chunk's place inside it.
    pub(crate) fn block_of(&self, c: [usize; 3]) -> ([usize; 3], [usize; 3]) {
        let p = self.per_block;
        (
            [c[0] / p[0], c[1] / p[1], c[2] / p[2]],
            [c[0] % p[0], c[1] % p[1], c[2] % p[2]],
        )
    }

    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self.source, Source::Mapped { .. })
    }

    /// Decode chunk `c` through zarrs (`retrieve_chunk`, or the inner chunk of a shard).
    pub(crate) fn decode_chunk(&self, c: [usize; 3]) -> Result<Decoded> {
        let Source::Zarrs { array, shards } = &self.source else {
            return Err(Error::cache(
                &self.dir,
                "array is memory-mapped, not decoded",
            ));
        };
        let path = || self.block_path(self.block_of(c).0);
        let idx = self.zarr_index(c);
        // Unsharded, a chunk is a write block: a missing file must be a recorded fill block.
        let unsharded = self.per_block == [1, 1, 1];
        if !unsharded {
            self.verify_shard(array, self.block_of(c).0)?;
            // zarrs would read a shard evicted from a budgeted tier as fill values.
            self.blocks.ensure(&path())?;
        }
        if unsharded {
            self.block_present(c, &path())?;
        }
        let bytes = array
            .retrieve_subchunk_opt::<ArrayBytes<'static>>(shards, &idx, &CodecOptions::default())
            .map_err(|e| Error::zarr(path(), e))?;
        let mut bytes = bytes
            .into_fixed()
            .map_err(|e| Error::zarr(path(), e))?
            .into_owned();
        let es = self.dtype.size();
        // zarrs hands back the full chunk; accept one clipped at the array's edge as well.
        let full = self.chunk;
        let clipped = [0, 1, 2].map(|a| full[a].min(self.shape[a].saturating_sub(c[a] * full[a])));
        let dims = if bytes.len() == self.chunk_bytes {
            full
        } else if Some(bytes.len()) == product(clipped).map(|n| n * es) {
            clipped
        } else {
            return Err(Error::zarr(
                path(),
                format!(
                    "decoded chunk {idx:?} holds {} bytes, expected {}",
                    bytes.len(),
                    self.chunk_bytes
                ),
            ));
        };
        // zarrs decodes to native byte order; rows are copied out as little-endian.
        if cfg!(target_endian = "big") && es > 1 {
            for e in bytes.chunks_exact_mut(es) {
                e.reverse();
            }
        }
        if unsharded && dims == full && bytes.len() == self.block_bytes() {
            self.check_hash(c, &bytes, &path())?;
        }
        Ok(Decoded { bytes, dims })
    }
}
