//! The trainer end to end on the bundled data: a tiny U-Net overfits one case, a run resumed
//! after a halt (in-process) or a SIGKILL (the binary) ends with the same weights as an
//! uninterrupted run, the run folder holds what the README promises, and bad input gets a
//! clear error.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use common::fixtures::bundled_cache;
use voxcache::cache::reader::CacheReader;
use voxcache::model::config::{NetworkOptions, Norm};
use voxcache::train::augment::AugmentConfig;
use voxcache::train::config::TrainConfig;
use voxcache::train::loader::{Loader, LoaderConfig};
use voxcache::train::loss::{dice_ce, one_hot};
use voxcache::train::optim::{Optimizer, OptimizerKind};
use voxcache::train::sampler::{Sampler, SamplerConfig};
use voxcache::train::trainer::{run, RunOptions};
use voxcache::train::validate::SlidingWindow;

/// A cache of the bundled data, built once for all tests (read-only to them).
fn cache() -> &'static Path {
    bundled_cache("default", &[])
}

/// A small, fast configuration.
fn tiny() -> TrainConfig {
    TrainConfig {
        network: NetworkOptions {
            patch: [8, 32, 32],
            base_channels: 4,
            max_channels: 16,
            stages: 3,
            norm: Norm::Group(2),
            ..NetworkOptions::default()
        },
        batch_size: 2,
        steps: 12,
        lr: 3e-3,
        val_every: 0,
        val_fraction: 0.0,
        checkpoint_every: 4,
        keep_last: 2,
        log_every: 2,
        workers: 2,
        ..TrainConfig::default()
    }
}

fn options(run_dir: &Path, config: TrainConfig) -> RunOptions {
    RunOptions {
        cache_dir: cache().to_path_buf(),
        run_dir: run_dir.to_path_buf(),
        resume: false,
        device: "cpu".into(),
        progress: false,
        config,
        halt_after: None,
        final_validation: true,
        benchmark: false,
        mapped_mib: None,
        blocks: Default::default(),
        batch_hashes: false,
    }
}

/// The weights of the newest checkpoint of a run.
fn final_weights(run_dir: &Path) -> HashMap<String, Vec<f32>> {
    let ck = run_dir.join("checkpoints");
    let mut steps: Vec<PathBuf> = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("step-"))
        })
        .collect();
    steps.sort();
    let last = steps.last().expect("a checkpoint");
    candle_core::safetensors::load(last.join("model.safetensors"), &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .collect()
}

#[test]
fn a_tiny_unet_overfits_one_case() {
    let reader = CacheReader::open(cache()).unwrap();
    let entry = reader.open_entry("vessels", "vessels_000").unwrap();
    let cfg = TrainConfig {
        fg_fraction: 0.5,
        ..tiny()
    };
    let dev = Device::Cpu;
    let model = cfg.network().build(1, 2, &dev).unwrap();
    let mut opt = Optimizer::new(
        model.params(),
        OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
    )
    .unwrap();
    let sampler = Sampler::new(
        std::slice::from_ref(&entry),
        vec![1.0],
        SamplerConfig {
            patch_zyx: cfg.network.patch,
            batch_size: cfg.batch_size,
            fg_fraction: cfg.fg_fraction,
            seed: 3,
            skip_class: None,
            shard: Default::default(),
        },
    )
    .unwrap();
    let mut loader = Loader::start(
        vec![entry.clone()],
        sampler,
        LoaderConfig {
            workers: 1,
            queue_depth: 2,
            augment: AugmentConfig::none(),
            skeleton: false,
            ..LoaderConfig::default()
        },
        0,
    )
    .unwrap();
    let started = Instant::now();
    let params = model.params();
    let mut losses = Vec::new();
    for _ in 0..80 {
        let (b, _) = loader.next().unwrap();
        let p = cfg.network.patch;
        let x = Tensor::from_vec(b.image, (b.batch_size, 1, p[0], p[1], p[2]), &dev).unwrap();
        let t = one_hot(&b.label, b.batch_size, 2, p, &dev).unwrap();
        let l = dice_ce(&model.forward(&x).unwrap(), &t).unwrap();
        losses.push(l.ce + l.dice_loss);
        let g = l.total.backward().unwrap();
        let grads: Vec<Tensor> = params
            .iter()
            .map(|(_, v)| g.get(v.as_tensor()).unwrap().clone())
            .collect();
        opt.step(&grads, 1e-2, Some(12.0)).unwrap();
    }
    let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = losses[losses.len() - 5..].iter().sum::<f64>() / 5.0;
    let scratch = tempfile::tempdir().unwrap();
    let v = SlidingWindow {
        model: &model,
        device: &dev,
        patch: cfg.network.patch,
        overlap: 0.5,
        batch: 2,
        classes: &voxcache::train::classes::ClassMap::new(&[0, 1].into(), None, "test").unwrap(),
        cldice_scratch: Some(scratch.path()),
    }
    .run(&[("vessels_000".to_string(), entry)])
    .unwrap();
    eprintln!(
        "overfit: loss {first:.3} -> {last:.3}, Dice {:.3}, clDice {:.3}, {:.1} s",
        v.mean_dice,
        v.mean_cldice,
        started.elapsed().as_secs_f64()
    );
    // The scratch files are unlinked at once: nothing is left behind.
    assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
    assert_eq!(v.cldice_per_class.len(), 1);
    assert!(
        v.mean_cldice > 0.6,
        "clDice on the training case {}",
        v.mean_cldice
    );
    assert!(last < first / 3.0, "loss fell only from {first} to {last}");
    assert!(
        v.mean_dice > 0.7,
        "Dice on the training case {}",
        v.mean_dice
    );
}

