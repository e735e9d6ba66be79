//! The parameters of a build (`prep build-cache`, and `prep inspect`'s forecast of one), after
//! defaults, pipeline and flags are merged (the `config` layer does the merging).

use crate::error::{Error, Result};
use crate::format::{
    ChannelParams, Compression, DerivedArrays, ForegroundStats, ImageDtype, Normalization,
    OutputParams, FORMAT_VERSION,
};

/// The name of the pipeline used when none is named (its file is bundled with the `config` layer).
pub const DEFAULT_PIPELINE: &str = "default";

/// How the target spacing is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SpacingChoice {
    /// Per-axis median with nnU-Net's anisotropy rule.
    Auto,
    /// Explicit (x, y, z), in the files' units.
    Explicit([f64; 3]),
}

/// A named chunk layout: the image's element type, chunk, shard and codec set together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `raw` below [`AUTO_PACKED_ABOVE_BYTES`] of forecast uncompressed output, else `packed`
    /// (decided over the whole dataset, so every `--part` of a build decides alike).
    Auto,
    /// float32 images, uncompressed 32x128x128 chunks: memory-mapped, the fastest patches
    /// while the cache fits in the page cache.
    Raw,
    /// float16 images, 16x32x32 inner chunks compressed with Blosc (LZ4, byte shuffle) in
    /// 64x256x256 shards: about 40% of `raw`'s bytes, each inner chunk decoded on its own;
    /// faster than `raw` once reads come from disk.
    Packed,
}

/// Above this forecast of uncompressed output (image and label, float32), `Layout::Auto`
/// builds `packed`: a cache this large stops fitting the page cache of the smaller training
/// machines (a quarter of 32 GiB), and from disk `packed` reads faster than `raw` (see
/// docs/usage.md, "Choosing the chunk layout").
pub const AUTO_PACKED_ABOVE_BYTES: u64 = 8 << 30;

impl std::str::FromStr for Layout {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "auto" => Ok(Layout::Auto),
            "raw" => Ok(Layout::Raw),
            "packed" => Ok(Layout::Packed),
            _ => Err(Error::Config(format!(
                "layout {s:?}: choose auto, raw or packed"
            ))),
        }
    }
}

impl Layout {
    /// Set the layout's element type, chunk, shard and codec (`Auto` sets `raw`'s until the
    /// build decides).
    pub fn apply_to(self, s: &mut Settings) {
        s.layout = self;
        match self {
            Layout::Auto | Layout::Raw => {
                s.image_dtype = ImageDtype::Float32;
                s.chunk_zyx = [32, 128, 128];
                s.shard_zyx = None;
                s.compression = Compression::None;
            }
            Layout::Packed => {
                s.image_dtype = ImageDtype::Float16;
                s.chunk_zyx = [16, 32, 32];
                s.shard_zyx = Some([64, 256, 256]);
                s.compression = Compression::BloscLz4 { level: 5 };
            }
        }
    }

    /// "raw", "packed", "auto".
    pub fn name(self) -> &'static str {
        match self {
            Layout::Auto => "auto",
            Layout::Raw => "raw",
            Layout::Packed => "packed",
        }
    }
}

/// Parameters after defaults, pipeline and flags are merged (spacing not yet resolved).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Name of the pipeline the settings came from, recorded in the manifest.
    pub pipeline: String,
    /// How the target spacing is chosen.
    pub spacing: SpacingChoice,
    /// Intensity scheme applied to the image before resampling: to every channel whose
    /// dataset.json name does not pick one (nnU-Net's "CT", "noNorm", "zscore").
    pub normalization: Normalization,
    /// `--normalization` was given on the command line: it applies to every channel,
    /// whatever dataset.json's channel names say.
    pub normalization_forced: bool,
    /// The planned configuration is a cascade's second stage after this one: the build needs
    /// `--previous-stage` (not part of the cache's parameters).
    pub previous_stage_of: Option<String>,
    /// The named layout the four fields below came from; `Auto` until a build decides, and
    /// no longer `Auto` once a pipeline or flag sets one of them.
    pub layout: Layout,
    /// Element type of the cached image.
    pub image_dtype: ImageDtype,
    /// Chunk shape (z, y, x) in voxels: an upper bound, fitted to each case
    /// ([`crate::format::OutputParams::layout_for`]).
    pub chunk_zyx: [usize; 3],
    /// Shard shape (z, y, x) in voxels, whole multiples of the chunk; `None`: no sharding.
    pub shard_zyx: Option<[usize; 3]>,
    /// Chunk codec; `Compression::None` keeps chunks memory-mappable.
    pub compression: Compression,
    /// Foreground coordinates sampled per class for the patch sampler.
    pub fg_samples: usize,
    /// Seed of the foreground sample (same seed, same sample).
    pub seed: u64,
    /// Label-derived arrays built beside the label.
    pub derived: DerivedArrays,
    /// Largest forecast output of one case, in GiB; not part of the content key (it shapes
    /// nothing that is written).
    pub max_case_gib: f64,
    /// Inputs with more voxel bytes than this many MiB are read from a scratch file instead of
    /// memory; not part of the content key (the output is the same either way).
    pub input_ram_mib: u64,
}

