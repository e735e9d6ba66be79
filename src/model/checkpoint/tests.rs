//! Checkpoints written, loaded, pruned, marked best and checked against their hashes.

use super::*;

fn state(step: u64) -> TrainState {
    TrainState {
        step,
        optimizer_steps: step / 2,
        seed: 42,
        best_metric: Some(0.75),
        best_step: Some(step),
        config: crate::format::training::TrainConfig::default(),
        extra: StateExtra {
            dataset: Some("vessels".into()),
            num_classes: Some(3),
            ..Default::default()
        },
    }
}

fn model(seed: f32) -> Vec<(String, Tensor)> {
    let w: Vec<f32> = (0..60).map(|i| (i as f32 * 0.731 + seed).sin()).collect();
    vec![
        (
            "enc.0.weight".into(),
            Tensor::new(w.as_slice(), &Device::Cpu)
                .unwrap()
                .reshape((3, 4, 5))
                .unwrap(),
        ),
        (
            "enc.0.bias".into(),
            Tensor::new(&[seed, f32::MIN_POSITIVE, -0.0], &Device::Cpu).unwrap(),
        ),
    ]
}

fn optimizer(seed: f32) -> HashMap<String, Tensor> {
    model(seed + 1.0)
        .into_iter()
        .map(|(n, t)| (format!("adam_m/{n}"), t))
        .collect()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn steps_on_disk(ck: &Checkpointer) -> Vec<u64> {
    ck.step_dirs()
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect()
}

#[test]
fn a_file_changed_after_the_save_is_refused_by_its_hash() {
    let run = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(run.path(), 3).unwrap();
    let dir = ck.save(&model(0.5), &optimizer(0.5), &state(7)).unwrap();
    let recorded: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join(STATE_FILE)).unwrap()).unwrap();
    assert_eq!(recorded["extra"]["files"].as_object().unwrap().len(), 2);
    // One weight's last byte changed: still a valid safetensors file.
    let path = dir.join(MODEL_FILE);
    let mut bytes = fs::read(&path).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    fs::write(&path, &bytes).unwrap();
    let err = Checkpointer::load(&dir, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("BLAKE3"),
        "{err}"
    );
    // A state naming a file outside its folder is refused, not read.
    let mut edited = recorded.clone();
    edited["extra"]["files"] = serde_json::json!({"../../etc/passwd": "00"});
    fs::write(dir.join(STATE_FILE), serde_json::to_vec(&edited).unwrap()).unwrap();
    let err = Checkpointer::load(&dir, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("not a file of its checkpoint folder"), "{err}");
    // A state without hashes (an older checkpoint) loads.
    let mut older = recorded;
    older["extra"].as_object_mut().unwrap().remove("files");
    fs::write(dir.join(STATE_FILE), serde_json::to_vec(&older).unwrap()).unwrap();
    assert_eq!(
        Checkpointer::load(&dir, &Device::Cpu).unwrap().state,
        state(7)
    );
}

#[test]
fn round_trip_is_bit_exact() {
    let run = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(run.path(), 3).unwrap();
    let m = model(0.5);
    let o = optimizer(0.5);
    let dir = ck.save(&m, &o, &state(1234)).unwrap();
    assert_eq!(dir, run.path().join("checkpoints/step-00001234"));
    let back = Checkpointer::load(&dir, &Device::Cpu).unwrap();
    assert_eq!(back.state, state(1234));
    assert_eq!(back.model.len(), m.len());
    for (name, t) in &m {
        assert_eq!(back.model[name].dims(), t.dims());
        assert_eq!(bits(&back.model[name]), bits(t));
    }
    for (name, t) in &o {
        assert_eq!(bits(&back.optimizer[name]), bits(t));
    }
    // Nothing temporary is left behind.
    let names: Vec<String> = fs::read_dir(ck.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["step-00001234".to_string()]);
}

#[test]
fn empty_optimizer_state_round_trips() {
    let run = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(run.path(), 1).unwrap();
    let dir = ck.save(&model(0.0), &HashMap::new(), &state(1)).unwrap();
    let back = Checkpointer::load(&dir, &Device::Cpu).unwrap();
    assert!(back.optimizer.is_empty());
}

#[test]
fn keeps_the_last_k_and_best_survives() {
    let run = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(run.path(), 2).unwrap();
    let mut saved = Vec::new();
    for step in [100, 200, 300, 400] {
        saved.push(
            ck.save(&model(step as f32), &optimizer(0.0), &state(step))
                .unwrap(),
        );
        if step == 200 {
            ck.mark_best(&saved[1]).unwrap();
        }
    }
    assert_eq!(steps_on_disk(&ck), vec![300, 400]);
    let best = ck.best(&Device::Cpu).unwrap().unwrap();
    assert_eq!(best.state.step, 200);
    assert_eq!(bits(&best.model["enc.0.weight"]), bits(&model(200.0)[0].1));
    // Replacing best.
    ck.mark_best(&saved[3]).unwrap();
    assert_eq!(ck.best(&Device::Cpu).unwrap().unwrap().state.step, 400);
    let latest = ck.latest(&Device::Cpu).unwrap().unwrap();
    assert_eq!(latest.state.step, 400);
    assert!(latest.skipped.is_empty());
}