#[test]
fn resume_after_a_halt_gives_the_uninterrupted_weights() {
    let t = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    let full = t.path().join("full");
    let s = run(&options(&full, tiny()), &stop).unwrap();
    assert_eq!(s.steps_done, 12);

    let halted = t.path().join("halted");
    let mut o = options(&halted, tiny());
    o.halt_after = Some(6); // killed after step 6: the step-4 checkpoint is the latest
                            // A tiny limit on mapped pages: they are handed back and read again all the time, which
                            // changes the speed only, never what training sees.
    o.mapped_mib = Some(1);
    run(&o, &stop).unwrap();
    o.halt_after = None;
    o.resume = true;
    let s = run(&o, &stop).unwrap();
    assert_eq!((s.start_step, s.steps_done), (4, 12));
    assert_eq!(final_weights(&full), final_weights(&halted));

    // The run folder: metrics for every logged step once, curves, at most keep_last + best.
    let log = std::fs::read_to_string(halted.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("\"train\""))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, vec![2, 4, 6, 8, 10, 12], "{log}");
    assert!(halted.join("curves.png").is_file());
    let kept = std::fs::read_dir(halted.join("checkpoints"))
        .unwrap()
        .count();
    assert!(kept <= 3, "{kept} checkpoint folders");
}

#[test]
fn skeleton_recall_trains_logs_its_term_and_resumes_exactly() {
    let t = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    let mut cfg = tiny();
    cfg.loss.skeleton_recall = 1.0;
    cfg.fg_fraction = 1.0; // every patch on a vessel, so every batch has a skeleton
    let full = t.path().join("full");
    let s = run(&options(&full, cfg.clone()), &stop).unwrap();
    assert_eq!(s.steps_done, 12);
    let log = std::fs::read_to_string(full.join("metrics.jsonl")).unwrap();
    let terms: Vec<f64> = log
        .lines()
        .filter(|l| l.contains("\"train\""))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["skeleton_recall_loss"]
                .as_f64()
                .expect("the term is logged")
        })
        .collect();
    assert_eq!(terms.len(), 6);
    assert!(terms.iter().all(|v| (0.0..=1.0).contains(v)), "{terms:?}");
    // The same run without the term ends elsewhere; with it, a halted and resumed run ends
    // where the uninterrupted one did (the skeletons are a function of the batch).
    let plain = t.path().join("plain");
    run(&options(&plain, tiny()), &stop).unwrap();
    assert_ne!(final_weights(&full), final_weights(&plain));
    let halted = t.path().join("halted");
    let mut o = options(&halted, cfg);
    o.halt_after = Some(6);
    run(&o, &stop).unwrap();
    o.halt_after = None;
    o.resume = true;
    run(&o, &stop).unwrap();
    assert_eq!(final_weights(&full), final_weights(&halted));
}

