//! What the build recorded per write block (the entry's checksums), and the checks of each
//! block against it when first mapped or decoded: a missing or altered chunk is refused
//! instead of read as zeros or wrong values.

use std::path::Path;

use zarrs::array::{Array, ArrayBytes, CodecOptions};

use super::{ravel, ArrayReader, EMPTY};
use crate::cache::store::ReadStore;
use crate::error::{Error, Result};
use crate::format::ChunkChecksums;

/// The recorded hashes of one array's blocks, and the hash of an all-zero block.
#[derive(Default)]
pub(crate) struct Recorded {
    pub(crate) hashes: std::collections::BTreeMap<String, String>,
    pub(crate) zero: String,
}

impl Recorded {
    /// The hashes of `array` (of its channel `channel`, names without the channel) in `sums`,
    /// for blocks of `block_bytes` decoded bytes.
    pub(crate) fn new(
        sums: &ChunkChecksums,
        array: &str,
        channel: Option<usize>,
        block_bytes: usize,
    ) -> Self {
        let all = sums.of(array).cloned().unwrap_or_default();
        let hashes = match channel {
            None => all,
            Some(c) => {
                let prefix = format!("{c}.");
                all.into_iter()
                    .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_string(), v)))
                    .filter(|(k, _)| k.split('.').count() == 3)
                    .collect()
            }
        };
        Recorded {
            hashes,
            zero: ChunkChecksums::hash(&vec![0u8; block_bytes]),
        }
    }
}

impl ArrayReader {
    /// Whether the build recorded block `b` as all fill value (zarr stores no file for it).
    fn recorded_fill(&self, b: [usize; 3]) -> bool {
        let name = ChunkChecksums::block_name(b.map(|v| v as u64));
        self.recorded.hashes.get(&name) == Some(&self.recorded.zero)
    }

    /// A block whose file is absent: fine when the build recorded it as all fill value (zarr
    /// does not write those), an error when it held data.
    fn absent(&self, b: [usize; 3], path: &Path) -> Result<()> {
        let name = ChunkChecksums::block_name(b.map(|v| v as u64));
        match self.recorded.hashes.get(&name) {
            Some(h) if *h != self.recorded.zero => Err(Error::cache(
                path,
                format!(
                    "{} block {name} is missing, but the build wrote data there: the cache is damaged (prep inspect --verify lists all)",
                    self.what
                ),
            )),
            // The build records every block of the grid it wrote, fill blocks included: a
            // block it did not record (a rewritten chunk grid) is not part of this entry.
            None if !self.recorded.hashes.is_empty() => Err(Error::cache(
                path,
                format!(
                    "{} block {name} is missing and the build recorded no block there: the array's metadata does not match what was built (prep inspect --verify)",
                    self.what
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Whether block `b`'s file is there, never looked at through a link (a cache holds its own
    /// files, and a link may lead anywhere); an absent block must be one the build recorded as
    /// all fill value.
    pub(super) fn block_present(&self, b: [usize; 3], path: &Path) -> Result<bool> {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => Err(Error::cache(
                path,
                "a symbolic link inside a cache entry: refused (the cache holds its own files)",
            )),
            Ok(_) => {
                self.blocks.touch(path);
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // In a tier filled on first read (a cache on S3) the block comes now; one the
                // build recorded as all fill value was never stored, so none is asked for.
                if !self.recorded_fill(b) && self.blocks.fetch_missing(path)? {
                    return Ok(true);
                }
                self.absent(b, path)?;
                Ok(false)
            }
            Err(e) => Err(Error::io(path, e)),
        }
    }

    /// A block's decoded bytes against the recorded hash.
    pub(super) fn check_hash(&self, b: [usize; 3], bytes: &[u8], path: &Path) -> Result<()> {
        self.check_digest(b, ChunkChecksums::hash(bytes), path)
    }

    /// A mapped shard against the recorded hash of its block, which the build took over the
    /// block's dense C-order bytes: rows are hashed in that order straight from the mapping
    /// (an absent inner chunk reads as zeros), so no copy of the shard is made.
    pub(super) fn check_shard(
        &self,
        b: [usize; 3],
        map: &[u8],
        offsets: &[[u64; 2]],
        path: &Path,
    ) -> Result<()> {
        let [pz, py, px] = self.per_block;
        let [cz, cy, cx] = self.chunk;
        let row = cx * self.dtype.size();
        let zeros = vec![0u8; row];
        let mut h = blake3::Hasher::new();
        for iz in 0..pz {
            for z in 0..cz {
                for iy in 0..py {
                    for y in 0..cy {
                        for ix in 0..px {
                            let [o, _] = offsets[ravel([iz, iy, ix], self.per_block)];
                            if o == EMPTY {
                                h.update(&zeros);
                            } else {
                                let at = o as usize + (z * cy + y) * row;
                                h.update(&map[at..at + row]);
                            }
                        }
                    }
                }
            }
        }
        let got = h.finalize().to_hex()[..32].to_string();
        self.check_digest(b, got, path)
    }

    /// A block's digest (as [`ChunkChecksums::hash`] gives it) against the recorded one.
    fn check_digest(&self, b: [usize; 3], got: String, path: &Path) -> Result<()> {
        let name = ChunkChecksums::block_name(b.map(|v| v as u64));
        match self.recorded.hashes.get(&name) {
            Some(want) if *want == got => Ok(()),
            Some(want) => Err(Error::cache(
                path,
                format!(
                    "{} block {name}: content hash {got} differs from the recorded {want}: the chunk is corrupt (prep inspect --verify lists all)",
                    self.what
                ),
            )),
            None => Err(Error::cache(
                path,
                format!("{} block {name} has no recorded checksum", self.what),
            )),
        }
    }

    /// The first time a chunk of compressed shard `b` is asked for: the whole shard decoded once
    /// and checked against the build's checksum (what the build hashed is the shard's dense
    /// block), or its absence against the record. Memory: one shard, while checked.
    pub(super) fn verify_shard(&self, array: &Array<ReadStore>, b: [usize; 3]) -> Result<()> {
        let lock = || self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if lock().contains(&b) {
            return Ok(());
        }
        let p = self.block_path(b);
        if self.block_present(b, &p)? {
            let idx = self.zarr_index(b);
            let bytes = array
                .retrieve_chunk_opt::<ArrayBytes<'static>>(&idx, &CodecOptions::default())
                .map_err(|e| Error::zarr(&p, e))?
                .into_fixed()
                .map_err(|e| Error::zarr(&p, e))?;
            let mut bytes = bytes.into_owned();
            // Checksums are of little-endian bytes; zarrs decodes to native order.
            let es = self.dtype.size();
            if cfg!(target_endian = "big") && es > 1 {
                bytes.chunks_exact_mut(es).for_each(|e| e.reverse());
            }
            self.check_hash(b, &bytes, &p)?;
        }
        lock().insert(b);
        Ok(())
    }
}
