//! The parameters that shape an entry's bytes, as recorded in entries and the manifest. Their
//! canonical JSON is part of every content key.

use serde::{Deserialize, Serialize};

use super::dtype::Dtype;
use super::normalization::{ForegroundStats, Normalization, SchemeStatistics};
use crate::error::{Error, Result};

/// Element type of the cached image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageDtype {
    /// 4 bytes a voxel: the normalized values exactly.
    Float32,
    /// 2 bytes a voxel: half the disk and read bandwidth, about 3 significant digits.
    Float16,
}

impl ImageDtype {
    /// The stored element type.
    pub fn dtype(self) -> Dtype {
        match self {
            ImageDtype::Float32 => Dtype::Float32,
            ImageDtype::Float16 => Dtype::Float16,
        }
    }
}

impl std::str::FromStr for ImageDtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "float32" | "f32" => Ok(ImageDtype::Float32),
            "float16" | "f16" => Ok(ImageDtype::Float16),
            _ => Err(Error::Config(format!(
                "image dtype {s:?}: choose float32 or float16"
            ))),
        }
    }
}

/// The label-derived arrays an entry is built with (for the losses that need them): part of the
/// content key, so asking for them builds new entries and never changes existing ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DerivedArrays {
    /// A signed distance map per foreground class (boundary and surface losses).
    pub distance: bool,
    /// The label's skeleton (Skeleton Recall, clDice).
    pub skeleton: bool,
    /// dataset.json's ignore label when arrays are built: it is not a class (no distance
    /// channel) and is background to the skeleton. Absent from the key when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_label: Option<u16>,
}

impl DerivedArrays {
    /// Whether any array is asked for.
    pub fn any(self) -> bool {
        self.distance || self.skeleton
    }

    /// The names asked for, as the pipeline key spells them.
    pub fn names(self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.distance {
            v.push("distance");
        }
        if self.skeleton {
            v.push("skeleton");
        }
        v
    }

    /// From names: `distance`, `skeleton`; an empty list or `none` asks for nothing.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Self> {
        let mut d = DerivedArrays::default();
        for n in names {
            match n.as_ref().trim() {
                "distance" => d.distance = true,
                "skeleton" => d.skeleton = true,
                "none" | "" => {}
                other => {
                    return Err(Error::Config(format!(
                        "derived array {other:?}: choose distance, skeleton (or none)"
                    )))
                }
            }
        }
        Ok(d)
    }
}

/// `distance,skeleton`, `distance`, `skeleton` or `none`.
impl std::str::FromStr for DerivedArrays {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::from_names(&s.split(',').collect::<Vec<_>>())
    }
}

/// Chunk compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "codec", rename_all = "lowercase")]
pub enum Compression {
    /// Raw little-endian chunks: the trainer memory-maps them.
    None,
    /// Zstandard.
    Zstd {
        /// zstd level (default 3).
        level: i32,
    },
    /// Blosc (zstd inside, byte shuffle).
    Blosc {
        /// Blosc level, 0..9 (default 5).
        level: u8,
    },
    /// Blosc with LZ4 inside and byte shuffle: decodes several times faster than zstd.
    #[serde(rename = "blosc-lz4")]
    BloscLz4 {
        /// Blosc level, 0..9 (default 5).
        level: u8,
    },
}

impl Compression {
    /// From a codec name (`none` or `raw`, `zstd`, `blosc`) and an optional level (else the
    /// codec's default).
    pub fn parse(name: &str, level: Option<i32>) -> Result<Self> {
        Ok(match name {
            "none" | "raw" => Compression::None,
            "zstd" => Compression::Zstd {
                level: level.unwrap_or(3),
            },
            "blosc" | "blosc-lz4" => {
                let l = level.unwrap_or(5);
                let level = u8::try_from(l)
                    .map_err(|_| Error::Config(format!("blosc level {l} is not one of 0..9")))?;
                match name {
                    "blosc" => Compression::Blosc { level },
                    _ => Compression::BloscLz4 { level },
                }
            }
            _ => {
                return Err(Error::Config(format!(
                    "compression {name:?}: choose none, zstd, blosc or blosc-lz4"
                )))
            }
        })
        .and_then(|c| match c.level_problem() {
            Some(p) => Err(Error::Config(p)),
            None => Ok(c),
        })
    }