#[test]
fn resume_with_gradient_accumulation_and_sgd_gives_the_uninterrupted_weights() {
    let t = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    let cfg = TrainConfig {
        steps: 6,
        accumulate: 2,
        batch_size: 1,
        optimizer: voxcache::train::config::OptimizerName::Sgd,
        lr: 1e-2,
        checkpoint_every: 2,
        ..tiny()
    };
    let full = t.path().join("full");
    run(&options(&full, cfg.clone()), &stop).unwrap();
    let halted = t.path().join("halted");
    let mut o = options(&halted, cfg);
    o.halt_after = Some(3);
    run(&o, &stop).unwrap();
    o.halt_after = None;
    o.resume = true;
    let s = run(&o, &stop).unwrap();
    assert_eq!((s.start_step, s.steps_done), (2, 6));
    assert_eq!(final_weights(&full), final_weights(&halted));
}

#[test]
fn validation_reports_dice_and_keeps_the_best() {
    let t = tempfile::tempdir().unwrap();
    let cfg = TrainConfig {
        steps: 6,
        val_every: 3,
        val_fraction: 0.2,
        ..tiny()
    };
    let s = run(&options(t.path(), cfg), &AtomicBool::new(false)).unwrap();
    assert_eq!(s.val_cases, 2);
    let v = s.last_validation.expect("validation ran");
    assert_eq!(v.dice_per_class.len(), 1);
    assert_eq!(v.dice_per_case.len(), 2);
    assert!((0.0..=1.0).contains(&v.mean_dice), "{v:?}");
    assert!(t
        .path()
        .join("checkpoints/best/model.safetensors")
        .is_file());
    let log = std::fs::read_to_string(t.path().join("metrics.jsonl")).unwrap();
    assert_eq!(
        log.lines().filter(|l| l.contains("\"val\"")).count(),
        2,
        "{log}"
    );
}

/// `fold = K` trains on nnU-Net's fold K of the cache's cases (the same cases as nnU-Net's
/// fold K: scripts/splits_check.py) and records it; a splits_final.json is used as it is, and
/// one that names a case the cache lacks is refused naming it.
#[test]
fn a_fold_trains_on_nnunets_split_or_the_given_file() {
    use voxcache::format::run::RunRecord;
    use voxcache::train::folds::{kfold_splits, FoldChoice};
    let ids: Vec<String> = (0..10).map(|i| format!("vessels_{i:03}")).collect();
    let folds = kfold_splits(&ids, 5, 12345).unwrap();
    let t = tempfile::tempdir().unwrap();
    let cfg = TrainConfig {
        steps: 1,
        fold: Some(FoldChoice::Index(3)),
        ..tiny()
    };
    let s = run(&options(t.path(), cfg.clone()), &AtomicBool::new(false)).unwrap();
    assert_eq!((s.train_cases, s.val_cases), (8, 2));
    let record: RunRecord =
        serde_json::from_str(&std::fs::read_to_string(t.path().join("run.json")).unwrap()).unwrap();
    assert_eq!(record.split, folds[3]);
    // A file of the user's: its own fold 0, then one naming a case that is not there.
    let file = t.path().join("splits_final.json");
    let mine = serde_json::json!([{"train": &ids[2..], "val": &ids[..2]}]);
    std::fs::write(&file, mine.to_string()).unwrap();
    let own = TrainConfig {
        fold: Some(FoldChoice::Index(0)),
        splits: Some(file.clone()),
        ..cfg.clone()
    };
    let r2 = t.path().join("own");
    let s = run(&options(&r2, own.clone()), &AtomicBool::new(false)).unwrap();
    assert_eq!((s.train_cases, s.val_cases), (8, 2));
    let bad = serde_json::json!([{"train": &ids[1..], "val": ["vessels_000", "ghost"]}]);
    std::fs::write(&file, bad.to_string()).unwrap();
    let e = run(
        &options(&t.path().join("bad"), own),
        &AtomicBool::new(false),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("ghost") && e.contains("splits_final.json"),
        "{e}"
    );
}

