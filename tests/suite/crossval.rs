//! nnU-Net's method end to end on the bundled data: five folds of two configurations, each
//! fold ending with its held-out cases predicted in their own geometry and scored;
//! `evaluate --cv` scores each configuration and decides its postprocessing; `evaluate --best`
//! ranks the configurations and their ensemble and names a predict command; `predict` with the
//! five folds writes segmentations in the input geometry. Then nnU-Net's postprocessing rule
//! on made-up predictions whose answer is known, and the refusals of bad input.

use crate::common;

use std::path::{Path, PathBuf};

use common::fixtures::{bundled_cache, bundled_data, run as bin, s, text};
use common::Nii;
use voxcache::evaluate::crossval::decide_postprocessing;
use voxcache::evaluate::pairs::{CasePair, Pairs};
use voxcache::evaluate::{evaluate_pairs, ClassTable};
use voxcache::format::dataset_json::LabelClass;
use voxcache::nifti_io::{read_header, read_volume};

/// Five folds of a tiny network: `seed` makes the second configuration differ, and it
/// validates only at the end (`--val-every 0`): once, in the fold validation. The cache is
/// at twice the bundled data's in-plane spacing: each fold ends by predicting its held-out
/// cases, and the outlier case (4.97 um, upsampled about 5x at the default spacing) would
/// otherwise take most of the test's time.
fn train_folds(out: &Path, seed: &str) {
    let cache = bundled_cache("coarse", &["--spacing", "2,2,3"]);
    let o = bin(
        "train",
        &[
            "--cache-dir",
            s(cache),
            "--out",
            s(out),
            "--fold",
            "0,1,2,3,4",
            "--patch",
            "8,32,32",
            "--batch-size",
            "2",
            "--steps",
            "12",
            "--base-channels",
            "4",
            "--stages",
            "3",
            "--val-every",
            if seed == "1" { "12" } else { "0" },
            "--seed",
            seed,
            "--no-progress",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        text(&o).matches("fold validation (2 cases").count(),
        5,
        "{}",
        text(&o)
    );
    // Validated during training at step 12, or (--val-every 0) only by the fold validation.
    let in_training = text(&o).matches("validation Dice").count();
    assert_eq!(in_training > 0, seed == "1", "{}", text(&o));
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn five_folds_cross_validate_ensemble_and_predict() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("plain"), t.path().join("other"));
    train_folds(&a, "1");
    train_folds(&b, "2");
    // Each fold validated its own two held-out cases, in their input geometry, probabilities
    // kept; the folds together hold every case once.
    let mut validated = Vec::new();
    for k in 0..5 {
        let fold = a.join(format!("fold_{k}"));
        let record = json(&fold.join("run.json"));
        let summary = json(&fold.join("validation/summary.json"));
        let ids: Vec<String> = summary["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect();
        let held_out: Vec<String> = serde_json::from_value(record["split"]["val"].clone()).unwrap();
        assert_eq!(ids, held_out, "fold {k}");
        for id in &ids {
            let pred = fold.join(format!("validation/{id}.nii.gz"));
            let input = bundled_data().join(format!("imagesTr/{id}_0000.nii.gz"));
            let (p, i) = (read_header(&pred).unwrap(), read_header(&input).unwrap());
            assert_eq!((p.shape_xyz, p.affine.0), (i.shape_xyz, i.affine.0), "{id}");
            assert!(fold
                .join(format!("validation/{id}.probabilities.zarr/zarr.json"))
                .is_file());
        }
        validated.extend(ids);
    }
    validated.sort();
    let all: Vec<String> = (0..10).map(|i| format!("vessels_{i:03}")).collect();
    assert_eq!(validated, all);

    // One score for the configuration, over the ten cases, and the decision beside each fold.
    let o = bin("evaluate", &["--cv", s(&a), "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let cv = json(&a.join("crossval/summary.json"));
    assert_eq!(cv["evaluated"], 10, "{}", text(&o));
    for k in 0..5 {
        assert!(a.join(format!("fold_{k}/postprocessing.json")).is_file());
    }
    // The mean over the ten cases is the mean of the folds' per-case Dice.
    let mut dice = Vec::new();
    for k in 0..5 {
        let v = json(&a.join(format!("fold_{k}/validation/summary.json")));
        for c in v["cases"].as_array().unwrap() {
            dice.push(c["classes"][0]["dice"].as_f64().unwrap_or(f64::NAN));
        }
    }
    let finite: Vec<f64> = dice.into_iter().filter(|d| d.is_finite()).collect();
    let mean = finite.iter().sum::<f64>() / finite.len() as f64;
    let cv_mean = cv["foreground_mean"]["dice"].as_f64().unwrap();
    assert!((mean - cv_mean).abs() < 1e-9, "{mean} vs {cv_mean}");

    // The best of two configurations and their ensemble.
    let best_dir = t.path().join("best");
    let summary = t.path().join("best-summary.json");
    let o = bin(
        "evaluate",
        &[
            "--best",
            s(&a),
            s(&b),
            "--out",
            s(&best_dir),
            "--summary",
            s(&summary),
            "-q",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let best = json(&best_dir.join("best.json"));
    // --summary is honoured with --best too: the same report.
    assert_eq!(json(&summary)["ranking"], best["ranking"]);
    let ranking = best["ranking"].as_array().unwrap();
    assert_eq!(ranking.len(), 3, "{best}");
    assert!(ranking.iter().any(|c| c["name"] == "plain + other"));
    let scores: Vec<f64> = ranking
        .iter()
        .map(|c| c["dice"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let command = best["predict_command"].as_str().unwrap();
    assert!(command.starts_with("predict --model"), "{command}");
    assert!(text(&o).contains("predict with: predict --model"));

    // Predict with the five folds of a configuration as one ensemble: the input's geometry.
    let out = t.path().join("pred");
    let image = bundled_data().join("imagesTr/vessels_004_0000.nii.gz");
    let mut args: Vec<String> = Vec::new();
    for k in 0..5 {
        args.push("--model".into());
        args.push(a.join(format!("fold_{k}")).display().to_string());
    }
    args.extend([image.display().to_string(), "--out".into()]);
    args.push(out.display().to_string());
    args.extend(["--json".into(), "-q".into()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = bin("predict", &refs);
    assert!(o.status.success(), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["checkpoints"].as_array().unwrap().len(), 5);
    let seg = out.join("vessels_004.nii.gz");
    let (p, i) = (read_header(&seg).unwrap(), read_header(&image).unwrap());
    assert_eq!((p.shape_xyz, p.affine.0), (i.shape_xyz, i.affine.0));

    // Bad input, refused before any work, naming the file: a fold given twice, a fold with no
    // validation, a postprocessing file naming a class the model lacks.
    let fold0 = a.join("fold_0");
    let o = bin("evaluate", &["--cv", s(&fold0), s(&fold0), "-q"]);
    assert!(
        !o.status.success() && text(&o).contains("two folds"),
        "{}",
        text(&o)
    );
    let bare = t.path().join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::copy(fold0.join("run.json"), bare.join("run.json")).unwrap();
    let o = bin("evaluate", &["--cv", s(&bare), "-q"]);
    assert!(
        !o.status.success() && text(&o).contains("validate-only"),
        "{}",
        text(&o)
    );
    let pp = t.path().join("pp.json");
    std::fs::write(
        &pp,
        r#"{"foreground": false, "classes": [7], "connectivity": "full", "dice_before": null, "dice_after": null}"#,
    )
    .unwrap();
    let o = bin(
        "predict",
        &[
            "--model",
            s(&fold0),
            "--postprocessing",
            s(&pp),
            s(&image),
            "--out",
            s(&t.path().join("never")),
        ],
    );
    assert!(
        !o.status.success() && text(&o).contains("label 7") && text(&o).contains("pp.json"),
        "{}",
        text(&o)
    );
    assert!(!t.path().join("never/vessels_004.nii.gz").exists());
}

/// A 16x16x16 label volume with the given boxes of label 1 (x, y, z ranges).
fn write_boxes(path: &Path, boxes: &[[std::ops::Range<usize>; 3]]) {
    let n = 16;
    let mut v = vec![0u8; n * n * n];
    for [xs, ys, zs] in boxes {
        for z in zs.clone() {
            for y in ys.clone() {
                for x in xs.clone() {
                    v[(z * n + y) * n + x] = 1;
                }
            }
        }
    }
    std::fs::write(path, Nii::new([n; 3], [1.0; 3], &v, false).bytes()).unwrap();
}

/// nnU-Net's rule: keeping the largest component is chosen where a stray blob lowers Dice, and
/// refused where the reference itself has two components; the filtered file keeps only the
/// largest component, in the input's header.
#[test]
fn postprocessing_keeps_the_largest_component_only_where_dice_rises() {
    let t = tempfile::tempdir().unwrap();
    let table = ClassTable::fixed(
        vec![LabelClass {
            name: "vessel".into(),
            values: vec![1],
        }],
        None,
    );
    let big = [0..8, 0..8, 0..8];
    let blob = [12..15, 12..15, 12..15];
    let case = |name: &str,
                pred: &[[std::ops::Range<usize>; 3]],
                truth: &[[std::ops::Range<usize>; 3]]| {
        let (p, r) = (
            t.path().join(format!("{name}_pred.nii.gz")),
            t.path().join(format!("{name}.nii")),
        );
        write_boxes(&p, pred);
        write_boxes(&r, truth);
        CasePair {
            id: name.into(),
            prediction: p,
            reference: Some(r),
        }
    };
    let decide = |pairs: Pairs, out: PathBuf| {
        let baseline = evaluate_pairs(pairs.clone(), &table, false, 1, false).unwrap();
        decide_postprocessing(&pairs, &table, &baseline, &out, false, 1).unwrap()
    };
    // A stray blob in the prediction: removing it raises Dice to 1.
    let stray = Pairs {
        pairs: vec![case(
            "stray",
            &[big.clone(), blob.clone()],
            std::slice::from_ref(&big),
        )],
        without_prediction: Vec::new(),
    };
    let (d, after) = decide(stray, t.path().join("cv1"));
    assert!(d.foreground && d.classes.is_empty(), "{d:?}");
    assert!(
        d.dice_before.unwrap() < 1.0 && d.dice_after == Some(1.0),
        "{d:?}"
    );
    assert_eq!(after.unwrap().foreground_mean.dice, 1.0);
    let filtered = read_volume(&t.path().join("cv1/postprocessed/stray_pred.nii.gz")).unwrap();
    let kept = filtered.data.iter().filter(|&&v| v != 0.0).count();
    assert_eq!(kept, 8 * 8 * 8);
    // Two true components: keeping one would lower Dice, so nothing is kept.
    let two = Pairs {
        pairs: vec![case("two", &[big.clone(), blob.clone()], &[big, blob])],
        without_prediction: Vec::new(),
    };
    let (d, after) = decide(two, t.path().join("cv2"));
    assert!(
        !d.foreground && d.classes.is_empty() && after.is_none(),
        "{d:?}"
    );
}
