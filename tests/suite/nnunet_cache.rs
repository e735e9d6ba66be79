//! `prep build-cache --nnunet-plans` against nnU-Net's own preprocessed arrays.
//! tests/fixtures/nnunet_preprocessed was made by scripts/nnunet_cache_check.py with nnunetv2
//! 2.8.1 (`--cases 4 --fixture`): two raw datasets, their plans, and what
//! `nnUNetv2_plan_and_preprocess -c 3d_fullres` wrote for each case (data, seg). One is CT-like
//! and anisotropic (z resampled apart, CT normalization, cropped zero borders); the other has
//! two MR-like channels normalized inside the nonzero mask, a transposed grid and a label voxel
//! where every channel is 0.

use std::path::{Path, PathBuf};

use crate::common::fixtures::{prep, s};
use crate::nnunet_import::parse_npy;
use voxcache::cache::reader::CacheReader;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nnunet_preprocessed")
        .join(name)
}

/// An array of nnU-Net's `.npz` of a case.
fn npz(path: &Path, key: &str) -> (Vec<usize>, Vec<f32>) {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut entry = zip.by_name(&format!("{key}.npy")).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
    parse_npy(&bytes)
}

/// `prep build-cache DATA --nnunet-plans DATA/nnUNetPlans.json --configuration C`.
fn build(data: &Path, cache: &Path, configuration: &str) -> std::process::Output {
    prep(&[
        "build-cache",
        s(data),
        "--cache-dir",
        s(cache),
        "--nnunet-plans",
        s(&data.join("nnUNetPlans.json")),
        "--configuration",
        configuration,
        "-q",
    ])
}

/// The fixture dataset `name` copied into a temporary folder and its cache built from its plans
/// (3d_fullres): the folder, the cache, its reader and its dataset's name.
fn built(name: &str) -> (tempfile::TempDir, PathBuf, CacheReader, String) {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("raw");
    crate::common::fixtures::copy_tree(&fixture(name), &data);
    let cache = t.path().join("cache");
    let out = build(&data, &cache, "3d_fullres");
    assert!(out.status.success(), "{out:?}");
    let reader = CacheReader::open(&cache).unwrap();
    let dataset = reader.datasets()[0].to_string();
    (t, cache, reader, dataset)
}

/// Build the dataset's cache from its plans and compare every case with nnU-Net's arrays:
/// data within 1e-4 of the channel's largest magnitude, labels equal (nnU-Net's -1 as 0).
fn matches_nnunet(name: &str) {
    let (_t, _cache, reader, dataset) = built(name);
    let expected: Vec<PathBuf> = std::fs::read_dir(fixture(name).join("expected"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(expected.len() >= 4);
    let mut labelled = 0usize;
    for path in expected {
        let id = path.file_stem().unwrap().to_string_lossy().to_string();
        let (shape, want) = npz(&path, "data");
        let (seg_shape, seg) = npz(&path, "seg");
        let entry = reader.open_entry(&dataset, &id).unwrap();
        let zyx = entry.shape_zyx();
        assert_eq!(shape[1..], zyx, "{id}: the grid is nnU-Net's");
        assert_eq!(seg_shape, zyx.to_vec(), "{id}");
        assert_eq!(entry.channels(), shape[0], "{id}");
        let masks = name == "Dataset992_CacheMR";
        assert_eq!(!entry.norm_mask_channels().is_empty(), masks, "{id}");
        let mut got = vec![0f32; want.len()];
        entry.read_image([0, 0, 0], zyx, &mut got).unwrap();
        let n = zyx.iter().product::<usize>();
        for c in 0..shape[0] {
            let (w, g) = (&want[c * n..][..n], &got[c * n..][..n]);
            let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
            let worst = w.iter().zip(g).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst / scale <= 1e-4,
                "{id} channel {c}: {worst} of {scale}"
            );
        }
        let mut lab = vec![0u16; n];
        entry.read_label([0, 0, 0], zyx, &mut lab).unwrap();
        let differ = lab
            .iter()
            .zip(&seg)
            .filter(|(&l, &s)| f32::from(l) != s.max(0.0))
            .count();
        assert_eq!(differ, 0, "{id}: label voxels differ from nnU-Net's");
        labelled += lab.iter().filter(|&&l| l > 0).count();
    }
    assert!(labelled > 0, "no foreground: the fixture tests nothing");
}

#[test]
fn a_cache_from_plans_is_nnunets_preprocessing_ct_anisotropic() {
    matches_nnunet("Dataset991_CacheCT");
}

#[test]
fn a_cache_from_plans_is_nnunets_preprocessing_masked_two_channels_transposed() {
    matches_nnunet("Dataset992_CacheMR");
}

#[test]
fn plans_a_cache_cannot_reproduce_are_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("raw");
    crate::common::fixtures::copy_tree(&fixture("Dataset991_CacheCT"), &data);
    let cache = t.path().join("cache");
    let run = |configuration: &str| build(&data, &cache, configuration);
    let out = run("2d");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        said.contains("nnUNetPlans.json") && said.contains("2d"),
        "{said}"
    );
    let out = run("3d_nonexistent");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!cache.join("manifest.json").exists());
}

