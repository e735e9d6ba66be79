//! A training block's convolution (bias included) and its norm + LeakyReLU as one op on the
//! CPU. The convolution's output, which the norm's backward reads, is kept inside the op
//! instead of being a tensor of the graph: the graph holds one tensor per block instead of
//! two, and candle's backward makes (zeros, then a sum) one gradient of the activations' size
//! per block instead of two. The values and gradients are the two ops' bit for bit.

use std::sync::Mutex;

use candle_core::{bail, CpuStorage, CustomOp3, Device, Layout, Result, Shape, Tensor};

use super::bias::ChannelSum;
use super::conv::{with_bias_cpu, Conv3dForward};
use super::norm::GroupNormLeakyRelu;
use super::stored::Stored;
use super::tape::Grads2;

/// The norm and activation after a convolution: weight and bias (C,), groups, eps, slope.
pub struct NormAct<'a> {
    /// The norm's weight (gamma).
    pub weight: &'a Tensor,
    /// The norm's bias (beta).
    pub bias: &'a Tensor,
    /// Groups of channels (the channels: instance norm).
    pub groups: usize,
    /// Added to the variance.
    pub eps: f64,
    /// LeakyReLU's slope (1: no activation).
    pub slope: f64,
}

/// The op on (x, w, [conv bias | norm weight | norm bias]).
pub(super) struct ConvNormAct {
    pub(super) conv: Conv3dForward,
    pub(super) norm: GroupNormLeakyRelu,
    /// The convolution's output, for the backward pass.
    pub(super) saved: Mutex<Option<Tensor>>,
}

fn poisoned<T>(_: T) -> candle_core::Error {
    candle_core::Error::Msg("conv-norm: a thread panicked holding its saved output".into())
}

impl CustomOp3 for ConvNormAct {
    fn name(&self) -> &'static str {
        "conv-norm-leaky-relu"
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
        let c = self.conv.0.cout;
        let params = super::conv::f32_data(s3, l3, &[3 * c], self.name())?;
        let (b, rest) = params.split_at(c);
        let (nw, nb) = rest.split_at(c);
        let (y, shape) = with_bias_cpu(&self.conv, (s1, l1), (s2, l2), b)?;
        let z = match &y {
            CpuStorage::F32(v) => self
                .norm
                .forward_cpu(Stored::F32(v), shape.dims(), nw, nb)?,
            CpuStorage::BF16(v) => self
                .norm
                .forward_cpu(Stored::Bf16(v), shape.dims(), nw, nb)?,
            _ => bail!("{}: f32 or bf16 tensors only", self.name()),
        };
        let y = match y {
            CpuStorage::F32(v) => Tensor::from_vec(v, shape.clone(), &Device::Cpu)?,
            CpuStorage::BF16(v) => Tensor::from_vec(v, shape.clone(), &Device::Cpu)?,
            _ => bail!("{}: f32 or bf16 tensors only", self.name()),
        };
        *self.saved.lock().map_err(poisoned)? = Some(y);
        Ok((z, shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        params: &Tensor,
        _z: &Tensor,
        dz: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, dp) = self.grads(x, w, params, dz, [x.track_op(), w.track_op()])?;
        Ok((dx, dw, Some(dp)))
    }
}

impl ConvNormAct {
    /// (dx, dw) where `need`ed and the parameters' gradient, from the result's gradient `dz`.
    pub(super) fn grads(
        &self,
        x: &Tensor,
        w: &Tensor,
        params: &Tensor,
        dz: &Tensor,
        need: [bool; 2],
    ) -> Result<(Option<Tensor>, Option<Tensor>, Tensor)> {
        let y = self.saved.lock().map_err(poisoned)?.clone();
        let Some(y) = y else {
            bail!("{}: backward before forward", self.name())
        };
        let c = self.conv.0.cout;
        let (nw, nb) = (params.narrow(0, c, c)?, params.narrow(0, 2 * c, c)?);
        let (dy, dnw, dnb) = self.norm.backward(&y, &nw, &nb, dz)?;
        drop(y);
        let (dx, dw) = self.conv.grads(x, w, &dy, need)?;
        let db = dy.apply_op1_no_bwd(&ChannelSum)?;
        let dp = Tensor::cat(&[&db, &dnw, &dnb], 0)?;
        Ok((dx, dw, dp))
    }
}
