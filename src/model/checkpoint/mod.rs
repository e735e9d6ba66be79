//! Atomic checkpoints of a run: `RUN/checkpoints/step-00001234/{model.safetensors,
//! optimizer.safetensors, state.json}`, the last K of them, and `RUN/checkpoints/best/`.
//!
//! A checkpoint is written into a uniquely named `.tmp-*` folder, every file and the folder
//! are fsynced, and only then is the folder renamed into place (and the parent fsynced), so a
//! crash leaves either the previous set or the new complete checkpoint. A folder that has to
//! be replaced (`best`, or a step saved twice) is first moved aside to `.old-NAME-*`; if a
//! crash strikes between the two renames, the next `Checkpointer::new` moves it back.
//! One trainer per run folder: `new` deletes leftovers of crashed saves.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
pub(crate) use crate::util::files::sync_dir;
use crate::util::files::{sync_file, write_synced};

/// The weights of a checkpoint folder.
pub const MODEL_FILE: &str = "model.safetensors";
/// The optimizer state of a checkpoint folder.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub use crate::format::run::{StateExtra, TrainState, STATE_FILE};
/// The checkpoint folder of the best validation score.
pub const BEST_DIR: &str = "best";
const TMP_PREFIX: &str = ".tmp-";
const OLD_PREFIX: &str = ".old-";
/// A numbered checkpoint folder's name: `step-N`.
pub const STEP_PREFIX: &str = "step-";
/// The folder of a run's checkpoints.
pub const CHECKPOINTS_DIR: &str = "checkpoints";

/// A loaded checkpoint.
pub struct Checkpoint {
    /// The checkpoint folder.
    pub dir: PathBuf,
    /// Network parameters by name.
    pub model: HashMap<String, Tensor>,
    /// Optimizer moments by name.
    pub optimizer: HashMap<String, Tensor>,
    /// Step, seed, best score and the options of the run.
    pub state: TrainState,
    /// Newer checkpoint folders that `Checkpointer::latest` passed over, with the reason
    /// (empty from `Checkpointer::load`); worth a warning line.
    pub skipped: Vec<String>,
}

/// Writes, prunes and finds the checkpoints of one run folder.
pub struct Checkpointer {
    dir: PathBuf,
    keep_last: usize,
    /// The run's `run.json`, written into every checkpoint folder when set.
    record: Option<Vec<u8>>,
}

impl Checkpointer {
    /// Creates `RUN/checkpoints` if needed, puts back a folder a crash left moved aside and
    /// deletes the temporary folders of crashed saves.
    pub fn new(run_dir: &Path, keep_last: usize) -> Result<Self> {
        if keep_last == 0 {
            return Err(Error::Config(
                "keep_last must be at least 1 (the checkpoint just written is always kept)".into(),
            ));
        }
        let dir = run_dir.join(CHECKPOINTS_DIR);
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        recover(&dir)?;
        Ok(Checkpointer {
            dir,
            keep_last,
            record: None,
        })
    }

    /// The checkpoints of a run folder, for reading only (predict): nothing is created,
    /// recovered or deleted.
    pub fn read_only(run_dir: &Path) -> Self {
        Checkpointer {
            dir: run_dir.join(CHECKPOINTS_DIR),
            keep_last: usize::MAX,
            record: None,
        }
    }

    /// Write `run_json` (the run's record) into every checkpoint folder too, so that a
    /// checkpoint copied on its own still says what model and preprocessing it is.
    pub fn with_record(mut self, run_json: Vec<u8>) -> Self {
        self.record = Some(run_json);
        self
    }

