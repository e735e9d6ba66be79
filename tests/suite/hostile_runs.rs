//! Hostile run folders and inputs through `predict`, each child under a wall-clock limit and an
//! address-space limit (an allocation sized by a hostile field aborts the child, which fails the
//! test): a tampered run.json (absurd or inconsistent classes, zero chunk, non-positive or absurd
//! target spacing, an impossible codec level), NaN weights, an empty checkpoint path, a
//! mixed-byte-order input header, and an output damaged after a run. Each is refused with the
//! file and the field named, or (the last two) handled: the header written in one byte order,
//! the damaged output predicted again.
#![cfg(unix)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::fixtures::{bundled_cache, bundled_data, copy_tree, process_scratch, text};

/// A child must finish within this.
const LIMIT: Duration = Duration::from_secs(120);

/// A tiny model trained once for this binary.
fn model() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| {
        let run = process_scratch("hostile-model").join("run");
        let o = Command::new(env!("CARGO_BIN_EXE_train"))
            .arg("--cache-dir")
            .arg(bundled_cache("default", &[]))
            .arg("--out")
            .arg(&run)
            .args(["--patch", "8,32,32", "--steps", "4", "--base-channels", "4"])
            .args(["--stages", "3", "--val-fraction", "0", "--no-progress"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        run
    })
}

/// `predict ARGS` bounded in time and address space: (exit code, stdout + stderr).
fn predict(args: &[&str]) -> (i32, String) {
    crate::common::bounded::bounded(env!("CARGO_BIN_EXE_predict"), args, &[], LIMIT)
}

/// A change to a run.json.
type Edit = Box<dyn Fn(&mut serde_json::Value)>;

/// A copy of the model's run folder with `edit` applied to its run.json.
fn tampered(root: &Path, name: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let dir = root.join(name);
    copy_tree(model(), &dir);
    let path = dir.join("run.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
    dir
}

/// A bundled image that predicts in a fraction of a second (vessels_001, the coarse outlier, is
/// upsampled about 5x in-plane and takes 30-50 s).
fn image() -> PathBuf {
    bundled_data().join("imagesTr/vessels_003_0000.nii.gz")
}

/// `predict --model RUN IMAGE --out OUT EXTRA...` on the bundled image.
fn predict_image(run: &Path, out: &Path, extra: &[&str]) -> (i32, String) {
    let (run, image, out) = (run.to_str().unwrap(), image(), out.to_str().unwrap());
    let args = [
        &["--model", run, image.to_str().unwrap(), "--out", out],
        extra,
    ]
    .concat();
    predict(&args)
}

#[test]
fn a_tampered_run_record_is_refused_naming_the_file_and_the_field() {
    let t = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "huge",
            Box::new(|v| v["num_classes"] = 1_000_000_000_000u64.into()),
            "num_classes",
        ),
        (
            "one",
            Box::new(|v| v["num_classes"] = 1.into()),
            "num_classes",
        ),
        (
            "short",
            Box::new(|v| {
                let first = v["classes"][0].clone();
                v["classes"] = serde_json::json!([first]);
            }),
            "classes lists 1",
        ),
        (
            "twice",
            Box::new(|v| {
                v["classes"][1]["value"] = 0.into();
            }),
            "repeat",
        ),
        (
            "chunk",
            Box::new(|v| {
                v["preprocessing"]["params"]["chunk_zyx"] = serde_json::json!([0, 128, 128])
            }),
            "chunk_zyx",
        ),
        (
            "spacing",
            Box::new(|v| v["preprocessing"]["params"]["target_spacing_xyz"][0] = 0.0.into()),
            "target_spacing_xyz",
        ),
        (
            "negative",
            Box::new(|v| v["preprocessing"]["params"]["target_spacing_xyz"][2] = (-1.0).into()),
            "target_spacing_xyz",
        ),
        (
            "head",
            Box::new(|v| {
                v["num_classes"] = 3.into();
                let mut c = v["classes"].as_array().unwrap().clone();
                c.push(serde_json::json!({"value": 9, "name": "extra"}));
                v["classes"] = c.into();
            }),
            "do not fit",
        ),
        (
            "blosc",
            Box::new(|v| {
                v["preprocessing"]["params"]["compression"] =
                    serde_json::json!({"codec": "blosc", "level": 255})
            }),
            "compression: blosc level 255",
        ),
        (
            "absurd",
            Box::new(|v| {
                v["preprocessing"]["params"]["target_spacing_xyz"] =
                    serde_json::json!([1e-4, 1e-4, 1e-4])
            }),
            "or the target spacing",
        ),
        (
            "wide",
            Box::new(|v| v["config"]["max_channels"] = 1_000_000_000u64.into()),
            "max_channels",
        ),
    ];
    for (name, edit, want) in cases {
        let run = tampered(t.path(), name, edit);
        let out = t.path().join(format!("out_{name}"));
        let (code, text) = predict_image(&run, &out, &["-q"]);
        assert_ne!(code, 0, "{name}: accepted\n{text}");
        assert!(
            text.contains(want)
                && (text.contains("run.json") || text.contains("model.safetensors")),
            "{name}: expected {want:?} and the file named:\n{text}"
        );
    }
}