#[test]
fn a_fold_of_such_a_cache_is_refused_before_training_and_its_model_by_predict() {
    use crate::common::fixtures::text;
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("raw");
    crate::common::fixtures::copy_tree(&fixture("Dataset991_CacheCT"), &data);
    let cache = t.path().join("cache");
    assert!(build(&data, &cache, "3d_fullres").status.success());
    let train = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_train"))
            .args(["--cache-dir", s(&cache), "--steps", "2", "--out"])
            .arg(t.path().join("run"))
            .args(extra)
            .output()
            .unwrap()
    };
    // A fold's validation would need nnU-Net's preprocessing in predict: refused up front.
    let out = train(&["--fold", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--no-fold-validation"),
        "{}",
        text(&out)
    );
    assert!(!t.path().join("run").join("checkpoints").exists());
    // Trained on every case, the model is refused by predict, naming the plans.
    let out = train(&[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_predict"))
        .args([
            "--model",
            s(&t.path().join("run")),
            s(&data.join("imagesTr")),
            "--out",
        ])
        .arg(t.path().join("pred"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("nnUNetPlans.json"), "{}", text(&out));
}

/// The masked MR-like set: the cache holds nnU-Net's normalization mask (`seg >= 0`), and
/// augmented patches have the masked channels zeroed outside it (nnU-Net's MaskImageTransform),
/// padding beyond the case included, while raw patches are left as read.
#[test]
fn augmented_patches_of_a_masked_cache_are_zeroed_outside_nnunets_mask() {
    use voxcache::train::augment::AugmentConfig;
    use voxcache::train::loader::{Loader, LoaderConfig};
    use voxcache::train::sampler::{Sampler, SamplerConfig};
    use voxcache::train::spatial::SpatialConfig;

    let name = "Dataset992_CacheMR";
    let (_t, cache, reader, dataset) = built(name);
    let mut entries = Vec::new();
    let (mut inside, mut outside) = (0, 0);
    for e in std::fs::read_dir(fixture(name).join("expected")).unwrap() {
        let path = e.unwrap().path();
        let id = path.file_stem().unwrap().to_string_lossy().to_string();
        let entry = reader.open_entry(&dataset, &id).unwrap();
        assert_eq!(entry.norm_mask_channels(), [0, 1], "{id}");
        let zyx = entry.shape_zyx();
        let mut mask = vec![0u16; zyx.iter().product()];
        entry.read_norm_mask([0, 0, 0], zyx, &mut mask).unwrap();
        let (_, seg) = npz(&path, "seg");
        let differ = mask
            .iter()
            .zip(&seg)
            .filter(|(&m, &s)| (m == 1) != (s >= 0.0))
            .count();
        assert_eq!(differ, 0, "{id}: the mask is not nnU-Net's seg >= 0");
        inside += mask.iter().filter(|&&m| m == 1).count();
        outside += mask.iter().filter(|&&m| m == 0).count();
        entries.push(entry);
    }
    assert!(inside > 0 && outside > 0, "{inside} in, {outside} out");

    // Intensity transforms on every patch (noise would fill the outside), every axis mirrored,
    // no spatial map: each patch is its box mirrored, so the mask can be read beside it.
    let every = AugmentConfig::every();
    let augment = AugmentConfig {
        mirror_prob: 1.0,
        spatial: SpatialConfig::none(),
        ..every.clone()
    };
    let patch = [12, 28, 28];
    let n: usize = patch.iter().product();
    // Each patch's image, its box's mask and its box as cached.
    type Check<'a> = &'a dyn Fn(&[f32], &[u16], &[f32]);
    let run = |augment: AugmentConfig, steps: u64, check: Check| {
        let sampler = Sampler::new(&entries, Vec::new(), SamplerConfig::new(patch, 2, 5)).unwrap();
        let cfg = LoaderConfig {
            workers: 2,
            augment,
            ..LoaderConfig::default()
        };
        let mut loader = Loader::start(entries.clone(), sampler, cfg, 0).unwrap();
        for _ in 0..steps {
            let (b, _) = loader.next().unwrap();
            for (i, c) in b.choices.iter().enumerate() {
                let e = &entries[c.case];
                let mut mask = vec![0u16; n];
                e.read_norm_mask(c.start_zyx, patch, &mut mask).unwrap();
                let mut raw = vec![0f32; 2 * n];
                e.read_image(c.start_zyx, patch, &mut raw).unwrap();
                check(&b.image[i * 2 * n..(i + 1) * 2 * n], &mask, &raw);
            }
        }
    };
    let zeroed_outside = std::cell::Cell::new(0usize);
    let kept_inside = std::cell::Cell::new(0usize);
    run(augment.clone(), 8, &|img, mask, _| {
        let mut mask = mask.to_vec();
        voxcache::geometry::mirror(&mut mask, patch, [true; 3]);
        for ch in img.chunks_exact(n) {
            for (v, &m) in ch.iter().zip(&mask) {
                match m {
                    0 => {
                        assert_eq!(*v, 0.0, "a masked channel is not zero outside the mask");
                        zeroed_outside.set(zeroed_outside.get() + 1);
                    }
                    _ => kept_inside.set(kept_inside.get() + usize::from(*v != 0.0)),
                }
            }
        }
    });
    assert!(zeroed_outside.get() > 0 && kept_inside.get() > 0);
    // Quarter turns too: with noise on every voxel a masked channel is zero exactly where the
    // box's mask, mirrored and turned by one of the four quarter turns, is 0.
    let turned = std::cell::Cell::new(0usize);
    let rot90 = AugmentConfig {
        rot90: true,
        ..augment.clone()
    };
    run(rot90, 8, &|img, mask, _| {
        let zeros: Vec<bool> = img[..n].iter().map(|&v| v == 0.0).collect();
        let fits: Vec<usize> = (0..4)
            .filter(|&k| {
                let mut m = mask.to_vec();
                let moves = voxcache::train::augment::Moves {
                    flips: [true; 3],
                    quarter_turns: k,
                };
                moves.apply(&mut m, patch);
                m.iter().zip(&zeros).all(|(&m, &z)| (m == 0) == z)
            })
            .collect();
        assert!(
            !fits.is_empty(),
            "no quarter turn of the mask fits the zeros"
        );
        turned.set(turned.get() + usize::from(!fits.contains(&0)));
    });
    assert!(
        turned.get() > 0,
        "no patch was turned: the check saw no turn"
    );
    // Raw patches are the cache's values, outside the mask too (nothing zeroed), and some of
    // those values are not zero (else this checks nothing).
    let raw_outside = std::cell::Cell::new(0usize);
    run(AugmentConfig::none(), 16, &|img, mask, raw| {
        assert_eq!(img, raw);
        let outside = raw[..n]
            .iter()
            .zip(mask)
            .filter(|(&v, &m)| m == 0 && v != 0.0);
        raw_outside.set(raw_outside.get() + outside.count());
    });
    assert!(
        raw_outside.get() > 0,
        "no cached value outside the mask was drawn"
    );
    // Rotated and scaled patches read the mask through the same map (no error, some zeros).
    let zeros = std::cell::Cell::new(0usize);
    run(every, 4, &|img, _, _| {
        zeros.set(zeros.get() + img.iter().filter(|&&v| v == 0.0).count())
    });
    assert!(zeros.get() > 0);

    // prep inspect --verify hashes the mask's blocks too, and names a damaged one.
    let verify = || prep(&["inspect", s(&cache), "--verify", "--json"]);
    let o = verify();
    assert!(o.status.success(), "{}", crate::common::fixtures::text(&o));
    let array = voxcache::format::NORM_MASK_ARRAY;
    let f = crate::derived::walk(&entries[0].dir().join(array))
        .into_iter()
        .max()
        .unwrap();
    let mut b = std::fs::read(&f).unwrap();
    b[0] ^= 0x55;
    std::fs::write(&f, b).unwrap();
    let o = verify();
    assert!(!o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cache"]["verify"]["corrupt"], 1, "{v}");
    assert_eq!(v["problems"][0]["array"], array, "{v}");

    // An entry whose record of the mask disagrees with its parameters is refused on opening.
    let zj = entries[1].dir().join(voxcache::format::ZARR_JSON);
    let good = std::fs::read_to_string(&zj).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 3] = [
        ("removed", |a| {
            a["derived"].as_object_mut().unwrap().remove("norm_mask");
        }),
        ("other channels", |a| {
            a["derived"]["norm_mask"]["channels"] = serde_json::json!([1]);
        }),
        ("a channel past the image's", |a| {
            a["params"]["nnunet"]["norm_mask_channels"] = serde_json::json!([0, 2]);
        }),
    ];
    for (what, edit) in edits {
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        edit(&mut v["attributes"]["voxcache"]);
        std::fs::write(&zj, v.to_string()).unwrap();
        let err = voxcache::cache::reader::EntryReader::open(entries[1].dir())
            .unwrap_err()
            .to_string();
        assert!(err.contains("norm_mask"), "{what}: {err}");
    }
    std::fs::write(&zj, good).unwrap();
}
