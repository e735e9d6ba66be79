//! Where a training run's folder goes when `--out` is not given.

use std::path::{Path, PathBuf};

use crate::cache::reader::CacheReader;
use crate::error::Result;
use crate::train::folds::FoldChoice;

/// Run folders go under this folder, relative to the working folder.
pub const RUNS_ROOT: &str = "runs";

/// `ROOT/NAME`, `ROOT/NAME-2`, ...: a new run takes the first free folder, a resumed one the
/// newest existing one, so running the README command twice starts a second run instead of
/// failing or overwriting the first.
pub fn numbered_run_dir(root: &Path, name: &str, resume: bool) -> PathBuf {
    let candidate = |i: usize| {
        if i == 1 {
            root.join(name)
        } else {
            root.join(format!("{name}-{i}"))
        }
    };
    let mut i = 1;
    while candidate(i).exists() {
        i += 1;
    }
    if resume && i > 1 {
        candidate(i - 1)
    } else {
        candidate(i)
    }
}

/// The run folder: `out` when given, else `runs/DATASET` numbered as above, DATASET being the
/// configured dataset or else the cache's first (the one a single-dataset cache holds). A
/// cross-validation fold K runs in `runs/DATASET_foldK` (`OUT/fold_K` when `out` is given
/// for several folds, as nnU-Net names them).
pub fn run_dir(
    out: Option<&Path>,
    dataset: Option<&str>,
    cache_dir: &Path,
    resume: bool,
    fold: Option<(FoldChoice, bool)>,
) -> Result<PathBuf> {
    if let Some(p) = out {
        return Ok(match fold {
            Some((f, true)) => p.join(format!("fold_{f}")),
            _ => p.to_path_buf(),
        });
    }
    let name = match dataset {
        Some(d) => d.to_string(),
        None => CacheReader::open(cache_dir)?
            .datasets()
            .first()
            .map(|s| s.to_string())
            .unwrap_or_else(|| "run".into()),
    };
    let name = match fold {
        Some((f, _)) => format!("{name}_fold{f}"),
        None => name,
    };
    Ok(numbered_run_dir(Path::new(RUNS_ROOT), &name, resume))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_runs_take_the_next_number_and_resume_takes_the_newest() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        assert_eq!(numbered_run_dir(root, "ves", false), root.join("ves"));
        // Nothing to resume: the first folder.
        assert_eq!(numbered_run_dir(root, "ves", true), root.join("ves"));
        std::fs::create_dir(root.join("ves")).unwrap();
        assert_eq!(numbered_run_dir(root, "ves", false), root.join("ves-2"));
        assert_eq!(numbered_run_dir(root, "ves", true), root.join("ves"));
        std::fs::create_dir(root.join("ves-2")).unwrap();
        assert_eq!(numbered_run_dir(root, "ves", false), root.join("ves-3"));
        assert_eq!(numbered_run_dir(root, "ves", true), root.join("ves-2"));
        // Another dataset's runs do not count.
        assert_eq!(numbered_run_dir(root, "liver", false), root.join("liver"));
    }

    #[test]
    fn out_wins_and_a_named_dataset_needs_no_cache() {
        let t = tempfile::tempdir().unwrap();
        let missing = t.path().join("no-cache");
        let out = t.path().join("mine");
        assert_eq!(
            run_dir(Some(&out), None, &missing, false, None).unwrap(),
            out
        );
        let d = run_dir(None, Some("liver"), &missing, false, None).unwrap();
        assert_eq!(d.parent(), Some(Path::new(RUNS_ROOT)));
        assert!(d
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("liver"));
        assert!(run_dir(None, None, &missing, false, None).is_err());
        let one = Some((FoldChoice::Index(2), false));
        assert_eq!(
            run_dir(Some(&out), None, &missing, false, one).unwrap(),
            out
        );
        let several = Some((FoldChoice::Index(2), true));
        let d = run_dir(Some(&out), None, &missing, false, several).unwrap();
        assert_eq!(d, out.join("fold_2"));
        let d = run_dir(None, Some("liver"), &missing, false, one).unwrap();
        assert!(d.ends_with("liver_fold2"), "{d:?}");
    }
}
