//! build-cache end to end: content keys, incremental rebuilds, atomicity, reproducibility and
//! bad inputs, through the real `prep` binary.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixtures::{build_report, bundled_data, entry_dirs, prep, stderr};
use common::{tree_hashes, write_case, Nii};

/// The failed cases of a build report: id -> error message.
fn failures(r: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["outcome"]["status"] == "failed")
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["outcome"]["error"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn count(report: &serde_json::Value, what: &str) -> u64 {
    report[what].as_u64().unwrap_or(u64::MAX)
}

/// Three small cases with different spacings.
fn dataset(dir: &Path) -> PathBuf {
    let d = dir.join("ds");
    write_case(&d, "a", [20, 18, 6], [1.0, 1.0, 3.0], 1);
    write_case(&d, "b", [16, 16, 9], [0.5, 0.5, 2.0], 2);
    write_case(&d, "c", [12, 14, 5], [2.0, 2.0, 3.0], 3);
    d
}

#[test]
fn rebuild_is_a_no_op_and_bytes_are_reproducible() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    let (c1, c2) = (t.path().join("c1"), t.path().join("c2"));
    let (o, r) = build_report(&data, &c1, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        (count(&r, "built"), count(&r, "cached"), count(&r, "failed")),
        (3, 0, 0)
    );
    let before = tree_hashes(&c1.join("entries"));

    let (o, r) = build_report(&data, &c1, &[]);
    assert!(o.status.success());
    assert_eq!((count(&r, "built"), count(&r, "cached")), (0, 3));
    assert_eq!(
        tree_hashes(&c1.join("entries")),
        before,
        "a rebuild must not touch entries"
    );

    // A second cache built from scratch holds the very same bytes.
    let (o, _) = build_report(&data, &c2, &["-j", "1"]);
    assert!(o.status.success());
    assert_eq!(tree_hashes(&c2.join("entries")), before);
}

#[test]
fn sharded_and_compressed_builds_are_reproducible_too() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    for flags in [
        &["--chunk", "4,8,8", "--shard", "8,16,16"][..],
        &["--compression", "zstd"][..],
        &["--compression", "blosc", "--image-dtype", "float16"][..],
    ] {
        let (c1, c2) = (t.path().join("s1"), t.path().join("s2"));
        let _ = std::fs::remove_dir_all(&c1);
        let _ = std::fs::remove_dir_all(&c2);
        let (o, _) = build_report(&data, &c1, flags);
        assert!(o.status.success(), "{flags:?}: {}", stderr(&o));
        let (o, _) = build_report(&data, &c2, flags);
        assert!(o.status.success());
        assert_eq!(
            tree_hashes(&c1.join("entries")),
            tree_hashes(&c2.join("entries")),
            "{flags:?}"
        );
    }
}

#[test]
fn a_changed_parameter_makes_new_entries_and_a_changed_file_rebuilds_one_case() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    let cache = t.path().join("cache");
    let (_, r) = build_report(&data, &cache, &[]);
    assert_eq!(count(&r, "built"), 3);
    let (_, r) = build_report(&data, &cache, &["--normalization", "zscore"]);
    assert_eq!((count(&r, "built"), count(&r, "cached")), (3, 0));
    assert_eq!(entry_dirs(&cache).len(), 6);
    let (_, r) = build_report(&data, &cache, &["--spacing", "1,1,2"]);
    assert_eq!(count(&r, "built"), 3);
    // Back to the first parameters: all cached.
    let (_, r) = build_report(&data, &cache, &[]);
    assert_eq!((count(&r, "built"), count(&r, "cached")), (0, 3));
    // Touch one input's bytes: only that case is rebuilt.
    write_case(&data, "b", [16, 16, 9], [0.5, 0.5, 2.0], 99);
    let (_, r) = build_report(&data, &cache, &[]);
    assert_eq!((count(&r, "built"), count(&r, "cached")), (1, 2));
    let built: Vec<&str> = r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["outcome"]["status"] == "built")
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(built, vec!["b"]);
}

