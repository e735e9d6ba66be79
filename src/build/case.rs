//! One case's work: read and normalize its input, write its entry into a temporary folder,
//! make it durable and rename it into place.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cache::layout::{dir_bytes, Commit};
use crate::cache::store::EntryStore;
use crate::cache::writer::{write_entry, EntryInput};
use crate::cache::{content_key, CacheDir};
use crate::dataset::scan::{check_pair, ScannedCase};
use crate::error::{Error, Result};
use crate::format::entry::{InputGeometry, OutputGeometry, SourceFile, Sources};
use crate::format::{Dtype, OutputParams};
use crate::geometry::{zyx, Affine};
use crate::nifti_io;
use crate::normalize;
use crate::plan::CasePlan;
use crate::resample::VoxelRead;

/// Everything known about one case before it is built.
pub(super) struct Job<'a> {
    pub(super) scanned: &'a ScannedCase,
    pub(super) plan: &'a CasePlan,
    pub(super) key: String,
    /// The label values dataset.json allows, if the dataset has one.
    pub(super) label_values: Option<&'a std::collections::BTreeSet<u16>>,
}

/// A case read and checked, its statistics known, ready to be resampled and written. Its
/// voxels are held as stored (in memory when small, else in a scratch file), not as f32.
pub(super) struct Decoded {
    image: nifti_io::VoxelSource,
    image_file: (blake3::Hash, u64),
    label: Option<DecodedLabel>,
    stats: normalize::IntensityStats,
    applied: normalize::AppliedNormalization,
}

/// A label read and checked: its voxels, the type they are cached as, the file's blake3 and
/// size.
struct DecodedLabel {
    voxels: nifti_io::VoxelSource,
    dtype: Dtype,
    file: (blake3::Hash, u64),
}

/// Read and check one case's input, computing its statistics as it streams (everything before
/// resampling). Headers are checked against each other before any voxel is read.
pub(super) fn decode_case(
    job: &Job,
    params: &OutputParams,
    source: &nifti_io::SourceOptions,
) -> Result<Decoded> {
    let s = job.scanned;
    let id = &s.source.id;
    if let Some(l) = &s.source.label {
        check_pair(
            id,
            &nifti_io::read_header(&s.source.image)?,
            &nifti_io::read_header(l)?,
        )?;
    }
    // Image and label inflate on two threads: gzip decoding is sequential within a file.
    let (image, label) = rayon::join(
        || {
            let mut acc = normalize::IntensityAccumulator::default();
            nifti_io::VoxelSource::open(&s.source.image, source, &mut |b| {
                acc.add(b);
                Ok(())
            })
            .map(|(v, st)| (v, st, acc.finish()))
        },
        || {
            s.source.label.as_ref().map(|p| {
                let mut check = nifti_io::LabelCheck::new(p);
                if let Some(v) = job.label_values {
                    check = check.allowing_only(v);
                }
                nifti_io::VoxelSource::open(p, source, &mut |b| check.block(b)).map(|(v, st)| {
                    DecodedLabel {
                        voxels: v,
                        dtype: check.dtype(),
                        file: (st.file_hash, st.file_bytes),
                    }
                })
            })
        },
    );
    let (image, streamed, stats) = image?;
    let label = label.transpose()?;
    if let Some(l) = &label {
        check_pair(id, image.header(), l.voxels.header())?;
    }
    // The files may have changed since the key was computed: refuse to file them under it.
    let key = content_key(
        params,
        id,
        &streamed.file_hash,
        label.as_ref().map(|l| &l.file.0),
    );
    if key != job.key {
        return Err(Error::case(
            id,
            "an input file changed during the build; run it again",
        ));
    }
    if stats.nonfinite_voxels > 0 {
        return Err(Error::nifti(
            &s.source.image,
            format!(
                "{} voxels are NaN or infinite; fix or mask them before caching",
                stats.nonfinite_voxels
            ),
        ));
    }
    let applied = normalize::plan_normalization(
        params.normalization,
        &stats,
        params.dataset_foreground.as_ref(),
    )?;
    Ok(Decoded {
        image,
        image_file: (streamed.file_hash, streamed.file_bytes),
        label,
        stats,
        applied,
    })
}

