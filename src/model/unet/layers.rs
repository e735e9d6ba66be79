//! The U-Net's layers: seeded parameters, convolution, the conv-norm-activation block,
//! nnU-Net's residual block, and the decoder's upsampling.

use std::cell::RefCell;

use candle_core::{DType, Device, Tensor, Var};

use super::super::config::{Norm, DS_PREFIX};
use super::super::ops;
use crate::error::Result;
use crate::util::rng::Rng;

/// `t` in `dt`: parameters are kept in f32 and cast on use, so their gradients come back f32.
pub(super) fn cast(t: &Tensor, dt: DType) -> Result<Tensor> {
    Ok(t.to_dtype(dt)?)
}

/// What a pass is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// Training: every op records its inputs for the backward pass (the parameters are
    /// variables), so every activation stays alive until the graph is dropped.
    Train,
    /// Prediction: the parameters are read detached, so no op records anything and each
    /// activation is freed as soon as the next layer has read it.
    Infer,
}

/// One pass through the network: what it is for, and what its convolutions multiply in on
/// the CPU (bf16 precision there keeps f32 tensors and multiplies in bf16 inside them).
#[derive(Clone, Copy, Debug)]
pub(super) struct Pass<'a> {
    pub(super) mode: Mode,
    pub(super) products: ops::Products,
    /// Where each LeakyReLU's output goes, in forward order, when the pass is traced.
    pub(super) trace: Option<&'a RefCell<Vec<Tensor>>>,
    /// Where a training pass records its ops instead of candle's graph (see [`ops::Tape`]).
    pub(super) tape: Option<&'a RefCell<ops::Tape>>,
}

impl Pass<'_> {
    /// A bias or norm parameter `t` as this pass reads it next to tensors of type `dt`: f32
    /// beside a bf16 training pass's bf16 activations on the CPU (its ops add and scale in
    /// f32), else `dt`.
    fn small(self, t: &Tensor, dt: DType) -> Result<Tensor> {
        match self.products {
            ops::Products::Bf16 => self.param(t, DType::F32),
            ops::Products::F32 => self.param(t, dt),
        }
    }

    /// Keep `y`, a LeakyReLU's output, when the pass is traced.
    fn record(self, y: &Tensor) {
        if let Some(t) = self.trace {
            t.borrow_mut().push(y.clone());
        }
    }

    /// Parameter `t` as this pass reads it (detached: no graph when inferring).
    fn param(self, t: &Tensor, dt: DType) -> Result<Tensor> {
        match (self.mode, self.tape) {
            (Mode::Train, Some(tape)) => Ok(tape.borrow_mut().param(t, dt)?),
            (Mode::Train, None) => cast(t, dt),
            (Mode::Infer, _) => cast(&t.detach(), dt),
        }
    }

    /// `t` in `dt`.
    pub(super) fn cast(self, t: &Tensor, dt: DType) -> Result<Tensor> {
        match self.tape {
            Some(tape) => Ok(tape.borrow_mut().cast(t, dt)?),
            None => cast(t, dt),
        }
    }

    /// `f(inputs)`: recorded on the tape, where the pass has one, as a generic op.
    pub(super) fn op(
        self,
        inputs: &[&Tensor],
        f: impl FnOnce(&[Tensor]) -> candle_core::Result<Tensor>,
    ) -> Result<Tensor> {
        Ok(match self.tape {
            Some(tape) => tape.borrow_mut().generic(inputs, f)?,
            None => f(&inputs.iter().map(|t| (*t).clone()).collect::<Vec<_>>())?,
        })
    }

    /// The channels of `ts` one after the other.
    pub(super) fn cat(self, ts: &[&Tensor]) -> Result<Tensor> {
        Ok(match self.tape {
            Some(tape) => tape.borrow_mut().cat(ts, 1)?,
            None => Tensor::cat(ts, 1)?,
        })
    }

    /// `y + b[c]`, into `y` itself when inferring (`y` is the fresh output of a conv).
    fn add_bias(self, y: Tensor, b: &Tensor) -> Result<Tensor> {
        match self.mode {
            Mode::Train => self.op(&[&y, b], |t| ops::add_channel_bias(&t[0], &t[1])),
            Mode::Infer => Ok(ops::add_channel_bias_owned(y, b)?),
        }
    }
}

