//! Every option of `prep build-cache --help` walked through its modes (a cache in a folder, on
//! S3, `--dry-run`), and those of `prep plan` and `prep synth` (one mode each): an option a
//! mode does not take is refused (exit 2, naming it and the mode) before any input is read; one
//! it takes is never refused ([`crate::modes_walk`]).

use crate::common::fixtures::s;
use crate::modes_walk::{all, args, empty_cwd, row, Fate, Walk};
use voxcache::config::modes::build::{DRY_RUN, NNUNET, S3_CACHE};

#[test]
fn every_build_cache_option_is_used_or_refused_in_every_mode() {
    use Fate::{Refused as R, Used as U};
    let t = tempfile::tempdir().unwrap();
    let cwd = empty_cwd(&t);
    let cache = t.path().join("cache");
    // No DATA: the default, data/vessels under the (empty) working folder, is not there.
    let local = args(&["--cache-dir", s(&cache)]);
    let modes = vec![
        local.clone(),
        args(&["--cache-dir", "s3://bucket/prefix"]),
        [local.clone(), args(&["--dry-run"])].concat(),
        [local, args(&["--nnunet-plans", "/nonexistent/plans.json"])].concat(),
    ];
    let lp = R("a local path");
    let s3 = [lp, U, R(DRY_RUN), lp];
    let build = all(U, 4);
    let nn = R(NNUNET);
    let labels = row("--labels", Some("/nonexistent/*_seg.nii.gz"), &build)
        .with(&["--images", "/nonexistent/*_img.nii.gz"]);
    let rows = vec![
        row("--images", Some("/nonexistent/*_img.nii.gz"), &build),
        labels,
        row("--cache-dir", Some("/nonexistent/c2"), &build),
        row("--s3-endpoint", Some("http://127.0.0.1:9"), &s3),
        row("--local-cache", Some("/nonexistent/tier"), &s3),
        // A build reads through no tier: its budget is refused even on S3.
        row(
            "--local-cache-gb",
            Some("1"),
            &[lp, R("build-cache"), lp, lp],
        ),
        row("--name", Some("x"), &build),
        row(
            "--previous-stage",
            Some("/nonexistent/prev"),
            &[U, U, U, nn],
        ),
        row("--pipeline", Some("default"), &[U, U, U, nn]),
        row("--configuration", Some("3d_fullres"), &build),
        row("--spacing", Some("auto"), &[U, U, U, nn]),
        row("--normalization", Some("zscore"), &[U, U, U, nn]),
        row("--layout", Some("raw"), &build),
        row("--image-dtype", Some("float32"), &build),
        row("--chunk", Some("32,128,128"), &build),
        row("--shard", Some("none"), &build),
        row("--compression", Some("none"), &build),
        row("--compression-level", Some("3"), &build),
        row("--fg-samples", Some("100"), &build),
        row("--seed", Some("1"), &build),
        row("--derived", Some("none"), &build),
        row("--max-case-gib", Some("1"), &build),
        row("--input-ram-mib", Some("64"), &build),
        row("--jobs", Some("1"), &build),
        row("--part", Some("0/2"), &[U, U, R(DRY_RUN), U]),
        row("--dry-run", None, &[U, U, U, R(DRY_RUN)]),
        row("--json", None, &build),
        row("--quiet", None, &[U, U, R(DRY_RUN), U]),
        row(
            "--nnunet-plans",
            Some("/nonexistent/other.json"),
            &[U, R(S3_CACHE), R(DRY_RUN), U],
        ),
    ];
    Walk {
        exe: env!("CARGO_BIN_EXE_prep"),
        sub: vec!["build-cache"],
        modes,
        rows,
        cwd: &cwd,
        env: vec![],
    }
    .run();
    assert!(!cache.exists(), "a build wrote its cache");
}

#[test]
fn every_plan_and_synth_option_is_used() {
    let t = tempfile::tempdir().unwrap();
    let cwd = empty_cwd(&t);
    Walk {
        exe: env!("CARGO_BIN_EXE_prep"),
        sub: vec!["plan"],
        modes: vec![args(&["/nonexistent/data"])],
        rows: vec![
            row("--preset", Some("resenc-m"), &[Fate::Used]),
            row("--out", Some("/nonexistent/plan.toml"), &[Fate::Used]),
            row("--gpu-memory-gb", Some("8"), &[Fate::Used]),
        ],
        cwd: &cwd,
        env: vec![],
    }
    .run();
    // synth writes its dataset: into a folder under a file, which it cannot make.
    let file = t.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let out = file.join("synthetic");
    let out = s(&out);
    let rows = vec![
        row("--out", Some(out), &[Fate::Used]),
        row("--preset", Some("small"), &[Fate::Used]).with(&["--out", out]),
        row("--seed", Some("1"), &[Fate::Used]).with(&["--out", out]),
    ];
    Walk {
        exe: env!("CARGO_BIN_EXE_prep"),
        sub: vec!["synth"],
        modes: vec![vec![]],
        rows,
        cwd: &cwd,
        env: vec![],
    }
    .run();
}
