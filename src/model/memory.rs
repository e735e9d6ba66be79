//! The memory of one training step of our network, counted from its layers: what `prep plan`
//! sizes a plan with and `train --benchmark` prints beside the measured peak; and of one
//! prediction pass ([`inference_pass`]), which keeps no graph.
//!
//! candle's graph (training on a GPU) keeps every tensor a forward pass makes until the
//! backward pass is done (each op holds its inputs), so the peak is the weights, their
//! gradients and optimizer moments, every activation of the forward pass, and what the
//! backward pass holds at once on top. The CPU's tape ([`super::ops::Tape`]) frees each op's
//! tensors as its backward runs and makes no zeroed gradients: the same peak, at the start of
//! the backward pass, with less on top. The counts
//! per layer below are the tensors our ops create (conv, bias, fused norm-activation, ...), at
//! the batch's size, in the precision's bytes; the loss's per output voxel and the backward
//! pass's are measured constants (see `tests/memory_forecast.rs`).

use super::config::{Encoder, Precision, UNetConfig};
use super::ops::direct;

/// Tensors kept per class and output voxel by the Dice + cross-entropy loss of one output
/// (one-hot target, log-softmax's intermediates, probabilities, their products and the
/// contiguous copies the Dice sums make).
const LOSS_TENSORS: usize = 10;
/// Largest activations alive at once in the backward pass beyond the forward's own, in units
/// of the largest layer output (an output's gradient, its input's, and the sums that
/// accumulate a gradient with two consumers).
const BACKWARD_TENSORS: usize = 7;
/// The same on the CPU's tape (a gradient handed on as it is, summed only where paths meet).
const TAPE_BACKWARD_TENSORS: usize = 2;
/// Column workspace of one convolution worker (the ops' 256 Ki floats).
const WORKSPACE_BYTES: u64 = 1 << 20;

/// Bytes of one training step, by what holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepMemory {
    /// Master weights (f32), and their bf16 copies under bf16.
    pub weights: u64,
    /// Their gradients (f32).
    pub gradients: u64,
    /// Optimizer moments (f32; AdamW 2, SGD 1 per weight).
    pub optimizer: u64,
    /// Every tensor of the forward pass, kept for the backward one.
    pub activations: u64,
    /// The loss's tensors over the supervised outputs (f32).
    pub loss: u64,
    /// What the backward pass holds on top at its peak.
    pub backward: u64,
    /// The convolutions' per-worker scratch.
    pub workspace: u64,
    /// Batches the loader holds (queued and in preparation).
    pub data: u64,
}

impl StepMemory {
    /// All of it.
    pub fn total(&self) -> u64 {
        self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.loss
            + self.backward
            + self.workspace
            + self.data
    }

    /// "412 MiB (weights 5, gradients 5, ...)".
    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        format!(
            "{:.0} MiB (weights {:.0}, gradients {:.0}, optimizer {:.0}, activations {:.0}, loss {:.0}, backward {:.0}, workspace {:.0}, batches {:.0})",
            mib(self.total()),
            mib(self.weights),
            mib(self.gradients),
            mib(self.optimizer),
            mib(self.activations),
            mib(self.loss),
            mib(self.backward),
            mib(self.workspace),
            mib(self.data),
        )
    }
}

/// What shapes a step's memory besides the network.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepShape {
    /// Patch (z, y, x).
    pub patch: [usize; 3],
    /// Patches a batch.
    pub batch: usize,
    /// Arithmetic of the passes.
    pub precision: Precision,
    /// Optimizer moments per weight (AdamW 2, SGD with momentum 1).
    pub moments: usize,
    /// Batches the loader holds at once (its queue and the ones being built).
    pub data_batches: usize,
    /// Convolution workers (threads).
    pub workers: usize,
    /// Whether the pass records its ops on the CPU's tape instead of candle's graph.
    pub tape: bool,
}

