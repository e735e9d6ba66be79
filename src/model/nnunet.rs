//! nnU-Net v2's checkpoints read without Python: the zip archive `torch.save` writes, its
//! pickle walked with candle's reader, the `network_weights` state dict renamed to our
//! parameters, and the network rebuilt from the plans' `arch_kwargs` (dynamic-network-
//! architectures' PlainConvUNet and ResidualEncoderUNet are our plain and residual U-Nets; a 2D
//! network is ours one voxel deep).
//!
//! The state dict names each parameter more than once (`convs.N.conv.weight` and
//! `convs.N.all_modules.0.weight`; the decoder's own reference to the encoder): those are
//! views of one storage and are skipped. Anything else we cannot place (a batch norm's running
//! statistics, another network's layers) refuses the checkpoint: its trainer changed the
//! network the plans describe.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::pickle::{Object, PthTensors, Stack};
use candle_core::{Device, Tensor};

use super::config::{Encoder, Norm, UNetConfig, Upsampling};
use super::unet::UNet;
use crate::error::{Error, Result};
use crate::format::nnunet::Architecture;

/// Largest pickle read (a checkpoint's is a few MB: optimizer state, logs, plans).
const MAX_PICKLE_BYTES: u64 = 1 << 30;

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
}

/// The unpickled top-level dictionary of the checkpoint.
fn top_level(path: &Path) -> Result<Vec<(Object, Object)>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(|e| {
        bad(
            path,
            format!("not a PyTorch checkpoint (a zip archive written by torch.save): {e}"),
        )
    })?;
    let name = zip
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.to_string()))
        .find(|n| n.ends_with("/data.pkl") || n == "data.pkl")
        .ok_or_else(|| {
            bad(
                path,
                "no data.pkl inside: not a checkpoint written by torch.save",
            )
        })?;
    let entry = zip
        .by_name(&name)
        .map_err(|e| bad(path, format!("{name}: {e}")))?;
    if entry.size() > MAX_PICKLE_BYTES {
        return Err(bad(
            path,
            format!("{name} is {} bytes: too large", entry.size()),
        ));
    }
    let mut reader = std::io::BufReader::new(entry.take(MAX_PICKLE_BYTES));
    let mut stack = Stack::empty();
    stack
        .read_loop(&mut reader)
        .map_err(|e| bad(path, format!("its pickle does not read: {e}")))?;
    match stack.finalize() {
        Ok(Object::Dict(d)) => Ok(d),
        Ok(_) => Err(bad(
            path,
            "its pickle is not a dictionary: not an nnU-Net checkpoint",
        )),
        Err(e) => Err(bad(path, format!("its pickle does not read: {e}"))),
    }
}

fn get<'a>(d: &'a [(Object, Object)], key: &str) -> Option<&'a Object> {
    d.iter()
        .find(|(k, _)| matches!(k, Object::Unicode(s) if s == key))
        .map(|(_, v)| v)
}

fn text(o: Option<&Object>) -> Option<String> {
    match o {
        Some(Object::Unicode(s)) => Some(s.clone()),
        _ => None,
    }
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
        let top = top_level(path)?;
        let trainer = text(get(&top, "trainer_name")).ok_or_else(|| {
            bad(
                path,
                "no trainer_name: not a checkpoint written by nnU-Net v2's trainer",
            )
        })?;
        let configuration = match get(&top, "init_args") {
            Some(Object::Dict(d)) => text(get(d, "configuration")),
            _ => None,
        };
        let mirror_axes = match get(&top, "inference_allowed_mirroring_axes") {
            None | Some(Object::None) => None,
            Some(Object::Tuple(t)) | Some(Object::List(t)) => {
                let mut axes = Vec::new();
                for a in t {
                    match a {
                        Object::Int(i) if (0..3).contains(i) => axes.push(*i as usize),
                        other => {
                            return Err(bad(
                                path,
                                format!(
                                    "inference_allowed_mirroring_axes holds {other:?}, not an axis"
                                ),
                            ))
                        }
                    }
                }
                Some(axes)
            }
            Some(other) => {
                return Err(bad(
                    path,
                    format!("inference_allowed_mirroring_axes is {other:?}, not a tuple of axes"),
                ))
            }
        };
        if !matches!(get(&top, "network_weights"), Some(Object::Dict(_))) {
            return Err(bad(
                path,
                "no network_weights dictionary: not an nnU-Net checkpoint",
            ));
        }
        let pth = PthTensors::new(path, Some("network_weights"))
            .map_err(|e| bad(path, format!("its network_weights do not read: {e}")))?;
        let n_stages = arch.features.len();
        let mut names: Vec<&String> = pth.tensor_infos().keys().collect();
        names.sort();
        let mut weights = HashMap::new();
        for name in names {
            let ours = our_name(name, n_stages).map_err(|()| {
                bad(path, format!("parameter {name} is not part of the {} the plans describe: trainer {trainer} changed the network (batch norm, another architecture), which is not reproduced", arch.class))
            })?;
            let Some(ours) = ours else { continue };
            let t = pth
                .get(name)
                .map_err(|e| bad(path, format!("parameter {name}: {e}")))?
                .ok_or_else(|| bad(path, format!("parameter {name} has no data")))?;
            let t = t.to_dtype(candle_core::DType::F32)?;
            // 2D weights (out, in, kh, kw) become one voxel deep.
            let t = if arch.dims == 2 && t.rank() == 4 {
                let d = t.dims().to_vec();
                t.reshape((d[0], d[1], 1, d[2], d[3]))?
            } else {
                t
            };
            weights.insert(ours, t.to_device(&Device::Cpu)?);
        }
        Ok(NnunetCheckpoint {
            path: path.to_path_buf(),
            trainer,
            configuration,
            mirror_axes,
            weights,
        })
    }

    /// The network with these weights, on `dev`.
    pub fn network(&self, config: UNetConfig, dev: &Device) -> Result<UNet> {
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
