//! `evaluate` on shapes with known answers, and against a whole-volume reference of the same
//! definitions (binary erosion for the edges, every pair of edge voxels for the distances) on
//! volumes that span several read blocks; classes from dataset.json (regions, ignore label) and
//! from `--labels`; errors name the case's files and leave the other cases measured.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::fixtures::text;
use common::{Lcg, Nii};
use voxcache::nifti_io::read_volume;

fn evaluate(args: &[&Path], extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_evaluate"))
        .args(args)
        .args(extra)
        .arg("--json")
        .output()
        .unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

/// Write a u8 label volume (x fastest) with micrometre units.
fn write(path: &Path, shape: [usize; 3], spacing: [f32; 3], values: &[u8]) {
    let mut n = Nii::new(shape, spacing, values, false);
    n.xyzt_units = 3;
    n.write(path);
}

fn boxed(shape: [usize; 3], lo: [usize; 3], hi: [usize; 3], value: u8) -> Vec<u8> {
    let mut v = vec![0u8; shape.iter().product()];
    for z in lo[2]..hi[2] {
        for y in lo[1]..hi[1] {
            for x in lo[0]..hi[0] {
                v[(z * shape[1] + y) * shape[0] + x] = value;
            }
        }
    }
    v
}

/// The definitions on whole volumes: a voxel of the class is an edge when a 6-neighbour is
/// outside the class or outside the grid; distances between every pair of edge voxels.
fn reference_metrics(pred: &Path, truth: &Path, value: f32) -> [f64; 4] {
    let (p, t) = (read_volume(pred).unwrap(), read_volume(truth).unwrap());
    let shape = p.header.shape_xyz;
    let s = p.header.spacing_xyz;
    let edges = |data: &[f32]| {
        let at = |x: i64, y: i64, z: i64| {
            if x < 0 || y < 0 || z < 0 {
                return false;
            }
            let (x, y, z) = (x as usize, y as usize, z as usize);
            if x >= shape[0] || y >= shape[1] || z >= shape[2] {
                return false;
            }
            data[(z * shape[1] + y) * shape[0] + x] == value
        };
        let mut out = Vec::new();
        for z in 0..shape[2] as i64 {
            for y in 0..shape[1] as i64 {
                for x in 0..shape[0] as i64 {
                    let n = [
                        (1, 0, 0),
                        (-1, 0, 0),
                        (0, 1, 0),
                        (0, -1, 0),
                        (0, 0, 1),
                        (0, 0, -1),
                    ];
                    if at(x, y, z) && n.iter().any(|d| !at(x + d.0, y + d.1, z + d.2)) {
                        out.push([x as f64 * s[0], y as f64 * s[1], z as f64 * s[2]]);
                    }
                }
            }
        }
        out
    };
    let (a, b) = (edges(&p.data), edges(&t.data));
    let directed = |from: &[[f64; 3]], to: &[[f64; 3]]| {
        let mut d: Vec<f64> = from
            .iter()
            .map(|p| {
                to.iter()
                    .map(|q| {
                        ((p[0] - q[0]).powi(2) + (p[1] - q[1]).powi(2) + (p[2] - q[2]).powi(2))
                            .sqrt()
                    })
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        d.sort_by(f64::total_cmp);
        d
    };
    let pct = |d: &[f64]| {
        let pos = 0.95 * (d.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        d[lo] + (d[hi] - d[lo]) * (pos - lo as f64)
    };
    let (ab, ba) = (directed(&a, &b), directed(&b, &a));
    let both = p
        .data
        .iter()
        .zip(&t.data)
        .filter(|(x, y)| **x == value && **y == value)
        .count();
    let count = |d: &[f32]| d.iter().filter(|v| **v == value).count();
    let dice = 2.0 * both as f64 / (count(&p.data) + count(&t.data)) as f64;
    let asd = (ab.iter().sum::<f64>() + ba.iter().sum::<f64>()) / (ab.len() + ba.len()) as f64;
    [
        dice,
        pct(&ab).max(pct(&ba)),
        ab[ab.len() - 1].max(ba[ba.len() - 1]),
        asd,
    ]
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn known_answers_of_shifted_boxes() {
    let t = tempfile::tempdir().unwrap();
    let shape = [12, 10, 9];
    let (p, r) = (t.path().join("p.nii.gz"), t.path().join("r.nii.gz"));
    // The reference is a 4x4x4 box, the prediction the same box one voxel further along x.
    write(
        &r,
        shape,
        [1.0, 2.0, 3.0],
        &boxed(shape, [2, 2, 2], [6, 6, 6], 1),
    );
    write(
        &p,
        shape,
        [1.0, 2.0, 3.0],
        &boxed(shape, [3, 2, 2], [7, 6, 6], 1),
    );
    let o = evaluate(&[&p, &r], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let j = json(&o);
    assert_eq!(j["unit"], "um");
    let m = &j["cases"][0]["classes"][0];
    assert_eq!(
        (m["tp"].as_u64(), m["fp"].as_u64(), m["fn"].as_u64()),
        (Some(48), Some(16), Some(16))
    );
    assert!(close(m["dice"].as_f64().unwrap(), 0.75), "{m}");
    assert!(close(m["iou"].as_f64().unwrap(), 0.6), "{m}");
    // Every edge voxel of one box is at most one x step (1 um) from the other's.
    assert!(close(m["hd"].as_f64().unwrap(), 1.0), "{m}");
    assert!(close(m["pred_volume"].as_f64().unwrap(), 64.0 * 6.0), "{m}");
    // Against the whole-volume definitions.
    let [dice, hd95, hd, asd] = reference_metrics(&p, &r, 1.0);
    for (k, want) in [("dice", dice), ("hd95", hd95), ("hd", hd), ("asd", asd)] {
        assert!(close(m[k].as_f64().unwrap(), want), "{k}: {m} vs {want}");
    }
}

#[test]
fn a_one_slice_image_is_measured_in_2d() {
    let t = tempfile::tempdir().unwrap();
    let shape = [10, 10, 1];
    let (p, r) = (t.path().join("p.nii.gz"), t.path().join("r.nii.gz"));
    // 4x4 squares one column apart: the edges are the 12 border pixels of each square (in 3-D
    // every pixel of a one-slice image would be an edge), 6 of 12 a side at distance 1.
    write(&r, shape, [1.0; 3], &boxed(shape, [2, 2, 0], [6, 6, 1], 1));
    write(&p, shape, [1.0; 3], &boxed(shape, [3, 2, 0], [7, 6, 1], 1));
    let j = json(&evaluate(&[&p, &r], &[]));
    let m = &j["cases"][0]["classes"][0];
    assert!(close(m["dice"].as_f64().unwrap(), 0.75), "{m}");
    assert!(close(m["hd"].as_f64().unwrap(), 1.0), "{m}");
    assert!(close(m["asd"].as_f64().unwrap(), 0.5), "{m}");
}

#[test]
fn blobs_across_read_blocks_equal_the_whole_volume_definitions() {
    // 140 x 120 x 70 voxels: 1.18 M, so slices straddle the reader's 1 M-voxel blocks.
    let shape = [140usize, 120, 70];
    let t = tempfile::tempdir().unwrap();
    let mut rng = Lcg(7);
    let mut blobs = |n: usize| {
        let centres: Vec<[f64; 4]> = (0..n)
            .map(|_| {
                [
                    rng.range(10, 130) as f64,
                    rng.range(10, 110) as f64,
                    rng.range(5, 65) as f64,
                    rng.range(3, 9) as f64,
                ]
            })
            .collect();
        let mut v = vec![0u8; shape.iter().product()];
        for z in 0..shape[2] {
            for y in 0..shape[1] {
                for x in 0..shape[0] {
                    let inside = centres.iter().any(|c| {
                        (x as f64 - c[0]).powi(2)
                            + (y as f64 - c[1]).powi(2)
                            + (2.0 * (z as f64 - c[2])).powi(2)
                            < c[3] * c[3]
                    });
                    v[(z * shape[1] + y) * shape[0] + x] = inside as u8;
                }
            }
        }
        v
    };
    let (a, b) = (blobs(6), blobs(5));
    let (p, r) = (t.path().join("p.nii"), t.path().join("r.nii.gz"));
    write(&p, shape, [0.7, 0.7, 1.6], &a);
    write(&r, shape, [0.7, 0.7, 1.6], &b);
    let o = evaluate(&[&p, &r], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let j = json(&o);
    let m = &j["cases"][0]["classes"][0];
    let [dice, hd95, hd, asd] = reference_metrics(&p, &r, 1.0);
    for (k, want) in [("dice", dice), ("hd95", hd95), ("hd", hd), ("asd", asd)] {
        assert!(close(m[k].as_f64().unwrap(), want), "{k}: {m} vs {want}");
    }
    // Blobs up to 9 voxels thick thinned in 64-voxel blocks: the halo widens until the
    // skeletons equal those of the whole volumes. Disjoint blobs score 0; against the union
    // of both, the prediction's skeleton is all inside and part of the union's is not.
    let cl = reference_cldice(&p, &r, 1.0);
    assert!(close(m["cldice"].as_f64().unwrap(), cl), "{m} vs {cl}");
    let union: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x | y).collect();
    let u = t.path().join("u.nii.gz");
    write(&u, shape, [0.7, 0.7, 1.6], &union);
    let j = json(&evaluate(&[&p, &u], &[]));
    let m = &j["cases"][0]["classes"][0];
    let cl = reference_cldice(&p, &u, 1.0);
    assert!(cl > 0.3 && cl < 0.95, "{cl}");
    assert!(close(m["cldice"].as_f64().unwrap(), cl), "{m} vs {cl}");
}

/// clDice on whole volumes: both masks thinned at once ([`voxcache::prep::derived::thinning::skeletonize`]).
fn reference_cldice(pred: &Path, truth: &Path, value: f32) -> f64 {
    let (p, t) = (read_volume(pred).unwrap(), read_volume(truth).unwrap());
    let [nx, ny, nz] = p.header.shape_xyz;
    let mask = |d: &[f32]| d.iter().map(|&v| v == value).collect::<Vec<bool>>();
    let (mp, mt) = (mask(&p.data), mask(&t.data));
    let (sp, st) = (
        voxcache::prep::derived::thinning::skeletonize(&mp, [nz, ny, nx]),
        voxcache::prep::derived::thinning::skeletonize(&mt, [nz, ny, nx]),
    );
    let share = |s: &[bool], m: &[bool]| {
        let all = s.iter().filter(|&&v| v).count() as f64;
        s.iter().zip(m).filter(|(&s, &m)| s && m).count() as f64 / all
    };
    let (prec, sens) = (share(&sp, &mt), share(&st, &mp));
    if prec + sens == 0.0 {
        0.0
    } else {
        2.0 * prec * sens / (prec + sens)
    }
}

#[test]
fn a_broken_tube_costs_cldice_far_more_than_dice() {
    // A tube three voxels across along x, 150 voxels long (three 64-voxel blocks); the
    // prediction misses 6 voxels of it in the middle.
    let shape = [150usize, 9, 9];
    let t = tempfile::tempdir().unwrap();
    let tube = boxed(shape, [0, 3, 3], [150, 6, 6], 1);
    let mut broken = tube.clone();
    for (b, g) in broken
        .iter_mut()
        .zip(boxed(shape, [72, 3, 3], [78, 6, 6], 1))
    {
        if g != 0 {
            *b = 0;
        }
    }
    let (p, r) = (t.path().join("p.nii.gz"), t.path().join("r.nii.gz"));
    write(&p, shape, [1.0; 3], &broken);
    write(&r, shape, [1.0; 3], &tube);
    let j = json(&evaluate(&[&p, &r], &[]));
    let m = &j["cases"][0]["classes"][0];
    let (dice, cldice) = (m["dice"].as_f64().unwrap(), m["cldice"].as_f64().unwrap());
    assert!(close(cldice, reference_cldice(&p, &r, 1.0)), "{m}");
    assert!(dice > 0.97 && cldice < dice, "{m}");
    // --no-cldice: not measured.
    let j = json(&evaluate(&[&p, &r], &["--no-cldice"]));
    assert!(j["cases"][0]["classes"][0]["cldice"].is_null(), "{j}");
    // Identical files: 1.
    let j = json(&evaluate(&[&r, &r], &[]));
    assert_eq!(j["cases"][0]["classes"][0]["cldice"], 1.0);
}

#[test]
fn regions_the_ignore_label_and_empty_classes() {
    let t = tempfile::tempdir().unwrap();
    let (pred, refs) = (t.path().join("pred"), t.path().join("ds/labelsTr"));
    std::fs::create_dir_all(&pred).unwrap();
    std::fs::create_dir_all(&refs).unwrap();
    std::fs::write(
        t.path().join("ds/dataset.json"),
        r#"{"channel_names": {"0": "MRI"}, "labels": {"background": 0, "core": 1, "edema": 2,
            "whole": [1, 2], "absent": 3, "ignore": 4}, "numTraining": 1, "file_ending": ".nii.gz"}"#,
    )
    .unwrap();
    let shape = [10, 10, 10];
    // Reference: core box, edema box beside it, and an unannotated slab at z >= 8.
    let mut r = boxed(shape, [2, 2, 2], [5, 5, 5], 1);
    for (i, v) in boxed(shape, [5, 2, 2], [7, 5, 5], 2)
        .into_iter()
        .enumerate()
    {
        if v != 0 {
            r[i] = v;
        }
    }
    for v in r[8 * 100..].iter_mut() {
        *v = 4;
    }
    // Prediction: core where the reference has edema and the reverse; a core blob under the
    // ignore slab (not counted); no edema.
    let mut p = boxed(shape, [2, 2, 2], [7, 5, 5], 1);
    p[9 * 100 + 55] = 1;
    write(&refs.join("a.nii.gz"), shape, [1.0; 3], &r);
    write(&pred.join("a.nii.gz"), shape, [1.0; 3], &p);
    let o = evaluate(&[&pred, &t.path().join("ds")], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let j = json(&o);
    let classes = j["cases"][0]["classes"].as_array().unwrap();
    let names: Vec<&str> = classes
        .iter()
        .map(|c| c["class"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["core", "whole", "edema", "absent"], "{j}");
    let core = &classes[0];
    assert_eq!(
        (
            core["tp"].as_u64(),
            core["fp"].as_u64(),
            core["fn"].as_u64()
        ),
        (Some(27), Some(18), Some(0))
    );
    // The region: 45 voxels each side, the same ones.
    assert_eq!(classes[1]["dice"], 1.0);
    assert_eq!(classes[1]["cldice"], 1.0);
    assert_eq!(classes[1]["hd95"], 0.0);
    // Edema predicted nowhere: Dice 0, distances undefined (null), the empty side named.
    assert_eq!(classes[2]["dice"], 0.0);
    assert_eq!(classes[2]["cldice"], 0.0);
    assert!(classes[2]["hd95"].is_null());
    assert_eq!(classes[2]["empty"], "prediction");
    // A class in neither file: nothing defined.
    assert!(classes[3]["dice"].is_null());
    assert!(classes[3]["cldice"].is_null());
    assert_eq!(classes[3]["empty"], "both");
    // --labels wins over dataset.json; its names are used.
    let o = evaluate(&[&pred, &t.path().join("ds")], &["--labels", "tumour=1+2"]);
    let j = json(&o);
    assert_eq!(j["cases"][0]["classes"][0]["class"], "tumour");
    assert_eq!(j["mean"][0]["dice"], 1.0);
}

#[test]
fn a_bad_case_fails_alone_naming_its_files() {
    let t = tempfile::tempdir().unwrap();
    let (pred, refs) = (t.path().join("pred"), t.path().join("refs"));
    std::fs::create_dir_all(&pred).unwrap();
    std::fs::create_dir_all(&refs).unwrap();
    let shape = [8, 8, 8];
    let good = boxed(shape, [2, 2, 2], [6, 6, 6], 1);
    for id in ["a", "b", "c", "d"] {
        write(&pred.join(format!("{id}.nii.gz")), shape, [1.0; 3], &good);
    }
    write(&refs.join("a.nii.gz"), shape, [1.0; 3], &good);
    // b: another grid; c: no reference; d: a NaN voxel in the prediction.
    write(&refs.join("b.nii.gz"), [8, 8, 7], [1.0; 3], &good[..448]);
    write(&refs.join("d.nii.gz"), shape, [1.0; 3], &good);
    let mut nan: Vec<f32> = good.iter().map(|&v| v as f32).collect();
    nan[100] = f32::NAN;
    let mut n = Nii::new(shape, [1.0; 3], &nan, false);
    n.xyzt_units = 3;
    n.write(&pred.join("d.nii.gz"));
    write(&refs.join("e.nii.gz"), shape, [1.0; 3], &good);
    let o = evaluate(&[&pred, &refs], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let j = json(&o);
    assert_eq!(
        (j["evaluated"].as_u64(), j["failed"].as_u64()),
        (Some(1), Some(3)),
        "{j}"
    );
    assert_eq!(j["without_prediction"], serde_json::json!(["e"]));
    let err = |i: usize| j["cases"][i]["error"].as_str().unwrap().to_string();
    assert!(
        err(1).contains("b.nii.gz") && err(1).contains("[8, 8, 7]"),
        "{}",
        err(1)
    );
    assert!(
        err(2).contains("no reference") && err(2).contains("c.nii.gz"),
        "{}",
        err(2)
    );
    assert!(
        err(3).contains("d.nii.gz") && err(3).contains("NaN"),
        "{}",
        err(3)
    );
    assert_eq!(j["cases"][0]["classes"][0]["dice"], 1.0);
    // Nothing to evaluate at all is an error of the command.
    let empty = t.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = evaluate(&[&empty, &refs], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no NIfTI files"), "{}", text(&o));
}

/// A prediction on the reference's grid written in other units (SimpleITK, hence nnU-Net,
/// writes mm for an input in um) is the same grid: scored, distances in the reference's unit.
/// The same numbers in another unit are another grid: refused.
#[test]
fn the_same_grid_in_other_units_is_scored_in_the_references_unit() {
    let t = tempfile::tempdir().unwrap();
    let shape = [8, 8, 8];
    let truth = boxed(shape, [2, 2, 2], [6, 6, 6], 1);
    let shifted = boxed(shape, [3, 2, 2], [7, 6, 6], 1);
    let reference = t.path().join("r.nii.gz");
    write(&reference, shape, [2.0; 3], &truth);
    let mm = t.path().join("mm.nii.gz");
    let mut n = Nii::new(shape, [0.002; 3], &shifted, false);
    n.xyzt_units = 2;
    n.write(&mm);
    let o = evaluate(&[&mm, &reference], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let j = json(&o);
    assert_eq!(j["unit"], "um", "{j}");
    let c = &j["cases"][0]["classes"][0];
    assert!(close(c["dice"].as_f64().unwrap(), 0.75), "{c}");
    assert!(close(c["hd"].as_f64().unwrap(), 2.0), "{c}");
    // 2 mm voxels are not 2 um voxels.
    let wrong = t.path().join("wrong.nii.gz");
    let mut n = Nii::new(shape, [2.0; 3], &shifted, false);
    n.xyzt_units = 2;
    n.write(&wrong);
    let o = evaluate(&[&wrong, &reference], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("different geometry"), "{}", text(&o));
}
