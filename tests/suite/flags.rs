//! Every option of `predict --help` walked through every mode of the command: an option that
//! does not apply to the chosen kind of model is refused (exit 2, naming the option and the
//! mode) before anything runs, one that applies is never refused, and an option added to the
//! binary without a place in this table fails the test until it gets one. Where one option is
//! taken as another's equivalent (`--overlap` and nnU-Net's step size, `--step-size` and our
//! overlap), the two spellings give the same segmentation.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::fixtures::{s, text};
use crate::modes_walk::help_options;

/// How an option fares in one mode.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fate {
    /// Used as given (or as its equivalent).
    Applies,
    /// Refused: it does not apply to the mode.
    Refused,
}
use Fate::{Applies, Refused};

/// predict's options: a value to give each (`None` for a switch) and its fate with a model made
/// by train, with `--nnunet-model`, and with `-d`.
fn predict_table() -> Vec<(&'static str, Option<&'static str>, [Fate; 3])> {
    vec![
        (
            "--model",
            Some("/nonexistent/run"),
            [Applies, Applies, Applies],
        ),
        (
            "--nnunet-model",
            Some("/nonexistent/nn"),
            [Applies, Applies, Applies],
        ),
        ("--dataset", Some("4"), [Applies, Applies, Applies]),
        (
            "--configuration",
            Some("3d_fullres"),
            [Refused, Refused, Applies],
        ),
        (
            "--trainer",
            Some("nnUNetTrainer"),
            [Refused, Refused, Applies],
        ),
        ("--plans", Some("nnUNetPlans"), [Refused, Refused, Applies]),
        ("--folds", Some("0"), [Refused, Applies, Applies]),
        (
            "--nnunet-checkpoint",
            Some("checkpoint_best.pth"),
            [Refused, Applies, Applies],
        ),
        ("--step-size", Some("0.5"), [Applies, Applies, Applies]),
        ("--disable-tta", None, [Applies, Applies, Applies]),
        (
            "--postprocessing",
            Some("/nonexistent/pp.json"),
            [Applies, Applies, Applies],
        ),
        ("--no-postprocessing", None, [Applies, Applies, Applies]),
        ("--checkpoint", Some("latest"), [Applies, Refused, Refused]),
        (
            "--input",
            Some("/nonexistent/in2.nii.gz"),
            [Applies, Applies, Applies],
        ),
        ("--out", Some("OUT"), [Applies, Applies, Applies]),
        ("--device", Some("cpu"), [Applies, Applies, Applies]),
        ("--overlap", Some("0.5"), [Applies, Applies, Applies]),
        ("--mirror", None, [Applies, Applies, Applies]),
        ("--batch", Some("1"), [Applies, Applies, Applies]),
        ("--precision", Some("bf16"), [Applies, Applies, Applies]),
        ("--jobs", Some("1"), [Applies, Refused, Refused]),
        ("--save-probabilities", None, [Applies, Applies, Applies]),
        (
            "--window-memory-mib",
            Some("64"),
            [Applies, Applies, Applies],
        ),
        ("--mapped-mib", Some("64"), [Applies, Refused, Refused]),
        (
            "--previous-stage",
            Some("/nonexistent/prev"),
            [Applies, Refused, Refused],
        ),
        (
            "--previous-model",
            Some("/nonexistent/prev-run"),
            [Applies, Refused, Refused],
        ),
        // The model given in the table's first mode is local: S3 options do not apply.
        (
            "--s3-endpoint",
            Some("http://127.0.0.1:9"),
            [Refused, Refused, Refused],
        ),
        (
            "--local-cache",
            Some("/nonexistent/lc"),
            [Refused, Refused, Refused],
        ),
        ("--json", None, [Applies, Applies, Applies]),
        ("--quiet", None, [Applies, Applies, Applies]),
    ]
}

#[test]
fn every_predict_option_is_used_or_refused_in_every_mode() {
    let exe = env!("CARGO_BIN_EXE_predict");
    let table = predict_table();
    let listed = help_options(exe, &[]);
    for o in &listed {
        assert!(
            table.iter().any(|(name, _, _)| name == o),
            "predict --help lists {o}, which this table does not place in its modes"
        );
    }
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let modes: [(&str, Vec<&str>); 3] = [
        ("models made by train", vec!["--model", "/nonexistent/run"]),
        ("nnU-Net models", vec!["--nnunet-model", "/nonexistent/nn"]),
        ("nnU-Net models", vec!["-d", "4", "-c", "3d_fullres"]),
    ];
    for (name, value, fates) in &table {
        if ["--model", "--nnunet-model", "--dataset", "--out"].contains(name) {
            continue; // they choose the mode or are always given
        }
        for (m, (mode, args)) in modes.iter().enumerate() {
            // -d's own -c is already given in its mode.
            if m == 2 && *name == "--configuration" {
                continue;
            }
            let mut cmd = Command::new(exe);
            cmd.args(args)
                .arg("/nonexistent/in.nii.gz")
                .args(["--out", s(&out)])
                .env("nnUNet_results", t.path().join("results"));
            cmd.arg(name);
            if let Some(v) = value {
                cmd.arg(v);
            }
            let o = cmd.output().unwrap();
            let said = text(&o);
            let refused = said.contains("does not apply to");
            match fates[m] {
                Refused => {
                    assert_eq!(o.status.code(), Some(2), "{name} in {args:?}: {said}");
                    assert!(
                        refused && said.contains(name) && said.contains(mode),
                        "{name} in {args:?} should be refused naming it and {mode:?}: {said}"
                    );
                }
                Applies => assert!(!refused, "{name} in {args:?} was refused: {said}"),
            }
            assert!(!out.exists(), "{name} in {args:?} wrote its output folder");
        }
    }
}

