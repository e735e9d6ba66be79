//! `prep inspect` end to end: the dataset fingerprint and forecast (checked against what
//! build-cache writes), the cache report and --verify, the JSON shape, the human tables (golden
//! file) and the preview PNG.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::fixtures::{build, entry_dirs, files_under, prep, prep_in, repeat_first_fg_row, text};
use common::{tree_hashes, write_case, Nii};
use serde_json::Value;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn inspect_json(path: &Path, extra: &[&str]) -> (Output, Value) {
    let mut args = vec!["inspect", s(path), "--json"];
    args.extend_from_slice(extra);
    let o = prep(&args);
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    (o, v)
}

fn xyz(v: &Value) -> [f64; 3] {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    [0, 1, 2].map(|i| a[i].as_f64().unwrap())
}

fn shape(v: &Value) -> [u64; 3] {
    let a = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    [0, 1, 2].map(|i| a[i].as_u64().unwrap())
}

fn case<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["dataset"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no case {id}"))
}

fn distinct(report: &Value) -> Vec<([f64; 3], u64)> {
    report["dataset"]["spacing"]["distinct"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (xyz(&d["spacing_xyz"]), d["count"].as_u64().unwrap()))
        .collect()
}

fn problems_of<'a>(report: &'a Value, kind: &str) -> Vec<&'a Value> {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == kind)
        .collect()
}

/// Every case's forecast output shape equals the shape build-cache wrote.
fn assert_forecast_matches_build(data: &Path, report: &Value, cache: &Path, extra: &[&str]) {
    build(data, cache, extra);
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(cache.join("manifest.json")).unwrap()).unwrap();
    let (name, ds) = manifest["datasets"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    let cases = ds["cases"].as_object().unwrap();
    assert_eq!(
        cases.len(),
        report["dataset"]["cases"].as_array().unwrap().len(),
        "{name}"
    );
    for (id, c) in cases {
        let f = shape(&case(report, id)["forecast"]["out_shape_xyz"]);
        let entry = cache.join(c["entry"].as_str().unwrap());
        let zarr: Value =
            serde_json::from_slice(&std::fs::read(entry.join("zarr.json")).unwrap()).unwrap();
        let written = shape(&zarr["attributes"]["voxcache"]["output"]["shape_xyz"]);
        assert_eq!(f, written, "case {id}");
        let z = shape(&c["out_shape_zyx"]);
        assert_eq!([z[2], z[1], z[0]], f, "case {id}");
    }
}

/// Five cases, three at the mode spacing; "e" is coarse in-plane and becomes 16x the median.
fn median_dataset(dir: &Path) -> PathBuf {
    let d = dir.join("ds");
    write_case(&d, "a", [10, 10, 8], [1.0, 1.0, 2.0], 1);
    write_case(&d, "b", [10, 10, 8], [1.0, 1.0, 2.0], 2);
    write_case(&d, "c", [10, 10, 8], [1.0, 1.0, 2.0], 3);
    write_case(&d, "d", [10, 10, 8], [0.5, 0.5, 2.0], 4);
    write_case(&d, "e", [10, 10, 8], [4.0, 4.0, 2.0], 5);
    d
}

