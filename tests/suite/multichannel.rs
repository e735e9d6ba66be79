//! Several image channels end to end: nnU-Net's `CASE_0000`, `CASE_0001`... files are one case;
//! each channel is normalized by its own scheme (dataset.json's "CT" picks the CT scheme) and
//! cached as one channel of a (c, z, y, x) image that equals a build of that channel alone;
//! missing channels and channels on another grid fail their case naming the files; the trainer
//! takes the channels as its input channels.

use crate::common;

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
    // What predict needs to make a new volume's input: the cache's parameters and unit.
    let pre = &run["preprocessing"];
    assert_eq!(pre["unit"], "um");
    assert_eq!(
        pre["params"]["target_spacing_xyz"],
        serde_json::json!([1.5, 1.5, 5.0])
    );
    assert_eq!(
        pre["params"]["channels"][0]["normalization"],
        "zscore-nonzero"
    );
    assert_eq!(pre["params"]["channels"][1]["normalization"], "ct");
    assert!(pre["params"]["channels"][1]["dataset_foreground"]["mean"].is_number());
    // Every checkpoint folder holds the same record.
    let best = std::fs::read(run_dir.join("checkpoints/best/run.json")).unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&best).unwrap(),
        run
    );
}

/// A Decathlon multi-modal case: `CASE_0000` .. `CASE_000N` of one case as the volumes of one
/// 4-D file, named after the case (the header of the first, dim[0] = 4, dim[4] = N).
fn pack_4d(files: &[PathBuf], out: &Path) {
    use std::io::{Read, Write};
    let raw = |p: &Path| {
        let mut v = Vec::new();
        flate2::read::MultiGzDecoder::new(std::fs::File::open(p).unwrap())
            .read_to_end(&mut v)
            .unwrap();
        v
    };
    let first = raw(&files[0]);
    let offset = f32::from_le_bytes(first[108..112].try_into().unwrap()) as usize;
    let mut bytes = first.clone();
    bytes[40..42].copy_from_slice(&4i16.to_le_bytes());
    bytes[48..50].copy_from_slice(&(files.len() as i16).to_le_bytes());
    for f in &files[1..] {
        bytes.extend_from_slice(&raw(f)[offset..]);
    }
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(out).unwrap(),
        flate2::Compression::fast(),
    );
    gz.write_all(&bytes).unwrap();
    gz.finish().unwrap();
}

