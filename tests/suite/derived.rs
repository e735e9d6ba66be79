//! Label-derived arrays through the real `prep` binary: `--derived distance,skeleton` builds a
//! signed distance map per class and the skeleton, chunk by chunk, equal to the whole-volume
//! computations; they are part of the content key, read by the reader, checked by --verify.

use crate::common;

use std::path::Path;

use std::sync::atomic::AtomicBool;

use common::fixtures::{
    bits, build, build_report, bundled_cache, entry_dirs, open_entries, prep, s, text, WholeBoxes,
};
use common::Lcg;
use voxcache::cache::reader::CacheReader;
use voxcache::model::config::{NetworkOptions, Norm};
use voxcache::prep::derived::edt::signed_distance;
use voxcache::prep::derived::thinning::skeletonize;
use voxcache::train::config::TrainConfig;
use voxcache::train::spatial::{Transform, TransformedReader};
use voxcache::train::trainer::{run, RunOptions};

fn thin_data(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("thin");
    let o = prep(&["synth", "--preset", "thin", "--out", s(&data)]);
    assert!(o.status.success(), "{}", text(&o));
    data
}

#[test]
fn chunked_derived_arrays_equal_whole_volume_ones() {
    let t = tempfile::tempdir().unwrap();
    let data = thin_data(t.path());
    let cache = t.path().join("cache");
    // Small chunks: many chunk faces cut the vessels.
    build(
        &data,
        &cache,
        &["--derived", "distance,skeleton", "--chunk", "8,16,16"],
    );
    let reader = CacheReader::open(&cache).unwrap();
    let ds = reader.datasets()[0].to_string();
    let mut skeleton_voxels = 0;
    for case in reader.cases(&ds).unwrap() {
        let e = reader.open_entry(&ds, &case.case_id).unwrap();
        assert!(e.has_distance() && e.has_skeleton());
        let shape = e.shape_zyx();
        let n: usize = shape.iter().product();
        let mut lab = vec![0u16; n];
        e.read_label([0, 0, 0], shape, &mut lab).unwrap();
        let meta = std::fs::read(e.dir().join("zarr.json")).unwrap();
        let attrs: serde_json::Value = serde_json::from_slice(&meta).unwrap();
        let sp = &attrs["attributes"]["voxcache"]["output"]["spacing_xyz"];
        let sp = [2, 1, 0].map(|i| sp[i].as_f64().unwrap());
        for class in e.classes() {
            let inside: Vec<bool> = lab.iter().map(|&v| v == class).collect();
            let want = signed_distance(&inside, shape, sp);
            let mut got = vec![0f32; n];
            e.read_distance(class, [0, 0, 0], shape, &mut got).unwrap();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{}: distance of class {class} differs from the whole-volume transform",
                case.case_id
            );
            let whole = skeletonize(&inside, shape);
            let mut sk = vec![0u16; n];
            e.read_skeleton([0, 0, 0], shape, &mut sk).unwrap();
            let differ = sk
                .iter()
                .zip(&whole)
                .filter(|(a, b)| (**a == class) != **b)
                .count();
            assert_eq!(
                differ, 0,
                "{}: chunked skeleton differs from the whole-volume one",
                case.case_id
            );
            skeleton_voxels += whole.iter().filter(|&&b| b).count();
        }
        // A class absent from the case reads as 0.
        let mut z = vec![1f32; 8];
        e.read_distance(77, [0, 0, 0], [2, 2, 2], &mut z).unwrap();
        assert!(z.iter().all(|&v| v == 0.0));
    }
    assert!(skeleton_voxels > 1000, "{skeleton_voxels} skeleton voxels");
}

