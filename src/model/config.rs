//! The network's configuration: its shape ([`UNetConfig`]), the choices a pipeline names
//! (norm, up-sampling, precision), and the network options of a run ([`NetworkOptions`]), from
//! which training and prediction build the same network.

use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

use super::unet::UNet;
use crate::error::{Error, Result};

/// Serde through the type's string spelling (`FromStr` and `Display`), so pipeline files,
/// flags and run records spell a value the same way and a bad one gets `FromStr`'s message.
macro_rules! serde_as_string {
    ($($t:ty),*) => {$(
        impl TryFrom<String> for $t {
            type Error = Error;
            fn try_from(s: String) -> Result<Self> {
                s.parse()
            }
        }
        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.to_string()
            }
        }
    )*};
}
pub(crate) use serde_as_string;

serde_as_string!(Upsampling, Precision, Encoder);

/// How a norm may be written: the string, or the table `{ group = G }` of earlier versions,
/// which gets an error giving the string to write instead.
#[derive(Deserialize)]
#[serde(untagged)]
enum NormSpelling {
    Text(String),
    Table { group: usize },
}

impl TryFrom<NormSpelling> for Norm {
    type Error = Error;
    fn try_from(s: NormSpelling) -> Result<Self> {
        match s {
            NormSpelling::Text(t) => t.parse(),
            NormSpelling::Table { group } => Err(Error::Config(format!(
                "norm is written as a string: \"group:{group}\" (or \"instance\"), not a table"
            ))),
        }
    }
}

impl From<Norm> for String {
    fn from(n: Norm) -> String {
        n.to_string()
    }
}

impl std::fmt::Display for Upsampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Normalization after each convolution. Written `instance` or `group:G`, the same in a
/// pipeline file, on the command line and in a run's saved configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "NormSpelling", into = "String")]
pub enum Norm {
    /// Instance norm with affine parameters (nnU-Net's default): GroupNorm with one channel a group.
    Instance,
    /// Group norm with this many groups (capped by the channel count).
    Group(usize),
}

impl std::fmt::Display for Norm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Norm::Instance => f.write_str("instance"),
            Norm::Group(g) => write!(f, "group:{g}"),
        }
    }
}

impl std::str::FromStr for Norm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "instance" => Ok(Norm::Instance),
            t => match t.strip_prefix("group:").map(|g| g.trim().parse::<usize>()) {
                Some(Ok(g)) if g > 0 => Ok(Norm::Group(g)),
                _ => Err(Error::Config(format!(
                    "norm {s:?}: give instance or group:G (G groups, at least 1)"
                ))),
            },
        }
    }
}

/// How the decoder goes up one resolution: `transpose` or `nearest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Upsampling {
    /// Transposed convolution with kernel = stride (nnU-Net, DynUNet).
    Transpose,
    /// Nearest-neighbour upsampling followed by a 1x1x1 convolution.
    Nearest,
}

impl Upsampling {
    /// The spelling of pipeline files, flags and run records.
    pub fn name(self) -> &'static str {
        match self {
            Upsampling::Transpose => "transpose",
            Upsampling::Nearest => "nearest",
        }
    }
}

impl std::str::FromStr for Upsampling {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        [Upsampling::Transpose, Upsampling::Nearest]
            .into_iter()
            .find(|u| u.name() == s.trim())
            .ok_or_else(|| Error::Config(format!("upsampling {s:?}: give transpose or nearest")))
    }
}

/// How the encoder's stages are built: `plain` or `residual`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Encoder {
    /// nnU-Net's PlainConvUNet: conv-norm-LeakyReLU blocks, the first of a stage strided.
    #[default]
    Plain,
    /// nnU-Net's ResidualEncoderUNet (its ResEnc presets): a stem block, then residual
    /// blocks (two convolutions and a skip); the decoder stays plain.
    Residual,
}

