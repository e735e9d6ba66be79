//! Pipelines: named parameter sets, like a recipe per dataset. The bundled ones are compiled into
//! the library, so an installed binary behaves the same on every machine whatever folder it runs
//! in; a user's own pipeline is a `.toml` file given by path.

use std::path::Path;

use serde::Deserialize;

use super::configurations::ConfigurationTable;
use super::settings::{PrepFlags, Settings, SpacingChoice};
use super::values::from_str;
use crate::error::{Error, Result};
use crate::format::ImageDtype;
use crate::prep::normalize::Normalization;
use crate::train::config::TrainConfig;

/// The pipeline used when none is named.
pub use crate::prep::settings::DEFAULT_PIPELINE;

/// The bundled pipelines: `pipelines/NAME.toml` of the source tree at build time.
pub const BUNDLED: [(&str, &str); 4] = [
    ("compact", include_str!("../../pipelines/compact.toml")),
    ("ct", include_str!("../../pipelines/ct.toml")),
    ("default", include_str!("../../pipelines/default.toml")),
    ("minivess", include_str!("../../pipelines/minivess.toml")),
];

/// A pipeline file as written: every field optional, unknown keys refused. Values are read
/// through the same parsers as the command-line flags of the same name.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineFile {
    /// What the pipeline is for, in a line (every bundled one has one).
    pub description: Option<String>,
    /// "auto", "x,y,z" or one number for all three axes.
    #[serde(default, deserialize_with = "from_str")]
    pub spacing: Option<SpacingChoice>,
    /// zscore-nonzero, zscore, ct or none.
    #[serde(default, deserialize_with = "from_str")]
    pub normalization: Option<Normalization>,
    /// auto, raw or packed (the four keys below override parts of it).
    #[serde(default, deserialize_with = "from_str")]
    pub layout: Option<super::settings::Layout>,
    /// float32 or float16.
    #[serde(default, deserialize_with = "from_str")]
    pub image_dtype: Option<ImageDtype>,
    /// Chunk shape (z, y, x) in voxels.
    pub chunk: Option<[usize; 3]>,
    /// Shard shape (z, y, x); each shard holds whole chunks. Absent: no sharding.
    pub shard: Option<[usize; 3]>,
    /// none (memory-mappable), zstd, blosc or blosc-lz4.
    pub compression: Option<String>,
    /// Level of the codec (zstd: default 3; blosc: 0..9, default 5).
    pub compression_level: Option<i32>,
    /// Foreground coordinates sampled per class for the patch sampler.
    pub fg_samples: Option<usize>,
    /// Seed of the foreground sample (same seed, same sample).
    pub seed: Option<u64>,
    /// Label-derived arrays to build: a list of "distance", "skeleton" (default: none).
    pub derived: Option<Vec<String>>,
    /// Largest forecast output of one case, in GiB (default 1024).
    pub max_case_gib: Option<f64>,
    /// Inputs with more voxel data than this many MiB are read from a scratch file (default 256).
    pub input_ram_mib: Option<u64>,
    /// Options of `train`; they do not shape the cache, so they are not part of its content key.
    pub train: Option<TrainConfig>,
    /// The planned configuration used (a key of `configurations`): its spacing is the
    /// cache's, its patch, batch and network `[train]`'s (`--configuration` picks another).
    pub configuration: Option<String>,
    /// Planned configurations (`prep plan` writes them), by name.
    pub configurations: Option<std::collections::BTreeMap<String, ConfigurationTable>>,
}

impl PipelineFile {
    /// The cache parameters this file sets, as one layer over the defaults (the command line is
    /// another layer of the same kind, applied after it).
    pub fn cache_layer(&self) -> Result<PrepFlags> {
        let derived = match &self.derived {
            Some(names) => Some(crate::format::DerivedArrays::from_names(names)?),
            None => None,
        };
        Ok(PrepFlags {
            pipeline: None,
            configuration: None,
            spacing: self.spacing,
            normalization: self.normalization,
            layout: self.layout,
            image_dtype: self.image_dtype,
            chunk: self.chunk,
            shard: self.shard.map(|s| super::values::Shard(Some(s))),
            compression: self.compression.clone(),
            compression_level: self.compression_level,
            fg_samples: self.fg_samples,
            seed: self.seed,
            max_case_gib: self.max_case_gib,
            input_ram_mib: self.input_ram_mib,
            derived,
        })
    }
}

