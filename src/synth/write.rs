//! Write a whole synthetic dataset: the nnU-Net folders, the cases generated in parallel with
//! bounded memory, and `dataset.json`.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::organs::generate_organs_case;
use super::render::{generate_case, second_channel, IGNORE_VALUE};
use super::tumour::{generate_tumour_case, CONTRASTS};
use super::{SynthCaseSpec, SynthLayout};
use crate::error::{Error, Result};
use crate::format::dataset_json::{DatasetJson, SynthCaseRecord};
use crate::nifti_io::{write_nifti_i16, write_nifti_u8};

/// At most this many cases are held in memory at once by [`write_dataset`].
const MAX_CASES_IN_FLIGHT: usize = 4;

/// Write the whole dataset (cases generated in parallel with rayon, at most a few in memory at
/// once), calling `on_case(index, spec)` after each case is written. Creates OUT and subfolders;
/// `dataset.json` is written last.
pub fn write_dataset(
    out: &Path,
    specs: &[SynthCaseSpec],
    seed: u64,
    on_case: impl Fn(usize, &SynthCaseSpec) + Sync,
) -> Result<()> {
    write_dataset_as(out, specs, seed, SynthLayout::Vessels, on_case)
}

/// [`write_dataset`] with the cases made as `layout` says (one channel, or two with more
/// classes and an ignore label).
pub fn write_dataset_as(
    out: &Path,
    specs: &[SynthCaseSpec],
    seed: u64,
    layout: SynthLayout,
    on_case: impl Fn(usize, &SynthCaseSpec) + Sync,
) -> Result<()> {
    validate_specs(specs)?;
    refuse_foreign(out, specs, layout)?;
    let images = out.join("imagesTr");
    let images_dir = &images;
    let labels = out.join("labelsTr");
    for dir in [out, images.as_path(), labels.as_path()] {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }

    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<(usize, Error)>> = Mutex::new(None);
    let workers = rayon::current_num_threads()
        .min(MAX_CASES_IN_FLIGHT)
        .min(specs.len())
        .max(1);
    let write_one = |i: usize| -> Result<()> {
        let spec = &specs[i];
        if layout == SynthLayout::Regions {
            let (images, label) = generate_tumour_case(spec, seed);
            for (c, image) in images.iter().enumerate() {
                let p = images_dir.join(format!("{}_{c:04}.nii.gz", spec.id));
                write_nifti_i16(&p, spec.shape_xyz, spec.spacing_xyz, image)?;
            }
            let label_path = labels.join(format!("{}.nii.gz", spec.id));
            return write_nifti_u8(&label_path, spec.shape_xyz, spec.spacing_xyz, &label);
        }
        let (image, mut label) = if layout == SynthLayout::Organs {
            generate_organs_case(spec, seed)
        } else {
            generate_case(spec, seed)
        };
        let image_path = images.join(format!("{}_0000.nii.gz", spec.id));
        write_nifti_i16(&image_path, spec.shape_xyz, spec.spacing_xyz, &image)?;
        drop(image);
        if layout == SynthLayout::MultiChannel {
            let ct = second_channel(spec, seed, &mut label);
            let ct_path = images.join(format!("{}_0001.nii.gz", spec.id));
            write_nifti_i16(&ct_path, spec.shape_xyz, spec.spacing_xyz, &ct)?;
        }
        let label_path = labels.join(format!("{}.nii.gz", spec.id));
        write_nifti_u8(&label_path, spec.shape_xyz, spec.spacing_xyz, &label)
    };
    rayon::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|_| loop {
                if failure.lock().map(|f| f.is_some()).unwrap_or(true) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= specs.len() {
                    break;
                }
                match write_one(i) {
                    Ok(()) => on_case(i, &specs[i]),
                    Err(e) => {
                        if let Ok(mut f) = failure.lock() {
                            if f.as_ref().is_none_or(|(j, _)| i < *j) {
                                *f = Some((i, e));
                            }
                        }
                        break;
                    }
                }
            });
        }
    });
    let failure = failure.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some((_, e)) = failure {
        return Err(e);
    }

    let json_path = out.join("dataset.json");
    std::fs::write(&json_path, dataset_json(specs, seed, layout).to_json())
        .map_err(|e| Error::io(&json_path, e))
}