impl Encoder {
    /// The spelling of pipeline files, flags and run records.
    pub fn name(self) -> &'static str {
        match self {
            Encoder::Plain => "plain",
            Encoder::Residual => "residual",
        }
    }

    /// Whether it is the default (records leave it out, so older runs read the same).
    pub fn is_plain(&self) -> bool {
        *self == Encoder::Plain
    }
}

impl std::str::FromStr for Encoder {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        [Encoder::Plain, Encoder::Residual]
            .into_iter()
            .find(|e| e.name() == s.trim())
            .ok_or_else(|| Error::Config(format!("encoder {s:?}: give plain or residual")))
    }
}

impl std::fmt::Display for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Arithmetic of the forward and backward passes: `f32`, or `bf16` (activations and
/// convolutions in bfloat16 with f32 accumulation; master weights, optimizer moments, norm
/// statistics and the loss stay f32, and checkpoints are f32 either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Precision {
    /// Everything in f32 (the only choice on the CPU).
    #[default]
    F32,
    /// bfloat16 activations with f32 master weights (GPU).
    Bf16,
}

impl Precision {
    /// The spelling of pipeline files, flags and run records.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }

    /// The dtype activations are computed in.
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            "f16" => Err(Error::Config(
                "precision f16 needs loss scaling, which is not built yet: use bf16 (same speed on \
                 GPUs since Ampere, no scaling needed)"
                    .into(),
            )),
            _ => Err(Error::Config(format!("precision {s:?}: give f32 or bf16"))),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The network's shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UNetConfig {
    /// Image channels of the input.
    pub in_channels: usize,
    /// Output channels, background included (2 for a binary task).
    pub num_classes: usize,
    /// Channels of the first stage; each deeper stage doubles them up to `max_channels`.
    pub base_channels: usize,
    /// Cap on the channels of any stage.
    pub max_channels: usize,
    /// Strides (z, y, x) of stages 1.. (stage 0 has stride 1): depth = strides.len() + 1.
    pub strides: Vec<[usize; 3]>,
    /// Normalization after each convolution.
    pub norm: Norm,
    /// How the decoder goes up a resolution.
    pub upsampling: Upsampling,
    /// Heads at the lower decoder resolutions (see [`UNetConfig::supervised_levels`]).
    #[serde(default)]
    pub deep_supervision: bool,
    /// Kernel (z, y, x) of each stage's convolutions, stage 0 first; a decoder stage uses its
    /// level's (nnU-Net's 1x3x3 for an axis much coarser than the others). Empty: 3x3x3.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<[usize; 3]>,
    /// Channels of each stage, stage 0 first. Empty: `base_channels` doubling up to
    /// `max_channels`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<usize>,
    /// Convolution blocks of each encoder stage, stage 0 first. Empty: 2 each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<usize>,
    /// Convolution blocks of each decoder stage, by the level it ends at (0 = full
    /// resolution; depth - 1 entries). Empty: 2 each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decoder_blocks: Vec<usize>,
    /// Plain or residual encoder stages.
    #[serde(default, skip_serializing_if = "Encoder::is_plain")]
    pub encoder: Encoder,
}

/// Parameter names of the deep-supervision heads start with this.
pub const DS_PREFIX: &str = "ds";

impl UNetConfig {
    /// Resolution levels with an output, full resolution (0) first: with deep supervision
    /// every decoder level but the lowest (levels 0..depth-2), else level 0 alone.
    pub fn supervised_levels(&self) -> Vec<usize> {
        let depth = self.strides.len() + 1;
        if self.deep_supervision {
            (0..depth.saturating_sub(2).max(1)).collect()
        } else {
            vec![0]
        }
    }

    /// The total stride (z, y, x) of resolution level `level`.
    pub fn level_stride(&self, level: usize) -> [usize; 3] {
        let mut t = [1; 3];
        for s in self.strides.iter().take(level) {
            for a in 0..3 {
                t[a] *= s[a];
            }
        }
        t
    }

