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
mod tests {
    use super::*;

    #[test]
    fn norm_and_upsampling_have_one_spelling() {
        for (text, norm) in [("instance", Norm::Instance), ("group:8", Norm::Group(8))] {
            assert_eq!(text.parse::<Norm>().unwrap(), norm);
            assert_eq!(norm.to_string(), text);
            assert_eq!(serde_json::to_value(norm).unwrap(), text);
            let t: toml::Table = toml::from_str(&format!("norm = \"{text}\"")).unwrap();
            assert_eq!(t["norm"].clone().try_into::<Norm>().unwrap(), norm);
        }
        for bad in ["group:0", "group:", "group", "batch"] {
            assert!(bad.parse::<Norm>().is_err(), "{bad}");
        }
        let t: toml::Table = toml::from_str("norm = { group = 8 }").unwrap();
        let e = t["norm"]
            .clone()
            .try_into::<Norm>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"group:8\""), "{e}");
        for u in [Upsampling::Transpose, Upsampling::Nearest] {
            assert_eq!(u.name().parse::<Upsampling>().unwrap(), u);
            assert_eq!(serde_json::to_value(u).unwrap(), u.name());
        }
        assert!("bilinear".parse::<Upsampling>().is_err());
    }

    #[test]
    fn precision_has_one_spelling_and_f16_is_refused_with_a_reason() {
        for p in [Precision::F32, Precision::Bf16] {
            assert_eq!(p.name().parse::<Precision>().unwrap(), p);
            assert_eq!(serde_json::to_value(p).unwrap(), p.name());
        }
        let e = "f16".parse::<Precision>().unwrap_err().to_string();
        assert!(e.contains("loss scaling") && e.contains("bf16"), "{e}");
        assert!("fp32".parse::<Precision>().is_err());
    }

    /// bf16 passes (here through the generic ops on the CPU, the same casts as on a GPU) give
    /// f32 logits close to the f32 ones, and f32 gradients for the f32 master weights that
    /// point the same way.
    #[test]
    fn bf16_passes_keep_f32_outputs_and_gradients() -> Result<()> {
        let cfg = UNetConfig {
            in_channels: 1,
            num_classes: 2,
            base_channels: 4,
            max_channels: 8,
            strides: vec![[1, 2, 2], [2, 2, 2]],
            norm: Norm::Instance,
            upsampling: Upsampling::Transpose,
            deep_supervision: true,
            kernels: vec![],
            features: vec![],
            blocks: vec![],
            decoder_blocks: vec![],
        };
        let dev = Device::Cpu;
        let mut net = UNet::new(cfg, 3, &dev)?;
        let mut rng = Rng::new(9);
        let x: Vec<f32> = (0..4 * 16 * 16).map(|_| rng.normal() as f32).collect();
        let x = Tensor::from_vec(x, (1, 1, 4, 16, 16), &dev)?;
        let run = |net: &UNet| -> Result<(Vec<Tensor>, candle_core::backprop::GradStore)> {
            let outs = net.forward_all(&x)?;
            let total = outs[0].sqr()?.mean_all()?;
            let grads = total.backward()?;
            Ok((outs, grads))
        };
        let (f32_out, f32_grads) = run(&net)?;
        net.set_precision(Precision::Bf16);
        let (bf_out, bf_grads) = run(&net)?;
        for (a, b) in f32_out.iter().zip(&bf_out) {
            assert_eq!(b.dtype(), DType::F32);
            let scale = a.abs()?.max_all()?.to_scalar::<f32>()?.max(1e-6);
            let diff = (a - b)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(
                diff / scale < 0.05,
                "bf16 logits off by {diff} (scale {scale})"
            );
        }
        for (name, p) in net.params() {
            let (g32, g16) = (f32_grads.get(p.as_tensor()), bf_grads.get(p.as_tensor()));
            let (Some(g32), Some(g16)) = (g32, g16) else {
                // Deep-supervision heads get no gradient from this full-resolution loss.
                assert!(name.starts_with(DS_PREFIX), "{name}: no gradient");
                continue;
            };
            assert_eq!(g16.dtype(), DType::F32, "{name}");
            let dot = (g32 * g16)?.sum_all()?.to_scalar::<f32>()?;
            let n = (g32.sqr()?.sum_all()?.sqrt()? * g16.sqr()?.sum_all()?.sqrt()?)?
                .to_scalar::<f32>()?;
            // A conv bias followed by instance norm has a zero gradient in exact arithmetic:
            // both devices hand it rounding noise, whose direction means nothing.
            if n > 1e-12 && !name.ends_with("conv.bias") {
                assert!(dot / n > 0.97, "{name}: cosine {}", dot / n);
            }
        }
        Ok(())
    }

    #[test]
    fn deep_supervision_adds_heads_at_the_lower_levels() -> Result<()> {
        let cfg = UNetConfig {
            in_channels: 2,
            num_classes: 3,
            base_channels: 4,
            max_channels: 16,
            strides: UNetConfig::plan_strides([8, 32, 32], 4, 2),
            norm: Norm::Instance,
            upsampling: Upsampling::Transpose,
            deep_supervision: true,
            kernels: vec![],
            features: vec![],
            blocks: vec![],
            decoder_blocks: vec![],
        };
        assert_eq!(cfg.supervised_levels(), vec![0, 1]);
        let w = cfg.level_weights();
        assert!((w[0] - 2.0 / 3.0).abs() < 1e-12 && (w[1] - 1.0 / 3.0).abs() < 1e-12);
        let five = UNetConfig {
            strides: UNetConfig::plan_strides([16, 64, 64], 5, 2),
            ..cfg.clone()
        };
        assert_eq!(five.supervised_levels(), vec![0, 1, 2]);
        let net = UNet::new(cfg.clone(), 3, &Device::Cpu)?;
        let x = Tensor::ones((1, 2, 8, 32, 32), DType::F32, &Device::Cpu)?;
        let outs = net.forward_all(&x)?;
        assert_eq!(outs.len(), 2);
        assert_eq!(outs[0].dims(), &[1, 3, 8, 32, 32]);
        let s = cfg.level_stride(1);
        assert_eq!(outs[1].dims(), &[1, 3, 8 / s[0], 32 / s[1], 32 / s[2]]);
        // The full-resolution output is the plain forward's.
        let plain = net.forward(&x)?;
        assert_eq!(
            plain.flatten_all()?.to_vec1::<f32>()?,
            outs[0].flatten_all()?.to_vec1::<f32>()?
        );
        // A model without the heads loads the checkpoint of one with them (prediction).
        let values: std::collections::HashMap<String, Tensor> = net
            .params()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        assert!(values.keys().any(|k| k.starts_with("ds1.")));
        let bare = UNet::new(
            UNetConfig {
                deep_supervision: false,
                kernels: vec![],
                features: vec![],
                blocks: vec![],
                decoder_blocks: vec![],
                ..cfg
            },
            9,
            &Device::Cpu,
        )?;
        bare.load(&values)?;
        assert_eq!(
            bare.forward(&x)?.flatten_all()?.to_vec1::<f32>()?,
            plain.flatten_all()?.to_vec1::<f32>()?
        );
        Ok(())
    }

    #[test]
    fn strides_follow_the_patch() {
        assert_eq!(
            UNetConfig::plan_strides([16, 64, 64], 5, 4),
            vec![[2, 2, 2], [2, 2, 2], [1, 2, 2], [1, 2, 2]]
        );
        assert_eq!(
            UNetConfig::plan_strides([5, 32, 32], 3, 4),
            vec![[1, 2, 2], [1, 2, 2]]
        );
    }

    #[test]
    fn forward_keeps_the_spatial_shape() -> Result<()> {
        for up in [Upsampling::Transpose, Upsampling::Nearest] {
            let cfg = UNetConfig {
                in_channels: 1,
                num_classes: 3,
                base_channels: 4,
                max_channels: 8,
                strides: UNetConfig::plan_strides([8, 16, 16], 3, 4),
                norm: Norm::Group(2),
                upsampling: up,
                deep_supervision: false,
                kernels: vec![],
                features: vec![],
                blocks: vec![],
                decoder_blocks: vec![],
            };
            let net = UNet::new(cfg, 1, &Device::Cpu)?;
            let x = Tensor::ones((2, 1, 8, 16, 16), DType::F32, &Device::Cpu)?;
            assert_eq!(net.forward(&x)?.dims(), &[2, 3, 8, 16, 16]);
            // Same seed, same weights.
            let again = UNet::new(net.config().clone(), 1, &Device::Cpu)?;
            let (a, b) = (&net.params()[0].1, &again.params()[0].1);
            assert_eq!(
                a.flatten_all()?.to_vec1::<f32>()?,
                b.flatten_all()?.to_vec1::<f32>()?
            );
        }
        Ok(())
    }

    #[test]
    fn per_stage_kernels_features_and_blocks_shape_the_network() -> Result<()> {
        let base = UNetConfig {
            in_channels: 1,
            num_classes: 2,
            base_channels: 4,
            max_channels: 8,
            strides: vec![[1, 2, 2], [2, 2, 2]],
            norm: Norm::Instance,
            upsampling: Upsampling::Transpose,
            deep_supervision: false,
            kernels: vec![],
            features: vec![],
            blocks: vec![],
            decoder_blocks: vec![],
        };
        // The defaults spelled out are the same network, parameter for parameter.
        let spelled = UNetConfig {
            kernels: vec![[3, 3, 3]; 3],
            features: vec![4, 8, 8],
            blocks: vec![2; 3],
            decoder_blocks: vec![2; 2],
            ..base.clone()
        };
        let (a, b) = (
            UNet::new(base.clone(), 5, &Device::Cpu)?,
            UNet::new(spelled, 5, &Device::Cpu)?,
        );
        let names = |n: &UNet| {
            n.params()
                .into_iter()
                .map(|(k, v)| (k, v.dims().to_vec()))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&a), names(&b));
        // nnU-Net's anisotropic plan: 1x3x3 kernels at full resolution, 3 / 1 / 2 blocks.
        let cfg = UNetConfig {
            kernels: vec![[1, 3, 3], [3, 3, 3], [3, 3, 3]],
            features: vec![3, 5, 7],
            blocks: vec![3, 1, 2],
            decoder_blocks: vec![1, 2],
            ..base.clone()
        };
        let net = UNet::new(cfg.clone(), 5, &Device::Cpu)?;
        // Counted by hand: conv weights + biases, norm weights + biases, ups, head.
        let conv = |ci: usize, co: usize, k: [usize; 3]| {
            co * ci * k.iter().product::<usize>() + co + 2 * co
        };
        let want = conv(1, 3, [1, 3, 3])
            + 2 * conv(3, 3, [1, 3, 3])
            + conv(3, 5, [3; 3])
            + conv(5, 7, [3; 3])
            + conv(7, 7, [3; 3])
            + (7 * 5 * 8 + 5)
            + conv(10, 5, [3; 3])
            + conv(5, 5, [3; 3])
            + (5 * 3 * 4 + 3)
            + conv(6, 3, [1, 3, 3])
            + (3 * 2 + 2);
        assert_eq!(net.num_parameters(), want);
        assert!(net.params().iter().any(|(n, _)| n == "enc0.2.conv.weight"));
        assert!(!net.params().iter().any(|(n, _)| n == "dec0.1.conv.weight"));
        let x = Tensor::ones((1, 1, 4, 8, 8), DType::F32, &Device::Cpu)?;
        assert_eq!(net.forward(&x)?.dims(), &[1, 2, 4, 8, 8]);
        // Lists that do not fit the depth, even kernels: refused naming the key.
        for (bad, key) in [
            (
                UNetConfig {
                    kernels: vec![[3; 3]; 2],
                    ..base.clone()
                },
                "kernels",
            ),
            (
                UNetConfig {
                    features: vec![4; 4],
                    ..base.clone()
                },
                "features",
            ),
            (
                UNetConfig {
                    decoder_blocks: vec![1; 3],
                    ..base.clone()
                },
                "decoder_blocks",
            ),
            (
                UNetConfig {
                    kernels: vec![[2, 3, 3]; 3],
                    ..base.clone()
                },
                "odd",
            ),
        ] {
            let e = UNet::new(bad, 1, &Device::Cpu)
                .err()
                .expect("refused")
                .to_string();
            assert!(e.contains(key), "{e}");
        }
        Ok(())
    }
}
