//! Cross-validation's files: a fold's `validation/` folder (its held-out cases predicted in their
//! own geometry, their class probabilities, and `summary.json`), and the postprocessing decided
//! from the folds (`postprocessing.json`, beside each fold's model).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::util::files::read_capped;

/// A fold run's folder of validation predictions.
pub const VALIDATION_DIR: &str = "validation";
/// The evaluation report of a validation or cross-validation folder.
pub const SUMMARY_FILE: &str = "summary.json";
/// The postprocessing decision, in a cross-validation folder and beside each fold's model.
pub const POSTPROCESSING_FILE: &str = "postprocessing.json";
/// The cross-validation folder `evaluate --cv` writes (beside the fold runs by default).
pub const CROSSVAL_DIR: &str = "crossval";

/// The largest summary read (a summary of tens of thousands of cases).
const MAX_BYTES: u64 = 256 << 20;
/// The largest postprocessing decision read: one filter per class or region, a few hundred
/// bytes; the cap keeps a hostile file from sizing an allocation.
const MAX_DECISION_BYTES: u64 = 1 << 20;

/// One case of a summary: what cross-validation needs to find its files again.
#[derive(Clone, Debug, Deserialize)]
pub struct SummaryCase {
    /// Case id.
    pub id: String,
    /// The prediction file.
    pub prediction: PathBuf,
    /// The reference (label) file it was scored against.
    pub reference: Option<PathBuf>,
    /// "evaluated" or "failed".
    pub status: String,
}

/// The part of a `summary.json` (an evaluation report) that cross-validation reads back.
#[derive(Clone, Debug, Deserialize)]
pub struct SummaryCases {
    /// Per case.
    pub cases: Vec<SummaryCase>,
}

impl SummaryCases {
    /// Read `path`.
    pub fn read(path: &Path) -> Result<SummaryCases> {
        let bytes = read_capped(path, MAX_BYTES).map_err(|e| Error::io(path, e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            Error::Config(format!(
                "{}: not an evaluation summary: {e}",
                path.display()
            ))
        })
    }
}

/// Which largest-component filters a model's predictions get (nnU-Net's rule, decided from
/// cross-validation: each kept only where it raised the mean Dice).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Postprocessing {
    /// Keep only the largest connected component of the foreground (every class together);
    /// voxels outside it become background.
    pub foreground: bool,
    /// Then, per label value listed, keep only that class's largest component.
    pub classes: Vec<u16>,
    /// Then, per region (its label values) of a region model, keep only the region's largest
    /// component.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<Vec<u16>>,
    /// Neighbourhood of a component: "full" (26 neighbours, as nnU-Net) or "faces" (6).
    pub connectivity: String,
    /// Mean foreground Dice of the cross-validation before the filters.
    pub dice_before: Option<f64>,
    /// After them.
    pub dice_after: Option<f64>,
    /// The cross-validation folder it was decided in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_in: Option<PathBuf>,
}

impl Postprocessing {
    /// No filter at all.
    pub fn is_none(&self) -> bool {
        !self.foreground && self.classes.is_empty() && self.regions.is_empty()
    }

    /// Read `path`; `Ok(None)` when there is no such file.
    pub fn read(path: &Path) -> Result<Option<Postprocessing>> {
        let bytes = match read_capped(path, MAX_DECISION_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(path, e)),
        };
        let p: Postprocessing = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Config(format!(
                "{}: not a postprocessing decision: {e}",
                path.display()
            ))
        })?;
        if !matches!(p.connectivity.as_str(), "full" | "faces") {
            return Err(Error::Config(format!(
                "{}: connectivity {:?} (expected \"full\" or \"faces\")",
                path.display(),
                p.connectivity
            )));
        }
        Ok(Some(p))
    }

    /// The filters in words, in the order they apply ("largest foreground component, then
    /// largest component of label 2"); `None` when there is none.
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.foreground {
            parts.push("largest foreground component".to_string());
        }
        for v in &self.classes {
            parts.push(format!("largest component of label {v}"));
        }
        for r in &self.regions {
            let v: Vec<String> = r.iter().map(|v| v.to_string()).collect();
            parts.push(format!("largest component of region {}", v.join("+")));
        }
        (!parts.is_empty()).then(|| parts.join(", then "))
    }

    /// What the filters are, without the scores: equal keys filter equally.
    pub fn key(&self) -> String {
        serde_json::to_string(&(
            self.foreground,
            &self.classes,
            &self.regions,
            &self.connectivity,
        ))
        .unwrap_or_default()
    }

    /// Write `path` (whole, then renamed into place).
    pub fn write(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| Error::io(path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_over_its_cap_is_refused_before_it_is_parsed() {
        let dir = std::env::temp_dir().join(format!("voxcache-pp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(POSTPROCESSING_FILE);
        let classes = vec!["1"; 1 << 20].join(",");
        std::fs::write(
            &path,
            format!(r#"{{"foreground": false, "classes": [{classes}], "connectivity": "full"}}"#),
        )
        .unwrap();
        let e = Postprocessing::read(&path).unwrap_err().to_string();
        assert!(
            e.contains(POSTPROCESSING_FILE) && e.contains("bytes"),
            "{e}"
        );
        std::fs::write(
            &path,
            r#"{"foreground": true, "classes": [1], "connectivity": "full"}"#,
        )
        .unwrap();
        assert!(Postprocessing::read(&path).unwrap().is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
