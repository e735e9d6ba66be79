//! The chunk caches shared by every entry a [`super::CacheReader`] opens: mapped files
//! (bounded by count) and decoded chunks (bounded by bytes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::array::{Decoded, MappedBlock};
use super::lru::Lru;
use crate::error::Result;

/// How entries are read.
#[derive(Clone, Debug)]
pub struct ReaderOptions {
    /// Memory-map uncompressed chunks (the fast path). `false` decodes every array through
    /// zarrs, as for compressed caches (for comparisons).
    pub mmap: bool,
    /// The most files kept mapped at once, over all entries sharing the [`ChunkCache`].
    pub max_maps: usize,
    /// Bytes of decoded (compressed) chunks kept, over all entries sharing the cache.
    pub decoded_cache_bytes: usize,
    /// `None` (the default): the maps' pages are the kernel's to manage. They are clean page
    /// cache, not anonymous memory: reclaimed under pressure, read again when next touched,
    /// never what the OOM killer weighs. `Some(bytes)`, the strict mode for machines that
    /// bill page cache (see docs/usage.md, "Memory"): once reads have brought that many bytes
    /// into the maps (counted in the kernel's 64 KiB fault-around windows, each once), the
    /// least recently used maps hand their pages back, so the resident set stays flat
    /// whatever the cache's size, at the cost of faulting pages in again (a patch read from a
    /// cache larger than the budget spends about half its time in the kernel).
    pub mapped_resident_bytes: Option<u64>,
    /// Where a block file the cache folder lacks comes from: nowhere for a complete folder
    /// (the default), the bucket for the local tier of a cache on S3.
    pub blocks: crate::cache::store::Blocks,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            mmap: true,
            max_maps: 4096,
            decoded_cache_bytes: 256 << 20,
            mapped_resident_bytes: None,
            blocks: Default::default(),
        }
    }
}

/// The strict mode's resident set moves within `1/BAND` of its limit, below and above: the
/// maps are counted every `limit/BAND` bytes read, and trimmed to `limit - limit/BAND`.
const BAND: u64 = 16;

/// (entry serial, array id, chunk or file index)
pub(super) type Key = (u64, u16, usize);

struct Shared {
    options: ReaderOptions,
    /// `None`: the file does not exist (all fill value); remembered so it is not looked up again.
    maps: Mutex<Lru<Key, Option<Arc<MappedBlock>>>>,
    /// `None`: an inner chunk its shard does not hold (all fill value).
    decoded: Mutex<Lru<Key, Option<Arc<Decoded>>>>,
    /// Bytes the maps' pages may have grown by since the maps were last counted.
    growth_since_count: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Mapped files and decoded chunks, shared by the entries opened with it. Cloning shares.
#[derive(Clone)]
pub struct ChunkCache {
    shared: Arc<Shared>,
}

/// What a [`ChunkCache`] holds right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkCacheStats {
    /// Files (chunks or shards) mapped, or remembered as absent.
    pub mapped_files: usize,
    /// Decoded chunks kept.
    pub decoded_chunks: usize,
    /// Bytes of the decoded chunks kept.
    pub decoded_bytes: usize,
}

impl ChunkCache {
    /// Empty caches, bounded as `options` say.
    pub fn new(options: ReaderOptions) -> Self {
        ChunkCache {
            shared: Arc::new(Shared {
                maps: Mutex::new(Lru::new(options.max_maps.max(1))),
                decoded: Mutex::new(Lru::new(options.decoded_cache_bytes)),
                growth_since_count: AtomicU64::new(0),
                options,
            }),
        }
    }

    /// The options the caches were made with.
    pub fn options(&self) -> &ReaderOptions {
        &self.shared.options
    }

    /// What the caches hold right now.
    pub fn stats(&self) -> ChunkCacheStats {
        let maps = lock(&self.shared.maps);
        let decoded = lock(&self.shared.decoded);
        ChunkCacheStats {
            mapped_files: maps.len(),
            decoded_chunks: decoded.len(),
            decoded_bytes: decoded.used(),
        }
    }