    /// nnU-Net's loss weights of the outputs: 1 / 2^level, normalized to sum to 1.
    pub fn level_weights(&self) -> Vec<f64> {
        let w: Vec<f64> = self
            .supervised_levels()
            .iter()
            .map(|&l| 0.5f64.powi(l as i32))
            .collect();
        let sum: f64 = w.iter().sum();
        w.iter().map(|v| v / sum).collect()
    }

    /// nnU-Net-like plan: keep halving each axis while it stays at least `min_size` voxels at the
    /// next stage, up to `max_stages` stages in all. An axis of the patch too small to halve
    /// keeps stride 1 (anisotropic data: thin z gets (1, 2, 2) strides first).
    pub fn plan_strides(
        patch_zyx: [usize; 3],
        max_stages: usize,
        min_size: usize,
    ) -> Vec<[usize; 3]> {
        let mut size = patch_zyx;
        let mut strides = Vec::new();
        while strides.len() + 1 < max_stages {
            let s: [usize; 3] = std::array::from_fn(|a| {
                if size[a].is_multiple_of(2) && size[a] / 2 >= min_size {
                    2
                } else {
                    1
                }
            });
            if s == [1, 1, 1] {
                break;
            }
            for a in 0..3 {
                size[a] /= s[a];
            }
            strides.push(s);
        }
        strides
    }

    /// Channels of stage `stage` (0 = full resolution).
    pub fn channels(&self, stage: usize) -> usize {
        match self.features.get(stage) {
            Some(&f) => f,
            None => (self.base_channels << stage.min(16)).min(self.max_channels),
        }
    }

    /// Kernel (z, y, x) of stage `stage`'s convolutions.
    pub fn kernel(&self, stage: usize) -> [usize; 3] {
        self.kernels.get(stage).copied().unwrap_or([3; 3])
    }

    /// Convolution blocks of encoder stage `stage`.
    pub fn encoder_blocks(&self, stage: usize) -> usize {
        self.blocks.get(stage).copied().unwrap_or(2)
    }

    /// Convolution blocks of the decoder stage ending at `level`.
    pub fn decoder_blocks(&self, level: usize) -> usize {
        self.decoder_blocks.get(level).copied().unwrap_or(2)
    }

    /// The patch sizes this network accepts are multiples of the total stride.
    pub fn total_stride(&self) -> [usize; 3] {
        let mut t = [1; 3];
        for s in &self.strides {
            for a in 0..3 {
                t[a] *= s[a];
            }
        }
        t
    }

