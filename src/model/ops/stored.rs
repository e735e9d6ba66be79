//! What the CPU ops read and write: contiguous f32, or bf16 (a bf16 training pass keeps its
//! activations and their gradients in bf16, half the bytes, and computes in f32 inside each
//! op), widened and rounded a row at a time.

use candle_core::{bail, CpuStorage, DType, Layout, Result, Tensor};
use half::bf16;

use super::direct::Cast;

/// A contiguous CPU argument.
#[derive(Clone, Copy)]
pub(crate) enum Stored<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

impl<'a> Stored<'a> {
    /// The argument `s` with layout `l`, of `expect` elements.
    pub(crate) fn of(s: &'a CpuStorage, l: &Layout, expect: usize, what: &str) -> Result<Self> {
        let Some((a, b)) = l.contiguous_offsets() else {
            bail!("{what}: argument must be contiguous")
        };
        let v = match s {
            CpuStorage::F32(d) => Stored::F32(&d[a..b]),
            CpuStorage::BF16(d) => Stored::Bf16(&d[a..b]),
            _ => bail!("{what}: only f32 and bf16 tensors are supported"),
        };
        if v.len() != expect {
            bail!("{what}: {} elements, expected {expect}", v.len());
        }
        Ok(v)
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Stored::F32(d) => d.len(),
            Stored::Bf16(d) => d.len(),
        }
    }

    pub(crate) fn is_bf16(&self) -> bool {
        matches!(self, Stored::Bf16(_))
    }

    /// Elements `start..start + dst.len()` as f32.
    pub(crate) fn widen(&self, start: usize, dst: &mut [f32]) {
        match self {
            Stored::F32(d) => dst.copy_from_slice(&d[start..][..dst.len()]),
            Stored::Bf16(d) => bf16::cast_row(&d[start..][..dst.len()], dst),
        }
    }
}

/// A bf16 training pass on the CPU: activations `x` in bf16, the small parameters (biases,
/// norm weights) in f32, which the CPU ops take as they are.
pub(crate) fn cpu_bf16_with_f32(x: &Tensor, params: &[&Tensor]) -> bool {
    x.device().is_cpu()
        && x.dtype() == DType::BF16
        && params
            .iter()
            .all(|t| t.device().is_cpu() && t.dtype() == DType::F32)
}
