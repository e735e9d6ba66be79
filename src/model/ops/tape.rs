//! A training pass's own record of its ops (a tape) on the CPU, in place of candle's graph.
//!
//! candle's backward makes every node's gradient as a fresh zeroed tensor plus a sum, in bf16
//! a slow one, and keeps every activation until the whole graph is dropped. The tape records
//! each op with its backward; its backward pass hands each gradient on as it is, sums only
//! where two paths meet (the skip connections), and frees each op's saved tensors once it has
//! run. The convolutions with their bias, the block's conv-norm op, the casts and the
//! concatenation have entries of their own; any other op runs under a small candle graph of
//! its own (see [`Tape::generic`]). The gradients are candle's graph's bit for bit where at
//! most two paths meet (a plain U-Net's); where three do, in another order of summation.

use std::collections::{HashMap, HashSet};

use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, TensorId, Var,
};

use super::activation::AddLeakyRelu;
use super::conv::{Conv3dForward, Conv3dGradInput, Conv3dGradWeight, WithBias};
use super::conv_norm::NormAct;
use super::geometry::Products;

/// The gradients of a two-argument op for the arguments that `need` them, from the
/// gradient `dy` of its result (the op's backward without reading the result).
pub trait Grads2 {
    /// (d first argument, d second argument), each where needed.
    fn grads(
        &self,
        a: &Tensor,
        b: &Tensor,
        dy: &Tensor,
        need: [bool; 2],
    ) -> Result<(Option<Tensor>, Option<Tensor>)>;
}

impl Grads2 for Conv3dForward {
    fn grads(
        &self,
        x: &Tensor,
        w: &Tensor,
        dy: &Tensor,
        [need_x, need_w]: [bool; 2],
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = dy.contiguous()?;
        let dx = match need_x {
            true => Some(dy.apply_op2_no_bwd(w, &Conv3dGradInput(self.0))?),
            false => None,
        };
        let dw = match need_w {
            true => Some(x.apply_op2_no_bwd(&dy, &Conv3dGradWeight(self.0))?),
            false => None,
        };
        Ok((dx, dw))
    }
}

impl Grads2 for Conv3dGradInput {
    fn grads(
        &self,
        dy: &Tensor,
        w: &Tensor,
        up: &Tensor,
        [need_dy, need_w]: [bool; 2],
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let up = up.contiguous()?;
        let d_dy = match need_dy {
            true => Some(up.apply_op2_no_bwd(w, &Conv3dForward(self.0))?),
            false => None,
        };
        let d_w = match need_w {
            true => Some(up.apply_op2_no_bwd(dy, &Conv3dGradWeight(self.0))?),
            false => None,
        };
        Ok((d_dy, d_w))
    }
}

/// An op's backward: its result's gradient and which arguments need theirs, to the
/// arguments' gradients (None where not needed).
type Backward = Box<dyn FnOnce(&Tensor, &[bool]) -> Result<Vec<Option<Tensor>>>>;

struct Step {
    inputs: Vec<TensorId>,
    need: Vec<bool>,
    output: TensorId,
    backward: Backward,
}

/// The ops of one training pass, in the order they ran.
#[derive(Default)]
pub struct Tape {
    steps: Vec<Step>,
    /// The tensors that need a gradient: the parameters and what was computed from them.
    live: HashSet<TensorId>,
}

impl std::fmt::Debug for Tape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tape({} ops)", self.steps.len())
    }
}

impl Tape {
    /// Keep `backward` for `y = op(inputs)` where some input needs a gradient.
    fn record(&mut self, inputs: &[&Tensor], y: &Tensor, backward: Backward) {
        let need: Vec<bool> = inputs.iter().map(|t| self.live.contains(&t.id())).collect();
        if need.contains(&true) {
            self.live.insert(y.id());
            self.steps.push(Step {
                inputs: inputs.iter().map(|t| t.id()).collect(),
                need,
                output: y.id(),
                backward,
            });
        }
    }

    /// The parameter `v` (a variable) as the pass reads it, in `dt`: its gradient comes back
    /// in `v`'s type under `v`'s id.
    pub fn param(&mut self, v: &Tensor, dt: DType) -> Result<Tensor> {
        self.live.insert(v.id());
        self.cast(v, dt)
    }

