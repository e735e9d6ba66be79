//! The run's metrics log, `RUN/metrics.jsonl`: one JSON object per line, tagged
//! `"kind": "train"` or `"kind": "val"`, written with one `write` call per line so a crash
//! tears at most the last line.
//!
//! JSON has no NaN or infinity: serde_json writes them as `null`, and reading maps `null` back
//! to NaN, so a diverged loss or an undefined Dice survives a round trip.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{Error, Result};

/// One logged training step (averages over the logging interval).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct TrainRecord {
    /// Optimizer step.
    pub step: u64,
    #[serde(deserialize_with = "f64_or_nan")]
    /// Total loss.
    pub loss: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    /// Its Dice part.
    pub dice_loss: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    /// Its cross-entropy part.
    pub ce_loss: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    /// Learning rate of the step.
    pub lr: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    /// Patches per second since the last line.
    pub patches_per_s: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    /// Share of the time spent waiting for batches.
    pub data_wait_frac: f64,
    #[serde(deserialize_with = "f64_or_nan")]
    /// Peak resident memory of the process (VmHWM: anonymous and file-backed), MiB.
    pub peak_rss_mb: f64,
    /// Peak anonymous memory of the process since the run started (RssAnon, sampled), MiB:
    /// the memory our promises are about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_anon_mb: Option<f64>,
    /// Anonymous memory just before the network was built, MiB: the peak less this is what
    /// the training step (weights, optimizer, activations, loader) took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_anon_mb: Option<f64>,
    /// Peak file-backed resident memory (RssFile, sampled): mapped cache pages, which the
    /// kernel reclaims under pressure, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_file_mb: Option<f64>,
    #[serde(deserialize_with = "f64_or_nan")]
    /// Seconds since the run started.
    pub elapsed_s: f64,
    /// The Skeleton Recall term (unweighted), when it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skeleton_recall_loss: Option<f64>,
    /// The clDice term (unweighted), when it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cldice_loss: Option<f64>,
    /// The boundary term (unweighted), when it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundary_loss: Option<f64>,
    /// The surface term (unweighted), when it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surface_loss: Option<f64>,
    /// On a GPU: MiB our tensors hold at the log step, and the most they held in the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_allocated_mb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Peak GPU memory our tensors held, MiB (on a GPU).
    pub gpu_peak_mb: Option<f64>,
}

/// One validation pass.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct ValRecord {
    /// Optimizer step.
    pub step: u64,
    #[serde(deserialize_with = "vec_f64_or_nan")]
    /// Dice of each foreground class.
    pub dice_per_class: Vec<f64>,
    #[serde(deserialize_with = "f64_or_nan")]
    /// Their mean.
    pub mean_dice: f64,
    #[serde(deserialize_with = "cases_or_nan")]
    /// Mean Dice of each validation case.
    pub dice_per_case: Vec<(String, f64)>,
    /// Centreline Dice per foreground class (absent when not measured).
    #[serde(
        deserialize_with = "vec_f64_or_nan",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub cldice_per_class: Vec<f64>,
    /// Mean of the defined per-class clDice values (absent when not measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_cldice: Option<f64>,
    #[serde(deserialize_with = "f64_or_nan")]
    /// Seconds the validation took.
    pub seconds: f64,
}

/// One line of the log.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Record {
    /// A training line.
    Train(TrainRecord),
    /// A validation line.
    Val(ValRecord),
}

impl Record {
    /// The step the line is about.
    pub fn step(&self) -> u64 {
        match self {
            Record::Train(r) => r.step,
            Record::Val(r) => r.step,
        }
    }
}

fn f64_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn vec_f64_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    let v = Vec::<Option<f64>>::deserialize(d)?;
    Ok(v.into_iter().map(|x| x.unwrap_or(f64::NAN)).collect())
}

fn cases_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, f64)>, D::Error> {
    let v = Vec::<(String, Option<f64>)>::deserialize(d)?;
    Ok(v.into_iter()
        .map(|(c, x)| (c, x.unwrap_or(f64::NAN)))
        .collect())
}

/// An open metrics log, appending.
pub struct MetricsLog {
    path: PathBuf,
    file: fs::File,
}

impl MetricsLog {
    /// Opens (creates) the log. A torn last line from a crash is cut off, so new lines never
    /// glue onto it. On resume from `resume_step`, lines with a step beyond it are dropped
    /// (the file is rewritten atomically) so the log matches the weights.
    pub fn open(path: &Path, resume_step: Option<u64>) -> Result<Self> {
        let text = match fs::read(path) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(path, e)),
        };
        if let Some(bytes) = text {
            let whole_lines = match bytes.iter().rposition(|&b| b == b'\n') {
                Some(i) => &bytes[..=i],
                None => &bytes[..0],
            };
            let kept = match resume_step {
                Some(step) => lines_up_to(path, whole_lines, step)?,
                None => whole_lines.to_vec(),
            };
            if kept.len() != bytes.len() {
                crate::util::files::write_atomic(path, &kept)?;
            }
        }
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        Ok(MetricsLog {
            path: path.to_path_buf(),
            file,
        })
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one record as one line, in one write (no user-space buffer to lose).
    pub fn append(&mut self, r: &Record) -> Result<()> {
        let mut line = serde_json::to_vec(r)
            .map_err(|e| Error::Train(format!("{}: {e}", self.path.display())))?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .and_then(|_| self.file.flush())
            .map_err(|e| Error::io(&self.path, e))
    }

    /// Every record of a log. A last line that does not parse (torn by a crash) is ignored;
    /// a bad line anywhere else is an error naming the file and line.
    pub fn read_all(path: &Path) -> Result<Vec<Record>> {
        let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        let mut out = Vec::with_capacity(lines.len());
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Record>(line) {
                Ok(r) => out.push(r),
                Err(_) if i + 1 == lines.len() => {}
                Err(e) => {
                    return Err(Error::Train(format!(
                        "{}: line {}: {e}",
                        path.display(),
                        i + 1
                    )))
                }
            }
        }
        Ok(out)
    }
}

