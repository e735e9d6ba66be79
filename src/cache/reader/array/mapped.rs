//! A memory-mapped block (a chunk file, or a shard with its validated index) and what a read
//! adds to the resident set, counted in the kernel's fault-around windows so that the shared
//! cache can hand pages back when a run reads more than it may keep.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::Mmap;

use super::{ArrayReader, Source, EMPTY};
use crate::error::{Error, Result};

/// The kernel maps a file's cached pages around a faulting page in aligned windows of this
/// size (`fault_around_bytes`, 64 KiB by default), so what a read adds to the resident set is
/// counted in these windows, not in the bytes read.
const RESIDENT_WINDOW_SHIFT: u32 = 16;

/// One chunk file, or one shard file with its validated index, mapped read-only.
pub(crate) struct MappedBlock {
    pub(super) map: Mmap,
    /// Byte offset and length of each inner chunk (C order) of a shard, [`EMPTY`] for an
    /// absent one; `None` for a plain chunk file (the chunk starts at 0).
    pub(super) inner: Option<Box<[[u64; 2]]>>,
    /// One bit per fault-around window the mapping overlaps (counted from the window holding
    /// its first byte): touched by a read since the pages were last handed back.
    touched: Box<[AtomicU64]>,
    /// The bytes of those windows: what the mapping may hold resident.
    resident: AtomicU64,
}

impl MappedBlock {
    fn new(map: Mmap, inner: Option<Box<[[u64; 2]]>>) -> Self {
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

impl ArrayReader {
    /// Map block `b` and validate its size (and shard index); `None` if the file does not
    /// exist (every element is the fill value). An uncompressed block is checked against its
    /// recorded hash, which reads all of it: `strict` (the reader's strict memory mode) hands
    /// those pages back after. Compressed inner chunks are checked when decoded.
    pub(crate) fn map_block(&self, b: [usize; 3], strict: bool) -> Result<Option<MappedBlock>> {
        let (index, packed): (Option<super::IndexFormat>, bool) = match &self.source {
            Source::Mapped { index } => (*index, false),
            Source::Packed { index, .. } => (Some(*index), true),
            Source::Zarrs { .. } => {
                return Err(Error::cache(&self.dir, "array is not memory-mapped"))
            }
        };
        let path = self.block_path(b);
        if !self.block_present(b, &path)? {
            return Ok(None);
        }
        let file = match File::open(&path) {
            // Evicted from a budgeted tier since it was checked: fetched again.
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && self.blocks.fetch_missing(&path)? =>
            {
                File::open(&path)
            }
            other => other,
        }
        .map_err(|e| Error::io(&path, e))?;
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
                        offsets.push([EMPTY, EMPTY]);
                        continue;
                    }
                    if packed && nbytes == 0 {
                        return Err(Error::cache(
                            &path,
                            format!("shard index: inner chunk {i} is 0 bytes"),
                        ));
                    }
                    if !packed && nbytes != self.chunk_bytes as u64 {
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
                    offsets.push([off, nbytes]);
                }
                Some(offsets.into_boxed_slice())
            }
        };
        // Checked once, when mapped: a plain chunk file is its block's decoded bytes; a shard
        // is hashed as the block its inner chunks assemble.
        match &inner {
            _ if packed => {}
            None => self.check_hash(b, &map, &path)?,
            Some(offsets) => self.check_shard(b, &map, offsets, &path)?,
        }
        let block = MappedBlock::new(map, inner);
        if strict && !packed {
            // Hashing touched every page of the file: hand them back so that the resident set
            // holds only the rows patches read. Nothing counted yet (not read through `touch`).
            block.release();
        }
        Ok(Some(block))
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