#[test]
fn a_build_killed_before_commit_leaves_nothing_that_looks_complete() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    let cache = t.path().join("cache");
    let out = Command::new(env!("CARGO_BIN_EXE_prep"))
        .args([
            "build-cache",
            data.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
            "-q",
        ])
        .env("VOXCACHE_FAILPOINT", "after-write")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the failpoint must kill the build");
    assert!(
        entry_dirs(&cache).is_empty(),
        "no entry may appear before its commit"
    );
    assert!(!cache.join("manifest.json").exists());
    let leftovers = std::fs::read_dir(cache.join("tmp")).unwrap().count();
    assert!(
        leftovers >= 1,
        "the killed build leaves its temporary folder"
    );

    let (o, r) = build_report(&data, &cache, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(count(&r, "built"), 3);
    assert!(stderr(&o).contains("stale temporary entry"));
    assert_eq!(std::fs::read_dir(cache.join("tmp")).unwrap().count(), 0);
}

#[test]
fn the_forecast_is_what_gets_written() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    let cache = t.path().join("cache");
    let (_, plan) = build_report(&data, &cache, &["--dry-run", "--spacing", "0.7,0.9,1.3"]);
    assert!(!cache.exists(), "a dry run writes nothing");
    let (_, r) = build_report(&data, &cache, &["--spacing", "0.7,0.9,1.3"]);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.join("manifest.json")).unwrap()).unwrap();
    let cases = &manifest["datasets"]["ds"]["cases"];
    for p in plan["plans"].as_array().unwrap() {
        let id = p["id"].as_str().unwrap();
        let xyz: Vec<u64> = p["out_shape_xyz"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let zyx: Vec<u64> = cases[id]["out_shape_zyx"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(zyx, vec![xyz[2], xyz[1], xyz[0]], "{id}");
        let entry = cache.join(cases[id]["entry"].as_str().unwrap());
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(entry.join("image/zarr.json")).unwrap()).unwrap();
        let shape: Vec<u64> = meta["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        // (c, z, y, x): one channel.
        assert_eq!(shape[..], [&[1u64][..], &zyx[..]].concat()[..]);
    }
    assert_eq!(count(&r, "built"), 3);
}

#[test]
fn the_dry_run_prints_the_forecast_inspect_prints() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    let d = data.to_str().unwrap();
    let cache = t.path().join("cache");
    let c = cache.to_str().unwrap();
    let flags = ["--spacing", "0.7,0.9,1.3", "--pipeline", "compact"];
    let dry = prep(
        &[
            &["build-cache", d, "--cache-dir", c, "--dry-run"][..],
            &flags,
        ]
        .concat(),
    );
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(!cache.exists(), "a dry run writes nothing");
    let inspect = prep(&[&["inspect", d, "--headers-only"][..], &flags].concat());
    assert!(inspect.status.success(), "{}", stderr(&inspect));
    let dry = String::from_utf8_lossy(&dry.stdout);
    let inspect = String::from_utf8_lossy(&inspect.stdout);
    let forecast = &inspect[inspect.find("forecast at").expect("a forecast")..];
    let forecast = &forecast[..forecast.find("\nproblems").unwrap_or(forecast.len())];
    assert!(forecast.contains("(float16 image + label)"), "{forecast}");
    assert!(
        dry.ends_with(forecast),
        "dry run:\n{dry}\ninspect:\n{forecast}"
    );
    // The layout the build would write (the compact pipeline's), then the plan.
    assert!(
        dry.starts_with("layout packed: float16, blosc-lz4")
            && dry.contains("\ntarget spacing (x,y,z): 0.7x0.9x1.3"),
        "{dry}"
    );
}

#[test]
fn a_broken_pipeline_stops_the_job_and_is_named() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    let bad = t.path().join("mine.toml");
    std::fs::write(&bad, "chunk = [32, 128, 128]\nnormalisation = \"zscore\"\n").unwrap();
    let cache = t.path().join("cache");
    let (o, _) = build_report(&data, &cache, &["--pipeline", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("mine.toml") && e.contains("normalisation"),
        "{e}"
    );
    assert!(!cache.exists());
}

