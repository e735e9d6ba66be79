//! One dataset folder holding two good cases and one file of every hostile kind at once, run
//! through the real binaries (`prep build-cache`, `prep inspect` text and `--json`,
//! `prep inspect CACHE --verify`) under a wall-clock limit and with the child's peak memory
//! measured: nothing may panic, hang or take the job down; the good cases are built and
//! verify; every bad case fails alone, its error naming its file. Unix only: named pipes,
//! symbolic links, names that are not UTF-8 and `wait4`.
#![cfg(unix)]

use crate::common;

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{write_case, Nii};

/// A child that must finish within this (the whole job is a few seconds).
const LIMIT: Duration = Duration::from_secs(60);
/// Peak resident memory allowed to the child, whatever the inputs say.
const MAX_RSS: u64 = 400 << 20;

/// What a bounded run of `prep` gave.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// The child's own peak resident set (from `wait4`), in bytes.
    max_rss: u64,
    args: String,
}

impl Run {
    fn describe(&self) -> String {
        format!(
            "prep {}: status {:?}, peak {} MiB\nstdout:\n{}\nstderr:\n{}",
            self.args,
            self.code,
            self.max_rss >> 20,
            self.stdout,
            self.stderr
        )
    }

    /// No panic, no crash by signal, memory bounded.
    fn check_sane(&self) {
        assert!(
            self.code.is_some(),
            "killed by a signal: {}",
            self.describe()
        );
        assert_ne!(self.code, Some(101), "panicked: {}", self.describe());
        assert!(
            !self.stderr.contains("panicked"),
            "panicked: {}",
            self.describe()
        );
        assert!(
            self.max_rss < MAX_RSS,
            "peak memory {} MiB over {} MiB: {}",
            self.max_rss >> 20,
            MAX_RSS >> 20,
            self.describe()
        );
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("no JSON on stdout ({e}): {}", self.describe()))
    }
}

/// Drain a child's pipe on a thread (a full pipe would otherwise stall the child).
fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = r.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    })
}