/// nnU-Net's residual encoder (`encoder = "residual"`, as the ResEnc plans set it) trains,
/// resumes to the same weights and predicts from its run folder.
#[test]
fn a_residual_encoder_trains_resumes_and_predicts() {
    use voxcache::model::config::Encoder;
    let residual = TrainConfig {
        network: NetworkOptions {
            encoder: Encoder::Residual,
            features: vec![4, 8, 16],
            blocks: vec![1, 2, 2],
            decoder_blocks: vec![1, 1],
            ..tiny().network
        },
        ..tiny()
    };
    let t = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    let full = t.path().join("full");
    run(&options(&full, residual.clone()), &stop).unwrap();
    let halted = t.path().join("halted");
    let mut o = options(&halted, residual);
    o.halt_after = Some(6);
    run(&o, &stop).unwrap();
    (o.halt_after, o.resume) = (None, true);
    run(&o, &stop).unwrap();
    assert_eq!(final_weights(&full), final_weights(&halted));
    let weights = final_weights(&full);
    assert!(
        weights.contains_key("stem.conv.weight") && weights.contains_key("enc1.0.skip.conv.weight")
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(full.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["config"]["encoder"], "residual");

    let out = t.path().join("pred");
    let image =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/vessels/imagesTr/vessels_000_0000.nii.gz");
    let o = Command::new(env!("CARGO_BIN_EXE_predict"))
        .arg("--model")
        .arg(&full)
        .arg(&image)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.join("vessels_000.nii.gz").is_file());
}

fn train_cmd(run_dir: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_train"));
    c.arg("--cache-dir")
        .arg(cache())
        .arg("--out")
        .arg(run_dir)
        .args([
            "--patch",
            "8,32,32",
            "--base-channels",
            "4",
            "--stages",
            "3",
            "--norm",
            "group:2",
            "--val-fraction",
            "0",
            "--no-progress",
        ])
        .args(extra);
    c
}

