//! CUDA implementations of the custom ops (built with `--features cuda`).
//!
//! - [`conv`]: conv3d forward, input gradient (also the transposed convolution) and weight
//!   gradient through cuDNN's N-d convolution;
//! - [`launch`]: our own kernels (`kernels.cu`, compiled to PTX at build time) for the fused
//!   group norm + LeakyReLU and its gradient, max pooling and its gradient, the per-channel
//!   bias add and channel sum.
//!
//! Every op has the CPU op beside it as its oracle; tests/gpu_ops.rs compares them on a GPU.
//! Launch sizes come from [`super::launch_plan`], which is plain Rust and tested on the CPU.

pub mod conv;
pub mod launch;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView};
use candle_core::cuda_backend::CudaDType;
use candle_core::{bail, CudaStorage, Layout, Result};

/// The contiguous data of one argument, of element type `T`.
pub(crate) fn view<'a, T: CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    use candle_core::backend::BackendStorage;
    let slice: &CudaSlice<T> = match s.as_cuda_slice::<T>() {
        Ok(slice) => slice,
        Err(_) => bail!("{what}: unsupported element type {:?} on CUDA", s.dtype()),
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(slice.slice(a..b)),
        None => bail!("{what}: argument must be contiguous"),
    }
}

/// The contiguous f32 data of one argument.
pub(crate) fn f32_view<'a>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, f32>> {
    view::<f32>(s, l, what)
}