fn dataset_json(specs: &[SynthCaseSpec], seed: u64, layout: SynthLayout) -> DatasetJson {
    let cases = specs
        .iter()
        .map(|s| SynthCaseRecord {
            id: s.id.clone(),
            shape_xyz: s.shape_xyz,
            spacing_xyz: s.spacing_xyz,
        })
        .collect();
    let names = |pairs: &[(&str, u16)]| -> serde_json::Map<String, serde_json::Value> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), serde_json::Value::from(*v)))
            .collect()
    };
    if layout == SynthLayout::Regions {
        let mut labels = names(&[("background", 0)]);
        for (name, values) in [
            ("whole tumor", vec![1u16, 2, 3]),
            ("tumor core", vec![2, 3]),
            ("enhancing tumor", vec![3]),
        ] {
            labels.insert(name.into(), values.into());
        }
        return DatasetJson {
            name: "voxcache-synthetic-brats".into(),
            description: format!(
                "Synthetic BraTS-like brain tumours generated by voxcache (seed {seed}): four MRI \
                 contrasts of a head (zeros outside it), labels 1 edema, 2 necrosis, 3 \
                 enhancing; trained on regions whole tumor, tumor core and enhancing tumor."
            ),
            channel_names: CONTRASTS
                .iter()
                .enumerate()
                .map(|(i, n)| (i.to_string(), n.to_string()))
                .collect(),
            labels,
            regions_class_order: Some(vec![1, 2, 3]),
            num_training: specs.len(),
            file_ending: ".nii.gz".into(),
            cases,
        };
    }
    if layout == SynthLayout::Organs {
        return DatasetJson {
            name: "voxcache-synthetic-organs".into(),
            description: format!(
                "Synthetic organs generated by voxcache (seed {seed}): a body holding two organs \
                 of one tissue, wider than a small patch, told apart only by a small core, \
                 bright in label 1 and dark in label 2."
            ),
            channel_names: [("0".to_string(), "MRI".to_string())].into(),
            labels: names(&[
                ("background", 0),
                ("organ, bright core", 1),
                ("organ, dark core", 2),
            ]),
            regions_class_order: None,
            num_training: specs.len(),
            file_ending: ".nii.gz".into(),
            cases,
        };
    }
    DatasetJson {
        name: "voxcache-synthetic-vessels".into(),
        description: format!(
            "Synthetic two-photon microscopy vessels generated by voxcache (seed {seed}); \
             tubes along smooth random curves in micrometers, int16 images, uint8 labels{}.",
            match layout {
                SynthLayout::MultiChannel =>
                    "; a second, CT-like channel; class 2 is vessel brighter in it, 3 marks unannotated slices",
                _ => "",
            }
        ),
        channel_names: match layout {
            SynthLayout::MultiChannel => [
                ("0".to_string(), "two-photon".to_string()),
                ("1".to_string(), "CT".to_string()),
            ]
            .into(),
            _ => [("0".to_string(), "two-photon".to_string())].into(),
        },
        // In name order, as every voxcache version has written them.
        labels: match layout {
            SynthLayout::MultiChannel => names(&[
                ("background", 0),
                ("bright vessel", 2),
                ("ignore", u16::from(IGNORE_VALUE)),
                ("vessel", 1),
            ]),
            _ => names(&[("background", 0), ("vessel", 1)]),
        },
        regions_class_order: None,
        num_training: specs.len(),
        file_ending: ".nii.gz".into(),
        cases,
    }
}

/// A synthetic dataset goes into a new or empty folder, or over an earlier (or interrupted) one
/// of exactly these cases and channels: a folder holding anything else (a user's dataset,
/// another preset's cases or channels) is refused before anything is written, so no file of it
/// is overwritten or mixed with the new cases.
fn refuse_foreign(out: &Path, specs: &[SynthCaseSpec], layout: SynthLayout) -> Result<()> {
    let refuse = |why: String| {
        Err(Error::Config(format!(
            "--out {}: {why}; prep synth writes a dataset folder of its own: give a new or empty folder",
            out.display()
        )))
    };
    let Ok(meta) = out.metadata() else {
        return Ok(());
    };
    if !meta.is_dir() {
        return refuse("it is a file, not a folder".into());
    }
    let list = |dir: &Path| -> Result<Vec<String>> {
        let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
        let mut names: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        Ok(names)
    };
    let top = list(out)?;
    // What anything else than the two case folders is (reported first, whatever the order).
    if let Some(other) = top
        .iter()
        .find(|n| !["dataset.json", "imagesTr", "labelsTr"].contains(&n.as_str()))
    {
        return refuse(format!("it holds {other}, which prep synth did not write"));
    }
    if top.iter().any(|n| n == "dataset.json") {
        let want = dataset_json(specs, 0, layout).name;
        let name = std::fs::read(out.join("dataset.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["name"].as_str().map(str::to_string));
        if name.as_deref() != Some(want.as_str()) {
            return refuse(format!(
                "its dataset.json is not one this preset writes (name {name:?}, not {want:?})"
            ));
        }
    }
    // The exact files this layout writes: its channels of each case, and each case's label.
    let channels = match layout {
        SynthLayout::Regions => CONTRASTS.len(),
        SynthLayout::MultiChannel => 2,
        _ => 1,
    };
    let mut expected = std::collections::HashSet::new();
    for s in specs {
        for c in 0..channels {
            expected.insert(format!("imagesTr/{}_{c:04}.nii.gz", s.id));
        }
        expected.insert(format!("labelsTr/{}.nii.gz", s.id));
    }
    for folder in ["imagesTr", "labelsTr"] {
        if !top.iter().any(|n| n == folder) {
            continue;
        }
        let names = list(&out.join(folder))?;
        if let Some(other) = names
            .iter()
            .find(|f| !expected.contains(&format!("{folder}/{f}")))
        {
            return refuse(format!(
                "{folder}/{other} is not a file this preset writes (an earlier synth of another preset?), and the two would mix"
            ));
        }
    }
    Ok(())
}

fn validate_specs(specs: &[SynthCaseSpec]) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for s in specs {
        let bad = |msg: String| Error::Config(format!("synthetic case '{}': {msg}", s.id));
        if s.id.is_empty()
            || s.id.starts_with('.')
            || s.id.contains(['/', '\\'])
            || s.id.chars().any(char::is_control)
        {
            return Err(bad("id must be a plain, non-empty file name".into()));
        }
        if !seen.insert(s.id.as_str()) {
            return Err(bad("duplicate id".into()));
        }
        if s.shape_xyz.iter().any(|&n| n == 0 || n > i16::MAX as usize) {
            return Err(bad(format!(
                "shape {:?} must be between 1 and {} along each axis",
                s.shape_xyz,
                i16::MAX
            )));
        }
        if s.spacing_xyz.iter().any(|v| !v.is_finite() || *v <= 0.0) {
            return Err(bad(format!(
                "spacing {:?} must be finite and positive",
                s.spacing_xyz
            )));
        }
    }
    Ok(())
}