    /// `RUN/checkpoints`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Write a checkpoint for `state.step` atomically, then delete the oldest step folders so
    /// that the one just written and the `keep_last - 1` newest others remain (never `best`).
    /// Returns the checkpoint's folder.
    pub fn save(
        &self,
        model: &[(String, Tensor)],
        optimizer: &HashMap<String, Tensor>,
        state: &TrainState,
    ) -> Result<PathBuf> {
        let mut named: HashMap<&str, Tensor> = HashMap::with_capacity(model.len());
        for (name, t) in model {
            if named.insert(name.as_str(), t.clone()).is_some() {
                return Err(Error::Train(format!(
                    "checkpoint: model tensor {name} given twice"
                )));
            }
        }
        let name = step_dir_name(state.step);
        let tmp = self.dir.join(unique_name(TMP_PREFIX, &name));
        fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let written = write_files(&tmp, &named, optimizer, state, self.record.as_deref());
        if let Err(e) = written {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        let target = self.dir.join(&name);
        replace_dir(&self.dir, &tmp, &target, &name)?;
        self.prune(state.step)?;
        Ok(target)
    }

    /// Replace `best/` atomically with a copy of a saved checkpoint folder. Files are hard
    /// links where the file system allows (checkpoint files are never modified in place), so
    /// this costs no space or time; otherwise they are copied.
    pub fn mark_best(&self, saved: &Path) -> Result<()> {
        let tmp = self.dir.join(unique_name(TMP_PREFIX, BEST_DIR));
        fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let staged = (|| -> Result<()> {
            // The run's record, when the checkpoint has one, before state.json.
            let record = crate::format::run::RUN_FILE;
            let files = [MODEL_FILE, OPTIMIZER_FILE, record, STATE_FILE];
            for file in files {
                let from = saved.join(file);
                let to = tmp.join(file);
                if file == record && !from.is_file() {
                    continue;
                }
                if !from.is_file() {
                    return Err(Error::Train(format!(
                        "{}: missing; cannot mark an incomplete checkpoint as best",
                        from.display()
                    )));
                }
                if fs::hard_link(&from, &to).is_err() {
                    fs::copy(&from, &to).map_err(|e| Error::io(&to, e))?;
                    sync_file(&to)?;
                }
            }
            sync_dir(&tmp)
        })();
        if let Err(e) = staged {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        replace_dir(&self.dir, &tmp, &self.dir.join(BEST_DIR), BEST_DIR)
    }

    /// The newest complete checkpoint: the highest step whose folder loads (state.json parses,
    /// both tensor files read). Temporary folders are ignored; newer folders that fail to load
    /// are passed over and listed in `Checkpoint::skipped`. `Ok(None)` only when the run has
    /// no checkpoint at all; when it has some and none loads, an error lists each and why.
    pub fn latest(&self, device: &Device) -> Result<Option<Checkpoint>> {
        let mut skipped = Vec::new();
        let dirs = self.step_dirs()?;
        let none_saved = dirs.is_empty();
        for (_, dir) in dirs.into_iter().rev() {
            if !dir.join(STATE_FILE).is_file() {
                skipped.push(format!("{}: no {STATE_FILE}, incomplete", dir.display()));
                continue;
            }
            match Self::load(&dir, device) {
                Ok(mut ckpt) => {
                    ckpt.skipped = skipped;
                    return Ok(Some(ckpt));
                }
                Err(e) => skipped.push(e.to_string()),
            }
        }
        // Checkpoints exist but none loads: starting over would overwrite the run.
        if !none_saved || self.dir.join(BEST_DIR).exists() {
            if self.dir.join(BEST_DIR).exists() && none_saved {
                skipped.push(format!(
                    "{}: only best/ is left, no step checkpoint to continue from",
                    self.dir.display()
                ));
            }
            return Err(Error::Train(format!(
                "no checkpoint in {} could be loaded, so --resume stops instead of starting again and overwriting the run (move the folder aside, or start a new --out):\n  - {}",
                self.dir.display(),
                skipped.join("\n  - ")
            )));
        }
        Ok(None)
    }

    /// `best/`, if one was marked.
    pub fn best(&self, device: &Device) -> Result<Option<Checkpoint>> {
        let dir = self.dir.join(BEST_DIR);
        if !dir.is_dir() {
            return Ok(None);
        }
        Self::load(&dir, device).map(Some)
    }

    /// Load one checkpoint folder; errors name the file at fault.
    pub fn load(dir: &Path, device: &Device) -> Result<Checkpoint> {
        let state_path = dir.join(STATE_FILE);
        let mut state = TrainState::read(&state_path)?;
        // The hashes belong to the folder, not to the training state the run goes on with.
        for (file, want) in std::mem::take(&mut state.extra.files) {
            check_hash(dir, &file, &want)?;
        }
        let model = load_tensors(&dir.join(MODEL_FILE), device)?;
        let optimizer = load_tensors(&dir.join(OPTIMIZER_FILE), device)?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            model,
            optimizer,
            state,
            skipped: Vec::new(),
        })
    }

