//! Which kernels multiply bf16 values: AMX tiles (`amx.rs`) for the forward pass and the input
//! gradient where the CPU has AMX-BF16, AVX512-BF16's dot products (`bf16.rs`) where they
//! outrun the f32 kernels on this CPU (`util::simd::bf16_products`), else the f32 kernels on
//! the values widened as each ring slot is filled (the same products: one of two bf16 values
//! is exact in f32). bf16 tensors (training's activations) take either; f32 tensors with bf16
//! products (`--precision bf16` inference) only the dot products: widened, they would be the
//! f32 pass with rounding and no gain, so there the f32 pass computes them.

use half::bf16;

use super::super::columns::Planes;
use super::super::geometry::{ConvGeom, Products};
#[cfg(target_arch = "x86_64")]
use super::bf16 as dot;
use super::kernels::{Kernel, F32};
use super::weights::grad_weight_with;
use super::{
    applies, forward_weight, grad_input_strided_with, grad_input_with, reads_directly, Operand,
    Pass,
};
use crate::util::simd::{bf16_products, Bf16Products};

/// How one pass multiplies bf16 tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum How {
    /// AMX tiles (the CPU has AMX-BF16).
    Tiles,
    /// The dot-product kernels (the CPU has AVX512-BF16).
    Dot,
    /// The f32 kernels on widened values.
    Widened,
}

impl How {
    /// This process's choice: the tiles or the dot products where the CPU has them and they
    /// pay.
    pub(super) fn here() -> Self {
        match (dot_available(), bf16_products()) {
            (true, Bf16Products::Tiles) if tiles_available() => Self::Tiles,
            (true, Bf16Products::Dot) => Self::Dot,
            _ => Self::Widened,
        }
    }
}

/// Whether the CPU runs the dot-product kernels (AVX512-BF16, not capped by `VOXCACHE_SIMD`).
pub(super) fn dot_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        dot::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU runs the AMX tile kernels (AMX-BF16 granted, not capped by `VOXCACHE_SIMD`).
pub(super) fn tiles_available() -> bool {
    cfg!(target_arch = "x86_64") && crate::util::simd::amx_bf16()
}

/// Whether bf16 values are multiplied by the tile or dot-product kernels in this process:
/// AMX-BF16 or AVX512-BF16 present, not capped off, and faster than the f32 kernels here (or
/// `VOXCACHE_BF16=dot`).
pub fn bf16_dot_products() -> bool {
    How::here() != How::Widened
}

/// Whether the tile or dot-product kernels compute this convolution in this process: padding
/// below the kernel size, any stride (a kernel equal to its stride too: the transposed
/// convolution's gradients, where twice the f32 rate pays for the phase planes), the input
/// gradient at a stride one pass per stride phase.
fn dot_kernels(how: How, g: &ConvGeom) -> bool {
    how != How::Widened && (0..3).all(|a| g.padding[a] < g.kernel[a])
}

/// The tile or dot-product engine of `g`'s forward pass (`pass`) where `g` asks for bf16
/// products and this process multiplies them so: what the passes that only inference runs
/// multiply in.
#[cfg(target_arch = "x86_64")]
pub(super) fn dot_engine(pass: &Pass, g: &ConvGeom, w: &[f32]) -> Option<dot::Pairs> {
    let how = How::here();
    (g.products == Products::Bf16 && applies(g) && how != How::Widened).then(|| {
        dot::Pairs::new(pass, how == How::Tiles, |o, i, t| {
            forward_weight(g, w, o, i, t).bf16()
        })
    })
}

/// The forward pass on bf16 tensors (None where neither kernel reads this convolution),
/// `bias` (f32) added to the sums before their one rounding.
pub fn forward_bf16(
    g: &ConvGeom,
    x: &[bf16],
    w: &[bf16],
    bias: Option<&[f32]>,
) -> Option<Vec<bf16>> {
    forward_bf16_by(How::here(), g, x, w, bias)
}

