//! `prep build-cache --nnunet-plans` against nnU-Net's own preprocessed arrays.
//! tests/fixtures/nnunet_preprocessed was made by scripts/nnunet_cache_check.py with nnunetv2
//! 2.8.1 (`--cases 4 --fixture`): two raw datasets, their plans, and what
//! `nnUNetv2_plan_and_preprocess -c 3d_fullres` wrote for each case (data, seg). One is CT-like
//! and anisotropic (z resampled apart, CT normalization, cropped zero borders); the other has
//! two MR-like channels normalized inside the nonzero mask, a transposed grid and a label voxel
//! where every channel is 0.

use std::path::{Path, PathBuf};

use crate::common::fixtures::{prep, s};
use crate::nnunet_import::parse_npy;
use voxcache::cache::reader::CacheReader;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nnunet_preprocessed")
        .join(name)
}

/// An array of nnU-Net's `.npz` of a case.
fn npz(path: &Path, key: &str) -> (Vec<usize>, Vec<f32>) {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut entry = zip.by_name(&format!("{key}.npy")).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
    parse_npy(&bytes)
}

/// `prep build-cache DATA --nnunet-plans DATA/nnUNetPlans.json --configuration C`.
fn build(data: &Path, cache: &Path, configuration: &str) -> std::process::Output {
    prep(&[
        "build-cache",
        s(data),
        "--cache-dir",
        s(cache),
        "--nnunet-plans",
        s(&data.join("nnUNetPlans.json")),
        "--configuration",
        configuration,
        "-q",
    ])
}

/// Build the dataset's cache from its plans and compare every case with nnU-Net's arrays:
/// data within 1e-4 of the channel's largest magnitude, labels equal (nnU-Net's -1 as 0).
fn matches_nnunet(name: &str) {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("raw");
    crate::common::fixtures::copy_tree(&fixture(name), &data);
    let cache = t.path().join("cache");
    let out = build(&data, &cache, "3d_fullres");
    assert!(out.status.success(), "{out:?}");
    let reader = CacheReader::open(&cache).unwrap();
    let dataset = reader.datasets()[0].to_string();
    let expected: Vec<PathBuf> = std::fs::read_dir(fixture(name).join("expected"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(expected.len() >= 4);
    let mut labelled = 0usize;
    for path in expected {
        let id = path.file_stem().unwrap().to_string_lossy().to_string();
        let (shape, want) = npz(&path, "data");
        let (seg_shape, seg) = npz(&path, "seg");
        let entry = reader.open_entry(&dataset, &id).unwrap();
        let zyx = entry.shape_zyx();
        assert_eq!(shape[1..], zyx, "{id}: the grid is nnU-Net's");
        assert_eq!(seg_shape, zyx.to_vec(), "{id}");
        assert_eq!(entry.channels(), shape[0], "{id}");
        let mut got = vec![0f32; want.len()];
        entry.read_image([0, 0, 0], zyx, &mut got).unwrap();
        let n = zyx.iter().product::<usize>();
        for c in 0..shape[0] {
            let (w, g) = (&want[c * n..][..n], &got[c * n..][..n]);
            let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
            let worst = w.iter().zip(g).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst / scale <= 1e-4,
                "{id} channel {c}: {worst} of {scale}"
            );
        }
        let mut lab = vec![0u16; n];
        entry.read_label([0, 0, 0], zyx, &mut lab).unwrap();
        let differ = lab
            .iter()
            .zip(&seg)
            .filter(|(&l, &s)| f32::from(l) != s.max(0.0))
            .count();
        assert_eq!(differ, 0, "{id}: label voxels differ from nnU-Net's");
        labelled += lab.iter().filter(|&&l| l > 0).count();
    }
    assert!(labelled > 0, "no foreground: the fixture tests nothing");
}

#[test]
fn a_cache_from_plans_is_nnunets_preprocessing_ct_anisotropic() {
    matches_nnunet("Dataset991_CacheCT");
}

#[test]
fn a_cache_from_plans_is_nnunets_preprocessing_masked_two_channels_transposed() {
    matches_nnunet("Dataset992_CacheMR");
}

#[test]
fn plans_a_cache_cannot_reproduce_are_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("raw");
    crate::common::fixtures::copy_tree(&fixture("Dataset991_CacheCT"), &data);
    let cache = t.path().join("cache");
    let run = |configuration: &str| build(&data, &cache, configuration);
    let out = run("2d");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        said.contains("nnUNetPlans.json") && said.contains("2d"),
        "{said}"
    );
    let out = run("3d_nonexistent");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!cache.join("manifest.json").exists());
}

#[test]
fn a_fold_of_such_a_cache_is_refused_before_training_and_its_model_by_predict() {
    use crate::common::fixtures::text;
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("raw");
    crate::common::fixtures::copy_tree(&fixture("Dataset991_CacheCT"), &data);
    let cache = t.path().join("cache");
    assert!(build(&data, &cache, "3d_fullres").status.success());
    let train = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_train"))
            .args(["--cache-dir", s(&cache), "--steps", "2", "--out"])
            .arg(t.path().join("run"))
            .args(extra)
            .output()
            .unwrap()
    };
    // A fold's validation would need nnU-Net's preprocessing in predict: refused up front.
    let out = train(&["--fold", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--no-fold-validation"),
        "{}",
        text(&out)
    );
    assert!(!t.path().join("run").join("checkpoints").exists());
    // Trained on every case, the model is refused by predict, naming the plans.
    let out = train(&[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_predict"))
        .args([
            "--model",
            s(&t.path().join("run")),
            s(&data.join("imagesTr")),
            "--out",
        ])
        .arg(t.path().join("pred"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("nnUNetPlans.json"), "{}", text(&out));
}
