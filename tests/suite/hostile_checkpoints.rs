//! Hostile nnU-Net checkpoints through `predict --nnunet-model`, each child under a wall-clock
//! limit and an address-space limit (an allocation sized by a hostile field, a stack overflow
//! or a panic fails the test): deeply nested and memo-doubling pickles, tensors claiming 1024^4
//! elements, short `_rebuild_tensor_v2` argument tuples and persistent ids, NaN and infinite
//! weights, checkpoints that are a link to /dev/zero, a directory or a FIFO, and plans whose
//! network is far wider than the checkpoint's. Each is refused, naming the file and the reason.
#![cfg(unix)]

#[path = "../checkpoint_fuzz/archive.rs"]
#[allow(dead_code)] // the fuzzer's mutator uses the rest
mod archive;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A child must finish within this.
const LIMIT: Duration = Duration::from_secs(60);

const CHECKPOINT: &str = "checkpoint_final.pth";

/// `predict ARGS` bounded in time and address space: (exit code, stdout + stderr).
fn predict(args: &[&str]) -> (i32, String) {
    crate::common::bounded::bounded(env!("CARGO_BIN_EXE_predict"), args, &[], LIMIT)
}

/// A copy of the ct3d fixture's results folder under `root/name` with fold 0 only and no
/// checkpoint yet: (the results folder, its fold_0 checkpoint path).
fn results_copy(root: &Path, name: &str) -> (PathBuf, PathBuf) {
    let src = archive::results_dir("ct3d");
    let dir = root.join(name).join(src.file_name().unwrap());
    std::fs::create_dir_all(dir.join("fold_0")).unwrap();
    for f in ["plans.json", "dataset.json", "dataset_fingerprint.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let ck = dir.join("fold_0").join(CHECKPOINT);
    (dir, ck)
}

/// `predict --nnunet-model DIR` on the fixture's inputs: the refusal's exit code and text.
fn predict_with(dir: &Path, out: &Path) -> (i32, String) {
    let inputs = archive::results_dir("ct3d")
        .parent()
        .unwrap()
        .join("inputs");
    predict(&[
        "--nnunet-model",
        dir.to_str().unwrap(),
        inputs.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ])
}

#[test]
fn the_checkpoint_writer_of_these_tests_makes_checkpoints_that_read() {
    // The control: the fixture's weights rewritten by the tests' writer, unchanged.
    let t = tempfile::tempdir().unwrap();
    let (dir, ck) = results_copy(t.path(), "control");
    let params = archive::fixture_params("ct3d");
    std::fs::write(
        &ck,
        archive::checkpoint(&params, "3d_fullres", &mut |_, _, _| {}),
    )
    .unwrap();
    voxcache::infer::nnunet::model::NnunetModel::open(&dir, None, CHECKPOINT)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn hostile_checkpoints_are_refused_naming_the_file_and_the_reason() {
    let t = tempfile::tempdir().unwrap();
    for (name, bytes, words) in archive::hostile() {
        let (dir, ck) = results_copy(t.path(), name);
        std::fs::write(&ck, bytes).unwrap();
        let started = Instant::now();
        let (code, text) = predict_with(&dir, &t.path().join(format!("out-{name}")));
        assert_ne!(code, 0, "{name}: accepted\n{text}");
        assert!(
            text.contains(ck.to_str().unwrap()),
            "{name}: the file is not named:\n{text}"
        );
        for w in &words {
            assert!(text.contains(w.as_str()), "{name}: no {w:?} in:\n{text}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{name}: took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn checkpoints_that_are_not_regular_files_are_named_as_what_they_are() {
    let t = tempfile::tempdir().unwrap();
    let (dir, ck) = results_copy(t.path(), "zero");
    std::os::unix::fs::symlink("/dev/zero", &ck).unwrap();
    let (code, text) = predict_with(&dir, &t.path().join("out-zero"));
    assert_ne!(code, 0);
    assert!(
        text.contains("not a regular file: a character device (a link to /dev/zero)")
            && text.contains(ck.to_str().unwrap()),
        "{text}"
    );
    let (dir, ck) = results_copy(t.path(), "dir");
    std::fs::create_dir(&ck).unwrap();
    let (code, text) = predict_with(&dir, &t.path().join("out-dir"));
    assert_ne!(code, 0);
    assert!(text.contains("not a regular file: a directory"), "{text}");
    // A FIFO nobody writes to: opening it to read would block forever.
    let (dir, ck) = results_copy(t.path(), "fifo");
    let c = std::ffi::CString::new(ck.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (code, text) = predict_with(&dir, &t.path().join("out-fifo"));
    assert_ne!(code, 0);
    assert!(text.contains("not a regular file: a FIFO"), "{text}");
    // Missing stays "missing".
    let (dir, _) = results_copy(t.path(), "missing");
    let (code, text) = predict_with(&dir, &t.path().join("out-missing"));
    assert_ne!(code, 0);
    assert!(
        text.contains("missing: this fold has not finished training"),
        "{text}"
    );
}

#[test]
fn a_network_wider_than_the_checkpoint_is_refused_before_it_is_built() {
    // 4096 features per stage: several GB of network, for a checkpoint of 4/8/16.
    let t = tempfile::tempdir().unwrap();
    let (dir, ck) = results_copy(t.path(), "wide");
    std::fs::copy(
        archive::results_dir("ct3d").join("fold_0").join(CHECKPOINT),
        &ck,
    )
    .unwrap();
    let plans = dir.join("plans.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plans).unwrap()).unwrap();
    let kw = &mut v["configurations"]["3d_fullres"]["architecture"]["arch_kwargs"];
    let n = kw["features_per_stage"].as_array().unwrap().len();
    kw["features_per_stage"] = serde_json::json!(vec![4096; n]);
    std::fs::write(&plans, v.to_string()).unwrap();
    let (code, text) = predict_with(&dir, &t.path().join("out"));
    assert_ne!(code, 0, "{text}");
    for w in [
        "parameter encoder.stages.0.0.convs.0.conv.weight has shape [4, 1, 1, 3, 3] in the checkpoint, [4096, 1, 1, 3, 3] in the network of the plans",
        "configurations.3d_fullres.architecture.arch_kwargs.features_per_stage",
        plans.to_str().unwrap(),
        ck.to_str().unwrap(),
    ] {
        assert!(text.contains(w), "no {w:?} in:\n{text}");
    }
}
