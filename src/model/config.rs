//! The network's configuration: its shape ([`UNetConfig`]), planned and checked from a run's
//! network options ([`NetworkOptions`] and the choices it names, typed in
//! [`crate::format::training::network`] because run records hold them), from which training and
//! prediction build the same network.

use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

use super::unet::UNet;
use crate::error::{Error, Result};

pub use crate::format::training::network::{Encoder, NetworkOptions, Norm, Precision, Upsampling};

impl Precision {
    /// The dtype activations are computed in.
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
        }
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
    /// A plain U-Net: instance norm, transposed-convolution upsampling, no deep supervision,
    /// 3x3x3 kernels, channels doubling from `base_channels` up to `max_channels`, two blocks
    /// a stage (set the other fields with struct update syntax).
    pub fn plain(
        in_channels: usize,
        num_classes: usize,
        base_channels: usize,
        max_channels: usize,
        strides: Vec<[usize; 3]>,
    ) -> Self {
        Self {
            in_channels,
            num_classes,
            base_channels,
            max_channels,
            strides,
            norm: Norm::Instance,
            upsampling: Upsampling::Transpose,
            deep_supervision: false,
            kernels: vec![],
            features: vec![],
            blocks: vec![],
            decoder_blocks: vec![],
            encoder: Encoder::Plain,
        }
    }

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
