//! One array of an entry (`image` or `label`): its metadata, where each chunk's bytes live and
//! how to get at them, memory-mapped or decoded through zarrs.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::Mmap;
use zarrs::array::{
    Array, ArrayBytes, ArrayShardedReadableExt, ArrayShardedReadableExtCache, CodecOptions,
};

use super::sample::StoredDtype;
use crate::cache::store::ReadStore;
use crate::error::{Error, Result};
use crate::format::{ArrayLayout, ChunkChecksums, Encoding};

/// An inner chunk that a shard does not hold (all fill value).
const EMPTY: u64 = u64::MAX;

/// The kernel maps a file's cached pages around a faulting page in aligned windows of this
/// size (`fault_around_bytes`, 64 KiB by default), so what a read adds to the resident set is
/// counted in these windows, not in the bytes read.
const RESIDENT_WINDOW_SHIFT: u32 = 16;

/// One chunk file, or one shard file with its validated index, mapped read-only.
pub(crate) struct MappedBlock {
    map: Mmap,
    /// Byte offset of each inner chunk (C order) of a shard, [`EMPTY`] for an absent one;
    /// `None` for a plain chunk file (the chunk starts at 0).
    inner: Option<Box<[u64]>>,
    /// One bit per fault-around window the mapping overlaps (counted from the window holding
    /// its first byte): touched by a read since the pages were last handed back.
    touched: Box<[AtomicU64]>,
    /// The bytes of those windows: what the mapping may hold resident.
    resident: AtomicU64,
}

