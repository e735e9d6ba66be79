//! Every option of `train --help` walked through every mode of `train`: a new run on a cache in a
//! folder and on S3, `--resume`, a fold, `--fold all`, `--validate-only` and `--benchmark`. An
//! option a mode does not take is refused (exit 2, naming it and the mode) before the cache is
//! read; one it takes is never refused ([`crate::modes_walk`]).

use crate::common::fixtures::{s, text};
use crate::modes_walk::{all, row, Fate, Row, Walk};
use voxcache::config::modes::train::{BENCHMARK, FOLD, FOLD_ALL, NO_FOLD, VALIDATE_ONLY};

/// The S3 options' refusal where the cache is a local folder.
const LOCAL: &str = "a local path";

/// The modes, in the table's order.
fn modes() -> Vec<Vec<String>> {
    let cache = ["--cache-dir", "/nonexistent/cache"];
    let with = |more: &[&str]| -> Vec<String> {
        cache.iter().chain(more).map(|a| a.to_string()).collect()
    };
    vec![
        with(&[]),
        vec!["--cache-dir".into(), "s3://bucket/prefix".into()],
        with(&["--resume"]),
        with(&["--fold", "0"]),
        with(&["--fold", "all"]),
        with(&["--fold", "0", "--validate-only"]),
        with(&["--benchmark", "1"]),
    ]
}

/// train's options: a value for each and its fate in each of [`modes`].
fn table() -> Vec<Row> {
    use Fate::{Refused as R, Used as U};
    let n = 7;
    // What the run is trained with: nothing to --validate-only.
    let training = [U, U, U, U, U, R(VALIDATE_ONLY), U];
    // Cadences of a run that --benchmark does not keep.
    let cadence = [U, U, U, U, U, R(VALIDATE_ONLY), R(BENCHMARK)];
    let s3 = [
        R(LOCAL),
        U,
        R(LOCAL),
        R(LOCAL),
        R(LOCAL),
        R(LOCAL),
        R(LOCAL),
    ];
    let mut rows = vec![
        row("--cache-dir", Some("/nonexistent/c2"), &all(U, n)),
        row("--s3-endpoint", Some("http://127.0.0.1:9"), &s3),
        row("--local-cache", Some("/nonexistent/tier"), &s3),
        row("--local-cache-gb", Some("1"), &s3),
        row(
            "--out",
            Some("/nonexistent/run"),
            &[U, U, U, U, U, U, R(BENCHMARK)],
        ),
        row(
            "--resume",
            None,
            &[U, U, U, U, U, R(VALIDATE_ONLY), R(BENCHMARK)],
        ),
        row("--device", Some("cpu"), &all(U, n)),
        row("--pipeline", Some("default"), &training),
        row("--configuration", Some("auto"), &training),
        row("--dataset", Some("vessels"), &all(U, n)),
        row("--steps", Some("5"), &training),
        row("--batch-size", Some("2"), &training),
        row("--patch", Some("16,32,32"), &training),
        row("--lr", Some("0.01"), &training),
        row("--optimizer", Some("sgd"), &training),
        row("--accumulate", Some("1"), &training),
        row("--fg-fraction", Some("0.3"), &training),
        row("--base-channels", Some("8"), &training),
        row("--stages", Some("3"), &training),
        row("--norm", Some("instance"), &training),
        row("--upsampling", Some("nearest"), &training),
        row("--precision", Some("f32"), &training),
        row("--no-augment", None, &training),
        row("--augment", Some("mirror_prob=0.5"), &training),
        row("--loss", Some("skeleton_recall=1"), &training),
        row("--deep-supervision", Some("on"), &training),
        row(
            "--val-fraction",
            Some("0.2"),
            &[U, U, U, R(FOLD), R(FOLD), R(VALIDATE_ONLY), U],
        ),
        // The fold modes give --fold themselves.
        row("--fold", Some("1"), &all(U, n)),
        row(
            "--splits",
            Some("/nonexistent/splits_final.json"),
            &[
                R(NO_FOLD),
                R(NO_FOLD),
                R(NO_FOLD),
                U,
                R(FOLD_ALL),
                R(VALIDATE_ONLY),
                R(NO_FOLD),
            ],
        ),
        row(
            "--val-every",
            Some("10"),
            &[U, U, U, U, R(FOLD_ALL), R(VALIDATE_ONLY), R(BENCHMARK)],
        ),
        row("--checkpoint-every", Some("10"), &cadence),
        row("--log-every", Some("10"), &cadence),
        row("--workers", Some("1"), &training),
        row("--seed", Some("1"), &training),
        row("--threads", Some("1"), &all(U, n)),
        row("--no-progress", None, &all(U, n)),
        row("--mapped-mib", Some("64"), &training),
        row("--batch-hashes", None, &cadence),
        row(
            "--benchmark",
            Some("1"),
            &[U, U, R(BENCHMARK), U, U, R(VALIDATE_ONLY), U],
        ),
    ];
    // The options of a fold's final validation.
    let validation = |skip: Fate| {
        [
            R(NO_FOLD),
            R(NO_FOLD),
            R(NO_FOLD),
            U,
            R(FOLD_ALL),
            skip,
            R(BENCHMARK),
        ]
    };
    rows.push(row(
        "--validation-data",
        Some("/nonexistent/data"),
        &validation(U),
    ));
    rows.push(row("--validation-mirror", None, &validation(U)));
    rows.push(row(
        "--no-fold-validation",
        None,
        &validation(R(VALIDATE_ONLY)),
    ));
    // --validate-only needs --fold (clap's requirement): given with fold 0 where the mode has
    // none; with --resume and --benchmark it is the mode that refuses them.
    rows.push(
        row(
            "--validate-only",
            None,
            &[U, U, R(VALIDATE_ONLY), U, R(FOLD_ALL), U, R(VALIDATE_ONLY)],
        )
        .with(&["--fold", "0"]),
    );
    rows
}

#[test]
fn every_train_option_is_used_or_refused_in_every_mode() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    Walk {
        exe: env!("CARGO_BIN_EXE_train"),
        sub: vec![],
        modes: modes(),
        rows: table(),
        cwd: &cwd,
        // A cache on S3 fails at once on an endpoint that is not a URL, past the mode checks.
        env: vec![("AWS_ENDPOINT_URL", "not-a-url")],
    }
    .run();
}

#[test]
fn benchmark_refuses_several_folds_and_a_list_with_a_fold_validates() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let train = |args: &[&str]| {
        let mut all = vec!["--cache-dir", s(&cache)];
        all.extend(args);
        crate::common::fixtures::run("train", &all)
    };
    // Several folds: --benchmark would time the first alone.
    let o = train(&["--benchmark", "1", "--fold", "0,1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--fold with 2 folds does not apply to train --benchmark"),
        "{}",
        text(&o)
    );
    // --fold 0,all has a fold to validate: the validation options apply.
    let o = train(&["--fold", "0,all", "--validation-mirror"]);
    assert!(!text(&o).contains("does not apply"), "{}", text(&o));
    assert!(!cache.exists());
}
