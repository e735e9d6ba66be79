//! 3D pooling with kernel == stride. Max pooling has a CPU custom op whose gradient goes to
//! the first maximum of each window only (candle's max reduction would hand it to every tie,
//! and windows of post-ReLU zeros tie a lot); elsewhere it is a reshape + max composition.
//! Average pooling is a reshape + sum composition everywhere (exact gradient, cheap).

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// (N, C, D, H, W) of `x` and the pooled size, or an error when `k` does not divide.
pub fn pooled_dims(dims: &[usize], k: [usize; 3], what: &str) -> Result<([usize; 5], [usize; 3])> {
    let &[n, c, d, h, w] = dims else {
        bail!("{what}: expected (N, C, D, H, W), got {dims:?}")
    };
    let size = [d, h, w];
    if (0..3).any(|a| k[a] == 0 || size[a] % k[a] != 0) {
        bail!("{what}: kernel {k:?} must be positive and divide the spatial size {size:?}");
    }
    if size.contains(&0) || n == 0 || c == 0 {
        bail!("{what}: empty tensor {dims:?}");
    }
    Ok(([n, c, d, h, w], [0, 1, 2].map(|a| size[a] / k[a])))
}

/// View (N, C, D, H, W) as (N, C, D/kd, kd, H/kh, kh, W/kw, kw) so windows are axes 3, 5, 7.
fn windows(x: &Tensor, k: [usize; 3], what: &str) -> Result<Tensor> {
    let ([n, c, ..], [pd, ph, pw]) = pooled_dims(x.dims(), k, what)?;
    x.reshape(vec![n, c, pd, k[0], ph, k[1], pw, k[2]])
}

/// Max pooling from built-in ops (any device); ties share the gradient as candle's max does.
pub fn max_pool3d_generic(x: &Tensor, k: [usize; 3]) -> Result<Tensor> {
    windows(x, k, "max_pool3d")?.max(7)?.max(5)?.max(3)
}

/// Average pooling from built-in ops (any device).
pub fn avg_pool3d(x: &Tensor, k: [usize; 3]) -> Result<Tensor> {
    let count = (k[0] * k[1] * k[2]) as f64;
    windows(x, k, "avg_pool3d")?
        .sum(7)?
        .sum(5)?
        .sum(3)?
        .affine(1.0 / count, 0.0)
}

/// Index (within one channel plane) of the first maximum of every window, in output order.
fn argmax_plane(x: &[f32], size: [usize; 3], k: [usize; 3], mut visit: impl FnMut(usize, usize)) {
    let [_, h, w] = size;
    let [pd, ph, pw] = [0, 1, 2].map(|a| size[a] / k[a]);
    let mut o = 0;
    for od in 0..pd {
        for oh in 0..ph {
            for ow in 0..pw {
                let mut best = (od * k[0] * h + oh * k[1]) * w + ow * k[2];
                for a in 0..k[0] {
                    for b in 0..k[1] {
                        let row = ((od * k[0] + a) * h + oh * k[1] + b) * w + ow * k[2];
                        for i in row..row + k[2] {
                            if x[i] > x[best] {
                                best = i;
                            }
                        }
                    }
                }
                visit(o, best);
                o += 1;
            }
        }
    }
}

fn plane_data<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = s else {
        bail!("{what}: only f32 tensors are supported")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => bail!("{what}: argument must be contiguous"),
    }
}

/// CPU max pooling, argument x (contiguous f32).
pub struct MaxPool3d(pub [usize; 3]);
/// Its gradient, arguments (x, dy): dy routed to each window's first maximum.
pub struct MaxPool3dGrad(pub [usize; 3]);

impl CustomOp1 for MaxPool3d {
    fn name(&self) -> &'static str {
        "max-pool3d"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let ([n, c, d, h, w], [pd, ph, pw]) = pooled_dims(l.dims(), self.0, "max_pool3d")?;
        let x = plane_data(s, l, "max_pool3d")?;
        let (vin, vout) = (d * h * w, pd * ph * pw);
        let mut y = vec![0f32; n * c * vout];
        y.par_chunks_mut(vout)
            .zip(x.par_chunks(vin))
            .for_each(|(yp, xp)| {
                argmax_plane(xp, [d, h, w], self.0, |o, i| yp[o] = xp[i]);
            });
        Ok((CpuStorage::F32(y), Shape::from(vec![n, c, pd, ph, pw])))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use super::cuda::{launch, view, with_element};
        use candle_core::backend::BackendStorage;
        let what = "max_pool3d";
        let ([n, c, d, h, w], [pd, ph, pw]) = pooled_dims(l.dims(), self.0, what)?;
        let y = with_element!(s.dtype(), what, T => {
            let x = view::<T>(s, l, what)?;
            let out = n * c * pd * ph * pw;
            let y = launch::max_pool_forward(&s.device, &x, [d, h, w], self.0, out)?;
            candle_core::CudaStorage::wrap_cuda_slice(y, s.device.clone())
        });
        Ok((y, Shape::from(vec![n, c, pd, ph, pw])))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(
            &dy.contiguous()?,
            &MaxPool3dGrad(self.0),
        )?))
    }
}

impl CustomOp2 for MaxPool3dGrad {
    fn name(&self) -> &'static str {
        "max-pool3d-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ([n, c, d, h, w], [pd, ph, pw]) = pooled_dims(l1.dims(), self.0, "max_pool3d grad")?;
        if l2.dims() != [n, c, pd, ph, pw] {
            bail!(
                "max_pool3d grad: dy shape {:?} does not match x {:?}",
                l2.dims(),
                l1.dims()
            );
        }
        let x = plane_data(s1, l1, "max_pool3d grad")?;
        let dy = plane_data(s2, l2, "max_pool3d grad")?;
        let (vin, vout) = (d * h * w, pd * ph * pw);
        let mut dx = vec![0f32; x.len()];
        dx.par_chunks_mut(vin)
            .zip(x.par_chunks(vin).zip(dy.par_chunks(vout)))
            .for_each(|(dxp, (xp, dyp))| {
                argmax_plane(xp, [d, h, w], self.0, |o, i| dxp[i] = dyp[o]);
            });
        Ok((CpuStorage::F32(dx), Shape::from(l1.dims())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let ([n, c, d, h, w], [pd, ph, pw]) = pooled_dims(l1.dims(), self.0, "max_pool3d grad")?;
        if l2.dims() != [n, c, pd, ph, pw] {
            bail!(
                "max_pool3d grad: dy shape {:?} does not match x {:?}",
                l2.dims(),
                l1.dims()
            );
        }
        use super::cuda::{launch, view, with_element};
        use candle_core::backend::BackendStorage;
        let what = "max_pool3d grad";
        let dx = with_element!(s1.dtype(), what, T => {
            let (x, dy) = (view::<T>(s1, l1, what)?, view::<T>(s2, l2, what)?);
            let numel = l1.shape().elem_count();
            let dx = launch::max_pool_backward(&s1.device, &x, &dy, [d, h, w], self.0, numel)?;
            candle_core::CudaStorage::wrap_cuda_slice(dx, s1.device.clone())
        });
        Ok((dx, Shape::from(l1.dims())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn empty_tensors_are_an_error_not_a_panic() {
        for dims in [[1, 1, 0, 2, 2], [0, 1, 2, 2, 2], [1, 0, 2, 2, 2]] {
            let x = Tensor::zeros(&dims, DType::F32, &Device::Cpu).unwrap();
            let e = crate::model::ops::max_pool3d(&x, [1, 2, 2]).unwrap_err();
            assert!(e.to_string().contains("empty"), "{e}");
        }
    }
}