    /// Why this codec's level cannot be used, if it cannot: zstd's levels are -131072..22,
    /// blosc's 0..9. A record read from a file may hold any number; flags are checked in
    /// [`Compression::parse`].
    pub fn level_problem(&self) -> Option<String> {
        let (ok, level, range) = match *self {
            Compression::None => return None,
            Compression::Zstd { level } => ((-131072..=22).contains(&level), level, "-131072..22"),
            Compression::Blosc { level } | Compression::BloscLz4 { level } => {
                (level <= 9, level as i32, "0..9")
            }
        };
        (!ok).then(|| format!("{} level {level} is not one of {range}", self.name()))
    }

    /// The codec name as flags and pipeline files spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zstd { .. } => "zstd",
            Compression::Blosc { .. } => "blosc",
            Compression::BloscLz4 { .. } => "blosc-lz4",
        }
    }
}

/// Every parameter that shapes an entry's bytes. Its canonical JSON goes into the content key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputParams {
    /// [`super::FORMAT_VERSION`]: a new format gives every entry a new key.
    pub format_version: u32,
    /// Output grid convention: always "edge-aligned" (see [`crate::geometry`]).
    pub grid_convention: String,
    /// Target spacing (x, y, z) in the files' units.
    pub target_spacing_xyz: [f64; 3],
    /// Image resampling: always "linear".
    pub image_interpolation: String,
    /// Label resampling: always "nearest".
    pub label_interpolation: String,
    /// Per image channel, in channel order: its intensity scheme (applied before resampling)
    /// and the dataset statistics that scheme needs.
    pub channels: Vec<ChannelParams>,
    /// Element type of the cached image.
    pub image_dtype: ImageDtype,
    /// Configured chunk shape (z, y, x): an upper bound per axis ([`OutputParams::layout_for`]).
    pub chunk_zyx: [usize; 3],
    /// Configured shard shape (z, y, x); `None`: no sharding.
    pub shard_zyx: Option<[usize; 3]>,
    /// Chunk codec.
    pub compression: Compression,
    /// Foreground coordinates sampled per class.
    pub fg_samples: usize,
    /// Seed of the foreground sample (same seed, same sample).
    pub seed: u64,
    /// The label-derived arrays built beside the label.
    pub derived: DerivedArrays,
    /// Set when the entries are nnU-Net's preprocessed arrays for a plans file's
    /// configuration (`prep build-cache --nnunet-plans`): its crop, normalization and
    /// resampling, on its transposed grid, instead of this tool's own. Absent from the JSON
    /// otherwise, so earlier keys are unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nnunet: Option<NnunetPreprocessing>,
}

/// Which nnU-Net preprocessing made a cache's entries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NnunetPreprocessing {
    /// The plans file's name, as given.
    pub plans: String,
    /// The blake3 of its bytes: other plans give other entries.
    pub plans_blake3: String,
    /// The configuration preprocessed for (`3d_fullres`, ...).
    pub configuration: String,
    /// nnU-Net's image reader the plans name (it decides the spacing's unit).
    pub reader: String,
    /// The plans' `transpose_forward`: the cached axes are the files' (z, y, x) permuted so.
    pub transpose_forward: [usize; 3],
    /// The channels the plans normalize within the nonzero mask (`use_mask_for_norm`): a
    /// labelled entry then holds the normalization mask, and nnU-Net's training zeroes these
    /// channels outside it after augmentation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub norm_mask_channels: Vec<u16>,
}

/// How one image channel is normalized. Channel names are not here: renaming a channel in
/// dataset.json changes no byte of the cache, so it rebuilds nothing (the manifest has them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChannelParams {
    /// Intensity scheme applied to the channel before resampling.
    pub normalization: Normalization,
    /// The channel's dataset foreground statistics: the CT scheme only, else `None`.
    pub dataset_foreground: Option<ForegroundStats>,
}