/// The ct3d nnU-Net fixture's results folder and one input.
fn nnunet_fixture() -> (PathBuf, PathBuf) {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nnunet_models/ct3d");
    (
        base.join("nnUNetTrainer__nnUNetPlans__3d_fullres"),
        base.join("inputs/ct_coarse_0000.nii.gz"),
    )
}

fn predict(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_predict"))
        .args(args)
        .args(["-q"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{args:?}: {}", text(&o));
    o
}

fn voxels(p: &Path) -> Vec<f32> {
    voxcache::nifti_io::read_volume(p).unwrap().data
}

#[test]
fn overlap_and_step_size_are_one_setting_in_both_kinds_of_model() {
    let t = tempfile::tempdir().unwrap();
    let (nn, input) = nnunet_fixture();
    let out = |n: &str| t.path().join(n);
    // nnU-Net's model: --overlap 0.75 is its step 0.25 (more windows than its default 0.5).
    predict(&[
        "--nnunet-model",
        s(&nn),
        s(&input),
        "--out",
        s(&out("a")),
        "--overlap",
        "0.75",
        "--no-postprocessing",
    ]);
    predict(&[
        "--nnunet-model",
        s(&nn),
        s(&input),
        "--out",
        s(&out("b")),
        "--step-size",
        "0.25",
        "--no-postprocessing",
    ]);
    let name = "ct_coarse.nii.gz";
    assert_eq!(voxels(&out("a").join(name)), voxels(&out("b").join(name)));
    // Ours: --step-size 0.75 is --overlap 0.25.
    let run = crate::predict::model();
    let vin = crate::common::fixtures::bundled_data().join("imagesTr/vessels_003_0000.nii.gz");
    predict(&[
        "--model",
        s(run),
        s(&vin),
        "--out",
        s(&out("c")),
        "--step-size",
        "0.75",
    ]);
    predict(&[
        "--model",
        s(run),
        s(&vin),
        "--out",
        s(&out("d")),
        "--overlap",
        "0.25",
    ]);
    predict(&["--model", s(run), s(&vin), "--out", s(&out("e"))]);
    let name = "vessels_003.nii.gz";
    let (c, d, e) = (
        std::fs::read(out("c").join(".vessels_003.voxcache.json")).unwrap(),
        std::fs::read(out("d").join(".vessels_003.voxcache.json")).unwrap(),
        std::fs::read(out("e").join(".vessels_003.voxcache.json")).unwrap(),
    );
    // The record of each output names its overlap: equal for the two spellings, not the default.
    assert_eq!(c, d);
    assert_ne!(c, e);
    assert_eq!(voxels(&out("c").join(name)), voxels(&out("d").join(name)));
    // One setting given two ways is refused.
    let o = Command::new(env!("CARGO_BIN_EXE_predict"))
        .args([
            "--model",
            s(run),
            s(&vin),
            "--out",
            s(&out("f")),
            "--step-size",
            "0.5",
            "--overlap",
            "0.5",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("two ways"), "{}", text(&o));
}

#[test]
fn s3_options_are_refused_where_nothing_is_on_s3() {
    let t = tempfile::tempdir().unwrap();
    let data = crate::common::fixtures::bundled_data();
    let cache = t.path().join("cache");
    let run = t.path().join("run");
    let cases: [(&str, Vec<&str>, &str); 5] = [
        (
            "prep",
            vec![
                "build-cache",
                s(&data),
                "--cache-dir",
                s(&cache),
                "--s3-endpoint",
                "http://127.0.0.1:9",
            ],
            "--s3-endpoint",
        ),
        (
            "prep",
            vec!["inspect", s(&data), "--local-cache", s(&cache)],
            "--local-cache",
        ),
        (
            "train",
            vec![
                "--cache-dir",
                s(&cache),
                "--local-cache-gb",
                "1",
                "--out",
                s(&run),
            ],
            "--local-cache-gb",
        ),
        // A build stages, it reads through no tier: its budget does not apply.
        (
            "prep",
            vec![
                "build-cache",
                s(&data),
                "--cache-dir",
                "s3://bucket/p",
                "--local-cache-gb",
                "1",
            ],
            "--local-cache-gb",
        ),
        (
            "prep",
            vec![
                "inspect",
                "--nnunet-model",
                s(&data),
                "--s3-endpoint",
                "http://127.0.0.1:9",
            ],
            "--s3-endpoint",
        ),
    ];
    for (bin, args, flag) in cases {
        let o = crate::common::fixtures::run(bin, &args);
        let said = text(&o);
        assert_eq!(o.status.code(), Some(2), "{bin} {args:?}: {said}");
        assert!(
            said.contains(&format!("{flag} does not apply")),
            "{bin} {args:?}: {said}"
        );
        assert!(!cache.exists(), "{bin} {args:?} wrote the cache");
    }
}

/// `prep inspect`'s options: a value for each (`None`: a switch) and its fate on a dataset, a
/// cache and an nnU-Net model. The build options (spacing, chunk...) are a dataset forecast's.
fn inspect_table() -> Vec<(&'static str, Option<&'static str>, [Fate; 3])> {
    let build = [Applies, Refused, Refused];
    vec![
        (
            "--nnunet-model",
            Some("/nonexistent/nn"),
            [Applies, Applies, Applies],
        ),
        (
            "--nnunet-checkpoint",
            Some("checkpoint_best.pth"),
            [Refused, Refused, Applies],
        ),
        ("--pipeline", Some("default"), build),
        ("--configuration", Some("3d_fullres"), build),
        ("--spacing", Some("auto"), build),
        ("--normalization", Some("zscore"), build),
        ("--layout", Some("raw"), build),
        ("--image-dtype", Some("float32"), build),
        ("--chunk", Some("32,128,128"), build),
        ("--shard", Some("none"), build),
        ("--compression", Some("none"), build),
        ("--compression-level", Some("3"), build),
        ("--fg-samples", Some("100"), build),
        ("--seed", Some("1"), build),
        ("--derived", Some("none"), build),
        ("--max-case-gib", Some("1"), build),
        ("--input-ram-mib", Some("64"), build),
        // The paths here are local: S3 options never apply.
        (
            "--s3-endpoint",
            Some("http://127.0.0.1:9"),
            [Refused, Refused, Refused],
        ),
        (
            "--local-cache",
            Some("/nonexistent/lc"),
            [Refused, Refused, Refused],
        ),
        ("--local-cache-gb", Some("1"), [Refused, Refused, Refused]),
        ("--json", None, [Applies, Applies, Applies]),
        ("--verify", None, [Refused, Applies, Refused]),
        ("--headers-only", None, [Applies, Refused, Refused]),
        ("--jobs", Some("1"), [Applies, Applies, Refused]),
        ("--preview", Some("case"), [Applies, Applies, Refused]),
        (
            "--out",
            Some("/nonexistent/p.png"),
            [Applies, Applies, Refused],
        ),
        ("--channel", Some("0"), [Applies, Applies, Refused]),
    ]
}

#[test]
fn every_inspect_option_is_used_or_refused_for_each_kind_of_path() {
    let exe = env!("CARGO_BIN_EXE_prep");
    let table = inspect_table();
    for o in help_options(exe, &["inspect"]) {
        assert!(
            table.iter().any(|(name, _, _)| *name == o),
            "prep inspect --help lists {o}, which this table does not place"
        );
    }
    let t = tempfile::tempdir().unwrap();
    // A cache as far as the mode goes: a folder with a manifest (this one does not parse).
    let cache = t.path().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(cache.join("manifest.json"), b"{}").unwrap();
    // A dataset of one small case.
    let data = t.path().join("data");
    crate::common::write_case(&data, "a", [12, 10, 4], [1.0, 1.0, 2.0], 1);
    let modes: [(&str, Vec<&str>); 3] = [
        ("a dataset", vec!["inspect", s(&data)]),
        ("a cache", vec!["inspect", s(&cache)]),
        (
            "--nnunet-model",
            vec!["inspect", "--nnunet-model", "/nonexistent/nn"],
        ),
    ];
    for (name, value, fates) in &table {
        if *name == "--nnunet-model" {
            continue;
        }
        for (m, (mode, args)) in modes.iter().enumerate() {
            let mut cmd = Command::new(exe);
            cmd.args(args).arg(name);
            if let Some(v) = value {
                cmd.arg(v);
            }
            // --preview and --out need each other (the refusal may name either).
            let companion = match *name {
                "--preview" => Some("--out"),
                "--out" | "--channel" => Some("--preview"),
                _ => None,
            };
            match *name {
                "--preview" => cmd.args(["--out", "/nonexistent/p.png"]),
                "--out" => cmd.args(["--preview", "case"]),
                "--channel" => cmd.args(["--preview", "case", "--out", "/nonexistent/p.png"]),
                _ => &mut cmd,
            };
            let o = cmd.output().unwrap();
            let said = text(&o);
            let refused = said.contains("does not apply to");
            match fates[m] {
                Refused => {
                    assert_eq!(o.status.code(), Some(2), "{name} on {mode}: {said}");
                    // S3 options name the path itself rather than its kind.
                    let s3 = name.starts_with("--s3") || name.starts_with("--local-cache");
                    assert!(
                        refused
                            && (said.contains(name) || companion.is_some_and(|c| said.contains(c)))
                            && (said.contains(mode) || s3),
                        "{name} on {mode} should be refused naming it: {said}"
                    );
                }
                Applies => assert!(!refused, "{name} on {mode} was refused: {said}"),
            }
        }
    }
}
