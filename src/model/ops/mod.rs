//! 3D convolution, transposed convolution, pooling and upsampling for candle, with gradients.
//!
//! Tensors are NCDHW, weights laid out as in PyTorch. Each op is a custom op with a CPU
//! implementation and, in a `cuda` build, a CUDA one (f32 and bf16: cuDNN for the
//! convolutions, our kernels for the rest; see `cuda`). On the CPU, convolutions are computed
//! directly from the input planes ([`direct`]: f32 at any stride, bf16 with f32 sums at stride
//! 1 on CPUs with AVX512-BF16; the up path's transposed convolution plane by plane); the input
//! gradient of a strided convolution is blocked im2col + `gemm` with a workspace bounded per
//! worker ([`conv`] holds the family). bf16 where no bf16 implementation exists runs widened to
//! f32 (f32 op, result rounded); other devices and types fall back to compositions of candle's
//! built-in ops ([`conv3d_generic`]). The signatures mirror what a future `Tensor::conv3d`
//! would take.
//!
//! - [`geometry`]: shapes and per-axis tap index maps;
//! - [`columns`]: blocks of the column (im2col) matrix; [`blocks`]: block plan and workers;
//! - [`matmul`]: strided `gemm` wrapper; [`conv`]: the custom ops; [`direct`]: convolutions
//!   without columns (f32, and bf16 on CPUs with AVX512-BF16);
//! - [`generic`]: device-independent fallbacks; [`pool3d`]: pooling;
//! - [`infer`]: what only inference runs: convolutions written over their input, and the
//!   decoder's first convolution computing its upsampled planes;
//! - [`norm`]: group/instance norm fused with LeakyReLU; [`bias`]: per-channel bias add;
//! - [`activation`]: the residual block's sum and LeakyReLU in one op;
//! - [`launch_plan`]: launch sizes of the CUDA kernels (plain arithmetic, tested on the CPU).

pub mod activation;
pub mod bias;
pub mod blocks;
pub mod columns;
pub mod conv;
mod conv_norm;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod direct;
pub mod generic;
pub mod geometry;
pub mod infer;
pub mod launch_plan;
pub mod matmul;
pub mod norm;
pub mod pool3d;
mod stored;
mod tape;

use candle_core::{bail, DType, Result, Tensor};

pub use activation::add_leaky_relu;
pub use bias::{add_channel_bias, add_channel_bias_owned};
pub use conv_norm::NormAct;
pub use generic::{conv3d_generic, conv_transpose3d_generic};
pub use infer::{conv3d_owned, conv3d_up_concat, UpConv};
pub use norm::{group_norm_leaky_relu, group_norm_leaky_relu_generic, group_norm_leaky_relu_owned};
pub use pool3d::{avg_pool3d, max_pool3d_generic};
pub use tape::Tape;

use conv::{Conv3dForward, Conv3dForwardPair, Conv3dGradInput};
use geometry::ConvGeom;
pub use geometry::Products;

/// Whether the custom ops (CPU, or CUDA in a `cuda` build) can run on these tensors.
pub(crate) fn fast_path(ts: &[&Tensor]) -> bool {
    ts.iter()
        .all(|t| t.dtype() == DType::F32 && custom_device(t.device()))
}

fn custom_device(dev: &candle_core::Device) -> bool {
    dev.is_cpu() || (cfg!(feature = "cuda") && dev.is_cuda())
}

/// bf16 tensors on a device with the custom ops: the op runs in f32 on the widened values
/// and its result is rounded to bf16, which is what bf16 kernels compute (bf16 storage, f32
/// arithmetic), so it is also their oracle. The casts carry gradients, so the backward pass
/// is the f32 one with bf16 gradients at the op's boundary. (candle's own CPU matmul has no
/// bf16, so the generic compositions could not run these at all.)
pub(crate) fn widened_bf16(ts: &[&Tensor]) -> bool {
    ts.iter()
        .all(|t| t.dtype() == DType::BF16 && custom_device(t.device()))
}

