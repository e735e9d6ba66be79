//! One case's work: read and normalize its input, write its entry into a temporary folder,
//! make it durable and rename it into place.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::entry::{write_entry, EntryInput};
use super::previous_probabilities::{self, PreviousProbabilities};
use crate::cache::layout::{dir_bytes, Commit};
use crate::cache::store::EntryStore;
use crate::cache::{content_key, CacheDir};
use crate::error::{Error, Result};
use crate::format::entry::{InputGeometry, OutputGeometry, SourceFile, Sources};
use crate::format::{Dtype, Normalization, OutputParams};
use crate::geometry::VoxelRead;
use crate::geometry::{zyx, Affine};
use crate::nifti_io;
use crate::prep::dataset::scan::{check_channel, check_pair, ScannedCase};
use crate::prep::normalize;
use crate::prep::plan::CasePlan;

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
#[derive(Default)]
pub(super) struct Decoded {
    /// One per channel, in order (none when the writer reads the case itself).
    channels: Vec<DecodedChannel>,
    label: Option<DecodedLabel>,
}

/// One image channel read: its voxels, the file's blake3 and size, its statistics and the
/// normalization they give.
struct DecodedChannel {
    voxels: nifti_io::VoxelSource,
    file: (blake3::Hash, u64),
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

/// Read the case's headers again and check them against each other (the files may have
/// changed since the scan); the first channel's header.
pub(super) fn check_headers(s: &ScannedCase) -> Result<nifti_io::HeaderInfo> {
    let id = &s.source.id;
    let header = |k: usize| {
        let (path, frame) = s.source.channel(k);
        nifti_io::read_frame_header(path, frame)
    };
    let first = header(0)?;
    for k in 1..s.source.images.len() {
        check_channel(id, &first, &header(k)?)?;
    }
    if let Some(l) = &s.source.label {
        check_pair(id, &first, &nifti_io::read_header(l)?)?;
    }
    Ok(first)
}

/// Refuse to file a case under its key when the files read (the channels' and the label's
/// hashes) are not those the key was computed from: they changed during the build.
pub(super) fn same_key(
    job: &Job,
    params: &OutputParams,
    images: &[blake3::Hash],
    label: Option<&blake3::Hash>,
) -> Result<()> {
    let s = job.scanned;
    let hashes = images
        .iter()
        .zip(&s.source.images)
        .enumerate()
        .map(|(k, (h, p))| channel_hash(params, k, p, *h))
        .collect::<Result<Vec<_>>>()?;
    if content_key(params, &s.source.id, &hashes, label) != job.key {
        return Err(Error::case(
            &s.source.id,
            "an input file changed during the build; run it again",
        ));
    }
    Ok(())
}

/// The entry's record of the input image's grid, from its header.
pub(super) fn input_geometry(h: &nifti_io::HeaderInfo) -> InputGeometry {
    InputGeometry {
        shape_xyz: h.shape_xyz,
        spacing_xyz: h.spacing_xyz,
        affine: h.affine.0,
        affine_source: h.affine_source.to_string(),
        affine_warning: h.affine_warning.clone(),
        orientation: h.affine.axis_codes(),
        datatype: h.datatype.to_string(),
        unit: h.unit.to_string(),
    }
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
    check_headers(s)?;
    // The channels and the label inflate on two threads: gzip decoding is sequential within a
    // file. Channels share the in-memory budget (each beyond its share goes to scratch).
    let n = s.source.images.len().max(1) as u64;
    let per_channel = nifti_io::SourceOptions {
        ram_limit_bytes: source.ram_limit_bytes / n,
        scratch_dir: source.scratch_dir.clone(),
    };
    let (images, label) = rayon::join(
        || -> Result<Vec<_>> {
            let mut out = Vec::new();
            for k in 0..s.source.images.len() {
                let (path, frame) = s.source.channel(k);
                let mut acc = normalize::IntensityAccumulator::default();
                let (v, st) =
                    nifti_io::VoxelSource::open_frame(path, frame, &per_channel, &mut |b| {
                        acc.add(b);
                        Ok(())
                    })?;
                out.push((v, st, acc.finish()));
            }
            Ok(out)
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
    let images = images?;
    let label = label.transpose()?;
    for (v, _, _) in &images[1..] {
        check_channel(id, images[0].0.header(), v.header())?;
    }
    if let Some(l) = &label {
        check_pair(id, images[0].0.header(), l.voxels.header())?;
    }
    let read: Vec<blake3::Hash> = images.iter().map(|(_, st, _)| st.file_hash).collect();
    same_key(job, params, &read, label.as_ref().map(|l| &l.file.0))?;
    let mut channels = Vec::new();
    for ((voxels, streamed, stats), (path, cp)) in images
        .into_iter()
        .zip(s.source.images.iter().zip(&params.channels))
    {
        normalize::refuse_nonfinite(path, stats.nonfinite_voxels)?;
        let applied = normalize::plan_normalization(
            cp.normalization,
            &stats,
            cp.dataset_foreground.as_ref(),
        )?;
        channels.push(DecodedChannel {
            voxels,
            file: (streamed.file_hash, streamed.file_bytes),
            stats,
            applied,
        });
    }
    Ok(Decoded { channels, label })
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
    let Decoded { channels, label } = decoded;
    let h = channels[0].voxels.header();
    let out_xyz = job.plan.out_shape_xyz;
    let out_affine: Affine = h.affine.for_output_grid(h.shape_xyz, out_xyz);
    let source = Sources {
        images: channels
            .iter()
            .zip(&s.source.images)
            .map(|(c, p)| SourceFile {
                file: file_name(p),
                blake3: c.file.0.to_hex().to_string(),
                bytes: c.file.1,
            })
            .collect(),
        label: match (&s.source.label, label.as_ref().map(|l| l.file)) {
            (Some(p), Some((hash, bytes))) => Some(SourceFile {
                file: file_name(p),
                blake3: hash.to_hex().to_string(),
                bytes,
            }),
            _ => None,
        },
    };
    let input = input_geometry(h);
    let output = OutputGeometry::new(
        out_xyz,
        job.plan.out_spacing_xyz,
        params.target_spacing_xyz,
        out_affine.0,
        out_affine.axis_codes(),
    );

    // A previous stage's channels all name one segmentation: its probabilities, if kept.
    let previous = match s
        .source
        .images
        .iter()
        .enumerate()
        .find_map(|(k, p)| previous_probabilities_of(params, k, p).map(|q| (p, q)))
    {
        Some((seg, probs)) => {
            PreviousProbabilities::open(&probs, seg, zyx(h.shape_xyz), &h.affine.0)?
        }
        None => None,
    };
    let mut source = source;
    if let Some(p) = &previous {
        // The entry names what its channels were made from.
        let (hash, bytes) = previous_probabilities::hash(p.path())?;
        for (k, f) in source.images.iter_mut().enumerate() {
            if previous_probabilities_of(params, k, &s.source.images[k]).is_some() {
                f.file = file_name(p.path());
                f.blake3 = hash.to_hex().to_string();
                f.bytes = bytes;
            }
        }
    }
    let tmp = cache.new_tmp_entry(key)?;
    let store = Arc::new(EntryStore::new(&tmp));
    let normalized: Vec<normalize::Normalized<'_, nifti_io::VoxelSource>> = channels
        .iter()
        .map(|c| normalize::Normalized {
            input: &c.voxels,
            applied: c.applied,
        })
        .collect();
    let images: Vec<&dyn VoxelRead> = normalized.iter().map(|n| n as &dyn VoxelRead).collect();
    let result = (|| {
        write_entry(
            &store,
            &tmp,
            EntryInput {
                case_id: id,
                key,
                images: &images,
                label: label
                    .as_ref()
                    .map(|l| (&l.voxels as &dyn VoxelRead, l.dtype)),
                previous: previous.as_ref(),
                norm_mask: None,
                in_shape_zyx: zyx(h.shape_xyz),
                out_shape_zyx: zyx(out_xyz),
                params,
                source,
                input,
                output,
                intensity: channels.iter().map(|c| c.stats).collect(),
                normalization: channels.iter().map(|c| c.applied).collect(),
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
    pub(super) tmp: PathBuf,
    pub(super) key: String,
    pub(super) store: Arc<EntryStore>,
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

pub(super) fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default()
}

/// The content key of a case: its parameters and the bytes of its files (hashing is cheap,
/// so what is cached is known before any heavy work).
pub(super) fn case_key(params: &OutputParams, s: &ScannedCase) -> Result<String> {
    // A packed case names one file per channel: hashed once.
    let mut ih: Vec<blake3::Hash> = Vec::new();
    for (k, p) in s.source.images.iter().enumerate() {
        // The previous stage's channels repeat one file.
        let again = k > 0 && (s.source.packed || s.source.images[k] == s.source.images[k - 1]);
        ih.push(match again {
            true => ih[k - 1],
            false => channel_hash(params, k, p, hash_file(p)?)?,
        });
    }
    let lh = match &s.source.label {
        Some(l) => Some(hash_file(l)?),
        None => None,
    };
    Ok(content_key(params, &s.source.id, &ih, lh.as_ref()))
}

/// What channel `k` (file `p`, whose bytes hash to `file`) adds to its case's key: the file's
/// hash, and the probabilities the channel is made from when there are some.
fn channel_hash(
    params: &OutputParams,
    k: usize,
    p: &Path,
    file: blake3::Hash,
) -> Result<blake3::Hash> {
    Ok(match previous_probabilities_of(params, k, p) {
        None => file,
        Some(probs) => {
            let mut h = blake3::Hasher::new();
            h.update(file.as_bytes());
            h.update(previous_probabilities::hash(&probs)?.0.as_bytes());
            h.finalize()
        }
    })
}

/// The first stage's probabilities beside channel `k`'s file `p`, when that channel is a previous
/// stage's segmentation.
fn previous_probabilities_of(params: &OutputParams, k: usize, p: &Path) -> Option<PathBuf> {
    match params.channels.get(k).map(|c| c.normalization) {
        Some(Normalization::Indicator(_)) => previous_probabilities::beside(p),
        _ => None,
    }
}

fn hash_file(path: &Path) -> Result<blake3::Hash> {
    let mut h = blake3::Hasher::new();
    let f = crate::nifti_io::open_input(path)?;
    h.update_reader(f).map_err(|e| Error::io(path, e))?;
    Ok(h.finalize())
}
