//! The cache parameters of `prep build-cache` and `prep inspect`: built-in defaults, then a
//! pipeline, then command-line flags, merged by one function ([`resolve`]).

use std::path::PathBuf;

use super::pipeline::{Pipeline, DEFAULT_PIPELINE};
use super::values::{parse_three, parse_zyx, Shard};
use crate::error::{Error, Result};
use crate::format::{Compression, DerivedArrays, ImageDtype};
use crate::prep::dataset::DatasetSource;
use crate::prep::normalize::Normalization;
pub use crate::prep::settings::{Layout, Settings, SpacingChoice};

/// `auto`, `x,y,z`, or one number for all three axes.
impl std::str::FromStr for SpacingChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.trim() == "auto" {
            return Ok(SpacingChoice::Auto);
        }
        match parse_three::<f64>(s, true) {
            Some(v) if v.iter().all(|x| x.is_finite() && *x > 0.0) => {
                Ok(SpacingChoice::Explicit(v))
            }
            _ => Err(Error::Config(format!(
                "spacing {s:?}: give auto, three positive numbers x,y,z, or one for all three"
            ))),
        }
    }
}

/// Overrides of the cache parameters, every one optional: what the command line says (both
/// `prep build-cache` and `prep inspect` take these flags), or what a pipeline file says
/// ([`super::PipelineFile::cache_layer`]). Field names and value spellings are the pipeline
/// file's keys and values.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct PrepFlags {
    /// Bundled pipeline (default, ct, compact, minivess) or a path to a .toml file; the flags
    /// below override it [default: default].
    #[arg(long, value_name = "NAME|FILE.toml")]
    pub pipeline: Option<String>,
    /// The pipeline's planned configuration to use (`prep plan` writes them; default: the
    /// file's `configuration`): its spacing becomes the cache's.
    #[arg(long, value_name = "NAME")]
    pub configuration: Option<String>,
    /// Target spacing: auto (per-axis median + anisotropy rule), x,y,z in the files' units, or
    /// one number for all three axes.
    #[arg(long, value_name = "auto|x,y,z")]
    pub spacing: Option<SpacingChoice>,
    /// zscore-nonzero (default), zscore, ct or none.
    #[arg(long)]
    pub normalization: Option<Normalization>,
    /// Chunk layout: auto (default: raw, or packed when the uncompressed cache would pass
    /// 8 GiB), raw (float32, uncompressed, memory-mapped) or packed (float16, Blosc-LZ4 inner
    /// chunks of 16x32x32 in shards). The four flags below override parts of it.
    #[arg(long, value_name = "auto|raw|packed")]
    pub layout: Option<Layout>,
    /// float32 (default) or float16.
    #[arg(long)]
    pub image_dtype: Option<ImageDtype>,
    /// Chunk shape z,y,x in voxels (an upper bound per axis).
    #[arg(long, value_name = "z,y,x", value_parser = parse_zyx)]
    pub chunk: Option<[usize; 3]>,
    /// Shard shape z,y,x (whole multiples of the chunk), or none.
    #[arg(long, value_name = "z,y,x|none")]
    pub shard: Option<Shard>,
    /// none (memory-mappable), zstd, blosc (zstd inside) or blosc-lz4.
    #[arg(long)]
    pub compression: Option<String>,
    /// Level of the codec (zstd: default 3; blosc: 0..9, default 5).
    #[arg(long)]
    pub compression_level: Option<i32>,
    /// Foreground coordinates sampled per class for patch sampling.
    #[arg(long)]
    pub fg_samples: Option<usize>,
    /// Seed of the foreground sample.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Label-derived arrays to build beside the label: distance (signed distance per class, for
    /// the boundary and surface losses), skeleton (Skeleton Recall, clDice), both as
    /// distance,skeleton, or none (default).
    #[arg(long, value_name = "distance,skeleton|none")]
    pub derived: Option<DerivedArrays>,
    /// Largest output a case may have, in GiB (image + label as cached): a case whose forecast
    /// is over it fails before anything is written (a header with a wrong spacing, usually).
    #[arg(long, value_name = "GIB")]
    pub max_case_gib: Option<f64>,
    /// Input volumes with more voxel data than this (MiB, as stored, inflated) are inflated once
    /// into a scratch file in the cache's tmp/ and read from there, not held in memory.
    #[arg(long, value_name = "MIB")]
    pub input_ram_mib: Option<u64>,
}