/// Whether the custom ops take these tensors as they are: f32 wherever the custom ops exist,
/// and bf16 on CUDA too (cuDNN and our kernels store bf16 and compute in f32).
pub(crate) fn native(ts: &[&Tensor]) -> bool {
    let cuda_bf16 = |t: &&Tensor| t.dtype() == DType::BF16 && t.device().is_cuda();
    fast_path(ts) || (cfg!(feature = "cuda") && ts.iter().all(cuda_bf16))
}

/// f32 tensors on the CPU (where the ops with a bias inside run).
fn cpu_f32(ts: &[&Tensor]) -> bool {
    ts.iter()
        .all(|t| t.dtype() == DType::F32 && t.device().is_cpu())
}

/// Where the CPU ops with a bias inside run: f32 tensors, or a bf16 training pass's bf16
/// input and weight with an f32 bias.
fn cpu_with_bias(x: &Tensor, w: &Tensor, b: &Tensor) -> bool {
    cpu_f32(&[x, w, b]) || (cpu_bf16(&[x, w]) && stored::cpu_bf16_with_f32(x, &[b]))
}

/// bf16 tensors on the CPU: the convolution ops take them as they are (bf16 kernels where the
/// CPU has them, else the f32 pass on widened values inside the op, rounded once).
fn cpu_bf16(ts: &[&Tensor]) -> bool {
    ts.iter()
        .all(|t| t.dtype() == DType::BF16 && t.device().is_cpu())
}

pub(crate) fn in_f32(
    ts: &[&Tensor],
    op: impl FnOnce(&[Tensor]) -> Result<Tensor>,
) -> Result<Tensor> {
    let wide = ts
        .iter()
        .map(|t| t.to_dtype(DType::F32))
        .collect::<Result<Vec<_>>>()?;
    op(&wide)?.to_dtype(DType::BF16)
}

/// x: (N, Cin, D, H, W), w: (Cout, Cin, kd, kh, kw); zero padding and stride per axis (d, h, w).
pub fn conv3d(x: &Tensor, w: &Tensor, padding: [usize; 3], stride: [usize; 3]) -> Result<Tensor> {
    conv3d_in(x, w, padding, stride, Products::F32)
}

/// [`conv3d`] whose CPU passes on f32 tensors multiply in `products` (and its gradients too).
pub fn conv3d_in(
    x: &Tensor,
    w: &Tensor,
    padding: [usize; 3],
    stride: [usize; 3],
    products: Products,
) -> Result<Tensor> {
    if !native(&[x, w]) && !cpu_bf16(&[x, w]) && widened_bf16(&[x, w]) {
        return in_f32(&[x, w], |t| conv3d(&t[0], &t[1], padding, stride));
    }
    if !native(&[x, w]) && !cpu_bf16(&[x, w]) {
        return conv3d_generic(x, w, padding, stride);
    }
    let geom = forward_geom(x, w, padding, stride, products)?;
    x.contiguous()?
        .apply_op2(&w.contiguous()?, Conv3dForward(geom))
}

/// The geometry of `conv3d_in(x, w, ..)`.
fn forward_geom(
    x: &Tensor,
    w: &Tensor,
    padding: [usize; 3],
    stride: [usize; 3],
    products: Products,
) -> Result<ConvGeom> {
    let mut geom = ConvGeom::new(x.dims(), w.dims(), padding, stride)?;
    geom.products = products;
    Ok(geom)
}

/// `conv3d_in(x, w, ..) + b[c]` (b: (Cout,)). In one op for f32 tensors on the CPU
/// ([`conv::WithBias`]: a training graph then holds one tensor, not two), else the
/// convolution and [`add_channel_bias`]; the same values and gradients either way.
pub fn conv3d_bias_in(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    padding: [usize; 3],
    stride: [usize; 3],
    products: Products,
) -> Result<Tensor> {
    if !conv_bias_fused(x, w, b, 0)? {
        return add_channel_bias(&conv3d_in(x, w, padding, stride, products)?, b);
    }
    let geom = forward_geom(x, w, padding, stride, products)?;
    x.contiguous()?.apply_op3(
        &w.contiguous()?,
        &b.contiguous()?,
        conv::WithBias(Conv3dForward(geom)),
    )
}