#[test]
fn saving_an_older_step_keeps_it() {
    // A run resumed from an older checkpoint: the new save must survive pruning.
    let run = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(run.path(), 1).unwrap();
    ck.save(&model(0.0), &optimizer(0.0), &state(500)).unwrap();
    ck.save(&model(1.0), &optimizer(0.0), &state(300)).unwrap();
    assert_eq!(steps_on_disk(&ck), vec![300]);
    // And the same step saved twice is replaced.
    ck.save(&model(2.0), &optimizer(0.0), &state(300)).unwrap();
    let back = ck.latest(&Device::Cpu).unwrap().unwrap();
    assert_eq!(bits(&back.model["enc.0.weight"]), bits(&model(2.0)[0].1));
}

#[test]
fn latest_ignores_temp_and_incomplete_folders() {
    let run = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(run.path(), 5).unwrap();
    assert!(ck.latest(&Device::Cpu).unwrap().is_none());
    ck.save(&model(0.0), &optimizer(0.0), &state(10)).unwrap();
    // A crashed save of step 30 (temp folder with everything but state.json) and a
    // hand-made step folder without state.json.
    let tmp = ck.dir().join(".tmp-step-00000030-1-2-3");
    fs::create_dir(&tmp).unwrap();
    fs::write(tmp.join(MODEL_FILE), b"partial").unwrap();
    let incomplete = ck.dir().join(step_dir_name(20));
    fs::create_dir(&incomplete).unwrap();
    fs::copy(
        ck.dir().join("step-00000010").join(MODEL_FILE),
        incomplete.join(MODEL_FILE),
    )
    .unwrap();
    let latest = ck.latest(&Device::Cpu).unwrap().unwrap();
    assert_eq!(latest.state.step, 10);
    assert_eq!(latest.skipped.len(), 1);
    assert!(latest.skipped[0].contains("step-00000020"));
    // A bad state.json is passed over too.
    fs::write(incomplete.join(STATE_FILE), b"{\"step\": ").unwrap();
    let latest = ck.latest(&Device::Cpu).unwrap().unwrap();
    assert_eq!(latest.state.step, 10);
    assert!(
        latest.skipped[0].contains(STATE_FILE),
        "{:?}",
        latest.skipped
    );
    // A new Checkpointer deletes the stale temp folder.
    let ck = Checkpointer::new(run.path(), 5).unwrap();
    assert!(!tmp.exists());
    assert_eq!(steps_on_disk(&ck), vec![10, 20]);
}

#[test]
fn folder_moved_aside_by_a_crash_is_restored() {
    let run = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(run.path(), 5).unwrap();
    let saved = ck.save(&model(0.0), &optimizer(0.0), &state(7)).unwrap();
    ck.mark_best(&saved).unwrap();
    // Simulate a crash after `best` was moved aside and before its replacement arrived.
    let aside = ck.dir().join(unique_name(OLD_PREFIX, BEST_DIR));
    fs::rename(ck.dir().join(BEST_DIR), &aside).unwrap();
    let staged = ck.dir().join(unique_name(TMP_PREFIX, BEST_DIR));
    fs::create_dir(&staged).unwrap();
    let ck = Checkpointer::new(run.path(), 5).unwrap();
    assert!(!aside.exists() && !staged.exists());
    assert_eq!(ck.best(&Device::Cpu).unwrap().unwrap().state.step, 7);
}

#[test]
fn truncated_model_file_is_named_in_the_error() {
    let run = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(run.path(), 5).unwrap();
    let dir = ck.save(&model(0.0), &optimizer(0.0), &state(5)).unwrap();
    let file = dir.join(MODEL_FILE);
    let len = fs::metadata(&file).unwrap().len();
    let f = fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(len - 17).unwrap();
    let err = Checkpointer::load(&dir, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains(&file.display().to_string()), "{err}");
    // latest() falls back past it, saying why.
    let older = ck.save(&model(1.0), &optimizer(0.0), &state(4)).unwrap();
    let latest = ck.latest(&Device::Cpu).unwrap().unwrap();
    assert_eq!(latest.dir, older);
    assert!(latest.skipped[0].contains(MODEL_FILE));
    // A missing optimizer file is named too.
    fs::remove_file(older.join(OPTIMIZER_FILE)).unwrap();
    let err = Checkpointer::load(&older, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains(OPTIMIZER_FILE), "{err}");
}

#[test]
fn keep_last_zero_is_refused() {
    let run = tempfile::tempdir().unwrap();
    assert!(Checkpointer::new(run.path(), 0).is_err());
}

#[test]
fn when_no_checkpoint_loads_latest_refuses_and_says_why() {
    let run = tempfile::tempdir().unwrap();
    let ck = Checkpointer::new(run.path(), 5).unwrap();
    assert!(
        ck.latest(&Device::Cpu).unwrap().is_none(),
        "a new run has none"
    );
    let a = ck.save(&model(0.0), &optimizer(0.0), &state(4)).unwrap();
    let b = ck.save(&model(1.0), &optimizer(0.0), &state(8)).unwrap();
    ck.mark_best(&b).unwrap();
    fs::write(a.join(STATE_FILE), b"garbage").unwrap();
    fs::write(b.join(MODEL_FILE), b"not safetensors").unwrap();
    let err = ck.latest(&Device::Cpu).err().unwrap().to_string();
    assert!(err.contains("overwriting"), "{err}");
    for d in [&a, &b] {
        assert!(err.contains(&d.display().to_string()), "{err}");
    }
    // best/ alone is a run too: refused the same way.
    fs::remove_dir_all(&a).unwrap();
    fs::remove_dir_all(&b).unwrap();
    let err = ck.latest(&Device::Cpu).err().unwrap().to_string();
    assert!(err.contains("only best/"), "{err}");
}
