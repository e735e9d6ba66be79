//! Integration tests of the synthetic vessel dataset generator.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use nifti::{IntoNdArray, NiftiObject, ReaderOptions};
use voxcache::nifti_io::{write_nifti_i16, write_nifti_u8};
use voxcache::synth::{
    generate_case, preset_cases, write_dataset, SynthCaseSpec, SynthPreset, VesselStyle,
};

fn spec(id: &str, shape_xyz: [usize; 3], spacing_xyz: [f64; 3]) -> SynthCaseSpec {
    SynthCaseSpec {
        id: id.to_string(),
        shape_xyz,
        spacing_xyz,
        vessels: VesselStyle::Mixed,
    }
}

/// Every file under `dir`, by path relative to `dir`, with its bytes.
fn read_tree(dir: &Path) -> HashMap<String, Vec<u8>> {
    let mut out = HashMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

fn foreground_fraction(label: &[u8]) -> f64 {
    label.iter().filter(|&&v| v == 1).count() as f64 / label.len() as f64
}

#[test]
fn same_seed_gives_identical_bytes() {
    let specs = vec![
        spec("a", [40, 33, 7], [0.99, 0.99, 5.0]),
        spec("b", [29, 35, 5], [4.97, 4.97, 5.0]),
    ];
    let (d1, d2, d3) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write_dataset(d1.path(), &specs, 42, |_, _| {}).unwrap();
    write_dataset(d2.path(), &specs, 42, |_, _| {}).unwrap();
    write_dataset(d3.path(), &specs, 43, |_, _| {}).unwrap();
    let (t1, t2, t3) = (
        read_tree(d1.path()),
        read_tree(d2.path()),
        read_tree(d3.path()),
    );
    let mut names: Vec<_> = t1.keys().cloned().collect();
    names.sort();
    let sep = std::path::MAIN_SEPARATOR;
    assert_eq!(
        names,
        vec![
            "dataset.json".to_string(),
            format!("imagesTr{sep}a_0000.nii.gz"),
            format!("imagesTr{sep}b_0000.nii.gz"),
            format!("labelsTr{sep}a.nii.gz"),
            format!("labelsTr{sep}b.nii.gz"),
        ]
    );
    assert!(t1 == t2, "same seed must give byte-identical files");
    let image = format!("imagesTr{sep}a_0000.nii.gz");
    assert_ne!(
        t1[&image], t3[&image],
        "another seed must give another image"
    );

    // Generation alone is deterministic too, and does not depend on the case's position.
    let alone = generate_case(&specs[1], 42);
    assert_eq!(alone, generate_case(&specs[1], 42));
}

#[test]
fn written_file_reads_back_with_geometry_and_values() {
    let dir = tempfile::tempdir().unwrap();
    // Non-square, non-cubic shape so that any axis mix-up shows.
    let s = spec("rb", [37, 29, 6], [0.62, 0.99, 5.0]);
    let (image, label) = generate_case(&s, 7);
    let [nx, ny, nz] = s.shape_xyz;
    assert_eq!(image.len(), nx * ny * nz);
    assert_eq!(label.len(), nx * ny * nz);

    for name in ["rb_0000.nii.gz", "rb_0000.nii"] {
        let path = dir.path().join(name);
        write_nifti_i16(&path, s.shape_xyz, s.spacing_xyz, &image).unwrap();
        let obj = ReaderOptions::new().read_file(&path).unwrap();
        let h = obj.header();
        assert_eq!(&h.dim[..4], &[3, 37, 29, 6]);
        assert_eq!(h.datatype, 4, "int16");
        assert_eq!(h.bitpix, 16);
        assert_eq!(&h.pixdim[1..4], &[0.62f32, 0.99, 5.0]);
        assert_eq!(h.sform_code, 1);
        assert_eq!(h.qform_code, 1);
        assert_eq!(h.xyzt_units, 3, "micrometers");
        assert_eq!(h.srow_x, [0.62, 0.0, 0.0, 0.0]);
        assert_eq!(h.srow_y, [0.0, 0.99, 0.0, 0.0]);
        assert_eq!(h.srow_z, [0.0, 0.0, 5.0, 0.0]);
        assert_eq!((h.scl_slope, h.scl_inter), (1.0, 0.0));
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk[..2] == [0x1f, 0x8b], name.ends_with(".gz"));
        let arr = obj.into_volume().into_ndarray::<i16>().unwrap();
        assert_eq!(arr.shape(), &[37, 29, 6]);
        for z in 0..nz {
            for y in 0..ny {
                for x in 0..nx {
                    assert_eq!(arr[[x, y, z]], image[(z * ny + y) * nx + x]);
                }
            }
        }
    }

    let path = dir.path().join("rb.nii.gz");
    write_nifti_u8(&path, s.shape_xyz, s.spacing_xyz, &label).unwrap();
    let obj = ReaderOptions::new().read_file(&path).unwrap();
    assert_eq!(obj.header().datatype, 2, "uint8");
    assert_eq!(obj.header().bitpix, 8);
    let arr = obj.into_volume().into_ndarray::<u8>().unwrap();
    for z in 0..nz {
        for y in 0..ny {
            for x in 0..nx {
                assert_eq!(arr[[x, y, z]], label[(z * ny + y) * nx + x]);
            }
        }
    }
}