/// Named trainable parameters, created with seeded initial values.
pub(super) struct ParamStore {
    pub(super) params: Vec<(String, Var)>,
    rng: Rng,
    dev: Device,
}

impl ParamStore {
    pub(super) fn new(rng: Rng, dev: &Device) -> Self {
        ParamStore {
            params: Vec::new(),
            rng,
            dev: dev.clone(),
        }
    }

    fn add(&mut self, name: String, values: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
        let var = Var::from_tensor(&Tensor::from_vec(values, shape, &self.dev)?)?;
        let t = var.as_tensor().clone();
        self.params.push((name, var));
        Ok(t)
    }

    /// He-normal weights for LeakyReLU(0.01) (nnU-Net's init), fan-in = product of the other dims.
    pub(super) fn kaiming(
        &mut self,
        name: String,
        shape: &[usize],
        fan_in: usize,
    ) -> Result<Tensor> {
        let gain = (2.0 / (1.0 + 0.01f64 * 0.01)).sqrt();
        let std = gain / (fan_in.max(1) as f64).sqrt();
        let n: usize = shape.iter().product();
        let values = (0..n).map(|_| (self.rng.normal() * std) as f32).collect();
        self.add(name, values, shape)
    }

    pub(super) fn constant(&mut self, name: String, n: usize, value: f32) -> Result<Tensor> {
        self.add(name, vec![value; n], &[n])
    }

    /// Parameters sorted by name (the order optimizers and checkpoints use).
    pub(super) fn sorted(&self) -> Vec<(String, Var)> {
        let mut p = self.params.clone();
        p.sort_by(|a, b| a.0.cmp(&b.0));
        p
    }
}

pub(super) struct Conv {
    weight: Tensor,
    bias: Option<Tensor>,
    padding: [usize; 3],
    stride: [usize; 3],
}

impl Conv {
    pub(super) fn new(
        ps: &mut ParamStore,
        name: &str,
        cin: usize,
        cout: usize,
        k: [usize; 3],
        stride: [usize; 3],
    ) -> Result<Self> {
        let fan_in = cin * k.iter().product::<usize>();
        let weight = ps.kaiming(
            format!("{name}.weight"),
            &[cout, cin, k[0], k[1], k[2]],
            fan_in,
        )?;
        let bias = Some(ps.constant(format!("{name}.bias"), cout, 0.0)?);
        Ok(Conv {
            weight,
            bias,
            padding: k.map(|k| k / 2),
            stride,
        })
    }

    /// Without a bias (the residual block's projection: its norm would cancel one).
    fn without_bias(
        ps: &mut ParamStore,
        name: &str,
        cin: usize,
        cout: usize,
        k: [usize; 3],
    ) -> Result<Self> {
        let weight = ps.kaiming(
            format!("{name}.weight"),
            &[cout, cin, k[0], k[1], k[2]],
            cin * k.iter().product::<usize>(),
        )?;
        Ok(Conv {
            weight,
            bias: None,
            padding: k.map(|k| k / 2),
            stride: [1; 3],
        })
    }

    pub(super) fn forward(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let dt = x.dtype();
        let w = pass.param(&self.weight, dt)?;
        if let (Mode::Train, Some(b)) = (pass.mode, &self.bias) {
            // One tensor for the graph to keep, not the conv's output and its sum with b.
            let b = pass.small(b, dt)?;
            let (p, s, products) = (self.padding, self.stride, pass.products);
            return Ok(match pass.tape {
                Some(tape) => tape.borrow_mut().conv3d_bias(x, &w, &b, p, s, products)?,
                None => ops::conv3d_bias_in(x, &w, &b, p, s, products)?,
            });
        }
        let (p, s, products) = (self.padding, self.stride, pass.products);
        let y = pass.op(&[x, &w], |t| ops::conv3d_in(&t[0], &t[1], p, s, products))?;
        self.finish(y, pass)
    }