/// Run `prep ARGS`, killing it (and failing) after [`LIMIT`]; reaped with `wait4` for its
/// peak memory.
#[allow(clippy::zombie_processes)] // reaped by wait4 below, which std's wait cannot replace
fn prep_bounded(args: &[&OsStr]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_prep"))
        .args(args)
        .env_remove("VOXCACHE_FAILPOINT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start prep");
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let pid = child.id() as libc::pid_t;
    let start = Instant::now();
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value to be overwritten by wait4.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waits on our own child, writing into the two locals above.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        assert!(r >= 0, "wait4: {}", std::io::Error::last_os_error());
        if r == pid {
            break (status, usage);
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "prep {args:?} still running after {LIMIT:?}: killed (a hang)\nstderr so far:\n{}",
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Run {
        code,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        // Linux reports ru_maxrss in KiB.
        max_rss: usage.ru_maxrss as u64 * 1024,
        args: args
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// A good int16 image of `shape` (x fastest), as `write_case` makes them, for hostile copies.
fn image(shape: [usize; 3], spacing: [f32; 3]) -> Nii {
    let n = shape.iter().product::<usize>();
    let vals: Vec<i16> = (0..n).map(|i| (i * 37 % 1000) as i16).collect();
    Nii::new(shape, spacing, &vals, false)
}

/// Gzip `bytes` into memory.
fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A bad case: its id, the file its error must name, and a word the error must hold
/// (lowercase; `None` where several wordings are right, as for a gzip stream broken mid-way).
struct Bad {
    id: String,
    file: String,
    needle: Option<&'static str>,
}

fn bad(id: &str, file: &str, needle: impl Into<Option<&'static str>>) -> Bad {
    Bad {
        id: id.into(),
        file: file.into(),
        needle: needle.into(),
    }
}

/// The dataset: two good cases and the hostile files, with what each must fail with.
fn hostile_dataset(root: &Path) -> (PathBuf, Vec<Bad>) {
    let data = root.join("hostile");
    write_case(&data, "good1", [12, 10, 6], [1.0, 1.0, 2.0], 1);
    write_case(&data, "good2", [10, 12, 5], [0.8, 0.8, 2.5], 2);
    let img = |id: &str| data.join(format!("imagesTr/{id}_0000.nii.gz"));
    let lab = |id: &str| data.join(format!("labelsTr/{id}.nii.gz"));
    let img_name = |id: &str| format!("{id}_0000.nii.gz");
    let mut bads = Vec::new();

    // Header fields.
    // A huge finite spacing: an output of u64::MAX voxels. Unlabelled and first by name, so
    // the dry run's forecast meets it before any labelled case.
    let mut n = image([10, 8, 4], [1.0; 3]);
    n.pixdim[1] = 1e30;
    n.write(&img("absurd_spacing"));
    bads.push(bad("absurd_spacing", &img_name("absurd_spacing"), "pixdim"));
    let mut n = image([10, 8, 4], [1.0; 3]);
    n.pixdim[2] = f32::NAN;
    n.write(&img("nan_pixdim"));
    bads.push(bad("nan_pixdim", &img_name("nan_pixdim"), "spacing"));
    let mut n = image([10, 8, 4], [1.0; 3]);
    n.dims[1] = 0;
    n.write(&img("zero_dim"));
    bads.push(bad("zero_dim", &img_name("zero_dim"), "dim[2]"));
    // dim[0] = 9: no byte order makes it 1..7 (read the other way round it is 2304).
    let mut b = image([10, 8, 4], [1.0; 3]).bytes();
    b[40..42].copy_from_slice(&9i16.to_le_bytes());
    std::fs::write(img("dim0"), gz(&b)).unwrap();
    bads.push(bad("dim0", &img_name("dim0"), "dim[0]"));
    let mut n = image([10, 8, 4], [1.0; 3]);
    n.datatype = 32; // complex64
    n.bitpix = 64;
    n.write(&img("complex64"));
    bads.push(bad("complex64", &img_name("complex64"), "datatype"));
    let mut n = image([10, 8, 4], [1.0; 3]);
    n.datatype = 128; // RGB24
    n.bitpix = 24;
    n.write(&img("rgb24"));
    bads.push(bad("rgb24", &img_name("rgb24"), "datatype"));
    let mut n = image([10, 8, 4], [1.0; 3]);
    (n.qform_code, n.sform_code) = (1, 0);
    n.quatern = [0.8, 0.6, 0.3, 0.0, 0.0, 0.0];
    n.write(&img("quaternion"));
    bads.push(bad("quaternion", &img_name("quaternion"), "not a rotation"));
    let mut n = image([10, 8, 4], [1.0; 3]);
    n.magic = *b"xyz\0";
    n.write(&img("magic"));
    bads.push(bad("magic", &img_name("magic"), "magic"));
    // NIfTI-2: an axis wider than the reader takes.
    let mut b = image([10, 8, 4], [1.0; 3]).bytes_v2();
    b[24..32].copy_from_slice(&40_000i64.to_le_bytes()); // dim[1]
    std::fs::write(img("nifti2_wide"), gz(&b)).unwrap();
    bads.push(bad("nifti2_wide", &img_name("nifti2_wide"), "32767"));
    let mut n = image([10, 8, 2], [1.0; 3]);
    n.dims = vec![10, 8, 1, 2];
    n.write(&img("two_frames"));
    bads.push(bad("two_frames", &img_name("two_frames"), "4d"));

    // The voxel data against the header.
    let mut b = image([10, 8, 4], [1.0; 3]).bytes();
    b[108..112].copy_from_slice(&1.0e6f32.to_le_bytes());
    std::fs::write(img("vox_offset"), gz(&b)).unwrap();
    bads.push(bad("vox_offset", &img_name("vox_offset"), "truncated"));
    let b = image([10, 8, 4], [1.0; 3]).bytes();
    std::fs::write(
        data.join("imagesTr/cut_voxels_0000.nii"),
        &b[..b.len() - 100],
    )
    .unwrap();
    bads.push(bad("cut_voxels", "cut_voxels_0000.nii", "truncated"));
    std::fs::write(img("header_only"), gz(&b[..352])).unwrap();
    bads.push(bad("header_only", &img_name("header_only"), "truncated"));
    let mut n = image([10, 8, 4], [1.0; 3]);
    n.dims = vec![32767, 32767, 32767];
    n.write(&img("lying_dims"));
    bads.push(bad("lying_dims", &img_name("lying_dims"), "truncated"));
    // A lie under --max-case-gib (745 GiB of output) but over any disk's free space: it must
    // fail alone, not stop the job at the free-space check.
    n.dims = vec![20000, 20000, 500];
    n.write(&img("lying_disk"));
    bads.push(bad("lying_disk", &img_name("lying_disk"), "truncated"));
    std::fs::write(img("empty"), b"").unwrap();
    bads.push(bad("empty", &img_name("empty"), "not a nifti file"));
    let mut v: Vec<f32> = (0..320).map(|i| i as f32).collect();
    v[33] = f32::NAN;
    Nii::new([10, 8, 4], [1.0; 3], &v, false).write(&img("nan_voxel"));
    bads.push(bad("nan_voxel", &img_name("nan_voxel"), "nan"));

    // Gzip streams: bytes flipped mid-stream, the trailer cut, a bomb of zeros after the voxels.
    let big = image([32, 32, 16], [1.0; 3]);
    let mut g = gz(&big.bytes());
    let mid = g.len() / 2;
    for k in 0..4 {
        g[mid + k] ^= 0xa5;
    }
    std::fs::write(img("gz_flipped"), &g).unwrap();
    bads.push(bad("gz_flipped", &img_name("gz_flipped"), None));
    let g = gz(&big.bytes());
    std::fs::write(img("gz_cut_trailer"), &g[..g.len() - 8]).unwrap();
    bads.push(bad(
        "gz_cut_trailer",
        &img_name("gz_cut_trailer"),
        "truncated",
    ));
    // Written a MiB at a time: the child's peak memory counts this process's at its start.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(&image([10, 8, 4], [1.0; 3]).bytes()).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..512 {
        e.write_all(&zeros).unwrap();
    }
    let mut g = e.finish().unwrap();
    let n = g.len();
    g[n - 8] ^= 0x55; // so that it fails, after everything was inflated
    std::fs::write(img("gz_bomb"), &g).unwrap();
    bads.push(bad("gz_bomb", &img_name("gz_bomb"), "gzip"));

    // Labels.
    write_case(&data, "label_frac", [10, 8, 4], [1.0; 3], 3);
    Nii::new([10, 8, 4], [1.0; 3], &vec![0.5f32; 320], false).write(&lab("label_frac"));
    bads.push(bad("label_frac", "label_frac.nii.gz", "whole numbers"));
    write_case(&data, "label_neg", [10, 8, 4], [1.0; 3], 4);
    Nii::new([10, 8, 4], [1.0; 3], &vec![-1i16; 320], false).write(&lab("label_neg"));
    bads.push(bad("label_neg", "label_neg.nii.gz", "whole numbers"));
    write_case(&data, "label_shape", [10, 8, 4], [1.0; 3], 5);
    Nii::new([10, 8, 5], [1.0; 3], &vec![0u8; 400], false).write(&lab("label_shape"));
    bads.push(bad("label_shape", "label_shape.nii.gz", "voxels"));
    write_case(&data, "label_affine", [10, 8, 4], [1.0; 3], 8);
    Nii::new([10, 8, 4], [1.0, 1.0, 2.0], &vec![0u8; 320], false).write(&lab("label_affine"));
    bads.push(bad("label_affine", "label_affine.nii.gz", "geometry"));
    Nii::new([10, 8, 4], [1.0; 3], &vec![0u8; 320], false).write(&lab("orphan"));
    bads.push(bad("orphan", "orphan.nii.gz", "without an image"));

    // Discovery: one case twice, a second channel, things that are not regular files.
    write_case(&data, "twice", [10, 8, 4], [1.0; 3], 6);
    image([10, 8, 4], [1.0; 3]).write(&data.join("imagesTr/twice_0000.nii"));
    bads.push(bad("twice", "twice_0000.nii", "two images"));
    write_case(&data, "channels", [10, 8, 4], [1.0; 3], 7);
    image([10, 8, 4], [1.0; 3]).write(&data.join("imagesTr/channels_0001.nii.gz"));
    bads.push(bad(
        "channels",
        "channels_0001.nii.gz",
        "channel 1 of case channels, but most cases have 1 channel",
    ));
    // A macOS resource fork: hidden, so not a case at all.
    std::fs::write(
        data.join("imagesTr/._good1_0000.nii.gz"),
        b"\0\x05\x16\x07junk",
    )
    .unwrap();
    std::fs::create_dir_all(img("folder")).unwrap();
    bads.push(bad("folder", &img_name("folder"), "folder"));
    let fifo = std::ffi::CString::new(img("pipe").into_os_string().into_vec()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let made = unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) };
    assert_eq!(made, 0, "mkfifo: {}", std::io::Error::last_os_error());
    bads.push(bad("pipe", &img_name("pipe"), "named pipe"));
    std::os::unix::fs::symlink(img("loop"), img("loop")).unwrap();
    bads.push(bad("loop", &img_name("loop"), "symbolic links"));
    let name = OsStr::from_bytes(b"not_utf8_\xff_0000.nii.gz");
    image([10, 8, 4], [1.0; 3]).write(&data.join("imagesTr").join(name));
    bads.push(bad("not_utf8_", "not_utf8_\u{fffd}_0000.nii.gz", "utf-8"));
    (data, bads)
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

#[test]
fn a_dataset_of_hostile_files_builds_its_good_cases_and_names_every_bad_file() {
    let t = tempfile::tempdir().unwrap();
    let (data, bads) = hostile_dataset(t.path());
    let cache = t.path().join("cache");

    // The dry run prints the plan of everything readable (absurd outputs included).
    let dry = prep_bounded(&[
        os("build-cache"),
        data.as_os_str(),
        os("--cache-dir"),
        cache.as_os_str(),
        os("--dry-run"),
    ]);
    dry.check_sane();
    assert_eq!(dry.code, Some(1), "{}", dry.describe());
    assert!(dry.stdout.contains("forecast at"), "{}", dry.describe());
    assert!(!cache.exists(), "a dry run writes nothing");

    let build = prep_bounded(&[
        os("build-cache"),
        data.as_os_str(),
        os("--cache-dir"),
        cache.as_os_str(),
        os("--json"),
        os("-j"),
        os("2"),
    ]);
    build.check_sane();
    assert_eq!(build.code, Some(1), "{}", build.describe());
    let r = build.json();
    let cases = r["cases"].as_array().unwrap();
    let outcome = |id: &str| {
        cases
            .iter()
            .filter(|c| c["id"].as_str().is_some_and(|i| i.starts_with(id)))
            .map(|c| {
                let status = c["outcome"]["status"].as_str().unwrap_or("").to_string();
                let error = c["outcome"]["error"].as_str().unwrap_or("").to_string();
                (status, error)
            })
            .collect::<Vec<_>>()
    };
    // Exactly the two good cases are built, and they verify.
    for id in ["good1", "good2"] {
        assert_eq!(
            outcome(id),
            vec![("built".to_string(), String::new())],
            "{id}"
        );
    }
    assert_eq!(r["built"], 2, "{}", build.describe());
    assert_eq!(r["failed"], bads.len(), "{}", build.describe());
    let mut wrong = Vec::new();
    for b in &bads {
        let got = outcome(&b.id);
        let named = got.iter().any(|(status, e)| {
            status == "failed"
                && e.contains(&b.file)
                && b.needle.is_none_or(|w| e.to_lowercase().contains(w))
        });
        if !named {
            wrong.push(format!("{} ({}, {:?}): {got:?}", b.id, b.file, b.needle));
        }
    }
    assert!(
        wrong.is_empty(),
        "bad cases not failed with their file named:\n{}",
        wrong.join("\n")
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.join("manifest.json")).unwrap()).unwrap();
    let listed: Vec<&String> = manifest["datasets"]["hostile"]["cases"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(listed, vec!["good1", "good2"]);
    let verify = prep_bounded(&[os("inspect"), cache.as_os_str(), os("--verify")]);
    verify.check_sane();
    assert_eq!(verify.code, Some(0), "{}", verify.describe());

    // inspect, before building: every bad case is a problem naming its file.
    let text = prep_bounded(&[os("inspect"), data.as_os_str()]);
    text.check_sane();
    assert_eq!(text.code, Some(1), "{}", text.describe());
    assert!(text.stdout.contains("good2"), "{}", text.describe());
    let json = prep_bounded(&[os("inspect"), data.as_os_str(), os("--json")]);
    json.check_sane();
    assert_eq!(json.code, Some(1), "{}", json.describe());
    let j = json.json();
    let problems = j["problems"].as_array().unwrap();
    let mut unnamed = Vec::new();
    for b in &bads {
        // The file is the problem's path, or named in its message (image and label pairs).
        let named = problems.iter().any(|p| {
            let message = p["message"].as_str().unwrap_or("");
            let path = p["path"].as_str().unwrap_or("");
            p["severity"] == "error"
                && (path.ends_with(&b.file) || message.contains(&b.file))
                && b.needle.is_none_or(|w| message.to_lowercase().contains(w))
        });
        if !named {
            unnamed.push(format!("{} ({}, {:?})", b.id, b.file, b.needle));
        }
    }
    assert!(
        unnamed.is_empty(),
        "inspect does not name these bad files: {unnamed:?}\n{}",
        serde_json::to_string_pretty(&j["problems"]).unwrap()
    );
    let planned: Vec<&str> = j["dataset"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["forecast"].is_null())
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert!(
        planned.contains(&"good1") && planned.contains(&"good2"),
        "{planned:?}"
    );
}