/// Overlay one layer of overrides (a pipeline file's, or the flags). A codec named without a
/// level gets that codec's default level; a level alone applies to the current codec.
pub fn apply(s: &mut Settings, l: &PrepFlags) -> Result<()> {
    if let Some(v) = l.spacing {
        s.spacing = v;
    }
    if let Some(v) = l.normalization {
        s.normalization = v;
    }
    if let Some(v) = l.layout {
        v.apply_to(s);
    }
    // A field of the layout set on its own: the layout is the one written, not decided.
    let own = l.image_dtype.is_some()
        || l.chunk.is_some()
        || l.shard.is_some()
        || l.compression.is_some()
        || l.compression_level.is_some();
    if own && s.layout == Layout::Auto {
        s.layout = Layout::Raw;
    }
    if let Some(v) = l.image_dtype {
        s.image_dtype = v;
    }
    if let Some(v) = l.chunk {
        s.chunk_zyx = v;
    }
    if let Some(Shard(v)) = l.shard {
        s.shard_zyx = v;
    }
    match (&l.compression, l.compression_level) {
        (Some(c), level) => s.compression = Compression::parse(c, level)?,
        (None, Some(level)) => {
            s.compression = Compression::parse(s.compression.name(), Some(level))?
        }
        (None, None) => {}
    }
    if let Some(v) = l.fg_samples {
        s.fg_samples = v;
    }
    if let Some(v) = l.seed {
        s.seed = v;
    }
    if let Some(v) = l.derived {
        s.derived = v;
    }
    if let Some(v) = l.max_case_gib {
        s.max_case_gib = v;
    }
    if let Some(v) = l.input_ram_mib {
        s.input_ram_mib = v;
    }
    Ok(())
}

/// The settings of a build (or of inspect's forecast of one): the pipeline the flags name (the
/// default one otherwise), then the flags, checked together.
pub fn resolve(flags: &PrepFlags) -> Result<Settings> {
    let pipeline = Pipeline::load_configured(
        flags.pipeline.as_deref().unwrap_or(DEFAULT_PIPELINE),
        flags.configuration.as_deref(),
    )?;
    let mut s = pipeline.settings;
    apply(&mut s, flags)?;
    s.normalization_forced = flags.normalization.is_some();
    s.validate()?;
    Ok(s)
}

/// The dataset folder used when `prep build-cache` is given none, relative to the working folder
/// (the repository root in the README's first command).
pub const BUNDLED_DATA: &str = "data/vessels";

/// Where the cases come from: `--images`/`--labels` globs, else DATA, else the bundled dataset.
pub fn dataset_source(
    data: Option<PathBuf>,
    images: Option<String>,
    labels: Option<String>,
) -> Result<DatasetSource> {
    Ok(match (images, data) {
        (Some(images), _) => DatasetSource::Globs { images, labels },
        (None, Some(d)) => DatasetSource::Folder(d),
        (None, None) => {
            let d = PathBuf::from(BUNDLED_DATA);
            if !d.is_dir() {
                return Err(Error::Config(format!(
                    "no DATA given, and the bundled dataset {BUNDLED_DATA} is not under the \
                     working folder: give a dataset folder or --images"
                )));
            }
            DatasetSource::Folder(d)
        }
    })
}