/// The forecast of one training step of `config` (see the module's notes).
pub fn training_step(config: &UNetConfig, shape: &StepShape) -> StepMemory {
    let depth = config.strides.len() + 1;
    let voxels = |level: usize| -> u64 {
        let t = config.level_stride(level);
        (0..3)
            .map(|a| (shape.patch[a] / t[a].max(1)) as u64)
            .product()
    };
    let n = shape.batch as u64;
    // Activation elements (per sample), and the largest single one.
    let mut elems = 0u64;
    let mut largest = 0u64;
    let mut keep = |count: u64, channels: usize, level: usize| {
        let e = channels as u64 * voxels(level);
        elems += count * e;
        largest = largest.max(e);
    };
    keep(1, config.in_channels, 0);
    let residual = config.encoder == Encoder::Residual;
    if residual {
        keep(2, config.channels(0), 0); // the stem: conv (its bias added in the op), norm-activation
    }
    for s in 0..depth {
        let cout = config.channels(s);
        for b in 0..config.encoder_blocks(s) {
            if !residual {
                // The conv's output (its bias added in the op) and the norm-activation's.
                keep(2, cout, s);
                continue;
            }
            // Two blocks and the activation of their sum with the skip path.
            keep(4 + 1, cout, s);
            let cin = match (s, b) {
                (0, _) | (_, 1..) => cout,
                _ => config.channels(s - 1),
            };
            if b == 0 && s > 0 && config.strides[s - 1] != [1; 3] {
                keep(1, cin, s); // the average-pooled input
            }
            if cin != cout {
                keep(2, cout, s); // projection conv and norm
            }
        }
    }
    for level in (0..depth - 1).rev() {
        let c = config.channels(level);
        // Upsampling (its bias added in the op), the concatenation (2c), then the blocks.
        keep(1 + 2 + 2 * config.decoder_blocks(level) as u64, c, level);
    }
    let levels = config.supervised_levels();
    let outputs: u64 = levels
        .iter()
        .map(|&l| config.num_classes as u64 * voxels(l))
        .sum();
    // Heads: one tensor per supervised output (the bias added in the conv's op).
    elems += outputs;
    let bytes = match shape.precision {
        Precision::F32 => 4,
        Precision::Bf16 => 2,
    };
    let params = parameter_count(config);
    let weights = 4 * params
        + match shape.precision {
            Precision::F32 => 0,
            Precision::Bf16 => 2 * params,
        };
    let data_elems = (config.in_channels as u64 + 1) * voxels(0);
    StepMemory {
        weights,
        gradients: 4 * params,
        optimizer: 4 * params * shape.moments as u64,
        activations: bytes * n * elems,
        loss: 4 * n * LOSS_TENSORS as u64 * outputs,
        backward: bytes
            * n
            * largest
            * match shape.tape {
                true => TAPE_BACKWARD_TENSORS,
                false => BACKWARD_TENSORS,
            } as u64,
        workspace: WORKSPACE_BYTES * shape.workers.max(1) as u64,
        data: 4 * n * data_elems * shape.data_batches as u64,
    }
}

/// Bytes of one prediction pass ([`super::unet::UNet::infer`]) of a batch, by what holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PassMemory {
    /// The weights (f32).
    pub weights: u64,
    /// The most activations alive at once in the pass, its logits included: the skip
    /// connections still waiting for the decoder, one layer's input and its output.
    pub activations: u64,
    /// The batch's input (read, and as a tensor) and its class scores (probabilities and their
    /// copy out of the tensor) around the pass.
    pub io: u64,
    /// The convolutions' per-worker scratch.
    pub workspace: u64,
}

impl PassMemory {
    /// All of it.
    pub fn total(&self) -> u64 {
        self.weights + self.activations + self.io + self.workspace
    }

    /// "412 MiB (weights 5, activations 300, ...)".
    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        format!(
            "{:.0} MiB (weights {:.0}, activations {:.0}, input and scores {:.0}, workspace {:.0})",
            mib(self.total()),
            mib(self.weights),
            mib(self.activations),
            mib(self.io),
            mib(self.workspace),
        )
    }
}

