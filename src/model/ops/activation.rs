//! The residual block's ending, `leaky_relu(x + skip)`, as one op.
//!
//! Written with candle's ops it keeps the sum, its product with the slope and their maximum for
//! the backward pass, whose mask arithmetic then makes half a dozen more tensors of the same
//! size: the largest share of a residual encoder's training memory. Here the forward keeps
//! only its output (its inputs are kept by the layers that made them) and the backward is one
//! pass recomputing the sign of the sum. On the CPU it takes f32 or bf16 tensors (a bf16
//! training pass's activations: widened, summed in f32, rounded once); other devices use the
//! composition.

use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use half::bf16;
use rayon::prelude::*;

use super::direct::Cast;
use super::stored::Stored;

/// `leaky_relu(x + skip)` with negative slope `slope`, x and skip of one shape.
pub fn add_leaky_relu(x: &Tensor, skip: &Tensor, slope: f64) -> Result<Tensor> {
    if x.dims() != skip.dims() {
        bail!(
            "add_leaky_relu: x {:?} and skip {:?} differ",
            x.dims(),
            skip.dims()
        );
    }
    if fused(x, skip) {
        return x
            .contiguous()?
            .apply_op2(&skip.contiguous()?, AddLeakyRelu(slope as f32));
    }
    let sum = (x + skip)?;
    sum.maximum(&(&sum * slope)?)
}

/// `a + b` of two tensors of one shape. bf16 CPU tensors are widened, summed in f32 and
/// rounded once, as candle does it, but sixteen values a step where candle makes a conversion
/// call every eight (the training tape's sum where two paths meet).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match a.dims() == b.dims() && super::cpu_bf16(&[a, b]) {
        true => a.contiguous()?.apply_op2_no_bwd(&b.contiguous()?, &Add),
        false => a + b,
    }
}

/// `a + b` on the CPU (see [`add`]).
struct Add;

impl CustomOp2 for Add {
    fn name(&self) -> &'static str {
        "add"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let n = l1.shape().elem_count();
        let a = Stored::of(s1, l1, n, self.name())?;
        let b = Stored::of(s2, l2, n, self.name())?;
        Ok((
            elementwise([a, b], self.name(), |[a, b]| a + b)?,
            l1.shape().clone(),
        ))
    }
}

/// Whether [`add_leaky_relu`] runs as one op: CPU tensors, both f32 or both bf16.
pub(super) fn fused(x: &Tensor, skip: &Tensor) -> bool {
    x.dims() == skip.dims() && (super::cpu_f32(&[x, skip]) || super::cpu_bf16(&[x, skip]))
}

/// The op on (x, skip), of slope `.0`.
pub(super) struct AddLeakyRelu(pub(super) f32);

/// (x, skip, dy) -> dy where x + skip > 0, else slope * dy.
struct AddLeakyReluGrad(f32);

/// Values per task of the elementwise passes.
const CHUNK: usize = 1 << 14;

/// `f` of the arguments' values, which are all f32 or all bf16 and of one length: computed in
/// f32 a chunk at a time in parallel, the result of the arguments' type (rounded once).
fn elementwise<const N: usize>(
    args: [Stored<'_>; N],
    what: &str,
    f: impl Fn([f32; N]) -> f32 + Sync,
) -> Result<CpuStorage> {
    let (n, bf) = (args[0].len(), args[0].is_bf16());
    if args.iter().any(|a| a.len() != n || a.is_bf16() != bf) {
        bail!("{what}: arguments of one type and length only");
    }
    let f32s: Option<Vec<&[f32]>> = args
        .iter()
        .map(|a| match a {
            Stored::F32(d) => Some(*d),
            Stored::Bf16(_) => None,
        })
        .collect();
    if let Some(src) = f32s {
        let mut out = vec![0f32; n];
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, o)| {
            for (j, v) in o.iter_mut().enumerate() {
                *v = f(std::array::from_fn(|k| src[k][i * CHUNK + j]));
            }
        });
        return Ok(CpuStorage::F32(out));
    }
    let chunk = |i: usize, len: usize| -> Vec<f32> {
        let wide: Vec<Vec<f32>> = args
            .iter()
            .map(|a| {
                let mut v = vec![0f32; len];
                a.widen(i * CHUNK, &mut v);
                v
            })
            .collect();
        (0..len)
            .map(|j| f(std::array::from_fn(|k| wide[k][j])))
            .collect()
    };
    let mut out = vec![bf16::ZERO; n];
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(i, o)| <f32 as Cast<bf16>>::cast_row(&chunk(i, o.len()), o));
    Ok(CpuStorage::BF16(out))
}

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
        let n = l1.shape().elem_count();
        let x = Stored::of(s1, l1, n, self.name())?;
        let s = Stored::of(s2, l2, n, self.name())?;
        let y = elementwise([x, s], self.name(), |[a, b]| act(a + b, self.0))?;
        Ok((y, l1.shape().clone()))
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
        let n = l1.shape().elem_count();
        let x = Stored::of(s1, l1, n, self.name())?;
        let s = Stored::of(s2, l2, n, self.name())?;
        let dy = Stored::of(s3, l3, n, self.name())?;
        let slope = self.0;
        let d = elementwise([x, s, dy], self.name(), |[a, b, g]| match a + b > 0.0 {
            true => g,
            false => g * slope,
        })?;
        Ok((d, l1.shape().clone()))
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

    /// On bf16 tensors: the f32 op on the widened values, rounded once (value and gradients).
    #[test]
    fn bf16_tensors_get_the_f32_op_rounded_once() -> Result<()> {
        let dev = Device::Cpu;
        let bf = |t: Tensor| t.to_dtype(candle_core::DType::BF16);
        // More values than one chunk, so the parallel split is exercised.
        let shape = (2, 3, 8, 40, 50);
        let x = bf(Tensor::randn(0f32, 1.0, shape, &dev)?)?;
        let s = bf(Tensor::randn(0f32, 1.0, shape, &dev)?)?;
        let dy = bf(Tensor::randn(0f32, 1.0, shape, &dev)?)?;
        let wide = |t: &Tensor| t.to_dtype(candle_core::DType::F32);
        let bits = |t: &Tensor| -> Result<Vec<u16>> {
            Ok(t.flatten_all()?
                .to_vec1::<half::bf16>()?
                .iter()
                .map(|v| v.to_bits())
                .collect())
        };
        let y = add_leaky_relu(&x, &s, 0.01)?;
        assert_eq!(y.dtype(), candle_core::DType::BF16);
        let want = bf(add_leaky_relu(&wide(&x)?, &wide(&s)?, 0.01)?)?;
        assert_eq!(bits(&y)?, bits(&want)?);
        let (dx, ds) = AddLeakyRelu(0.01).bwd(&x, &s, &y, &dy)?;
        let (dx, ds) = (dx.unwrap(), ds.unwrap());
        let (wx, _) = AddLeakyRelu(0.01).bwd(&wide(&x)?, &wide(&s)?, &y, &wide(&dy)?)?;
        let want = bf(wx.unwrap())?;
        assert_eq!(bits(&dx)?, bits(&want)?);
        assert_eq!(bits(&ds)?, bits(&want)?);
        Ok(())
    }
}