/// Refuse a cache folder that is, holds or is inside the data it is built from.
pub fn cache_apart(
    cache: &std::path::Path,
    source: &DatasetSource,
    previous: Option<&std::path::Path>,
) -> Result<()> {
    // A glob's folder: the part of the pattern before its first wildcard.
    let glob_dir = |g: &str| -> PathBuf {
        std::path::Path::new(g)
            .components()
            .take_while(|c| !c.as_os_str().to_string_lossy().contains(['*', '?', '[']))
            .collect()
    };
    let mut read: Vec<(&str, PathBuf)> = match source {
        DatasetSource::Folder(d) => vec![("the data folder", d.clone())],
        DatasetSource::Globs { images, labels } => std::iter::once(("--images", images))
            .chain(labels.iter().map(|l| ("--labels", l)))
            .map(|(f, g)| (f, glob_dir(g)))
            .filter(|(_, d)| !d.as_os_str().is_empty())
            .collect(),
        DatasetSource::Cases(_) => Vec::new(),
    };
    read.extend(previous.map(|p| ("--previous-stage", p.to_path_buf())));
    let read: Vec<(&str, &std::path::Path)> = read.iter().map(|(f, p)| (*f, p.as_path())).collect();
    crate::util::paths::refuse_overlap("--cache-dir", cache, &read)?;
    Ok(())
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
        let p = st.output_params([1.0; 3], None);
        let l = p.layout_for([41, 512, 100]);
        assert_eq!(l.chunk_zyx, [21, 128, 100]);
        assert_eq!(l.shard_zyx, None);
        st.shard_zyx = Some([64, 256, 256]);
        let p = st.output_params([1.0; 3], None);
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
        let base = Settings::default().output_params([1.0, 1.0, 1.0], None);
        let mut variants = vec![];
        let mut p = base.clone();
        p.target_spacing_xyz[2] = 1.0000001;
        variants.push(p);
        let mut p = base.clone();
        p.channels[0].normalization = Normalization::Zscore;
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

    #[test]
    fn the_layout_is_auto_until_something_sets_it() {
        let s = resolve(&PrepFlags::default()).unwrap();
        assert_eq!(s.layout, Layout::Auto);
        assert_eq!(s.compression, Compression::None);
        // A field of the layout on its own: the layout is the one written (raw's, changed).
        let s = resolve(&PrepFlags {
            image_dtype: Some(ImageDtype::Float16),
            ..PrepFlags::default()
        })
        .unwrap();
        assert_eq!(s.layout, Layout::Raw);
        // --layout over a pipeline's, then a flag over a part of it.
        let s = resolve(&PrepFlags {
            pipeline: Some("compact".into()),
            layout: Some(Layout::Raw),
            ..PrepFlags::default()
        })
        .unwrap();
        assert_eq!((s.layout, s.shard_zyx), (Layout::Raw, None));
        let s = resolve(&PrepFlags {
            layout: Some(Layout::Packed),
            compression: Some("zstd".into()),
            ..PrepFlags::default()
        })
        .unwrap();
        assert_eq!(s.layout, Layout::Packed);
        assert_eq!(s.image_dtype, ImageDtype::Float16);
        assert_eq!(s.compression, Compression::Zstd { level: 3 });
        assert!("packd".parse::<Layout>().is_err());
    }

    #[test]
    fn flags_override_the_pipeline_and_are_checked_with_it() {
        let s = resolve(&PrepFlags {
            pipeline: Some("compact".into()),
            chunk: Some([16, 64, 64]),
            ..PrepFlags::default()
        })
        .unwrap();
        assert_eq!(s.pipeline, "compact");
        assert_eq!(s.image_dtype, ImageDtype::Float16);
        assert_eq!(s.chunk_zyx, [16, 64, 64]);
        assert_eq!(s.shard_zyx, Some([64, 256, 256]));
        assert_eq!(s.compression, Compression::BloscLz4 { level: 5 });

        // A level alone keeps the pipeline's codec; --shard none turns sharding off.
        let s = resolve(&PrepFlags {
            pipeline: Some("compact".into()),
            compression_level: Some(9),
            shard: Some(Shard(None)),
            ..PrepFlags::default()
        })
        .unwrap();
        assert_eq!(s.compression, Compression::BloscLz4 { level: 9 });
        assert_eq!(s.shard_zyx, None);

        // The compact pipeline's shard is not a multiple of this chunk.
        let e = resolve(&PrepFlags {
            pipeline: Some("compact".into()),
            chunk: Some([48, 64, 64]),
            ..PrepFlags::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("whole multiple"), "{e}");
    }

    #[test]
    fn no_flags_means_the_default_pipeline() {
        let s = resolve(&PrepFlags::default()).unwrap();
        let d = Settings::default();
        assert_eq!(s.pipeline, "default");
        assert_eq!(
            s.output_params([1.0; 3], None).canonical_json(),
            d.output_params([1.0; 3], None).canonical_json()
        );
    }
}
