//! nnU-Net's loss for region-based training (BraTS): one sigmoid output per region, each
//! region a set of label values (whole tumour 1+2+3, tumour core 2+3, enhancing 3) that may
//! overlap. Binary cross-entropy on the logits plus the soft Dice of each region over the batch
//! (nnU-Net's `DC_and_BCE_loss` with `MemoryEfficientSoftDiceLoss`, sigmoid, batch Dice, every
//! region counted). Voxels of the ignore label count in neither term; as in nnU-Net, the masked
//! cross-entropy is summed over regions and divided by the labelled voxels, the unmasked one
//! averaged over regions and voxels.

use candle_core::{DType, Device, Tensor};

use super::dice_ce::{batch_dice_loss, LossParts};
use crate::error::{Error, Result};

/// Region membership of `labels` (N patches of V voxels each, laid out (N, V)): (N, R, V), 1
/// where a voxel's value is one of region r's, 0 elsewhere and wherever it holds `ignore`; and
/// whether any voxel holds `ignore`. The targets of the loss, and of Python's loader.
pub fn region_membership(
    labels: &[u16],
    n: usize,
    regions: &[Vec<u16>],
    ignore: Option<u16>,
) -> (Vec<u8>, bool) {
    let v = labels.len() / n.max(1);
    let r = regions.len();
    // Membership of every value met, looked up once per value.
    let top = labels
        .iter()
        .copied()
        .filter(|&l| Some(l) != ignore)
        .max()
        .unwrap_or(0) as usize;
    let member: Vec<Vec<bool>> = (0..=top)
        .map(|value| {
            regions
                .iter()
                .map(|reg| reg.contains(&(value as u16)))
                .collect()
        })
        .collect();
    let mut out = vec![0u8; n * r * v];
    let mut any_ignored = false;
    for b in 0..n {
        for (i, &l) in labels[b * v..(b + 1) * v].iter().enumerate() {
            if Some(l) == ignore {
                any_ignored = true;
                continue;
            }
            for (k, &m) in member[l as usize].iter().enumerate() {
                if m {
                    out[(b * r + k) * v + i] = 1;
                }
            }
        }
    }
    (out, any_ignored)
}

/// (N, R, D, H, W) targets of `labels` (raw label-file values, laid out (N, D, H, W)): 1 where
/// a voxel's value is one of region r's. A voxel holding `ignore` is 0 in every region; the
/// mask (N, 1, D, H, W), returned when any voxel is ignored, is 0 there.
pub fn region_targets(
    labels: &[u16],
    n: usize,
    regions: &[Vec<u16>],
    ignore: Option<u16>,
    spatial: [usize; 3],
    dev: &Device,
) -> Result<(Tensor, Option<Tensor>)> {
    let v: usize = spatial.iter().product();
    if labels.len() != n * v {
        return Err(Error::Train(format!(
            "labels: {} values for {n} patches of {spatial:?}",
            labels.len()
        )));
    }
    let r = regions.len();
    let (member, any_ignored) = region_membership(labels, n, regions, ignore);
    let out: Vec<f32> = member.into_iter().map(f32::from).collect();
    let shape5 = |c: usize| (n, c, spatial[0], spatial[1], spatial[2]);
    let target = Tensor::from_vec(out, shape5(r), dev)?;
    let mask = match any_ignored {
        true => {
            let m: Vec<f32> = labels
                .iter()
                .map(|&l| (Some(l) != ignore) as u8 as f32)
                .collect();
            Some(Tensor::from_vec(m, shape5(1), dev)?)
        }
        false => None,
    };
    Ok((target, mask))
}

