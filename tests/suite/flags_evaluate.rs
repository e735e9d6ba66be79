//! Every option of `evaluate --help` walked through its modes (PRED GT, `--cv`, `--best`): an
//! option a mode does not take is refused (exit 2, naming it and the mode) before any input is
//! read; one it takes is never refused ([`crate::modes_walk`]).

use crate::modes_walk::{all, args, empty_cwd, row, Fate, Walk};
use voxcache::config::modes::evaluate::{BEST, CV, PAIRS};

#[test]
fn every_evaluate_option_is_used_or_refused_in_every_mode() {
    use Fate::{Chooses as C, Refused as R, Used as U};
    let t = tempfile::tempdir().unwrap();
    let cwd = empty_cwd(&t);
    let rows = vec![
        row("--cv", Some("/nonexistent/runs"), &[C, C, C]),
        row("--best", Some("/nonexistent/config"), &[C, C, C]),
        row("--out", Some("/nonexistent/out"), &[R(PAIRS), U, U]),
        row("--no-postprocessing", None, &[R(PAIRS), U, R(BEST)]),
        row(
            "--dataset-json",
            Some("/nonexistent/dataset.json"),
            &[U, R(CV), R(BEST)],
        ),
        row("--labels", Some("1"), &[U, R(CV), R(BEST)]),
        row("--json", None, &all(U, 3)),
        row("--summary", Some("/nonexistent/summary.json"), &all(U, 3)),
        row("--no-cldice", None, &all(U, 3)),
        row("--jobs", Some("1"), &all(U, 3)),
        row("--quiet", None, &all(U, 3)),
    ];
    Walk {
        exe: env!("CARGO_BIN_EXE_evaluate"),
        sub: vec![],
        modes: vec![
            args(&["/nonexistent/pred", "/nonexistent/ref"]),
            args(&["--cv", "/nonexistent/runs"]),
            args(&["--best", "/nonexistent/config"]),
        ],
        rows,
        cwd: &cwd,
        env: vec![],
    }
    .run();
}