/// The forecast of one prediction pass of `batch` windows of `patch` (z, y, x) through
/// `config`'s network in f32, `workers` convolution threads. The pass keeps no graph: its peak
/// is the largest of the points it goes through, each the skip connections still held plus the
/// layer at work (its input, the tensors it makes, its output). A plain block after a stage's
/// first writes over its input (odd kernels keep the size); a decoder's first block after a
/// transposed convolution computes the upsampled planes it reads and writes over the skip
/// (else it reads the upsampled tensor and the skip side by side, never concatenated). The
/// peak therefore follows the largest level, not the network's depth.
pub fn inference_pass(
    config: &UNetConfig,
    patch: [usize; 3],
    batch: usize,
    workers: usize,
) -> PassMemory {
    let depth = config.strides.len() + 1;
    let voxels = |level: usize| -> u64 {
        let t = config.level_stride(level);
        (0..3).map(|a| (patch[a] / t[a].max(1)) as u64).product()
    };
    let size = |c: usize, level: usize| c as u64 * voxels(level);
    let residual = config.encoder == Encoder::Residual;
    let n = batch.max(1) as u64;
    let scratch = Scratch {
        config,
        patch,
        batch: n,
        workers: workers.max(1),
    };
    // Whether a stride-1 convolution of `level` keeps the size (and so may write in place).
    let same = |level: usize| config.kernel(level).iter().all(|v| v % 2 == 1);
    // Elements per sample: skips held, the current tensor when it is not one of them; the
    // peak of those and the bytes of the peak with the convolution's scratch at that point.
    let (mut skips, mut cur, mut peak, mut peak_bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut at = |live: u64, scratch: u64| {
        peak = peak.max(live);
        peak_bytes = peak_bytes.max(4 * n * live + scratch);
    };
    if residual {
        // The stem reads the input (counted in `io`).
        cur = size(config.channels(0), 0);
        at(cur, scratch.ring(config.in_channels, 0, None));
    }
    for s in 0..depth {
        let cout = config.channels(s);
        let out = size(cout, s);
        // A stage's first convolution reads the level above at its stride.
        let first = match s {
            0 => scratch.ring(config.in_channels, 0, None),
            _ => scratch.ring(config.channels(s - 1), s, Some(config.strides[s - 1])),
        };
        for b in 0..config.encoder_blocks(s) {
            if !residual {
                match b > 0 && same(s) {
                    true => at(
                        skips + cur,
                        scratch.ring(cout, s, None) + scratch.aside(cout, s),
                    ),
                    false => at(
                        skips + cur + out,
                        if b == 0 {
                            first
                        } else {
                            scratch.ring(cout, s, None)
                        },
                    ),
                }
                cur = out;
                continue;
            }
            let cin = match (s, b) {
                (0, _) | (_, 1..) => cout,
                _ => config.channels(s - 1),
            };
            let strided = b == 0 && s > 0 && config.strides[s - 1] != [1; 3];
            let pool = if strided { size(cin, s) } else { 0 };
            let proj = if cin != cout { out } else { 0 };
            // The skip path's own tensor (none when it is the input itself).
            let side = if proj > 0 { proj } else { pool };
            // Pooled input and its projection, then two convs beside it, then their sum.
            let ring = first.max(scratch.ring(cout, s, None));
            at(skips + cur + (pool + proj).max(side + 2 * out), ring);
            cur = out;
        }
        if s + 1 < depth {
            skips += cur; // the stage's output is kept for the decoder
            cur = 0;
        }
    }
    for level in (0..depth - 1).rev() {
        let c = config.channels(level);
        let up = size(c, level);
        // Nearest upsampling makes the deep tensor's copy at this level before its 1x1 conv.
        let (widened, up_ring) = match config.upsampling {
            super::config::Upsampling::Transpose => (0, 0),
            super::config::Upsampling::Nearest => (
                size(config.channels(level + 1), level),
                scratch.pointwise(config.channels(level + 1), level),
            ),
        };
        let skip = size(c, level);
        let (pair, aside) = (scratch.ring(2 * c, level, None), scratch.aside(c, level));
        let later = match same(level) {
            true => (up, scratch.ring(c, level, None) + aside),
            false => (2 * up, scratch.ring(c, level, None)),
        };
        match (config.upsampling, config.decoder_blocks(level)) {
            (super::config::Upsampling::Transpose, 1..) if same(level) => {
                // Over the skip, beside the deep tensor; later blocks over their input.
                at(skips + cur, pair + aside);
                at(skips - skip + later.0, later.1);
            }
            (_, blocks) => {
                at(skips + cur + widened + up, up_ring);
                // The deep tensor is freed; the first block reads the upsampled one and the
                // skip (their concatenation when the level has no block).
                at(skips + up + if blocks == 0 { 2 * up } else { up }, pair);
                if blocks > 1 {
                    at(skips - skip + later.0, later.1);
                }
            }
        }
        skips -= skip;
        cur = up;
    }
    at(cur + size(config.num_classes, 0), 0);
    let per_window = voxels(0) * (2 * config.in_channels + 2 * config.num_classes) as u64;
    PassMemory {
        weights: 4 * parameter_count(config),
        activations: 4 * n * peak,
        io: 4 * n * per_window,
        workspace: peak_bytes - 4 * n * peak,
    }
}

/// The scratch of the inference pass's convolutions, which read the input planes directly.
struct Scratch<'a> {
    config: &'a UNetConfig,
    patch: [usize; 3],
    batch: u64,
    workers: usize,
}

