//! The nnU-Net checkpoint fuzzer's target, shared by `examples/fuzz_checkpoints.rs` (long runs)
//! and `tests/checkpoint_corpus.rs` (the corpus replay and a short run in the test suite), so
//! both feed an input through the same stages, in memory:
//! 1. the zip archive and its pickle (`TorchArchive::new`);
//! 2. the state dict placed in our network's names, each weight's bytes read and checked
//!    (`NnunetCheckpoint::from_archive`), for each fixture's architecture (ct3d, ct2d, the
//!    residual encoder) until one fits;
//! 3. every shape compared with the plans' network (`check_network`), nothing allocated.
//!
//! A panic is a finding (the callers run each input under `catch_unwind`); so is a refusal
//! that does not name the input, and a peak of live memory over [`MAX_PEAK`] (measured by the
//! counting allocator of `alloc`, which the callers install). Included with `#[path]` by the
//! example; it needs the crate's `zip` and `libc` dependencies only.

pub(crate) mod alloc;
pub(crate) mod archive;
pub(crate) mod mutate;
pub(crate) mod seeds;

use std::io::Cursor;
use std::path::Path;

use voxcache::format::nnunet::pickle::Limits;
use voxcache::format::nnunet::torch_archive::{ArchiveLimits, TorchArchive};
use voxcache::format::nnunet::{NnunetDataset, Plans};
use voxcache::model::config::UNetConfig;
use voxcache::model::nnunet::{unet_config, NnunetCheckpoint};

/// The name every input is read under; every refusal must name it.
pub(crate) const INPUT_NAME: &str = "fuzz_input/checkpoint_final.pth";

/// Most live memory one input may take on top of what was live before it.
pub(crate) const MAX_PEAK: usize = 256 << 20;

/// The reader's bounds under fuzzing: the production defaults scaled down, so that the
/// memory bound above holds whatever a small input decompresses to.
pub(crate) fn limits() -> ArchiveLimits {
    ArchiveLimits {
        pickle: Limits {
            max_objects: 1 << 20,
            max_memo: 1 << 20,
            max_text_bytes: 16 << 20,
            max_depth: 1000,
        },
        max_pickle_bytes: 8 << 20,
        max_tensor_bytes: 64 << 20,
    }
}

/// What the stages made of one input.
#[derive(Clone, Debug, Default)]
pub(crate) struct Outcome {
    /// The archive and its pickle read.
    pub(crate) read: bool,
    /// Its weights read and fit one fixture's network.
    pub(crate) accepted: bool,
    /// The first refusal's text.
    pub(crate) error: Option<String>,
}

/// The fixtures' networks the inputs are placed in.
pub(crate) struct Target {
    models: Vec<(Plans, UNetConfig)>,
}

impl Target {
    pub(crate) fn new() -> Target {
        let models = [
            ("ct3d", "3d_fullres"),
            ("ct2d", "2d"),
            ("regions_resenc", "3d_fullres"),
        ]
        .iter()
        .map(|(fixture, cfg)| {
            let dir = archive::results_dir(fixture);
            let plans = Plans::read(&dir.join("plans.json"), cfg).unwrap();
            let ds = NnunetDataset::read(&dir.join("dataset.json")).unwrap();
            let config = unet_config(
                &plans.configuration.architecture,
                plans.channels(),
                ds.labels.heads(),
            );
            (plans, config)
        })
        .collect();
        Target { models }
    }

    /// Run `input` through the stages.
    pub(crate) fn run(&self, input: &[u8]) -> Outcome {
        let path = Path::new(INPUT_NAME);
        let mut o = Outcome::default();
        let refused = |o: &mut Outcome, e: voxcache::Error| {
            let text = e.to_string();
            assert!(
                text.contains(INPUT_NAME),
                "a refusal without the file: {text}"
            );
            o.error.get_or_insert(text);
        };
        let mut archive = match TorchArchive::new(path, Cursor::new(input), limits()) {
            Ok(a) => a,
            Err(e) => {
                refused(&mut o, e);
                return o;
            }
        };
        o.read = true;
        for (plans, config) in &self.models {
            let ck =
                NnunetCheckpoint::from_archive(&mut archive, &plans.configuration.architecture);
            match ck.and_then(|ck| ck.check_network(config, plans)) {
                Ok(()) => {
                    o.accepted = true;
                    return o;
                }
                Err(e) => refused(&mut o, e),
            }
        }
        o
    }
}