/// The complete lines whose record has `step <= resume_step`. Lines that do not parse are
/// refused rather than silently dropped: the log is the run's history.
fn lines_up_to(path: &Path, whole_lines: &[u8], resume_step: u64) -> Result<Vec<u8>> {
    let mut kept = Vec::with_capacity(whole_lines.len());
    for (i, line) in whole_lines.split_inclusive(|&b| b == b'\n').enumerate() {
        let trimmed = line.trim_ascii();
        if trimmed.is_empty() {
            continue;
        }
        let r: Record = serde_json::from_slice(trimmed)
            .map_err(|e| Error::Train(format!("{}: line {}: {e}", path.display(), i + 1)))?;
        if r.step() <= resume_step {
            kept.extend_from_slice(line);
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(step: u64, loss: f64) -> Record {
        Record::Train(TrainRecord {
            step,
            loss,
            dice_loss: loss / 2.0,
            ce_loss: loss / 2.0,
            lr: 0.01,
            grad_norm: 3.5,
            patches_per_s: 12.0,
            data_wait_frac: 0.1,
            peak_rss_mb: 900.0,
            peak_anon_mb: Some(300.0),
            base_anon_mb: Some(20.0),
            peak_file_mb: Some(600.0),
            elapsed_s: step as f64,
            skeleton_recall_loss: None,
            cldice_loss: None,
            boundary_loss: None,
            surface_loss: Some(0.25),
            gpu_allocated_mb: Some(512.0),
            gpu_peak_mb: Some(2048.5),
        })
    }

    fn val(step: u64, dice: f64) -> Record {
        Record::Val(ValRecord {
            step,
            dice_per_class: vec![dice, f64::NAN],
            mean_dice: dice,
            dice_per_case: vec![("case_001".into(), dice)],
            cldice_per_class: vec![dice, f64::NAN],
            mean_cldice: Some(dice),
            seconds: 4.5,
        })
    }

    /// NaN != NaN, so compare through the JSON text.
    fn same(a: &[Record], b: &[Record]) {
        let j = |r: &[Record]| serde_json::to_string(r).unwrap();
        assert_eq!(j(a), j(b));
    }

    #[test]
    fn lines_are_tagged_and_round_trip_with_nan() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let records = vec![train(1, 0.9), val(1, 0.5), train(2, f64::NAN)];
        let mut log = MetricsLog::open(&path, None).unwrap();
        for r in &records {
            log.append(r).unwrap();
        }
        let text = fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[0].starts_with("{\"kind\":\"train\",\"step\":1,"),
            "{}",
            lines[0]
        );
        assert!(lines[1].contains("\"kind\":\"val\""));
        assert!(lines[1].contains("\"dice_per_case\":[[\"case_001\",0.5]]"));
        let back = MetricsLog::read_all(&path).unwrap();
        same(&back, &records);
        match &back[2] {
            Record::Train(t) => assert!(t.loss.is_nan()),
            _ => panic!("expected a train record"),
        }
    }

    #[test]
    fn resume_drops_later_lines_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut log = MetricsLog::open(&path, None).unwrap();
        for s in 1..=6 {
            log.append(&train(s * 10, 1.0 / s as f64)).unwrap();
            if s % 2 == 0 {
                log.append(&val(s * 10, 0.1 * s as f64)).unwrap();
            }
        }
        drop(log);
        // A crash tore the last line.
        let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"kind\":\"train\",\"step\":70,\"lo")
            .unwrap();
        drop(f);
        assert_eq!(MetricsLog::read_all(&path).unwrap().len(), 9);

        let mut log = MetricsLog::open(&path, Some(40)).unwrap();
        let steps: Vec<u64> = MetricsLog::read_all(&path)
            .unwrap()
            .iter()
            .map(Record::step)
            .collect();
        assert_eq!(steps, vec![10, 20, 20, 30, 40, 40]);
        log.append(&train(50, 0.3)).unwrap();
        let back = MetricsLog::read_all(&path).unwrap();
        assert_eq!(back.len(), 7);
        same(&back[6..], &[train(50, 0.3)]);
        // No temp file is left next to the log.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn reopening_without_resume_cuts_a_torn_line_and_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        fs::write(
            &path,
            format!(
                "{}\n{{\"kind\":\"tr",
                serde_json::to_string(&train(1, 0.5)).unwrap()
            ),
        )
        .unwrap();
        let mut log = MetricsLog::open(&path, None).unwrap();
        log.append(&train(2, 0.4)).unwrap();
        let back = MetricsLog::read_all(&path).unwrap();
        same(&back, &[train(1, 0.5), train(2, 0.4)]);
    }

    #[test]
    fn a_bad_line_in_the_middle_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let good = serde_json::to_string(&train(1, 0.5)).unwrap();
        fs::write(&path, format!("{good}\nnot json\n{good}\n")).unwrap();
        let err = MetricsLog::read_all(&path).unwrap_err().to_string();
        assert!(
            err.contains("metrics.jsonl") && err.contains("line 2"),
            "{err}"
        );
        assert!(MetricsLog::open(&path, Some(5)).is_err());
    }
}
