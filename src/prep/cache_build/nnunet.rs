//! `prep build-cache --nnunet-plans PLANS --configuration C`: entries that hold nnU-Net's own
//! preprocessed arrays for a configuration of its plans (its `DefaultPreprocessor`: transpose,
//! crop to the nonzero box, its normalization schemes with the plans' statistics, its
//! resampling of images and segmentations, [`crate::prep::nnunet`]), so that a network trained
//! on them is one nnU-Net's own predictor can run. The cached grid is nnU-Net's: the files'
//! (z, y, x) permuted by `transpose_forward`, cropped and resampled; the entry's affine maps it
//! back to the world.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::case::{check_headers, file_name, input_geometry, same_key, Job, Written};
use crate::cache::store::EntryStore;
use crate::cache::CacheDir;
use crate::error::{Error, Result};
use crate::format::entry::{OutputGeometry, SourceFile, Sources};
use crate::format::nnunet::Plans;
use crate::format::{
    ChannelParams, ForegroundStats, NnunetPreprocessing, Normalization, OutputParams,
};
use crate::geometry::VoxelRead;
use crate::nifti_io::{self, LabelCheck};
use crate::prep::dataset::DatasetSource;
use crate::prep::nnunet::volume::Scratch;
use crate::prep::nnunet::{preprocess_training, reader_unit_scale, CaseGeometry};
use crate::prep::settings::Settings;

/// What the user named: a plans file and one of its configurations.
#[derive(Clone, Debug)]
pub struct NnunetSource {
    /// The `nnUNetPlans.json` (or any plans file nnU-Net wrote).
    pub plans: PathBuf,
    /// The configuration to preprocess for.
    pub configuration: String,
}

/// The plans read and checked for a build.
pub(super) struct NnunetBuild {
    pub(super) plans: Plans,
    pub(super) record: NnunetPreprocessing,
}

impl NnunetBuild {
    /// Read the plans and its configuration; refuse what the build cannot reproduce. `data`:
    /// where the cases come from (its dataset.json may name nnU-Net's reader).
    pub(super) fn read(src: &NnunetSource, data: &DatasetSource) -> Result<NnunetBuild> {
        let plans = Plans::read(&src.plans, &src.configuration)?;
        let reader = crate::format::nnunet::reader_of(&plans, dataset_reader(data).as_deref())?;
        let refuse = |m: String| {
            Err(Error::Model {
                path: src.plans.clone(),
                message: m,
            })
        };
        if plans.configuration.spacing.len() != 3 {
            return refuse(format!(
                "configuration {}: a 2d configuration's cache is not built yet (its slices are a 3d configuration's voxels at each case's own z spacing): build the 3d_fullres one",
                src.configuration
            ));
        }
        if plans.configuration.previous_stage.is_some() {
            return refuse(format!(
                "configuration {} is a cascade's second stage: its cache (with the first stage's segmentations as channels) is not built from plans yet",
                src.configuration
            ));
        }
        if plans.configuration.resampling_seg.is_none() {
            return refuse(format!(
                "configuration {}: no resampling_fn_seg_kwargs: not a plans file nnU-Net v2 writes",
                src.configuration
            ));
        }
        let bytes = std::fs::read(&src.plans).map_err(|e| Error::io(&src.plans, e))?;
        let record = NnunetPreprocessing {
            plans: src
                .plans
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            plans_blake3: blake3::hash(&bytes).to_hex().to_string(),
            configuration: src.configuration.clone(),
            reader,
            transpose_forward: plans.transpose_forward,
            norm_mask_channels: (0..plans.configuration.use_mask_for_norm.len())
                .filter(|&k| plans.configuration.use_mask_for_norm[k])
                .map(|k| k as u16)
                .collect(),
        };
        Ok(NnunetBuild { plans, record })
    }

