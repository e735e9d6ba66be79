//! nnU-Net's five cross-validation folds of the case ids read from stdin (one a line), for the
//! cross-check against scikit-learn's KFold and nnunetv2's own split (scripts/splits_check.py):
//!
//!   printf 'a\nb\nc\nd\ne\n' | cargo run --example cv_splits [N_SPLITS] [SEED]
//!
//! Prints nnU-Net's splits_final.json layout: a list of {"train": [...], "val": [...]}.

use std::io::Read;

use voxcache::train::folds::{kfold_splits, NNUNET_FOLDS, NNUNET_SEED};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n_splits = match args.first() {
        Some(a) => a.parse()?,
        None => NNUNET_FOLDS,
    };
    let seed = match args.get(1) {
        Some(a) => a.parse()?,
        None => NNUNET_SEED,
    };
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text)?;
    let ids: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    let splits = kfold_splits(&ids, n_splits, seed)?;
    println!("{}", serde_json::to_string(&splits)?);
    Ok(())
}