/// The first f32 tensor's first value in a safetensors file set to NaN, as a diverged run
/// would have saved it: the hash state.json records beside it follows.
fn poison(weights: &Path) {
    let mut bytes = std::fs::read(weights).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let (_, t) = header
        .as_object()
        .unwrap()
        .iter()
        .find(|(k, t)| *k != "__metadata__" && t["dtype"] == "F32")
        .unwrap();
    let at = 8 + n + t["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(weights, &bytes).unwrap();
    let state_path = weights.with_file_name("state.json");
    let mut state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    let hash = blake3::hash(&bytes).to_hex().to_string();
    state["extra"]["files"]["model.safetensors"] = hash.into();
    std::fs::write(&state_path, state.to_string()).unwrap();
}

#[test]
fn nan_weights_and_an_empty_checkpoint_path_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let run = tampered(t.path(), "nan", |_| {});
    for e in walk(&run.join("checkpoints")) {
        if e.file_name().is_some_and(|n| n == "model.safetensors") {
            poison(&e);
        }
    }
    let out = t.path().join("out");
    let (code, text) = predict_image(&run, &out, &[]);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("NaN") && text.contains("model.safetensors"),
        "{text}"
    );
    let (code, text) = predict_image(model(), &out, &["--checkpoint", ""]);
    assert_ne!(code, 0);
    assert!(
        text.contains("--checkpoint") && text.contains("empty"),
        "{text}"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The raw first 348 bytes of a (gzipped) NIfTI-1 file.
fn raw_header(path: &Path) -> Vec<u8> {
    use std::io::Read;
    let mut d = flate2::read::MultiGzDecoder::new(std::fs::File::open(path).unwrap());
    let mut h = vec![0u8; 348];
    d.read_exact(&mut h).unwrap();
    h
}

/// An input whose sizeof_hdr is little-endian while every other field is big-endian: the
/// output header is of one byte order (sizeof_hdr and dims read in the same order) and gives
/// the input's geometry back. Then an output damaged after the run is predicted again.
#[test]
fn a_mixed_byte_order_header_is_written_in_one_order_and_a_damaged_output_is_redone() {
    let t = tempfile::tempdir().unwrap();
    let vol = voxcache::nifti_io::read_volume(&image()).unwrap();
    let [nx, ny, nz] = vol.header.shape_xyz;
    let sp = vol.header.spacing_xyz.map(|s| s as f32);
    let mut nii = common::Nii::new([nx, ny, nz], sp, &vol.data, true);
    nii.xyzt_units = 3; // um, as the bundled data
    let mut bytes = nii.bytes();
    bytes[0..4].copy_from_slice(&348i32.to_le_bytes());
    let input = t.path().join("mixed.nii");
    std::fs::write(&input, &bytes).unwrap();
    let out = t.path().join("out");
    let args = [
        "--model",
        model().to_str().unwrap(),
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "-q",
    ];
    let (code, text) = predict(&args);
    assert_eq!(code, 0, "{text}");
    let seg = out.join("mixed.nii.gz");
    let h = raw_header(&seg);
    let sizeof_be = i32::from_be_bytes(h[0..4].try_into().unwrap());
    let dim0_be = i16::from_be_bytes(h[40..42].try_into().unwrap());
    let dims_be: Vec<i16> = (1..4)
        .map(|i| i16::from_be_bytes(h[40 + 2 * i..42 + 2 * i].try_into().unwrap()))
        .collect();
    assert_eq!((sizeof_be, dim0_be), (348, 3), "one byte order throughout");
    assert_eq!(dims_be, vec![nx as i16, ny as i16, nz as i16]);
    let back = voxcache::nifti_io::read_header(&seg).unwrap();
    assert_eq!(back.shape_xyz, [nx, ny, nz]);
    // Damaged after the run: not "already there", predicted again.
    let len = std::fs::metadata(&seg).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(len / 2).unwrap();
    let (code, text) = predict(&[args.as_slice(), &["--json"]].concat());
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("\"predicted\": 1"), "{text}");
    assert_eq!(
        voxcache::nifti_io::read_header(&seg).unwrap().shape_xyz,
        [nx, ny, nz]
    );
}

#[test]
fn a_cache_of_unlabelled_cases_is_refused_by_train_with_a_message() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    std::fs::create_dir_all(data.join("imagesTr")).unwrap();
    for id in ["vessels_003", "vessels_004"] {
        let name = format!("{id}_0000.nii.gz");
        std::fs::copy(
            bundled_data().join("imagesTr").join(&name),
            data.join("imagesTr").join(&name),
        )
        .unwrap();
    }
    let cache = t.path().join("cache");
    common::fixtures::build(&data, &cache, &[]);
    let out = t.path().join("run");
    let o = common::fixtures::run(
        "train",
        &[
            "--cache-dir",
            cache.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--steps",
            "1",
            "--no-progress",
        ],
    );
    let said = text(&o);
    // Refused as bad input (exit 2), not a panic (exit 101), naming the problem.
    assert_eq!(o.status.code(), Some(2), "{said}");
    assert!(said.contains("none of its 2 cases has a label"), "{said}");
}
