//! Models trained by nnU-Net v2 itself, predicted by us, against `nnUNetv2_predict`'s own
//! outputs on the same inputs. The tiny results folders, inputs and expected outputs under
//! tests/fixtures/nnunet_models were made by nnunetv2 2.8.1 (scripts/nnunet_fixtures.py: real
//! training, real checkpoints, real predictions with mirroring), so no PyTorch is needed here.
//!
//! Acceptance, per case: at least 99.9% of voxels equal, and every voxel that differs has a
//! top-2 margin under 0.05 in nnU-Net's own probabilities (the case where float32 rounding in
//! another convolution can tip the argmax).

use std::path::{Path, PathBuf};

use voxcache::infer::nnunet::{predict_nnunet, NnunetPredictOptions};
use voxcache::infer::postprocess::PostprocessingChoice;
use voxcache::infer::predict::PredictOutcome;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nnunet_models")
}

/// The one `TRAINER__PLANS__CONFIGURATION` folder of a fixture.
fn results_dir(name: &str) -> PathBuf {
    let dir = fixtures().join(name);
    std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().contains("__"))
        .unwrap_or_else(|| panic!("no results folder in {}", dir.display()))
}

/// A little-endian float16, float32 or int8 .npy: (shape, values).
pub(crate) fn parse_npy(bytes: &[u8]) -> (Vec<usize>, Vec<f32>) {
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
            12,
        ),
    };
    let header = std::str::from_utf8(&bytes[start..start + len]).unwrap();
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape_text = header
        .split("'shape': (")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    let shape: Vec<usize> = shape_text
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let data = &bytes[start + len..];
    let values: Vec<f32> = if header.contains("'<f2'") {
        data.chunks_exact(2)
            .map(|b| f32::from(half::f16::from_le_bytes([b[0], b[1]])))
            .collect()
    } else if header.contains("'|i1'") {
        data.iter().map(|&b| f32::from(b as i8)).collect()
    } else {
        assert!(header.contains("'<f4'"), "{header}");
        data.chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    assert_eq!(values.len(), shape.iter().product::<usize>(), "{header}");
    (shape, values)
}

/// The `probabilities` array of an nnU-Net `.npz`.
fn read_npz(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut entry = zip.by_name("probabilities.npy").unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
    parse_npy(&bytes)
}

/// Predict with `dir`, writing nnU-Net's probability files too.
/// nnU-Net's defaults (step 0.5, mirroring) on the CPU, no postprocessing, probabilities saved.
fn options(dir: &Path, folds: Option<&[&str]>, inputs: &Path, out: &Path) -> NnunetPredictOptions {
    NnunetPredictOptions {
        model: dir.to_path_buf(),
        folds: folds.map(|f| f.iter().map(|s| s.to_string()).collect()),
        checkpoint: "checkpoint_final.pth".into(),
        inputs: vec![inputs.to_path_buf()],
        out: out.to_path_buf(),
        device: "cpu".into(),
        step: 0.5,
        mirror: true,
        batch: 2,
        precision: None,
        window_memory: 256 << 20,
        postprocessing: PostprocessingChoice::Off,
        save_probabilities: true,
        quiet: true,
    }
}

fn predict(dir: &Path, folds: Option<&[&str]>, inputs: &Path, out: &Path) {
    let report = predict_nnunet(&options(dir, folds, inputs, out)).unwrap();
    for c in &report.cases {
        assert!(
            matches!(c.outcome, PredictOutcome::Predicted { .. }),
            "{}: {:?}",
            c.id,
            c.outcome
        );
    }
    assert!(report.predicted > 0);
}

/// Our segmentations in `ours` against nnU-Net's in `expected` (CASE.nii.gz and
/// CASE_probabilities.npy).
fn compare(expected: &Path, ours: &Path) {
    compare_within(expected, ours, 1e-3);
}

