//! The NIfTI header fuzzer's target, shared by `examples/fuzz_headers.rs` (long runs) and
//! `tests/fuzz_corpus.rs` (the corpus replay and a short run in the test suite), so both feed
//! an input through exactly the same stages:
//! 1. the header parser (`nifti_io::parse_header_bytes`, what `read_header` does on a file);
//! 2. when it accepts, the planning a build and `prep inspect` do from headers alone: the
//!    image/label check, the target spacing (auto and explicit), the per-case plans with
//!    their size limits, the dry-run text, the output affine;
//! 3. the whole-file reader (`nifti_io::read_volume`, the build's streaming pass, on the input
//!    written to a scratch file) and the label conversion.
//!
//! A panic anywhere is the finding; so is a broken invariant (checked with `assert!`): a
//! refusal that does not name the file, an accepted header with a zero or non-finite field, a
//! plan that loses a voxel. Included with `#[path]` by the example (the crate's public API
//! does not grow for it); it needs a root module `nii` (tests/common/nii.rs) beside it.

pub(crate) mod mutate;
pub(crate) mod seeds;

use std::path::{Path, PathBuf};

use voxcache::config::SpacingChoice;
use voxcache::format::ImageDtype;
use voxcache::geometry::voxels;
use voxcache::inspect::dataset_report::render_plan;
use voxcache::nifti_io::{self, HeaderInfo};
use voxcache::prep::dataset::scan::{check_pair, ScannedCase};
use voxcache::prep::dataset::CaseSource;
use voxcache::prep::plan::{decide_spacing, plan_scanned, MAX_OUTPUT_SIDE};

/// The file name every input is read under; every refusal must name it.
pub(crate) const INPUT_NAME: &str = "fuzz_input.nii";

/// What the stages made of one input.
#[derive(Clone, Debug, Default)]
pub(crate) struct Outcome {
    /// The header parser accepted it (and so the plan ran).
    pub(crate) accepted: bool,
    /// The whole file read and decoded (only tried when the header was accepted).
    pub(crate) decoded: bool,
    /// The header was accepted and the uncompressed file holds every voxel byte the header
    /// declares, yet the whole-file reader refused it: the stages disagree (its error).
    pub(crate) disagreement: Option<String>,
}

/// Where the whole-file reader reads the inputs from: one scratch file, rewritten per input
/// (in memory under /dev/shm where there is one).
pub(crate) struct Target {
    _dir: tempfile::TempDir,
    file: PathBuf,
}

impl Target {
    pub(crate) fn new() -> Target {
        let dir = tempfile::Builder::new()
            .prefix("voxcache-fuzz")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("a scratch folder");
        let file = dir.path().join(INPUT_NAME);
        Target { _dir: dir, file }
    }

    /// Feed one input through the header parser, the plan and the reader. Panics on a
    /// finding.
    pub(crate) fn run(&self, bytes: &[u8]) -> Outcome {
        fuzz_one(bytes, &self.file)
    }
}

fn fuzz_one(bytes: &[u8], scratch: &Path) -> Outcome {
    let path = Path::new(INPUT_NAME);
    let header = match nifti_io::parse_header_bytes(path, bytes) {
        Ok(h) => h,
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains(INPUT_NAME), "a refusal without the file: {e}");
            return Outcome::default();
        }
    };
    check_header(&header);
    plan_header(&header);
    let (decoded, disagreement) = read_whole(bytes, &header, scratch);
    Outcome {
        accepted: true,
        decoded,
        disagreement,
    }
}

/// What an accepted header promises everything after it.
fn check_header(h: &HeaderInfo) {
    assert!(
        h.shape_xyz
            .iter()
            .all(|&n| (1..=i16::MAX as usize).contains(&n)),
        "shape {:?}",
        h.shape_xyz
    );
    assert!(
        h.spacing_xyz.iter().all(|s| s.is_finite() && *s > 0.0),
        "spacing {:?}",
        h.spacing_xyz
    );
    assert!(h.affine.is_finite(), "affine {:?}", h.affine);
    assert!([1, 2, 4, 8].contains(&h.bytes_per_voxel), "{}", h.datatype);
    assert!(h.vox_offset >= 352, "vox_offset {}", h.vox_offset);
    let bytes = h.voxel_count().checked_mul(h.bytes_per_voxel as u64);
    assert_eq!(bytes, Some(h.data_bytes()));
    check_pair("fuzz", h, h).expect("a header is its own label's grid");
    let codes = h.affine.axis_codes();
    assert!(codes.len() == 3, "orientation {codes}");
    serde_json::to_string(h).expect("a header serializes");
}

