//! The cascade's previous stage from the first stage's probabilities, as nnU-Net's training
//! takes it: where `CASE.probabilities.zarr` lies beside a segmentation, the cached channels
//! are the argmax of the probabilities resampled linearly to the cache's grid (not the label
//! map resampled); the entry's key follows the probabilities; an array made for another grid
//! fails its case, named.

use crate::common;

use std::path::Path;

use common::fixtures::{prep, s, text};
use voxcache::cache::reader::CacheReader;
use voxcache::format::labels::{ClassInfo, Labels};
use voxcache::geometry::Block;
use voxcache::infer::prob_zarr::ProbabilityZarr;
use voxcache::nifti_io::{read_header, read_volume};
use voxcache::prep::resample::LinearResampler;

/// Class probabilities over a case's grid (z, y, x), smooth in space and nowhere tied: four
/// classes whose weights are waves of different phases, normalized to sum to 1.
fn probabilities(shape: [usize; 3], phase: f32) -> Vec<Vec<f32>> {
    let n: usize = shape.iter().product();
    let mut p = vec![vec![0f32; n]; 4];
    for i in 0..n {
        let (z, y, x) = (
            (i / (shape[1] * shape[2])) as f32,
            ((i / shape[2]) % shape[1]) as f32,
            (i % shape[2]) as f32,
        );
        let w: Vec<f32> = (0..4)
            .map(|c| {
                let c = c as f32;
                (1.3 + (0.21 * x + 0.9 * c + phase).sin()
                    + 0.7 * (0.17 * y - 0.5 * c).cos()
                    + 0.4 * (0.3 * z + c * c).sin())
                .exp()
            })
            .collect();
        let sum: f32 = w.iter().sum();
        for (pc, wc) in p.iter_mut().zip(&w) {
            pc[i] = wc / sum;
        }
    }
    p
}

/// Write `p` as `CASE.probabilities.zarr` at `dest` for the image whose header is `image`'s.
fn write_probabilities(image: &Path, p: &[Vec<f32>], dest: &Path, shape_zyx: [usize; 3]) {
    let mut header = read_header(image).unwrap();
    header.shape_xyz = [shape_zyx[2], shape_zyx[1], shape_zyx[0]];
    let names = ["background", "a", "b", "c"];
    let classes = (0..4).map(|v| ClassInfo {
        value: v,
        name: names[v as usize].into(),
    });
    let outputs = Labels::of_classes(classes.collect(), None).unwrap();
    let rows = 5;
    let tmp = dest.with_extension("tmp");
    let z = ProbabilityZarr::create(&tmp, &header, &outputs, rows).unwrap();
    let plane = shape_zyx[1] * shape_zyx[2];
    for (c, pc) in p.iter().enumerate() {
        for z0 in (0..shape_zyx[0]).step_by(rows) {
            let end = (z0 + rows).min(shape_zyx[0]);
            z.write_slab(c, z0, &pc[z0 * plane..end * plane]).unwrap();
        }
    }
    z.finish(dest).unwrap();
}

/// The brats-like preset in `dir/brats`, and `dir/prev`, a first stage's folder holding its
/// labels as the segmentations (12 cases).
fn brats_and_previous(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (data, prev) = (dir.join("brats"), dir.join("prev"));
    let o = prep(&["synth", "--preset", "brats-like", "--out", s(&data)]);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::create_dir_all(&prev).unwrap();
    for i in 0..12 {
        let id = format!("brats_{i:03}");
        std::fs::copy(
            data.join(format!("labelsTr/{id}.nii.gz")),
            prev.join(format!("{id}.nii.gz")),
        )
        .unwrap();
    }
    (data, prev)
}

