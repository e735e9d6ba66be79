//! Pipelines: named parameter sets (pipelines/NAME.toml) and the resolved parameters that shape
//! a cache entry. Command-line flags override what a pipeline file says.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::format::{ChunkLayout, Compression, ImageDtype, OutputParams, FORMAT_VERSION};
use crate::normalize::Normalization;

/// How the target spacing is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SpacingChoice {
    /// Per-axis median with nnU-Net's anisotropy rule.
    Auto,
    /// Explicit (x, y, z), in the files' units.
    Explicit([f64; 3]),
}

impl std::str::FromStr for SpacingChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.trim() == "auto" {
            return Ok(SpacingChoice::Auto);
        }
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let bad = || {
            Error::Config(format!(
                "spacing {s:?}: give auto or three positive numbers x,y,z"
            ))
        };
        let vals: Vec<f64> = match parts.len() {
            1 => vec![parts[0].parse().map_err(|_| bad())?; 3],
            3 => parts
                .iter()
                .map(|p| p.parse().map_err(|_| bad()))
                .collect::<Result<_>>()?,
            _ => return Err(bad()),
        };
        if vals.iter().any(|v: &f64| !v.is_finite() || *v <= 0.0) {
            return Err(bad());
        }
        Ok(SpacingChoice::Explicit([vals[0], vals[1], vals[2]]))
    }
}

/// A pipeline file as written: every field optional.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineFile {
    pub description: Option<String>,
    /// "auto" or "x,y,z".
    pub spacing: Option<String>,
    pub normalization: Option<String>,
    pub image_dtype: Option<String>,
    /// Chunk shape (z, y, x) in voxels.
    pub chunk: Option<[usize; 3]>,
    /// Shard shape (z, y, x); each shard holds whole chunks. Absent: no sharding.
    pub shard: Option<[usize; 3]>,
    pub compression: Option<String>,
    pub compression_level: Option<i32>,
    /// Foreground coordinates sampled per class for the patch sampler.
    pub fg_samples: Option<usize>,
    pub seed: Option<u64>,
    /// Training options for `train` (see `train::config::TrainConfig`); they do not shape the
    /// cache, so they are not part of its content key.
    pub train: Option<toml::Table>,
}

/// Parameters after defaults, pipeline file and flags are merged (spacing not yet resolved).
#[derive(Clone, Debug)]
pub struct Settings {
    pub pipeline: String,
    pub spacing: SpacingChoice,
    pub normalization: Normalization,
    pub image_dtype: ImageDtype,
    pub chunk_zyx: [usize; 3],
    pub shard_zyx: Option<[usize; 3]>,
    pub compression: Compression,
    pub fg_samples: usize,
    pub seed: u64,
}

/// The defaults (see README, "Choosing the chunk layout", for the measurement behind them).
impl Default for Settings {
    fn default() -> Self {
        Settings {
            pipeline: "default".into(),
            spacing: SpacingChoice::Auto,
            normalization: Normalization::ZscoreNonzero,
            image_dtype: ImageDtype::Float32,
            chunk_zyx: [32, 128, 128],
            shard_zyx: None,
            compression: Compression::None,
            fg_samples: 10_000,
            seed: 1234,
        }
    }
}

impl Settings {
    /// Overlay a pipeline file on these settings.
    pub fn apply_file(&mut self, name: &str, f: &PipelineFile) -> Result<()> {
        self.pipeline = name.to_string();
        if let Some(s) = &f.spacing {
            self.spacing = s.parse()?;
        }
        if let Some(n) = &f.normalization {
            self.normalization = n.parse()?;
        }
        if let Some(d) = &f.image_dtype {
            self.image_dtype = d.parse()?;
        }
        if let Some(c) = f.chunk {
            self.chunk_zyx = c;
        }
        if f.shard.is_some() {
            self.shard_zyx = f.shard;
        }
        if let Some(c) = &f.compression {
            self.compression = Compression::parse(c, f.compression_level)?;
        }
        if let Some(n) = f.fg_samples {
            self.fg_samples = n;
        }
        if let Some(s) = f.seed {
            self.seed = s;
        }
        self.validate()
    }

