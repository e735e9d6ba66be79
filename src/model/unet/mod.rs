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

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

use super::config::{Encoder, Precision, UNetConfig, Upsampling, DS_PREFIX};
use super::ops;
use crate::error::{Error, Result};
use crate::util::rng::Rng;

mod layers;
mod shapes;

pub use shapes::parameter_shapes;

use layers::{cast, is_ds_param, Block, Conv, Layer, Mode, ParamStore, Pass, ResBlock, Up};

/// The U-Net with its parameters.
pub struct UNet {
    config: UNetConfig,
    /// The residual encoder's stem (one conv-norm-act block before stage 0).
    stem: Option<Block>,
    /// Encoder stages, full resolution first: their blocks.
    encoder: Vec<Vec<Layer>>,
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
        let residual = config.encoder == Encoder::Residual;
        // nnU-Net's residual encoder starts with a stem that brings the input to stage 0's
        // channels; stage 0's first block then keeps them.
        let stem = if residual {
            let c0 = config.channels(0);
            let k = config.kernel(0);
            let norm = config.norm;
            Some(Block::new(
                &mut ps,
                "stem",
                config.in_channels,
                c0,
                k,
                [1; 3],
                norm,
            )?)
        } else {
            None
        };
        let mut encoder = Vec::with_capacity(depth);
        for s in 0..depth {
            let cin = match (s, residual) {
                (0, false) => config.in_channels,
                (0, true) => config.channels(0),
                _ => config.channels(s - 1),
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
                    let name = format!("enc{s}.{b}");
                    Ok(if residual {
                        Layer::Residual(Box::new(ResBlock::new(
                            &mut ps, &name, i, cout, k, st, norm,
                        )?))
                    } else {
                        Layer::Plain(Block::new(&mut ps, &name, i, cout, k, st, norm)?)
                    })
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
            stem,
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

    /// Logits (N, num_classes, D, H, W) of an input (N, in_channels, D, H, W), recorded for a
    /// backward pass: every activation stays alive as long as the result (see [`Self::infer`]).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut out = self.run(x, false, self.pass(Mode::Train, x))?;
        Ok(out.swap_remove(0))
    }

    /// [`Self::forward`] and every LeakyReLU's output, in the order the pass computes them:
    /// which side of 0 each activation took, for a cross-check against another framework's
    /// network of the same layers (scripts/torch_crosscheck.py).
    pub fn forward_traced(&self, x: &Tensor) -> Result<(Tensor, Vec<Tensor>)> {
        let trace = std::cell::RefCell::new(Vec::new());
        let pass = Pass {
            trace: Some(&trace),
            ..self.pass(Mode::Train, x)
        };
        let mut out = self.run(x, false, pass)?;
        Ok((out.swap_remove(0), trace.into_inner()))
    }

    /// The logits of [`Self::forward`] without recording anything for a backward pass: each
    /// activation is freed as soon as the next layer has read it (the skip connections when
    /// the decoder has used them), so the pass holds a few activations at once instead of all
    /// of them. What prediction and validation use; the values are the same bit for bit.
    pub fn infer(&self, x: &Tensor) -> Result<Tensor> {
        let mut out = self.run(&x.detach(), false, self.pass(Mode::Infer, x))?;
        Ok(out.swap_remove(0))
    }

    /// The logits of every supervised level, full resolution first (see
    /// [`UNetConfig::supervised_levels`]); the full-resolution one alone without deep
    /// supervision.
    pub fn forward_all(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        self.run(x, true, self.pass(Mode::Train, x))
    }

    /// [`Self::forward_all`] for training: on the CPU the pass records its ops on a tape of its
    /// own instead of candle's graph ([`ops::Tape`]: no zeroed gradient and sum per op, each
    /// op's saved tensors freed as the backward pass goes); elsewhere candle's graph. The
    /// gradients are the same either way (bit for bit in a plain U-Net).
    pub fn train_pass(&self, x: &Tensor) -> Result<TrainPass> {
        if !x.device().is_cpu() {
            let outputs = self.forward_all(x)?;
            return Ok(TrainPass {
                outputs,
                tape: None,
            });
        }
        let tape = std::cell::RefCell::new(ops::Tape::default());
        let pass = Pass {
            tape: Some(&tape),
            ..self.pass(Mode::Train, x)
        };
        let results = self.run(x, true, pass)?;
        // The loss differentiates down to these copies (the results are small: classes
        // channels), the tape on from them.
        let outputs = results
            .iter()
            .map(|t| Ok(Var::from_tensor(t)?.as_tensor().clone()))
            .collect::<Result<Vec<_>>>()?;
        let ids = results.iter().map(|t| t.id()).collect();
        Ok(TrainPass {
            outputs,
            tape: Some((tape.into_inner(), ids)),
        })
    }

    /// A pass of `mode` on `x`: bf16 on the CPU keeps f32 tensors, with bf16 products inside
    /// the convolutions (the other CPU ops have no bf16 arithmetic to gain from).
    fn pass(&self, mode: Mode, x: &Tensor) -> Pass<'static> {
        let products = match (self.precision, x.device().is_cpu()) {
            (Precision::Bf16, true) => ops::Products::Bf16,
            _ => ops::Products::F32,
        };
        Pass {
            mode,
            products,
            trace: None,
            tape: None,
        }
    }

