//! A strided f32 matrix product on raw pointers (the `gemm` crate candle itself uses), so the
//! convolution can write straight into its output tensor's channel planes.

use gemm::Parallelism;

/// A matrix view: element (i, j) lives at `ptr + i * rs + j * cs`.
#[derive(Clone, Copy)]
pub struct View {
    /// Element (0, 0).
    pub ptr: *const f32,
    /// Step between rows, in elements.
    pub rs: isize,
    /// Step between columns, in elements.
    pub cs: isize,
}

impl View {
    /// A row-major view with rows `rs` elements apart.
    pub fn rows(ptr: *const f32, rs: usize) -> Self {
        Self {
            ptr,
            rs: rs as isize,
            cs: 1,
        }
    }

    /// The transpose of a row-major matrix with row stride `rs`.
    pub fn transposed(ptr: *const f32, rs: usize) -> Self {
        Self {
            ptr,
            rs: 1,
            cs: rs as isize,
        }
    }
}

/// A raw output pointer that blocks writing disjoint regions may share across threads.
pub struct SharedOut<T = f32>(pub *mut T);
// SAFETY: every user writes disjoint elements (distinct grid rows / samples).
unsafe impl<T> Send for SharedOut<T> {}
unsafe impl<T> Sync for SharedOut<T> {}

impl<T> Clone for SharedOut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedOut<T> {}

impl<T> SharedOut<T> {
    /// The element `offset` past the start (a method, so closures capture the whole wrapper).
    ///
    /// # Safety
    /// `offset` must lie inside the buffer.
    #[inline]
    pub unsafe fn at(self, offset: usize) -> *mut T {
        self.0.add(offset)
    }
}

/// `dst (m x n) = [dst +] lhs (m x k) @ rhs (k x n)`.
///
/// # Safety
/// Every element the views address must be valid for the given shape, and no other thread may
/// touch the addressed elements of `dst` during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    lhs: View,
    rhs: View,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    // gemm computes dst = alpha * dst + beta * lhs @ rhs (alpha ignored unless read_dst).
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        accumulate,
        lhs.ptr,
        lhs.cs,
        lhs.rs,
        rhs.ptr,
        rhs.cs,
        rhs.rs,
        1.0f32,
        1.0f32,
        false,
        false,
        false,
        par,
    );
}