#[test]
fn bad_cases_fail_alone_with_the_file_named() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    let img = |id: &str| data.join(format!("imagesTr/{id}_0000.nii.gz"));
    let lab = |id: &str| data.join(format!("labelsTr/{id}.nii.gz"));
    // Truncated image.
    write_case(&data, "trunc", [10, 10, 4], [1.0; 3], 5);
    let bytes = std::fs::read(img("trunc")).unwrap();
    std::fs::write(img("trunc"), &bytes[..bytes.len() / 2]).unwrap();
    // Label of another shape.
    write_case(&data, "shape", [10, 10, 4], [1.0; 3], 6);
    Nii::new([10, 10, 5], [1.0; 3], &vec![0u8; 500], false).write(&lab("shape"));
    // Label with another affine.
    write_case(&data, "affine", [10, 10, 4], [1.0; 3], 7);
    Nii::new([10, 10, 4], [1.0, 1.0, 2.0], &vec![0u8; 400], false).write(&lab("affine"));
    // Label with fractional values.
    write_case(&data, "frac", [10, 10, 4], [1.0; 3], 8);
    Nii::new([10, 10, 4], [1.0; 3], &vec![0.5f32; 400], false).write(&lab("frac"));
    // Image with a NaN voxel.
    write_case(&data, "nan", [10, 10, 4], [1.0; 3], 9);
    let mut v = vec![1.0f32; 400];
    v[17] = f32::NAN;
    Nii::new([10, 10, 4], [1.0; 3], &v, false).write(&img("nan"));
    // NaN spacing.
    write_case(&data, "pixnan", [10, 10, 4], [1.0; 3], 10);
    let mut n = Nii::new([10, 10, 4], [1.0; 3], &vec![1i16; 400], false);
    n.pixdim[1] = f32::NAN;
    n.write(&img("pixnan"));

    let cache = t.path().join("cache");
    let (o, r) = build_report(&data, &cache, &[]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "any failed case makes the exit status non-zero"
    );
    assert_eq!(
        (count(&r, "built"), count(&r, "failed")),
        (3, 6),
        "{}",
        stderr(&o)
    );
    let errors = failures(&r);
    let expect = [
        ("trunc", "trunc_0000.nii.gz", "truncated"),
        ("shape", "shape", "voxels"),
        ("affine", "affine", "geometry"),
        ("frac", "frac.nii.gz", "whole numbers"),
        ("nan", "nan_0000.nii.gz", "nan"),
        ("pixnan", "pixnan_0000.nii.gz", "spacing"),
    ];
    for (id, name, needle) in expect {
        let e = &errors[id];
        assert!(
            e.contains(name) && e.to_lowercase().contains(needle),
            "{id}: {e}"
        );
    }
    // Only the good cases have entries; no temporary folder is left behind.
    assert_eq!(entry_dirs(&cache).len(), 3);
    assert_eq!(std::fs::read_dir(cache.join("tmp")).unwrap().count(), 0);
}

#[test]
fn empty_folder_and_unwritable_cache_are_clear_errors() {
    let t = tempfile::tempdir().unwrap();
    let empty = t.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = prep(&[
        "build-cache",
        empty.to_str().unwrap(),
        "--cache-dir",
        t.path().join("c").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no NIfTI images found"),
        "{}",
        stderr(&o)
    );

    let data = dataset(t.path());
    let blocker = t.path().join("a_file");
    std::fs::write(&blocker, b"x").unwrap();
    let bad_cache = blocker.join("cache");
    let o = prep(&[
        "build-cache",
        data.to_str().unwrap(),
        "--cache-dir",
        bad_cache.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("a_file"), "{}", stderr(&o));
}

#[test]
fn parts_build_disjoint_shares_that_merge_in_one_manifest() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    let cache = t.path().join("cache");
    let (_, r0) = build_report(&data, &cache, &["--part", "0/2"]);
    let (_, r1) = build_report(&data, &cache, &["--part", "1/2"]);
    assert_eq!(count(&r0, "built") + count(&r1, "built"), 3);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        manifest["datasets"]["ds"]["cases"]
            .as_object()
            .unwrap()
            .len(),
        3
    );
    let (_, r) = build_report(&data, &cache, &[]);
    assert_eq!(count(&r, "cached"), 3);
}

