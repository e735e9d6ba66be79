//! Per-channel bias add with a fast gradient.
//!
//! `x.broadcast_add(bias.reshape((1, C, 1, 1, 1)))` is correct everywhere, but on the CPU its
//! backward sums the gradient over dims (0, 2, 3, 4) with candle's generic strided reduction,
//! which `perf` showed at 14-20% of a U-Net training step. Here the bias gradient is one
//! sequential pass per (sample, channel) row, in a fixed order (deterministic).

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, DType, InplaceOp2, Layout, Result, Shape, Tensor,
};

use rayon::prelude::*;

use super::norm::{contiguous_f32, contiguous_f32_mut};

/// `y = x + bias[c]` for x (N, C, ...) and bias (C,).
pub fn add_channel_bias(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    if x.rank() < 2 || bias.dims() != [x.dim(1)?] {
        bail!(
            "add_channel_bias: x {:?} and bias {:?} do not fit (N, C, ...) and (C,)",
            x.dims(),
            bias.dims()
        );
    }
    if x.dtype() != bias.dtype() {
        // A bf16 training pass's f32 bias beside bf16 values: as the values are stored.
        return add_channel_bias(x, &bias.to_dtype(x.dtype())?);
    }
    if !super::native(&[x, bias]) && super::widened_bf16(&[x, bias]) {
        return super::in_f32(&[x, bias], |t| add_channel_bias(&t[0], &t[1]));
    }
    if super::native(&[x, bias]) {
        x.contiguous()?
            .apply_op2(&bias.contiguous()?, AddChannelBias)
    } else {
        let mut shape = vec![1; x.rank()];
        shape[1] = x.dim(1)?;
        x.broadcast_add(&bias.reshape(shape)?)
    }
}

/// [`add_channel_bias`] for a pass that records no graph, consuming `x`: on the CPU in f32
/// the bias is added into `x`'s own storage (no second tensor of its size), elsewhere, or when
/// either argument is tracked for gradients, it is the same as [`add_channel_bias`]. The values
/// are the same bit for bit. `x` must not be shared: callers pass the fresh output of the
/// previous op (any clone of it would see the bias too).
pub fn add_channel_bias_owned(x: Tensor, bias: &Tensor) -> Result<Tensor> {
    let in_place = x.device().is_cpu()
        && x.dtype() == DType::F32
        && bias.dtype() == DType::F32
        && x.is_contiguous()
        && !x.track_op()
        && !bias.track_op()
        && x.rank() >= 2
        && bias.dims() == [x.dim(1)?];
    if !in_place {
        return add_channel_bias(&x, bias);
    }
    x.inplace_op2(&bias.contiguous()?, &AddChannelBias)?;
    Ok(x)
}

struct AddChannelBias;

/// `y += bias[c]` over rows of `v` voxels, channel `i % c` for row `i`.
pub(super) fn add_rows(y: &mut [f32], b: &[f32], c: usize, v: usize) {
    if v > 0 {
        for (i, row) in y.chunks_mut(v).enumerate() {
            let bc = b[i % c];
            row.iter_mut().for_each(|e| *e += bc);
        }
    }
}

/// [`add_rows`] on bf16 values: each widened, the bias added in f32, rounded again.
pub(super) fn add_rows_bf16(y: &mut [half::bf16], b: &[f32], c: usize, v: usize) {
    use super::direct::Cast;
    let mut buf = vec![0f32; v.min(1 << 14)];
    if v > 0 {
        for (i, row) in y.chunks_mut(v).enumerate() {
            for part in row.chunks_mut(buf.len()) {
                let wide = &mut buf[..part.len()];
                half::bf16::cast_row(part, wide);
                wide.iter_mut().for_each(|e| *e += b[i % c]);
                f32::cast_row(wide, part);
            }
        }
    }
}

/// (N, C, ...) -> (C,): the sum of each channel over samples and voxels.
pub(super) struct ChannelSum;

pub(super) fn rows(dims: &[usize]) -> (usize, usize, usize) {
    let (n, c) = (dims[0], dims[1]);
    (n, c, dims[2..].iter().product())
}