#[test]
fn writer_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.nii.gz");
    let err = write_nifti_u8(&path, [4, 4, 4], [1.0, 1.0, 1.0], &[0u8; 10]).unwrap_err();
    assert!(err.to_string().contains("short.nii.gz"), "{err}");
    let path = dir.path().join("wrong.txt");
    let err = write_nifti_u8(&path, [2, 2, 2], [1.0, 1.0, 1.0], &[0u8; 8]).unwrap_err();
    assert!(err.to_string().contains("wrong.txt"), "{err}");
    let path = dir.path().join("missing").join("x.nii");
    let err = write_nifti_u8(&path, [2, 2, 2], [1.0, 1.0, 1.0], &[0u8; 8]).unwrap_err();
    assert!(err.to_string().contains("x.nii"), "{err}");
}

#[test]
fn labels_are_binary_with_plausible_foreground() {
    for preset in [SynthPreset::Small, SynthPreset::Minivess] {
        let s = &preset_cases(preset, 0)[0];
        let (image, label) = generate_case(s, 0);
        assert!(label.iter().all(|&v| v <= 1), "{preset}: label not 0/1");
        let frac = foreground_fraction(&label);
        assert!(
            (0.002..=0.30).contains(&frac),
            "{preset} {}: foreground fraction {frac}",
            s.id
        );
        // Vessels are brighter than the background.
        let (mut fg, mut nfg, mut bg, mut nbg) = (0.0, 0usize, 0.0, 0usize);
        for (&v, &l) in image.iter().zip(&label) {
            if l == 1 {
                fg += v as f64;
                nfg += 1;
            } else {
                bg += v as f64;
                nbg += 1;
            }
        }
        let (fg, bg) = (fg / nfg as f64, bg / nbg as f64);
        assert!(
            (50.0..150.0).contains(&bg),
            "{preset}: background mean {bg}"
        );
        assert!(
            fg > bg + 100.0,
            "{preset}: vessel mean {fg} vs background {bg}"
        );
    }
}

