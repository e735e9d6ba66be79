//! Several image channels end to end: nnU-Net's `CASE_0000`, `CASE_0001`... files are one case;
//! each channel is normalized by its own scheme (dataset.json's "CT" picks the CT scheme) and
//! cached as one channel of a (c, z, y, x) image that equals a build of that channel alone;
//! missing channels and channels on another grid fail their case naming the files; the trainer
//! takes the channels as its input channels.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixtures::{build, build_report, prep, stderr, text};
use voxcache::cache::reader::CacheReader;

/// `prep synth --preset multichannel` into `dir/data`: 10 small cases of two channels
/// (two-photon, CT), labels 0, 1, 2 and the ignore label 3.
fn synth(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    let o = prep(&[
        "synth",
        "--preset",
        "multichannel",
        "--out",
        data.to_str().unwrap(),
        "--seed",
        "3",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    data
}

/// A copy of `data` holding only channel `ch`, renamed `_0000`, with the labels and no
/// dataset.json: the one-channel dataset a user would have built before.
fn one_channel(data: &Path, ch: usize, into: &Path) -> PathBuf {
    for sub in ["imagesTr", "labelsTr"] {
        std::fs::create_dir_all(into.join(sub)).unwrap();
    }
    let suffix = format!("_{ch:04}.nii.gz");
    for e in std::fs::read_dir(data.join("imagesTr")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if let Some(id) = name.strip_suffix(&suffix) {
            std::fs::copy(
                data.join("imagesTr").join(&name),
                into.join("imagesTr").join(format!("{id}_0000.nii.gz")),
            )
            .unwrap();
        }
    }
    for e in std::fs::read_dir(data.join("labelsTr")).unwrap() {
        let name = e.unwrap().file_name();
        std::fs::copy(
            data.join("labelsTr").join(&name),
            into.join("labelsTr").join(&name),
        )
        .unwrap();
    }
    into.to_path_buf()
}

fn entry_attrs(dir: &Path) -> serde_json::Value {
    let z: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("zarr.json")).unwrap()).unwrap();
    z["attributes"]["voxcache"].clone()
}