    fn run(&self, x: &Tensor, all_levels: bool, pass: Pass) -> Result<Vec<Tensor>> {
        let mut skips = Vec::with_capacity(self.encoder.len());
        // bf16 products on the CPU: training keeps its activations (and their gradients) in
        // bf16, half the memory, each op computing in f32 inside; inference keeps f32 tensors
        // (it holds a few at a time) and rounds only the convolutions' operands.
        let dtype = match (pass.products, pass.mode) {
            (ops::Products::Bf16, Mode::Train) => DType::BF16,
            (ops::Products::Bf16, Mode::Infer) => DType::F32,
            (ops::Products::F32, _) => self.precision.dtype(),
        };
        let mut h = cast(x, dtype)?;
        if let Some(stem) = &self.stem {
            h = stem.forward(&h, pass)?;
        }
        for blocks in &self.encoder {
            for (k, b) in blocks.iter().enumerate() {
                // A stage's first block reads the tensor the skips also hold; the others read
                // their predecessor's output alone (inferring, they may write over it).
                h = match k {
                    0 => b.forward(&h, pass)?,
                    _ => b.forward_owned(h, pass)?,
                };
            }
            skips.push(h.clone());
        }
        skips.pop();
        let mut lower = Vec::new();
        for (up, blocks) in &self.decoder {
            let skip = skips
                .pop()
                .ok_or_else(|| Error::Train("U-Net: decoder deeper than encoder".into()))?;
            // Inferring, the first block computes the upsampled planes it reads (the
            // upsampled tensor is never built) and writes over the skip; else it reads the
            // upsampled tensor and the skip side by side (inferring, their concatenation is
            // never built). Both are freed once it has run; later blocks may write over
            // their input.
            let rest = blocks.get(1..).unwrap_or_default();
            let next = match blocks.first() {
                Some(first) => {
                    let y = match first.forward_up_pair(&h, up, skip, pass)? {
                        Ok(y) => {
                            drop(h);
                            y
                        }
                        Err(skip) => {
                            let upsampled = up.forward(&h, pass)?;
                            drop(h);
                            let y = first.forward_pair(&upsampled, &skip, pass)?;
                            drop((upsampled, skip));
                            y
                        }
                    };
                    rest.iter().try_fold(y, |h, b| b.forward_owned(h, pass))?
                }
                None => pass.cat(&[&up.forward(&h, pass)?, &skip])?,
            };
            h = next;
            // The level this decoder stage ends at is the number of skips left.
            let level = skips.len();
            if all_levels && level >= 1 && level <= self.ds_heads.len() {
                lower.push(self.ds_heads[level - 1].forward(&h, pass)?);
            }
        }
        let mut out = vec![self.head.forward(&h, pass)?];
        out.extend(lower.into_iter().rev());
        // Losses and softmax run in f32 whatever the passes' precision.
        out.iter().map(|t| pass.cast(t, DType::F32)).collect()
    }
}

/// A training pass's results ([`UNet::forward_all`]'s) and what its backward pass needs.
pub struct TrainPass {
    outputs: Vec<Tensor>,
    /// The tape and the ids of the results the outputs copy, where the pass kept one.
    tape: Option<(ops::Tape, Vec<candle_core::TensorId>)>,
}

impl TrainPass {
    /// The logits of every supervised level, full resolution first.
    pub fn outputs(&self) -> &[Tensor] {
        &self.outputs
    }

    /// The parameters' gradients of `loss`, a function of [`Self::outputs`] (keyed by the
    /// parameters, as candle's backward gives them).
    pub fn backward(self, loss: &Tensor) -> Result<GradStore> {
        let grads = loss.backward()?;
        let Some((tape, ids)) = self.tape else {
            return Ok(grads);
        };
        let seeds = ids
            .into_iter()
            .zip(&self.outputs)
            .filter_map(|(id, out)| grads.get(out).map(|g| (id, g.clone())));
        let seeds: Vec<_> = seeds.collect();
        drop(grads);
        let mut store = GradStore::default();
        for (id, g) in tape.backward(seeds)? {
            store.insert_id(id, g);
        }
        Ok(store)
    }
}

#[cfg(test)]
mod tests;