/// [`compare`] with the probabilities within `tolerance`: labels equal but in 0.1% of voxels at
/// most, each a near tie in nnU-Net's probabilities.
fn compare_within(expected: &Path, ours: &Path, tolerance: f32) {
    let mut cases = 0;
    for e in std::fs::read_dir(expected).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(id) = name.strip_suffix(".nii.gz") else {
            continue;
        };
        cases += 1;
        let theirs = voxcache::nifti_io::read_volume(&e.path()).unwrap();
        let mine = voxcache::nifti_io::read_volume(&ours.join(&name)).unwrap();
        assert_eq!(theirs.header.shape_xyz, mine.header.shape_xyz, "{id}");
        assert_eq!(
            theirs.header.affine.0, mine.header.affine.0,
            "{id}: the output's geometry is the input's"
        );
        let (shape, probs) =
            parse_npy(&std::fs::read(expected.join(format!("{id}_probabilities.npy"))).unwrap());
        // Our CASE.npz holds nnU-Net's probabilities (stored here rounded to float16).
        let (our_shape, our_probs) = read_npz(&ours.join(format!("{id}.npz")));
        assert_eq!(our_shape, shape, "{id}: probabilities' shape");
        let worst = probs
            .iter()
            .zip(&our_probs)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= tolerance,
            "{id}: probabilities differ by up to {worst}"
        );
        assert!(ours.join(format!("{id}.pkl")).is_file(), "{id}: no .pkl");
        let n = theirs.data.len();
        assert_eq!(
            shape[1..].iter().product::<usize>(),
            n,
            "{id}: probabilities {shape:?}"
        );
        let mut differ = 0;
        for i in 0..n {
            if theirs.data[i] != mine.data[i] {
                differ += 1;
                let mut p: Vec<f32> = (0..shape[0]).map(|c| probs[c * n + i]).collect();
                p.sort_by(|a, b| b.total_cmp(a));
                assert!(
                    p[0] - p[1] < 0.05,
                    "{id}: voxel {i} differs ({} vs {}) with a margin of {}",
                    theirs.data[i],
                    mine.data[i],
                    p[0] - p[1]
                );
            }
        }
        assert!(
            differ as f64 <= 0.001 * n as f64,
            "{id}: {differ} of {n} voxels differ"
        );
        assert!(
            theirs.data.iter().any(|&v| v != 0.0),
            "{id}: nnU-Net's prediction is all background: the fixture tests nothing"
        );
    }
    assert!(cases > 0, "no expected outputs in {}", expected.display());
}

#[test]
fn plain_3d_ct_anisotropic_one_fold_and_ensemble() {
    let out = tempfile::tempdir().unwrap();
    let dir = results_dir("ct3d");
    let inputs = fixtures().join("ct3d/inputs");
    predict(&dir, Some(&["0"]), &inputs, &out.path().join("f0"));
    compare(
        &fixtures().join("ct3d/expected_fold0"),
        &out.path().join("f0"),
    );
    predict(&dir, Some(&["0", "1"]), &inputs, &out.path().join("f01"));
    compare(
        &fixtures().join("ct3d/expected_folds01"),
        &out.path().join("f01"),
    );
}

#[test]
fn bf16_predicts_within_near_ties_of_nnunet() {
    let out = tempfile::tempdir().unwrap();
    let inputs = fixtures().join("ct3d/inputs");
    let opts = NnunetPredictOptions {
        precision: Some(voxcache::format::training::network::Precision::Bf16),
        folds: Some(vec!["0".into()]),
        ..options(&results_dir("ct3d"), None, &inputs, out.path())
    };
    assert_eq!(predict_nnunet(&opts).unwrap().failed, 0);
    compare_within(&fixtures().join("ct3d/expected_fold0"), out.path(), 2e-2);
}

#[test]
fn plain_2d_configuration() {
    let out = tempfile::tempdir().unwrap();
    predict(
        &results_dir("ct2d"),
        None,
        &fixtures().join("ct2d/inputs"),
        out.path(),
    );
    compare(&fixtures().join("ct2d/expected"), out.path());
}

