//! Convolutions that only inference runs (no graph: nothing reads an activation after the
//! next layer has), each saving one first-level activation a window:
//! - [`conv3d_owned`]: a convolution written over its own input, where it has as many
//!   outputs as inputs (the second convolution of each stage);
//! - [`conv3d_up_concat`]: a decoder's first convolution computing the upsampled planes it
//!   reads, so that the upsampled tensor is never built, and written over the skip
//!   connection where the output has the skip's channels.
//!
//! Both give the values of the ops they replace bit for bit (`direct::tests`), with f32
//! products and with bf16 ones (the upsampling itself is f32 either way, as the transposed
//! convolution's).

use candle_core::{bail, CpuStorage, CustomOp3, InplaceOp2, InplaceOp3, Layout, Result, Shape};
use candle_core::{DType, Tensor};

use super::conv::f32_data;
use super::direct;
use super::geometry::{ConvGeom, Products};
use super::norm::contiguous_f32_mut;
use super::{conv3d_in, fast_path, generic};

/// `conv3d(x, w, padding)` (stride 1) consuming `x`: on the CPU (f32 tensors that record no
/// graph, as many outputs as inputs, padding that keeps the size) the output is
/// written over `x`'s own storage; elsewhere it is [`conv3d_in`]. `x` must not be shared:
/// callers pass the fresh output of the previous layer.
pub fn conv3d_owned(
    x: Tensor,
    w: &Tensor,
    padding: [usize; 3],
    products: Products,
) -> Result<Tensor> {
    let mut geom = ConvGeom::new(x.dims(), w.dims(), padding, [1; 3])?;
    geom.products = products;
    let in_place = untracked_cpu_f32(&[&x, w])
        && x.is_contiguous()
        && geom.cin == geom.cout
        && geom.output == geom.input
        && direct::applies(&geom);
    if !in_place {
        return conv3d_in(&x, w, padding, [1; 3], products);
    }
    x.inplace_op2(&w.contiguous()?, &Conv3dInPlace(geom))?;
    Ok(x)
}

/// `conv3d(cat([conv_transpose3d(low, up_weight, stride) + up_bias, skip], 1), w, padding)`,
/// a U-Net decoder's first convolution after its upsampling, consuming `skip`. On the CPU
/// (f32 tensors that record no graph, a stride-1 convolution whose padding is below its
/// kernel) each worker computes the upsampled planes it reads, so the upsampled tensor is
/// never built, and where the output has the skip's channels and size it is written over the
/// skip: `Ok(Ok(output))`. Elsewhere `Ok(Err(skip))`: the caller runs the ops. `skip` must
/// not be shared.
pub fn conv3d_up_concat(
    low: &Tensor,
    up: UpConv,
    skip: Tensor,
    w: &Tensor,
    padding: [usize; 3],
    products: Products,
) -> Result<std::result::Result<Tensor, Tensor>> {
    let UpConv {
        weight: up_weight,
        bias: up_bias,
        stride,
    } = up;
    let mut args = vec![low, up_weight, &skip, w];
    args.extend(up_bias);
    if !untracked_cpu_f32(&args) {
        return Ok(Err(skip));
    }
    let (n, cl, d, h, wd) = low.dims5()?;
    let (wcl, _, kd, kh, kw) = up_weight.dims5()?;
    generic::check_transpose(cl, wcl, [kd, kh, kw], stride)?;
    let (ns, cs, ds, hs, ws) = skip.dims5()?;
    if (ns, ds, hs, ws) != (n, d * kd, h * kh, wd * kw) {
        bail!(
            "conv3d_up_concat: skip {:?} is not the upsampled {:?}",
            skip.dims(),
            low.dims()
        );
    }
    let cu = up_weight.dim(1)?;
    let mut geom = ConvGeom::new(&[n, cu + cs, ds, hs, ws], w.dims(), padding, [1; 3])?;
    geom.products = products;
    if !direct::applies(&geom) {
        return Ok(Err(skip));
    }
    let op = UpPair {
        geom,
        up_weight: up_weight.flatten_all()?.to_vec1()?,
        up_bias: up_bias.map(|b| b.flatten_all()?.to_vec1()).transpose()?,
        stride,
    };
    let (low, w) = (low.contiguous()?, w.contiguous()?);
    if geom.cout == cs && geom.output == geom.input && skip.is_contiguous() {
        skip.inplace_op3(&low, &w, &op)?;
        return Ok(Ok(skip));
    }
    Ok(Ok(low.apply_op3_no_bwd(&skip.contiguous()?, &w, &op)?))
}