#[test]
fn previous_stage_probabilities_are_resampled_and_their_argmax_cached() {
    let t = tempfile::tempdir().unwrap();
    let (data, prev) = brats_and_previous(t.path());
    let cache = t.path().join("cache");
    let image = |id: &str| data.join(format!("imagesTr/{id}_0000.nii.gz"));
    let shape_of = |id: &str| {
        let [x, y, z] = read_header(&image(id)).unwrap().shape_xyz;
        [z, y, x]
    };
    // brats_001 and brats_002 have probabilities; brats_003's are on another grid.
    for (id, phase) in [("brats_001", 0.0), ("brats_002", 1.0)] {
        let shape = shape_of(id);
        let dest = prev.join(format!("{id}.probabilities.zarr"));
        write_probabilities(&image(id), &probabilities(shape, phase), &dest, shape);
    }
    let mut wrong = shape_of("brats_003");
    wrong[0] += 1;
    let dest = prev.join("brats_003.probabilities.zarr");
    write_probabilities(
        &image("brats_003"),
        &probabilities(wrong, 0.0),
        &dest,
        wrong,
    );

    // Another grid than the input's: resampling is not the identity on any axis.
    let build = || {
        prep(&[
            "build-cache",
            s(&data),
            "--cache-dir",
            s(&cache),
            "--previous-stage",
            s(&prev),
            "--spacing",
            "1.5,1.25,1.75",
        ])
    };
    let o = build();
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("11 built"), "{out}");
    assert!(
        out.contains("brats_003.probabilities.zarr") && out.contains("another grid"),
        "{out}"
    );

    let reader = CacheReader::open(&cache).unwrap();
    let ds = reader.datasets()[0].to_string();
    for (id, phase) in [("brats_001", 0.0), ("brats_002", 1.0)] {
        let e = reader.open_entry(&ds, id).unwrap();
        let out_shape = e.shape_zyx();
        let in_shape = shape_of(id);
        assert_ne!(out_shape, in_shape);
        let n: usize = out_shape.iter().product();
        // The reference: each class (as stored, float16) resampled alone, then the argmax.
        let linear = LinearResampler::new(in_shape, out_shape);
        let whole = Block {
            start: [0, 0, 0],
            size: out_shape,
        };
        let mut best = vec![(f32::NEG_INFINITY, 0u16); n];
        for (c, pc) in probabilities(in_shape, phase).iter().enumerate() {
            let stored: Vec<f32> = pc
                .iter()
                .map(|&v| half::f16::from_f32(v).to_f32())
                .collect();
            let mut r = vec![0f32; n];
            linear.fill(&stored, whole, &mut r);
            for (b, &v) in best.iter_mut().zip(&r) {
                if v > b.0 {
                    *b = (v, c as u16);
                }
            }
        }
        let segmentation = read_volume(&prev.join(format!("{id}.nii.gz"))).unwrap();
        for k in 0..3u16 {
            let mut ch = vec![0f32; n];
            e.read_channel(4 + k as usize, [0, 0, 0], out_shape, &mut ch)
                .unwrap();
            let want: Vec<f32> = best
                .iter()
                .map(|&(_, c)| (c == k + 1) as u8 as f32)
                .collect();
            assert_eq!(ch, want, "{id} label {}", k + 1);
            assert!(want.contains(&1.0), "{id} label {}", k + 1);
            // Not the segmentation's channel: the probabilities were used.
            let from_seg = segmentation.data.iter().filter(|&&l| l == (k + 1) as f32);
            assert_ne!(
                ch.iter().filter(|&&v| v == 1.0).count(),
                from_seg.count(),
                "{id} label {}",
                k + 1
            );
        }
        assert_eq!(
            e.sources().images[4].file,
            format!("{id}.probabilities.zarr"),
            "the entry names what the channel was made from"
        );
    }

    // The key follows the probabilities: brats_002's changed, it alone is rebuilt.
    std::fs::remove_dir_all(prev.join("brats_003.probabilities.zarr")).unwrap();
    let o = build();
    assert!(text(&o).contains("1 built, 11 cached"), "{}", text(&o));
    let id = "brats_002";
    let shape = shape_of(id);
    let dest = prev.join(format!("{id}.probabilities.zarr"));
    write_probabilities(&image(id), &probabilities(shape, 2.0), &dest, shape);
    let o = build();
    assert!(text(&o).contains("1 built, 11 cached"), "{}", text(&o));
}

/// A second stage trained on a cache built from the first stage's probabilities validates its
/// fold: the held-out cases' entries name the probabilities, and the fold validation (which
/// builds them again from the same folder) takes those as the files the entries were built from.
#[test]
fn a_second_stage_built_from_probabilities_validates_its_fold() {
    let t = tempfile::tempdir().unwrap();
    let (data, prev) = brats_and_previous(t.path());
    let (cache, run) = (t.path().join("cache"), t.path().join("run"));
    for i in 0..12 {
        let id = format!("brats_{i:03}");
        let image = data.join(format!("imagesTr/{id}_0000.nii.gz"));
        let [x, y, z] = read_header(&image).unwrap().shape_xyz;
        let dest = prev.join(format!("{id}.probabilities.zarr"));
        write_probabilities(
            &image,
            &probabilities([z, y, x], i as f32),
            &dest,
            [z, y, x],
        );
    }
    let o = prep(&[
        "build-cache",
        s(&data),
        "--cache-dir",
        s(&cache),
        "--previous-stage",
        s(&prev),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_train"))
        .args(["--cache-dir", s(&cache), "--out", s(&run), "--fold", "0"])
        .args(["--patch", "16,32,32", "--batch-size", "2", "--steps", "2"])
        .args(["--base-channels", "4", "--stages", "3", "--no-progress"])
        .output()
        .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(!out.contains("is not the file"), "{out}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("validation/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["failed"], 0, "{summary}");
    assert!(summary["evaluated"].as_u64().unwrap() > 0, "{summary}");
}