#[test]
fn sigkill_and_resume_gives_the_uninterrupted_weights() {
    let t = tempfile::tempdir().unwrap();
    let full = t.path().join("full");
    const SHORT: [&str; 4] = ["--steps", "16", "--checkpoint-every", "2"];
    let out = train_cmd(&full, &SHORT).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let killed = t.path().join("killed");
    let mut child = train_cmd(&killed, &SHORT).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !killed.join("checkpoints/step-00000006").is_dir() {
        assert!(Instant::now() < deadline, "no checkpoint appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL: no handler runs
    child.wait().unwrap();
    let out = train_cmd(&killed, &[&SHORT[..], &["--resume"]].concat())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("resumed from step"), "{err}");
    assert_eq!(final_weights(&full), final_weights(&killed));
}

fn train_error(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_train"))
        .args(args)
        .arg("--no-progress")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    // The exit convention of both binaries: 2 when the command could not run.
    assert_eq!(out.status.code(), Some(2), "{args:?} should fail: {err}");
    err
}

#[test]
fn bad_input_gets_a_clear_error() {
    let t = tempfile::tempdir().unwrap();
    let missing = t.path().join("nope");
    let e = train_error(&["--cache-dir", missing.to_str().unwrap()]);
    assert!(e.contains("cache folder not found"), "{e}");

    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = train_error(&["--cache-dir", empty.to_str().unwrap()]);
    assert!(e.contains("not a voxcache cache"), "{e}");

    let c = cache().to_str().unwrap();
    let out = t.path().join("run");
    let o = out.to_str().unwrap();
    let e = train_error(&["--cache-dir", c, "--out", o, "--dataset", "liver"]);
    assert!(
        e.contains("no dataset \"liver\"") && e.contains("vessels"),
        "{e}"
    );
    let e = train_error(&["--cache-dir", c, "--out", o, "--patch", "256,512,512"]);
    assert!(e.contains("voxels"), "{e}");
    let e = train_error(&["--cache-dir", c, "--out", o, "--patch", "8,32"]);
    assert!(e.contains("three numbers"), "{e}");

    // Another format version.
    let other = t.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let m = std::fs::read_to_string(cache().join("manifest.json")).unwrap();
    let v = voxcache::format::FORMAT_VERSION;
    let m = m.replace(
        &format!("\"format_version\": {v}"),
        "\"format_version\": 99",
    );
    std::fs::write(other.join("manifest.json"), m).unwrap();
    let e = train_error(&["--cache-dir", other.to_str().unwrap()]);
    assert!(e.contains("format version 99"), "{e}");
}

#[test]
fn ctrl_c_writes_a_checkpoint_and_exits_130() {
    let t = tempfile::tempdir().unwrap();
    let run_dir = t.path().join("run");
    let child = train_cmd(&run_dir, &["--steps", "400", "--checkpoint-every", "4"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !run_dir.join("checkpoints/step-00000004").is_dir() {
        assert!(Instant::now() < deadline, "no checkpoint appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    let step: u64 = err
        .split("interrupted: checkpoint of step ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no interruption line in {err}"));
    assert!((4..400).contains(&step), "{err}");
    let dir = run_dir.join(format!("checkpoints/step-{step:08}"));
    assert!(dir.join("model.safetensors").is_file(), "{err}");
    assert!(dir.join("state.json").is_file());
}

#[test]
fn resume_never_starts_over_on_a_run_it_cannot_load() {
    let t = tempfile::tempdir().unwrap();
    let run_dir = t.path().join("run");
    let out = train_cmd(&run_dir, &["--steps", "4", "--checkpoint-every", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics = std::fs::read(run_dir.join("metrics.jsonl")).unwrap();
    let resume = |what: &str| {
        let out = train_cmd(&run_dir, &["--steps", "4", "--resume"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        // Nothing of the run was overwritten.
        let now = std::fs::read(run_dir.join("metrics.jsonl")).unwrap();
        assert_eq!(now, metrics, "{what}: metrics.jsonl changed");
        err
    };
    let steps: Vec<PathBuf> = {
        let mut v: Vec<PathBuf> = std::fs::read_dir(run_dir.join("checkpoints"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("step-")
            })
            .collect();
        v.sort();
        v
    };
    assert!(!steps.is_empty());
    let newest = steps.last().unwrap();
    // A state that claims a step past the run's end.
    let state_path = newest.join("state.json");
    let good_state = std::fs::read_to_string(&state_path).unwrap();
    let mut state: serde_json::Value = serde_json::from_str(&good_state).unwrap();
    state["step"] = 999_999.into();
    std::fs::write(&state_path, state.to_string()).unwrap();
    let err = resume("step past the end");
    assert!(
        err.contains("state.json") && err.contains("999999"),
        "{err}"
    );
    std::fs::write(&state_path, &good_state).unwrap();
    // Every checkpoint damaged: an error listing each, not a fresh start.
    for s in &steps {
        std::fs::write(s.join("model.safetensors"), b"garbage").unwrap();
    }
    let err = resume("all damaged");
    for s in &steps {
        assert!(err.contains(&s.display().to_string()), "{err}");
    }
}

#[test]
fn labels_that_skip_values_train_as_consecutive_classes_and_the_ignore_label_is_recorded() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("ds");
    std::fs::create_dir_all(data.join("imagesTr")).unwrap();
    std::fs::create_dir_all(data.join("labelsTr")).unwrap();
    // Labels 0, 1 and 4 (BraTS-like gaps) and the ignore label 9 on the first slices.
    let shape = [24usize, 24, 10];
    for (k, id) in ["p", "q"].iter().enumerate() {
        let mut img = Vec::new();
        let mut lab = Vec::new();
        for z in 0..shape[2] {
            for y in 0..shape[1] {
                for x in 0..shape[0] {
                    let l: u8 = if z < 2 {
                        9
                    } else if (6..12).contains(&x) && (6..12).contains(&y) {
                        1
                    } else if (14..20).contains(&x) && (12..18).contains(&y) {
                        4
                    } else {
                        0
                    };
                    lab.push(l);
                    img.push((l as i16) * 40 + ((x * 7 + y * 3 + z + k) % 11) as i16);
                }
            }
        }
        common::Nii::new(shape, [1.0; 3], &img, false)
            .write(&data.join(format!("imagesTr/{id}_0000.nii.gz")));
        common::Nii::new(shape, [1.0; 3], &lab, false)
            .write(&data.join(format!("labelsTr/{id}.nii.gz")));
    }
    std::fs::write(
        data.join("dataset.json"),
        r#"{"channel_names": {"0": "MRI"},
            "labels": {"background": 0, "core": 1, "edge": 4, "ignore": 9}}"#,
    )
    .unwrap();
    let cache = t.path().join("cache");
    let o = common::fixtures::prep(&[
        "build-cache",
        data.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", common::fixtures::stderr(&o));
    let run_dir = t.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_train"))
        .arg("--cache-dir")
        .arg(&cache)
        .arg("--out")
        .arg(&run_dir)
        .args([
            "--patch",
            "8,16,16",
            "--base-channels",
            "4",
            "--stages",
            "2",
            "--steps",
            "3",
            "--val-fraction",
            "0.5",
            "--val-every",
            "3",
            "--no-progress",
        ])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("3 classes: background (0), core (1), edge (4); label 9 ignored"),
        "{text}"
    );
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["num_classes"], 3);
    assert_eq!(run["ignore_label"], 9);
    let values: Vec<u64> = run["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["value"].as_u64().unwrap())
        .collect();
    assert_eq!(values, [0, 1, 4]);
    // Dice is reported by class name.
    let dice_line = text
        .lines()
        .find(|l| l.starts_with("validation Dice"))
        .unwrap_or_default();
    assert!(
        dice_line.contains("core ") && dice_line.contains("edge "),
        "{text}"
    );
    // Validation Dice has one entry per foreground class.
    let log = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    let val = log
        .lines()
        .find(|l| l.contains("\"val\""))
        .expect("a validation record");
    let v: serde_json::Value = serde_json::from_str(val).unwrap();
    assert_eq!(
        v["dice_per_class"].as_array().map(|a| a.len()),
        Some(2),
        "{val}"
    );
}

#[test]
fn benchmark_times_steps_and_keeps_no_run_folder() {
    let t = tempfile::tempdir().unwrap();
    let run_dir = t.path().join("run");
    // --out is refused: a benchmark keeps no run folder.
    let out = train_cmd(&run_dir, &["--benchmark", "3"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("--out does not apply to train --benchmark"),
        "{said}"
    );
    // Without it, from an empty folder (a run would go to runs/ there).
    let work = t.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_train"))
        .arg("--cache-dir")
        .arg(cache())
        .args([
            "--patch",
            "8,32,32",
            "--base-channels",
            "4",
            "--stages",
            "3",
        ])
        .args(["--norm", "group:2", "--val-fraction", "0", "--no-progress"])
        .args(["--benchmark", "3"])
        .current_dir(&work)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    for line in [
        "step time",
        "patches/s",
        "data wait",
        "peak memory",
        "a run of",
    ] {
        assert!(stdout.contains(line), "{line} missing:\n{stdout}");
    }
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "--benchmark must not create a run folder"
    );

    // The library report: 3 measured steps of 2 patches, plausible rates.
    let mut opts = options(&run_dir, tiny());
    opts.progress = false;
    let r = voxcache::train::benchmark::benchmark(&opts, 3, &AtomicBool::new(false)).unwrap();
    assert_eq!(r.steps, 3);
    assert!(r.step_s > 0.0 && r.max_step_s >= r.step_s, "{r:?}");
    assert!(
        r.patches_per_s > 0.0 && (0.0..=1.0).contains(&r.data_wait_frac),
        "{r:?}"
    );
    assert_eq!(r.gpu_peak_mb, None);
    assert!(!run_dir.exists());

    // bf16 on the CPU: bf16 convolution kernels where the CPU has AVX512-BF16, the f32 ones on
    // widened values elsewhere; the steps run and learn nothing undefined.
    let mut bf = tiny();
    bf.network.precision = voxcache::model::config::Precision::Bf16;
    let opts = options(&run_dir, bf);
    let r = voxcache::train::benchmark::benchmark(&opts, 2, &AtomicBool::new(false)).unwrap();
    assert!(r.steps == 2 && r.step_s > 0.0, "{r:?}");
    // Validations with no case held out would do nothing: refused, naming the option.
    let e = train_error(&[
        "--cache-dir",
        cache().to_str().unwrap(),
        "--out",
        t.path().join("nv").to_str().unwrap(),
        "--val-fraction",
        "0",
        "--val-every",
        "5",
    ]);
    assert!(e.contains("--val-every 5") && e.contains("held out"), "{e}");
    assert!(!t.path().join("nv").exists());
    let e = train_error(&["--precision", "f16"]);
    assert!(e.contains("loss scaling"), "{e}");
}