    /// The cache's parameters: the layout from `settings`, the plans' spacing (its transposed
    /// axes, x first, in its reader's unit) and each channel's scheme with its statistics.
    pub(super) fn params(&self, settings: &Settings, ignore_label: Option<u16>) -> OutputParams {
        let cfg = &self.plans.configuration;
        let s = &cfg.spacing;
        let channels = cfg
            .normalization_schemes
            .iter()
            .enumerate()
            .map(|(k, &scheme)| ChannelParams {
                normalization: match scheme {
                    Normalization::Zscore if cfg.use_mask_for_norm[k] => {
                        Normalization::ZscoreNonzero
                    }
                    other => other,
                },
                dataset_foreground: match scheme {
                    Normalization::Ct => {
                        self.plans.intensity_properties[k].map(|p| ForegroundStats {
                            lower: p.percentile_00_5,
                            upper: p.percentile_99_5,
                            mean: p.mean,
                            std: p.std,
                        })
                    }
                    _ => None,
                },
            })
            .collect();
        let mut p = settings.output_params_for([s[2], s[1], s[0]], channels);
        p.image_interpolation = format!(
            "nnU-Net order {} (order_z {})",
            cfg.resampling_data.order, cfg.resampling_data.order_z
        );
        if let Some(r) = &cfg.resampling_seg {
            p.label_interpolation = format!(
                "nnU-Net per label order {} (order_z {})",
                r.order, r.order_z
            );
        }
        if p.derived.any() {
            p.derived.ignore_label = ignore_label;
        }
        p.nnunet = Some(self.record.clone());
        p
    }

    /// The target spacing (x, y, z) of the files' own axes and unit, for the size forecast
    /// of a file whose header is `h`.
    pub(super) fn file_target_xyz(&self, h: &nifti_io::HeaderInfo) -> [f64; 3] {
        let k = reader_unit_scale(h, &self.record.reader);
        let tf = self.plans.transpose_forward;
        let mut zyx_t = [0.0; 3];
        for a in 0..3 {
            zyx_t[tf[a]] = self.plans.configuration.spacing[a] / k;
        }
        [zyx_t[2], zyx_t[1], zyx_t[0]]
    }
}

/// dataset.json's `overwrite_image_reader_writer` in a dataset folder, when it names one.
fn dataset_reader(data: &DatasetSource) -> Option<String> {
    let DatasetSource::Folder(dir) = data else {
        return None;
    };
    let text = std::fs::read(dir.join("dataset.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v.get("overwrite_image_reader_writer")?
        .as_str()
        .map(str::to_string)
}

/// One channel of a preprocessed volume, read as the entry writer reads its inputs.
struct Channel<'a> {
    volume: &'a Scratch<f32>,
    c: usize,
}

impl VoxelRead for Channel<'_> {
    fn read(&self, start: usize, out: &mut [f32]) -> Result<()> {
        self.volume.read_run(self.c, 0, 0, start, out)
    }
}

/// nnU-Net's preprocessed segmentation (-1 outside the normalization mask) read as the cached
/// label (-1 as 0) or as the normalization mask (1 where not -1).
struct Segmentation<'a> {
    volume: &'a Scratch<f32>,
    mask: bool,
}

impl VoxelRead for Segmentation<'_> {
    fn read(&self, start: usize, out: &mut [f32]) -> Result<()> {
        self.volume.read_run(0, 0, 0, start, out)?;
        for v in out.iter_mut() {
            *v = match self.mask {
                true => f32::from(u8::from(*v >= 0.0)),
                false => v.max(0.0),
            };
        }
        Ok(())
    }
}