/// BCE + soft Dice of `logits` (N, R, D, H, W) against region targets of the same shape,
/// leaving out the voxels where `mask` (N, 1, D, H, W) is 0.
pub fn bce_dice(logits: &Tensor, target: &Tensor, mask: Option<&Tensor>) -> Result<LossParts> {
    if logits.dims() != target.dims() || logits.rank() != 5 {
        return Err(Error::Train(format!(
            "region loss: logits {:?} and target {:?} must both be (N, R, D, H, W)",
            logits.dims(),
            target.dims()
        )));
    }
    // BCE with logits, stable: max(x, 0) - x t + log(1 + exp(-|x|)).
    let relu = logits.relu()?;
    let softplus = ((logits.abs()?.neg()?.exp()? + 1.0)?).log()?;
    let bce = ((relu - logits.mul(target)?)? + softplus)?;
    let ce = match mask {
        Some(m) => {
            let labelled = m.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            (bce.broadcast_mul(m)?.sum_all()? * (1.0 / labelled.max(1e-8)))?
        }
        None => bce.mean_all()?,
    }
    .to_dtype(DType::F32)?;
    let p = candle_nn::ops::sigmoid(logits)?;
    let (p, t) = match mask {
        Some(m) => (p.broadcast_mul(m)?, target.broadcast_mul(m)?),
        None => (p, target.clone()),
    };
    let dice_loss = batch_dice_loss(&p, &t)?;
    let total = (&ce + &dice_loss)?;
    Ok(LossParts {
        ce: ce.to_scalar::<f32>()? as f64,
        dice_loss: dice_loss.to_scalar::<f32>()? as f64,
        total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::loss::dice_ce::SMOOTH;

    fn brats() -> Vec<Vec<u16>> {
        vec![vec![1, 2, 3], vec![2, 3], vec![3]]
    }

    #[test]
    fn targets_overlap_as_the_regions_do_and_ignore_is_masked() {
        let dev = Device::Cpu;
        let labels = [0u16, 1, 2, 3, 9, 3];
        let (t, m) = region_targets(&labels, 1, &brats(), Some(9), [1, 1, 6], &dev).unwrap();
        let t: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(
            t,
            [
                0., 1., 1., 1., 0., 1., // whole
                0., 0., 1., 1., 0., 1., // core
                0., 0., 0., 1., 0., 1., // enhancing
            ]
        );
        let m: Vec<f32> = m.unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(m, [1., 1., 1., 1., 0., 1.]);
        let (_, none) = region_targets(&[0, 1], 1, &brats(), Some(9), [1, 1, 2], &dev).unwrap();
        assert!(none.is_none());
    }

    /// Against the formulas written out voxel by voxel (nnU-Net's, in f64).
    #[test]
    fn bce_and_dice_equal_the_written_out_formulas() {
        let dev = Device::Cpu;
        let labels = [0u16, 1, 2, 3, 3, 9, 1, 0];
        let x: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.6).collect();
        for ignore in [None, Some(9)] {
            let (t, m) = region_targets(&labels, 2, &brats(), ignore, [1, 1, 4], &dev).unwrap();
            let logits = Tensor::from_vec(x.clone(), (2, 3, 1, 1, 4), &dev).unwrap();
            let got = bce_dice(&logits, &t, m.as_ref()).unwrap();
            let tv: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
            let keep = |b: usize, i: usize| Some(labels[b * 4 + i]) != ignore;
            let (mut ce, mut labelled) = (0f64, 0f64);
            let (mut inter, mut sp, mut st) = ([0f64; 3], [0f64; 3], [0f64; 3]);
            for b in 0..2 {
                for i in 0..4 {
                    let k = keep(b, i) as u8 as f64;
                    labelled += k;
                    for r in 0..3 {
                        let j = (b * 3 + r) * 4 + i;
                        let (xv, tv) = (x[j] as f64, tv[j] as f64);
                        let p = 1.0 / (1.0 + (-xv).exp());
                        ce += k * -(tv * p.ln() + (1.0 - tv) * (1.0 - p).ln());
                        inter[r] += k * p * tv;
                        sp[r] += k * p;
                        st[r] += k * tv;
                    }
                }
            }
            let ce = match ignore {
                Some(_) => ce / labelled,
                None => ce / 24.0,
            };
            let dice: f64 = (0..3)
                .map(|r| (2.0 * inter[r] + SMOOTH) / (sp[r] + st[r] + SMOOTH))
                .sum::<f64>()
                / 3.0;
            assert!(
                (got.ce - ce).abs() < 1e-5,
                "{ignore:?}: ce {} vs {ce}",
                got.ce
            );
            assert!(
                (got.dice_loss - (1.0 - dice)).abs() < 1e-5,
                "{ignore:?}: dice loss {} vs {}",
                got.dice_loss,
                1.0 - dice
            );
        }
    }

    #[test]
    fn gradients_flow_and_vanish_at_ignored_voxels() {
        let dev = Device::Cpu;
        let labels = [9u16, 1, 2, 3];
        let (t, m) = region_targets(&labels, 1, &brats(), Some(9), [1, 1, 4], &dev).unwrap();
        let x = candle_core::Var::from_tensor(
            &Tensor::zeros((1, 3, 1, 1, 4), DType::F32, &dev).unwrap(),
        )
        .unwrap();
        let loss = bce_dice(x.as_tensor(), &t, m.as_ref()).unwrap();
        let grads = loss.total.backward().unwrap();
        let g: Vec<f32> = grads
            .get(&x)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for r in 0..3 {
            assert_eq!(g[r * 4], 0.0, "region {r}: gradient at the ignored voxel");
            assert!(g[r * 4 + 1..r * 4 + 4].iter().any(|v| *v != 0.0));
        }
    }
}