/// `group_norm_leaky_relu(conv3d_bias_in(x, w, b, ..), ..)` for training: on the CPU one op
/// that keeps the convolution's output inside instead of in the graph (f32 tensors, or a bf16
/// pass's bf16 ones with f32 biases and norm parameters); elsewhere the two ops.
pub fn conv_norm_leaky_relu(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    padding: [usize; 3],
    stride: [usize; 3],
    products: Products,
    norm: NormAct,
) -> Result<Tensor> {
    if !conv_norm_fused(x, w, b, &norm)? {
        let y = conv3d_bias_in(x, w, b, padding, stride, products)?;
        let NormAct {
            weight,
            bias,
            groups,
            eps,
            slope,
        } = norm;
        return group_norm_leaky_relu(&y, weight, bias, groups, eps, slope);
    }
    let op = conv_norm_op(x, w, padding, stride, products, &norm)?;
    let params = Tensor::cat(&[b, norm.weight, norm.bias], 0)?;
    x.contiguous()?.apply_op3(&w.contiguous()?, &params, op)
}

/// Whether [`conv_norm_leaky_relu`] runs as one op on these tensors.
fn conv_norm_fused(x: &Tensor, w: &Tensor, b: &Tensor, norm: &NormAct) -> Result<bool> {
    Ok(conv_bias_fused(x, w, b, 0)?
        && cpu_f32(&[norm.weight, norm.bias])
        && norm.weight.dims() == b.dims()
        && norm.bias.dims() == b.dims())
}

/// The one op of [`conv_norm_leaky_relu`].
fn conv_norm_op(
    x: &Tensor,
    w: &Tensor,
    padding: [usize; 3],
    stride: [usize; 3],
    products: Products,
    norm: &NormAct,
) -> Result<conv_norm::ConvNormAct> {
    Ok(conv_norm::ConvNormAct {
        conv: Conv3dForward(forward_geom(x, w, padding, stride, products)?),
        norm: norm::GroupNormLeakyRelu::new(norm.groups, norm.eps, norm.slope),
        saved: std::sync::Mutex::new(None),
    })
}

/// Whether a convolution (or, `out_axis` 1, a transposed one) and its bias `b` run as one op
/// on the CPU: the bias has one value per output channel, `w`'s dimension `out_axis`.
fn conv_bias_fused(x: &Tensor, w: &Tensor, b: &Tensor, out_axis: usize) -> Result<bool> {
    Ok(cpu_with_bias(x, w, b) && b.dims() == [w.dim(out_axis)?])
}

/// `conv3d(cat([a, b], 1), w, ..)` (a U-Net decoder's upsampled tensor and its skip
/// connection) without building the concatenation, where no argument records a graph and the
/// custom CPU op runs (f32 on the CPU): the same values bit for bit, without a tensor of both
/// inputs' size. Elsewhere, the concatenation and [`conv3d`].
pub fn conv3d_concat(
    a: &Tensor,
    b: &Tensor,
    w: &Tensor,
    padding: [usize; 3],
    stride: [usize; 3],
) -> Result<Tensor> {
    conv3d_concat_in(a, b, w, padding, stride, Products::F32)
}

/// [`conv3d_concat`] whose CPU pass multiplies in `products`.
pub fn conv3d_concat_in(
    a: &Tensor,
    b: &Tensor,
    w: &Tensor,
    padding: [usize; 3],
    stride: [usize; 3],
    products: Products,
) -> Result<Tensor> {
    let untracked = [a, b, w].iter().all(|t| !t.track_op());
    if !(untracked && fast_path(&[a, b, w]) && a.device().is_cpu()) {
        return conv3d_in(&Tensor::cat(&[a, b], 1)?, w, padding, stride, products);
    }
    let (n, ca, d, h, wd) = a.dims5()?;
    let (nb, cb, db, hb, wb) = b.dims5()?;
    if (nb, db, hb, wb) != (n, d, h, wd) {
        bail!(
            "conv3d_concat: a {:?} and b {:?} differ beyond channels",
            a.dims(),
            b.dims()
        );
    }
    let mut geom = ConvGeom::new(&[n, ca + cb, d, h, wd], w.dims(), padding, stride)?;
    geom.products = products;
    a.contiguous()?
        .apply_op3_no_bwd(&b.contiguous()?, &w.contiguous()?, &Conv3dForwardPair(geom))
}