#[test]
fn minivess_preset_has_the_spacing_mix() {
    let cases = preset_cases(SynthPreset::Minivess, 0);
    assert_eq!(cases.len(), 70);
    assert_eq!(cases, preset_cases(SynthPreset::Minivess, 0));
    let key = |s: [f64; 3]| format!("{:?}", s);
    let mut counts: HashMap<String, usize> = HashMap::new();
    for c in &cases {
        *counts.entry(key(c.spacing_xyz)).or_default() += 1;
        assert_eq!(&c.shape_xyz[..2], &[512, 512], "{}", c.id);
        assert!((5..=110).contains(&c.shape_xyz[2]), "{}", c.id);
    }
    for (sp, n) in [
        ([0.99, 0.99, 5.0], 31),
        ([0.62, 0.62, 5.0], 20),
        ([0.99, 0.99, 2.0], 8),
        ([0.62, 0.62, 10.0], 5),
        ([4.97, 4.97, 5.0], 1),
        ([2.48, 2.48, 5.0], 1),
    ] {
        assert_eq!(counts.get(&key(sp)).copied(), Some(n), "{sp:?}");
    }
    assert_eq!(counts.values().sum::<usize>(), 70);
    for c in &cases {
        let [sx, sy, sz] = c.spacing_xyz;
        assert!((0.31..=4.97).contains(&sx) && sx == sy && (1.0..=10.0).contains(&sz));
    }
    let outlier: Vec<_> = cases
        .iter()
        .filter(|c| c.spacing_xyz == [4.97, 4.97, 5.0])
        .collect();
    assert_eq!(outlier.len(), 1);
    assert_eq!(outlier[0].shape_xyz, [512, 512, 61]);
    let ids: std::collections::HashSet<_> = cases.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids.len(), 70);
    assert_eq!(cases[0].id, "vessels_000");
    // The order is shuffled, and the seed changes it.
    assert_ne!(
        cases.iter().map(|c| c.spacing_xyz).collect::<Vec<_>>(),
        preset_cases(SynthPreset::Minivess, 1)
            .iter()
            .map(|c| c.spacing_xyz)
            .collect::<Vec<_>>()
    );
}

#[test]
fn small_preset_is_heterogeneous_and_under_3_mb() {
    let cases = preset_cases(SynthPreset::Small, 0);
    assert_eq!(cases.len(), 10);
    let outliers = cases
        .iter()
        .filter(|c| c.spacing_xyz == [4.97, 4.97, 5.0])
        .count();
    assert_eq!(outliers, 1);
    assert!(cases.iter().any(|c| c.shape_xyz[2] == 5));
    for c in &cases {
        let [nx, ny, nz] = c.shape_xyz;
        assert!((48..=80).contains(&nx) && (48..=80).contains(&ny) && (5..=24).contains(&nz));
    }

    let dir = tempfile::tempdir().unwrap();
    let seen = AtomicUsize::new(0);
    write_dataset(dir.path(), &cases, 0, |i, s| {
        assert_eq!(s.id, cases[i].id);
        seen.fetch_add(1, Ordering::Relaxed);
    })
    .unwrap();
    assert_eq!(seen.load(Ordering::Relaxed), 10);

    let tree = read_tree(dir.path());
    let nii_bytes: usize = tree
        .iter()
        .filter(|(k, _)| k.ends_with(".nii.gz"))
        .map(|(_, v)| v.len())
        .sum();
    assert_eq!(tree.len(), 21);
    assert!(nii_bytes < 3_000_000, "small preset is {nii_bytes} bytes");

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("dataset.json")).unwrap()).unwrap();
    assert_eq!(json["numTraining"], 10);
    assert_eq!(json["file_ending"], ".nii.gz");
    assert_eq!(json["channel_names"]["0"], "two-photon");
    assert_eq!(json["labels"]["background"], 0);
    assert_eq!(json["labels"]["vessel"], 1);
    assert_eq!(json["cases"].as_array().unwrap().len(), 10);
    assert_eq!(json["cases"][3]["id"], cases[3].id.as_str());
    assert_eq!(
        json["cases"][3]["shape_xyz"],
        serde_json::json!(cases[3].shape_xyz)
    );
    assert_eq!(
        json["cases"][3]["spacing_xyz"],
        serde_json::json!(cases[3].spacing_xyz)
    );

    // Each written label reads back as 0/1 with the case's shape.
    for c in &cases {
        let path = dir.path().join("labelsTr").join(format!("{}.nii.gz", c.id));
        let obj = ReaderOptions::new().read_file(&path).unwrap();
        let arr = obj.into_volume().into_ndarray::<u8>().unwrap();
        assert_eq!(arr.shape(), &c.shape_xyz[..]);
        assert!(arr.iter().all(|&v| v <= 1));
    }
}