pub(super) fn forward_bf16_by(
    how: How,
    g: &ConvGeom,
    x: &[bf16],
    w: &[bf16],
    bias: Option<&[f32]>,
) -> Option<Vec<bf16>> {
    let vi = g.input_voxels();
    let channel = |n: usize, i: usize| &x[(n * g.cin + i) * vi..][..vi];
    #[cfg(target_arch = "x86_64")]
    if dot_kernels(how, g) {
        return Some(dot::forward(how == How::Tiles, g, channel, w, bias));
    }
    if !reads_directly(g) {
        return None;
    }
    let pass = Pass::forward(g);
    let engine = F32::new(Kernel::detect(), &pass, |o, i, t| {
        forward_weight(g, w, o, i, t).to_f32()
    });
    let fill = |n, i, source, slot: &mut [f32]| pass.fill_plane(channel(n, i), source, slot);
    Some(pass.run_biased(&engine, fill, bias))
}

/// The input gradient on bf16 tensors, as [`forward_bf16`] (None also where a stride phase
/// cannot be padded).
pub fn grad_input_bf16(g: &ConvGeom, dy: &[bf16], w: &[bf16]) -> Option<Vec<bf16>> {
    grad_input_bf16_by(How::here(), g, dy, w)
}

pub(super) fn grad_input_bf16_by(
    how: How,
    g: &ConvGeom,
    dy: &[bf16],
    w: &[bf16],
) -> Option<Vec<bf16>> {
    #[cfg(target_arch = "x86_64")]
    if dot_kernels(how, g) {
        return dot::grad_input(how == How::Tiles, g, dy, w);
    }
    let _ = how;
    match (applies(g), reads_directly(g)) {
        (true, _) => Some(grad_input_with(Kernel::detect(), g, dy, w)),
        (false, true) => grad_input_strided_with(Kernel::detect(), g, dy, w),
        (false, false) => None,
    }
}

/// The weight gradient (f32 sums) on bf16 tensors, as [`forward_bf16`], for kernels 1 to 3
/// wide.
pub fn grad_weight_bf16(g: &ConvGeom, x: &[bf16], dy: &[bf16]) -> Option<Vec<f32>> {
    grad_weight_bf16_by(How::here(), g, x, dy)
}

pub(super) fn grad_weight_bf16_by(
    how: How,
    g: &ConvGeom,
    x: &[bf16],
    dy: &[bf16],
) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if dot_kernels(how, g) {
        let vi = g.input_voxels();
        return dot::grad_weight(
            how == How::Tiles,
            g,
            |n, i| &x[(n * g.cin + i) * vi..][..vi],
            dy,
        );
    }
    let _ = how;
    grad_weight_with(Kernel::detect(), g, x, dy)
}

/// The forward pass on f32 tensors with bf16 products and f32 sums, where this process
/// multiplies bf16 by dot products (None otherwise: the f32 pass is as fast).
pub fn forward_bf16_products<'a>(
    g: &ConvGeom,
    sample: impl Fn(usize) -> Planes<'a> + Sync,
    w: &[f32],
) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if dot_kernels(How::here(), g) {
        let tiles = How::here() == How::Tiles;
        return Some(dot::forward(tiles, g, |n, i| sample(n).channel(i), w, None));
    }
    let _ = (g, sample, w);
    None
}

/// The input gradient on f32 tensors with bf16 products, as [`forward_bf16_products`].
pub fn grad_input_bf16_products(g: &ConvGeom, dy: &[f32], w: &[f32]) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if dot_kernels(How::here(), g) {
        return dot::grad_input(How::here() == How::Tiles, g, dy, w);
    }
    let _ = (g, dy, w);
    None
}

/// The weight gradient on f32 tensors with bf16 products, as [`forward_bf16_products`], for
/// kernels 1 to 3 wide.
pub fn grad_weight_bf16_products(g: &ConvGeom, x: &[f32], dy: &[f32]) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if dot_kernels(How::here(), g) {
        let vi = g.input_voxels();
        let tiles = How::here() == How::Tiles;
        return dot::grad_weight(tiles, g, |n, i| &x[(n * g.cin + i) * vi..][..vi], dy);
    }
    let _ = (g, x, dy);
    None
}