    /// `x` in `dt` (`x` itself where it is of that type).
    pub fn cast(&mut self, x: &Tensor, dt: DType) -> Result<Tensor> {
        if x.dtype() == dt {
            return Ok(x.clone());
        }
        let (y, from) = (x.detach().to_dtype(dt)?, x.dtype());
        self.record(
            &[x],
            &y,
            Box::new(move |g, _| Ok(vec![Some(g.to_dtype(from)?)])),
        );
        Ok(y)
    }

    /// The concatenation of `ts` along `dim`.
    pub fn cat(&mut self, ts: &[&Tensor], dim: usize) -> Result<Tensor> {
        let parts: Vec<Tensor> = ts.iter().map(|t| t.detach()).collect();
        let y = Tensor::cat(&parts, dim)?;
        let sizes = ts.iter().map(|t| t.dim(dim)).collect::<Result<Vec<_>>>()?;
        let backward = move |g: &Tensor, need: &[bool]| {
            let mut start = 0;
            let mut out = Vec::with_capacity(sizes.len());
            for (n, needed) in sizes.iter().zip(need) {
                out.push(match needed {
                    true => Some(g.narrow(dim, start, *n)?),
                    false => None,
                });
                start += n;
            }
            Ok(out)
        };
        self.record(ts, &y, Box::new(backward));
        Ok(y)
    }

    /// `f(inputs)`, any composition of candle's ops and ours, differentiated by candle under a
    /// graph of its own: the inputs that need a gradient run as variables (copies, where they
    /// are not parameters), and the backward seeds the result with its gradient.
    pub fn generic(
        &mut self,
        inputs: &[&Tensor],
        f: impl FnOnce(&[Tensor]) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let mut vars = Vec::with_capacity(inputs.len());
        let mut args = Vec::with_capacity(inputs.len());
        for t in inputs {
            if self.live.contains(&t.id()) {
                let v = Var::from_tensor(t)?;
                args.push(v.as_tensor().clone());
                vars.push(Some(v));
            } else {
                args.push(t.detach());
                vars.push(None);
            }
        }
        let y = f(&args)?;
        drop(args);
        let out = y.detach();
        let backward = move |g: &Tensor, _: &[bool]| {
            let grads = y.apply_op1(Seed(g.clone()))?.backward()?;
            Ok(vars
                .iter()
                .map(|v| v.as_ref().and_then(|v| grads.get(v.as_tensor()).cloned()))
                .collect())
        };
        self.record(inputs, &out, Box::new(backward));
        Ok(out)
    }

    /// [`super::conv_norm_leaky_relu`].
    #[allow(clippy::too_many_arguments)] // the op's own arguments and the tape
    pub fn conv_norm_leaky_relu(
        &mut self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        padding: [usize; 3],
        stride: [usize; 3],
        products: Products,
        norm: NormAct,
    ) -> Result<Tensor> {
        if !super::conv_norm_fused(x, w, b, &norm)? {
            let (nw, nb) = (norm.weight, norm.bias);
            let (groups, eps, slope) = (norm.groups, norm.eps, norm.slope);
            return self.generic(&[x, w, b, nw, nb], |t| {
                let norm = NormAct {
                    weight: &t[3],
                    bias: &t[4],
                    groups,
                    eps,
                    slope,
                };
                super::conv_norm_leaky_relu(&t[0], &t[1], &t[2], padding, stride, products, norm)
            });
        }
        let params = self.cat(&[b, norm.weight, norm.bias], 0)?;
        let op = super::conv_norm_op(x, w, padding, stride, products, &norm)?;
        let (xc, wc) = (x.detach().contiguous()?, w.detach().contiguous()?);
        let y = xc.apply_op3_no_bwd(&wc, &params, &op)?;
        let p = params.clone();
        let backward = move |g: &Tensor, need: &[bool]| {
            let (dx, dw, dp) = op.grads(&xc, &wc, &p, g, [need[0], need[1]])?;
            Ok(vec![dx, dw, Some(dp)])
        };
        self.record(&[x, w, &params], &y, Box::new(backward));
        Ok(y)
    }