    /// [`Self::forward`] of the channels of `a` then `b` (a decoder's upsampled tensor and its
    /// skip connection) when inferring, without building their concatenation (training
    /// concatenates: [`Block::forward_pair`]).
    fn infer_pair(&self, a: &Tensor, b: &Tensor, pass: Pass) -> Result<Tensor> {
        let w = pass.param(&self.weight, a.dtype())?;
        let (p, s, products) = (self.padding, self.stride, pass.products);
        let y = ops::conv3d_concat_in(a, b, &w, p, s, products)?;
        self.finish(y, pass)
    }

    /// The conv's output `y` plus its bias.
    fn finish(&self, y: Tensor, pass: Pass) -> Result<Tensor> {
        match &self.bias {
            Some(b) => {
                let b = pass.small(b, y.dtype())?;
                pass.add_bias(y, &b)
            }
            None => Ok(y),
        }
    }
}

/// LeakyReLU's slope (nnU-Net's); a slope of 1 is no activation.
const SLOPE: f64 = 0.01;

/// conv -> norm -> LeakyReLU (the last two fused in [`ops::group_norm_leaky_relu`]), or
/// conv -> norm alone (slope 1) where a residual sum comes before the activation.
pub(super) struct Block {
    conv: Conv,
    norm_weight: Tensor,
    norm_bias: Tensor,
    groups: usize,
    slope: f64,
}

impl Block {
    #[allow(clippy::too_many_arguments)] // one block's whole shape, named at each call
    pub(super) fn new(
        ps: &mut ParamStore,
        name: &str,
        cin: usize,
        cout: usize,
        kernel: [usize; 3],
        stride: [usize; 3],
        norm: Norm,
    ) -> Result<Self> {
        let conv = Conv::new(ps, &format!("{name}.conv"), cin, cout, kernel, stride)?;
        Self::around(ps, name, conv, cout, norm, 1.0, SLOPE)
    }

    /// `conv` followed by its norm (weights initially `gamma`) and activation (`slope`).
    fn around(
        ps: &mut ParamStore,
        name: &str,
        conv: Conv,
        cout: usize,
        norm: Norm,
        gamma: f32,
        slope: f64,
    ) -> Result<Self> {
        let groups = match norm {
            Norm::Instance => cout,
            Norm::Group(g) => largest_divisor_at_most(cout, g),
        };
        let norm_weight = ps.constant(format!("{name}.norm.weight"), cout, gamma)?;
        let norm_bias = ps.constant(format!("{name}.norm.bias"), cout, 0.0)?;
        Ok(Block {
            conv,
            norm_weight,
            norm_bias,
            groups,
            slope,
        })
    }

    pub(super) fn forward(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let conv = &self.conv;
        if let (Mode::Train, Some(b)) = (pass.mode, &conv.bias) {
            // One op: the convolution's output stays inside it, out of the graph.
            let dt = x.dtype();
            let (w, b) = (pass.param(&conv.weight, dt)?, pass.small(b, dt)?);
            let nw = pass.small(&self.norm_weight, dt)?;
            let nb = pass.small(&self.norm_bias, dt)?;
            let norm = ops::NormAct {
                weight: &nw,
                bias: &nb,
                groups: self.groups,
                eps: 1e-5,
                slope: self.slope,
            };
            let (p, s, products) = (conv.padding, conv.stride, pass.products);
            let y = match pass.tape {
                Some(t) => t
                    .borrow_mut()
                    .conv_norm_leaky_relu(x, &w, &b, p, s, products, norm)?,
                None => ops::conv_norm_leaky_relu(x, &w, &b, p, s, products, norm)?,
            };
            if self.slope != 1.0 {
                pass.record(&y);
            }
            return Ok(y);
        }
        let y = self.conv.forward(x, pass)?;
        self.norm(y, pass)
    }

