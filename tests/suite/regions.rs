//! Region-based training (nnU-Net's BraTS mode) end to end on `prep synth --preset brats-like`:
//! the run records its regions and their order, trains one sigmoid output per region, its fold
//! validation and `evaluate --cv` score regions, `predict` writes each voxel as the last region
//! in `regions_class_order` whose probability passes 0.5 and keeps those probabilities on
//! request; loss terms defined for classes only and labels no region holds are refused.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::fixtures::{build, prep, run as bin, s, text};
use common::zarrs_box;
use voxcache::nifti_io::read_volume;

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The brats-like data (12 cases, four channels, labels 1-3 in regions whole tumor 1+2+3,
/// tumor core 2+3, enhancing tumor 3) and its cache.
fn brats(dir: &Path) -> (PathBuf, PathBuf) {
    let (data, cache) = (dir.join("brats"), dir.join("cache"));
    let o = prep(&["synth", "--preset", "brats-like", "--out", s(&data)]);
    assert!(o.status.success(), "{}", text(&o));
    build(&data, &cache, &[]);
    (data, cache)
}

/// A tiny network for a few steps on fold 0, validated at the end on its held-out cases.
fn train(cache: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "--cache-dir",
        s(cache),
        "--out",
        s(out),
        "--patch",
        "16,32,32",
        "--batch-size",
        "2",
        "--steps",
        "6",
        "--base-channels",
        "4",
        "--stages",
        "3",
        "--val-every",
        "6",
        "--no-progress",
    ];
    args.extend_from_slice(extra);
    bin("train", &args)
}

#[test]
fn regions_train_validate_predict_and_evaluate() {
    let t = tempfile::tempdir().unwrap();
    let (data, cache) = brats(t.path());
    let run = t.path().join("run");
    let o = train(&cache, &run, &["--fold", "0"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o)
            .contains("3 sigmoid regions: whole tumor 1+2+3, tumor core 2+3, enhancing tumor 3"),
        "{}",
        text(&o)
    );
    // One fold trains into the run folder itself.
    let fold = run.clone();
    let record = json(&fold.join("run.json"));
    assert_eq!(record["regions_class_order"], serde_json::json!([1, 2, 3]));
    let regions: Vec<(String, Vec<u16>)> = record["regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                serde_json::from_value(r["values"].clone()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        regions,
        [
            ("whole tumor".to_string(), vec![1, 2, 3]),
            ("tumor core".to_string(), vec![2, 3]),
            ("enhancing tumor".to_string(), vec![3]),
        ]
    );
    // The fold's validation scored the three regions on its held-out cases.
    let summary = json(&fold.join("validation/summary.json"));
    let held_out = record["split"]["val"].as_array().unwrap().len();
    assert_eq!(summary["cases"].as_array().unwrap().len(), held_out);
    let scored: Vec<&str> = summary["cases"][0]["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["class"].as_str().unwrap())
        .collect();
    assert_eq!(scored, ["whole tumor", "tumor core", "enhancing tumor"]);

    // evaluate --cv over the fold: the regions, and a postprocessing decision.
    let o = bin("evaluate", &["--cv", s(&fold), "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(fold.join("postprocessing.json").is_file());

    // predict: labels written in regions_class_order from the kept region probabilities.
    let out = t.path().join("pred");
    let image = t.path().join("one");
    std::fs::create_dir_all(&image).unwrap();
    for c in 0..4 {
        let name = format!("brats_000_{c:04}.nii.gz");
        std::fs::copy(data.join("imagesTr").join(&name), image.join(&name)).unwrap();
    }
    let o = bin(
        "predict",
        &[
            "--model",
            s(&fold),
            "--no-postprocessing",
            s(&image),
            "--out",
            s(&out),
            "--save-probabilities",
            "-q",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let seg = read_volume(&out.join("brats_000.nii.gz")).unwrap();
    let [nx, ny, nz] = seg.header.shape_xyz;
    let n = nx * ny * nz;
    let zarr = out.join("brats_000.probabilities.zarr");
    let attrs = json(&zarr.join("zarr.json"))["attributes"]["voxcache"].clone();
    assert_eq!(attrs["kind"], "region probabilities");
    assert_eq!(attrs["values"], serde_json::json!([1, 2, 3]));
    assert_eq!(
        attrs["regions"],
        serde_json::json!([[1, 2, 3], [2, 3], [3]])
    );
    let p = zarrs_box(&zarr, "", [0; 3], [nz, ny, nx]);
    assert_eq!(p.len(), 3 * n);
    let mut checked = 0;
    for i in 0..n {
        let heads = [p[i], p[n + i], p[2 * n + i]];
        assert!(heads.iter().all(|h| (0.0..=1.0).contains(h)), "voxel {i}");
        // float16 storage can move a probability across 0.5 only when it is that close.
        if heads.iter().any(|h| (h - 0.5).abs() < 2e-3) {
            continue;
        }
        let mut want = 0.0;
        for (h, value) in heads.iter().zip([1.0, 2.0, 3.0]) {
            if *h > 0.5 {
                want = value;
            }
        }
        assert_eq!(seg.data[i], want, "voxel {i}: {heads:?}");
        checked += 1;
    }
    assert!(checked > n / 2, "{checked} of {n}");

    // evaluate on the prediction: the regions from the dataset's dataset.json.
    let o = bin("evaluate", &[s(&out), s(&data), "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = report["cases"][0]["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["class"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["whole tumor", "tumor core", "enhancing tumor"]);
}

#[test]
fn region_runs_refuse_class_only_losses_and_unknown_labels() {
    let t = tempfile::tempdir().unwrap();
    let (data, cache) = brats(t.path());
    let o = train(&cache, &t.path().join("cl"), &["--loss", "cldice=1"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("regions") && text(&o).contains("clDice"),
        "{}",
        text(&o)
    );
    assert!(!t.path().join("cl/checkpoints").exists());

    // Label value 4 in a case, held by no region: that case fails its build, naming the file;
    // the others are built.
    let label = data.join("labelsTr/brats_003.nii.gz");
    let mut v = read_volume(&label).unwrap();
    let i = v.data.iter().position(|&x| x == 0.0).unwrap();
    v.data[i] = 4.0;
    let shape = v.header.shape_xyz;
    let bytes: Vec<u8> = v.data.iter().map(|&x| x as u8).collect();
    voxcache::nifti_io::write_nifti_u8(&label, shape, [1.0, 1.0, 1.0], &bytes).unwrap();
    let o = prep(&[
        "build-cache",
        s(&data),
        "--cache-dir",
        s(&t.path().join("cache4")),
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("brats_003.nii.gz")
            && text(&o).contains("value 4")
            && text(&o).contains("11 built"),
        "{}",
        text(&o)
    );
}
