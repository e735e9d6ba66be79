//! The 3D U-Net: nnU-Net's plain convolutional U-Net, with optional deep supervision.
//!
//! Each encoder stage is a few (two by default) conv -> norm -> LeakyReLU 0.01 blocks, the
//! first of which downsamples with its stride (no pooling layers, as nnU-Net); kernels are
//! 3x3x3 unless the configuration gives a stage another (1x3x3 where an axis is coarse). Each
//! decoder stage upsamples (transposed conv with kernel = stride, or nearest + 1x1x1 conv),
//! concatenates the skip connection and applies its blocks with its level's kernel; a 1x1x1
//! conv gives the class logits.
//!
//! Deep supervision (nnU-Net's): further 1x1x1 heads give logits at the decoder's lower
//! resolutions, every one but the lowest (nnU-Net computes that one and weights it 0); they
//! are trained only ([`UNet::forward_all`]); prediction uses the full-resolution head alone.
//!
//! Parameters are created here from our seeded [`Rng`], not candle's initializers (those draw
//! from an unseeded thread RNG), so a run's initial weights depend only on its seed.

use candle_core::{DType, Device, Tensor, Var};

use super::config::{Norm, Precision, UNetConfig, Upsampling, DS_PREFIX};
use super::ops;
use crate::error::{Error, Result};
use crate::util::rng::Rng;

/// `t` in `dt`: parameters are kept in f32 and cast on use, so their gradients come back f32.
fn cast(t: &Tensor, dt: DType) -> Result<Tensor> {
    Ok(t.to_dtype(dt)?)
}

/// Named trainable parameters, created with seeded initial values.
pub struct ParamStore {
    params: Vec<(String, Var)>,
    rng: Rng,
    dev: Device,
}