    pub fn validate(&self) -> Result<()> {
        if self.chunk_zyx.iter().any(|&c| c == 0 || c > 4096) {
            return Err(Error::Config(format!(
                "chunk shape {:?}: each side must be 1..4096",
                self.chunk_zyx
            )));
        }
        if let Some(s) = self.shard_zyx {
            for a in 0..3 {
                if s[a] == 0 || s[a] % self.chunk_zyx[a] != 0 {
                    return Err(Error::Config(format!(
                        "shard shape {s:?} must be a whole multiple of the chunk shape {:?}",
                        self.chunk_zyx
                    )));
                }
            }
            let bytes: usize = s.iter().product::<usize>() * 4;
            if bytes > 1 << 30 {
                return Err(Error::Config(format!(
                    "shard shape {s:?} is over 1 GiB per shard"
                )));
            }
        }
        Ok(())
    }
}

/// Where a pipeline name points: `NAME` -> pipelines/NAME.toml (next to the working folder, else
/// next to the crate), or a path to a .toml file.
pub fn pipeline_path(name: &str) -> Result<PathBuf> {
    if name.ends_with(".toml") || name.contains('/') {
        return Ok(PathBuf::from(name));
    }
    let candidates = [
        PathBuf::from("pipelines").join(format!("{name}.toml")),
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("pipelines")
            .join(format!("{name}.toml")),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            Error::Config(format!(
                "pipeline {name:?} not found (looked for {})",
                candidates[0].display()
            ))
        })
}

pub fn load_pipeline(name: &str) -> Result<(String, PipelineFile)> {
    let path = pipeline_path(name)?;
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let file: PipelineFile =
        toml::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(name)
        .to_string();
    Ok((stem, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_splits_axes_evenly_under_the_bound() {
        let mut st = Settings {
            chunk_zyx: [32, 128, 128],
            ..Settings::default()
        };
        let p = OutputParams::new(&st, [1.0; 3], None);
        let l = p.layout_for([41, 512, 100]);
        assert_eq!(l.chunk_zyx, [21, 128, 100]);
        assert_eq!(l.shard_zyx, None);
        st.shard_zyx = Some([64, 256, 256]);
        let p = OutputParams::new(&st, [1.0; 3], None);
        let l = p.layout_for([41, 2545, 100]);
        assert_eq!(l.chunk_zyx, [21, 128, 100]);
        assert_eq!(l.shard_zyx, Some([42, 256, 100]));
    }

    #[test]
    fn spacing_parses() {
        assert_eq!(
            "auto".parse::<SpacingChoice>().unwrap(),
            SpacingChoice::Auto
        );
        assert_eq!(
            "1,1,2.5".parse::<SpacingChoice>().unwrap(),
            SpacingChoice::Explicit([1.0, 1.0, 2.5])
        );
        assert_eq!(
            "0.5".parse::<SpacingChoice>().unwrap(),
            SpacingChoice::Explicit([0.5; 3])
        );
        assert!("1,nan,1".parse::<SpacingChoice>().is_err());
        assert!("1,-1,1".parse::<SpacingChoice>().is_err());
        assert!("1,1".parse::<SpacingChoice>().is_err());
    }

    #[test]
    fn every_parameter_changes_the_canonical_json() {
        let base = OutputParams::new(&Settings::default(), [1.0, 1.0, 1.0], None);
        let mut variants = vec![];
        let mut p = base.clone();
        p.target_spacing_xyz[2] = 1.0000001;
        variants.push(p);
        let mut p = base.clone();
        p.normalization = Normalization::Zscore;
        variants.push(p);
        let mut p = base.clone();
        p.chunk_zyx = [16, 16, 16];
        variants.push(p);
        let mut p = base.clone();
        p.compression = Compression::Zstd { level: 3 };
        variants.push(p);
        let mut p = base.clone();
        p.seed = 7;
        variants.push(p);
        for v in variants {
            assert_ne!(v.canonical_json(), base.canonical_json());
        }
    }
}