/// The affine (x, y, z voxel of the cached grid to world) of the preprocessed grid, from the
/// file's affine `file`: the cached axis `a` (transposed) is the file's axis
/// `transpose_forward[a]`, offset by the crop box and scaled edge-aligned.
fn cached_affine(file: &[[f64; 4]; 4], g: &CaseGeometry, tf: [usize; 3]) -> [[f64; 4]; 4] {
    // a: cached (transposed) zyx axis; its voxel t maps to file zyx index f[tf[a]].
    let mut voxel = [[0.0f64; 4]; 4];
    voxel[3][3] = 1.0;
    for (a, &f) in tf.iter().enumerate() {
        let s = g.shape_after_cropping[a] as f64 / g.new_shape[a] as f64;
        let file_xyz = 2 - f;
        let cached_xyz = 2 - a;
        voxel[file_xyz][cached_xyz] = s;
        voxel[file_xyz][3] = 0.5 * s - 0.5 + g.bbox[a][0] as f64;
    }
    let mut out = [[0.0f64; 4]; 4];
    for (r, row) in out.iter_mut().enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            *v = (0..4).map(|k| file[r][k] * voxel[k][c]).sum();
        }
    }
    out
}

/// Preprocess one case as nnU-Net would for `build`'s configuration and write its entry into
/// a temporary folder.
pub(super) fn write_case(
    cache: &CacheDir,
    job: &Job,
    params: &OutputParams,
    build: &NnunetBuild,
    source: &nifti_io::SourceOptions,
    on_voxels: &(dyn Fn(u64) + Sync),
) -> Result<Written> {
    let s = job.scanned;
    let id = &s.source.id;
    let first = check_headers(s)?;
    let mut check = match &s.source.label {
        Some(l) => LabelCheck::new(l),
        None => LabelCheck::new(Path::new("")),
    };
    if let Some(v) = job.label_values {
        check = check.allowing_only(v);
    }
    let (pre, label) = preprocess_training(
        &s.source,
        &build.plans,
        &build.record.reader,
        check,
        source.ram_limit_bytes,
        &source.scratch_dir,
    )?;
    // The files may have changed since the key was computed: refuse to file them under it.
    let read: Vec<blake3::Hash> = pre.files.iter().map(|(h, _)| *h).collect();
    same_key(job, params, &read, label.as_ref().map(|l| &l.file.0))?;
    let g = &pre.geometry;
    let out_zyx = g.new_shape;
    let out_xyz = [out_zyx[2], out_zyx[1], out_zyx[0]];
    let affine = cached_affine(&first.affine.0, g, build.plans.transpose_forward);
    let out_affine = crate::geometry::Affine(affine);
    let sp = first.spacing_xyz;
    let spacing_zyx = [sp[2], sp[1], sp[0]];
    let tf = build.plans.transpose_forward;
    let true_spacing = [0, 1, 2]
        .map(|a| spacing_zyx[tf[a]] * g.shape_after_cropping[a] as f64 / g.new_shape[a] as f64);
    let k = reader_unit_scale(&first, &build.record.reader);
    let target = g.target_spacing.map(|t| t / k);
    let output = OutputGeometry::new(
        out_xyz,
        [true_spacing[2], true_spacing[1], true_spacing[0]],
        [target[2], target[1], target[0]],
        affine,
        out_affine.axis_codes(),
    );
    let input = input_geometry(&first);
    let source = Sources {
        images: pre
            .files
            .iter()
            .zip(&s.source.images)
            .map(|((h, bytes), p)| SourceFile {
                file: file_name(p),
                blake3: h.to_hex().to_string(),
                bytes: *bytes,
            })
            .collect(),
        label: match (&s.source.label, &label) {
            (Some(p), Some(l)) => Some(SourceFile {
                file: file_name(p),
                blake3: l.file.0.to_hex().to_string(),
                bytes: l.file.1,
            }),
            _ => None,
        },
    };
    let channels: Vec<Channel> = (0..pre.files.len())
        .map(|c| Channel {
            volume: &pre.data,
            c,
        })
        .collect();
    let images: Vec<&dyn VoxelRead> = channels.iter().map(|c| c as &dyn VoxelRead).collect();
    // nnU-Net's -1 is cached as 0 in the label, and as 0 in the normalization mask.
    let label_read = label.as_ref().map(|l| Segmentation {
        volume: &l.voxels,
        mask: false,
    });
    let mask_channels = &build.record.norm_mask_channels;
    let mask_read = label
        .as_ref()
        .filter(|_| !mask_channels.is_empty())
        .map(|l| Segmentation {
            volume: &l.voxels,
            mask: true,
        });
    let tmp = cache.new_tmp_entry(&job.key)?;
    let store = Arc::new(EntryStore::new(&tmp));
    let result = super::entry::write_entry(
        &store,
        &tmp,
        super::entry::EntryInput {
            case_id: id,
            key: &job.key,
            images: &images,
            label: match (&label_read, &label) {
                (Some(r), Some(l)) => Some((r as &dyn VoxelRead, l.dtype)),
                _ => None,
            },
            previous: None,
            norm_mask: mask_read
                .as_ref()
                .map(|m| (m as &dyn VoxelRead, mask_channels.as_slice())),
            in_shape_zyx: out_zyx,
            out_shape_zyx: out_zyx,
            params,
            source,
            input,
            output,
            intensity: pre.intensity.clone(),
            normalization: pre.normalization.clone(),
        },
        on_voxels,
    );
    match result {
        Ok(()) => Ok(Written {
            tmp,
            key: job.key.clone(),
            store,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cached_affine_undoes_the_transpose_the_crop_and_the_zoom() {
        // File: 10 x 20 x 30 (z, y, x) with spacing x 1, y 2, z 3 and an offset.
        let file = [
            [1.0, 0.0, 0.0, 5.0],
            [0.0, 2.0, 0.0, 6.0],
            [0.0, 0.0, 3.0, 7.0],
            [0.0, 0.0, 0.0, 1.0],
        ];
        // transpose_forward [2, 0, 1]: cached axes are file (x, z, y); box starts (4, 1, 2) in
        // those axes, 8 x 6 x 10 voxels zoomed to 16 x 3 x 10.
        let tf = [2, 0, 1];
        let g = CaseGeometry {
            shape_zyx: [10, 20, 30],
            spacing_zyx: [3.0, 2.0, 1.0],
            shape_before_cropping: [30, 10, 20],
            spacing_transposed: [1.0, 3.0, 2.0],
            bbox: [[4, 12], [1, 7], [2, 12]],
            shape_after_cropping: [8, 6, 10],
            target_spacing: [0.5, 6.0, 2.0],
            new_shape: [16, 3, 10],
        };
        let a = cached_affine(&file, &g, tf);
        let world = |v: [f64; 3]| -> [f64; 3] {
            [0, 1, 2].map(|r| (0..3).map(|c| a[r][c] * v[c]).sum::<f64>() + a[r][3])
        };
        // Cached voxel t = (t0, t1, t2) in (z, y, x) order is x, y, z = (t2, t1, t0).
        for t in [[0usize, 0, 0], [15, 2, 9], [3, 1, 4]] {
            let cropped = [0, 1, 2].map(|ax| {
                let s = g.shape_after_cropping[ax] as f64 / g.new_shape[ax] as f64;
                (t[ax] as f64 + 0.5) * s - 0.5 + g.bbox[ax][0] as f64
            });
            // Transposed axis ax is file zyx axis tf[ax].
            let mut f = [0.0; 3];
            for ax in 0..3 {
                f[tf[ax]] = cropped[ax];
            }
            let expected = [f[2] * 1.0 + 5.0, f[1] * 2.0 + 6.0, f[0] * 3.0 + 7.0];
            let got = world([t[2] as f64, t[1] as f64, t[0] as f64]);
            for r in 0..3 {
                assert!(
                    (got[r] - expected[r]).abs() < 1e-9,
                    "{t:?}: {got:?} != {expected:?}"
                );
            }
        }
    }
}