impl Scratch<'_> {
    fn dims(&self, level: usize) -> [usize; 3] {
        let t = self.config.level_stride(level);
        [0, 1, 2].map(|a| self.patch[a] / t[a].max(1))
    }

    /// Every worker's ring of padded planes for a convolution of `level` over `src` channels,
    /// read at `stride` from the level above (None: stride 1 at the level).
    fn ring(&self, src: usize, level: usize, stride: Option<[usize; 3]>) -> u64 {
        let k = self.config.kernel(level);
        let pad = k.map(|v| v / 2);
        let one = match stride {
            Some(s) => direct::worker_bytes(src, self.dims(level - 1), k, pad, s),
            None => direct::worker_bytes(src, self.dims(level), k, pad, [1; 3]),
        };
        one * self.workers as u64
    }

    /// Every worker's ring for a 1x1x1 convolution of `level` over `src` channels.
    fn pointwise(&self, src: usize, level: usize) -> u64 {
        let one = direct::worker_bytes(src, self.dims(level), [1; 3], [0; 3], [1; 3]);
        one * self.workers as u64
    }

    /// What a convolution written over its `c` channels at `level` holds aside where workers
    /// meet: `kd - 1` planes a meeting.
    fn aside(&self, c: usize, level: usize) -> u64 {
        let [_, h, w] = self.dims(level);
        let planes = (self.config.kernel(level)[0] - 1) * (self.workers - 1);
        4 * self.batch * (planes * c * h * w) as u64
    }
}

/// Trainable scalars of `config`'s network, counted as [`super::unet::UNet`] creates them
/// (from [`super::unet::parameter_shapes`], the one list of its parameters).
pub fn parameter_count(config: &UNetConfig) -> u64 {
    super::unet::parameter_shapes(config)
        .iter()
        .map(|(_, shape)| shape.iter().product::<usize>() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Norm, Upsampling};
    use crate::model::unet::UNet;
    use candle_core::Device;

    /// The count the forecast uses is the network's own, for every kind of network.
    #[test]
    fn parameter_count_is_the_built_networks() {
        let base = UNetConfig {
            in_channels: 2,
            num_classes: 3,
            base_channels: 4,
            max_channels: 12,
            strides: vec![[1, 2, 2], [2, 2, 2], [2, 2, 2]],
            norm: Norm::Instance,
            upsampling: Upsampling::Transpose,
            deep_supervision: true,
            kernels: vec![[1, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3]],
            features: vec![],
            blocks: vec![],
            decoder_blocks: vec![],
            encoder: Encoder::Plain,
        };
        let variants = [
            base.clone(),
            UNetConfig {
                upsampling: Upsampling::Nearest,
                deep_supervision: false,
                ..base.clone()
            },
            UNetConfig {
                encoder: Encoder::Residual,
                features: vec![4, 8, 12, 12],
                blocks: vec![1, 3, 4, 2],
                decoder_blocks: vec![1, 1, 1],
                ..base.clone()
            },
            UNetConfig {
                encoder: Encoder::Residual,
                in_channels: 1,
                blocks: vec![2, 1, 1, 1],
                ..base
            },
        ];
        for c in variants {
            let net = UNet::new(c.clone(), 0, &Device::Cpu).unwrap();
            assert_eq!(parameter_count(&c), net.num_parameters() as u64, "{c:?}");
        }
    }

    /// bf16 halves the activations and adds bf16 copies of the weights; f32 master weights,
    /// gradients and moments stay.
    #[test]
    fn bf16_halves_the_activations() {
        let c = UNetConfig {
            deep_supervision: true,
            ..UNetConfig::plain(1, 2, 8, 32, vec![[2, 2, 2], [2, 2, 2]])
        };
        let shape = StepShape {
            patch: [16, 32, 32],
            batch: 2,
            precision: Precision::F32,
            moments: 2,
            data_batches: 3,
            workers: 2,
            tape: true,
        };
        let f = training_step(&c, &shape);
        let b = training_step(
            &c,
            &StepShape {
                precision: Precision::Bf16,
                ..shape
            },
        );
        assert_eq!(b.activations * 2, f.activations);
        assert_eq!(b.weights, f.weights * 3 / 2);
        assert_eq!((b.gradients, b.optimizer), (f.gradients, f.optimizer));
        assert_eq!(f.optimizer, 2 * f.gradients);
    }
}