#[test]
fn derived_arrays_change_the_key_and_are_verified() {
    let t = tempfile::tempdir().unwrap();
    let data = thin_data(t.path());
    let cache = t.path().join("cache");
    build(&data, &cache, &[]);
    let plain = entry_dirs(&cache);
    let (o, r) = build_report(&data, &cache, &["--derived", "skeleton,distance"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        r["built"], 10,
        "asking for derived arrays builds new entries"
    );
    let all = entry_dirs(&cache);
    assert_eq!(all.len(), 20);
    let derived: Vec<_> = all.iter().filter(|d| !plain.contains(d)).collect();
    let reader = CacheReader::open(&cache).unwrap();
    let ds = reader.datasets()[0].to_string();
    let e = reader.open_entry(&ds, "vessels_000").unwrap();
    assert!(!e.has_distance() || derived.iter().any(|d| *d == e.dir()));

    let o = prep(&["inspect", s(&cache), "--verify", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cache"]["verify"]["corrupt"], 0);

    // Damage one distance chunk and one skeleton chunk: --verify names both.
    let d = derived[0];
    for array in ["distance", "skeleton"] {
        let mut files: Vec<_> = walk(&d.join(array));
        files.sort();
        let f = files.last().unwrap();
        let mut b = std::fs::read(f).unwrap();
        b[0] ^= 0x55;
        std::fs::write(f, b).unwrap();
    }
    let o = prep(&["inspect", s(&cache), "--verify", "--json"]);
    assert!(!o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cache"]["verify"]["corrupt"], 2, "{v}");
    let arrays: Vec<String> = v["problems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["array"].as_str().map(String::from))
        .collect();
    assert!(arrays.contains(&"distance".to_string()), "{arrays:?}");
    assert!(arrays.contains(&"skeleton".to_string()), "{arrays:?}");

    // Tampered attributes of another derived entry: a distance class the label lacks, the
    // skeleton record removed, the distance unit changed. Each is named by --verify and
    // refused by the reader, naming the entry's zarr.json.
    let e = derived[1];
    let zj = e.join("zarr.json");
    let good = std::fs::read_to_string(&zj).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 3] = [
        ("classes", |a| {
            a["derived"]["distance"]["classes"] = serde_json::json!([1, 5]);
        }),
        ("skeleton", |a| {
            a["derived"].as_object_mut().unwrap().remove("skeleton");
        }),
        ("unit", |a| a["derived"]["distance"]["unit"] = "mm".into()),
    ];
    for (what, edit) in edits {
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        edit(&mut v["attributes"]["voxcache"]);
        std::fs::write(&zj, v.to_string()).unwrap();
        let o = prep(&["inspect", s(&cache), "--verify"]);
        assert!(!o.status.success(), "{what}: verify passed\n{}", text(&o));
        assert!(text(&o).contains("derived"), "{what}: {}", text(&o));
        let err = voxcache::cache::reader::EntryReader::open(e)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("zarr.json") && err.contains("derived"),
            "{what}: {err}"
        );
    }
    std::fs::write(&zj, good).unwrap();
}

#[test]
fn bad_derived_names_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let o = prep(&[
        "build-cache",
        "nowhere",
        "--cache-dir",
        s(&t.path().join("c")),
        "--derived",
        "distance,medial",
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("\"medial\""), "{}", text(&o));
}

fn train_options(cache: &Path, run_dir: &Path, config: TrainConfig) -> RunOptions {
    RunOptions {
        cache_dir: cache.to_path_buf(),
        run_dir: run_dir.to_path_buf(),
        resume: false,
        device: "cpu".into(),
        progress: false,
        config,
        halt_after: None,
        final_validation: true,
        benchmark: false,
        mapped_mib: None,
        blocks: Default::default(),
        batch_hashes: false,
    }
}

fn small_run() -> TrainConfig {
    TrainConfig {
        network: NetworkOptions {
            patch: [8, 32, 32],
            base_channels: 4,
            max_channels: 16,
            stages: 3,
            norm: Norm::Group(2),
            ..NetworkOptions::default()
        },
        batch_size: 2,
        steps: 8,
        val_every: 0,
        val_fraction: 0.0,
        checkpoint_every: 4,
        log_every: 2,
        fg_fraction: 1.0,
        workers: 2,
        ..TrainConfig::default()
    }
}

#[test]
fn distance_and_skeleton_losses_train_log_and_resume_exactly() {
    let t = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    // Without distance maps, the losses that need them say how to get them.
    let plain = bundled_cache("plain", &[]);
    let mut cfg = small_run();
    cfg.loss.boundary = 0.1;
    let err = run(&train_options(plain, &t.path().join("x"), cfg), &stop).unwrap_err();
    assert!(err.to_string().contains("--derived distance"), "{err}");

    let cache = bundled_cache("derived", &["--derived", "distance,skeleton"]);
    let mut cfg = small_run();
    cfg.loss.skeleton_recall = 1.0;
    cfg.loss.cldice = 0.5;
    cfg.loss.boundary = 0.1;
    cfg.loss.surface = 0.001;
    let full = t.path().join("full");
    run(&train_options(cache, &full, cfg.clone()), &stop).unwrap();
    let log = std::fs::read_to_string(full.join("metrics.jsonl")).unwrap();
    for key in [
        "cldice_loss",
        "boundary_loss",
        "surface_loss",
        "skeleton_recall_loss",
    ] {
        let v: Vec<f64> = log
            .lines()
            .filter(|l| l.contains("\"train\""))
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()[key]
                    .as_f64()
                    .unwrap()
            })
            .collect();
        assert_eq!(v.len(), 4, "{key}");
        assert!(v.iter().all(|x| x.is_finite()), "{key}: {v:?}");
    }
    let halted = t.path().join("halted");
    let mut o = train_options(cache, &halted, cfg);
    o.halt_after = Some(4);
    run(&o, &stop).unwrap();
    o.halt_after = None;
    o.resume = true;
    run(&o, &stop).unwrap();
    let last = |d: &Path| {
        std::fs::read_to_string(d.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .rfind(|l| l.contains("\"train\""))
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    v["loss"].as_f64(),
                    v["cldice_loss"].as_f64(),
                    v["surface_loss"].as_f64(),
                )
            })
    };
    assert_eq!(last(&full), last(&halted), "resumed run differs");
}

