//! nnU-Net v2's checkpoints read without Python: the zip archive `torch.save` writes, its
//! pickle read by our bounded reader ([`crate::format::nnunet::torch_archive`]), the
//! `network_weights` state dict renamed to our parameters (each refused, named, if it holds NaN
//! or infinite values), and the network rebuilt from the plans' `arch_kwargs`
//! (dynamic-network-architectures' PlainConvUNet and ResidualEncoderUNet are our plain and
//! residual U-Nets; a 2D network is ours one voxel deep). Every parameter's shape is compared
//! with the plans' network before that network is allocated.
//!
//! The state dict names each parameter more than once (`convs.N.conv.weight` and
//! `convs.N.all_modules.0.weight`; the decoder's own reference to the encoder): those are
//! views of one storage and are skipped. Anything else we cannot place (a batch norm's running
//! statistics, another network's layers) refuses the checkpoint: its trainer changed the
//! network the plans describe.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use super::config::{Encoder, Norm, UNetConfig, Upsampling, DS_PREFIX};
use super::unet::{parameter_shapes, UNet};
use crate::error::{Error, Result};
use crate::format::nnunet::pickle::{Pickle, TensorRef, TorchDtype, Value};
use crate::format::nnunet::torch_archive::{ArchiveLimits, RawTensor, TorchArchive};
use crate::format::nnunet::{Architecture, Plans};