#[test]
fn write_dataset_rejects_bad_specs() {
    let dir = tempfile::tempdir().unwrap();
    let dup = vec![
        spec("x", [4, 4, 4], [1.0, 1.0, 1.0]),
        spec("x", [4, 4, 4], [1.0, 1.0, 1.0]),
    ];
    assert!(write_dataset(dir.path(), &dup, 0, |_, _| {}).is_err());
    let zero = vec![spec("y", [4, 0, 4], [1.0, 1.0, 1.0])];
    assert!(write_dataset(dir.path(), &zero, 0, |_, _| {}).is_err());
    let bad_spacing = vec![spec("z", [4, 4, 4], [1.0, 0.0, 1.0])];
    assert!(write_dataset(dir.path(), &bad_spacing, 0, |_, _| {}).is_err());
}

#[test]
fn preset_names_parse() {
    assert_eq!("small".parse::<SynthPreset>().unwrap(), SynthPreset::Small);
    assert_eq!(
        "minivess".parse::<SynthPreset>().unwrap(),
        SynthPreset::Minivess
    );
    let err = "tiny".parse::<SynthPreset>().unwrap_err().to_string();
    assert!(
        err.contains("tiny") && err.contains("small") && err.contains("minivess"),
        "{err}"
    );
}

/// The thin preset: every vessel one to three voxels across (two erosions with the 6-neighbour
/// cross leave nothing; one leaves a few percent), a vessel fraction of about 0.5 to 2.5%, and
/// rasterized without breaking apart: branches joined to their vessels, a few 26-connected
/// trees a case, not fragments.
#[test]
fn thin_preset_vessels_are_one_to_three_voxels_across_and_unbroken() {
    let cases = preset_cases(SynthPreset::Thin, 1);
    assert_eq!(cases.len(), 10);
    for spec in &cases {
        assert_eq!(spec.spacing_xyz, [1.0, 1.0, 1.0]);
        assert_eq!(spec.vessels, VesselStyle::Thin);
        let (_, label) = generate_case(spec, 1);
        let [nx, ny, nz] = spec.shape_xyz;
        let at = |v: &[bool], x: i64, y: i64, z: i64| {
            x >= 0
                && y >= 0
                && z >= 0
                && (x as usize) < nx
                && (y as usize) < ny
                && (z as usize) < nz
                && v[(z as usize * ny + y as usize) * nx + x as usize]
        };
        let erode = |v: &[bool]| -> Vec<bool> {
            let mut out = vec![false; v.len()];
            for z in 0..nz as i64 {
                for y in 0..ny as i64 {
                    for x in 0..nx as i64 {
                        let i = (z as usize * ny + y as usize) * nx + x as usize;
                        out[i] = v[i]
                            && [
                                (1, 0, 0),
                                (-1, 0, 0),
                                (0, 1, 0),
                                (0, -1, 0),
                                (0, 0, 1),
                                (0, 0, -1),
                            ]
                            .iter()
                            .all(|d| at(v, x + d.0, y + d.1, z + d.2));
                    }
                }
            }
            out
        };
        let fg: Vec<bool> = label.iter().map(|&v| v == 1).collect();
        let count = |v: &[bool]| v.iter().filter(|b| **b).count();
        let n = count(&fg);
        let frac = n as f64 / fg.len() as f64;
        assert!(
            (0.004..0.03).contains(&frac),
            "{}: vessel fraction {frac}",
            spec.id
        );
        let once = erode(&fg);
        assert!(
            count(&once) as f64 <= 0.12 * n as f64,
            "{}: thick vessels",
            spec.id
        );
        assert_eq!(
            count(&erode(&once)),
            0,
            "{}: a vessel wider than 3 voxels",
            spec.id
        );
        // 26-connected trees.
        let mut seen = vec![false; fg.len()];
        let mut trees = 0;
        for start in 0..fg.len() {
            if !fg[start] || seen[start] {
                continue;
            }
            let (mut size, mut stack) = (0, vec![start]);
            seen[start] = true;
            while let Some(i) = stack.pop() {
                size += 1;
                let (x, y, z) = (
                    (i % nx) as i64,
                    ((i / nx) % ny) as i64,
                    (i / (nx * ny)) as i64,
                );
                for dz in -1..=1 {
                    for dy in -1..=1 {
                        for dx in -1..=1 {
                            if at(&fg, x + dx, y + dy, z + dz) {
                                let j = ((z + dz) as usize * ny + (y + dy) as usize) * nx
                                    + (x + dx) as usize;
                                if !seen[j] {
                                    seen[j] = true;
                                    stack.push(j);
                                }
                            }
                        }
                    }
                }
            }
            trees += 1;
            assert!(size >= 3, "{}: a fragment of {size} voxels", spec.id);
        }
        assert!(trees <= 12, "{}: {trees} pieces", spec.id);
    }
}