/// A case as scanned: `image` with itself as label (or none).
fn scanned(id: &str, image: &HeaderInfo, labelled: bool) -> ScannedCase {
    ScannedCase {
        source: CaseSource::single(id, image.path.clone(), labelled.then(|| image.path.clone())),
        image: image.clone(),
        other_channels: Vec::new(),
        label: labelled.then(|| image.clone()),
    }
}

/// Plan the header alone and among ordinary cases, at the auto spacing and at explicit
/// ones, as `prep build-cache`, its `--dry-run` and `prep inspect` do.
fn plan_header(h: &HeaderInfo) {
    let mut ordinary = [h.clone(), h.clone()];
    ordinary[0].shape_xyz = [512, 512, 40];
    ordinary[0].spacing_xyz = [0.7, 0.7, 5.0];
    ordinary[1].shape_xyz = [64, 48, 30];
    ordinary[1].spacing_xyz = [1.0, 1.0, 1.0];
    let alone = vec![scanned("fuzz", h, true)];
    let among = vec![
        scanned("fuzz", h, false),
        scanned("a", &ordinary[0], true),
        scanned("b", &ordinary[1], true),
    ];
    for cases in [alone, among] {
        let refs: Vec<&ScannedCase> = cases.iter().collect();
        for choice in [
            SpacingChoice::Auto,
            SpacingChoice::Explicit(h.spacing_xyz),
            SpacingChoice::Explicit([1.0, 1.0, 1.0]),
            SpacingChoice::Explicit([1e-3, 7.0, 0.25]),
        ] {
            let decision = decide_spacing(choice, &refs).expect("cases to choose from");
            let target = decision.target_xyz;
            assert!(
                target.iter().all(|t| t.is_finite() && *t > 0.0),
                "target {target:?} ({choice:?})"
            );
            for dtype in [ImageDtype::Float32, ImageDtype::Float16] {
                let plans = plan_scanned(&refs, target, dtype);
                assert_eq!(plans.len(), refs.len());
                for (p, s) in plans.iter().zip(&refs) {
                    assert!(p.out_shape_xyz.iter().all(|&m| m >= 1), "{p:?}");
                    assert_eq!(p.out_voxels, voxels(p.out_shape_xyz));
                    assert!(p.out_bytes >= p.out_voxels, "{p:?}");
                    if choice == SpacingChoice::Explicit(s.image.spacing_xyz) {
                        assert_eq!(p.out_shape_xyz, s.image.shape_xyz, "{p:?}");
                    }
                    assert!(
                        p.size_problem(1e-9).is_some(),
                        "no size limit refuses {p:?}"
                    );
                    let refused = p.size_problem(1024.0).is_some();
                    let absurd = p.out_shape_xyz.iter().any(|&m| m > MAX_OUTPUT_SIDE);
                    assert!(refused || !absurd, "{p:?}");
                    if !refused {
                        let a = s
                            .image
                            .affine
                            .for_output_grid(s.image.shape_xyz, p.out_shape_xyz);
                        assert!(a.is_finite(), "output affine {a:?}");
                    }
                }
                let text = render_plan(&decision, &plans, dtype);
                assert!(text.contains("forecast at"), "{text}");
                serde_json::to_string(&plans).expect("plans serialize");
            }
        }
    }
}

/// Read the whole input as `prep build-cache` reads a file; `(decoded, disagreement)`.
fn read_whole(bytes: &[u8], h: &HeaderInfo, path: &Path) -> (bool, Option<String>) {
    std::fs::write(path, bytes).expect("write the scratch file");
    match nifti_io::read_volume(path) {
        Ok(v) => {
            assert_eq!(v.header.shape_xyz, h.shape_xyz);
            assert_eq!(v.data.len() as u64, h.voxel_count());
            assert_eq!(v.file_bytes, bytes.len() as u64);
            assert_eq!(v.file_hash, blake3::hash(bytes));
            if let Err(e) = nifti_io::label_from_f32(path, v.data) {
                let e = e.to_string();
                assert!(e.contains(INPUT_NAME), "a refusal without the file: {e}");
            }
            (true, None)
        }
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains(INPUT_NAME), "a refusal without the file: {e}");
            let complete = !h.gzip && bytes.len() as u64 >= h.vox_offset as u64 + h.data_bytes();
            (false, complete.then_some(e))
        }
    }
}