/// Most parameters a checkpoint may place (nnU-Net's largest networks have a few hundred).
const MAX_PARAMETERS: usize = 1 << 16;

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::Model {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// A checkpoint's network and what inference needs from the rest of it.
pub struct NnunetCheckpoint {
    /// The file.
    pub path: PathBuf,
    /// `trainer_name`.
    pub trainer: String,
    /// `init_args.configuration`, when recorded.
    pub configuration: Option<String>,
    /// `inference_allowed_mirroring_axes` (axes of the patch, 0 first); `None`: no mirroring.
    pub mirror_axes: Option<Vec<usize>>,
    /// The weights under our parameter names.
    pub weights: HashMap<String, Tensor>,
    /// Our parameter name -> the checkpoint's, for messages.
    names: HashMap<String, String>,
    /// A 2D network (its weights were made one voxel deep).
    planar: bool,
}

/// The elements of `raw` as f32; `None` for an integer type.
fn to_f32(raw: &RawTensor) -> Option<Vec<f32>> {
    let b = &raw.bytes;
    Some(match raw.dtype {
        TorchDtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        TorchDtype::F64 => b
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0; 8];
                a.copy_from_slice(c);
                f64::from_le_bytes(a) as f32
            })
            .collect(),
        TorchDtype::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        TorchDtype::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

/// `inference_allowed_mirroring_axes`: `None`, or a tuple or list of axes 0..3.
fn mirror_axes(path: &Path, pk: &Pickle) -> Result<Option<Vec<usize>>> {
    let key = "inference_allowed_mirroring_axes";
    let Some(v) = pk.dict_get(pk.root(), key) else {
        return Ok(None);
    };
    if matches!(pk.value(v), Value::None) {
        return Ok(None);
    }
    let items = pk.items(v).ok_or_else(|| {
        bad(
            path,
            format!("{key} is {}, not a tuple of axes", pk.describe(v)),
        )
    })?;
    items
        .iter()
        .map(|&a| match pk.value(a) {
            Value::Int(i) if (0..3).contains(i) => Ok(*i as usize),
            _ => Err(bad(
                path,
                format!("{key} holds {}, not an axis", pk.describe(a)),
            )),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Our name for one of the state dict's parameters: `Ok(Some)` placed, `Ok(None)` a view of
/// another or the lowest segmentation layer nnU-Net computes and never uses; `Err` unknown.
fn our_name(name: &str, n_stages: usize) -> std::result::Result<Option<String>, ()> {
    let p: Vec<&str> = name.split('.').collect();
    let num = |s: &str| s.parse::<usize>().map_err(|_| ());
    let wb = |s: &str| {
        if s == "weight" || s == "bias" {
            Ok(s.to_string())
        } else {
            Err(())
        }
    };
    let cn = |s: &str| {
        if s == "conv" || s == "norm" {
            Ok(s.to_string())
        } else {
            Err(())
        }
    };
    if p.contains(&"all_modules") || p.first() == Some(&"decoder") && p.get(1) == Some(&"encoder") {
        return Ok(None);
    }
    let level = |i: usize| n_stages.checked_sub(2 + i).ok_or(());
    match p[..] {
        ["encoder", "stem", "convs", "0", c, w] => Ok(Some(format!("stem.{}.{}", cn(c)?, wb(w)?))),
        ["encoder", "stages", s, "blocks", b, conv @ ("conv1" | "conv2"), c, w] => Ok(Some(
            format!("enc{}.{}.{conv}.{}.{}", num(s)?, num(b)?, cn(c)?, wb(w)?),
        )),
        ["encoder", "stages", s, "blocks", b, "skip", k, c, w] => {
            num(k)?;
            Ok(Some(format!(
                "enc{}.{}.skip.{}.{}",
                num(s)?,
                num(b)?,
                cn(c)?,
                wb(w)?
            )))
        }
        ["encoder", "stages", s, "0", "convs", b, c, w] => Ok(Some(format!(
            "enc{}.{}.{}.{}",
            num(s)?,
            num(b)?,
            cn(c)?,
            wb(w)?
        ))),
        ["decoder", "stages", i, "convs", b, c, w] => Ok(Some(format!(
            "dec{}.{}.{}.{}",
            level(num(i)?)?,
            num(b)?,
            cn(c)?,
            wb(w)?
        ))),
        ["decoder", "transpconvs", i, w] => {
            Ok(Some(format!("dec{}.up.{}", level(num(i)?)?, wb(w)?)))
        }
        ["decoder", "seg_layers", i, w] => {
            let l = level(num(i)?)?;
            let w = wb(w)?;
            Ok(if l == 0 {
                Some(format!("head.{w}"))
            } else if l + 2 == n_stages {
                None
            } else {
                Some(format!("ds{l}.{w}"))
            })
        }
        _ => Err(()),
    }
}

/// (z, y, x) of a 2- or 3-number list (2D: one voxel deep).
fn zyx(v: &[usize]) -> [usize; 3] {
    match *v {
        [y, x] => [1, y, x],
        [z, y, x] => [z, y, x],
        _ => [1, 1, 1],
    }
}

/// Our network for an nnU-Net architecture with `in_channels` inputs and `outputs` heads.
pub fn unet_config(a: &Architecture, in_channels: usize, outputs: usize) -> UNetConfig {
    let mut decoder_blocks = a.decoder_convs.clone();
    decoder_blocks.reverse(); // nnU-Net lists them from the deepest; we from full resolution
    let residual = a.class == "ResidualEncoderUNet";
    UNetConfig {
        in_channels,
        num_classes: outputs,
        base_channels: a.features[0],
        max_channels: a.features.iter().copied().max().unwrap_or(a.features[0]),
        strides: a.strides[1..].iter().map(|s| zyx(s)).collect(),
        norm: Norm::Instance,
        upsampling: Upsampling::Transpose,
        deep_supervision: false,
        kernels: a.kernels.iter().map(|k| zyx(k)).collect(),
        features: a.features.clone(),
        blocks: a.encoder_blocks.clone(),
        decoder_blocks,
        encoder: if residual {
            Encoder::Residual
        } else {
            Encoder::Plain
        },
    }
}

impl NnunetCheckpoint {
    /// Read `path`, placing its weights in the network of `arch` (its stage count names the
    /// decoder levels).
    pub fn read(path: &Path, arch: &Architecture) -> Result<NnunetCheckpoint> {
        let mut archive = TorchArchive::open(path, ArchiveLimits::default())?;
        Self::from_archive(&mut archive, arch)
    }

    /// Read an open archive (a file, or bytes in memory), as [`NnunetCheckpoint::read`].
    pub fn from_archive<R: std::io::Read + std::io::Seek>(
        archive: &mut TorchArchive<R>,
        arch: &Architecture,
    ) -> Result<NnunetCheckpoint> {
        let path = archive.path().to_path_buf();
        let path = path.as_path();
        let pk = archive.pickle();
        let root = pk.root();
        if !matches!(pk.value(root), Value::Dict(_)) {
            return Err(bad(
                path,
                format!(
                    "its pickle holds {}, not a dictionary: not an nnU-Net checkpoint",
                    pk.describe(root)
                ),
            ));
        }
        let trainer = pk
            .dict_get(root, "trainer_name")
            .and_then(|t| pk.text(t))
            .map(str::to_string)
            .ok_or_else(|| {
                bad(
                    path,
                    "no trainer_name: not a checkpoint written by nnU-Net v2's trainer",
                )
            })?;
        let configuration = pk
            .dict_get(root, "init_args")
            .and_then(|a| pk.dict_get(a, "configuration"))
            .and_then(|c| pk.text(c))
            .map(str::to_string);
        let mirror_axes = mirror_axes(path, pk)?;
        let state = pk.dict_get(root, "network_weights");
        let Some(Value::Dict(entries)) = state.map(|s| pk.value(s)) else {
            return Err(bad(
                path,
                "no network_weights dictionary: not an nnU-Net checkpoint",
            ));
        };
        let n_stages = arch.features.len();
        let mut wanted: Vec<(String, String, TensorRef)> = Vec::new();
        let mut placed = HashSet::new();
        let mut storages: HashMap<String, &str> = HashMap::new();
        for &(k, v) in entries {
            let name = pk.text(k).ok_or_else(|| {
                bad(
                    path,
                    format!("network_weights has the key {}, not a name", pk.describe(k)),
                )
            })?;
            let ours = our_name(name, n_stages).map_err(|()| {
                bad(path, format!("parameter {name} is not part of the {} the plans describe: trainer {trainer} changed the network (batch norm, another architecture), which is not reproduced", arch.class))
            })?;
            let Some(ours) = ours else { continue };
            let Value::Tensor(t) = pk.value(v) else {
                return Err(bad(
                    path,
                    format!("parameter {name} is {}, not a tensor", pk.describe(v)),
                ));
            };
            if !placed.insert(ours.clone()) {
                return Err(bad(path, format!("parameter {name} is given twice")));
            }
            // Each placed weight has its own storage in nnU-Net's state dicts; sharing one
            // would let a small file claim its bytes many times over.
            if let Some(other) = storages.insert(t.storage.key.clone(), name) {
                return Err(bad(
                    path,
                    format!(
                        "parameters {other} and {name} share storage {}: not a state dict nnU-Net writes",
                        t.storage.key
                    ),
                ));
            }
            if placed.len() > MAX_PARAMETERS {
                return Err(bad(
                    path,
                    format!("more than {MAX_PARAMETERS} parameters: not an nnU-Net network"),
                ));
            }
            wanted.push((ours, name.to_string(), (**t).clone()));
        }
        let planar = arch.dims == 2;
        let mut weights = HashMap::new();
        let mut names = HashMap::new();
        for (ours, name, t) in wanted {
            let raw = archive.read_tensor(&name, &t)?;
            let values = to_f32(&raw).ok_or_else(|| {
                bad(
                    path,
                    format!(
                        "parameter {name} is stored as {}, not floating point",
                        raw.dtype.storage_name()
                    ),
                )
            })?;
            // NaN or infinite weights predict one class everywhere.
            let bad_values = values.iter().filter(|v| !v.is_finite()).count();
            if bad_values > 0 {
                return Err(bad(
                    path,
                    format!(
                        "parameter {name} holds NaN or infinite values ({bad_values} of {}): the training diverged or the file is damaged",
                        values.len()
                    ),
                ));
            }
            let mut shape = raw.shape.clone();
            // 2D weights (out, in, kh, kw) become one voxel deep.
            if planar && shape.len() == 4 {
                shape.insert(2, 1);
            }
            let t = Tensor::from_vec(values, shape, &Device::Cpu)?;
            names.insert(ours.clone(), name);
            weights.insert(ours, t);
        }
        Ok(NnunetCheckpoint {
            path: path.to_path_buf(),
            trainer,
            configuration,
            mirror_axes,
            weights,
            names,
            planar,
        })
    }

    /// Compare every weight with the network `config` describes (built from `plans`), by name
    /// and shape, without building it; a mismatch names the parameter, both shapes and the
    /// plans' field behind it.
    pub fn check_network(&self, config: &UNetConfig, plans: &Plans) -> Result<()> {
        // In the network's order, so the first mismatch named is the shallowest.
        let in_order: Vec<(String, Vec<usize>)> = parameter_shapes(config)
            .into_iter()
            .filter(|(n, _)| !is_ds(n))
            .collect();
        let expected: HashMap<&str, &Vec<usize>> =
            in_order.iter().map(|(n, s)| (n.as_str(), s)).collect();
        let field = |ours: &str, dim: Option<usize>| field_of(ours, dim, config, plans);
        let theirs = |ours: &str| self.names.get(ours).cloned().unwrap_or_else(|| ours.into());
        // Checkpoint layout: a 2D network's weights have no depth axis.
        let shown = |s: &[usize]| {
            let mut s = s.to_vec();
            if self.planar && s.len() == 5 {
                s.remove(2);
            }
            s
        };
        for (name, want) in &in_order {
            let Some(t) = self.weights.get(name) else {
                return Err(bad(&self.path, format!("the network of the plans has a parameter the checkpoint lacks ({name}, shape {:?}): {}", shown(want), field(name, None))));
            };
            if t.dims() != want.as_slice() {
                let dim = t.dims().iter().zip(want).position(|(a, b)| a != b);
                return Err(bad(
                    &self.path,
                    format!(
                        "parameter {} has shape {:?} in the checkpoint, {:?} in the network of the plans: {}",
                        theirs(name),
                        shown(t.dims()),
                        shown(want),
                        field(name, dim.or(Some(0)))
                    ),
                ));
            }
        }
        let mut extra: Vec<&String> = self
            .weights
            .keys()
            .filter(|n| !is_ds(n) && !expected.contains_key(n.as_str()))
            .collect();
        extra.sort();
        if let Some(name) = extra.first() {
            return Err(bad(
                &self.path,
                format!(
                    "parameter {} is not in the network of the plans: {}",
                    theirs(name),
                    field(name, None)
                ),
            ));
        }
        Ok(())
    }

    /// The network with these weights, on `dev`, after [`NnunetCheckpoint::check_network`].
    pub fn network(&self, config: UNetConfig, plans: &Plans, dev: &Device) -> Result<UNet> {
        self.check_network(&config, plans)?;
        let net = UNet::new(config, 0, dev)?;
        net.load(&self.weights).map_err(|e| {
            bad(
                &self.path,
                format!("its weights do not fit the network the plans describe: {e}"),
            )
        })?;
        Ok(net)
    }
}

/// A deep-supervision head (`ds1.weight`): unused when predicting.
fn is_ds(name: &str) -> bool {
    name.strip_prefix(DS_PREFIX)
        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
}

/// Where the plans (or dataset.json) set dimension `dim` of our parameter `ours`, or (`None`)
/// whether it exists at all.
fn field_of(ours: &str, dim: Option<usize>, config: &UNetConfig, plans: &Plans) -> String {
    let arch = &plans.configuration.architecture;
    let kw = |key: &str| {
        format!(
            "configurations.{}.architecture.arch_kwargs.{key} in {}",
            plans.configuration.name,
            plans.path.display()
        )
    };
    let blocks = if config.encoder == Encoder::Residual {
        "n_blocks_per_stage"
    } else {
        "n_conv_per_stage"
    };
    let parts: Vec<&str> = ours.split('.').collect();
    let stage =
        |p: &str, prefix: &str| p.strip_prefix(prefix).and_then(|s| s.parse::<usize>().ok());
    let first = parts.first().copied().unwrap_or("");
    let Some(dim) = dim else {
        return if parts.contains(&"skip") {
            kw("features_per_stage")
        } else if stage(first, "enc").is_some_and(|s| s >= arch.features.len()) {
            kw("n_stages")
        } else if stage(first, "enc").is_some() {
            kw(blocks)
        } else if stage(first, "dec").is_some() && parts.get(1) != Some(&"up") {
            kw("n_conv_per_stage_decoder")
        } else {
            kw("n_stages")
        };
    };
    let weight = parts.last() == Some(&"weight") && !ours.contains(".norm.");
    if first == "head" {
        return if dim == 0 {
            "the labels (or regions) in dataset.json".into()
        } else {
            kw("features_per_stage")
        };
    }
    if parts.get(1) == Some(&"up") {
        return if weight && dim >= 2 {
            kw("strides")
        } else {
            kw("features_per_stage")
        };
    }
    let input = first == "stem"
        || (first == "enc0" && parts.get(1) == Some(&"0") && config.encoder == Encoder::Plain);
    match (weight, dim) {
        (true, 1) if input => "the input channels (channel_names in dataset.json)".into(),
        (true, 2..) => kw("kernel_sizes"),
        _ => kw("features_per_stage"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_dict_names_map_to_ours() {
        let n = 5;
        let cases = [
            (
                "encoder.stages.0.0.convs.1.conv.weight",
                Some("enc0.1.conv.weight"),
            ),
            ("encoder.stages.2.0.convs.0.all_modules.0.weight", None),
            ("decoder.encoder.stages.0.0.convs.0.conv.weight", None),
            ("encoder.stem.convs.0.norm.bias", Some("stem.norm.bias")),
            (
                "encoder.stages.1.blocks.0.conv2.norm.weight",
                Some("enc1.0.conv2.norm.weight"),
            ),
            (
                "encoder.stages.1.blocks.0.skip.1.conv.weight",
                Some("enc1.0.skip.conv.weight"),
            ),
            (
                "decoder.stages.0.convs.1.norm.weight",
                Some("dec3.1.norm.weight"),
            ),
            ("decoder.transpconvs.3.bias", Some("dec0.up.bias")),
            ("decoder.seg_layers.3.weight", Some("head.weight")),
            ("decoder.seg_layers.2.weight", Some("ds1.weight")),
            ("decoder.seg_layers.0.bias", None),
        ];
        for (theirs, ours) in cases {
            assert_eq!(
                our_name(theirs, n),
                Ok(ours.map(str::to_string)),
                "{theirs}"
            );
        }
        for unknown in [
            "encoder.stages.0.0.convs.0.norm.running_mean",
            "encoder.stages.0.0.convs.0.norm.num_batches_tracked",
            "up_projection.weight",
            "decoder.seg_layers.9.weight",
        ] {
            assert_eq!(our_name(unknown, n), Err(()), "{unknown}");
        }
    }
}