    /// The mapped file (or its absence) under `key`, mapping it with `map` on a miss. Mapped
    /// outside the lock: a racing thread maps the same file at worst.
    pub(super) fn mapped(
        &self,
        key: Key,
        map: impl FnOnce() -> Result<Option<Arc<MappedBlock>>>,
    ) -> Result<Option<Arc<MappedBlock>>> {
        if let Some(slot) = lock(&self.shared.maps).get(&key) {
            return Ok(slot);
        }
        let slot = map()?;
        lock(&self.shared.maps).insert(key, slot.clone(), 1);
        Ok(slot)
    }

    /// Whether reads count the pages they bring into the maps (strict mode).
    pub(super) fn counts_mapped_pages(&self) -> bool {
        self.shared.options.mapped_resident_bytes.is_some()
    }

    /// Count `bytes` that reads may have added to the maps' resident pages
    /// ([`super::array::MappedBlock::touch`]), in strict mode. Every `1/BAND` of
    /// [`ReaderOptions::mapped_resident_bytes`] of growth, the maps' resident bytes are summed;
    /// past the limit, the least recently used maps hand their pages back (clean file pages,
    /// read again from the page cache when next touched) until `1 - 1/BAND` of it remain, so
    /// a long run over a large cache keeps a flat resident set, and the volumes patches keep
    /// coming back to keep their pages. The narrower the band, the flatter the set and the
    /// more of it kept on average: down to three quarters, a case just above the limit
    /// refaulted more (-3% patches per second against seven eighths).
    pub(super) fn note_mapped_growth(&self, bytes: u64) {
        let Some(limit) = self.shared.options.mapped_resident_bytes else {
            return;
        };
        if bytes == 0 {
            return;
        }
        let since = &self.shared.growth_since_count;
        if since.fetch_add(bytes, Ordering::Relaxed) + bytes < limit / BAND {
            return;
        }
        since.store(0, Ordering::Relaxed);
        let maps = lock(&self.shared.maps);
        let mut total = 0;
        maps.for_each_value(|m| total += m.as_ref().map_or(0, |m| m.resident()));
        if total <= limit {
            return;
        }
        let keep = limit - limit / BAND;
        maps.for_each_oldest_first(|m| {
            if let Some(m) = m {
                total -= m.release().min(total);
            }
            total > keep
        });
    }

    /// The bytes the mapped files may hold resident (what reads touched since each map's pages
    /// were last handed back, in fault-around windows).
    pub fn mapped_resident_bytes(&self) -> u64 {
        let mut total = 0;
        lock(&self.shared.maps).for_each_value(|m| total += m.as_ref().map_or(0, |m| m.resident()));
        total
    }

    /// The decoded chunk under `key`, decoding it with `decode` on a miss (outside the lock).
    pub(super) fn decoded(
        &self,
        key: Key,
        decode: impl FnOnce() -> Result<Arc<Decoded>>,
    ) -> Result<Arc<Decoded>> {
        if let Some(Some(d)) = self.decoded_hit(key) {
            return Ok(d);
        }
        let d = decode()?;
        self.insert_decoded(key, Some(d.clone()));
        Ok(d)
    }

    /// The decoded chunk under `key` if the cache holds it (`Some(None)`: known to be all
    /// fill value).
    pub(super) fn decoded_hit(&self, key: Key) -> Option<Option<Arc<Decoded>>> {
        lock(&self.shared.decoded).get(&key)
    }

    /// Keep a decoded chunk (or the fact that it is all fill value) under `key`.
    pub(super) fn insert_decoded(&self, key: Key, d: Option<Arc<Decoded>>) {
        let cost = d.as_ref().map_or(1, |d| d.bytes.len().max(1));
        lock(&self.shared.decoded).insert(key, d, cost);
    }

    /// Forget everything an entry put here (when its last reader is dropped).
    pub(super) fn purge(&self, entry: u64) {
        lock(&self.shared.maps).retain(|k| k.0 != entry);
        lock(&self.shared.decoded).retain(|k| k.0 != entry);
    }
}

impl std::fmt::Debug for ChunkCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkCache")
            .field("options", &self.shared.options)
            .field("stats", &self.stats())
            .finish()
    }
}
