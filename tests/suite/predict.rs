//! `predict` end to end: a small model trained on the bundled data segments volumes given as
//! files or folders; every output has its input's header geometry (oblique, flipped, qform-only,
//! big-endian inputs); the training cases come back above a Dice bar (scored by `evaluate`); a
//! re-run writes nothing; a case the model cannot take fails alone, naming its files.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::fixtures::{bundled_cache, bundled_data, process_scratch, text};
use common::zarrs_box;
use common::Nii;
use voxcache::nifti_io::{read_header, read_volume};

/// A tiny model trained once for this test binary on the bundled cache.
pub(crate) fn model() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    let run = RUN.get_or_init(|| {
        let run = process_scratch("model").join("run");
        let o = Command::new(env!("CARGO_BIN_EXE_train"))
            .arg("--cache-dir")
            .arg(bundled_cache("default", &[]))
            .arg("--out")
            .arg(&run)
            .args([
                "--patch",
                "8,32,32",
                "--batch-size",
                "2",
                "--steps",
                "80",
                "--base-channels",
                "4",
                "--stages",
                "3",
                // No validation: the fixture only needs weights (validating would predict the
                // 30-50 s outlier vessels_001 for nothing).
                "--val-fraction",
                "0",
                "--no-progress",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        run
    });
    run
}

fn predict(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_predict"))
        .arg("--model")
        .arg(model())
        .args(args)
        .output()
        .unwrap()
}

fn dice(pred: &Path, truth: &Path) -> f64 {
    let (p, t) = (read_volume(pred).unwrap(), read_volume(truth).unwrap());
    assert_eq!(p.data.len(), t.data.len());
    let (mut both, mut sum) = (0u64, 0u64);
    for (a, b) in p.data.iter().zip(&t.data) {
        let (a, b) = (*a == 1.0, *b == 1.0);
        both += (a && b) as u64;
        sum += a as u64 + b as u64;
    }
    2.0 * both as f64 / sum.max(1) as f64
}

#[test]
fn the_training_cases_come_back_and_a_rerun_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("pred");
    let images = bundled_data().join("imagesTr");
    let o = predict(&[
        images.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["predicted"], 10, "{r}");
    // Scored by `evaluate` against the bundled labels (found in the dataset folder), each
    // case's Dice checked against this test's own count.
    let o = Command::new(env!("CARGO_BIN_EXE_evaluate"))
        .arg(&out)
        .arg(bundled_data())
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(e["evaluated"], 10, "{e}");
    for c in e["cases"].as_array().unwrap() {
        let id = c["id"].as_str().unwrap();
        let truth = bundled_data().join(format!("labelsTr/{id}.nii.gz"));
        let ours = dice(&out.join(format!("{id}.nii.gz")), &truth);
        let theirs = c["classes"][0]["dice"].as_f64().unwrap();
        assert!(
            (ours - theirs).abs() < 1e-12,
            "{id}: Dice {ours} vs evaluate's {theirs}"
        );
    }
    let mean = e["mean"][0]["dice"].as_f64().unwrap();
    eprintln!(
        "predict then evaluate: mean Dice {mean:.3}, HD95 {}",
        e["mean"][0]["hd95"]
    );
    assert!(mean > 0.5, "mean Dice {mean} over the training cases");
    // Again: every output is there for the same input, weights and parameters.
    let o = predict(&[
        images.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (r["predicted"].as_u64(), r["existing"].as_u64()),
        (Some(0), Some(10)),
        "{r}"
    );
    // Another overlap is another prediction.
    let o = predict(&[
        images.join("vessels_003_0000.nii.gz").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--overlap",
        "0.25",
        "--json",
    ]);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["predicted"], 1, "{r}");
    // Asked for probabilities too, that case is predicted again (they were not there), then
    // skipped. They lie on the input grid, sum to 1, and their argmax is the segmentation.
    let with_probs = |expect: &str| {
        let o = predict(&[
            images.join("vessels_003_0000.nii.gz").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--overlap",
            "0.25",
            "--save-probabilities",
            "--json",
        ]);
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r[expect], 1, "{r}");
    };
    with_probs("predicted");
    with_probs("existing");
    let seg = read_volume(&out.join("vessels_003.nii.gz")).unwrap();
    let [nx, ny, nz] = seg.header.shape_xyz;
    let probs = zarrs_box(
        &out.join("vessels_003.probabilities.zarr"),
        "",
        [0; 3],
        [nz, ny, nx],
    );
    let n = nx * ny * nz;
    assert_eq!(probs.len(), 2 * n);
    for i in 0..n {
        let (bg, fg) = (probs[i], probs[n + i]);
        assert!((bg + fg - 1.0).abs() < 2e-3, "voxel {i}: {bg} + {fg}");
        // float16 rounding can swap near-ties only.
        if (bg - fg).abs() > 2e-3 {
            assert_eq!(
                seg.data[i],
                (fg > bg) as u8 as f32,
                "voxel {i}: {bg} vs {fg}"
            );
        }
    }
    // The slab cut into bands of one window row (the smallest memory): the same
    // probabilities and segmentation, bit for bit.
    let banded = t.path().join("banded");
    let o = predict(&[
        images.join("vessels_003_0000.nii.gz").to_str().unwrap(),
        "--out",
        banded.to_str().unwrap(),
        "--overlap",
        "0.25",
        "--save-probabilities",
        "--window-memory-mib",
        "0",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read(banded.join("vessels_003.nii.gz")).unwrap(),
        std::fs::read(out.join("vessels_003.nii.gz")).unwrap()
    );
    let again = zarrs_box(
        &banded.join("vessels_003.probabilities.zarr"),
        "",
        [0; 3],
        [nz, ny, nx],
    );
    assert!(again == probs, "banded probabilities differ");
    // What a killed predict leaves (a scratch folder, a half-written output, both of a dead
    // process on this host) is removed by the next one, and looks like no output meanwhile.
    let host = voxcache::util::sysinfo::hostname();
    let dead = 4_000_000; // above Linux's pid_max
    std::fs::create_dir_all(out.join(format!(".voxcache-predict.{host}.{dead}/cache"))).unwrap();
    std::fs::write(
        out.join(format!(".vessels_000.nii.gz.tmp.{host}.{dead}")),
        b"half",
    )
    .unwrap();
    let o = predict(&[
        images.join("vessels_000_0000.nii.gz").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("removed what an interrupted predict left"));
    // No temporary file is left.
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.contains(".tmp.") || n.starts_with(".voxcache-predict"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn outputs_have_their_inputs_geometry() {
    let t = tempfile::tempdir().unwrap();
    let src = bundled_data().join("imagesTr/vessels_000_0000.nii.gz");
    let v = read_volume(&src).unwrap();
    let h = &v.header;
    let values: Vec<i16> = v.data.iter().map(|&x| x as i16).collect();
    let [sx, sy, sz] = h.spacing_xyz.map(|s| s as f32);
    let base = || {
        let mut n = Nii::new(h.shape_xyz, [sx, sy, sz], &values, false);
        n.xyzt_units = 3; // micrometres, the model's unit
        n
    };
    let dir = t.path().join("in");
    std::fs::create_dir_all(&dir).unwrap();
    // Oblique: rotated 20 degrees about z, offset.
    let mut oblique = base();
    let (c, s) = (20f32.to_radians().cos(), 20f32.to_radians().sin());
    oblique.srow = [
        [c * sx, -s * sy, 0.0, 12.5],
        [s * sx, c * sy, 0.0, -3.0],
        [0.0, 0.0, sz, 7.0],
    ];
    oblique.sform_code = 2;
    oblique.write(&dir.join("oblique_0000.nii.gz"));
    // Flipped x (a negative srow diagonal).
    let mut flipped = base();
    flipped.srow[0] = [-sx, 0.0, 0.0, 30.0];
    flipped.write(&dir.join("flipped_0000.nii.gz"));
    // qform only (a quaternion of 90 degrees about z), sform code 0.
    let mut qonly = base();
    qonly.sform_code = 0;
    qonly.qform_code = 1;
    let h2 = std::f32::consts::FRAC_1_SQRT_2;
    qonly.quatern = [0.0, 0.0, h2, 1.0, 2.0, 3.0];
    qonly.write(&dir.join("qonly_0000.nii.gz"));
    // Big-endian and stored without gzip.
    let big = Nii::new(h.shape_xyz, [sx, sy, sz], &values, true);
    let mut big = big;
    big.xyzt_units = 3;
    std::fs::write(dir.join("bigendian_0000.nii"), big.bytes()).unwrap();

    let out = t.path().join("out");
    let o = predict(&[dir.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    for (case, input) in [
        ("oblique", "oblique_0000.nii.gz"),
        ("flipped", "flipped_0000.nii.gz"),
        ("qonly", "qonly_0000.nii.gz"),
        ("bigendian", "bigendian_0000.nii"),
    ] {
        let a = read_header(&dir.join(input)).unwrap();
        let b = read_header(&out.join(format!("{case}.nii.gz"))).unwrap();
        assert_eq!(b.shape_xyz, a.shape_xyz, "{case}");
        assert_eq!(b.spacing_xyz, a.spacing_xyz, "{case}");
        assert_eq!(
            (b.qform_code, b.sform_code),
            (a.qform_code, a.sform_code),
            "{case}"
        );
        assert_eq!(b.affine_source, a.affine_source, "{case}");
        assert!(
            b.affine.max_abs_diff(&a.affine) == 0.0,
            "{case}: {:?} vs {:?}",
            b.affine,
            a.affine
        );
        assert_eq!((b.unit, b.datatype), (a.unit, "uint8"), "{case}");
        assert_eq!(b.big_endian, a.big_endian, "{case}");
    }
    // The four are the same voxels under other geometry: the same segmentation.
    let seg = |c: &str| read_volume(&out.join(format!("{c}.nii.gz"))).unwrap().data;
    let first = seg("oblique");
    for c in ["flipped", "qonly", "bigendian"] {
        assert_eq!(seg(c), first, "{c}");
    }
}

#[test]
fn a_case_the_model_cannot_take_fails_alone() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("in");
    std::fs::create_dir_all(&dir).unwrap();
    let images = bundled_data().join("imagesTr");
    for f in ["vessels_000_0000.nii.gz", "vessels_002_0000.nii.gz"] {
        std::fs::copy(images.join(f), dir.join(f)).unwrap();
    }
    // A second channel for one case: the model takes one.
    std::fs::copy(
        images.join("vessels_002_0000.nii.gz"),
        dir.join("vessels_002_0001.nii.gz"),
    )
    .unwrap();
    // Not a NIfTI at all.
    std::fs::write(dir.join("broken_0000.nii.gz"), b"not a nifti").unwrap();
    // A NaN voxel.
    let v = read_volume(&images.join("vessels_003_0000.nii.gz")).unwrap();
    let mut values = v.data.clone();
    values[1234] = f32::NAN;
    let [sx, sy, sz] = v.header.spacing_xyz.map(|s| s as f32);
    let mut nan = Nii::new(v.header.shape_xyz, [sx, sy, sz], &values, false);
    nan.xyzt_units = 3;
    nan.write(&dir.join("nan_0000.nii.gz"));
    let out = t.path().join("out");
    let o = predict(&[dir.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let e = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(out.join("vessels_000.nii.gz").is_file(), "{e}");
    assert!(!out.join("vessels_002.nii.gz").exists());
    assert!(
        e.contains("vessels_002_0001.nii.gz: channel 1 of case vessels_002, but the model takes 1 channel (vessels_002_0000.nii.gz)"),
        "{e}"
    );
    assert!(e.contains("broken_0000.nii.gz"), "{e}");
    assert!(e.contains("nan_0000.nii.gz") && e.contains("NaN"), "{e}");
    assert!(!out.join("nan.nii.gz").exists());
    // An output folder that cannot be made (under a file) stops before any work, naming it.
    let o = predict(&[
        dir.to_str().unwrap(),
        "--out",
        t.path().join("in/nan_0000.nii.gz/x").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("nan_0000.nii.gz/x"), "{}", text(&o));
    // A damaged checkpoint: the model file cut short is named.
    let cut = t.path().join("cut");
    std::fs::create_dir_all(&cut).unwrap();
    let best = std::fs::read_dir(model().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("model.safetensors").is_file())
        .unwrap();
    for f in ["run.json", "state.json", "model.safetensors"] {
        if best.join(f).is_file() {
            std::fs::copy(best.join(f), cut.join(f)).unwrap();
        }
    }
    let weights = std::fs::read(cut.join("model.safetensors")).unwrap();
    std::fs::write(cut.join("model.safetensors"), &weights[..weights.len() / 2]).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_predict"))
        .arg("--model")
        .arg(&cut)
        .arg(&dir)
        .arg("--out")
        .arg(t.path().join("out-cut"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("model.safetensors"), "{}", text(&o));
    // A run folder without checkpoints cannot predict, and says so.
    let empty = t.path().join("run");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::copy(model().join("run.json"), empty.join("run.json")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_predict"))
        .arg("--model")
        .arg(&empty)
        .arg(&dir)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no checkpoints/ folder"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_killed_predict_leaves_nothing_that_looks_complete_and_resumes() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let images = bundled_data().join("imagesTr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_predict"))
        .arg("--model")
        .arg(model())
        .arg(&images)
        .arg("--out")
        .arg(&out)
        .arg("--quiet")
        .spawn()
        .unwrap();
    // Kill it (SIGKILL: no cleanup) once its first segmentation is being written or done.
    let started = std::time::Instant::now();
    let busy = |out: &Path| {
        std::fs::read_dir(out).is_ok_and(|rd| {
            rd.flatten().any(|e| {
                let n = e.file_name().to_string_lossy().to_string();
                n.contains(".nii.gz.tmp.") || n.ends_with(".nii.gz")
            })
        })
    };
    while !busy(&out) && started.elapsed().as_secs() < 120 {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    // Whatever is there under a final name is a whole segmentation with its record.
    let finished: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".nii.gz") && !n.starts_with('.'))
        .collect();
    for n in &finished {
        let v = read_volume(&out.join(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
        assert!(!v.data.is_empty());
        let id = n.trim_end_matches(".nii.gz");
        assert!(
            out.join(format!(".{id}.voxcache.json")).is_file(),
            "{n} has no record"
        );
    }
    eprintln!(
        "killed with {} of 10 segmentations finished",
        finished.len()
    );
    // The next predict sweeps what the killed one left and does the rest.
    let o = predict(&[
        images.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["existing"].as_u64(), Some(finished.len() as u64), "{r}");
    assert_eq!(
        r["predicted"].as_u64(),
        Some(10 - finished.len() as u64),
        "{r}"
    );
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.contains(".tmp.") || n.starts_with(".voxcache-predict"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// An input folder without NIfTI images is an error, not a success with nothing predicted.
#[test]
fn an_empty_input_folder_is_an_error() {
    let t = tempfile::tempdir().unwrap();
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(empty.join("notes.txt"), "not an image").unwrap();
    let out = t.path().join("out");
    let o = predict(&[empty.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("nothing to predict") && err.contains("empty"),
        "{err}"
    );
}

#[test]
fn windows_run_only_over_the_box_of_the_nonzero_input() {
    let t = tempfile::tempdir().unwrap();
    let src = bundled_data().join("imagesTr/vessels_000_0000.nii.gz");
    let v = read_volume(&src).unwrap();
    let [nx, ny, nz] = v.header.shape_xyz;
    let [sx, sy, sz] = v.header.spacing_xyz.map(|s| s as f32);
    // The same voxels inside a frame of zeros (as a head inside the air of an MRI).
    let pad = 64;
    const RIM: usize = 4;
    let (px, py) = (nx + 2 * pad, ny + 2 * pad);
    let mut values = vec![0i16; px * py * nz];
    for z in 0..nz {
        for y in 0..ny {
            for x in 0..nx {
                values[(z * py + y + pad) * px + x + pad] = v.data[(z * ny + y) * nx + x] as i16;
            }
        }
    }
    let dir = t.path().join("in");
    std::fs::create_dir_all(&dir).unwrap();
    let mut n = Nii::new([px, py, nz], [sx, sy, sz], &values, false);
    n.xyzt_units = 3;
    n.write(&dir.join("framed_0000.nii.gz"));
    let run = |input: &Path, out: &Path| {
        let o = predict(&[
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--json",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        report["windows"].as_u64().unwrap()
    };
    let (plain, framed) = (t.path().join("plain"), t.path().join("framed"));
    let w_plain = run(&src, &plain);
    let w_framed = run(&dir.join("framed_0000.nii.gz"), &framed);
    // Nine times the plane, about the same windows.
    assert!(
        w_framed <= w_plain * 3 / 2,
        "{w_framed} windows framed, {w_plain} plain"
    );
    let a = read_volume(&plain.join("vessels_000.nii.gz")).unwrap().data;
    let b = read_volume(&framed.join("framed.nii.gz")).unwrap().data;
    let (mut both, mut sum, mut outside) = (0u64, 0u64, 0u64);
    for z in 0..nz {
        for y in 0..py {
            for x in 0..px {
                let f = b[(z * py + y) * px + x] == 1.0;
                let inside = (pad..pad + ny).contains(&y) && (pad..pad + nx).contains(&x);
                // The box is one voxel wider than the nonzero voxels on the model's grid,
                // and probabilities are resampled back linearly: a rim of the frame next to
                // the image may hold what the image's edge holds.
                let near = (pad - RIM..pad + ny + RIM).contains(&y)
                    && (pad - RIM..pad + nx + RIM).contains(&x);
                if !near {
                    outside += f as u64;
                }
                if !inside {
                    continue;
                }
                let p = a[(z * ny + y - pad) * nx + x - pad] == 1.0;
                both += (p && f) as u64;
                sum += p as u64 + f as u64;
            }
        }
    }
    assert_eq!(outside, 0, "foreground in the zero frame");
    let d = 2.0 * both as f64 / sum.max(1) as f64;
    // Not the same voxels in: the frame's zeros enter the case's z-score statistics (this
    // model's scheme is plain z-score) and the spline at the image's edge; a tiny model.
    assert!(
        d > 0.8,
        "Dice {d} between the framed and plain segmentations"
    );
}

/// Another member for an ensemble beside [`model`]: the same cache and network, another seed,
/// fewer steps (so that its probabilities differ).
fn member(dir: &Path, seed: &str) -> PathBuf {
    let run = dir.join(format!("seed{seed}"));
    let o = Command::new(env!("CARGO_BIN_EXE_train"))
        .arg("--cache-dir")
        .arg(bundled_cache("default", &[]))
        .arg("--out")
        .arg(&run)
        .args(["--patch", "8,32,32", "--batch-size", "2", "--steps", "10"])
        .args(["--base-channels", "4", "--stages", "3", "--seed", seed])
        .args(["--val-fraction", "0", "--no-progress"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    run
}

/// `predict --model A --model B --model C --save-probabilities`: the ensemble's probabilities
/// equal the mean of its members' (each predicted alone) within float16 rounding (each stored
/// value is rounded once, and a single model's windows once more), and its segmentation is the
/// argmax of that mean wherever the top two are not within rounding of each other.
#[test]
fn an_ensembles_probabilities_are_the_mean_of_its_members() {
    let t = tempfile::tempdir().unwrap();
    let members = [
        model().to_path_buf(),
        member(t.path(), "2"),
        member(t.path(), "3"),
    ];
    let images = bundled_data().join("imagesTr");
    let files: Vec<PathBuf> = ["vessels_000", "vessels_006"]
        .iter()
        .map(|id| images.join(format!("{id}_0000.nii.gz")))
        .collect();
    let run = |models: &[PathBuf], out: &Path| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_predict"));
        for m in models {
            c.arg("--model").arg(m);
        }
        let o = c
            .args(&files)
            .arg("--out")
            .arg(out)
            .args([
                "--save-probabilities",
                "--no-postprocessing",
                "--json",
                "-q",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["predicted"], 2, "{r}");
        assert_eq!(r["checkpoints"].as_array().unwrap().len(), models.len());
    };
    let alone: Vec<PathBuf> = (0..members.len())
        .map(|k| t.path().join(format!("alone{k}")))
        .collect();
    for (m, out) in members.iter().zip(&alone) {
        run(std::slice::from_ref(m), out);
    }
    let ens = t.path().join("ensemble");
    run(&members, &ens);
    for id in ["vessels_000", "vessels_006"] {
        let seg = read_volume(&ens.join(format!("{id}.nii.gz"))).unwrap();
        let [nx, ny, nz] = seg.header.shape_xyz;
        let n = nx * ny * nz;
        let zarr = |dir: &Path| {
            let z = dir.join(format!("{id}.probabilities.zarr"));
            let attrs: serde_json::Value =
                serde_json::from_slice(&std::fs::read(z.join("zarr.json")).unwrap()).unwrap();
            let values: Vec<f32> =
                serde_json::from_value(attrs["attributes"]["voxcache"]["values"].clone()).unwrap();
            (values, zarrs_box(&z, "", [0; 3], [nz, ny, nx]))
        };
        let (values, got) = zarr(&ens);
        assert_eq!(values, [0.0, 1.0], "{id}");
        assert_eq!(got.len(), values.len() * n, "{id}");
        let each: Vec<Vec<f64>> = alone
            .iter()
            .map(|d| {
                let (v, p) = zarr(d);
                assert_eq!(v, values, "{id}");
                p
            })
            .collect();
        let mean: Vec<f64> = (0..got.len())
            .map(|i| each.iter().map(|p| p[i]).sum::<f64>() / each.len() as f64)
            .collect();
        let worst = got
            .iter()
            .zip(&mean)
            .map(|(a, b)| (a - b).abs())
            .fold(0f64, f64::max);
        // Three roundings to float16 of values in [0, 1], half an ulp (2^-12) each.
        assert!(
            worst <= 3.0 / 4096.0,
            "{id}: ensemble off the mean by {worst}"
        );
        // The members differ: an ensemble of one of them would not pass.
        let spread = each[0]
            .iter()
            .zip(&each[1])
            .map(|(a, b)| (a - b).abs())
            .fold(0f64, f64::max);
        assert!(spread > 0.05, "{id}: members differ by at most {spread}");
        let mut checked = 0;
        for i in 0..n {
            let (p0, p1) = (mean[i], mean[n + i]);
            if (p0 - p1).abs() < 2e-3 {
                continue;
            }
            let want = if p1 > p0 { values[1] } else { values[0] };
            assert_eq!(seg.data[i], want, "{id}: voxel {i}, mean {p0} {p1}");
            checked += 1;
        }
        assert!(
            checked > n * 9 / 10,
            "{id}: {checked} of {n} voxels checked"
        );
        eprintln!(
            "{id}: ensemble within {worst:.2e} of the mean, members apart by up to {spread:.3}"
        );
    }
}
