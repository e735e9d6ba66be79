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

/// Evaluates `$body` with the type alias `$t` set to the element type `$dtype` names (f32 or
/// bf16, the types the kernels are instantiated for); an error for any other.
macro_rules! with_element {
    ($dtype:expr, $what:expr, $t:ident => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $t = f32;
                $body
            }
            candle_core::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            d => candle_core::bail!("{}: element type {d:?} on CUDA: need f32 or bf16", $what),
        }
    };
}
pub(crate) use with_element;
