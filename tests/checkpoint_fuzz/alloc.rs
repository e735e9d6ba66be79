//! A counting global allocator for the checkpoint fuzzer: each thread's live bytes and their
//! peak (so the test harness's other threads do not count), and a cap on any one request. A
//! request over the cap writes the input being run to a file opened beforehand (no allocation
//! happens on that path) and fails, which aborts the process: the input is not lost.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering::Relaxed};

/// The allocator; install with `#[global_allocator]`.
pub(crate) struct Counting;

/// Largest single request allowed.
pub(crate) static CAP: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The input being run and the file descriptor it is written to if the cap is hit.
static INPUT: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static INPUT_LEN: AtomicUsize = AtomicUsize::new(0);
static DUMP_FD: AtomicI32 = AtomicI32::new(-1);

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn grew(by: usize) {
    let _ = LIVE.try_with(|l| {
        let live = l.get().wrapping_add(by as isize);
        l.set(live);
        let _ = PEAK.try_with(|p| p.set(p.get().max(live)));
    });
}

fn shrank(by: usize) {
    let _ = LIVE.try_with(|l| l.set(l.get().wrapping_sub(by as isize)));
}

/// Write raw bytes to a file descriptor (no allocation).
fn raw_write(fd: i32, bytes: &[u8]) {
    // SAFETY: a valid buffer of that length; a failed write is ignored.
    unsafe {
        libc::write(fd, bytes.as_ptr().cast(), bytes.len());
    }
}

#[cold]
fn over_cap() {
    raw_write(
        2,
        b"checkpoint fuzz: an allocation over the cap; the input is saved\n",
    );
    let fd = DUMP_FD.load(Relaxed);
    let (ptr, len) = (INPUT.load(Relaxed), INPUT_LEN.load(Relaxed));
    if fd >= 0 && !ptr.is_null() {
        // SAFETY: the input slice outlives the run it was registered for (see `running`).
        raw_write(fd, unsafe { std::slice::from_raw_parts(ptr, len) });
    }
}

fn allowed(size: usize) -> bool {
    if size > CAP.load(Relaxed) {
        over_cap();
        return false;
    }
    true
}

// SAFETY: every call is forwarded to the system allocator; only counters are kept around it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if !allowed(l.size()) {
            return std::ptr::null_mut();
        }
        let p = System.alloc(l);
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if !allowed(l.size()) {
            return std::ptr::null_mut();
        }
        let p = System.alloc_zeroed(l);
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        shrank(l.size());
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if !allowed(new) {
            return std::ptr::null_mut();
        }
        let q = System.realloc(p, l, new);
        if !q.is_null() {
            grew(new);
            shrank(l.size());
        }
        q
    }
}

/// Start measuring this thread: its peak restarts at its live bytes, which are returned.
pub(crate) fn start() -> isize {
    let live = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(live));
    live
}

/// This thread's peak live bytes since [`start`] returned `base`, above `base`.
pub(crate) fn peak_since(base: isize) -> usize {
    PEAK.with(Cell::get).saturating_sub(base).max(0) as usize
}

/// Where an input that hits the cap is written (a file created now, empty).
pub(crate) fn dump_to(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::io::IntoRawFd;
    let f = std::fs::File::create(path)?;
    DUMP_FD.store(f.into_raw_fd(), Relaxed);
    Ok(())
}

/// Register `input` as the one being run (until the next call).
pub(crate) fn running(input: &[u8]) {
    INPUT_LEN.store(input.len(), Relaxed);
    INPUT.store(input.as_ptr().cast_mut(), Relaxed);
}
