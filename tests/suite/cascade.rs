//! The cascade's data: `prep build-cache --previous-stage DIR` adds each case's first-stage
//! segmentation as one 0/1 image channel per foreground label; a case without one, or with
//! one on another grid, fails alone, named; the entry's key follows the segmentation's bytes.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::fixtures::{prep, process_scratch, s, text};
use common::zarrs_box;
use voxcache::cache::reader::CacheReader;
use voxcache::nifti_io::read_volume;
use voxcache::train::augment::AugmentConfig;
use voxcache::train::loader::{CascadeInput, Loader, LoaderConfig};
use voxcache::train::sampler::{Sampler, SamplerConfig};

/// `prep synth --preset brats-like` in `dir/brats`, and in `dir/prev` a "first stage's output"
/// for each case i that `label_of(i)` maps to a case: that case's label. Returns the data, the
/// previous-stage folder and where the cache goes.
fn brats_with_previous(
    dir: &Path,
    label_of: &dyn Fn(usize) -> Option<usize>,
) -> (PathBuf, PathBuf, PathBuf) {
    let (data, prev, cache) = (dir.join("brats"), dir.join("prev"), dir.join("cache"));
    let o = prep(&["synth", "--preset", "brats-like", "--out", s(&data)]);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::create_dir_all(&prev).unwrap();
    for i in 0..12 {
        if let Some(from) = label_of(i) {
            std::fs::copy(
                data.join(format!("labelsTr/brats_{from:03}.nii.gz")),
                prev.join(format!("brats_{i:03}.nii.gz")),
            )
            .unwrap();
        }
    }
    (data, prev, cache)
}

#[test]
fn previous_stage_segmentations_become_indicator_channels() {
    let t = tempfile::tempdir().unwrap();
    // The first stage's "predictions": the labels themselves (all but brats_011), and one
    // made on another grid (brats_010 gets brats_000's).
    let (data, prev, cache) = brats_with_previous(t.path(), &|i| (i < 11).then_some(i % 10));
    let build = || {
        prep(&[
            "build-cache",
            s(&data),
            "--cache-dir",
            s(&cache),
            "--previous-stage",
            s(&prev),
        ])
    };
    let o = build();
    assert!(!o.status.success());
    let out = text(&o);
    assert!(out.contains("10 built"), "{out}");
    assert!(
        out.contains("brats_011.nii.gz") && out.contains("3d_lowres"),
        "{out}"
    );
    assert!(out.contains("brats_010"), "{out}");

    let reader = CacheReader::open(&cache).unwrap();
    let ds = reader.datasets()[0].to_string();
    for i in [0, 4] {
        let id = format!("brats_{i:03}");
        let e = reader.open_entry(&ds, &id).unwrap();
        assert_eq!(e.channels(), 7, "four contrasts and labels 1, 2, 3");
        let shape = e.shape_zyx();
        let n: usize = shape.iter().product();
        let label = read_volume(&data.join(format!("labelsTr/{id}.nii.gz"))).unwrap();
        // At the data's own spacing (1 mm, the median) the grid is the input's.
        assert_eq!(label.data.len(), n);
        for (k, value) in [1.0f32, 2.0, 3.0].into_iter().enumerate() {
            let mut ch = vec![0f32; n];
            e.read_channel(4 + k, [0, 0, 0], shape, &mut ch).unwrap();
            let want: Vec<f32> = label
                .data
                .iter()
                .map(|&l| (l == value) as u8 as f32)
                .collect();
            assert_eq!(ch, want, "{id} label {value}");
            assert!(want.contains(&1.0), "{id} holds label {value}");
        }
    }

    // Built again: nothing changes; a segmentation changed: its case alone is rebuilt.
    let o = build();
    assert!(text(&o).contains("0 built, 10 cached"), "{}", text(&o));
    // The same voxels compressed anew: other bytes, so another key.
    let seg = prev.join("brats_002.nii.gz");
    let mut raw = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::MultiGzDecoder::new(std::fs::File::open(&seg).unwrap()),
        &mut raw,
    )
    .unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(1));
    std::io::Write::write_all(&mut gz, &raw).unwrap();
    std::fs::write(&seg, gz.finish().unwrap()).unwrap();
    let o = build();
    assert!(text(&o).contains("1 built, 9 cached"), "{}", text(&o));
}

/// Both stages of a cascade on the brats-like data, trained once for this test binary
/// (read-only to tests): the second stage on a cache built with `--previous-stage` (the labels
/// standing for the first stage's output; fold 0, validated at its end), the first a plain
/// model of two steps.
struct Stages {
    data: PathBuf,
    prev: PathBuf,
    cache: PathBuf,
    second: PathBuf,
    second_output: String,
    first: PathBuf,
}

