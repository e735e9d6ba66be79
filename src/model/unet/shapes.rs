//! The parameters [`super::UNet::new`] creates, by name and shape, computed without creating
//! any: a checkpoint is compared with them before a network is allocated.

use super::super::config::{Encoder, UNetConfig, Upsampling, DS_PREFIX};

/// A convolution's weight (out, in, kernel z, y, x) and bias.
fn conv(out: &mut Vec<(String, Vec<usize>)>, name: &str, cin: usize, cout: usize, k: [usize; 3]) {
    out.push((format!("{name}.weight"), vec![cout, cin, k[0], k[1], k[2]]));
    out.push((format!("{name}.bias"), vec![cout]));
}

/// The norm's weight and bias.
fn norm(out: &mut Vec<(String, Vec<usize>)>, name: &str, c: usize) {
    out.push((format!("{name}.norm.weight"), vec![c]));
    out.push((format!("{name}.norm.bias"), vec![c]));
}

/// conv -> norm (-> activation): `NAME.conv.*`, `NAME.norm.*`.
fn block(out: &mut Vec<(String, Vec<usize>)>, name: &str, cin: usize, cout: usize, k: [usize; 3]) {
    conv(out, &format!("{name}.conv"), cin, cout, k);
    norm(out, name, cout);
}

/// Every parameter of `config`'s network (name, shape), in the order the network creates them.
pub fn parameter_shapes(config: &UNetConfig) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    let depth = config.strides.len() + 1;
    let residual = config.encoder == Encoder::Residual;
    if residual {
        block(
            &mut out,
            "stem",
            config.in_channels,
            config.channels(0),
            config.kernel(0),
        );
    }
    for s in 0..depth {
        let cin = match (s, residual) {
            (0, false) => config.in_channels,
            (0, true) => config.channels(0),
            _ => config.channels(s - 1),
        };
        let (cout, k) = (config.channels(s), config.kernel(s));
        for b in 0..config.encoder_blocks(s) {
            let i = if b == 0 { cin } else { cout };
            let name = format!("enc{s}.{b}");
            if residual {
                block(&mut out, &format!("{name}.conv1"), i, cout, k);
                block(&mut out, &format!("{name}.conv2"), cout, cout, k);
                if i != cout {
                    // bias-free 1x1x1 projection and its norm
                    out.push((format!("{name}.skip.conv.weight"), vec![cout, i, 1, 1, 1]));
                    norm(&mut out, &format!("{name}.skip"), cout);
                }
            } else {
                block(&mut out, &name, i, cout, k);
            }
        }
    }
    for s in (0..depth - 1).rev() {
        let (deep, c, st) = (
            config.channels(s + 1),
            config.channels(s),
            config.strides[s],
        );
        match config.upsampling {
            Upsampling::Transpose => {
                out.push((
                    format!("dec{s}.up.weight"),
                    vec![deep, c, st[0], st[1], st[2]],
                ));
                out.push((format!("dec{s}.up.bias"), vec![c]));
            }
            Upsampling::Nearest => conv(&mut out, &format!("dec{s}.up"), deep, c, [1; 3]),
        }
        for b in 0..config.decoder_blocks(s) {
            let i = if b == 0 { 2 * c } else { c };
            block(&mut out, &format!("dec{s}.{b}"), i, c, config.kernel(s));
        }
    }
    conv(
        &mut out,
        "head",
        config.channels(0),
        config.num_classes,
        [1; 3],
    );
    for level in config.supervised_levels().into_iter().skip(1) {
        let name = format!("{DS_PREFIX}{level}");
        conv(
            &mut out,
            &name,
            config.channels(level),
            config.num_classes,
            [1; 3],
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Norm;
    use crate::model::unet::UNet;
    use candle_core::Device;

    /// The shapes are the built network's, name for name, for every kind of network.
    #[test]
    fn parameter_shapes_are_the_built_networks() {
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
                norm: Norm::Group(2),
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
                deep_supervision: false,
                ..base
            },
        ];
        for c in variants {
            let net = UNet::new(c.clone(), 0, &Device::Cpu).unwrap();
            let mut built: Vec<(String, Vec<usize>)> = net
                .params()
                .into_iter()
                .map(|(n, v)| (n, v.dims().to_vec()))
                .collect();
            let mut ours = parameter_shapes(&c);
            built.sort();
            ours.sort();
            assert_eq!(ours, built, "{c:?}");
        }
    }
}