#[test]
fn a_decathlon_folder_of_4d_multimodal_images_builds_as_its_nnunet_layout_does() {
    let t = tempfile::tempdir().unwrap();
    let data = synth(t.path());
    let msd = t.path().join("msd");
    std::fs::create_dir_all(msd.join("imagesTr")).unwrap();
    let labels = msd.join("labelsTr");
    std::fs::create_dir_all(&labels).unwrap();
    let mut ids = Vec::new();
    for e in std::fs::read_dir(data.join("labelsTr")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        let id = name.strip_suffix(".nii.gz").unwrap().to_string();
        std::fs::copy(data.join("labelsTr").join(&name), labels.join(&name)).unwrap();
        let channels: Vec<PathBuf> = (0..2)
            .map(|c| data.join(format!("imagesTr/{id}_{c:04}.nii.gz")))
            .collect();
        pack_4d(&channels, &msd.join(format!("imagesTr/{id}.nii.gz")));
        ids.push(id);
    }
    // The Decathlon's dataset.json: modalities and labels value -> name.
    let json = r#"{"name": "mc", "modality": {"0": "two-photon", "1": "CT"},
        "labels": {"0": "background", "1": "vessel", "2": "bright vessel", "3": "unannotated"},
        "training": [], "test": []}"#;
    std::fs::write(msd.join("dataset.json"), json).unwrap();
    // The nnU-Net folder with the same dataset.json, so both get the same schemes and classes.
    std::fs::write(data.join("dataset.json"), json).unwrap();
    let (a, b) = (t.path().join("cache-nnunet"), t.path().join("cache-msd"));
    build(&data, &a, &[]);
    let (o, r) = build_report(&msd, &b, &["--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(r["built"], 10, "{r}");
    let (ra, rb) = (
        CacheReader::open(&a).unwrap(),
        CacheReader::open(&b).unwrap(),
    );
    let (da, db) = (ra.datasets()[0].to_string(), rb.datasets()[0].to_string());
    assert_eq!(rb.manifest().datasets[&db].channels, ["two-photon", "CT"]);
    for id in &ids {
        let (ea, eb) = (
            ra.open_entry(&da, id).unwrap(),
            rb.open_entry(&db, id).unwrap(),
        );
        assert_eq!(eb.channels(), 2);
        let shape = ea.shape_zyx();
        assert_eq!(eb.shape_zyx(), shape);
        let n = 2 * shape.iter().product::<usize>();
        let (mut x, mut y) = (vec![0f32; n], vec![0f32; n]);
        ea.read_image([0, 0, 0], shape, &mut x).unwrap();
        eb.read_image([0, 0, 0], shape, &mut y).unwrap();
        assert!(
            x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{id}: the 4-D build differs from the one of separate channel files"
        );
    }
    // A 4-D file whose volumes are not the declared channels fails its case, naming it.
    let one = msd.join(format!("imagesTr/{}.nii.gz", ids[0]));
    pack_4d(
        &(0..3)
            .map(|c| data.join(format!("imagesTr/{}_{:04}.nii.gz", ids[0], c.min(1))))
            .collect::<Vec<_>>(),
        &one,
    );
    let (o, r) = build_report(&msd, &t.path().join("cache-bad"), &["--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(r["built"], 9, "{r}");
    let e = stderr(&o);
    assert!(
        e.contains(&format!(
            "{}: a 4D image of 3 volumes, but dataset.json declares 2 channels",
            one.display()
        )),
        "{e}"
    );
    // Inspect reads each volume's intensities.
    let o = prep(&["inspect", msd.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&format!("{} ch1", ids[1])), "{out}");
}

/// Predict's preprocessing: cases without labels, built with a cache's own parameters given
/// (its target spacing, and the CT channel's statistics from the labelled training set), come
/// out as the training cache's images, bit for bit, with the same keys for the same files.
#[test]
fn fixed_parameters_preprocess_unlabelled_cases_as_the_cache_did() {
    use voxcache::prep::cache_build::{build_cache, BuildOptions};
    use voxcache::prep::dataset::{CaseSource, DatasetSource};
    let t = tempfile::tempdir().unwrap();
    let data = synth(t.path());
    let train_cache = t.path().join("train");
    build(&data, &train_cache, &[]);
    let r = CacheReader::open(&train_cache).unwrap();
    let ds = r.datasets()[0].to_string();
    let params = r.manifest().datasets[&ds].params.clone();
    let cases: Vec<CaseSource> = ["vessels_004", "vessels_007"]
        .iter()
        .map(|id| CaseSource {
            id: id.to_string(),
            images: (0..2)
                .map(|c| data.join(format!("imagesTr/{id}_{c:04}.nii.gz")))
                .collect(),
            label: None,
            packed: false,
        })
        .collect();
    let scratch = t.path().join("scratch");
    let report = build_cache(&BuildOptions {
        source: DatasetSource::Cases(cases.clone()),
        cache_dir: scratch.clone(),
        remote: Default::default(),
        name: Some("predict".into()),
        settings: voxcache::config::Settings::default(),
        jobs: 2,
        dry_run: false,
        part: None,
        progress: false,
        quiet: true,
        fixed_params: Some(params.clone()),
        previous_stage: None,
        nnunet: None,
    })
    .unwrap();
    assert_eq!((report.built, report.failed), (2, 0));
    let s = CacheReader::open(&scratch).unwrap();
    assert_eq!(s.manifest().datasets["predict"].params, params);
    for c in &cases {
        let (a, b) = (
            r.open_entry(&ds, &c.id).unwrap(),
            s.open_entry("predict", &c.id).unwrap(),
        );
        assert!(b.label_dtype().is_none());
        let shape = a.shape_zyx();
        assert_eq!(b.shape_zyx(), shape);
        let n = 2 * shape.iter().product::<usize>();
        let (mut x, mut y) = (vec![0f32; n], vec![0f32; n]);
        a.read_image([0, 0, 0], shape, &mut x).unwrap();
        b.read_image([0, 0, 0], shape, &mut y).unwrap();
        assert!(
            x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{}",
            c.id
        );
    }
    // Parameters for another channel count are refused, saying so.
    let mut one = params.clone();
    one.channels.truncate(1);
    let err = build_cache(&BuildOptions {
        source: DatasetSource::Cases(cases),
        cache_dir: t.path().join("scratch2"),
        remote: Default::default(),
        name: None,
        settings: voxcache::config::Settings::default(),
        jobs: 1,
        dry_run: false,
        part: None,
        progress: false,
        quiet: true,
        fixed_params: Some(one),
        previous_stage: None,
        nnunet: None,
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("the cases have 2 image channels but the parameters given are for 1"),
        "{err}"
    );
}