/// The bundled data is `prep synth --preset small`'s output, byte for byte: the generator's
/// arithmetic (its random streams included) has not moved since the data was made.
#[test]
fn the_small_preset_reproduces_the_bundled_data() {
    let out = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_prep"))
        .args(["synth", "--preset", "small", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bundled = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/vessels");
    let (made, want) = (read_tree(out.path()), read_tree(&bundled));
    for (name, bytes) in &want {
        if name.ends_with(".nii.gz") {
            assert!(
                made.get(name) == Some(bytes),
                "{name} differs from the bundled file"
            );
        }
    }
    assert_eq!(
        made.keys().filter(|k| k.ends_with(".nii.gz")).count(),
        want.keys().filter(|k| k.ends_with(".nii.gz")).count()
    );
}

/// `prep synth`, `prep plan --out` and `prep inspect --preview --out` write beside a user's
/// files, never over them: each refuses, naming the file, and leaves every file as it was.
#[test]
fn outputs_never_overwrite_a_dataset() {
    use crate::common::fixtures::{bundled_data, prep, s, text};
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let mut copy = vec![bundled_data()];
    while let Some(d) = copy.pop() {
        let to = data.join(d.strip_prefix(bundled_data()).unwrap());
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.path().is_dir() {
                copy.push(e.path());
            } else {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }
    std::fs::write(data.join("notes.txt"), b"mine").unwrap();
    let before = read_tree(&data);
    let refused = |args: &[&str], names: &str| {
        let o = prep(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(names), "{args:?}: {}", text(&o));
    };
    let json = data.join("dataset.json");
    refused(&["plan", s(&data), "--out", s(&json)], "dataset.json");
    let image = data.join("imagesTr/vessels_003_0000.nii.gz");
    refused(
        &[
            "inspect",
            s(&data),
            "--preview",
            "vessels_003",
            "--out",
            s(&image),
        ],
        "vessels_003_0000.nii.gz",
    );
    // A dataset folder holding other files.
    refused(&["synth", "--out", s(&data)], "notes.txt");
    assert!(
        read_tree(&data) == before,
        "a refused command changed the dataset"
    );
    // Beside the inputs, and over an earlier synth of the same preset (finished or not), they
    // write.
    let plan = data.join("plan.toml");
    assert!(prep(&["plan", s(&data), "--out", s(&plan)])
        .status
        .success());
    let synth = t.path().join("synth");
    let ok = |args: &[&str]| {
        let o = prep(args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    };
    ok(&["synth", "--preset", "multichannel", "--out", s(&synth)]);
    ok(&[
        "synth",
        "--preset",
        "multichannel",
        "--out",
        s(&synth),
        "--seed",
        "2",
    ]);
    std::fs::remove_file(synth.join("dataset.json")).unwrap();
    ok(&["synth", "--preset", "multichannel", "--out", s(&synth)]);
    // Another preset's cases or channels would mix with these: refused.
    let made = read_tree(&synth);
    refused(&["synth", "--out", s(&synth)], "vessels_000_0001.nii.gz");
    refused(
        &["synth", "--preset", "organs", "--out", s(&synth)],
        "dataset.json",
    );
    assert!(
        read_tree(&synth) == made,
        "a refused synth changed the folder"
    );
}