    /// [`Self::forward`] of the channels of `a` then `b`, never concatenated when inferring
    /// (see [`Conv::infer_pair`]).
    pub(super) fn forward_pair(&self, a: &Tensor, b: &Tensor, pass: Pass) -> Result<Tensor> {
        if pass.mode == Mode::Train {
            // Training concatenates: then the convolution and norm are one op.
            return self.forward(&pass.cat(&[a, b])?, pass);
        }
        let y = self.conv.infer_pair(a, b, pass)?;
        self.norm(y, pass)
    }

    /// Inferring, the decoder's first block on `up(low)` then `skip` (consumed) with the
    /// upsampled tensor never built ([`ops::conv3d_up_concat`]): `Ok(Err(skip))` where that
    /// does not apply (the caller upsamples, then calls [`Self::forward_pair`]).
    pub(super) fn forward_up_pair(
        &self,
        low: &Tensor,
        up: &Up,
        skip: Tensor,
        pass: Pass,
    ) -> Result<std::result::Result<Tensor, Tensor>> {
        let Up::Transpose {
            weight,
            bias,
            stride,
        } = up
        else {
            return Ok(Err(skip));
        };
        let conv = &self.conv;
        let plain = matches!(pass.mode, Mode::Infer) && conv.stride == [1; 3];
        if !plain {
            return Ok(Err(skip));
        }
        let dt = low.dtype();
        let (uw, ub) = (pass.param(weight, dt)?, pass.small(bias, dt)?);
        let w = pass.param(&conv.weight, dt)?;
        let up = ops::UpConv {
            weight: &uw,
            bias: Some(&ub),
            stride: *stride,
        };
        match ops::conv3d_up_concat(low, up, skip, &w, conv.padding, pass.products)? {
            Ok(y) => Ok(Ok(self.norm(conv.finish(y, pass)?, pass)?)),
            Err(skip) => Ok(Err(skip)),
        }
    }

    /// [`Self::forward`] consuming `x`: inferring, the convolution may write over it
    /// ([`ops::conv3d_owned`]). `x` must not be shared.
    pub(super) fn forward_owned(&self, x: Tensor, pass: Pass) -> Result<Tensor> {
        let conv = &self.conv;
        if !matches!(pass.mode, Mode::Infer) || conv.stride != [1; 3] {
            return self.forward(&x, pass);
        }
        let w = pass.param(&conv.weight, x.dtype())?;
        let y = ops::conv3d_owned(x, &w, conv.padding, pass.products)?;
        self.norm(conv.finish(y, pass)?, pass)
    }

    /// The norm and activation of the conv's output `y`.
    fn norm(&self, y: Tensor, pass: Pass) -> Result<Tensor> {
        let dt = y.dtype();
        let (w, b) = (
            pass.small(&self.norm_weight, dt)?,
            pass.small(&self.norm_bias, dt)?,
        );
        Ok(match pass.mode {
            Mode::Train => {
                let (groups, slope) = (self.groups, self.slope);
                let y = pass.op(&[&y, &w, &b], |t| {
                    ops::group_norm_leaky_relu(&t[0], &t[1], &t[2], groups, 1e-5, slope)
                })?;
                if self.slope != 1.0 {
                    pass.record(&y);
                }
                y
            }
            // The conv's output is ours alone: normalized where it lies.
            Mode::Infer => {
                ops::group_norm_leaky_relu_owned(y, &w, &b, self.groups, 1e-5, self.slope)?
            }
        })
    }
}

/// nnU-Net's residual block (dynamic-network-architectures' BasicBlockD): conv-norm-act,
/// conv-norm, plus the input (average-pooled by the stride and projected by a bias-free 1x1x1
/// conv + norm where the stride or channels change), then the activation. The second norm
/// starts at weight 0, as nnU-Net initializes it, so each block starts as its skip path.
pub(super) struct ResBlock {
    conv1: Block,
    conv2: Block,
    pool: Option<[usize; 3]>,
    projection: Option<Block>,
}