/// A loaded, checked pipeline: its file merged over the defaults, for the cache and for `train`.
#[derive(Clone, Debug)]
pub struct Pipeline {
    /// The name recorded in the manifest: the bundled name, or the file's stem.
    pub name: String,
    /// Where it came from, for messages: `bundled pipeline ct` or `pipeline file my/ct.toml`.
    pub origin: String,
    /// The file as written, before the defaults.
    pub file: PipelineFile,
    /// The defaults with this file's cache parameters applied (validated).
    pub settings: Settings,
    /// The training defaults with this file's `[train]` table applied (validated).
    pub train: TrainConfig,
    /// Whether the pipeline gives a patch (a bundled pipeline, a `[train]` patch or a
    /// configuration): when nothing does, `train` plans the patch and network from the cache.
    pub patch_given: bool,
}

/// True when `spec` names a file rather than a bundled pipeline.
fn is_path(spec: &str) -> bool {
    spec.ends_with(".toml") || spec.contains('/') || spec.contains(std::path::MAIN_SEPARATOR)
}

impl Pipeline {
    /// `NAME` is a bundled pipeline; a value ending in `.toml` or holding a path separator is a
    /// file. Any fault in the file (TOML syntax, an unknown key, a bad value) is an error that
    /// names it: a pipeline is never silently skipped.
    pub fn load(spec: &str) -> Result<Pipeline> {
        Pipeline::load_configured(spec, None)
    }

    /// [`Pipeline::load`], with `configuration` (when given) picked instead of the file's.
    pub fn load_configured(spec: &str, configuration: Option<&str>) -> Result<Pipeline> {
        let mut p = Pipeline::load_file(spec)?;
        if let Some(name) = configuration.or(p.file.configuration.as_deref()) {
            let name = name.to_string();
            let in_origin = |e: &dyn std::fmt::Display| Error::Config(format!("{}: {e}", p.origin));
            let table = p
                .file
                .configurations
                .as_ref()
                .and_then(|c| c.get(&name))
                .ok_or_else(|| {
                    let have: Vec<String> = p
                        .file
                        .configurations
                        .iter()
                        .flat_map(|c| c.keys().cloned())
                        .collect();
                    in_origin(&format!(
                        "configuration {name:?} is not one of its [configurations] ({})",
                        if have.is_empty() {
                            "none".to_string()
                        } else {
                            have.join(", ")
                        }
                    ))
                })?
                .clone();
            table
                .apply(&name, &mut p.settings, &mut p.train)
                .map_err(|e| in_origin(&e))?;
            p.patch_given = true;
        }
        Ok(p)
    }

    fn load_file(spec: &str) -> Result<Pipeline> {
        if is_path(spec) {
            let path = Path::new(spec);
            let origin = format!("pipeline file {}", path.display());
            let bytes = crate::util::files::read_capped(path, 16 << 20)
                .map_err(|e| Error::Config(format!("{origin}: {e}")))?;
            let text = String::from_utf8(bytes)
                .map_err(|_| Error::Config(format!("{origin}: not UTF-8 text")))?;
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or(spec)
                .to_string();
            return Pipeline::parse(name, origin, &text);
        }
        match BUNDLED.iter().find(|(n, _)| *n == spec) {
            Some((name, text)) => {
                let mut p =
                    Pipeline::parse(name.to_string(), format!("bundled pipeline {name}"), text)?;
                // A bundled pipeline without a [train] table trains with the default one's
                // small network; only a file of the user's that gives no patch is planned.
                p.patch_given = true;
                Ok(p)
            }
            None => Err(Error::Config(format!(
                "pipeline {spec:?}: no bundled pipeline has that name (bundled: {}); \
                 give a path ending in .toml for a file of your own",
                bundled_names().join(", ")
            ))),
        }
    }