impl MappedBlock {
    fn new(map: Mmap, inner: Option<Box<[u64]>>) -> Self {
        let windows = Self::window_of(&map, map.len().saturating_sub(1)) + 1;
        let touched = (0..windows.div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect();
        MappedBlock {
            map,
            inner,
            touched,
            resident: AtomicU64::new(0),
        }
    }

    /// The window (of [`RESIDENT_WINDOW_SHIFT`]) holding byte `at` of the mapping, counted
    /// from the window of its first byte: windows are aligned in the address space.
    fn window_of(map: &Mmap, at: usize) -> usize {
        let base = map.as_ptr() as usize;
        ((base + at) >> RESIDENT_WINDOW_SHIFT) - (base >> RESIDENT_WINDOW_SHIFT)
    }

    /// The bytes of window `w` inside the mapping (whole pages): a window is the most the
    /// kernel maps around a fault, never past the mapping's ends.
    fn window_bytes(&self, w: usize) -> u64 {
        let base = self.map.as_ptr() as usize;
        let end = base + self.map.len().div_ceil(4096) * 4096;
        let start = ((base >> RESIDENT_WINDOW_SHIFT) + w) << RESIDENT_WINDOW_SHIFT;
        let stop = start + (1 << RESIDENT_WINDOW_SHIFT);
        (stop.min(end) - start.max(base)) as u64
    }

    /// Note that a read touches `part` (a slice of this mapping); returns the bytes of the
    /// windows it touches for the first time since the last [`MappedBlock::release`]: an upper
    /// bound on what the read adds to the resident set. Re-reading resident pages adds nothing,
    /// so the hand-back follows the pages actually brought in, not the bytes copied.
    pub(crate) fn touch(&self, part: &[u8]) -> u64 {
        if part.is_empty() {
            return 0;
        }
        let at = part.as_ptr() as usize - self.map.as_ptr() as usize;
        debug_assert!(at + part.len() <= self.map.len(), "a slice of the mapping");
        let (first, last) = (
            Self::window_of(&self.map, at),
            Self::window_of(&self.map, at + part.len() - 1),
        );
        let mut new = 0;
        for w in first..=last {
            let (word, bit) = (&self.touched[w / 64], 1u64 << (w % 64));
            // A load first: the common case (already touched) writes nothing shared.
            if word.load(Ordering::Relaxed) & bit == 0
                && word.fetch_or(bit, Ordering::Relaxed) & bit == 0
            {
                new += self.window_bytes(w);
            }
        }
        if new > 0 {
            self.resident.fetch_add(new, Ordering::Relaxed);
        }
        new
    }

    /// The bytes of the windows touched since the last release.
    pub(crate) fn resident(&self) -> u64 {
        self.resident.load(Ordering::Relaxed)
    }

    /// How many windows the mapping overlaps.
    #[cfg(test)]
    fn window_count(&self) -> usize {
        Self::window_of(&self.map, self.map.len() - 1) + 1
    }

    /// Hand the mapping's resident pages back to the system; they come back from the page
    /// cache when next touched. Returns the bytes [`MappedBlock::resident`] counted.
    pub(crate) fn release(&self) -> u64 {
        // SAFETY: a shared, read-only mapping of an immutable entry file: dropped pages are
        // read again, unchanged, from the file, by any thread.
        let _ = unsafe {
            self.map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        };
        for w in self.touched.iter() {
            w.store(0, Ordering::Relaxed);
        }
        self.resident.swap(0, Ordering::Relaxed)
    }
}

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
                        let o = offsets[ravel(*inner, arr.per_block)];
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
    /// What the build recorded per write block (`voxcache_chunks.json`), to refuse a missing
    /// or altered chunk instead of reading zeros or wrong values.
    recorded: Recorded,
    /// Decoded (compressed) shards already checked against `recorded`.
    verified: std::sync::Mutex<std::collections::HashSet<[usize; 3]>>,
}

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
        mmap: bool,
    ) -> Result<Vec<ArrayReader>> {
        let meta_path = entry.join(name).join("zarr.json");
        let first = Self::open(
            entry,
            name,
            first_id,
            expect_shape,
            mmap,
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
            all.push(Self::open(entry, name, id, expect_shape, mmap, Some(c))?);
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
        mmap: bool,
        channel: Option<usize>,
    ) -> Result<ArrayReader> {
        let dir = entry.join(name);
        let meta_path = dir.join("zarr.json");
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
            Encoding::ShardedRaw {
                index_at_end,
                index_crc32c,
            } if mmap && layout.mappable() => Source::Mapped {
                index: Some(IndexFormat {
                    at_end: index_at_end,
                    crc32c: index_crc32c,
                }),
            },
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
        })
    }

    /// Bytes of one write block (chunk, or whole shard) decoded, as the checksums hash them.
    pub(crate) fn block_bytes(&self) -> usize {
        self.layout.block.iter().product::<usize>() * self.dtype.size()
    }

    /// Check blocks against what the build recorded from now on.
    pub(crate) fn set_recorded(&mut self, recorded: Recorded) {
        self.recorded = recorded;
    }

    /// A block whose file is absent: fine when the build recorded it as all fill value (zarr
    /// does not write those), an error when it held data.
    fn absent(&self, b: [usize; 3], path: &std::path::Path) -> Result<()> {
        let name = ChunkChecksums::block_name(b.map(|v| v as u64));
        match self.recorded.hashes.get(&name) {
            Some(h) if *h != self.recorded.zero => Err(Error::cache(
                path,
                format!(
                    "{} block {name} is missing, but the build wrote data there: the cache is damaged (prep inspect --verify lists all)",
                    self.what
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Whether block `b`'s file is there, never looked at through a link (a cache holds its own
    /// files, and a link may lead anywhere); an absent block must be one the build recorded as
    /// all fill value.
    fn block_present(&self, b: [usize; 3], path: &Path) -> Result<bool> {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => Err(Error::cache(
                path,
                "a symbolic link inside a cache entry: refused (the cache holds its own files)",
            )),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.absent(b, path)?;
                Ok(false)
            }
            Err(e) => Err(Error::io(path, e)),
        }
    }

    /// A block's decoded bytes against the recorded hash.
    fn check_hash(&self, b: [usize; 3], bytes: &[u8], path: &std::path::Path) -> Result<()> {
        self.check_digest(b, ChunkChecksums::hash(bytes), path)
    }

    /// A mapped shard against the recorded hash of its block, which the build took over the
    /// block's dense C-order bytes: rows are hashed in that order straight from the mapping
    /// (an absent inner chunk reads as zeros), so no copy of the shard is made.
    fn check_shard(
        &self,
        b: [usize; 3],
        map: &[u8],
        offsets: &[u64],
        path: &std::path::Path,
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
                            let o = offsets[ravel([iz, iy, ix], self.per_block)];
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
    fn check_digest(&self, b: [usize; 3], got: String, path: &std::path::Path) -> Result<()> {
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

    /// Map block `b` and validate its size (and shard index); `None` if the file does not
    /// exist (every element is the fill value).
    pub(crate) fn map_block(&self, b: [usize; 3]) -> Result<Option<MappedBlock>> {
        let Source::Mapped { index } = &self.source else {
            return Err(Error::cache(&self.dir, "array is not memory-mapped"));
        };
        let path = self.block_path(b);
        if !self.block_present(b, &path)? {
            return Ok(None);
        }
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
        let [cz, cy, cx] = self.chunk;
        let what = format!("{cz}x{cy}x{cx} {}", self.dtype.name());
        let n_inner = self.per_block.iter().product::<usize>();
        let index_len = match index {
            None => {
                if len != self.chunk_bytes as u64 {
                    return Err(Error::cache(
                        &path,
                        format!(
                            "chunk file holds {len} bytes but a {what} chunk is {} bytes: truncated or corrupt",
                            self.chunk_bytes
                        ),
                    ));
                }
                0
            }
            Some(f) => {
                let index_len = n_inner * 16 + if f.crc32c { 4 } else { 0 };
                if len < index_len as u64 {
                    return Err(Error::cache(
                        &path,
                        format!(
                            "shard file holds {len} bytes, less than its {index_len}-byte index: truncated or corrupt"
                        ),
                    ));
                }
                index_len
            }
        };
        // SAFETY: the mapping is read-only and private to this reader. Cache entries are
        // immutable once committed (written into tmp/, then renamed into place), so the file is
        // not modified or truncated while mapped; every access below is bounds-checked against
        // the length validated here.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        if map.len() as u64 != len {
            return Err(Error::cache(&path, "file changed size while being opened"));
        }
        let inner = match index {
            None => None,
            Some(f) => {
                let len = map.len();
                let (ix, data) = if f.at_end {
                    (&map[len - index_len..], 0..len - index_len)
                } else {
                    (&map[..index_len], index_len..len)
                };
                let entries = &ix[..n_inner * 16];
                if f.crc32c {
                    let stored = u32::from_le_bytes([
                        ix[n_inner * 16],
                        ix[n_inner * 16 + 1],
                        ix[n_inner * 16 + 2],
                        ix[n_inner * 16 + 3],
                    ]);
                    if crc32c::crc32c(entries) != stored {
                        return Err(Error::cache(
                            &path,
                            "shard index checksum mismatch: truncated or corrupt shard file",
                        ));
                    }
                }
                let mut offsets = Vec::with_capacity(n_inner);
                for (i, e) in entries.chunks_exact(16).enumerate() {
                    let word = |k: usize| {
                        let mut w = [0u8; 8];
                        w.copy_from_slice(&e[k..k + 8]);
                        u64::from_le_bytes(w)
                    };
                    let (off, nbytes) = (word(0), word(8));
                    if off == EMPTY && nbytes == EMPTY {
                        offsets.push(EMPTY);
                        continue;
                    }
                    if nbytes != self.chunk_bytes as u64 {
                        return Err(Error::cache(
                            &path,
                            format!(
                                "shard index: inner chunk {i} is {nbytes} bytes but a {what} chunk is {} bytes",
                                self.chunk_bytes
                            ),
                        ));
                    }
                    let inside = off >= data.start as u64
                        && off
                            .checked_add(nbytes)
                            .is_some_and(|end| end <= data.end as u64);
                    if !inside {
                        return Err(Error::cache(
                            &path,
                            format!(
                                "shard index: inner chunk {i} (bytes {off}..+{nbytes}) lies outside the shard's data"
                            ),
                        ));
                    }
                    offsets.push(off);
                }
                Some(offsets.into_boxed_slice())
            }
        };
        // Checked once, when mapped: a plain chunk file is its block's decoded bytes; a shard
        // is hashed as the block its inner chunks assemble.
        match &inner {
            None => self.check_hash(b, &map, &path)?,
            Some(offsets) => self.check_shard(b, &map, offsets, &path)?,
        }
        // Hashing touched every page of the file; hand them back so the process keeps only the
        // rows patches read. Without this, each mapped file would stay whole in the resident set.
        let block = MappedBlock::new(map, inner);
        // Nothing counted yet: hashing read the pages, but not through `touch`.
        block.release();
        Ok(Some(block))
    }

    /// The first time a chunk of compressed shard `b` is asked for: the whole shard decoded once
    /// and checked against the build's checksum (what the build hashed is the shard's dense
    /// block), or its absence against the record. Memory: one shard, while checked.
    fn verify_shard(&self, array: &Array<ReadStore>, b: [usize; 3]) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touched_windows_count_once_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c");
        let window = 1usize << RESIDENT_WINDOW_SHIFT;
        std::fs::write(&path, vec![7u8; 5 * window + 100]).unwrap();
        let file = File::open(&path).unwrap();
        // SAFETY: a private file of this test, not modified while mapped.
        let block = MappedBlock::new(unsafe { Mmap::map(&file) }.unwrap(), None);
        let map = &block.map;
        // Windows are aligned in the address space; the mapping starts on a page.
        let skew = (map.as_ptr() as usize) % window;
        let all: u64 = (0..block.window_count())
            .map(|w| block.window_bytes(w))
            .sum();
        assert_eq!(all, (5 * window + 100).div_ceil(4096) as u64 * 4096);
        let w = |k: usize| block.window_bytes(k);
        // One byte: its window. Again: nothing new. Its neighbour in the same window: nothing.
        assert_eq!(block.touch(&map[10..11]), w(0));
        assert_eq!(block.touch(&map[10..11]), 0);
        assert_eq!(block.touch(&map[11..12]), 0);
        // A span from the next window's first byte over two more windows: three windows.
        let next = window - skew;
        assert_eq!(
            block.touch(&map[next..next + 2 * window + 1]),
            w(1) + w(2) + w(3)
        );
        assert_eq!(block.touch(&map[..]), all - w(0) - w(1) - w(2) - w(3));
        assert_eq!(block.touch(&map[..]), 0);
        assert_eq!(block.touch(&map[0..0]), 0);
        assert_eq!(block.resident(), all);
        assert_eq!(block.release(), all);
        assert_eq!(block.resident(), 0);
        assert_eq!(block.touch(&map[..]), all);
        // 5 windows and 100 bytes overlap 6 or 7 aligned windows.
        assert!((6..=7).contains(&block.window_count()));
    }
}