#[test]
fn median_rule_distribution_and_outliers_are_exact() {
    let t = tempfile::tempdir().unwrap();
    let data = median_dataset(t.path());
    let (o, r) = inspect_json(&data, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(r["kind"], "dataset");
    assert_eq!(
        distinct(&r),
        vec![
            ([1.0, 1.0, 2.0], 3),
            ([0.5, 0.5, 2.0], 1),
            ([4.0, 4.0, 2.0], 1)
        ]
    );
    let sp = &r["dataset"]["spacing"];
    assert_eq!(sp["target"]["rule"], "median");
    assert_eq!(xyz(&sp["target"]["target_xyz"]), [1.0, 1.0, 2.0]);
    assert_eq!(sp["auto"]["rule"], "median");
    let x = &sp["per_axis"]["x"];
    let xs = [1.0, 1.0, 1.0, 0.5, 4.0];
    assert_eq!(x["min"], 0.5);
    assert_eq!(x["max"], 4.0);
    assert_eq!(x["p50"], 1.0);
    assert_eq!(
        x["p10"].as_f64().unwrap(),
        voxcache::prep::plan::percentile(&xs, 10.0)
    );
    assert_eq!(
        x["p90"].as_f64().unwrap(),
        voxcache::prep::plan::percentile(&xs, 90.0)
    );
    assert_eq!(sp["per_axis"]["z"]["p90"], 2.0);

    assert_eq!(
        r["dataset"]["forecast"]["outliers"],
        serde_json::json!(["e"])
    );
    for id in ["a", "b", "c", "d", "e"] {
        let f = &case(&r, id)["forecast"];
        assert_eq!(f["outlier"], id == "e", "case {id}");
    }
    assert_eq!(
        shape(&case(&r, "e")["forecast"]["out_shape_xyz"]),
        [40, 40, 8]
    );
    assert_eq!(case(&r, "e")["forecast"]["size_factor"], 16.0);
    assert_eq!(
        shape(&case(&r, "d")["forecast"]["out_shape_xyz"]),
        [5, 5, 8]
    );
    // Voxel facts: write_case labels a disc in every slice but the first.
    let a = case(&r, "a");
    assert_eq!(a["header"]["datatype"], "int16");
    assert_eq!(a["header"]["orientation"], "RAS");
    assert_eq!(a["header"]["sform_code"], 1);
    let labels = &a["label_values"];
    assert_eq!(
        labels["0"].as_u64().unwrap() + labels["1"].as_u64().unwrap(),
        800
    );
    assert!(a["intensity"]["min"].as_f64().unwrap() >= 100.0);
    assert_eq!(r["errors"], 0);

    assert_forecast_matches_build(&data, &r, &t.path().join("cache"), &[]);
}

#[test]
fn anisotropy_rule_fires_for_thick_slices_and_the_forecast_matches_the_build() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("thick");
    for i in 0..9 {
        write_case(&d, &format!("t{i}"), [64, 64, 4], [0.7, 0.7, 5.0], i);
    }
    write_case(&d, "thin", [64, 64, 4], [0.7, 0.7, 1.0], 99);
    let (o, r) = inspect_json(&d, &["--headers-only"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(r["dataset"]["voxels_read"], false);
    assert_eq!(case(&r, "t0")["intensity"], Value::Null);
    assert_eq!(
        distinct(&r),
        vec![([0.7, 0.7, 5.0], 9), ([0.7, 0.7, 1.0], 1)]
    );
    let target = &r["dataset"]["spacing"]["target"];
    assert_eq!(target["rule"], "anisotropy rule");
    let zs: Vec<f64> = (0..9).map(|_| 5.0).chain([1.0]).collect();
    let p10 = voxcache::prep::plan::percentile(&zs, 10.0);
    assert!((p10 - 4.6).abs() < 1e-9);
    assert_eq!(xyz(&target["target_xyz"]), [0.7, 0.7, p10]);
    assert_eq!(xyz(&target["median_xyz"]), [0.7, 0.7, 5.0]);
    assert!(target["reason"]
        .as_str()
        .unwrap()
        .contains("10th percentile"));
    assert_eq!(r["dataset"]["forecast"]["outliers"], serde_json::json!([]));
    assert_eq!(
        shape(&case(&r, "t0")["forecast"]["out_shape_xyz"]),
        [64, 64, 4]
    );
    assert_eq!(
        shape(&case(&r, "thin")["forecast"]["out_shape_xyz"]),
        [64, 64, 1]
    );

    assert_forecast_matches_build(&d, &r, &t.path().join("cache"), &[]);
}

#[test]
fn an_explicit_spacing_answers_what_if_and_still_shows_auto() {
    let t = tempfile::tempdir().unwrap();
    let data = median_dataset(t.path());
    let (o, r) = inspect_json(&data, &["--spacing", "2,2,4", "--pipeline", "compact"]);
    assert!(o.status.success(), "{}", text(&o));
    let sp = &r["dataset"]["spacing"];
    assert_eq!(sp["target"]["rule"], "explicit");
    assert_eq!(xyz(&sp["target"]["target_xyz"]), [2.0, 2.0, 4.0]);
    assert_eq!(xyz(&sp["auto"]["target_xyz"]), [1.0, 1.0, 2.0]);
    assert_eq!(r["dataset"]["image_dtype"], "float16");
    let a = &case(&r, "a")["forecast"];
    assert_eq!(shape(&a["out_shape_xyz"]), [5, 5, 4]);
    // float16 image + uint8 label.
    assert_eq!(a["out_bytes"], 5 * 5 * 4 * 3);
    assert_eq!(a["whole_volume_f64_bytes"], 5 * 5 * 4 * 8);

    let o = prep(&["inspect", s(&data), "--spacing", "2,2,4"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("target spacing (x,y,z): 2x2x4 (explicit: what if)"),
        "{out}"
    );
    assert!(out.contains("auto would choose: 1x1x2 by median:"), "{out}");
}

fn flip_middle_byte(p: &Path) {
    let mut b = std::fs::read(p).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0xff;
    std::fs::write(p, b).unwrap();
}

fn rel(cache: &Path, p: &Path) -> String {
    p.strip_prefix(cache).unwrap().to_string_lossy().to_string()
}

#[test]
fn verify_passes_on_a_fresh_cache_and_names_every_damaged_file() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("ds");
    write_case(&data, "a", [20, 18, 6], [1.0, 1.0, 3.0], 1);
    write_case(&data, "b", [16, 16, 9], [0.5, 0.5, 2.0], 2);
    write_case(&data, "c", [12, 14, 5], [2.0, 2.0, 3.0], 3);
    let cache = t.path().join("cache");
    build(&data, &cache, &["--chunk", "4,8,8"]);
    let before = tree_hashes(&cache);

    let (o, r) = inspect_json(&cache, &["--verify"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(r["kind"], "cache");
    let v = &r["cache"]["verify"];
    assert_eq!(v["entries"], 3);
    assert!(v["blocks_checked"].as_u64().unwrap() > 6, "{v}");
    assert_eq!(
        v["blocks_checked"],
        v["blocks_ok"].as_u64().unwrap() + v["blocks_absent"].as_u64().unwrap()
    );
    assert!(
        v["blocks_absent"].as_u64().unwrap() > 0,
        "label blocks of background are not written: {v}"
    );
    assert_eq!(v["corrupt"], 0);
    assert_eq!(v["missing"], 0);
    assert_eq!(r["errors"], 0, "{}", r["problems"]);
    let o = prep(&["inspect", s(&cache), "--verify"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        tree_hashes(&cache),
        before,
        "inspect must not write into the cache"
    );

    // Damage one file in each of the three entries.
    let entries = entry_dirs(&cache);
    assert_eq!(entries.len(), 3);
    let flipped = files_under(&entries[0].join("image/c"))[1].clone();
    flip_middle_byte(&flipped);
    let deleted = files_under(&entries[1].join("label/c"))[0].clone();
    std::fs::remove_file(&deleted).unwrap();
    let truncated = entries[2].join("zarr.json");
    let len = std::fs::metadata(&truncated).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let (o, r) = inspect_json(&cache, &["--verify"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let corrupt = problems_of(&r, "corrupt-chunk");
    assert_eq!(corrupt.len(), 1, "{}", r["problems"]);
    assert_eq!(corrupt[0]["path"], rel(&cache, &flipped));
    assert_eq!(corrupt[0]["array"], "image");
    let block = flipped.strip_prefix(entries[0].join("image/c")).unwrap();
    assert_eq!(
        corrupt[0]["block"],
        block.to_string_lossy().replace('/', ".")
    );
    let missing = problems_of(&r, "missing-chunk");
    assert_eq!(missing.len(), 1, "{}", r["problems"]);
    assert_eq!(missing[0]["path"], rel(&cache, &deleted));
    assert_eq!(missing[0]["array"], "label");
    let meta = problems_of(&r, "metadata");
    assert_eq!(meta.len(), 1, "{}", r["problems"]);
    assert_eq!(meta[0]["path"], rel(&cache, &truncated));
    assert!(meta[0]["message"].as_str().unwrap().contains("truncated"));
    assert_eq!(r["cache"]["verify"]["corrupt"], 1);
    assert_eq!(r["cache"]["verify"]["missing"], 1);

    // The human report names the same files and exits 1 as well.
    let o = prep(&["inspect", s(&cache), "--verify"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    for p in [&flipped, &deleted, &truncated] {
        assert!(
            out.contains(&rel(&cache, p)),
            "{} not named in\n{out}",
            p.display()
        );
    }
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
}

#[test]
fn verify_checks_sharded_compressed_float16_entries_block_by_block() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("ds");
    write_case(&data, "a", [20, 18, 6], [1.0, 1.0, 3.0], 1);
    write_case(&data, "b", [16, 16, 9], [0.5, 0.5, 2.0], 2);
    let cache = t.path().join("cache");
    build(
        &data,
        &cache,
        &[
            "--chunk",
            "2,4,4",
            "--shard",
            "4,8,8",
            "--compression",
            "zstd",
            "--image-dtype",
            "float16",
        ],
    );
    let (o, r) = inspect_json(&cache, &["--verify"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(r["cache"]["verify"]["corrupt"], 0);
    let e = &r["cache"]["entries"][0];
    assert_eq!(e["codec"], "zstd-3");
    assert_eq!(e["image_dtype"], "float16");
    assert!(e["shard_zyx"].is_array());
    let ratio = e["decoded_bytes"].as_f64().unwrap() / e["bytes_on_disk"].as_f64().unwrap();
    assert_eq!(e["compression_ratio"].as_f64().unwrap(), ratio);

    let shard = files_under(&entry_dirs(&cache)[0].join("image/c"))[0].clone();
    flip_middle_byte(&shard);
    let (o, r) = inspect_json(&cache, &["--verify"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let corrupt = problems_of(&r, "corrupt-chunk");
    assert_eq!(corrupt.len(), 1, "{}", r["problems"]);
    assert_eq!(corrupt[0]["path"], rel(&cache, &shard));
}

fn has_keys(v: &Value, keys: &[&str]) {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    for k in keys {
        assert!(o.contains_key(*k), "missing key {k} in {v}");
    }
}

#[test]
fn json_reports_hold_the_documented_fields() {
    let t = tempfile::tempdir().unwrap();
    let data = median_dataset(t.path());
    let (_, r) = inspect_json(&data, &[]);
    has_keys(
        &r,
        &[
            "kind",
            "voxcache_version",
            "path",
            "dataset",
            "cache",
            "problems",
            "errors",
            "warnings",
        ],
    );
    assert_eq!(r["cache"], Value::Null);
    let d = &r["dataset"];
    has_keys(
        d,
        &[
            "pipeline",
            "image_dtype",
            "voxels_read",
            "n_cases",
            "n_labelled",
            "cases",
            "spacing",
            "forecast",
        ],
    );
    let c = case(&r, "a");
    has_keys(
        c,
        &[
            "id",
            "image",
            "label",
            "header",
            "label_datatype",
            "intensity",
            "label_values",
            "forecast",
        ],
    );
    assert_eq!(c["image"], "imagesTr/a_0000.nii.gz");
    assert_eq!(c["label"], "labelsTr/a.nii.gz");
    has_keys(
        &c["header"],
        &[
            "shape_xyz",
            "spacing_xyz",
            "unit",
            "datatype",
            "orientation",
            "qform_code",
            "sform_code",
            "affine_source",
        ],
    );
    has_keys(&c["intensity"], &["min", "max", "mean", "non_finite"]);
    has_keys(
        &c["forecast"],
        &[
            "out_shape_xyz",
            "out_spacing_xyz",
            "out_voxels",
            "out_bytes",
            "whole_volume_f32_bytes",
            "whole_volume_f64_bytes",
            "size_factor",
            "outlier",
        ],
    );
    let sp = &d["spacing"];
    has_keys(sp, &["distinct", "per_axis", "units", "auto", "target"]);
    for a in ["x", "y", "z"] {
        has_keys(&sp["per_axis"][a], &["min", "p10", "p50", "p90", "max"]);
    }
    has_keys(
        &sp["target"],
        &["target_xyz", "median_xyz", "rule", "reason"],
    );
    has_keys(
        &d["forecast"],
        &[
            "target_xyz",
            "image_dtype",
            "cases",
            "out_bytes",
            "whole_volume_f32_bytes",
            "whole_volume_f64_bytes",
            "outliers",
            "outlier_factor",
        ],
    );

    let cache = t.path().join("cache");
    build(&data, &cache, &[]);
    let (o, r) = inspect_json(&cache, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(r["dataset"], Value::Null);
    let c = &r["cache"];
    has_keys(
        c,
        &[
            "manifest_format_version",
            "datasets",
            "entries",
            "tmp",
            "totals",
            "verify",
        ],
    );
    assert_eq!(c["verify"], Value::Null);
    has_keys(
        &c["datasets"][0],
        &[
            "name",
            "pipeline",
            "params_key",
            "target_spacing_xyz",
            "spacing_rule",
            "spacing_reason",
            "normalization",
            "image_dtype",
            "chunk_zyx",
            "shard_zyx",
            "compression",
            "cases",
            "missing_entries",
        ],
    );
    assert_eq!(c["datasets"][0]["name"], "ds");
    assert_eq!(c["datasets"][0]["cases"], 5);
    let e = &c["entries"][0];
    has_keys(
        e,
        &[
            "key",
            "path",
            "case_id",
            "datasets",
            "orphan",
            "shape_zyx",
            "spacing_xyz",
            "unit",
            "image_dtype",
            "label_dtype",
            "chunk_zyx",
            "shard_zyx",
            "codec",
            "bytes_on_disk",
            "decoded_bytes",
            "compression_ratio",
            "label_classes",
        ],
    );
    assert_eq!(e["case_id"], "a");
    assert_eq!(e["datasets"], serde_json::json!(["ds"]));
    has_keys(
        &e["label_classes"]["1"],
        &["voxels", "bbox_min_zyx", "bbox_max_zyx"],
    );
    has_keys(
        &c["totals"],
        &[
            "entries",
            "orphans",
            "bytes_on_disk",
            "decoded_bytes",
            "tmp_bytes",
        ],
    );
    assert_eq!(c["totals"]["entries"], 5);
    assert_eq!(c["totals"]["orphans"], 0);
}

#[test]
fn orphans_and_tmp_leftovers_are_listed() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("ds");
    write_case(&data, "a", [12, 10, 4], [1.0, 1.0, 2.0], 1);
    let cache = t.path().join("cache");
    build(&data, &cache, &[]);
    // Other parameters for the same dataset name: the first entry is no longer referred to.
    build(&data, &cache, &["--seed", "9"]);
    let leftover = cache.join("tmp/abcd.otherhost.12345.0");
    std::fs::create_dir_all(&leftover).unwrap();
    std::fs::write(leftover.join("zarr.json"), b"{}").unwrap();
    let (o, r) = inspect_json(&cache, &[]);
    assert!(o.status.success(), "warnings only: {}", text(&o));
    let c = &r["cache"];
    assert_eq!(c["totals"]["entries"], 2);
    assert_eq!(c["totals"]["orphans"], 1);
    assert_eq!(problems_of(&r, "orphan").len(), 1);
    let tmp = &c["tmp"][0];
    assert_eq!(tmp["path"], "tmp/abcd.otherhost.12345.0");
    assert_eq!(tmp["host"], "otherhost");
    assert_eq!(tmp["pid"], 12345);
    assert_eq!(tmp["owner_alive"], Value::Null);
    assert_eq!(problems_of(&r, "tmp-leftover").len(), 1);
    let o = prep(&["inspect", s(&cache)]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("ORPHAN"), "{out}");
    assert!(out.contains("tmp/abcd.otherhost.12345.0"), "{out}");
    assert!(out.lines().all(|l| l.chars().count() <= 100), "{out}");
}

#[test]
fn the_human_dataset_report_matches_the_golden_file() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("ds");
    write_case(&data, "a", [20, 18, 6], [1.0, 1.0, 3.0], 1);
    write_case(&data, "b", [16, 16, 9], [0.5, 0.5, 2.0], 2);
    write_case(&data, "c", [12, 14, 5], [2.0, 2.0, 3.0], 3);
    write_case(&data, "d", [20, 18, 6], [1.0, 1.0, 3.0], 4);
    let o = prep_in(Some(t.path()), &["inspect", "ds"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/inspect_dataset.txt");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &out).unwrap();
    }
    let want = std::fs::read_to_string(&golden).unwrap_or_default();
    assert_eq!(
        out, want,
        "human report changed; if intended, rerun with UPDATE_GOLDEN=1 and review the diff"
    );
    for l in out.lines() {
        assert!(l.chars().count() <= 100, "line over 100 columns: {l}");
    }
}

#[test]
fn dataset_problems_are_named_with_their_files() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("bad");
    write_case(&d, "good", [8, 8, 4], [1.0, 1.0, 1.0], 1);
    // NaN voxels.
    let mut vals = vec![1.0f32; 8 * 8 * 4];
    vals[5] = f32::NAN;
    Nii::new([8, 8, 4], [1.0, 1.0, 1.0], &vals, false).write(&d.join("imagesTr/nan_0000.nii.gz"));
    Nii::new([8, 8, 4], [1.0, 1.0, 1.0], &[1u8; 256], false).write(&d.join("labelsTr/nan.nii.gz"));
    // No label.
    Nii::new([8, 8, 4], [1.0, 1.0, 1.0], &[3i16; 256], false)
        .write(&d.join("imagesTr/nolabel_0000.nii.gz"));
    // Label on another grid.
    Nii::new([8, 8, 4], [1.0, 1.0, 1.0], &[3i16; 256], false)
        .write(&d.join("imagesTr/mis_0000.nii.gz"));
    Nii::new([8, 8, 3], [1.0, 1.0, 1.0], &[1u8; 192], false).write(&d.join("labelsTr/mis.nii.gz"));
    // Header fine, voxel data cut short.
    let mut bytes = Nii::new([8, 8, 4], [1.0, 1.0, 1.0], &[3i16; 256], false).bytes();
    bytes.truncate(352 + 100);
    std::fs::write(d.join("imagesTr/trunc_0000.nii"), bytes).unwrap();
    Nii::new([8, 8, 4], [1.0, 1.0, 1.0], &[0u8; 256], false)
        .write(&d.join("labelsTr/trunc.nii.gz"));

    let (o, r) = inspect_json(&d, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let one = |kind: &str| {
        let p = problems_of(&r, kind);
        assert_eq!(p.len(), 1, "{kind}: {}", r["problems"]);
        p[0].clone()
    };
    let p = one("non-finite");
    assert_eq!(p["path"], "imagesTr/nan_0000.nii.gz");
    assert!(
        p["message"].as_str().unwrap().starts_with("1 voxels"),
        "{p}"
    );
    assert_eq!(one("missing-label")["case"], "nolabel");
    let p = one("mismatch");
    assert_eq!(p["case"], "mis");
    assert_eq!(p["path"], "labelsTr/mis.nii.gz");
    let p = one("unreadable");
    assert_eq!(p["path"], "imagesTr/trunc_0000.nii");
    assert!(p["message"].as_str().unwrap().contains("truncated"), "{p}");
    assert_eq!(one("empty-label")["case"], "trunc");
    for part in [&r["dataset"], &r["problems"]] {
        let j = part.to_string();
        assert!(!j.contains(s(t.path())), "paths are relative to PATH: {j}");
    }
    assert_eq!(case(&r, "nan")["intensity"]["non_finite"], 1);
    assert_eq!(case(&r, "good")["forecast"]["outlier"], false);
}

#[test]
fn foreign_and_corrupt_folders_are_clear_errors() {
    let t = tempfile::tempdir().unwrap();
    let empty = t.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("notes.txt"), b"hello").unwrap();
    for p in [
        empty.clone(),
        t.path().join("nope"),
        empty.join("notes.txt"),
    ] {
        let o = prep(&["inspect", s(&p)]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("not a dataset or voxcache cache"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // A cache whose manifest is garbage and with an entry folder missing its zarr.json.
    let cache = t.path().join("cache");
    std::fs::create_dir_all(cache.join("entries/ab/abcdef")).unwrap();
    std::fs::write(
        cache.join("manifest.json"),
        b"{\"format_version\": 1, \"datas",
    )
    .unwrap();
    let (o, r) = inspect_json(&cache, &["--verify"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(problems_of(&r, "manifest")[0]["path"], "manifest.json");
    assert_eq!(
        problems_of(&r, "incomplete-entry")[0]["path"],
        "entries/ab/abcdef"
    );
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
}

fn decode_png(p: &Path) -> (u32, u32, Vec<u8>) {
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(p).unwrap()));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

fn px(img: &(u32, u32, Vec<u8>), x: u32, y: u32) -> [u8; 3] {
    let i = ((y * img.0 + x) * 3) as usize;
    [img.2[i], img.2[i + 1], img.2[i + 2]]
}

fn overlaid(p: [u8; 3]) -> bool {
    p[0] as i32 - p[1] as i32 > 100 && p[1] == p[2]
}

#[test]
fn the_preview_shows_three_slices_at_physical_aspect_with_the_label_in_red() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("ds");
    // 16 x 12 x 4 voxels of 1 x 1 x 3: physical 16 x 12 x 12. The largest extent (16) spans 256
    // pixels, so a pixel is 1/16: axial 256x192, coronal 256x192, sagittal 192x192, 4 px apart.
    write_case(&data, "p", [16, 12, 4], [1.0, 1.0, 3.0], 1);
    let png_path = t.path().join("p.png");
    let o = prep(&["inspect", s(&data), "--preview", "p", "--out", s(&png_path)]);
    assert!(o.status.success(), "{}", text(&o));
    let img = decode_png(&png_path);
    assert_eq!((img.0, img.1), (256 + 4 + 256 + 4 + 192, 192));
    // Axial (z = 2): the disc around the centre is labelled, the corner is not.
    assert!(overlaid(px(&img, 128, 96)), "{:?}", px(&img, 128, 96));
    let corner = px(&img, 0, 0);
    assert!(
        corner[0] == corner[1] && corner[1] == corner[2],
        "{corner:?}"
    );
    // Coronal (y = 6): labelled above the first slice, not in it (bottom row, z = 0).
    assert!(overlaid(px(&img, 260 + 128, 96)));
    assert!(!overlaid(px(&img, 260 + 128, 191)));
    // The gap between panels is black.
    assert_eq!(px(&img, 257, 10), [0, 0, 0]);

    // From the cache (built at the input spacing): the same picture geometry and overlay, read
    // from the entry's arrays.
    let cache = t.path().join("cache");
    build(&data, &cache, &["--spacing", "1,1,3", "--chunk", "2,4,4"]);
    let before = tree_hashes(&cache);
    let png2 = t.path().join("p2.png");
    let o = prep(&["inspect", s(&cache), "--preview", "p", "--out", s(&png2)]);
    assert!(o.status.success(), "{}", text(&o));
    let img2 = decode_png(&png2);
    assert_eq!((img2.0, img2.1), (img.0, img.1));
    for y in 0..img.1 {
        for x in 0..img.0 {
            assert_eq!(
                overlaid(px(&img, x, y)),
                overlaid(px(&img2, x, y)),
                "overlay differs at ({x}, {y})"
            );
        }
    }
    // Never into the cache it reads.
    let inside = cache.join("p.png");
    let o = prep(&["inspect", s(&cache), "--preview", "p", "--out", s(&inside)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!inside.exists());
    assert_eq!(tree_hashes(&cache), before);

    let o = prep(&[
        "inspect",
        s(&data),
        "--preview",
        "nosuch",
        "--out",
        s(&png_path),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no case nosuch"));
}

#[test]
fn a_lost_manifest_is_an_error_and_a_killed_manifest_write_is_swept() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("ds");
    write_case(&data, "a", [12, 10, 4], [1.0, 1.0, 2.0], 1);
    let cache = t.path().join("cache");
    build(&data, &cache, &[]);
    assert!(
        std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().contains(".tmp")),
        "a finished build leaves no temporary file beside the manifest"
    );
    // What a builder killed while writing the manifest leaves: its temporary file in tmp/,
    // owned by a process that is gone (pid 0 is never a builder).
    let me = voxcache::util::sysinfo::hostname();
    let left = cache.join(format!("tmp/manifest.{me}.0.7"));
    std::fs::write(&left, b"{\"format_ver").unwrap();
    std::fs::remove_file(cache.join("manifest.json")).unwrap();
    let (o, r) = inspect_json(&cache, &["--verify"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let p = problems_of(&r, "manifest");
    assert_eq!(p.len(), 1, "{r}");
    assert_eq!(p[0]["severity"], "error");
    assert_eq!(problems_of(&r, "tmp-leftover").len(), 1);
    // The next build writes the manifest again and removes the leftover.
    build(&data, &cache, &[]);
    assert!(cache.join("manifest.json").is_file());
    assert!(
        !left.exists(),
        "the dead builder's manifest.tmp was not swept"
    );
    let (o, _) = inspect_json(&cache, &["--verify"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// A fresh two-case cache; returns it with the manifest parsed.
fn two_case_cache(t: &Path) -> (PathBuf, Value) {
    let data = t.join("ds");
    write_case(&data, "a", [12, 10, 4], [1.0, 1.0, 2.0], 1);
    write_case(&data, "b", [14, 10, 5], [1.0, 1.0, 2.0], 2);
    let cache = t.join("cache");
    build(&data, &cache, &["--chunk", "4,8,8"]);
    let m: Value =
        serde_json::from_slice(&std::fs::read(cache.join("manifest.json")).unwrap()).unwrap();
    (cache, m)
}

fn write_manifest(cache: &Path, m: &Value) {
    std::fs::write(cache.join("manifest.json"), m.to_string()).unwrap();
}

/// The error problems of `inspect --verify`, as "kind: message" lines; the exit status must
/// say damage was found.
fn verify_errors(cache: &Path) -> String {
    let (o, r) = inspect_json(cache, &["--verify"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    r["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["severity"] == "error")
        .map(|p| format!("{}: {}", p["kind"], p["message"]))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn verify_catches_manifest_and_entry_tampering() {
    let t = tempfile::tempdir().unwrap();
    let (cache, good) = two_case_cache(t.path());
    let ds = good["datasets"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    // Entries swapped between the cases.
    let a = good["datasets"][&ds]["cases"]["a"].clone();
    let b = good["datasets"][&ds]["cases"]["b"].clone();
    let mut m = good.clone();
    m["datasets"][&ds]["cases"]["a"] = b;
    m["datasets"][&ds]["cases"]["b"] = a.clone();
    write_manifest(&cache, &m);
    let e = verify_errors(&cache);
    assert!(e.contains("swapped"), "{e}");

    // A manifest shape that lies.
    let mut m = good.clone();
    m["datasets"][&ds]["cases"]["a"]["out_shape_zyx"] = serde_json::json!([1, 2, 3]);
    write_manifest(&cache, &m);
    let e = verify_errors(&cache);
    assert!(e.contains("[1, 2, 3]"), "{e}");

    // Entry paths that leave the cache.
    for bad in ["../elsewhere", "/etc"] {
        let mut m = good.clone();
        m["datasets"][&ds]["cases"]["a"]["entry"] = bad.into();
        write_manifest(&cache, &m);
        let e = verify_errors(&cache);
        assert!(e.contains("manifest"), "{bad}: {e}");
    }
    write_manifest(&cache, &good);
    let (o, _) = inspect_json(&cache, &["--verify"]);
    assert!(o.status.success(), "restored: {}", text(&o));

    // A chunk replaced by a link to a copy outside the cache.
    let entry = cache.join(a["entry"].as_str().unwrap());
    let chunk = files_under(&entry.join("image"))
        .into_iter()
        .find(|p| p.is_file() && !p.ends_with("zarr.json"))
        .unwrap();
    let outside = t.path().join("outside");
    std::fs::copy(&chunk, &outside).unwrap();
    std::fs::remove_file(&chunk).unwrap();
    std::os::unix::fs::symlink(&outside, &chunk).unwrap();
    let e = verify_errors(&cache);
    assert!(e.contains("symbolic link"), "{e}");
    std::fs::remove_file(&chunk).unwrap();
    std::fs::copy(&outside, &chunk).unwrap();

    // A foreground row listed twice, and one moved onto background.
    let (fg_chunk, rows) = repeat_first_fg_row(&entry);
    let e = verify_errors(&cache);
    assert!(e.contains("repeats or precedes"), "{e}");
    let mut moved = rows.clone();
    moved[4..16].fill(0); // voxel (0, 0, 0): background in these cases
    std::fs::write(&fg_chunk, &moved).unwrap();
    let e = verify_errors(&cache);
    assert!(e.contains("holds label 0"), "{e}");
}

/// `prep inspect DATA | head`: a closed pipe ends the process quietly, with no panic.
#[test]
fn a_closed_stdout_ends_quietly() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/vessels");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_prep"))
        .args(["inspect", data.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reading end closes before the report (which takes the headers' scan) is printed.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        !out.status.success(),
        "the process ended by the closed pipe"
    );
}

/// A dataset.json that is a folder or a FIFO is an error naming it, not silently ignored.
#[test]
fn a_dataset_json_that_is_not_a_file_is_named() {
    let t = tempfile::tempdir().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/vessels");
    for sub in ["imagesTr", "labelsTr"] {
        std::fs::create_dir_all(t.path().join(sub)).unwrap();
        for e in std::fs::read_dir(src.join(sub)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), t.path().join(sub).join(e.file_name())).unwrap();
        }
    }
    std::fs::create_dir(t.path().join("dataset.json")).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_prep"))
        .args(["inspect", t.path().to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("dataset.json") && err.contains("a folder"),
        "{err}"
    );
}
