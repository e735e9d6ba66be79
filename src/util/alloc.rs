//! An allocator for the training binaries that keeps large freed blocks for the next request
//! of the same size.
//!
//! A training step frees and allocates the same tensors every step. glibc maps every block
//! over 32 MiB afresh ([`super::sysinfo::REUSED_BELOW`]; above that it cannot keep them on its
//! heap without fragmenting it), and the kernel zeroes each page on first touch: at nnU-Net's
//! 128^3 plan that was about a tenth of a step. Here a freed block of 32 MiB or more is kept,
//! whole (up to [`KEPT_BLOCKS`] blocks), and handed to the next request of exactly its size
//! and alignment: no splitting, so no fragmentation, and pages already touched. Kept blocks
//! never take the process over its own high-water mark: the large blocks in use plus those kept
//! stay within the most ever in use at once (a request that finds none of its size first hands
//! kept blocks back to the system until it fits). Anything else goes to the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;

/// Blocks of at least this many bytes are kept when freed.
pub const LARGE: usize = super::sysinfo::REUSED_BELOW;
/// At most this many blocks kept at once.
pub const KEPT_BLOCKS: usize = 32;

/// A kept block: (size, alignment, address).
type Block = (usize, usize, usize);

struct Kept {
    blocks: [Block; KEPT_BLOCKS],
    count: usize,
    /// Bytes of the kept blocks.
    bytes: usize,
    /// Bytes of large blocks in use, and the most ever in use at once.
    live: usize,
    high: usize,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    blocks: [(0, 0, 0); KEPT_BLOCKS],
    count: 0,
    bytes: 0,
    live: 0,
    high: 0,
});

impl Kept {
    /// Remove block `i` from the kept ones.
    fn remove(&mut self, i: usize) -> Block {
        let b = self.blocks[i];
        self.blocks[i] = self.blocks[self.count - 1];
        self.count -= 1;
        self.bytes -= b.0;
        b
    }
}

/// The global allocator of `train` and `bench_train_step` (declare it with
/// `#[global_allocator]`).
pub struct KeepLarge;

impl KeepLarge {
    /// A kept block for the large `l`, if one is; else room for a new one, kept blocks handed
    /// back to the system until the blocks in use and kept fit the high-water mark.
    fn take(l: Layout) -> Option<*mut u8> {
        let mut k = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        k.live += l.size();
        k.high = k.high.max(k.live);
        let n = k.count;
        let same = k.blocks[..n]
            .iter()
            .position(|&(s, a, _)| s == l.size() && a == l.align());
        if let Some(i) = same {
            return Some(k.remove(i).2 as *mut u8);
        }
        while k.count > 0 && k.live + k.bytes > k.high {
            let last = k.count - 1;
            let (s, a, p) = k.remove(last);
            // SAFETY: a kept block, allocated by System with this layout and not in use.
            unsafe { System.dealloc(p as *mut u8, Layout::from_size_align_unchecked(s, a)) };
        }
        None
    }

    /// Keep the freed large block `p` of `l`; false where the store is full.
    fn keep(p: *mut u8, l: Layout) -> bool {
        let mut k = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        k.live -= l.size();
        if k.count == KEPT_BLOCKS {
            return false;
        }
        let n = k.count;
        k.blocks[n] = (l.size(), l.align(), p as usize);
        k.count += 1;
        k.bytes += l.size();
        true
    }

    /// A large block the system could not give: no longer counted in use.
    fn failed(l: Layout) {
        let mut k = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        k.live -= l.size();
    }
}

// SAFETY: every block comes from `System` with the same layout it is returned with: a kept
// block is handed out again only for a layout of its exact size and alignment.
unsafe impl GlobalAlloc for KeepLarge {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() < LARGE {
            return unsafe { System.alloc(l) };
        }
        if let Some(p) = Self::take(l) {
            return p;
        }
        let p = unsafe { System.alloc(l) };
        if p.is_null() {
            Self::failed(l);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() < LARGE {
            return unsafe { System.alloc_zeroed(l) };
        }
        if let Some(p) = Self::take(l) {
            // SAFETY: the block holds l.size() bytes.
            unsafe { std::ptr::write_bytes(p, 0, l.size()) };
            return p;
        }
        let p = unsafe { System.alloc_zeroed(l) };
        if p.is_null() {
            Self::failed(l);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if l.size() >= LARGE && Self::keep(p, l) {
            return;
        }
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if l.size() < LARGE && new < LARGE {
            return unsafe { System.realloc(p, l, new) };
        }
        // SAFETY: the caller's contract (new > 0, a valid layout of `new` bytes).
        let to = unsafe { Layout::from_size_align_unchecked(new, l.align()) };
        let q = unsafe { self.alloc(to) };
        if !q.is_null() {
            // SAFETY: both blocks hold at least the smaller size; they are distinct.
            unsafe { std::ptr::copy_nonoverlapping(p, q, l.size().min(new)) };
            unsafe { self.dealloc(p, l) };
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A freed large block comes back for the same layout, zeroed where asked; a request of
    /// another size that would take the process over its high-water mark hands kept blocks
    /// back first; small blocks are never kept.
    #[test]
    fn a_large_block_is_reused_for_its_exact_layout() {
        let a = KeepLarge;
        let big = Layout::from_size_align(LARGE + 4096, 64).unwrap();
        let other = Layout::from_size_align(LARGE + 8192, 64).unwrap();
        let kept = || {
            let k = KEPT.lock().unwrap();
            (k.count, k.bytes, k.live, k.high)
        };
        unsafe {
            let p = a.alloc(big);
            assert!(!p.is_null());
            p.write_bytes(7, big.size());
            a.dealloc(p, big);
            assert_eq!(kept(), (1, big.size(), 0, big.size()));
            let r = a.alloc_zeroed(big);
            assert_eq!(r, p, "the same size gets the kept block");
            assert!((0..big.size()).step_by(4093).all(|i| *r.add(i) == 0));
            a.dealloc(r, big);
            // Another size: keeping `big` beside it would pass the most ever in use.
            let q = a.alloc(other);
            assert!(!q.is_null());
            assert_eq!(kept(), (0, 0, other.size(), other.size()));
            a.dealloc(q, other);
            let small = Layout::from_size_align(4096, 8).unwrap();
            let s = a.alloc(small);
            a.dealloc(s, small);
            assert_eq!(kept(), (1, other.size(), 0, other.size()));
        }
    }
}