#[test]
fn each_channel_is_cached_as_a_build_of_that_channel_alone_would_cache_it() {
    let t = tempfile::tempdir().unwrap();
    let data = synth(t.path());
    let multi = t.path().join("multi");
    let (o, r) = build_report(&data, &multi, &["--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(r["built"], 10, "{r}");

    // The same channels built one at a time, with the scheme dataset.json picks for each.
    let c0 = one_channel(&data, 0, &t.path().join("d0"));
    let c1 = one_channel(&data, 1, &t.path().join("d1"));
    build(&c0, &t.path().join("cache0"), &[]);
    build(&c1, &t.path().join("cache1"), &["--normalization", "ct"]);

    let m = CacheReader::open(&multi).unwrap();
    let ds = m.datasets()[0].to_string();
    let manifest = &m.manifest().datasets[&ds];
    assert_eq!(manifest.channels, ["two-photon", "CT"]);
    let singles = [
        CacheReader::open(t.path().join("cache0")).unwrap(),
        CacheReader::open(t.path().join("cache1")).unwrap(),
    ];
    for case in m.cases(&ds).unwrap() {
        let e = m.open_entry(&ds, &case.case_id).unwrap();
        assert_eq!(e.channels(), 2);
        let a = entry_attrs(e.dir());
        let schemes: Vec<&str> = a["normalization"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["scheme"].as_str().unwrap())
            .collect();
        assert_eq!(schemes, ["zscore-nonzero", "ct"], "{}", case.case_id);
        assert_eq!(a["source"]["images"].as_array().unwrap().len(), 2);
        let shape = e.shape_zyx();
        let n: usize = shape.iter().product();
        let mut both = vec![0f32; 2 * n];
        e.read_image([0, 0, 0], shape, &mut both).unwrap();
        let mut label = vec![0u16; n];
        e.read_label([0, 0, 0], shape, &mut label).unwrap();
        for (ch, single) in singles.iter().enumerate() {
            let sds = single.datasets()[0].to_string();
            let s = single.open_entry(&sds, &case.case_id).unwrap();
            assert_eq!(s.shape_zyx(), shape);
            let mut alone = vec![0f32; n];
            s.read_image([0, 0, 0], shape, &mut alone).unwrap();
            let mut one = vec![0f32; n];
            e.read_channel(ch, [0, 0, 0], shape, &mut one).unwrap();
            assert!(
                one.iter()
                    .zip(&alone)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} channel {ch} differs from its one-channel build",
                case.case_id
            );
            assert_eq!(&both[ch * n..(ch + 1) * n], &one[..]);
            let mut slabel = vec![0u16; n];
            s.read_label([0, 0, 0], shape, &mut slabel).unwrap();
            assert_eq!(slabel, label);
        }
    }

    // The cache report names each channel's scheme; --verify checks every channel's blocks.
    let o = prep(&["inspect", multi.to_str().unwrap(), "--verify"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        out.contains("2 image channels: two-photon (zscore-nonzero), CT (ct)"),
        "{out}"
    );

    // A flipped byte in channel 1 is found and named by channel.
    let e = m.open_entry(&ds, "vessels_000").unwrap();
    let chunk = e.dir().join("image/c/1/0/0/0");
    let mut bytes = std::fs::read(&chunk).unwrap();
    let k = bytes.len() / 2;
    bytes[k] ^= 0x10;
    std::fs::write(&chunk, &bytes).unwrap();
    drop(e);
    let o = prep(&["inspect", multi.to_str().unwrap(), "--verify", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let blocks: Vec<&str> = r["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "corrupt-chunk")
        .map(|p| p["block"].as_str().unwrap())
        .collect();
    assert_eq!(blocks, ["1.0.0.0"], "{}", r["problems"]);
    let m = CacheReader::open(&multi).unwrap();
    let e = m.open_entry(&ds, "vessels_000").unwrap();
    let mut buf = vec![0f32; 2 * e.shape_zyx().iter().product::<usize>()];
    let err = e
        .read_image([0, 0, 0], e.shape_zyx(), &mut buf)
        .unwrap_err()
        .to_string();
    assert!(err.contains("image channel 1 block 0.0.0"), "{err}");
}

#[test]
fn missing_channels_and_channels_on_another_grid_fail_their_case_naming_the_files() {
    let t = tempfile::tempdir().unwrap();
    let data = synth(t.path());
    let images = data.join("imagesTr");
    // vessels_001 loses its CT file; vessels_002's CT file is another case's (another grid).
    std::fs::remove_file(images.join("vessels_001_0001.nii.gz")).unwrap();
    std::fs::copy(
        images.join("vessels_003_0001.nii.gz"),
        images.join("vessels_002_0001.nii.gz"),
    )
    .unwrap();
    let (o, r) = build_report(&data, &t.path().join("cache"), &["--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(r["built"], 8, "{r}");
    let e = stderr(&o);
    assert!(
        e.contains("case vessels_001: channel file missing: ")
            && e.contains("imagesTr/vessels_001_0001.nii.gz (dataset.json declares 2 channels)"),
        "{e}"
    );
    assert!(
        e.contains("case vessels_002: image ")
            && e.contains("vessels_002_0000.nii.gz")
            && e.contains("but channel ")
            && e.contains("vessels_002_0001.nii.gz"),
        "{e}"
    );
}

#[test]
fn the_trainer_takes_the_channels_and_records_them() {
    let t = tempfile::tempdir().unwrap();
    let data = synth(t.path());
    let cache = t.path().join("cache");
    build(&data, &cache, &["--spacing", "1.5,1.5,5"]);
    let run_dir = t.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_train"))
        .arg("--cache-dir")
        .arg(&cache)
        .arg("--out")
        .arg(&run_dir)
        .args([
            "--patch",
            "8,32,32",
            "--batch-size",
            "2",
            "--steps",
            "4",
            "--base-channels",
            "4",
            "--stages",
            "3",
            "--val-fraction",
            "0.2",
            "--val-every",
            "4",
            "--no-progress",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &stderr(&out);
    assert!(said.contains("2 image channels (two-photon, CT)"), "{said}");
    let run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["channels"], serde_json::json!(["two-photon", "CT"]));
    assert_eq!(run["ignore_label"], 3);
    let names: Vec<&str> = run["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["background", "vessel", "bright vessel"]);
}