#[test]
fn entries_record_geometry_stats_and_a_consistent_foreground_index() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    let cache = t.path().join("cache");
    let (_, r) = build_report(&data, &cache, &["--spacing", "0.8,0.8,1.5"]);
    assert_eq!(count(&r, "built"), 3);
    for e in entry_dirs(&cache) {
        let g: serde_json::Value =
            serde_json::from_slice(&std::fs::read(e.join("zarr.json")).unwrap()).unwrap();
        let a = &g["attributes"]["voxcache"];
        assert_eq!(a["format_version"], voxcache::format::FORMAT_VERSION);
        let key = e.file_name().unwrap().to_str().unwrap();
        assert_eq!(a["key"], key);
        let classes = a["label"]["classes"].as_object().unwrap();
        assert_eq!(classes.keys().collect::<Vec<_>>(), vec!["1"]);
        let fg = &a["fg_index"]["rows_per_class"]["1"];
        let voxels = classes["1"]["voxels"].as_u64().unwrap();
        assert_eq!(fg["count"].as_u64().unwrap(), voxels.min(10_000));
        // The true spacing is s * n / m on every axis.
        let inp = &a["input"];
        let out = &a["output"];
        for ax in 0..3 {
            let s = inp["spacing_xyz"][ax].as_f64().unwrap();
            let n = inp["shape_xyz"][ax].as_f64().unwrap();
            let m = out["shape_xyz"][ax].as_f64().unwrap();
            assert!((out["spacing_xyz"][ax].as_f64().unwrap() - s * n / m).abs() < 1e-9);
        }
        // The checksums are in the attributes: the entry holds nothing but Zarr nodes.
        let sums = &a["chunk_checksums"];
        assert!(!sums["image"].as_object().unwrap().is_empty(), "{sums}");
        assert!(!e.join("voxcache_chunks.json").exists());
    }
}