    /// `step-*` folders sorted by step.
    fn step_dirs(&self) -> Result<Vec<(u64, PathBuf)>> {
        let mut out = Vec::new();
        let entries = fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&self.dir, e))?;
            let name = entry.file_name();
            let Some(step) = name
                .to_str()
                .and_then(|n| n.strip_prefix(STEP_PREFIX))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            if entry.path().is_dir() {
                out.push((step, entry.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    fn prune(&self, just_saved: u64) -> Result<()> {
        let others: Vec<(u64, PathBuf)> = self
            .step_dirs()?
            .into_iter()
            .filter(|(s, _)| *s != just_saved)
            .collect();
        let excess = others.len().saturating_sub(self.keep_last - 1);
        for (_, dir) in &others[..excess] {
            fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        if excess > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

/// The folder name of the checkpoint taken at `step` (zero-padded, so names sort by step).
pub fn step_dir_name(step: u64) -> String {
    format!("{STEP_PREFIX}{step:08}")
}

/// A name no other save of this or an earlier process used: pid, time and a counter.
fn unique_name(prefix: &str, name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{name}-{}-{nanos}-{n}", std::process::id())
}

fn write_files(
    dir: &Path,
    model: &HashMap<&str, Tensor>,
    optimizer: &HashMap<String, Tensor>,
    state: &TrainState,
    record: Option<&[u8]>,
) -> Result<()> {
    let model_path = dir.join(MODEL_FILE);
    candle_core::safetensors::save(model, &model_path)
        .map_err(|e| Error::Train(format!("{}: {e}", model_path.display())))?;
    sync_file(&model_path)?;
    let opt_path = dir.join(OPTIMIZER_FILE);
    candle_core::safetensors::save(optimizer, &opt_path)
        .map_err(|e| Error::Train(format!("{}: {e}", opt_path.display())))?;
    sync_file(&opt_path)?;
    let mut written = vec![MODEL_FILE, OPTIMIZER_FILE];
    if let Some(bytes) = record {
        write_synced(&dir.join(crate::format::run::RUN_FILE), bytes)?;
        written.push(crate::format::run::RUN_FILE);
    }
    let mut state = state.clone();
    // Only the files written here: a state read back and saved again keeps no older entry.
    state.extra.files.clear();
    for file in written {
        state
            .extra
            .files
            .insert(file.to_string(), hash_file(&dir.join(file))?);
    }
    // state.json last: a folder with it is complete.
    write_synced(&dir.join(STATE_FILE), &state.to_json())?;
    sync_dir(dir)
}

/// Move the complete folder `staged` to `target` (named `name` inside `parent`), replacing a
/// folder already there by moving it aside first and deleting it afterwards.
fn replace_dir(parent: &Path, staged: &Path, target: &Path, name: &str) -> Result<()> {
    let aside = if target.exists() {
        let aside = parent.join(unique_name(OLD_PREFIX, name));
        fs::rename(target, &aside).map_err(|e| Error::io(target, e))?;
        Some(aside)
    } else {
        None
    };
    if let Err(e) = fs::rename(staged, target) {
        if let Some(aside) = &aside {
            let _ = fs::rename(aside, target);
        }
        let _ = fs::remove_dir_all(staged);
        return Err(Error::io(target, e));
    }
    sync_dir(parent)?;
    if let Some(aside) = aside {
        fs::remove_dir_all(&aside).map_err(|e| Error::io(&aside, e))?;
    }
    Ok(())
}

/// Undo what a crash in the middle of a save left: a folder moved aside whose replacement
/// never arrived goes back; everything else temporary is deleted.
fn recover(dir: &Path) -> Result<()> {
    let entries = fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut changed = false;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let path = entry.path();
        if name.starts_with(TMP_PREFIX) {
            remove_any(&path)?;
            changed = true;
        } else if let Some(rest) = name.strip_prefix(OLD_PREFIX) {
            // ".old-NAME-PID-NANOS-N": NAME is everything before the last three fields.
            let original = rest.rsplitn(4, '-').nth(3).unwrap_or("");
            let target = dir.join(original);
            if !original.is_empty() && !target.exists() {
                fs::rename(&path, &target).map_err(|e| Error::io(&path, e))?;
            } else {
                remove_any(&path)?;
            }
            changed = true;
        }
    }
    if changed {
        sync_dir(dir)?;
    }
    Ok(())
}

/// A file's BLAKE3 hash, hex.
fn hash_file(path: &Path) -> Result<String> {
    let mut h = blake3::Hasher::new();
    let file = fs::File::open(path).map_err(|e| Error::io(path, e))?;
    h.update_reader(file).map_err(|e| Error::io(path, e))?;
    Ok(h.finalize().to_hex().to_string())
}

/// `dir/file` hashes to `want`, as state.json recorded when the checkpoint was written.
fn check_hash(dir: &Path, file: &str, want: &str) -> Result<()> {
    // state.json names only the files written beside it: nothing outside the folder.
    let plain = Path::new(file).file_name().is_some_and(|n| n == file);
    if !plain {
        return Err(Error::Train(format!(
            "{}: names the file {file:?}, not a file of its checkpoint folder",
            dir.join(STATE_FILE).display()
        )));
    }
    let path = dir.join(file);
    let got = hash_file(&path)?;
    if got != want {
        return Err(Error::Train(format!(
            "{}: its BLAKE3 hash differs from the one state.json recorded when the checkpoint was written ({got} against {want}): the file changed or was damaged since",
            path.display()
        )));
    }
    Ok(())
}

fn remove_any(path: &Path) -> Result<()> {
    let r = if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    r.map_err(|e| Error::io(path, e))
}

fn load_tensors(path: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    if !path.is_file() {
        return Err(Error::Train(format!("{}: missing", path.display())));
    }
    candle_core::safetensors::load(path, device).map_err(|e| {
        Error::Train(format!(
            "{}: unreadable safetensors file: {e}",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests;