impl CustomOp2 for AddChannelBias {
    fn name(&self) -> &'static str {
        "add-channel-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s1, l1, CustomOp2::name(self))?;
        let b = contiguous_f32(s2, l2, CustomOp2::name(self))?;
        let (_, c, v) = rows(l1.dims());
        let mut y = x.to_vec();
        add_rows(&mut y, b, c, v);
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::{launch, view, with_element};
        use candle_core::backend::BackendStorage;
        let (_, c, v) = rows(l1.dims());
        let y = with_element!(s1.dtype(), CustomOp2::name(self), T => {
            let (x, b) = (view::<T>(s1, l1, CustomOp2::name(self))?, view::<T>(s2, l2, CustomOp2::name(self))?);
            let y = launch::add_channel_bias(&s1.device, &x, &b, c, v)?;
            candle_core::CudaStorage::wrap_cuda_slice(y, s1.device.clone())
        });
        Ok((y, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _bias: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let gb = grad.contiguous()?.apply_op1_no_bwd(&ChannelSum)?;
        Ok((Some(grad.clone()), Some(gb)))
    }
}

impl InplaceOp2 for AddChannelBias {
    fn name(&self) -> &'static str {
        "add-channel-bias-in-place"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let b = contiguous_f32(s2, l2, InplaceOp2::name(self))?;
        let data = contiguous_f32_mut(s1, l1, "add_channel_bias_owned")?;
        let (_, c, v) = rows(l1.dims());
        add_rows(data, b, c, v);
        Ok(())
    }
}

impl CustomOp1 for ChannelSum {
    fn name(&self) -> &'static str {
        "channel-sum"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, c, v) = rows(l.dims());
        let g = super::stored::Stored::of(s, l, l.shape().elem_count(), self.name())?;
        // Each (sample, channel) row summed by one task, in order; the rows then added per
        // channel in sample order: the same bits for any thread count.
        let sum = |row: &[f32]| row_sum(row);
        let rows: Vec<f64> = match g {
            _ if v == 0 => Vec::new(),
            super::stored::Stored::F32(g) => g.par_chunks(v).map(sum).collect(),
            // bf16 gradients of a bf16 pass: each row widened, then the same sums.
            g => (0..g.len() / v)
                .into_par_iter()
                .map_init(Vec::new, |row, i| {
                    row.resize(v, 0f32);
                    g.widen(i * v, row);
                    sum(row)
                })
                .collect(),
        };
        let mut acc = vec![0f64; c];
        for (i, r) in rows.into_iter().enumerate() {
            acc[i % c] += r;
        }
        let out = acc.into_iter().map(|a| a as f32).collect();
        Ok((CpuStorage::F32(out), Shape::from(c)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::{launch, view, with_element};
        use candle_core::backend::BackendStorage;
        let (n, c, v) = rows(l.dims());
        let out = with_element!(s.dtype(), self.name(), T => {
            let g = view::<T>(s, l, self.name())?;
            let out = launch::channel_sum(&s.device, &g, n, c, v)?;
            candle_core::CudaStorage::wrap_cuda_slice(out, s.device.clone())
        });
        Ok((out, Shape::from(c)))
    }
}

