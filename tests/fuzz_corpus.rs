//! The header fuzzer's corpus (`tests/fuzz_corpus/`) replayed through the fuzzer's own
//! function (`header_fuzz::Target::run`: header parser, plan, whole-file reader), its seeds
//! checked to be valid files, and a short fuzz run, so the suite catches what the long runs of
//! `examples/fuzz_headers.rs` found once (dev profile: integer overflow is checked here).

mod header_fuzz;
#[path = "common/nii.rs"]
#[allow(dead_code, unreachable_pub)] // the tests' writer; the fuzzer's seeds use a part of it
mod nii;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use header_fuzz::mutate::{mutate, Rng};
use header_fuzz::{seeds, Outcome, Target};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_corpus")
}

/// Why an input's outcome is not what its name promises (see `seeds::handmade`), if it is not.
fn against_name(name: &str, o: &Outcome) -> Option<String> {
    if let Some(e) = &o.disagreement {
        return Some(format!(
            "the header reader accepts it, the file reader refuses it: {e}"
        ));
    }
    let ok = match name.split('-').next().unwrap_or("") {
        "refuse" => !o.accepted,
        "header" => o.accepted && !o.decoded,
        "ok" => o.accepted && o.decoded,
        // Found by the fuzzer: refused or accepted, it must only not panic.
        "crash" => true,
        other => {
            return Some(format!(
                "unknown prefix {other:?} (refuse-, header-, ok-, crash-)"
            ))
        }
    };
    (!ok).then(|| format!("{o:?}"))
}

/// Run one input; the panic message if it panicked.
fn run(target: &Target, bytes: &[u8]) -> Result<Outcome, String> {
    catch_unwind(AssertUnwindSafe(|| target.run(bytes))).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

#[test]
fn every_corpus_file_replays_without_panic_and_as_its_name_says() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("the committed corpus")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 12, "a dozen inputs at least: {files:?}");
    let target = Target::new();
    let mut wrong = Vec::new();
    for f in &files {
        let name = f.file_name().unwrap().to_str().unwrap();
        match run(&target, &std::fs::read(f).unwrap()) {
            Err(panic) => wrong.push(format!("{name}: panicked: {panic}")),
            Ok(o) => wrong.extend(against_name(name, &o).map(|w| format!("{name}: {w}"))),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_handmade_inputs_are_in_the_corpus_and_do_as_named() {
    let target = Target::new();
    for (name, bytes) in seeds::handmade() {
        assert!(
            corpus_dir().join(name).is_file(),
            "{name} is not committed (cargo run --example fuzz_headers -- --write-handmade tests/fuzz_corpus)"
        );
        let o = run(&target, &bytes).unwrap_or_else(|p| panic!("{name}: panicked: {p}"));
        assert_eq!(against_name(name, &o), None, "{name}");
    }
}

/// The facts of a parsed header that the plan and the reader use, or the error's text.
fn facts(r: voxcache::Result<voxcache::nifti_io::HeaderInfo>) -> Result<String, String> {
    match r {
        Ok(h) => Ok(format!(
            "{:?} {:?} {:?} {} {} {} {} {}",
            h.shape_xyz,
            h.spacing_xyz,
            h.affine,
            h.affine_source,
            h.datatype,
            h.vox_offset,
            h.big_endian,
            h.gzip
        )),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn the_fuzzed_parser_is_the_file_reader() {
    // What the fuzzer calls on bytes is what `read_header` does on a file, errors included.
    let dir = tempfile::tempdir().unwrap();
    let mut inputs: Vec<(String, Vec<u8>)> = seeds::seeds()
        .into_iter()
        .enumerate()
        .map(|(i, b)| (format!("seed{i}.nii"), b))
        .collect();
    for (name, bytes) in seeds::handmade() {
        inputs.push((name.to_string(), bytes));
    }
    for (name, bytes) in inputs {
        let p = dir.path().join(&name);
        std::fs::write(&p, &bytes).unwrap();
        let from_file = facts(voxcache::nifti_io::read_header(&p));
        let from_bytes = facts(voxcache::nifti_io::parse_header_bytes(&p, &bytes));
        assert_eq!(from_bytes, from_file, "{name}");
        if let Err(e) = from_file {
            assert!(e.contains(&name), "the error does not name the file: {e}");
        }
    }
}

#[test]
fn every_seed_is_a_valid_file() {
    let target = Target::new();
    for (i, s) in seeds::seeds().iter().enumerate() {
        let o = run(&target, s).unwrap_or_else(|p| panic!("seed {i}: panicked: {p}"));
        assert!(o.accepted && o.decoded, "seed {i}: {o:?}");
    }
}

#[test]
fn a_short_fuzz_run_finds_nothing() {
    let target = Target::new();
    let mut pool = seeds::seeds();
    pool.extend(seeds::handmade().into_iter().map(|(_, b)| b));
    let mut rng = Rng::new(20_240_611);
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..20_000 {
        let seed = &pool[rng.below(pool.len())];
        let other = &pool[rng.below(pool.len())];
        let input = mutate(&mut rng, seed, other);
        match run(&target, &input) {
            Ok(Outcome {
                disagreement: Some(e),
                ..
            }) => {
                panic!("input {i}: the header reader accepts it, the file reader refuses it: {e}")
            }
            Ok(o) if o.accepted => accepted += 1,
            Ok(_) => refused += 1,
            Err(p) => {
                let saved = std::env::temp_dir().join(format!("voxcache-fuzz-{i}.bin"));
                let _ = std::fs::write(&saved, &input);
                panic!("input {i} panicked: {p} (saved as {})", saved.display());
            }
        }
    }
    // Both sides are reached: the mutations neither break every header nor leave them all valid.
    assert!(
        accepted > 2_000 && refused > 2_000,
        "{accepted} accepted, {refused} refused"
    );
}
