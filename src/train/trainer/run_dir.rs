//! The run folder's identity (`run.json`): written for a new run, compared on `--resume` so a
//! run never continues under settings other than its own.

use super::RunOptions;
use crate::error::{Error, Result};
use crate::format::run::{RunRecord, RUN_FILE};
use crate::util::files::write_atomic;

/// "key: was X, now Y" for each differing part of two run identities.
fn identity_differences(old: &RunRecord, new: &RunRecord) -> Vec<String> {
    let mut out = Vec::new();
    let mut diff = |key: &str, a: String, b: String| {
        if a != b {
            out.push(format!("{key} was {a}, now {b}"));
        }
    };
    diff("dataset", old.dataset.clone(), new.dataset.clone());
    diff(
        "classes",
        old.num_classes.to_string(),
        new.num_classes.to_string(),
    );
    if !old.classes.is_empty() {
        let values = |r: &RunRecord| {
            format!(
                "{:?}",
                r.classes.iter().map(|c| c.value).collect::<Vec<_>>()
            )
        };
        diff("class values", values(old), values(new));
        diff(
            "ignore label",
            format!("{:?}", old.ignore_label),
            format!("{:?}", new.ignore_label),
        );
    }
    if !old.channels.is_empty() {
        diff(
            "image channels",
            old.channels.join(", "),
            new.channels.join(", "),
        );
    }
    let empty = serde_json::Map::new();
    let (old_config, new_config) = (old.config.weight_shaping(), new.config.weight_shaping());
    let (a, b) = (
        old_config.as_object().unwrap_or(&empty),
        new_config.as_object().unwrap_or(&empty),
    );
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let show = |v: Option<&serde_json::Value>| v.map_or("unset".to_string(), |v| v.to_string());
        diff(k, show(a.get(k)), show(b.get(k)));
    }
    if old.split != new.split {
        out.push("the train/validation split differs".into());
    }
    out
}

/// Write the run's identity into its folder; on `--resume`, refuse one that differs from the
/// recorded one (naming each difference), and refuse to start over a folder that holds a run.
pub(super) fn prepare_run_dir(opts: &RunOptions, identity: &RunRecord) -> Result<()> {
    let dir = &opts.run_dir;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join(RUN_FILE);
    match RunRecord::read(&path)? {
        Some(old) if opts.resume => {
            // A run recorded before its preprocessing was: compared without it, then
            // recorded.
            let recorded_before = old.preprocessing.is_none();
            let mut new = identity.clone();
            if recorded_before {
                new.preprocessing = None;
            }
            if !old.same_run(&new) {
                return Err(Error::Train(format!(
                    "{}: --resume with settings that differ from the run's: {}; resume with the run's options or start a new --out",
                    path.display(),
                    identity_differences(&old, identity).join(", ")
                )));
            }
            if recorded_before {
                write_atomic(&path, &identity.to_json())?;
            }
            return Ok(());
        }
        Some(_) if dir.join("checkpoints").is_dir() => {
            return Err(Error::Train(format!(
                "{} already holds a run: pass --resume to continue it, or choose another --out",
                dir.display()
            )));
        }
        Some(_) | None => {}
    }
    write_atomic(&path, &identity.to_json())
}