    /// The pipeline used when none is named.
    pub fn default_pipeline() -> Result<Pipeline> {
        Pipeline::load(DEFAULT_PIPELINE)
    }

    /// Parse and check a pipeline's text; `origin` prefixes every error.
    pub fn parse(name: String, origin: String, text: &str) -> Result<Pipeline> {
        let in_origin = |e: &dyn std::fmt::Display| Error::Config(format!("{origin}: {e}"));
        let file: PipelineFile = toml::from_str(text).map_err(|e| in_origin(&e))?;
        let mut settings = Settings {
            pipeline: name.clone(),
            ..Settings::default()
        };
        file.cache_layer()
            .and_then(|layer| super::settings::apply(&mut settings, &layer))
            .and_then(|()| settings.validate())
            .map_err(|e| in_origin(&e))?;
        let train = file.train.clone().unwrap_or_default();
        train
            .validate()
            .map_err(|e| in_origin(&format!("[train]: {e}")))?;
        let raw: toml::Table = toml::from_str(text).map_err(|e| in_origin(&e))?;
        let patch_given = raw
            .get("train")
            .and_then(|t| t.as_table())
            .is_some_and(|t| t.contains_key("patch"));
        Ok(Pipeline {
            name,
            origin,
            file,
            settings,
            train,
            patch_given,
        })
    }
}

/// Names of the bundled pipelines, sorted.
pub fn bundled_names() -> Vec<&'static str> {
    BUNDLED.iter().map(|(n, _)| *n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_pipeline_parses_and_validates() {
        for name in bundled_names() {
            let p = Pipeline::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(p.name, name);
            assert!(p.file.description.is_some(), "{name} has no description");
        }
        let names = bundled_names();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
    }

    #[test]
    fn every_file_in_pipelines_is_bundled() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        assert_eq!(on_disk, bundled_names());
    }

    #[test]
    fn the_default_pipeline_is_the_built_in_default() {
        let p = Pipeline::default_pipeline().unwrap();
        let d = Settings::default();
        assert_eq!(
            (
                p.settings.chunk_zyx,
                p.settings.compression,
                p.settings.seed
            ),
            (d.chunk_zyx, d.compression, d.seed)
        );
    }

    #[test]
    fn broken_pipelines_are_errors_that_name_them() {
        let t = tempfile::tempdir().unwrap();
        let cases = [
            ("syntax.toml", "chunk = [32, 128"),
            ("unknown.toml", "chunks = [32, 128, 128]"),
            ("value.toml", "normalization = \"zscore-everything\""),
            ("spacing.toml", "spacing = \"1,1\""),
            ("shape.toml", "chunk = [0, 128, 128]"),
            ("train.toml", "[train]\npach = [8, 32, 32]"),
            ("trainvalue.toml", "[train]\nsteps = 0"),
        ];
        for (file, text) in cases {
            let path = t.path().join(file);
            std::fs::write(&path, text).unwrap();
            let e = Pipeline::load(path.to_str().unwrap())
                .unwrap_err()
                .to_string();
            assert!(e.contains(file), "{file}: {e}");
        }
        let e = Pipeline::load("nosuch").unwrap_err().to_string();
        assert!(e.contains("nosuch") && e.contains("minivess"), "{e}");
        let missing = t.path().join("missing.toml");
        let e = Pipeline::load(missing.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.toml"), "{e}");
    }

    #[test]
    fn a_file_is_named_by_its_stem() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("mine.toml");
        std::fs::write(&path, "image_dtype = \"float16\"").unwrap();
        let p = Pipeline::load(path.to_str().unwrap()).unwrap();
        assert_eq!(p.name, "mine");
        assert_eq!(p.settings.pipeline, "mine");
        assert_eq!(p.settings.image_dtype, ImageDtype::Float16);
    }
}