#[test]
fn residual_encoder_regions_two_channels_masked_norm() {
    let out = tempfile::tempdir().unwrap();
    let dir = results_dir("regions_resenc");
    predict(
        &dir,
        None,
        &fixtures().join("regions_resenc/inputs"),
        out.path(),
    );
    compare(&fixtures().join("regions_resenc/expected"), out.path());
}

/// What we cannot reproduce is refused, naming the file and the reason.
#[test]
fn unsupported_models_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let src = results_dir("ct3d");
    let copy = |to: &str| -> PathBuf {
        let d = tmp.path().join(to);
        std::fs::create_dir_all(d.join("fold_0")).unwrap();
        for f in ["plans.json", "dataset.json", "dataset_fingerprint.json"] {
            std::fs::copy(src.join(f), d.join(f)).unwrap();
        }
        std::fs::copy(
            src.join("fold_0/checkpoint_final.pth"),
            d.join("fold_0/checkpoint_final.pth"),
        )
        .unwrap();
        d
    };
    let open = |d: &Path, folds: Option<&[String]>, ck: &str| {
        voxcache::infer::nnunet::model::NnunetModel::open(d, folds, ck)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let plans_name = src
        .file_name()
        .unwrap()
        .to_string_lossy()
        .split("__")
        .nth(1)
        .unwrap()
        .to_string();
    // A cascade stage.
    let d = copy(&format!("nnUNetTrainer__{plans_name}__3d_cascade_fullres"));
    assert!(open(&d, None, "checkpoint_final.pth").contains("3d_cascade_fullres"));
    // A folder not named as nnU-Net names them.
    let d = copy("my_model");
    assert!(open(&d, None, "checkpoint_final.pth").contains("TRAINER__PLANS__CONFIGURATION"));
    // A missing fold and a missing checkpoint.
    let cfg = src.file_name().unwrap().to_string_lossy().to_string();
    let d = copy(&cfg);
    assert!(open(&d, Some(&["3".to_string()]), "checkpoint_final.pth").contains("fold_3"));
    assert!(open(&d, None, "checkpoint_best.pth").contains("checkpoint_best.pth"));
    // A truncated checkpoint names the file.
    let ck = d.join("fold_0/checkpoint_final.pth");
    let bytes = std::fs::read(&ck).unwrap();
    std::fs::write(&ck, &bytes[..bytes.len() / 2]).unwrap();
    let e = open(&d, None, "checkpoint_final.pth");
    assert!(e.contains("checkpoint_final.pth"), "{e}");
    // A batch-norm network in the plans.
    let d2 = tmp.path().join("bn").join(&cfg);
    std::fs::create_dir_all(d2.parent().unwrap()).unwrap();
    let d2 = {
        let d = copy(&format!("bn/{cfg}"));
        let p = d.join("plans.json");
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace("InstanceNorm3d", "BatchNorm3d");
        std::fs::write(&p, text).unwrap();
        d
    };
    let e = open(&d2, None, "checkpoint_final.pth");
    assert!(e.contains("norm_op") && e.contains("plans.json"), "{e}");
    // An image that is all zero fails alone, named.
    let inputs = tmp.path().join("zero");
    std::fs::create_dir_all(&inputs).unwrap();
    let first = std::fs::read_dir(fixtures().join("ct3d/inputs"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let v = voxcache::nifti_io::read_volume(&first).unwrap();
    let h = &v.header;
    let zeros = vec![0i16; v.data.len()];
    voxcache::nifti_io::write_nifti_i16(
        &inputs.join("blank_0000.nii.gz"),
        h.shape_xyz,
        h.spacing_xyz,
        &zeros,
    )
    .unwrap();
    let report = predict_nnunet(&NnunetPredictOptions {
        model: src.clone(),
        folds: Some(vec!["0".into()]),
        checkpoint: "checkpoint_final.pth".into(),
        inputs: vec![inputs],
        out: tmp.path().join("out"),
        device: "cpu".into(),
        step: 0.5,
        mirror: false,
        batch: 1,
        precision: None,
        window_memory: 1 << 20,
        postprocessing: PostprocessingChoice::Recorded,
        save_probabilities: false,
        quiet: true,
    })
    .unwrap();
    match &report.cases[0].outcome {
        PredictOutcome::Failed { error } => {
            assert!(error.contains("blank") && error.contains("0"), "{error}")
        }
        o => panic!("{o:?}"),
    }
}

/// The cross-validation folder's postprocessing.json is applied as nnUNetv2_apply_postprocessing
/// applies it (by default; `--no-postprocessing` gives nnUNetv2_predict's output), and a
/// decision we cannot apply is refused by name.
#[test]
fn crossval_postprocessing_keeps_the_largest_component() {
    let tmp = tempfile::tempdir().unwrap();
    let src = results_dir("ct2d");
    let dir = tmp.path().join(src.file_name().unwrap());
    std::fs::create_dir_all(dir.join("fold_0")).unwrap();
    for f in ["plans.json", "dataset.json", "fold_0/checkpoint_final.pth"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let cv = dir.join("crossval_results_folds_0_1_2_3_4");
    std::fs::create_dir_all(&cv).unwrap();
    let decision = |kwargs: &str, f: &str| {
        std::fs::write(
            cv.join("postprocessing.json"),
            format!("{{\"postprocessing_fns\": [\"{f}\"], \"postprocessing_kwargs\": [{kwargs}]}}"),
        )
        .unwrap()
    };
    let inputs = fixtures().join("ct2d/inputs");
    let run = |out: &Path| {
        predict_nnunet(&NnunetPredictOptions {
            postprocessing: PostprocessingChoice::Recorded,
            save_probabilities: false,
            ..options(&dir, None, &inputs, out)
        })
    };
    let keep = "remove_all_but_largest_component_from_segmentation";
    decision("{\"labels_or_regions\": 2}", keep);
    let out = tmp.path().join("out");
    assert_eq!(run(&out).unwrap().predicted, 2);
    let mut removed = 0;
    for case in ["ct_fine", "ct_coarse"] {
        // nnU-Net's output without postprocessing (ours equals it: see plain_2d_configuration).
        let raw = voxcache::nifti_io::read_volume(
            &fixtures().join(format!("ct2d/expected/{case}.nii.gz")),
        )
        .unwrap();
        let pp = voxcache::nifti_io::read_volume(&out.join(format!("{case}.nii.gz"))).unwrap();
        let mask: Vec<bool> = raw.data.iter().map(|&v| v == 2.0).collect();
        let comps = crate::common::components(&mask, raw.header.shape_xyz);
        let largest = comps.iter().map(Vec::len).max().unwrap();
        assert_eq!(comps.iter().filter(|c| c.len() == largest).count(), 1);
        let mut kept = vec![false; mask.len()];
        comps
            .iter()
            .filter(|c| c.len() == largest)
            .flatten()
            .for_each(|&i| kept[i] = true);
        for i in 0..mask.len() {
            let want = if mask[i] && !kept[i] {
                0.0
            } else {
                raw.data[i]
            };
            assert_eq!(pp.data[i], want, "{case}: voxel {i}");
        }
        removed += mask.iter().zip(&kept).filter(|(m, k)| **m && !**k).count();
    }
    assert!(
        removed > 0,
        "the fixture's label 2 has one component: nothing tested"
    );
    // Decisions we cannot apply are named.
    for (kwargs, f, says) in [
        (
            "{\"labels_or_regions\": 2}",
            "remove_small_things",
            "postprocessing_fns",
        ),
        ("{\"labels_or_regions\": 9}", keep, "label 9"),
        (
            "{\"labels_or_regions\": [1, \"a\"]}",
            keep,
            "labels_or_regions",
        ),
    ] {
        decision(kwargs, f);
        let e = run(&tmp.path().join("bad")).err().unwrap().to_string();
        assert!(e.contains("postprocessing.json") && e.contains(says), "{e}");
    }
}

/// nnU-Net's spelling through the binary, `predict -i IN -o OUT -d 981 -c 3d_fullres -f 0 1`
/// with `nnUNet_results` holding the dataset's 2d and 3d_fullres results folders, writes what
/// `predict --nnunet-model FOLDER --folds 0,1` writes, voxel for voxel; `-d
/// Dataset981_FixCT -f 0` what `--folds 0` writes; and the two fold sets differ (so `-f` and
/// `-c` are followed, not defaulted).
#[test]
fn the_dataset_spelling_predicts_as_the_results_folder_does() {
    use crate::common::fixtures::{copy_tree, s, text};
    let t = tempfile::tempdir().unwrap();
    let results = t.path().join("results");
    let dataset = results.join("Dataset981_FixCT");
    for (fixture, config) in [("ct3d", "3d_fullres"), ("ct2d", "2d")] {
        let name = format!("nnUNetTrainer__nnUNetPlans__{config}");
        copy_tree(&fixtures().join(fixture).join(&name), &dataset.join(&name));
    }
    let folder = dataset.join("nnUNetTrainer__nnUNetPlans__3d_fullres");
    let inputs = fixtures().join("ct3d/inputs");
    let predict = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_predict"))
            .env("nnUNet_results", &results)
            .args(args)
            .args(["--disable_tta", "-q"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    };
    let out = |name: &str| t.path().join(name);
    let (d01, m01, d0, m0) = (out("d01"), out("m01"), out("d0"), out("m0"));
    predict(&[
        "-i",
        s(&inputs),
        "-o",
        s(&d01),
        "-d",
        "981",
        "-c",
        "3d_fullres",
        "-f",
        "0",
        "1",
    ]);
    predict(&[
        "--nnunet-model",
        s(&folder),
        s(&inputs),
        "--folds",
        "0,1",
        "--out",
        s(&m01),
    ]);
    predict(&[
        "-d",
        "Dataset981_FixCT",
        "-c",
        "3d_fullres",
        "-f",
        "0",
        "-i",
        s(&inputs),
        "-o",
        s(&d0),
    ]);
    predict(&[
        "--nnunet-model",
        s(&folder),
        "--folds=0",
        s(&inputs),
        "--out",
        s(&m0),
    ]);
    let mut differ = 0;
    for case in ["ct_coarse", "ct_fine"] {
        let read = |dir: &Path| {
            voxcache::nifti_io::read_volume(&dir.join(format!("{case}.nii.gz"))).unwrap()
        };
        let (a, b) = (read(&d01), read(&m01));
        assert_eq!(a.header.affine.0, b.header.affine.0, "{case}");
        assert_eq!(a.data, b.data, "{case}: -d -f 0 1 against --folds 0,1");
        assert!(a.data.iter().any(|&v| v != 0.0), "{case}: all background");
        let (c, d) = (read(&d0), read(&m0));
        assert_eq!(c.data, d.data, "{case}: -d -f 0 against --folds 0");
        differ += a.data.iter().zip(&c.data).filter(|(x, y)| x != y).count();
    }
    assert!(differ > 0, "folds 0 and 1 predict as fold 0 alone");
}

/// `prep inspect --nnunet-model FOLDER INPUTS` (text and `--json`) against the plans and
/// nnU-Net's own records: configuration, plans, dataset, patch and spacing as plans.json lists
/// them, the channel's normalization, the classes, every fold's checkpoint, the mirror axes
/// nnU-Net recorded for inference; and per input the preprocessed grid and window count of
/// nnU-Net's formulas (round(shape x spacing / target), ceil((size - patch) / (patch / 2)) + 1
/// per axis; every slice for 2d), with mirror passes and folds multiplied in.
#[test]
fn inspect_reports_the_plans_figures() {
    use crate::common::fixtures::{prep, s, text};
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("manifest.json")).unwrap()).unwrap();
    for (fixture, config, folds) in [("ct3d", "3d_fullres", 2), ("ct2d", "2d", 1)] {
        let dir = results_dir(fixture);
        let inputs = fixtures().join(fixture).join("inputs");
        let plans: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("plans.json")).unwrap()).unwrap();
        let cfg = &plans["configurations"][config];
        let o = prep(&["inspect", "--nnunet-model", s(&dir), s(&inputs), "--json"]);
        assert!(o.status.success(), "{}", text(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["configuration"], config, "{r}");
        assert_eq!(r["plans"], plans["plans_name"], "{r}");
        assert_eq!(r["dataset"], plans["dataset_name"], "{r}");
        assert_eq!(r["patch_size"], cfg["patch_size"], "{r}");
        assert_eq!(r["spacing"], cfg["spacing"], "{r}");
        assert_eq!(r["transpose_forward"], plans["transpose_forward"], "{r}");
        assert_eq!(
            r["channels"],
            serde_json::json!([["CT", cfg["normalization_schemes"][0], false]]),
            "{r}"
        );
        assert_eq!(
            r["labels"],
            serde_json::json!(["0 background", "1 organ", "2 lesion"]),
            "{r}"
        );
        let want: Vec<String> = (0..folds)
            .map(|k| {
                dir.join(format!("fold_{k}/checkpoint_final.pth"))
                    .display()
                    .to_string()
            })
            .collect();
        assert_eq!(r["checkpoints"], serde_json::json!(want), "{r}");
        let recorded = &manifest["fixtures"][fixture]["inference_allowed_mirroring_axes"]["fold_0"];
        let mirror = r["mirror_axes"].as_array().unwrap().len();
        assert_eq!(mirror, recorded.as_array().unwrap().len(), "{r}");
        if config == "3d_fullres" {
            assert_eq!(r["mirror_axes"], *recorded, "{r}");
        }
        let patch: Vec<f64> = serde_json::from_value(cfg["patch_size"].clone()).unwrap();
        let target: Vec<f64> = serde_json::from_value(cfg["spacing"].clone()).unwrap();
        let forecast = r["forecast"].as_array().unwrap();
        assert_eq!(forecast.len(), 2, "{r}");
        for f in forecast {
            let id = f["id"].as_str().unwrap();
            let case = &manifest["fixtures"][fixture]["cases"][id];
            let xyz = |k: &str| -> Vec<f64> { serde_json::from_value(case[k].clone()).unwrap() };
            let (shape, spacing) = (xyz("shape_xyz"), xyz("spacing_xyz"));
            // (z, y, x); a 2d plan keeps the slices and lists (y, x) only.
            let planar = patch.len() == 2;
            let mut grid = Vec::new();
            let mut windows = 1usize;
            for a in 0..3 {
                let axis = 2 - a;
                let (n, sp) = (shape[axis], spacing[axis] as f32 as f64);
                if planar && a == 0 {
                    grid.push(n as usize);
                    windows *= n as usize;
                    continue;
                }
                let (p, goal) = match planar {
                    true => (patch[a - 1], target[a - 1]),
                    false => (patch[a], target[a]),
                };
                let size = (n * sp / goal).round();
                grid.push(size as usize);
                windows *= ((size.max(p) - p) / (p * 0.5)).ceil() as usize + 1;
            }
            assert_eq!(
                f["preprocessed_shape"],
                serde_json::json!(grid),
                "{id}: {f}"
            );
            assert_eq!(f["windows"], windows, "{id}: {f}");
            assert_eq!(
                f["forward_passes"],
                windows * (1 << mirror) * folds,
                "{id}: {f}"
            );
        }
        // The text report says the same.
        let o = prep(&["inspect", "--nnunet-model", s(&dir)]);
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let line = |key: &str| {
            out.lines()
                .find(|l| l.starts_with(key))
                .unwrap_or_else(|| panic!("no {key} line in\n{out}"))
                .to_string()
        };
        assert!(
            line("plans").ends_with(&format!("nnUNetPlans / {config}")),
            "{out}"
        );
        assert!(
            line("patch").contains(&format!(
                "{} at spacing {}",
                cfg["patch_size"].to_string().replace(',', ", "),
                cfg["spacing"].to_string().replace(',', ", ")
            )),
            "{out}"
        );
        assert!(line("channel 0").contains("CT: CTNormalization"), "{out}");
        for w in &want {
            assert!(line("folds").contains(w.as_str()), "{out}");
        }
    }
}

/// `path` (a gzipped NIfTI-1 in mm) rewritten uncompressed to `to` in micrometres: pixdim,
/// the quaternion offsets and the sform times 1000, xyzt_units NIFTI_UNITS_MICRON.
fn to_micrometres(path: &Path, to: &Path) {
    use std::io::Read;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut bytes)
        .unwrap();
    assert_eq!(i32::from_le_bytes(bytes[..4].try_into().unwrap()), 348);
    assert_eq!(bytes[123] & 7, 2, "{}: not in mm", path.display());
    let scale = |b: &mut [u8], at: usize| {
        let v = f32::from_le_bytes(b[at..at + 4].try_into().unwrap()) * 1000.0;
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    };
    let fields = (1..4).map(|i| 76 + 4 * i).chain([268, 272, 276]);
    let srows = (0..3).flat_map(|r| (0..4).map(move |c| 280 + 16 * r + 4 * c));
    for at in fields.chain(srows) {
        scale(&mut bytes, at);
    }
    bytes[123] = (bytes[123] & !7) | 3;
    std::fs::write(to, bytes).unwrap();
}