pub(crate) fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.file_name().is_some_and(|n| n != "zarr.json") {
            out.push(p);
        }
    }
    out
}

#[test]
fn derived_arrays_of_rotated_patches_read_their_footprint_as_whole_boxes_give() {
    // Through the real reader, plain and sharded-compressed, in small chunks: the distance
    // maps and skeleton of rotated patches (3D, and in-plane through the columns) read over
    // their footprint equal those read from whole boxes, bit for bit, across chunks and past
    // the volume's edges.
    let layouts: [(&str, &[&str]); 2] = [
        (
            "derived-small-chunks",
            &["--derived", "distance,skeleton", "--chunk", "4,16,16"],
        ),
        (
            "derived-sharded-zstd",
            &[
                "--derived",
                "distance,skeleton",
                "--chunk",
                "4,16,16",
                "--shard",
                "8,32,32",
                "--compression",
                "zstd",
            ],
        ),
    ];
    let in_plane = Transform::in_plane;
    let maps = [
        in_plane(0.7, 1.0),
        in_plane(-2.2, 1.35),
        in_plane(1.2, 0.8).mirrored([true, true, false]),
        Transform::rotate_scale([0.4, -0.5, 0.3], 1.0),
        Transform::rotate_scale([0.1, 0.5, -0.3], 0.7).mirrored([false, true, true]),
    ];
    let size = [9, 21, 30];
    let n: usize = size.iter().product();
    let mut rng = Lcg(11);
    for (name, flags) in layouts {
        let reader = CacheReader::open(bundled_cache(name, flags)).unwrap();
        let es = open_entries(&reader);
        let (mut spans, mut whole) = (TransformedReader::default(), TransformedReader::default());
        for e in es.iter().take(3) {
            assert!(e.has_distance() && e.has_skeleton(), "{name}");
            let classes: Vec<u16> = e.classes().into_iter().filter(|&c| c != 0).collect();
            let k = classes.len();
            let s = e.shape_zyx().map(|v| v as i64);
            for (m, t) in maps.iter().enumerate() {
                for _ in 0..3 {
                    let start = [0, 1, 2]
                        .map(|a| rng.range(-(size[a] as i64) / 2, s[a] - size[a] as i64 / 2));
                    let (mut a, mut b) = (vec![f32::NAN; k * n], vec![f32::NAN; k * n]);
                    let (mut sa, mut sb) = (vec![7u16; n], vec![9u16; n]);
                    spans
                        .read_derived(e, start, size, t, &classes, &mut a, Some(&mut sa))
                        .unwrap();
                    whole
                        .read_derived(
                            &WholeBoxes(e),
                            start,
                            size,
                            t,
                            &classes,
                            &mut b,
                            Some(&mut sb),
                        )
                        .unwrap();
                    assert_eq!(
                        bits(a.iter().map(|&v| v as f64)),
                        bits(b.iter().map(|&v| v as f64)),
                        "{name}: map {m} at {start:?}"
                    );
                    assert_eq!(sa, sb, "{name}: map {m} at {start:?}");
                }
            }
        }
    }
}
