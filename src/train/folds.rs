//! nnU-Net's cross-validation folds: the labelled case ids sorted, split by scikit-learn's
//! `KFold(n_splits=5, shuffle=True, random_state=12345)` exactly as nnU-Net v2's
//! `generate_crossval_split` calls it, so a fold here is the same cases as nnU-Net's fold of
//! the same number; or a `splits_final.json` (nnU-Net's file: a list of `{"train": [...],
//! "val": [...]}`) used as it is.

use std::path::Path;

use super::split::Split;
use crate::error::{Error, Result};
use crate::util::files::read_capped;
use crate::util::rng::numpy::LegacyRandomState;

/// nnU-Net's number of folds and the seed of its shuffle.
pub const NNUNET_FOLDS: usize = 5;
/// The `random_state` nnU-Net gives KFold.
pub const NNUNET_SEED: u32 = 12345;
pub use crate::format::SPLITS_FILE;
/// The largest splits file read (a list of case ids: a few MiB is tens of thousands of cases).
const MAX_SPLITS_BYTES: u64 = 64 << 20;

pub use crate::format::training::FoldChoice;

/// `--fold 0,1,2,3,4`: folds trained one after the other by one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldList(pub Vec<FoldChoice>);

impl std::str::FromStr for FoldList {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let mut folds: Vec<FoldChoice> = Vec::new();
        for part in s.split(',') {
            let f: FoldChoice = part.parse()?;
            if folds.contains(&f) {
                return Err(Error::Config(format!(
                    "--fold {s}: fold {f} is listed twice (each fold trains once, into its own run folder)"
                )));
            }
            folds.push(f);
        }
        Ok(FoldList(folds))
    }
}

/// nnU-Net's `generate_crossval_split(ids, seed, n_splits)`: the ids sorted, their indices
/// shuffled by numpy's `RandomState(seed)`, cut into `n_splits` runs (the first `n % n_splits`
/// one longer); each run validates, the rest train (both in sorted order, as KFold's masks
/// give them).
pub fn kfold_splits(ids: &[String], n_splits: usize, seed: u32) -> Result<Vec<Split>> {
    let mut sorted = ids.to_vec();
    sorted.sort();
    sorted.dedup();
    let n = sorted.len();
    if n_splits < 2 || n < n_splits {
        return Err(Error::Config(format!(
            "{n_splits}-fold cross-validation needs at least {n_splits} labelled cases; the dataset has {n}"
        )));
    }
    let mut order: Vec<usize> = (0..n).collect();
    LegacyRandomState::new(seed).shuffle(&mut order);
    let mut splits = Vec::with_capacity(n_splits);
    let mut start = 0;
    for k in 0..n_splits {
        let len = n / n_splits + usize::from(k < n % n_splits);
        let val_idx = &order[start..start + len];
        let mut is_val = vec![false; n];
        for &i in val_idx {
            is_val[i] = true;
        }
        splits.push(Split {
            train: (0..n)
                .filter(|&i| !is_val[i])
                .map(|i| sorted[i].clone())
                .collect(),
            val: (0..n)
                .filter(|&i| is_val[i])
                .map(|i| sorted[i].clone())
                .collect(),
        });
        start += len;
    }
    Ok(splits)
}

/// Read a `splits_final.json`.
pub fn read_splits(path: &Path) -> Result<Vec<Split>> {
    let what = |m: String| Error::Config(format!("{}: {m}", path.display()));
    let bytes = read_capped(path, MAX_SPLITS_BYTES).map_err(|e| what(e.to_string()))?;
    let splits: Vec<Split> = serde_json::from_slice(&bytes).map_err(|e| {
        what(format!(
            "not nnU-Net's splits (a list of {{\"train\": [...], \"val\": [...]}}): {e}"
        ))
    })?;
    if splits.is_empty() {
        return Err(what("no folds".into()));
    }
    Ok(splits)
}

