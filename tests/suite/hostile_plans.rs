//! Hostile nnU-Net results folders, inputs, flags and output folders through the binaries, each
//! child under a wall-clock limit and a 4 GiB address-space limit (an allocation sized by a
//! hostile value aborts the child, which fails the test): an output folder over the model or
//! the inputs, NaN voxels, absurd plans.json sizes (patch, spacing, strides) and input pixdim,
//! a huge or foreign postprocessing.json, absurd --step-size, an empty $nnUNet_results, and a
//! region holding the background. Each is refused with the file and the field or flag named,
//! before anything is allocated or written.
#![cfg(unix)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::fixtures::{bundled_cache, copy_tree, process_scratch, text};
use common::Nii;

/// A child must finish within this.
const LIMIT: Duration = Duration::from_secs(120);

/// `BIN ARGS` with `env` set, bounded in time and address space: (exit code, output).
fn bounded(bin: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    crate::common::bounded::bounded(bin, args, env, LIMIT)
}

fn predict(args: &[&str]) -> (i32, String) {
    bounded(env!("CARGO_BIN_EXE_predict"), args, &[])
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The ct3d fixture: (its inputs folder, its results folder).
fn ct3d() -> (PathBuf, PathBuf) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nnunet_models/ct3d");
    (
        root.join("inputs"),
        root.join("nnUNetTrainer__nnUNetPlans__3d_fullres"),
    )
}