/// The defaults (see docs/usage.md, "Choosing the chunk layout", for the measurement behind them).
impl Default for Settings {
    fn default() -> Self {
        Settings {
            pipeline: DEFAULT_PIPELINE.into(),
            spacing: SpacingChoice::Auto,
            normalization: Normalization::ZscoreNonzero,
            normalization_forced: false,
            previous_stage_of: None,
            layout: Layout::Auto,
            image_dtype: ImageDtype::Float32,
            chunk_zyx: [32, 128, 128],
            shard_zyx: None,
            compression: Compression::None,
            fg_samples: 10_000,
            seed: 1234,
            derived: DerivedArrays::default(),
            max_case_gib: 1024.0,
            input_ram_mib: 256,
        }
    }
}

impl Settings {
    /// Check the shapes: chunk sides 1..4096, shards whole multiples of the chunk and at most
    /// 1 GiB (at 4 bytes a voxel).
    pub fn validate(&self) -> Result<()> {
        if !(self.max_case_gib.is_finite() && self.max_case_gib > 0.0) {
            return Err(Error::Config(format!(
                "max_case_gib {}: give a positive number of GiB",
                self.max_case_gib
            )));
        }
        if self.chunk_zyx.iter().any(|&c| c == 0 || c > 4096) {
            return Err(Error::Config(format!(
                "chunk shape {:?}: each side must be 1..4096",
                self.chunk_zyx
            )));
        }
        if let Some(s) = self.shard_zyx {
            for a in 0..3 {
                if s[a] == 0 || s[a] % self.chunk_zyx[a] != 0 {
                    return Err(Error::Config(format!(
                        "shard shape {s:?} must be a whole multiple of the chunk shape {:?}",
                        self.chunk_zyx
                    )));
                }
            }
            let bytes: usize = s.iter().product::<usize>() * 4;
            if bytes > 1 << 30 {
                return Err(Error::Config(format!(
                    "shard shape {s:?} is over 1 GiB per shard"
                )));
            }
        }
        Ok(())
    }

    /// The parameters of a one-channel image at the target spacing `target` (x, y, z), with
    /// the dataset foreground statistics when the CT scheme needs them.
    pub fn output_params(&self, target: [f64; 3], fg: Option<ForegroundStats>) -> OutputParams {
        let channel = ChannelParams {
            normalization: self.normalization,
            dataset_foreground: fg,
        };
        self.output_params_for(target, vec![channel])
    }

    /// The parameters of an image of `channels.len()` channels.
    pub fn output_params_for(
        &self,
        target: [f64; 3],
        channels: Vec<ChannelParams>,
    ) -> OutputParams {
        OutputParams {
            format_version: FORMAT_VERSION,
            grid_convention: "edge-aligned".into(),
            target_spacing_xyz: target,
            image_interpolation: "linear".into(),
            label_interpolation: "nearest".into(),
            channels,
            image_dtype: self.image_dtype,
            chunk_zyx: self.chunk_zyx,
            shard_zyx: self.shard_zyx,
            compression: self.compression,
            fg_samples: self.fg_samples,
            seed: self.seed,
            derived: self.derived,
            nnunet: None,
        }
    }
}