/// A named pipe at `path` (mkfifo(3): there on every Unix, so never a reason to skip).
#[cfg(unix)]
fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
    assert_eq!(
        rc,
        0,
        "mkfifo {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// Unmounts the tiny filesystem even when the test fails.
struct TinyFs(PathBuf);
impl TinyFs {
    /// A 3 MB tmpfs at `dir/tiny`; the test fails, saying why, where it cannot be mounted
    /// (the tests that use it are ignored by a plain `cargo test`: they need root).
    fn mount(dir: &Path) -> TinyFs {
        let mnt = dir.join("tiny");
        std::fs::create_dir_all(&mnt).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=3m", "tmpfs"])
            .arg(&mnt)
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            mounted,
            "cannot mount a 3 MB tmpfs at {} (needs root, and mount and tmpfs)",
            mnt.display()
        );
        TinyFs(mnt)
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
#[ignore = "needs root: mounts a 3 MB tmpfs; run as root with cargo test --test build_cache -- --ignored"]
fn a_full_disk_fails_the_case_skips_the_rest_and_keeps_what_was_built() {
    let t = tempfile::tempdir().unwrap();
    let _guard = TinyFs::mount(t.path());
    let mnt = _guard.0.clone();
    let data = bundled_data();
    let cache = mnt.join("cache");
    // Uncompressed, the forecast (27 MiB) is exact: the cases that fit are built; each one
    // that does not fails alone before a byte of it is written, naming its file and the figures.
    let (o, r) = build_report(&data, &cache, &["--spacing", "0.99,0.99,2.9"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let built = count(&r, "built") as usize;
    let refused: Vec<&str> = r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["outcome"]["status"] == "failed")
        .map(|c| c["outcome"]["error"].as_str().unwrap())
        .collect();
    assert!(
        built >= 1 && !refused.is_empty() && built + refused.len() == 10,
        "{r}"
    );
    for e in &refused {
        assert!(e.contains("_0000.nii.gz") && e.contains("free"), "{e}");
    }
    assert_eq!(entry_dirs(&cache).len(), built);
    std::fs::remove_dir_all(&cache).unwrap();
    // Compressed, nothing forecasts the bytes: the disk fills during the build. Its first
    // cases fit, the 4.97 um outlier does not.
    let (o, r) = build_report(
        &data,
        &cache,
        &["--spacing", "0.99,0.99,2.9", "--compression", "zstd"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let built = count(&r, "built") as usize;
    assert!(built >= 1, "{r}");
    let cases = r["cases"].as_array().unwrap();
    let failed: Vec<&serde_json::Value> = cases
        .iter()
        .filter(|c| c["outcome"]["status"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1);
    assert!(failed[0]["outcome"]["error"]
        .as_str()
        .unwrap()
        .contains("No space left on device"));
    assert_eq!(
        cases
            .iter()
            .filter(|c| c["outcome"]["status"] == "skipped")
            .count(),
        10 - 1 - built,
        "every case after the failure is skipped"
    );
    assert!(stderr(&o).contains("disk is full"));
    assert_eq!(
        entry_dirs(&cache).len(),
        built,
        "the entries built before the disk filled are kept"
    );
    assert_eq!(
        std::fs::read_dir(cache.join("tmp")).unwrap().count(),
        0,
        "no partial entry is left"
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        manifest["datasets"]["vessels"]["cases"]
            .as_object()
            .unwrap()
            .len(),
        built
    );
}

/// An input that inflates past the disk (a gzip bomb, read through a scratch file) fails alone
/// before a byte of it is spilled, naming its file; the good case beside it is built.
#[test]
#[ignore = "needs root: mounts a 3 MB tmpfs; run as root with cargo test --test build_cache -- --ignored"]
fn a_gzip_bomb_larger_than_the_disk_fails_alone_named() {
    let t = tempfile::tempdir().unwrap();
    let _guard = TinyFs::mount(t.path());
    let mnt = _guard.0.clone();
    let data = t.path().join("data");
    write_case(&data, "good", [32, 32, 8], [1.0, 1.0, 2.0], 3);
    // 64 MiB of zeros: about 64 kB gzipped.
    let shape = [256, 256, 512];
    let zeros = vec![0i16; shape.iter().product()];
    Nii::new(shape, [1.0, 1.0, 1.0], &zeros, false).write(&data.join("imagesTr/bomb_0000.nii.gz"));
    let labels = vec![0u8; shape.iter().product()];
    Nii::new(shape, [1.0, 1.0, 1.0], &labels, false).write(&data.join("labelsTr/bomb.nii.gz"));
    let cache = mnt.join("cache");
    // Compressed: no output forecast stands in the way, so the spill is what meets the disk.
    let (o, r) = build_report(
        &data,
        &cache,
        &["--input-ram-mib", "0", "--compression", "zstd"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let cases = r["cases"].as_array().unwrap();
    let outcome = |id: &str| {
        cases
            .iter()
            .find(|c| c["id"] == id)
            .map(|c| c["outcome"].clone())
            .unwrap_or_else(|| panic!("{id} not in {r}"))
    };
    assert_eq!(outcome("good")["status"], "built", "{r}");
    let bomb = outcome("bomb");
    let e = bomb["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("bomb") && e.contains(".nii.gz") && e.contains("scratch space"),
        "{bomb}"
    );
}

#[cfg(unix)]
#[test]
fn a_named_pipe_or_a_corrupt_gzip_fails_its_case_and_nothing_hangs() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    // A named pipe where an image should be: opening it would block until a writer came.
    let pipe = data.join("imagesTr/pipe_0000.nii.gz");
    mkfifo(&pipe);
    // A .nii.gz whose gzip CRC is wrong: every voxel inflates, the check at the end fails.
    write_case(&data, "crc", [10, 10, 4], [1.0; 3], 11);
    let img = data.join("imagesTr/crc_0000.nii.gz");
    let mut bytes = std::fs::read(&img).unwrap();
    let n = bytes.len();
    bytes[n - 8] ^= 0x55;
    std::fs::write(&img, &bytes).unwrap();

    let cache = t.path().join("cache");
    let bin = env!("CARGO_BIN_EXE_prep");
    let out = Command::new("timeout")
        .args(["120", bin, "build-cache"])
        .arg(&data)
        .arg("--cache-dir")
        .arg(&cache)
        .arg("--json")
        .output()
        .unwrap();
    assert_ne!(
        out.status.code(),
        Some(124),
        "the build hung on the named pipe"
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((count(&r, "built"), count(&r, "failed")), (3, 2), "{r}");
    let error = |id: &str| {
        r["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .map(|c| c["outcome"]["error"].as_str().unwrap_or("").to_string())
            .unwrap()
    };
    let e = error("pipe");
    assert!(
        e.contains("pipe_0000.nii.gz") && e.contains("named pipe"),
        "{e}"
    );
    let e = error("crc");
    assert!(e.contains("crc_0000.nii.gz") && e.contains("gzip"), "{e}");
}

#[test]
fn a_spacing_that_makes_an_absurd_output_fails_its_case_before_writing() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    // Spacing 1000 on every axis: 10000x10000x4000 voxels, 1.8 TiB; 3.4e38: past any integer.
    for (id, pix) in [("huge", [1.0e3f32; 3]), ("max", [3.4e38, 1.0, 1.0])] {
        let n = Nii::new([10, 10, 4], pix, &vec![1i16; 400], false);
        n.write(&data.join(format!("imagesTr/{id}_0000.nii.gz")));
        let l = Nii::new([10, 10, 4], pix, &vec![0u8; 400], false);
        l.write(&data.join(format!("labelsTr/{id}.nii.gz")));
    }
    let cache = t.path().join("cache");
    let (o, r) = build_report(&data, &cache, &["--spacing", "1,1,1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!((count(&r, "built"), count(&r, "failed")), (3, 2), "{r}");
    for c in r["cases"].as_array().unwrap() {
        let e = c["outcome"]["error"].as_str().unwrap_or("");
        match c["id"].as_str().unwrap() {
            "huge" => assert!(e.contains("--max-case-gib"), "{e}"),
            "max" => assert!(e.contains("pixdim"), "{e}"),
            _ => assert_eq!(c["outcome"]["status"], "built"),
        }
    }
    // The forecast says the same without wrapping around, and the text report draws.
    let o = prep(&[
        "inspect",
        data.to_str().unwrap(),
        "--spacing",
        "1,1,1",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("inspect --json: {e}: {}", stderr(&o)));
    let out_bytes = j["dataset"]["forecast"]["out_bytes"].as_u64().unwrap();
    assert!(
        out_bytes > 1 << 40,
        "the forecast wrapped around: {out_bytes}"
    );
    let o = prep(&["inspect", data.to_str().unwrap(), "--spacing", "1,1,1"]);
    assert!(o.status.code().is_some_and(|c| c <= 1), "{}", stderr(&o));
}

#[test]
fn discovery_problems_fail_their_case_not_the_job() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    // A label with no image.
    Nii::new([10, 10, 4], [1.0; 3], &vec![0u8; 400], false)
        .write(&data.join("labelsTr/orphan.nii.gz"));
    // One case present as both .nii and .nii.gz.
    write_case(&data, "twice", [10, 10, 4], [1.0; 3], 12);
    let gz = std::fs::read(data.join("imagesTr/twice_0000.nii.gz")).unwrap();
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
    std::fs::write(data.join("imagesTr/twice_0000.nii"), raw).unwrap();
    // A file name that is not UTF-8.
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let name = std::ffi::OsStr::from_bytes(b"bad\xff_0000.nii.gz");
        std::fs::write(data.join("imagesTr").join(name), &gz).unwrap();
    }
    let cache = t.path().join("cache");
    let (o, r) = build_report(&data, &cache, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(count(&r, "built"), 3, "{r}");
    let failed = failures(&r);
    let find = |id: &str| {
        failed
            .iter()
            .find(|(i, _)| i.starts_with(id))
            .map(|(_, e)| e.clone())
            .unwrap_or_else(|| panic!("no failure for {id}: {failed:?}"))
    };
    assert!(find("orphan").contains("orphan.nii.gz"));
    let e = find("twice");
    assert!(
        e.contains("twice_0000.nii") && e.contains("two images"),
        "{e}"
    );
    #[cfg(unix)]
    assert!(find("bad").contains("UTF-8"));
}

#[test]
fn inputs_read_from_scratch_files_build_the_same_bytes_as_inputs_in_memory() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    // One case of more than 2^20 voxels: its statistics arrive in two blocks.
    write_case(&data, "d", [128, 128, 72], [1.0, 1.0, 2.0], 4);
    for flags in [
        &[][..],
        &["--normalization", "ct"][..],
        &["--chunk", "8,16,16", "--shard", "16,32,32"][..],
    ] {
        let (mem, disk) = (t.path().join("mem"), t.path().join("disk"));
        let _ = std::fs::remove_dir_all(&mem);
        let _ = std::fs::remove_dir_all(&disk);
        let (o, r) = build_report(&data, &mem, flags);
        assert!(o.status.success(), "{flags:?}: {}", stderr(&o));
        assert_eq!(count(&r, "built"), 4);
        let scratch = [flags, &["--input-ram-mib", "0"]].concat();
        let (o, r) = build_report(&data, &disk, &scratch);
        assert!(o.status.success(), "{flags:?}: {}", stderr(&o));
        assert_eq!(count(&r, "built"), 4);
        assert_eq!(
            tree_hashes(&mem.join("entries")),
            tree_hashes(&disk.join("entries")),
            "{flags:?}"
        );
        // Scratch files are unlinked when created: nothing is left in tmp/.
        let left: Vec<_> = std::fs::read_dir(disk.join("tmp")).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_large_gzip_input_builds_in_less_memory_than_its_inflated_size() {
    // 1024x1024x256 uint8: 256 MiB inflated (1 GiB as f32), well under 1 MiB gzipped.
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("big");
    std::fs::create_dir_all(data.join("imagesTr")).unwrap();
    let shape = [1024usize, 1024, 256];
    let mut vals = vec![0u8; shape.iter().product()];
    for (i, v) in vals.iter_mut().enumerate() {
        let (x, y, z) = (i % 1024, (i / 1024) % 1024, i / (1024 * 1024));
        let d2 = (x as i64 - 512).pow(2) + (y as i64 - 512).pow(2) + (z as i64 - 128).pow(2);
        *v = if d2 < 100 * 100 { 200 } else { (z % 3) as u8 };
    }
    Nii::new(shape, [1.0; 3], &vals, false).write(&data.join("imagesTr/big_0000.nii.gz"));
    drop(vals);
    let cache = t.path().join("cache");
    // The report's peak is the build's own (VmHWM): a child's rusage would include what this
    // test process held when it spawned the child.
    let (o, r) = build_report(&data, &cache, &["--spacing", "4", "--input-ram-mib", "16"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(count(&r, "built"), 1);
    let peak_mib = count(&r, "peak_rss_bytes") >> 20;
    assert!(
        peak_mib < 200,
        "peak {peak_mib} MiB for a 256 MiB input read through a scratch file"
    );
    let v = prep(&["inspect", cache.to_str().unwrap(), "--verify"]);
    assert!(v.status.success(), "{}", stderr(&v));
}

#[test]
fn a_dataset_json_is_read_and_its_labels_and_endings_are_held_to() {
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    let json = data.join("dataset.json");
    let cache = t.path().join("cache");
    // nnU-Net v2: classes 0 and 1 listed; every case builds.
    std::fs::write(
        &json,
        r#"{"channel_names": {"0": "CT"}, "labels": {"background": 0, "vessel": 1},
            "numTraining": 3, "file_ending": ".nii.gz"}"#,
    )
    .unwrap();
    let (o, r) = build_report(&data, &cache, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(count(&r, "built"), 3);
    let text = prep(&["inspect", data.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(
        out.contains("dataset.json (nnU-Net v2): channels CT; labels background 0, vessel 1"),
        "{out}"
    );
    let c = prep(&["inspect", cache.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&c.stdout).to_string();
    assert!(
        out.contains("ds: classes (dataset.json) background 0, vessel 1"),
        "{out}"
    );

    // A label value the file does not list fails that case, naming the label file.
    std::fs::write(
        &json,
        r#"{"channel_names": {"0": "CT"}, "labels": {"background": 0}, "file_ending": ".nii.gz"}"#,
    )
    .unwrap();
    let (o, r) = build_report(&data, &t.path().join("c2"), &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let f = failures(&r);
    assert_eq!(f.len(), 3, "{f:?}");
    assert!(
        f["a"].contains("labelsTr/a.nii.gz") && f["a"].contains("does not list"),
        "{f:?}"
    );
    let (o, j) = inspect_json(&data);
    assert!(o.contains("does not list"), "{j}");

    // MSD layout (value -> name) with one modality builds like the nnU-Net one (the channel
    // named CT picks the CT scheme in both).
    std::fs::write(
        &json,
        r#"{"name": "x", "modality": {"0": "CT"}, "labels": {"0": "background", "1": "vessel"},
            "training": [], "test": []}"#,
    )
    .unwrap();
    let (o, r) = build_report(&data, &cache, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(count(&r, "cached"), 3);

    // Two channels declared and one file per case: each case is refused naming the missing
    // file (and with no case left to plan from, the job stops).
    std::fs::write(
        &json,
        r#"{"channel_names": {"0": "T2", "1": "ADC"}, "labels": {"background": 0, "vessel": 1}}"#,
    )
    .unwrap();
    let (o, _) = build_report(&data, &t.path().join("c3"), &[]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    for case in ["a", "b", "c"] {
        assert!(
            e.contains(&format!("case {case}: channel file missing: "))
                && e.contains(&format!(
                    "imagesTr/{case}_0001.nii.gz (dataset.json declares 2 channels)"
                )),
            "{e}"
        );
    }
    assert!(e.contains("none of the 3 cases can be built"), "{e}");

    // A file ending that is not NIfTI stops the job before any work, naming the file.
    std::fs::write(
        &json,
        r#"{"labels": {"background": 0}, "file_ending": ".mha"}"#,
    )
    .unwrap();
    let (o, _) = build_report(&data, &t.path().join("c4"), &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("dataset.json") && stderr(&o).contains(".mha"),
        "{}",
        stderr(&o)
    );
    // And a broken one says where.
    std::fs::write(&json, "{\"labels\": ").unwrap();
    let (o, _) = build_report(&data, &t.path().join("c5"), &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("dataset.json") && stderr(&o).contains("JSON"),
        "{}",
        stderr(&o)
    );
}

/// `prep inspect DATA --json`: its stdout and stderr together, and the parsed report.
fn inspect_json(data: &Path) -> (String, serde_json::Value) {
    let o = prep(&["inspect", data.to_str().unwrap(), "--json"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (text, serde_json::from_slice(&o.stdout).unwrap_or_default())
}

#[test]
fn float16_refuses_values_beyond_its_range_and_names_the_case() {
    // 16-bit microscopy kept as it is (normalization none): 70000 does not fit a float16.
    let t = tempfile::tempdir().unwrap();
    let data = dataset(t.path());
    let vals = vec![70000.0f32; 400];
    Nii::new([10, 10, 4], [1.0; 3], &vals, false).write(&data.join("imagesTr/bright_0000.nii.gz"));
    Nii::new([10, 10, 4], [1.0; 3], &vec![0u8; 400], false)
        .write(&data.join("labelsTr/bright.nii.gz"));
    let flags = ["--normalization", "none", "--layout", "packed"];
    let (o, r) = build_report(&data, &t.path().join("packed"), &flags);
    assert!(!o.status.success());
    let failed = r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "bright")
        .unwrap();
    let error = failed["outcome"]["error"].to_string();
    assert!(
        error.contains("bright") && error.contains("float16"),
        "{failed}"
    );
    // The other cases built; float32 takes the case.
    assert!(r["built"].as_u64().unwrap() > 0);
    let (o, _) = build_report(&data, &t.path().join("raw"), &["--normalization", "none"]);
    assert!(o.status.success(), "{}", stderr(&o));
}