    /// Check the shape: channels, classes, groups and strides in range.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("model: {m}")));
        if self.in_channels == 0 || self.num_classes < 2 {
            return bad(format!(
                "needs at least 1 input channel and 2 classes, got {} and {}",
                self.in_channels, self.num_classes
            ));
        }
        if self.base_channels == 0 || self.max_channels < self.base_channels {
            return bad(format!(
                "base_channels {} must be > 0 and <= max_channels {}",
                self.base_channels, self.max_channels
            ));
        }
        // Beyond these a network's tensors would not be allocated (nnU-Net's largest: 320
        // features, a few hundred classes).
        let widest = self
            .features
            .iter()
            .copied()
            .max()
            .unwrap_or(self.max_channels);
        if self.max_channels > MAX_FEATURES
            || widest > MAX_FEATURES
            || self.num_classes > MAX_CLASSES
        {
            return bad(format!(
                "max_channels {}, features up to {widest}, {} classes: at most {MAX_FEATURES} features and {MAX_CLASSES} classes",
                self.max_channels, self.num_classes
            ));
        }
        if let Norm::Group(0) = self.norm {
            return bad("group norm needs at least one group".into());
        }
        if self.strides.iter().flatten().any(|&s| s == 0 || s > 4) {
            return bad(format!("strides must be 1..=4, got {:?}", self.strides));
        }
        let depth = self.strides.len() + 1;
        let lists = [
            ("kernels", self.kernels.len(), depth),
            ("features", self.features.len(), depth),
            ("blocks", self.blocks.len(), depth),
            ("decoder_blocks", self.decoder_blocks.len(), depth - 1),
        ];
        for (name, got, want) in lists {
            if got != 0 && got != want {
                return bad(format!(
                    "{name} has {got} entries for a network of {depth} stages: give {want} (one per {}stage)",
                    if name == "decoder_blocks" { "decoder " } else { "" }
                ));
            }
        }
        if self
            .kernels
            .iter()
            .flatten()
            .any(|&k| k == 0 || k > 7 || k % 2 == 0)
        {
            return bad(format!(
                "kernel sides must be odd, 1..=7 (the padding keeps the shape), got {:?}",
                self.kernels
            ));
        }
        if self.features.iter().any(|&f| f == 0 || f > 4096) {
            return bad(format!(
                "features must be 1..=4096, got {:?}",
                self.features
            ));
        }
        if self
            .blocks
            .iter()
            .chain(&self.decoder_blocks)
            .any(|&b| b == 0 || b > 64)
        {
            return bad(format!(
                "blocks per stage must be 1..=64, got {:?} and decoder {:?}",
                self.blocks, self.decoder_blocks
            ));
        }
        Ok(())
    }

    /// Check that a patch fits the network (each axis a multiple of the total stride).
    pub fn check_patch(&self, patch_zyx: [usize; 3]) -> Result<()> {
        let t = self.total_stride();
        if (0..3).any(|a| patch_zyx[a] == 0 || !patch_zyx[a].is_multiple_of(t[a])) {
            return Err(Error::Config(format!(
                "patch {patch_zyx:?} (z, y, x) must be a positive multiple of the network's total stride {t:?} on each axis"
            )));
        }
        Ok(())
    }
}

/// The most features a stage may have.
pub const MAX_FEATURES: usize = 8192;
/// The most output classes a network may have.
pub const MAX_CLASSES: usize = 4096;

/// The options of a run that shape its network, as the `[train]` table and a run's record
/// spell them. Training takes them from its configuration; prediction reads them back from the
/// run's record (other keys of the record are ignored here).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetworkOptions {
    /// Patch size (z, y, x) in voxels: the network's strides are planned from it.
    pub patch: [usize; 3],
    /// Channels of the first stage.
    pub base_channels: usize,
    /// Cap on the channels of any stage.
    pub max_channels: usize,
    /// Resolution stages.
    pub stages: usize,
    /// Normalization after each convolution.
    pub norm: Norm,
    /// How the decoder goes up a resolution.
    pub upsampling: Upsampling,
    /// Arithmetic of the passes.
    pub precision: Precision,
    /// Deep-supervision heads.
    pub deep_supervision: bool,
    /// Strides (z, y, x) of stages 1.. (`stages - 1` entries). Empty: planned from `patch`
    /// (halve each axis while it stays at least 4 voxels).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub strides: Vec<[usize; 3]>,
    /// Kernel (z, y, x) of each stage. Empty: 3x3x3.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<[usize; 3]>,
    /// Channels of each stage. Empty: `base_channels` doubling up to `max_channels`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<usize>,
    /// Convolution blocks of each encoder stage. Empty: 2 each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<usize>,
    /// Convolution blocks of each decoder stage, full resolution first. Empty: 2 each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decoder_blocks: Vec<usize>,
    /// Plain or residual encoder stages.
    #[serde(skip_serializing_if = "Encoder::is_plain")]
    pub encoder: Encoder,
    /// Seed of the initial weights.
    pub seed: u64,
}

impl Default for NetworkOptions {
    fn default() -> Self {
        NetworkOptions {
            patch: [16, 48, 48],
            base_channels: 8,
            max_channels: 128,
            stages: 4,
            norm: Norm::Instance,
            upsampling: Upsampling::Transpose,
            precision: Precision::F32,
            deep_supervision: true,
            strides: vec![],
            kernels: vec![],
            features: vec![],
            blocks: vec![],
            decoder_blocks: vec![],
            encoder: Encoder::Plain,
            seed: 1234,
        }
    }
}