fn stages() -> &'static Stages {
    static STAGES: OnceLock<Stages> = OnceLock::new();
    STAGES.get_or_init(|| {
        let dir = process_scratch("cascade-stages");
        let (data, prev, cache) = brats_with_previous(&dir, &Some);
        let o = prep(&[
            "build-cache",
            s(&data),
            "--cache-dir",
            s(&cache),
            "--previous-stage",
            s(&prev),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let second = dir.join("second");
        let o = Command::new(env!("CARGO_BIN_EXE_train"))
            .args(["--cache-dir", s(&cache), "--out", s(&second), "--fold", "0"])
            .args(["--patch", "16,32,32", "--batch-size", "2", "--steps", "4"])
            .args(["--base-channels", "4", "--stages", "3", "--val-every", "4"])
            .arg("--no-progress")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let second_output = text(&o);
        let (plain, first) = (dir.join("plain"), dir.join("first"));
        let o = prep(&["build-cache", s(&data), "--cache-dir", s(&plain)]);
        assert!(o.status.success(), "{}", text(&o));
        let o = Command::new(env!("CARGO_BIN_EXE_train"))
            .args(["--cache-dir", s(&plain), "--out", s(&first), "--steps", "2"])
            .args([
                "--patch",
                "16,32,32",
                "--base-channels",
                "4",
                "--stages",
                "3",
            ])
            .args(["--val-fraction", "0", "--no-progress"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        Stages {
            data,
            prev,
            cache,
            second,
            second_output,
            first,
        }
    })
}

/// The second stage on such a cache: it trains with the previous stage's channels, its fold
/// validation gives the held-out cases those channels again, and predict needs them
/// (`--previous-stage`), refusing them for a model that takes none.
#[test]
fn the_second_stage_trains_validates_and_predicts_with_the_first_stages_output() {
    let t = tempfile::tempdir().unwrap();
    let Stages {
        data,
        prev,
        cache,
        second: run,
        second_output,
        ..
    } = stages();
    // The first stage's output here is the labels: without augmentation, the loader's last
    // three channels are the label patch's one-hot.
    let reader = CacheReader::open(cache).unwrap();
    let entries = common::fixtures::open_entries(&reader);
    let sampler =
        Sampler::new(&entries, Vec::new(), SamplerConfig::new([16, 32, 32], 2, 3)).unwrap();
    let mut loader = Loader::start(
        entries.clone(),
        sampler,
        LoaderConfig {
            augment: AugmentConfig::none(),
            cascade: Some(CascadeInput {
                channels: 3,
                augment: None,
            }),
            ..LoaderConfig::default()
        },
        0,
    )
    .unwrap();
    let n = 16 * 32 * 32;
    for _ in 0..4 {
        let (b, _) = loader.next().unwrap();
        for i in 0..b.batch_size {
            let img = &b.image[i * 7 * n..(i + 1) * 7 * n];
            let lab = &b.label[i * n..(i + 1) * n];
            for k in 0..3 {
                let want: Vec<f32> = lab
                    .iter()
                    .map(|&l| (l == k as u16 + 1) as u8 as f32)
                    .collect();
                assert_eq!(
                    &img[(4 + k) * n..(5 + k) * n],
                    &want[..],
                    "sample {i} label {}",
                    k + 1
                );
            }
        }
    }
    drop(loader);
    assert!(
        second_output.contains("7 image channels"),
        "{second_output}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("validation/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["failed"], 0, "{summary}");
    assert!(summary["evaluated"].as_u64().unwrap() > 0, "{summary}");

    let one = t.path().join("one");
    std::fs::create_dir_all(&one).unwrap();
    for c in 0..4 {
        let name = format!("brats_005_{c:04}.nii.gz");
        std::fs::copy(data.join("imagesTr").join(&name), one.join(&name)).unwrap();
    }
    let predict = |extra: &[&str], out: &Path| {
        Command::new(env!("CARGO_BIN_EXE_predict"))
            .args(["--model", s(run), s(&one), "--out", s(out), "-q"])
            .args(extra)
            .output()
            .unwrap()
    };
    let o = predict(&[], &t.path().join("none"));
    assert!(!o.status.success());
    assert!(text(&o).contains("--previous-stage"), "{}", text(&o));
    let out = t.path().join("pred");
    let o = predict(&["--previous-stage", s(prev)], &out);
    assert!(o.status.success(), "{}", text(&o));
    let seg = read_volume(&out.join("brats_005.nii.gz")).unwrap();
    let image = read_volume(&one.join("brats_005_0000.nii.gz")).unwrap();
    assert_eq!(seg.header.shape_xyz, image.header.shape_xyz);
}

/// The chain in one predict (`--previous-model`) against its stages run one after the other:
/// the first stage alone (`predict --model FIRST --out A`), then the second on A
/// (`--previous-stage A --out B`). The chain's OUT/previous_stage/ equals A and its
/// segmentations and probabilities equal B's, voxel for voxel; the second stage on other
/// first-stage segmentations gives other probabilities (so the comparison sees which were used).
#[test]
fn the_chain_equals_its_stages_run_one_after_the_other() {
    let t = tempfile::tempdir().unwrap();
    let st = stages();
    let images = t.path().join("images");
    std::fs::create_dir_all(&images).unwrap();
    let cases = ["brats_005", "brats_011"];
    for id in cases {
        for c in 0..4 {
            let name = format!("{id}_{c:04}.nii.gz");
            std::fs::copy(st.data.join("imagesTr").join(&name), images.join(&name)).unwrap();
        }
    }
    let predict = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_predict"))
            .arg(&images)
            .args(["-q", "--save-probabilities"])
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
    };
    let (a, b, chain) = (
        t.path().join("a"),
        t.path().join("b"),
        t.path().join("chain"),
    );
    predict(&["--model", s(&st.first), "--out", s(&a)]);
    predict(&[
        "--model",
        s(&st.second),
        "--previous-stage",
        s(&a),
        "--out",
        s(&b),
    ]);
    predict(&[
        "--model",
        s(&st.second),
        "--previous-model",
        s(&st.first),
        "--out",
        s(&chain),
    ]);
    // The second stage on other segmentations: every voxel's label moved by one.
    let other = t.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    for id in cases {
        let v = read_volume(&a.join(format!("{id}.nii.gz"))).unwrap();
        let moved: Vec<u8> = v.data.iter().map(|&l| (l as u8 + 1) % 4).collect();
        voxcache::nifti_io::write_nifti_u8(
            &other.join(format!("{id}.nii.gz")),
            v.header.shape_xyz,
            v.header.spacing_xyz,
            &moved,
        )
        .unwrap();
    }
    let c = t.path().join("c");
    predict(&[
        "--model",
        s(&st.second),
        "--previous-stage",
        s(&other),
        "--out",
        s(&c),
    ]);
    let probabilities = |dir: &Path, id: &str, shape: [usize; 3]| {
        let [nx, ny, nz] = shape;
        zarrs_box(
            &dir.join(format!("{id}.probabilities.zarr")),
            "",
            [0; 3],
            [nz, ny, nx],
        )
    };
    for id in cases {
        let name = format!("{id}.nii.gz");
        let first = read_volume(&a.join(&name)).unwrap();
        let chained_first = read_volume(&chain.join("previous_stage").join(&name)).unwrap();
        assert_eq!(
            chained_first.header.affine.0, first.header.affine.0,
            "{id}: first stage's geometry"
        );
        assert_eq!(chained_first.data, first.data, "{id}: first stage");
        let (want, got) = (
            read_volume(&b.join(&name)).unwrap(),
            read_volume(&chain.join(&name)).unwrap(),
        );
        assert_eq!(got.header.shape_xyz, want.header.shape_xyz, "{id}");
        assert_eq!(got.data, want.data, "{id}: second stage");
        let shape = want.header.shape_xyz;
        let pb = probabilities(&b, id, shape);
        assert_eq!(
            common::fixtures::bits(probabilities(&chain, id, shape)),
            common::fixtures::bits(pb.clone()),
            "{id}: second stage's probabilities"
        );
        assert!(
            probabilities(&c, id, shape) != pb,
            "{id}: the second stage gives the same probabilities on other first-stage segmentations"
        );
    }
}

/// A plan's `3d_cascade_fullres` (previous_stage = "3d_lowres"): build-cache wants the first
/// stage's folder, and train refuses a cache without its channels, both naming the stage.
#[test]
fn a_cascade_configuration_needs_the_previous_stage() {
    let t = tempfile::tempdir().unwrap();
    let data = common::fixtures::bundled_data();
    let plan = t.path().join("plan.toml");
    let o = prep(&["plan", s(&data), "--out", s(&plan)]);
    assert!(o.status.success(), "{}", text(&o));
    // The bundled data plans no 3d_lowres: the cascade's table is written as prep plan would.
    let text_plan = std::fs::read_to_string(&plan).unwrap();
    let start = text_plan.find("[configurations.3d_fullres]").unwrap();
    let end = text_plan[start + 1..]
        .find("\n[")
        .map_or(text_plan.len(), |e| start + 1 + e);
    let table = text_plan[start..end]
        .replace("3d_fullres]", "3d_cascade_fullres]")
        .trim_end()
        .to_string();
    std::fs::write(
        &plan,
        format!("{text_plan}\n{table}\nprevious_stage = \"3d_lowres\"\n"),
    )
    .unwrap();
    let o = prep(&[
        "build-cache",
        s(&data),
        "--cache-dir",
        s(&t.path().join("never")),
        "--pipeline",
        s(&plan),
        "--configuration",
        "3d_cascade_fullres",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("--previous-stage") && text(&o).contains("3d_lowres"),
        "{}",
        text(&o)
    );
    assert!(!t.path().join("never/manifest.json").exists());
    let cache = common::fixtures::bundled_cache("default", &[]);
    let o = Command::new(env!("CARGO_BIN_EXE_train"))
        .args(["--cache-dir", s(cache), "--out", s(&t.path().join("run"))])
        .args([
            "--pipeline",
            s(&plan),
            "--configuration",
            "3d_cascade_fullres",
        ])
        .args(["--steps", "1", "--no-progress"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("3d_lowres") && text(&o).contains("--previous-stage"),
        "{}",
        text(&o)
    );
}
