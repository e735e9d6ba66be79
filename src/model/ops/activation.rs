//! The residual block's ending, `leaky_relu(x + skip)`, as one op.
//!
//! Written with candle's ops it keeps the sum, its product with the slope and their maximum for
//! the backward pass, whose mask arithmetic then makes half a dozen more tensors of the same
//! size: the largest share of a residual encoder's training memory. Here the forward keeps
//! only its output (its inputs are kept by the layers that made them) and the backward is one
//! pass recomputing the sign of the sum. Devices without a CPU implementation use the
//! composition.

use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use super::norm::contiguous_f32;

/// `leaky_relu(x + skip)` with negative slope `slope`, x and skip of one shape.
pub fn add_leaky_relu(x: &Tensor, skip: &Tensor, slope: f64) -> Result<Tensor> {
    if x.dims() != skip.dims() {
        bail!(
            "add_leaky_relu: x {:?} and skip {:?} differ",
            x.dims(),
            skip.dims()
        );
    }
    if super::fast_path(&[x, skip]) && x.device().is_cpu() {
        return x
            .contiguous()?
            .apply_op2(&skip.contiguous()?, AddLeakyRelu(slope as f32));
    }
    let sum = (x + skip)?;
    sum.maximum(&(&sum * slope)?)
}

struct AddLeakyRelu(f32);

/// (x, skip, dy) -> dy where x + skip > 0, else slope * dy.
struct AddLeakyReluGrad(f32);

fn act(v: f32, slope: f32) -> f32 {
    if v > 0.0 {
        v
    } else {
        v * slope
    }
}

impl CustomOp2 for AddLeakyRelu {
    fn name(&self) -> &'static str {
        "add-leaky-relu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s1, l1, self.name())?;
        let s = contiguous_f32(s2, l2, self.name())?;
        let y = x.iter().zip(s).map(|(a, b)| act(a + b, self.0)).collect();
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        skip: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let d = x.apply_op3_no_bwd(skip, &dy.contiguous()?, &AddLeakyReluGrad(self.0))?;
        Ok((Some(d.clone()), Some(d)))
    }
}

impl CustomOp3 for AddLeakyReluGrad {
    fn name(&self) -> &'static str {
        "add-leaky-relu-grad"
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
        let x = contiguous_f32(s1, l1, self.name())?;
        let s = contiguous_f32(s2, l2, self.name())?;
        let dy = contiguous_f32(s3, l3, self.name())?;
        let d = x
            .iter()
            .zip(s)
            .zip(dy)
            .map(|((a, b), g)| if a + b > 0.0 { *g } else { g * self.0 })
            .collect();
        Ok((CpuStorage::F32(d), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Value and gradients equal the composition's (the generic path, on the same numbers).
    #[test]
    fn matches_the_composition_forward_and_backward() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (2, 3, 4, 5, 6), &dev)?)?;
        let s = Var::from_tensor(&Tensor::randn(0f32, 1.0, (2, 3, 4, 5, 6), &dev)?)?;
        let w = Tensor::randn(0f32, 1.0, (2, 3, 4, 5, 6), &dev)?;
        let fused = add_leaky_relu(x.as_tensor(), s.as_tensor(), 0.01)?;
        let sum = (x.as_tensor() + s.as_tensor())?;
        let plain = sum.maximum(&(&sum * 0.01)?)?;
        let diff = (&fused - &plain)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-6, "{diff}");
        let gf = (&fused * &w)?.sum_all()?.backward()?;
        let gp = (&plain * &w)?.sum_all()?.backward()?;
        for v in [&x, &s] {
            let a = gf.get(v.as_tensor()).unwrap();
            let b = gp.get(v.as_tensor()).unwrap();
            let d = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(d < 1e-6, "{d}");
        }
        Ok(())
    }
}
