//! Region-based training (nnU-Net's BraTS mode) end to end on `prep synth --preset brats-like`:
//! the run records its regions and their order, trains one sigmoid output per region, its fold
//! validation and `evaluate --cv` score regions, `predict` writes each voxel as the last region
//! in `regions_class_order` whose probability passes 0.5 and keeps those probabilities on
//! request; loss terms defined for classes only and labels no region holds are refused.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

use common::fixtures::{build, prep, process_scratch, run as bin, s, text};
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

/// The brats-like data, its cache and a fold trained on it (fold 0, validated at its end), once
/// for this test binary: read-only to tests (copy the run before `evaluate --cv` writes into it).
struct Fold {
    data: PathBuf,
    run: PathBuf,
    train_output: String,
}

fn fold() -> &'static Fold {
    static FOLD: OnceLock<Fold> = OnceLock::new();
    FOLD.get_or_init(|| {
        let dir = process_scratch("regions-fold");
        let (data, cache) = brats(&dir);
        let run = dir.join("run");
        let o = train(&cache, &run, &["--fold", "0"]);
        assert!(o.status.success(), "{}", text(&o));
        Fold {
            data,
            run,
            train_output: text(&o),
        }
    })
}

#[test]
fn regions_train_validate_predict_and_evaluate() {
    let t = tempfile::tempdir().unwrap();
    let Fold {
        data,
        run,
        train_output,
    } = fold();
    assert!(
        train_output
            .contains("3 sigmoid regions: whole tumor 1+2+3, tumor core 2+3, enhancing tumor 3"),
        "{train_output}"
    );
    // One fold trains into the run folder itself (copied here: evaluate --cv writes into it).
    let fold = t.path().join("fold");
    common::fixtures::copy_tree(run, &fold);
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
    let o = bin("evaluate", &[s(&out), s(data), "--json"]);
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

/// nnU-Net's filter written here: the voxels holding any of `region`'s labels as one mask,
/// only its largest 26-connected component(s) kept, the rest set to background. Returns the
/// filtered labels and how many voxels it cleared.
fn keep_largest(labels: &[f32], region: &[f32], shape_xyz: [usize; 3]) -> (Vec<f32>, usize) {
    let mask: Vec<bool> = labels.iter().map(|v| region.contains(v)).collect();
    let comps = common::components(&mask, shape_xyz);
    let largest = comps.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = labels.to_vec();
    let mut cleared = 0;
    for c in comps.iter().filter(|c| c.len() < largest) {
        for &i in c {
            out[i] = 0.0;
            cleared += 1;
        }
    }
    (out, cleared)
}

/// A voxel of label 1 (edema) whose 26 neighbours are all label 1, so that a tumor-core voxel
/// put there touches no other tumor-core voxel.
fn edema_island(labels: &[f32], [nx, ny, nz]: [usize; 3]) -> Option<usize> {
    (0..labels.len()).find(|&i| {
        let (x, y, z) = (i % nx, (i / nx) % ny, i / (nx * ny));
        if x == 0 || y == 0 || z == 0 || x + 1 >= nx || y + 1 >= ny || z + 1 >= nz {
            return false;
        }
        (0..27).all(|k| {
            let (a, b, c) = (x + k % 3 - 1, y + (k / 3) % 3 - 1, z + k / 9 - 1);
            labels[a + nx * (b + ny * c)] == 1.0
        })
    })
}

/// Postprocessing on a region model decides on the regions, as nnU-Net's does: the fold's
/// validation predictions replaced by the references with one stray tumor-core voxel inside
/// the edema (the whole tumor unchanged, the tumor core with a second component), `evaluate
/// --cv` keeps the largest component of the region tumor core 2+3 (named as that region, not
/// as a label value, and not the foreground), its postprocessed predictions are exactly that
/// filter, and predict applies the recorded decision to the region.
#[test]
fn region_postprocessing_is_decided_and_applied_on_regions() {
    let t = tempfile::tempdir().unwrap();
    let f = fold();
    let run = t.path().join("fold");
    common::fixtures::copy_tree(&f.run, &run);
    let _ = std::fs::remove_file(run.join("postprocessing.json"));
    let summary = json(&run.join("validation/summary.json"));
    let mut strays = Vec::new();
    for c in summary["cases"].as_array().unwrap() {
        let id = c["id"].as_str().unwrap();
        let reference = read_volume(Path::new(c["reference"].as_str().unwrap())).unwrap();
        let shape = reference.header.shape_xyz;
        let mut labels = reference.data.clone();
        // The reference's tumor core is one component: the stray voxel is the only one.
        let (_, cleared) = keep_largest(&labels, &[2.0, 3.0], shape);
        assert_eq!(cleared, 0, "{id}: the reference's tumor core is in pieces");
        if let Some(i) = edema_island(&labels, shape) {
            labels[i] = 2.0;
            strays.push((id.to_string(), i));
        }
        let bytes: Vec<u8> = labels.iter().map(|&v| v as u8).collect();
        voxcache::nifti_io::write_nifti_u8(
            &run.join(format!("validation/{id}.nii.gz")),
            shape,
            reference.header.spacing_xyz,
            &bytes,
        )
        .unwrap();
    }
    assert!(!strays.is_empty(), "no validation case has a thick edema");

    let o = bin("evaluate", &["--cv", s(&run), "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let decision = json(&run.join("postprocessing.json"));
    assert_eq!(decision["foreground"], false, "{decision}");
    assert_eq!(decision["classes"], serde_json::json!([]), "{decision}");
    assert_eq!(
        decision["regions"],
        serde_json::json!([[2, 3]]),
        "{decision}"
    );
    let cv = t.path().join("crossval");
    assert_eq!(json(&cv.join("postprocessing.json")), decision);
    // The cross-validation's postprocessed predictions: the stray voxel is background, nothing
    // else changed (nnU-Net sets removed voxels to background, even where they were edema).
    for c in summary["cases"].as_array().unwrap() {
        let id = c["id"].as_str().unwrap();
        let before = read_volume(&run.join(format!("validation/{id}.nii.gz"))).unwrap();
        let after = read_volume(&cv.join(format!("postprocessed/{id}.nii.gz"))).unwrap();
        let mut want = before.data.clone();
        if let Some((_, i)) = strays.iter().find(|(s, _)| s == id) {
            want[*i] = 0.0;
        }
        assert_eq!(after.data, want, "{id}");
    }
    // Tumor core's Dice rose to 1; the whole tumor lost the voxel that was edema.
    let scores = json(&cv.join("postprocessed/summary.json"));
    let mean = |name: &str| {
        scores["mean"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["class"] == name)
            .unwrap_or_else(|| panic!("no {name} in {scores}"))["dice"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(mean("tumor core"), 1.0, "{scores}");
    assert!(mean("whole tumor") < 1.0, "{scores}");

    // predict applies the recorded decision to the region: its output is the unfiltered
    // prediction with tumor core's smaller components cleared.
    let image = t.path().join("images");
    std::fs::create_dir_all(&image).unwrap();
    let cases = ["brats_000", "brats_007"];
    for id in cases {
        for ch in 0..4 {
            let name = format!("{id}_{ch:04}.nii.gz");
            std::fs::copy(f.data.join("imagesTr").join(&name), image.join(&name)).unwrap();
        }
    }
    let predict = |out: &Path, extra: &[&str]| {
        let mut args = vec!["--model", s(&run), s(&image), "--out", s(out), "-q"];
        args.extend_from_slice(extra);
        let o = bin("predict", &args);
        assert!(o.status.success(), "{}", text(&o));
    };
    let (raw, pp) = (t.path().join("raw"), t.path().join("pp"));
    predict(&raw, &["--no-postprocessing"]);
    predict(&pp, &[]);
    let mut cleared = 0;
    for id in cases {
        let r = read_volume(&raw.join(format!("{id}.nii.gz"))).unwrap();
        let p = read_volume(&pp.join(format!("{id}.nii.gz"))).unwrap();
        let (want, n) = keep_largest(&r.data, &[2.0, 3.0], r.header.shape_xyz);
        assert_eq!(p.data, want, "{id}");
        eprintln!("{id}: {n} tumor-core voxels cleared by predict's postprocessing");
        cleared += n;
    }
    assert!(
        cleared > 0,
        "the model's tumor core is one piece: nothing tested"
    );
}