    /// [`super::add_leaky_relu`].
    pub fn add_leaky_relu(&mut self, x: &Tensor, skip: &Tensor, slope: f64) -> Result<Tensor> {
        if !super::activation::fused(x, skip) {
            return self.generic(&[x, skip], |t| super::add_leaky_relu(&t[0], &t[1], slope));
        }
        let (xc, sc) = (x.detach().contiguous()?, skip.detach().contiguous()?);
        let op = AddLeakyRelu(slope as f32);
        let y = xc.apply_op2_no_bwd(&sc, &op)?;
        let backward = move |g: &Tensor, _: &[bool]| {
            let (dx, ds) = op.bwd(&xc, &sc, g, g)?;
            Ok(vec![dx, ds])
        };
        self.record(&[x, skip], &y, Box::new(backward));
        Ok(y)
    }

    /// [`super::conv3d_bias_in`].
    pub fn conv3d_bias(
        &mut self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        padding: [usize; 3],
        stride: [usize; 3],
        products: Products,
    ) -> Result<Tensor> {
        if !super::conv_bias_fused(x, w, b, 0)? {
            return self.generic(&[x, w, b], |t| {
                super::conv3d_bias_in(&t[0], &t[1], &t[2], padding, stride, products)
            });
        }
        let geom = super::forward_geom(x, w, padding, stride, products)?;
        self.biased(x, w, b, WithBias(Conv3dForward(geom)))
    }

    /// [`super::conv_transpose3d_bias`].
    pub fn conv_transpose3d_bias(
        &mut self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        stride: [usize; 3],
        products: Products,
    ) -> Result<Tensor> {
        if !super::conv_bias_fused(x, w, b, 1)? {
            return self.generic(&[x, w, b], |t| {
                super::conv_transpose3d_bias(&t[0], &t[1], &t[2], stride, products)
            });
        }
        let mut geom = super::transpose_geom(x, w, stride)?;
        geom.products = products;
        self.biased(x, w, b, WithBias(Conv3dGradInput(geom)))
    }

    /// `op` (a convolution with its bias) on (x, w, b).
    fn biased<O>(&mut self, x: &Tensor, w: &Tensor, b: &Tensor, op: WithBias<O>) -> Result<Tensor>
    where
        O: candle_core::CustomOp2 + super::conv::BiasedBf16 + Grads2 + Send + Sync + 'static,
    {
        let (xc, wc) = (x.detach().contiguous()?, w.detach().contiguous()?);
        let y = xc.apply_op3_no_bwd(&wc, &b.detach().contiguous()?, &op)?;
        let backward = move |g: &Tensor, need: &[bool]| {
            let (dx, dw, db) = op.grads(&xc, &wc, g, [need[0], need[1], need[2]])?;
            Ok(vec![dx, dw, db])
        };
        self.record(&[x, w, b], &y, Box::new(backward));
        Ok(y)
    }

    /// The gradients of the recorded tensors' leaves (the parameters), keyed by their ids,
    /// from the gradients `seeds` of the pass's results. Each op's saved tensors are freed
    /// once its backward has run.
    pub fn backward(
        self,
        seeds: impl IntoIterator<Item = (TensorId, Tensor)>,
    ) -> Result<HashMap<TensorId, Tensor>> {
        let mut grads = HashMap::new();
        for (id, g) in seeds {
            accumulate(&mut grads, id, g)?;
        }
        for step in self.steps.into_iter().rev() {
            let Some(g) = grads.remove(&step.output) else {
                continue; // nothing downstream of it reached the loss
            };
            let g = g.contiguous()?;
            let out = (step.backward)(&g, &step.need)?;
            drop(g);
            for ((id, needed), gi) in step.inputs.iter().zip(&step.need).zip(out) {
                if let (true, Some(gi)) = (needed, gi) {
                    accumulate(&mut grads, *id, gi)?;
                }
            }
        }
        Ok(grads)
    }
}

/// Add `g` to the gradient of `id`: the first arrives as it is, a second is summed (where two
/// paths meet; the same bits as candle's sum, which its graph computes).
fn accumulate(grads: &mut HashMap<TensorId, Tensor>, id: TensorId, g: Tensor) -> Result<()> {
    let sum = match grads.remove(&id) {
        Some(prev) => super::activation::add(&prev, &g)?,
        None => g,
    };
    grads.insert(id, sum);
    Ok(())
}

/// A scalar of `arg` whose backward hands `arg` the gradient it holds: how a generic entry's
/// own graph is seeded with its result's gradient.
struct Seed(Tensor);

impl CustomOp1 for Seed {
    fn name(&self) -> &'static str {
        "tape-seed"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        Ok((CpuStorage::F32(vec![0.0]), Shape::from(())))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, _g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(self.0.clone()))
    }
}
