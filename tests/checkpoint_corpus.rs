//! The checkpoint fuzzer's corpus (`tests/checkpoint_corpus/`) replayed through the fuzzer's
//! own function (`checkpoint_fuzz::Target::run`: zip archive, pickle, state dict, weights,
//! shapes against the plans' network), each input under `catch_unwind` and a counting
//! allocator (a binary of its own, for that allocator); the seeds checked to be accepted; and a
//! short fuzz run, so the suite catches what the long runs of `examples/fuzz_checkpoints.rs`
//! found once.

mod checkpoint_fuzz;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use checkpoint_fuzz::mutate::{mutate, Rng};
use checkpoint_fuzz::{alloc, seeds, Outcome, Target, MAX_PEAK};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/checkpoint_corpus")
}

/// Run one input: its outcome and this thread's peak of live bytes, or the panic message.
fn run(target: &Target, bytes: &[u8]) -> Result<(Outcome, usize), String> {
    static CAPPED: std::sync::Once = std::sync::Once::new();
    CAPPED.call_once(|| {
        // An allocation over 1 GiB aborts this binary, with its input left here.
        let _ = alloc::dump_to(&std::env::temp_dir().join("voxcache-ckfuzz-allocation.pth"));
        alloc::CAP.store(1 << 30, std::sync::atomic::Ordering::Relaxed);
    });
    alloc::running(bytes);
    let base = alloc::start();
    let o = catch_unwind(AssertUnwindSafe(|| target.run(bytes))).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })?;
    Ok((o, alloc::peak_since(base)))
}

/// Why an input's outcome is not what its name promises, if it is not.
fn against_name(name: &str, o: &Outcome) -> Option<String> {
    let ok = match name.split('-').next().unwrap_or("") {
        "refuse" => !o.accepted,
        "ok" => o.accepted,
        // Found by the fuzzer: refused or accepted, it must only not panic.
        "crash" => true,
        other => return Some(format!("unknown prefix {other:?} (refuse-, ok-, crash-)")),
    };
    (!ok).then(|| format!("{o:?}"))
}

#[test]
fn every_corpus_file_replays_without_panic_within_memory_and_as_its_name_says() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("the committed corpus")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 9, "the hand-made inputs at least: {files:?}");
    let target = Target::new();
    let mut wrong = Vec::new();
    for f in &files {
        let name = f.file_name().unwrap().to_str().unwrap();
        match run(&target, &std::fs::read(f).unwrap()) {
            Err(panic) => wrong.push(format!("{name}: panicked: {panic}")),
            Ok((_, peak)) if peak > MAX_PEAK => {
                wrong.push(format!("{name}: {} MiB live", peak >> 20))
            }
            Ok((o, _)) => wrong.extend(against_name(name, &o).map(|w| format!("{name}: {w}"))),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_handmade_inputs_are_in_the_corpus_and_refused_with_their_reason() {
    let target = Target::new();
    let reasons = checkpoint_fuzz::archive::hostile();
    for ((name, bytes), (_, _, words)) in seeds::handmade().into_iter().zip(reasons) {
        assert!(
            corpus_dir().join(&name).is_file(),
            "{name} is not committed (cargo run --example fuzz_checkpoints -- --write-handmade tests/checkpoint_corpus)"
        );
        let (o, peak) = run(&target, &bytes).unwrap_or_else(|p| panic!("{name}: panicked: {p}"));
        assert!(
            !o.accepted && peak <= MAX_PEAK,
            "{name}: {o:?}, {peak} bytes"
        );
        // The fuzzer's bounds are smaller than predict's: one of them may come first.
        let e = o.error.unwrap_or_default();
        assert!(
            words.iter().all(|w| e.contains(w.as_str())) || e.contains("(limit)"),
            "{name}: no {words:?} in {e}"
        );
    }
}

#[test]
fn every_seed_is_accepted() {
    let target = Target::new();
    for (i, s) in seeds::seeds().iter().enumerate() {
        let (o, peak) = run(&target, s).unwrap_or_else(|p| panic!("seed {i}: panicked: {p}"));
        assert!(o.accepted, "seed {i}: {o:?}");
        assert!(peak < 16 << 20, "seed {i}: {peak} bytes live");
    }
}

#[test]
fn a_short_fuzz_run_finds_nothing() {
    let target = Target::new();
    let mut pool = seeds::seeds();
    pool.extend(
        seeds::handmade()
            .into_iter()
            .map(|(_, b)| b)
            .filter(|b| seeds::mutable(b)),
    );
    let mut rng = Rng::new(20_250_101);
    let (mut read, mut accepted) = (0, 0);
    let n = 1500;
    for i in 0..n {
        let seed = &pool[rng.below(pool.len())];
        let other = &pool[rng.below(pool.len())];
        let input = mutate(&mut rng, seed, other);
        match run(&target, &input) {
            Ok((o, peak)) if peak <= MAX_PEAK => {
                read += o.read as usize;
                accepted += o.accepted as usize;
            }
            outcome => {
                let saved = std::env::temp_dir().join(format!("voxcache-ckfuzz-{i}.pth"));
                let _ = std::fs::write(&saved, &input);
                panic!(
                    "input {i}: {:?} (saved as {})",
                    outcome.map(|(_, p)| p),
                    saved.display()
                );
            }
        }
    }
    // Both sides are reached: the mutations neither break every archive nor leave them all valid.
    assert!(
        read > n / 10 && accepted > n / 50 && accepted < n,
        "{read} read, {accepted} accepted of {n}"
    );
}