#[test]
fn micrometre_headers_are_read_in_mm_as_simpleitk_reads_them() {
    // nnU-Net's default reader, SimpleITK, converts a header's unit to mm: the same image in
    // um must give the same segmentation and probabilities as in mm.
    let tmp = tempfile::tempdir().unwrap();
    let dir = results_dir("ct3d");
    let plans = std::fs::read_to_string(dir.join("plans.json")).unwrap();
    assert!(plans.contains("\"SimpleITKIO\""), "the fixture's reader");
    let (mm, um) = (tmp.path().join("mm"), tmp.path().join("um"));
    std::fs::create_dir_all(&mm).unwrap();
    std::fs::create_dir_all(&um).unwrap();
    let name = "ct_coarse_0000.nii.gz";
    let input = fixtures().join("ct3d/inputs").join(name);
    std::fs::copy(&input, mm.join(name)).unwrap();
    to_micrometres(&input, &um.join("ct_coarse_0000.nii"));
    let um_header = voxcache::nifti_io::read_header(&um.join("ct_coarse_0000.nii")).unwrap();
    assert_eq!(um_header.unit, "um");
    let mut o = options(&dir, Some(&["0"]), &mm, &tmp.path().join("out_mm"));
    o.mirror = false;
    predict_nnunet(&o).unwrap();
    o.inputs = vec![um.clone()];
    o.out = tmp.path().join("out_um");
    let report = predict_nnunet(&o).unwrap();
    assert_eq!(report.predicted, 1, "{:?}", report.cases);
    let a = voxcache::nifti_io::read_volume(&tmp.path().join("out_mm/ct_coarse.nii.gz")).unwrap();
    let b = voxcache::nifti_io::read_volume(&tmp.path().join("out_um/ct_coarse.nii.gz")).unwrap();
    assert_eq!(
        a.data, b.data,
        "the segmentation depends on the header's unit"
    );
    let pa = read_npz(&tmp.path().join("out_mm/ct_coarse.npz"));
    let pb = read_npz(&tmp.path().join("out_um/ct_coarse.npz"));
    assert_eq!(pa, pb, "the probabilities depend on the header's unit");
}