/// A copy of the ct3d results folder under `root/name/`, its plans' 3d_fullres configuration
/// changed by `edit`.
fn tampered(root: &Path, name: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let dir = root
        .join(name)
        .join("nnUNetTrainer__nnUNetPlans__3d_fullres");
    copy_tree(&ct3d().1, &dir);
    let path = dir.join("plans.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v["configurations"]["3d_fullres"]);
    std::fs::write(&path, v.to_string()).unwrap();
    dir
}

/// A float32 image shaped as ct3d's ct_fine (21 x 33 x 36) at `spacing` mm, with `nan` voxels
/// set to NaN, written as `dir/ct_fine_0000.nii.gz`.
fn ct_like(dir: &Path, spacing: [f32; 3], nan: usize) -> PathBuf {
    ct_like_in(dir, spacing, nan, 2)
}

/// [`ct_like`] in NIfTI unit code `units` (2 mm, 3 um).
fn ct_like_in(dir: &Path, spacing: [f32; 3], nan: usize, units: u8) -> PathBuf {
    let shape = [36, 33, 21];
    let n: usize = shape.iter().product();
    let mut v: Vec<f32> = (0..n).map(|i| ((i * 37) % 200) as f32 - 100.0).collect();
    for k in 0..nan {
        v[(k * 7919) % n] = f32::NAN;
    }
    let path = dir.join("ct_fine_0000.nii.gz");
    std::fs::create_dir_all(dir).unwrap();
    let mut nii = Nii::new(shape, spacing, &v, false);
    nii.xyzt_units = units;
    nii.write(&path);
    path
}

#[test]
fn an_output_folder_over_what_a_command_reads_is_refused_before_writing() {
    let root = process_scratch("hostile-plans-out");
    let (inputs, fixture) = ct3d();
    let model = root.join("nnUNetTrainer__nnUNetPlans__3d_fullres");
    copy_tree(&fixture, &model);
    let before = common::tree_hashes(&model);
    for out in [model.clone(), model.join("fold_0/pred"), root.clone()] {
        let (code, o) = predict(&["--nnunet-model", s(&model), s(&inputs), "--out", s(&out)]);
        assert_eq!(code, 2, "{o}");
        assert!(
            o.contains(&format!("--out {}", out.display())) && o.contains(s(&model)),
            "names both paths: {o}"
        );
    }
    assert_eq!(
        common::tree_hashes(&model),
        before,
        "the model is untouched"
    );
    // An output inside an input folder, through a path with `..`.
    let inputs_copy = root.join("inputs");
    copy_tree(&inputs, &inputs_copy);
    let out = inputs_copy.join("x/../pred");
    let (code, o) = predict(&[
        "--nnunet-model",
        s(&model),
        s(&inputs_copy),
        "--out",
        s(&out),
    ]);
    assert_eq!(code, 2, "{o}");
    assert!(o.contains("is inside the input"), "{o}");
    assert!(!inputs_copy.join("pred").exists(), "nothing written");
    // train --out over its cache, prep build-cache --cache-dir inside its data, evaluate
    // --summary over a reference.
    let cache = root.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let (code, o) = bounded(
        env!("CARGO_BIN_EXE_train"),
        &["--cache-dir", s(&cache), "--out", s(&cache), "--steps", "1"],
        &[],
    );
    assert_eq!(code, 2, "{o}");
    assert!(o.contains("--out") && o.contains("--cache-dir"), "{o}");
    let data = root.join("data");
    common::write_case(&data, "case_000", [12, 12, 6], [1.0; 3], 1);
    let (code, o) = bounded(
        env!("CARGO_BIN_EXE_prep"),
        &[
            "build-cache",
            s(&data),
            "--cache-dir",
            s(&data.join("cache")),
        ],
        &[],
    );
    assert_eq!(code, 2, "{o}");
    assert!(
        o.contains("--cache-dir") && o.contains("the data folder"),
        "{o}"
    );
    assert!(!data.join("cache").exists(), "nothing written");
    let reference = data.join("labelsTr/case_000.nii.gz");
    let hash = common::tree_hashes(&data);
    let (code, o) = bounded(
        env!("CARGO_BIN_EXE_evaluate"),
        &[
            s(&data.join("labelsTr")),
            s(&data.join("labelsTr")),
            "--summary",
            s(&reference),
        ],
        &[],
    );
    assert_eq!(code, 2, "{o}");
    assert!(o.contains("--summary"), "{o}");
    assert_eq!(
        common::tree_hashes(&data),
        hash,
        "the reference is untouched"
    );
}

#[test]
fn nan_voxels_fail_their_case_alone_naming_the_file_and_the_count() {
    let root = process_scratch("hostile-plans-nan");
    let (inputs, model) = ct3d();
    let dir = root.join("inputs");
    copy_tree(&inputs, &dir);
    let bad = ct_like(&dir, [0.6, 0.6, 2.2], 5);
    let out = root.join("out");
    let (code, o) = predict(&[
        "--nnunet-model",
        s(&model),
        "-f",
        "0",
        s(&dir),
        "--out",
        s(&out),
    ]);
    assert_eq!(code, 1, "{o}");
    assert!(
        o.contains(s(&bad)) && o.contains("5 voxels are NaN or infinite"),
        "{o}"
    );
    assert!(
        out.join("ct_coarse.nii.gz").is_file(),
        "the other case goes on: {o}"
    );
    assert!(!out.join("ct_fine.nii.gz").exists());
    // Our own models: the same rule (the one build-cache applies).
    let run = root.join("run");
    let o = Command::new(env!("CARGO_BIN_EXE_train"))
        .args([
            "--cache-dir",
            s(bundled_cache("default", &[])),
            "--out",
            s(&run),
        ])
        .args(["--patch", "8,32,32", "--steps", "2", "--base-channels", "4"])
        .args(["--stages", "3", "--val-fraction", "0", "--no-progress"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let ours = root.join("ours");
    // At the bundled data's unit (um) and about its spacing.
    let bad = ct_like_in(&ours, [2.0, 2.0, 2.0], 3, 3);
    let (code, o) = predict(&["--model", s(&run), s(&ours), "--out", s(&root.join("out2"))]);
    assert_eq!(code, 1, "{o}");
    assert!(
        o.contains(s(&bad)) && o.contains("3 voxels are NaN or infinite"),
        "{o}"
    );
}

#[test]
fn absurd_plans_and_pixdim_are_refused_naming_the_field_and_the_file() {
    let root = process_scratch("hostile-plans-sizes");
    let (inputs, fixture) = ct3d();
    let inspect = |model: &Path, input: &Path| {
        bounded(
            env!("CARGO_BIN_EXE_prep"),
            &["inspect", "--nnunet-model", s(model), s(input)],
            &[],
        )
    };
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        (
            "huge_patch",
            serde_json::json!({"patch_size": [4096, 4096, 4096]}),
            "configurations.3d_fullres.patch_size",
        ),
        (
            "big_patch",
            serde_json::json!({"patch_size": [512, 512, 512]}),
            "configurations.3d_fullres.patch_size",
        ),
        (
            "strides",
            serde_json::json!({"patch_size": [8, 16, 10]}),
            "not divisible by 4",
        ),
        (
            "zero_spacing",
            serde_json::json!({"spacing": [0.0, 1.0, 1.0]}),
            "configurations.3d_fullres.spacing",
        ),
    ];
    for (name, change, field) in cases {
        let model = tampered(&root, name, |c| {
            for (k, v) in change.as_object().unwrap() {
                c[k] = v.clone();
            }
        });
        let out = root.join(format!("out_{name}"));
        let (code, o) = predict(&[
            "--nnunet-model",
            s(&model),
            "-f",
            "0",
            s(&inputs),
            "--out",
            s(&out),
        ]);
        assert_eq!(code, 2, "{name}: {o}");
        assert!(o.contains(field) && o.contains("plans.json"), "{name}: {o}");
        assert!(!out.exists(), "{name}: nothing written");
        let (code, o) = inspect(&model, &inputs);
        assert_eq!(code, 2, "{name}: {o}");
        assert!(o.contains(field), "{name}: {o}");
    }
    // Spacings that make a grid too large to count, or to hold on disk: each case fails,
    // naming the spacing field and the input.
    for (name, spacing, what) in [
        ("tiny_spacing", [1e-300, 1.0, 1.0], "voxels along axis 0"),
        ("fine_spacing", [0.001, 0.001, 0.001], "of scratch space"),
    ] {
        let model = tampered(&root, name, |c| c["spacing"] = serde_json::json!(spacing));
        let out = root.join(format!("out_{name}"));
        let (code, o) = predict(&[
            "--nnunet-model",
            s(&model),
            "-f",
            "0",
            s(&inputs),
            "--out",
            s(&out),
        ]);
        assert_eq!(code, 1, "{name}: {o}");
        assert!(
            o.contains(what)
                && o.contains("configurations.3d_fullres.spacing")
                && o.contains("ct_fine_0000.nii.gz"),
            "{name}: {o}"
        );
    }
    // An input's pixdim: too large to count, or too large a plane to resample in memory.
    for (pixdim, what) in [(1e30f32, "voxels along axis"), (1e5, "GiB of")] {
        let dir = root.join(format!("pixdim_{pixdim}"));
        let input = ct_like(&dir, [pixdim, 0.6, 2.2], 0);
        let out = root.join(format!("out_pixdim_{pixdim}"));
        let (code, o) = predict(&[
            "--nnunet-model",
            s(&fixture),
            "-f",
            "0",
            s(&dir),
            "--out",
            s(&out),
        ]);
        assert_eq!(code, 1, "{pixdim}: {o}");
        assert!(
            o.contains(what) && o.contains("pixdim") && o.contains(s(&input)),
            "{o}"
        );
        if pixdim > 1e6 {
            let (code, o) = inspect(&fixture, &dir);
            assert_eq!(code, 2, "{o}");
            assert!(o.contains("pixdim") && o.contains(s(&input)), "{o}");
        }
    }
}

#[test]
fn postprocessing_step_size_and_environment_are_bounded_and_named() {
    let root = process_scratch("hostile-plans-flags");
    let (inputs, model) = ct3d();
    let out = s(&root.join("out")).to_string();
    let base = [
        "--nnunet-model",
        s(&model),
        "-f",
        "0",
        s(&inputs),
        "--out",
        &out,
    ];
    // A 30 MB postprocessing.json of labels, and one naming a label the model never predicts.
    let huge = root.join("huge.json");
    let labels = vec!["1"; 15 << 20].join(",");
    std::fs::write(
        &huge,
        format!(
            r#"{{"postprocessing_fns": ["remove_all_but_largest_component_from_segmentation"], "postprocessing_kwargs": [{{"labels_or_regions": [{labels}]}}]}}"#
        ),
    )
    .unwrap();
    let foreign = root.join("foreign.json");
    std::fs::write(
        &foreign,
        r#"{"postprocessing_fns": ["remove_all_but_largest_component_from_segmentation"], "postprocessing_kwargs": [{"labels_or_regions": [7]}]}"#,
    )
    .unwrap();
    for (pp, what) in [
        (&huge, "bytes, over the"),
        (&foreign, "label 7 is not one the model predicts"),
    ] {
        let (code, o) = predict(&[&base[..], &["--postprocessing", s(pp)]].concat());
        assert_eq!(code, 2, "{o}");
        assert!(o.contains(s(pp)) && o.contains(what), "{o}");
    }
    for step in ["1e-9", "1e-300", "0", "2"] {
        let (code, o) = predict(&[&base[..], &["--step-size", step]].concat());
        assert_eq!(code, 2, "{o}");
        assert!(o.contains("--step-size"), "{step}: {o}");
    }
    let (code, o) = bounded(
        env!("CARGO_BIN_EXE_predict"),
        &["-d", "4", "-c", "3d_fullres", s(&inputs), "--out", &out],
        &[("nnUNet_results", "")],
    );
    assert_eq!(code, 2, "{o}");
    assert!(
        o.contains("nnUNet_results") && o.contains("empty or not set"),
        "{o}"
    );
}

#[test]
fn a_region_holding_the_background_is_refused_by_every_command() {
    let root = process_scratch("hostile-plans-regions");
    let data = root.join("data");
    common::write_case(&data, "case_000", [12, 12, 6], [1.0; 3], 1);
    let json = root.join("dataset.json");
    std::fs::write(
        &json,
        r#"{"channel_names": {"0": "MR"}, "labels": {"background": 0, "whole": [0, 1], "core": [1]}, "regions_class_order": [1, 1], "file_ending": ".nii.gz"}"#,
    )
    .unwrap();
    let labels = s(&data.join("labelsTr")).to_string();
    for extra in [
        vec!["--dataset-json", s(&json)],
        vec!["--labels", "whole=0+1,core=1"],
    ] {
        let (code, o) = bounded(
            env!("CARGO_BIN_EXE_evaluate"),
            &[&[labels.as_str(), labels.as_str()][..], &extra].concat(),
            &[],
        );
        assert_eq!(code, 2, "{extra:?}: {o}");
        assert!(o.contains("region whole") && o.contains("holds 0"), "{o}");
    }
    // The same function refuses it wherever regions come from: a dataset.json (train, prep),
    // an nnU-Net model's dataset.json (predict), a run record (predict, crossval).
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let e = voxcache::format::dataset_json::DatasetDescription::from_value(&v).unwrap_err();
    assert!(e.contains("holds 0"), "{e}");
    let model = root.join("model/nnUNetTrainer__nnUNetPlans__3d_fullres");
    copy_tree(&ct3d().1, &model);
    std::fs::write(
        model.join("dataset.json"),
        r#"{"channel_names": {"0": "CT"}, "labels": {"background": 0, "whole": [0, 1]}, "regions_class_order": [1], "file_ending": ".nii.gz"}"#,
    )
    .unwrap();
    let (code, o) = predict(&[
        "--nnunet-model",
        s(&model),
        s(&ct3d().0),
        "--out",
        s(&root.join("out")),
    ]);
    assert_eq!(code, 2, "{o}");
    assert!(o.contains("region whole") && o.contains("holds 0"), "{o}");
}