/// `conv_transpose3d(x, w, stride) + b[c]`, in one op for f32 tensors on the CPU (as
/// [`conv3d_bias_in`]), whose gradients multiply in `products` (the transposed convolution
/// itself sums f32 products: prediction's fused decoder computes the same sums).
pub fn conv_transpose3d_bias(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    stride: [usize; 3],
    products: Products,
) -> Result<Tensor> {
    if !conv_bias_fused(x, w, b, 1)? {
        return add_channel_bias(&conv_transpose3d(x, w, stride)?, b);
    }
    let mut geom = transpose_geom(x, w, stride)?;
    geom.products = products;
    x.contiguous()?.apply_op3(
        &w.contiguous()?,
        &b.contiguous()?,
        conv::WithBias(Conv3dGradInput(geom)),
    )
}

/// The convolution whose input gradient is the transposed convolution of `x` by `w`.
fn transpose_geom(x: &Tensor, w: &Tensor, stride: [usize; 3]) -> Result<ConvGeom> {
    let (n, cin, d, h, wd) = x.dims5()?;
    let (wcin, cout, kd, kh, kw) = w.dims5()?;
    generic::check_transpose(cin, wcin, [kd, kh, kw], stride)?;
    // It is the input gradient of the convolution (N, Cout, D*s..) -> (N, Cin, D, H, W) with
    // kernel == stride, whose weight (Cin, Cout, s..) is exactly `w`.
    let up = [d * kd, h * kh, wd * kw];
    ConvGeom::new(&[n, cout, up[0], up[1], up[2]], w.dims(), [0; 3], stride)
}

/// Transposed conv with kernel == stride (nnU-Net's up path): x (N, Cin, D, H, W),
/// w (Cin, Cout, sd, sh, sw) -> (N, Cout, D*sd, H*sh, W*sw).
pub fn conv_transpose3d(x: &Tensor, w: &Tensor, stride: [usize; 3]) -> Result<Tensor> {
    if !native(&[x, w]) && !cpu_bf16(&[x, w]) && widened_bf16(&[x, w]) {
        return in_f32(&[x, w], |t| conv_transpose3d(&t[0], &t[1], stride));
    }
    if !native(&[x, w]) && !cpu_bf16(&[x, w]) {
        return conv_transpose3d_generic(x, w, stride);
    }
    let geom = transpose_geom(x, w, stride)?;
    x.contiguous()?
        .apply_op2(&w.contiguous()?, Conv3dGradInput(geom))
}

/// Max pooling with kernel == stride (dims must divide; error otherwise).
pub fn max_pool3d(x: &Tensor, k: [usize; 3]) -> Result<Tensor> {
    if !native(&[x]) && widened_bf16(&[x]) {
        return in_f32(&[x], |t| max_pool3d(&t[0], k));
    }
    if !native(&[x]) {
        return max_pool3d_generic(x, k);
    }
    pool3d::pooled_dims(x.dims(), k, "max_pool3d")?;
    x.contiguous()?.apply_op1(pool3d::MaxPool3d(k))
}

/// Nearest-neighbour upsampling by integer factors: a broadcast whose gradient is the sum
/// over each replicated block (candle's 2D upsampling gradient overwrites instead).
pub fn upsample_nearest3d(x: &Tensor, scale: [usize; 3]) -> Result<Tensor> {
    let (n, c, d, h, w) = x.dims5()?;
    if scale.contains(&0) {
        bail!("upsample_nearest3d: scale {scale:?} must be positive");
    }
    let [sd, sh, sw] = scale;
    x.reshape(vec![n, c, d, 1, h, 1, w, 1])?
        .broadcast_as(vec![n, c, d, sd, h, sh, w, sw])?
        .reshape((n, c, d * sd, h * sh, w * sw))
}
