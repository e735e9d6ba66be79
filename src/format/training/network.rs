//! The network options of a run ([`NetworkOptions`]) and the choices a pipeline names (norm,
//! up-sampling, encoder, precision): the `[train]` keys that shape a network, as pipeline
//! files, flags and run records spell them. `model` builds the network from them.

use serde::{Deserialize, Serialize};

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