/// The split of `fold` over the labelled cases `ids`: from `splits` (a file's) or nnU-Net's
/// five folds. A file that names a case the cache does not have, or leaves one out of a fold,
/// is refused naming them.
pub fn fold_split(
    ids: &[String],
    fold: FoldChoice,
    splits: Option<(&Path, Vec<Split>)>,
) -> Result<Split> {
    let k = match fold {
        FoldChoice::All => {
            let mut all = ids.to_vec();
            all.sort();
            return Ok(Split {
                train: all,
                val: vec![],
            });
        }
        FoldChoice::Index(k) => k,
    };
    let (origin, splits) = match splits {
        Some((path, s)) => (path.display().to_string(), s),
        None => (
            "nnU-Net's 5 folds".to_string(),
            kfold_splits(ids, NNUNET_FOLDS, NNUNET_SEED)?,
        ),
    };
    let Some(split) = splits.get(k) else {
        return Err(Error::Config(format!(
            "fold {k}: {origin} has folds 0..{}",
            splits.len() - 1
        )));
    };
    let known: std::collections::BTreeSet<&String> = ids.iter().collect();
    let named: std::collections::BTreeSet<&String> = split.train.iter().chain(&split.val).collect();
    let unknown: Vec<&str> = named
        .iter()
        .filter(|c| !known.contains(*c))
        .map(|c| c.as_str())
        .collect();
    let missing: Vec<&str> = known
        .iter()
        .filter(|c| !named.contains(*c))
        .map(|c| c.as_str())
        .collect();
    let overlap: Vec<&str> = split
        .val
        .iter()
        .filter(|c| split.train.contains(c))
        .map(|c| c.as_str())
        .collect();
    let list = |v: &[&str]| {
        let shown: Vec<&str> = v.iter().take(5).copied().collect();
        format!(
            "{}{}",
            shown.join(", "),
            if v.len() > 5 {
                format!(" and {} more", v.len() - 5)
            } else {
                String::new()
            }
        )
    };
    if !unknown.is_empty() {
        return Err(Error::Config(format!(
            "{origin}, fold {k}: names cases the cache does not have: {}",
            list(&unknown)
        )));
    }
    if !missing.is_empty() {
        return Err(Error::Config(format!(
            "{origin}, fold {k}: leaves out labelled cases of the cache: {}",
            list(&missing)
        )));
    }
    if !overlap.is_empty() {
        return Err(Error::Config(format!(
            "{origin}, fold {k}: cases both train and validate: {}",
            list(&overlap)
        )));
    }
    Ok(split.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("case_{i:03}")).collect()
    }

    /// scikit-learn 1.9.1: `KFold(5, shuffle=True, random_state=12345).split(range(10))`
    /// validates [0, 7], [3, 9], [4, 6], [1, 8], [2, 5].
    #[test]
    fn ten_cases_fold_as_scikit_learn_does() {
        let s = kfold_splits(&ids(10), 5, NNUNET_SEED).unwrap();
        let val: Vec<Vec<String>> = s.iter().map(|f| f.val.clone()).collect();
        let want = [[0, 7], [3, 9], [4, 6], [1, 8], [2, 5]];
        for (got, w) in val.iter().zip(want) {
            assert_eq!(got, &w.map(|i| format!("case_{i:03}")).to_vec());
        }
        for f in &s {
            assert_eq!(f.train.len() + f.val.len(), 10);
            assert!(f.train.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn bad_folds_and_files_are_named() {
        let all = ids(8);
        let e = fold_split(&all, FoldChoice::Index(5), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("folds 0..4"), "{e}");
        let e = kfold_splits(&ids(3), 5, 1).unwrap_err().to_string();
        assert!(e.contains("at least 5"), "{e}");
        let file = vec![Split {
            train: ids(6),
            val: vec!["case_006".into(), "ghost".into()],
        }];
        let p = Path::new("splits_final.json");
        let e = fold_split(&all, FoldChoice::Index(0), Some((p, file.clone())))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ghost") && e.contains("does not have"), "{e}");
        let short = vec![Split {
            train: ids(6),
            val: vec!["case_006".into()],
        }];
        let e = fold_split(&all, FoldChoice::Index(0), Some((p, short)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("case_007") && e.contains("leaves out"), "{e}");
        let everything = fold_split(&all, FoldChoice::All, None).unwrap();
        assert_eq!((everything.train.len(), everything.val.len()), (8, 0));
        assert_eq!("all".parse::<FoldChoice>().unwrap(), FoldChoice::All);
        let list: FoldList = "0,1,all".parse().unwrap();
        assert_eq!(
            list.0,
            vec![FoldChoice::Index(0), FoldChoice::Index(1), FoldChoice::All]
        );
        for twice in ["0,1,1", "all,all"] {
            let e = twice.parse::<FoldList>().unwrap_err().to_string();
            assert!(e.contains("twice"), "{e}");
        }
        let e = "-1".parse::<FoldList>().unwrap_err().to_string();
        assert!(e.contains("\"-1\"") && e.contains("fold number"), "{e}");
        // A splits file that is not a regular file is refused, named.
        if Path::new("/dev/zero").exists() {
            let e = read_splits(Path::new("/dev/zero")).unwrap_err().to_string();
            assert!(
                e.contains("/dev/zero") && e.contains("not a regular file"),
                "{e}"
            );
        }
        assert!("0,,1".parse::<FoldList>().is_err());
        assert!("five".parse::<FoldChoice>().is_err());
    }
}