impl OutputParams {
    /// What every reader relies on: a positive finite target spacing, chunk and shard sides
    /// that are positive (a shard a whole number of chunks), one to [`super::entry::MAX_CHANNELS`]
    /// channels, schemes a build applies (not nnU-Net's rescale or RGB), the CT scheme with its
    /// statistics. `path` and `field` name the record.
    pub fn check(&self, path: &std::path::Path, field: &str) -> crate::Result<()> {
        let bad = |m: String| {
            Err(crate::Error::Config(format!(
                "{}: {field}.{m}",
                path.display()
            )))
        };
        if self
            .target_spacing_xyz
            .iter()
            .any(|s| !s.is_finite() || *s <= 0.0)
        {
            return bad(format!(
                "target_spacing_xyz {:?}: every spacing must be a positive number",
                self.target_spacing_xyz
            ));
        }
        if self.chunk_zyx.contains(&0) {
            return bad(format!("chunk_zyx {:?} has a zero side", self.chunk_zyx));
        }
        if let Some(s) = self.shard_zyx {
            if (0..3).any(|a| s[a] == 0 || s[a] % self.chunk_zyx[a] != 0) {
                return bad(format!(
                    "shard_zyx {s:?} is not a whole multiple of the chunk {:?}",
                    self.chunk_zyx
                ));
            }
        }
        if let Some(p) = self.compression.level_problem() {
            return bad(format!("compression: {p}"));
        }
        let c = self.channels.len();
        if c == 0 || c > super::entry::MAX_CHANNELS {
            return bad(format!(
                "channels: {c} channels (1 to {} can be read)",
                super::entry::MAX_CHANNELS
            ));
        }
        for (k, ch) in self.channels.iter().enumerate() {
            if !ch.normalization.built() && self.nnunet.is_none() {
                return bad(format!(
                    "channels[{k}]: {} normalization is applied to nnU-Net models' inputs only",
                    ch.normalization.name()
                ));
            }
            if ch.normalization.statistics() == SchemeStatistics::DatasetForeground
                && ch.dataset_foreground.is_none()
            {
                return bad(format!(
                    "channels[{k}]: CT normalization without the dataset's foreground statistics"
                ));
            }
        }
        Ok(())
    }

    /// Canonical JSON: fixed field order, shortest round-trip float formatting.
    pub fn canonical_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The chunk and shard shapes used for an output of `shape_zyx`: the configured chunk is an
    /// upper bound, and each axis is cut into the fewest near-equal chunks no larger than it,
    /// so edge chunks waste little padding (uncompressed edge chunks are stored full size).
    /// A shard keeps its configured number of chunks per axis, capped to what the axis needs.
    pub fn layout_for(&self, shape_zyx: [usize; 3]) -> ChunkLayout {
        let chunk = [0, 1, 2].map(|a| {
            let n = shape_zyx[a].max(1);
            let pieces = n.div_ceil(self.chunk_zyx[a]);
            n.div_ceil(pieces)
        });
        let shard = self.shard_zyx.map(|s| {
            [0, 1, 2].map(|a| {
                let per_shard = s[a] / self.chunk_zyx[a];
                chunk[a] * per_shard.min(shape_zyx[a].max(1).div_ceil(chunk[a]))
            })
        });
        ChunkLayout {
            chunk_zyx: chunk,
            shard_zyx: shard,
        }
    }
}

/// The chunk (and shard) shape of one entry's arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkLayout {
    /// Chunk shape (z, y, x) in voxels: the inner chunk when sharded.
    pub chunk_zyx: [usize; 3],
    /// Shard shape (z, y, x) in voxels; `None` when not sharded.
    pub shard_zyx: Option<[usize; 3]>,
}

impl ChunkLayout {
    /// The unit a worker computes and writes: a shard if sharded, else a chunk.
    pub fn write_block_zyx(&self) -> [usize; 3] {
        self.shard_zyx.unwrap_or(self.chunk_zyx)
    }
}