impl ResBlock {
    #[allow(clippy::too_many_arguments)] // one block's whole shape, named at each call
    pub(super) fn new(
        ps: &mut ParamStore,
        name: &str,
        cin: usize,
        cout: usize,
        kernel: [usize; 3],
        stride: [usize; 3],
        norm: Norm,
    ) -> Result<Self> {
        let conv1 = Block::new(
            ps,
            &format!("{name}.conv1"),
            cin,
            cout,
            kernel,
            stride,
            norm,
        )?;
        let c2 = Conv::new(
            ps,
            &format!("{name}.conv2.conv"),
            cout,
            cout,
            kernel,
            [1; 3],
        )?;
        let conv2 = Block::around(ps, &format!("{name}.conv2"), c2, cout, norm, 0.0, 1.0)?;
        let pool = (stride != [1; 3]).then_some(stride);
        let projection = if cin != cout {
            let skip = format!("{name}.skip");
            let conv = Conv::without_bias(ps, &format!("{skip}.conv"), cin, cout, [1; 3])?;
            Some(Block::around(ps, &skip, conv, cout, norm, 1.0, 1.0)?)
        } else {
            None
        };
        Ok(ResBlock {
            conv1,
            conv2,
            pool,
            projection,
        })
    }

    pub(super) fn forward(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let mut skip = match self.pool {
            Some(k) => pass.op(&[x], |t| ops::avg_pool3d(&t[0], k))?,
            None => x.clone(),
        };
        if let Some(p) = &self.projection {
            skip = p.forward(&skip, pass)?;
        }
        let main = self.conv2.forward(&self.conv1.forward(x, pass)?, pass)?;
        let y = match pass.tape {
            Some(t) => t.borrow_mut().add_leaky_relu(&main, &skip, SLOPE)?,
            None => ops::add_leaky_relu(&main, &skip, SLOPE)?,
        };
        pass.record(&y);
        Ok(y)
    }
}

/// One encoder layer: a plain block or a residual one.
pub(super) enum Layer {
    Plain(Block),
    Residual(Box<ResBlock>),
}

impl Layer {
    pub(super) fn forward(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        match self {
            Layer::Plain(b) => b.forward(x, pass),
            Layer::Residual(b) => b.forward(x, pass),
        }
    }

    /// [`Self::forward`] consuming `x` (see [`Block::forward_owned`]; a residual block keeps
    /// its input for its sum).
    pub(super) fn forward_owned(&self, x: Tensor, pass: Pass) -> Result<Tensor> {
        match self {
            Layer::Plain(b) => b.forward_owned(x, pass),
            Layer::Residual(b) => b.forward(&x, pass),
        }
    }
}

pub(super) fn is_ds_param(name: &str) -> bool {
    name.strip_prefix(DS_PREFIX)
        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
}

fn largest_divisor_at_most(n: usize, g: usize) -> usize {
    (1..=g.min(n))
        .rev()
        .find(|d| n.is_multiple_of(*d))
        .unwrap_or(1)
}

pub(super) enum Up {
    Transpose {
        weight: Tensor,
        bias: Tensor,
        stride: [usize; 3],
    },
    Nearest {
        conv: Conv,
        scale: [usize; 3],
    },
}

impl Up {
    pub(super) fn forward(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        match self {
            Up::Transpose {
                weight,
                bias,
                stride,
            } => {
                let dt = x.dtype();
                let (w, b) = (pass.param(weight, dt)?, pass.small(bias, dt)?);
                if pass.mode == Mode::Train {
                    let (s, products) = (*stride, pass.products);
                    return Ok(match pass.tape {
                        Some(t) => t
                            .borrow_mut()
                            .conv_transpose3d_bias(x, &w, &b, s, products)?,
                        None => ops::conv_transpose3d_bias(x, &w, &b, s, products)?,
                    });
                }
                let y = ops::conv_transpose3d(x, &w, *stride)?;
                pass.add_bias(y, &b)
            }
            Up::Nearest { conv, scale } => {
                let up = pass.op(&[x], |t| ops::upsample_nearest3d(&t[0], *scale))?;
                conv.forward(&up, pass)
            }
        }
    }
}