impl ParamStore {
    fn new(rng: Rng, dev: &Device) -> Self {
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
    fn kaiming(&mut self, name: String, shape: &[usize], fan_in: usize) -> Result<Tensor> {
        let gain = (2.0 / (1.0 + 0.01f64 * 0.01)).sqrt();
        let std = gain / (fan_in.max(1) as f64).sqrt();
        let n: usize = shape.iter().product();
        let values = (0..n).map(|_| (self.rng.normal() * std) as f32).collect();
        self.add(name, values, shape)
    }

    fn constant(&mut self, name: String, n: usize, value: f32) -> Result<Tensor> {
        self.add(name, vec![value; n], &[n])
    }

    /// Parameters sorted by name (the order optimizers and checkpoints use).
    pub fn sorted(&self) -> Vec<(String, Var)> {
        let mut p = self.params.clone();
        p.sort_by(|a, b| a.0.cmp(&b.0));
        p
    }
}

struct Conv {
    weight: Tensor,
    bias: Tensor,
    padding: [usize; 3],
    stride: [usize; 3],
}

impl Conv {
    fn new(
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
        let bias = ps.constant(format!("{name}.bias"), cout, 0.0)?;
        Ok(Conv {
            weight,
            bias,
            padding: k.map(|k| k / 2),
            stride,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dt = x.dtype();
        let y = ops::conv3d(x, &cast(&self.weight, dt)?, self.padding, self.stride)?;
        Ok(ops::add_channel_bias(&y, &cast(&self.bias, dt)?)?)
    }
}

/// conv -> norm -> LeakyReLU (the last two fused in [`ops::group_norm_leaky_relu`]).
struct Block {
    conv: Conv,
    norm_weight: Tensor,
    norm_bias: Tensor,
    groups: usize,
}

impl Block {
    #[allow(clippy::too_many_arguments)] // one block's whole shape, named at each call
    fn new(
        ps: &mut ParamStore,
        name: &str,
        cin: usize,
        cout: usize,
        kernel: [usize; 3],
        stride: [usize; 3],
        norm: Norm,
    ) -> Result<Self> {
        let conv = Conv::new(ps, &format!("{name}.conv"), cin, cout, kernel, stride)?;
        let groups = match norm {
            Norm::Instance => cout,
            Norm::Group(g) => largest_divisor_at_most(cout, g),
        };
        let norm_weight = ps.constant(format!("{name}.norm.weight"), cout, 1.0)?;
        let norm_bias = ps.constant(format!("{name}.norm.bias"), cout, 0.0)?;
        Ok(Block {
            conv,
            norm_weight,
            norm_bias,
            groups,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.conv.forward(x)?;
        let dt = y.dtype();
        Ok(ops::group_norm_leaky_relu(
            &y,
            &cast(&self.norm_weight, dt)?,
            &cast(&self.norm_bias, dt)?,
            self.groups,
            1e-5,
            0.01,
        )?)
    }
}

fn is_ds_param(name: &str) -> bool {
    name.strip_prefix(DS_PREFIX)
        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
}

fn largest_divisor_at_most(n: usize, g: usize) -> usize {
    (1..=g.min(n))
        .rev()
        .find(|d| n.is_multiple_of(*d))
        .unwrap_or(1)
}

enum Up {
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
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Up::Transpose {
                weight,
                bias,
                stride,
            } => {
                let dt = x.dtype();
                let y = ops::conv_transpose3d(x, &cast(weight, dt)?, *stride)?;
                Ok(ops::add_channel_bias(&y, &cast(bias, dt)?)?)
            }
            Up::Nearest { conv, scale } => conv.forward(&ops::upsample_nearest3d(x, *scale)?),
        }
    }
}

/// The U-Net with its parameters.
pub struct UNet {
    config: UNetConfig,
    /// Encoder stages, full resolution first: their blocks.
    encoder: Vec<Vec<Block>>,
    /// Decoder stages from the deepest up: (upsampling, blocks).
    decoder: Vec<(Up, Vec<Block>)>,
    head: Conv,
    /// Deep-supervision heads of levels 1.. (index 0 is level 1).
    ds_heads: Vec<Conv>,
    params: ParamStore,
    precision: Precision,
}

impl UNet {
    /// Build with seeded initial weights.
    pub fn new(config: UNetConfig, seed: u64, dev: &Device) -> Result<UNet> {
        config.validate()?;
        let mut ps = ParamStore::new(Rng::derive(seed, &[0x004d_4f44_454c]), dev);
        let depth = config.strides.len() + 1;
        let mut encoder = Vec::with_capacity(depth);
        for s in 0..depth {
            let cin = if s == 0 {
                config.in_channels
            } else {
                config.channels(s - 1)
            };
            let cout = config.channels(s);
            let stride = if s == 0 {
                [1; 3]
            } else {
                config.strides[s - 1]
            };
            let (k, norm) = (config.kernel(s), config.norm);
            let blocks = (0..config.encoder_blocks(s))
                .map(|b| {
                    let (i, st) = if b == 0 {
                        (cin, stride)
                    } else {
                        (cout, [1; 3])
                    };
                    Block::new(&mut ps, &format!("enc{s}.{b}"), i, cout, k, st, norm)
                })
                .collect::<Result<Vec<_>>>()?;
            encoder.push(blocks);
        }
        let mut decoder = Vec::with_capacity(depth - 1);
        for s in (0..depth - 1).rev() {
            let (cdeep, cout) = (config.channels(s + 1), config.channels(s));
            let stride = config.strides[s];
            let name = format!("dec{s}");
            let up = match config.upsampling {
                Upsampling::Transpose => {
                    let fan_in = cdeep * stride.iter().product::<usize>();
                    let weight = ps.kaiming(
                        format!("{name}.up.weight"),
                        &[cdeep, cout, stride[0], stride[1], stride[2]],
                        fan_in,
                    )?;
                    let bias = ps.constant(format!("{name}.up.bias"), cout, 0.0)?;
                    Up::Transpose {
                        weight,
                        bias,
                        stride,
                    }
                }
                Upsampling::Nearest => Up::Nearest {
                    conv: Conv::new(&mut ps, &format!("{name}.up"), cdeep, cout, [1; 3], [1; 3])?,
                    scale: stride,
                },
            };
            let (k, norm) = (config.kernel(s), config.norm);
            let blocks = (0..config.decoder_blocks(s))
                .map(|b| {
                    let i = if b == 0 { 2 * cout } else { cout };
                    Block::new(&mut ps, &format!("{name}.{b}"), i, cout, k, [1; 3], norm)
                })
                .collect::<Result<Vec<_>>>()?;
            decoder.push((up, blocks));
        }
        let head = Conv::new(
            &mut ps,
            "head",
            config.channels(0),
            config.num_classes,
            [1; 3],
            [1; 3],
        )?;
        let ds_heads = config
            .supervised_levels()
            .into_iter()
            .skip(1)
            .map(|level| {
                Conv::new(
                    &mut ps,
                    &format!("{DS_PREFIX}{level}"),
                    config.channels(level),
                    config.num_classes,
                    [1; 3],
                    [1; 3],
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(UNet {
            config,
            encoder,
            decoder,
            head,
            ds_heads,
            params: ps,
            precision: Precision::F32,
        })
    }

    /// Compute the passes in `precision` from now on (the parameters stay f32).
    pub fn set_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }

    /// The arithmetic of the passes.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The network's shape.
    pub fn config(&self) -> &UNetConfig {
        &self.config
    }

    /// Trainable parameters sorted by name.
    pub fn params(&self) -> Vec<(String, Var)> {
        self.params.sorted()
    }

    /// Trainable scalars.
    pub fn num_parameters(&self) -> usize {
        self.params.params.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// Overwrite parameter values (from a checkpoint); names and shapes must all match, except
    /// that a model built without deep supervision (for prediction) leaves a checkpoint's
    /// deep-supervision heads unused.
    pub fn load(&self, values: &std::collections::HashMap<String, Tensor>) -> Result<()> {
        for (name, var) in &self.params.params {
            let t = values
                .get(name)
                .ok_or_else(|| Error::Train(format!("checkpoint has no parameter {name}")))?;
            if t.dims() != var.dims() {
                return Err(Error::Train(format!(
                    "checkpoint parameter {name} has shape {:?}, the model {:?}",
                    t.dims(),
                    var.dims()
                )));
            }
            var.set(&t.to_dtype(DType::F32)?.to_device(var.device())?)?;
        }
        let unused_heads = if self.config.deep_supervision {
            0
        } else {
            values.keys().filter(|k| is_ds_param(k)).count()
        };
        if values.len() - unused_heads != self.params.params.len() {
            return Err(Error::Train(format!(
                "checkpoint has {} parameters, the model {}: it was trained with another network shape",
                values.len(),
                self.params.params.len()
            )));
        }
        Ok(())
    }

    /// Logits (N, num_classes, D, H, W) of an input (N, in_channels, D, H, W).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut out = self.run(x, false)?;
        Ok(out.swap_remove(0))
    }

    /// The logits of every supervised level, full resolution first (see
    /// [`UNetConfig::supervised_levels`]); the full-resolution one alone without deep
    /// supervision.
    pub fn forward_all(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        self.run(x, true)
    }

    fn run(&self, x: &Tensor, all_levels: bool) -> Result<Vec<Tensor>> {
        let mut skips = Vec::with_capacity(self.encoder.len());
        let mut h = cast(x, self.precision.dtype())?;
        for blocks in &self.encoder {
            for b in blocks {
                h = b.forward(&h)?;
            }
            skips.push(h.clone());
        }
        skips.pop();
        let mut lower = Vec::new();
        for (up, blocks) in &self.decoder {
            let skip = skips
                .pop()
                .ok_or_else(|| Error::Train("U-Net: decoder deeper than encoder".into()))?;
            h = Tensor::cat(&[&up.forward(&h)?, &skip], 1)?;
            for b in blocks {
                h = b.forward(&h)?;
            }
            // The level this decoder stage ends at is the number of skips left.
            let level = skips.len();
            if all_levels && level >= 1 && level <= self.ds_heads.len() {
                lower.push(self.ds_heads[level - 1].forward(&h)?);
            }
        }
        let mut out = vec![self.head.forward(&h)?];
        out.extend(lower.into_iter().rev());
        // Losses and softmax run in f32 whatever the passes' precision.
        out.iter().map(|t| cast(t, DType::F32)).collect()
    }
}

#[cfg(test)]
mod tests;