/// CPU tensors of f32 that record no graph.
fn untracked_cpu_f32(ts: &[&Tensor]) -> bool {
    fast_path(ts)
        && ts
            .iter()
            .all(|t| t.device().is_cpu() && t.dtype() == DType::F32 && !t.track_op())
}

/// The convolution written over its input, argument (x mut, w).
struct Conv3dInPlace(ConvGeom);

/// The transposed convolution of [`conv3d_up_concat`]: kernel = stride.
#[derive(Clone, Copy, Debug)]
pub struct UpConv<'a> {
    /// (Cl, Cu, sd, sh, sw), PyTorch's layout.
    pub weight: &'a Tensor,
    /// Per upsampled channel.
    pub bias: Option<&'a Tensor>,
    /// The stride, which is also the kernel.
    pub stride: [usize; 3],
}

/// The decoder's first convolution (see [`conv3d_up_concat`]): the transposed convolution's
/// weight (Cl, Cu, sd, sh, sw), bias and stride.
struct UpPair {
    geom: ConvGeom,
    up_weight: Vec<f32>,
    up_bias: Option<Vec<f32>>,
    stride: [usize; 3],
}

impl UpPair {
    /// The upsampling of `low` (its layout's dims (N, Cl, D, H, W)).
    fn upsampling<'a>(&'a self, low: &'a [f32], dims: &[usize]) -> Result<direct::Upsampling<'a>> {
        let [cl, ld, lh, lw] = [1, 2, 3, 4].map(|a| dims.get(a).copied().unwrap_or(0));
        let up = direct::Upsampling {
            low,
            low_ch: cl,
            low_size: [ld, lh, lw],
            weight: &self.up_weight,
            up_ch: self.up_weight.len() / (cl * self.stride.iter().product::<usize>()).max(1),
            stride: self.stride,
            bias: self.up_bias.as_deref(),
        };
        let [_, _, d, h, w] = self.geom.x_dims();
        if up.up_size() != [d, h, w] {
            bail!(
                "conv3d_up_concat: {:?} upsampled is not {:?}",
                dims,
                [d, h, w]
            );
        }
        Ok(up)
    }
}

impl InplaceOp2 for Conv3dInPlace {
    fn name(&self) -> &'static str {
        "conv3d-in-place"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let g = &self.0;
        let w = f32_data(s2, l2, &g.w_dims(), "conv3d in place w")?;
        let x = contiguous_f32_mut(s1, l1, "conv3d in place x")?;
        if x.len() != g.x_dims().iter().product::<usize>() {
            bail!("conv3d in place: x {:?} is not {:?}", l1.dims(), g.x_dims());
        }
        // SAFETY: `x` is this op's own storage, borrowed mutably for the call.
        unsafe { direct::forward_in_place(g, x.as_mut_ptr(), w) };
        Ok(())
    }
}

impl CustomOp3 for UpPair {
    fn name(&self) -> &'static str {
        "conv3d-up-pair"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.geom;
        let [n, cin, d, h, w] = g.x_dims();
        let low = f32_data(s1, l1, l1.dims(), "conv3d up-pair low")?;
        let up = self.upsampling(low, l1.dims())?;
        let skip_dims = [n, cin - up.up_ch, d, h, w];
        let skip = f32_data(s2, l2, &skip_dims, "conv3d up-pair skip")?;
        let wt = f32_data(s3, l3, &g.w_dims(), "conv3d up-pair w")?;
        Ok((
            CpuStorage::F32(direct::forward_up_pair(g, &up, skip, wt)),
            Shape::from(g.y_dims().to_vec()),
        ))
    }
}

impl InplaceOp3 for UpPair {
    fn name(&self) -> &'static str {
        "conv3d-up-pair-in-place"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let g = &self.geom;
        let low = f32_data(s2, l2, l2.dims(), "conv3d up-pair low")?;
        let up = self.upsampling(low, l2.dims())?;
        let wt = f32_data(s3, l3, &g.w_dims(), "conv3d up-pair w")?;
        let skip = contiguous_f32_mut(s1, l1, "conv3d up-pair skip")?;
        let [n, _, d, h, w] = g.x_dims();
        if skip.len() != n * g.cout * d * h * w {
            bail!(
                "conv3d up-pair: skip {:?} does not fit the output",
                l1.dims()
            );
        }
        // SAFETY: `skip` is this op's own storage, borrowed mutably for the call.
        unsafe { direct::forward_up_pair_in_place(g, &up, skip.as_mut_ptr(), wt) };
        Ok(())
    }
}