/// Write one decoded case's entry into a temporary folder and move it into place.
pub(super) fn write_case(
    cache: &CacheDir,
    job: &Job,
    params: &OutputParams,
    decoded: Decoded,
    on_voxels: &(dyn Fn(u64) + Sync),
) -> Result<Written> {
    let s = job.scanned;
    let id = &s.source.id;
    let key = &job.key;
    let Decoded {
        image,
        image_file: (image_hash, image_bytes),
        label,
        stats,
        applied,
    } = decoded;
    let h = image.header();
    let out_xyz = job.plan.out_shape_xyz;
    let out_affine: Affine = h.affine.for_output_grid(h.shape_xyz, out_xyz);
    let source = Sources {
        image: SourceFile {
            file: file_name(&s.source.image),
            blake3: image_hash.to_hex().to_string(),
            bytes: image_bytes,
        },
        label: match (&s.source.label, label.as_ref().map(|l| l.file)) {
            (Some(p), Some((hash, bytes))) => Some(SourceFile {
                file: file_name(p),
                blake3: hash.to_hex().to_string(),
                bytes,
            }),
            _ => None,
        },
    };
    let input = InputGeometry {
        shape_xyz: h.shape_xyz,
        spacing_xyz: h.spacing_xyz,
        affine: h.affine,
        affine_source: h.affine_source.to_string(),
        affine_warning: h.affine_warning.clone(),
        orientation: h.affine.axis_codes(),
        datatype: h.datatype.to_string(),
        unit: h.unit.to_string(),
    };
    let output = OutputGeometry::new(
        out_xyz,
        job.plan.out_spacing_xyz,
        params.target_spacing_xyz,
        out_affine,
    );

    let tmp = cache.new_tmp_entry(key)?;
    let store = Arc::new(EntryStore::new(&tmp));
    let result = (|| {
        write_entry(
            &store,
            &tmp,
            EntryInput {
                case_id: id,
                key,
                image: &normalize::Normalized {
                    input: &image,
                    applied,
                },
                label: label
                    .as_ref()
                    .map(|l| (&l.voxels as &dyn VoxelRead, l.dtype)),
                in_shape_zyx: zyx(h.shape_xyz),
                out_shape_zyx: zyx(out_xyz),
                params,
                source,
                input,
                output,
                intensity: stats,
                normalization: applied,
            },
            on_voxels,
        )?;
        Ok(())
    })();
    match result {
        Ok(()) => Ok(Written {
            tmp,
            key: key.clone(),
            store,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// An entry fully written into its temporary folder, not yet durable nor in place.
pub(super) struct Written {
    tmp: PathBuf,
    key: String,
    store: Arc<EntryStore>,
}

/// Make a written entry durable and rename it into place; returns the bytes it added.
pub(super) fn commit_written(cache: &CacheDir, w: Written) -> Result<u64> {
    let result = (|| {
        w.store.sync_all().map_err(|e| Error::io(&w.tmp, e))?;
        let bytes = dir_bytes(&w.tmp);
        failpoint("after-write")?;
        cache
            .commit(&w.tmp, &w.key)
            .map(|c| if c == Commit::Placed { bytes } else { 0 })
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&w.tmp);
    }
    result
}

/// Test hook: `VOXCACHE_FAILPOINT=after-write` makes a build die right before the commit, as a
/// killed process would, so tests can check that nothing half-written is left looking complete.
fn failpoint(name: &str) -> Result<()> {
    if std::env::var("VOXCACHE_FAILPOINT").is_ok_and(|v| v == name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default()
}

/// The content key of a case: its parameters and the bytes of its files (hashing is cheap,
/// so what is cached is known before any heavy work).
pub(super) fn case_key(params: &OutputParams, s: &ScannedCase) -> Result<String> {
    let ih = hash_file(&s.source.image)?;
    let lh = match &s.source.label {
        Some(l) => Some(hash_file(l)?),
        None => None,
    };
    Ok(content_key(params, &s.source.id, &ih, lh.as_ref()))
}

fn hash_file(path: &Path) -> Result<blake3::Hash> {
    let mut h = blake3::Hasher::new();
    let f = crate::nifti_io::open_input(path)?;
    h.update_reader(f).map_err(|e| Error::io(path, e))?;
    Ok(h.finalize())
}