/// The sum of `row` in f64, sixteen lanes summed apart and then added in a fixed order: a
/// vector add a step rather than one dependent scalar add a value, the same bits anywhere.
fn row_sum(row: &[f32]) -> f64 {
    let mut lanes = [0f64; 16];
    let chunks = row.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += v as f64;
        }
    }
    lanes.iter().sum::<f64>() + tail.iter().map(|&v| v as f64).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::Products;
    use candle_core::{Device, Var};

    #[test]
    fn matches_broadcast_add_forward_and_backward() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(
            &Tensor::arange(0f32, 2.0 * 3.0 * 20.0, &dev)?.reshape((2, 3, 4, 5, 1))?,
        )?;
        let b = Var::from_tensor(&Tensor::new(&[0.5f32, -1.0, 2.0], &dev)?)?;
        let r = Tensor::arange(0f32, 120.0, &dev)?
            .reshape((2, 3, 4, 5, 1))?
            .cos()?;
        let fast = add_channel_bias(x.as_tensor(), b.as_tensor())?;
        let slow = x
            .as_tensor()
            .broadcast_add(&b.as_tensor().reshape((1, 3, 1, 1, 1))?)?;
        let diff = |a: &Tensor, b: &Tensor| -> Result<f32> {
            a.sub(b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
        };
        assert_eq!(diff(&fast, &slow)?, 0.0);
        let gf = (fast * &r)?.sum_all()?.backward()?;
        let gs = (slow * &r)?.sum_all()?.backward()?;
        for v in [&x, &b] {
            let (a, s) = (
                gf.get(v.as_tensor()).unwrap(),
                gs.get(v.as_tensor()).unwrap(),
            );
            assert!(diff(a, s)? < 1e-4, "{a} {s}");
        }
        assert!(add_channel_bias(
            x.as_tensor(),
            &Tensor::zeros(4, candle_core::DType::F32, &dev)?
        )
        .is_err());
        Ok(())
    }

    /// The bias added inside the convolution's op (training) against the convolution then the
    /// bias op: the same values and gradients, bit for bit.
    #[test]
    fn a_bias_inside_the_convolution_changes_no_bit() -> Result<()> {
        use crate::model::ops::{conv3d, conv3d_bias_in, conv_transpose3d, conv_transpose3d_bias};
        let dev = Device::Cpu;
        let var = |n: usize, shape: &[usize], f: fn(&Tensor) -> Result<Tensor>| -> Result<Var> {
            Var::from_tensor(&f(&Tensor::arange(0f32, n as f32, &dev)?.reshape(shape)?)?)
        };
        let bits = |t: &Tensor| -> Result<Vec<u32>> {
            Ok(t.flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .map(|v| v.to_bits())
                .collect())
        };
        let x = var(2 * 3 * 5 * 6 * 7, &[2, 3, 5, 6, 7], |t| t.sin())?;
        let w = var(4 * 3 * 27, &[4, 3, 3, 3, 3], |t| (t * 0.1)?.cos())?;
        let b = var(4, &[4], |t| t - 1.5)?;
        let xt = var(2 * 4 * 3 * 4 * 5, &[2, 4, 3, 4, 5], |t| t.sin())?;
        let wt = var(4 * 3 * 8, &[4, 3, 2, 2, 2], |t| (t * 0.3)?.cos())?;
        let bt = var(3, &[3], |t| t * 0.5)?;
        type Pair<'a> = (
            Box<dyn Fn() -> Result<Tensor> + 'a>,
            Box<dyn Fn() -> Result<Tensor> + 'a>,
        );
        let (xs, ws, bs) = (x.as_tensor(), w.as_tensor(), b.as_tensor());
        let (xts, wts, bts) = (xt.as_tensor(), wt.as_tensor(), bt.as_tensor());
        let cases: Vec<(Pair, [&Var; 3])> = vec![
            (
                (
                    Box::new(|| conv3d_bias_in(xs, ws, bs, [1; 3], [1; 3], Products::F32)),
                    Box::new(|| add_channel_bias(&conv3d(xs, ws, [1; 3], [1; 3])?, bs)),
                ),
                [&x, &w, &b],
            ),
            (
                (
                    Box::new(|| conv3d_bias_in(xs, ws, bs, [1; 3], [1, 2, 2], Products::F32)),
                    Box::new(|| add_channel_bias(&conv3d(xs, ws, [1; 3], [1, 2, 2])?, bs)),
                ),
                [&x, &w, &b],
            ),
            (
                (
                    Box::new(|| conv_transpose3d_bias(xts, wts, bts, [2; 3], Products::F32)),
                    Box::new(|| add_channel_bias(&conv_transpose3d(xts, wts, [2; 3])?, bts)),
                ),
                [&xt, &wt, &bt],
            ),
        ];
        for (i, ((fused, apart), vars)) in cases.iter().enumerate() {
            let (f, a) = (fused()?, apart()?);
            assert_eq!(bits(&f)?, bits(&a)?, "case {i}: values");
            let r = Tensor::arange(0f32, f.elem_count() as f32, &dev)?
                .reshape(f.shape())?
                .cos()?;
            let (gf, ga) = (
                (f * &r)?.sum_all()?.backward()?,
                (a * &r)?.sum_all()?.backward()?,
            );
            for v in vars {
                let (p, q) = (
                    gf.get(v.as_tensor()).unwrap(),
                    ga.get(v.as_tensor()).unwrap(),
                );
                assert_eq!(bits(p)?, bits(q)?, "case {i}: gradient of {:?}", v.dims());
            }
        }
        Ok(())
    }
}