impl NetworkOptions {
    /// The network's shape for `in_channels` inputs and `num_classes` outputs, its patch checked.
    pub fn unet_config(&self, in_channels: usize, num_classes: usize) -> Result<UNetConfig> {
        let strides = if self.strides.is_empty() {
            UNetConfig::plan_strides(self.patch, self.stages, 4)
        } else if self.strides.len() + 1 != self.stages {
            return Err(Error::Config(format!(
                "strides lists {} stages after the first, but stages = {}: give stages - 1 strides",
                self.strides.len(),
                self.stages
            )));
        } else {
            self.strides.clone()
        };
        let ucfg = UNetConfig {
            in_channels,
            num_classes,
            base_channels: self.base_channels,
            max_channels: self.max_channels,
            strides,
            norm: self.norm,
            upsampling: self.upsampling,
            deep_supervision: self.deep_supervision,
            kernels: self.kernels.clone(),
            features: self.features.clone(),
            blocks: self.blocks.clone(),
            decoder_blocks: self.decoder_blocks.clone(),
            encoder: self.encoder,
        };
        ucfg.check_patch(self.patch)?;
        Ok(ucfg)
    }

    /// The network for `in_channels` input channels and `num_classes` outputs on `dev`, with
    /// its seeded initial weights.
    pub fn build(&self, in_channels: usize, num_classes: usize, dev: &Device) -> Result<UNet> {
        let ucfg = self.unet_config(in_channels, num_classes)?;
        if self.precision != Precision::F32 && dev.is_cpu() {
            return Err(Error::Config(format!(
                "precision {} is for a GPU (--device cuda): the CPU kernels compute in f32",
                self.precision
            )));
        }
        let mut model = UNet::new(ucfg, self.seed, dev)?;
        model.set_precision(self.precision);
        Ok(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_stage_lists_build_that_network_and_old_records_still_read() {
        let planned = NetworkOptions {
            patch: [8, 32, 32],
            stages: 3,
            strides: vec![[1, 2, 2], [2, 2, 2]],
            kernels: vec![[1, 3, 3], [3, 3, 3], [3, 3, 3]],
            features: vec![4, 6, 8],
            blocks: vec![1, 2, 2],
            decoder_blocks: vec![1, 1],
            ..NetworkOptions::default()
        };
        let net = planned.build(1, 2, &Device::Cpu).unwrap();
        let c = net.config();
        assert_eq!(c.strides, planned.strides);
        assert_eq!(
            (c.kernel(0), c.channels(1), c.encoder_blocks(0)),
            ([1, 3, 3], 6, 1)
        );
        // Stages that do not match the strides, a patch the strides do not divide: named.
        let e = NetworkOptions {
            stages: 4,
            ..planned.clone()
        }
        .build(1, 2, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("strides") && e.contains("stages = 4"), "{e}");
        let e = NetworkOptions {
            patch: [5, 32, 32],
            ..planned.clone()
        }
        .build(1, 2, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("multiple"), "{e}");
        // A record written before these keys existed reads as the default network, and the
        // default options write none of them (so existing runs keep their weight shaping).
        let old: NetworkOptions =
            serde_json::from_str(r#"{"patch": [16, 48, 48], "stages": 4}"#).unwrap();
        assert!(old.strides.is_empty() && old.kernels.is_empty() && old.blocks.is_empty());
        let json = serde_json::to_string(&NetworkOptions::default()).unwrap();
        assert!(
            !json.contains("kernels") && !json.contains("strides"),
            "{json}"
        );
        let back: NetworkOptions =
            serde_json::from_str(&serde_json::to_string(&planned).unwrap()).unwrap();
        assert_eq!(back, planned);
    }
}
