//! Per-thread working memory of the blur and the low-resolution simulation.

use std::cell::Cell;

thread_local! {
    /// Working memory of blur and low resolution, kept per thread (a loader worker's): a
    /// patch-sized buffer allocated per call came fresh from the kernel each time and its
    /// page faults cost as much as the transform.
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// This thread's scratch buffer, at least `len` long (contents unspecified); hand it back with
/// [`put_scratch`]. (A function taking a closure instead left the closure out of the AVX2
/// build.)
#[inline(always)]
pub(super) fn take_scratch(len: usize) -> Vec<f32> {
    let mut buf = SCRATCH.take();
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    buf
}

#[inline(always)]
pub(super) fn put_scratch(buf: Vec<f32>) {
    SCRATCH.set(buf);
}
