//! `--verify`: decode every write block of an entry (a chunk, or a shard when sharded) and compare
//! its blake3 with the one recorded in the entry's attributes at build time. A block whose file is
//! absent is fine only when its recorded hash is that of an all-fill-value (zero) block: Zarr
//! does not write such blocks.

use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;
use serde::Serialize;
use zarrs::array::Array;

use super::entry_meta::EntryMeta;
use super::{rel_path, Problem};
use crate::cache::reader::EntryReader;
use crate::cache::store::{open_readable, ReadStore};
use crate::format::{
    ArrayLayout, ChunkChecksums, Dtype, EntryAttrs, CHECKSUMS_AT, FG_ARRAY, ZARR_JSON,
};

/// Counts over the blocks checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VerifySummary {
    /// Entries checked.
    pub entries: usize,
    /// Blocks (chunks or shards) checked.
    pub blocks_checked: u64,
    /// Blocks whose hash matched the recorded one.
    pub blocks_ok: u64,
    /// Absent files whose recorded content is all fill value (legitimately not written).
    pub blocks_absent: u64,
    /// Blocks whose bytes do not match their recorded hash.
    pub corrupt: u64,
    /// Recorded blocks with no file (and content that is not all fill value).
    pub missing: u64,
    /// Unreadable metadata or checksums, unrecorded blocks and other inconsistencies.
    pub other: u64,
}

impl VerifySummary {
    /// Add another summary's block counts (not its entry count).
    pub fn add(&mut self, o: &VerifySummary) {
        self.blocks_checked += o.blocks_checked;
        self.blocks_ok += o.blocks_ok;
        self.blocks_absent += o.blocks_absent;
        self.corrupt += o.corrupt;
        self.missing += o.missing;
        self.other += o.other;
    }
}

/// Blocks bigger than this are checked one at a time (shards can be up to 1 GiB decoded).
const PARALLEL_BLOCK_BYTES: usize = 64 << 20;

/// Decode one block into the little-endian bytes the build hashed.
fn block_bytes(array: &Array<ReadStore>, dtype: Dtype, idx: &[u64]) -> Result<Vec<u8>, String> {
    let e = |e: zarrs::array::ArrayError| e.to_string();
    Ok(match dtype {
        Dtype::Float32 => array
            .retrieve_chunk::<Vec<f32>>(idx)
            .map_err(e)?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        Dtype::Float16 => array
            .retrieve_chunk::<Vec<half::f16>>(idx)
            .map_err(e)?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        Dtype::Uint8 => array.retrieve_chunk::<Vec<u8>>(idx).map_err(e)?,
        Dtype::Uint16 => array
            .retrieve_chunk::<Vec<u16>>(idx)
            .map_err(e)?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        Dtype::Uint32 => array
            .retrieve_chunk::<Vec<u32>>(idx)
            .map_err(e)?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    })
}

/// How the checksums file names a block: its indices joined by dots (`c.z.y.x` for the image).
fn block_name(idx: &[u64]) -> String {
    idx.iter().map(u64::to_string).collect::<Vec<_>>().join(".")
}

enum Outcome {
    Ok,
    Absent,
    Corrupt(Problem),
    Missing(Problem),
    Other(Problem),
}

struct ArrayCheck<'a> {
    root: &'a Path,
    meta: &'a EntryMeta,
    name: &'a str,
    array: &'a Array<ReadStore>,
    dtype: Dtype,
    recorded: &'a std::collections::BTreeMap<String, String>,
    zero_hash: String,
}

impl ArrayCheck<'_> {
    fn block(&self, idx: &[u64]) -> Outcome {
        let name = block_name(idx);
        let key = self.array.chunk_key(idx);
        let path = self.meta.dir.join(key.as_str());
        let rel = rel_path(self.root, &path);
        let problem = |kind: &'static str, msg: String| {
            Problem::error(kind, msg)
                .case(&self.meta.case_id)
                .path(rel.clone())
                .block(self.name, name.clone())
        };
        let Some(want) = self.recorded.get(&name) else {
            return Outcome::Other(problem(
                "unrecorded-chunk",
                format!("no checksum recorded for this block in {CHECKSUMS_AT}"),
            ));
        };
        if !path.is_file() {
            return if *want == self.zero_hash {
                Outcome::Absent
            } else {
                Outcome::Missing(problem(
                    "missing-chunk",
                    "the chunk file is missing, and the block it held was not all fill value"
                        .into(),
                ))
            };
        }
        match block_bytes(self.array, self.dtype, idx) {
            Err(e) => Outcome::Corrupt(problem("corrupt-chunk", format!("does not decode: {e}"))),
            Ok(bytes) => {
                let got = ChunkChecksums::hash(&bytes);
                if got == *want {
                    Outcome::Ok
                } else {
                    Outcome::Corrupt(problem(
                        "corrupt-chunk",
                        format!("content hash {got} differs from the recorded {want}"),
                    ))
                }
            }
        }
    }
}

/// What one entry's verification found so far.
struct Acc<'a> {
    sum: VerifySummary,
    problems: Vec<Problem>,
    case: &'a str,
}

impl Acc<'_> {
    fn other(&mut self, p: Problem) {
        self.sum.other += 1;
        self.problems.push(p.case(self.case));
    }

    fn done(self) -> (VerifySummary, Vec<Problem>) {
        (self.sum, self.problems)
    }
}

/// Verify one entry: every block of its image, label and derived arrays, and that its fg
/// array decodes.
pub fn verify_entry(root: &Path, m: &EntryMeta) -> (VerifySummary, Vec<Problem>) {
    let mut acc = Acc {
        sum: VerifySummary::default(),
        problems: Vec::new(),
        case: &m.case_id,
    };
    let sums_rel = rel_path(root, &m.dir.join(ZARR_JSON));
    let Some(sums) = entry_checksums(root, m, &mut acc) else {
        return acc.done();
    };
    let store = match open_readable(&m.dir) {
        Ok(s) => s,
        Err(e) => {
            acc.other(
                Problem::error("metadata", format!("cannot open the entry: {e}"))
                    .path(m.rel.clone()),
            );
            return acc.done();
        }
    };
    // (name, type, channels: the image has a leading channel axis)
    let mut arrays = vec![(crate::format::IMAGE_ARRAY, m.image_dtype, Some(m.channels))];
    if let Some(l) = m.label_dtype {
        arrays.push((crate::format::LABEL_ARRAY, l, None));
        if m.skeleton {
            arrays.push((crate::format::SKELETON_ARRAY, l, None));
        }
        if m.norm_mask {
            arrays.push((crate::format::NORM_MASK_ARRAY, Dtype::Uint8, None));
        }
    }
    if let Some(c) = m.distance_channels.filter(|&c| c > 0) {
        arrays.push((crate::format::DISTANCE_ARRAY, Dtype::Float32, Some(c)));
    }
    let entry = EntryCheck {
        root,
        meta: m,
        store: &store,
        sums: &sums,
        sums_rel: &sums_rel,
    };
    for (name, dtype, channels) in arrays {
        entry.verify_array(name, dtype, channels, &mut acc);
    }
    // Foreground rows are checked against the label only when the label itself verified.
    let label_ok = acc
        .problems
        .iter()
        .all(|p| p.array.as_deref() != Some(crate::format::LABEL_ARRAY));
    if m.fg_rows > 0 {
        entry.verify_fg(label_ok, &mut acc);
    }
    acc.done()
}

/// The entry's recorded checksums, their block shape checked against its layout; `None`
/// (the problem recorded) when they cannot be used.
fn entry_checksums(root: &Path, m: &EntryMeta, acc: &mut Acc) -> Option<ChunkChecksums> {
    // The checksums are in the group's attributes, read again here rather than kept in every
    // entry's `EntryMeta` (a report holds all entries' at once).
    let sums_path = m.dir.join(ZARR_JSON);
    let sums_rel = rel_path(root, &sums_path);
    let sums = std::fs::read(&sums_path)
        .map_err(|e| format!("cannot read: {e}"))
        .and_then(|b| {
            EntryAttrs::from_group_json(&sums_path, &b)
                .map(|a| a.chunk_checksums)
                .map_err(|e| super::file_message(root, &sums_path, &e.to_string()))
        });
    let sums = match sums {
        Ok(v) => v,
        Err(msg) => {
            acc.other(Problem::error("metadata", msg).path(sums_rel));
            return None;
        }
    };
    let block_shape = m.shard_zyx.unwrap_or(m.chunk_zyx);
    if sums.block_shape_zyx != block_shape {
        acc.other(
            Problem::error(
                "metadata",
                format!(
                    "block_shape_zyx is {:?}, but the entry's layout writes blocks of {:?}",
                    sums.block_shape_zyx, block_shape
                ),
            )
            .path(sums_rel),
        );
        return None;
    }
    Some(sums)
}

/// One entry being verified: its metadata, its store and its recorded checksums.
struct EntryCheck<'a> {
    root: &'a Path,
    meta: &'a EntryMeta,
    store: &'a Arc<ReadStore>,
    sums: &'a ChunkChecksums,
    sums_rel: &'a str,
}

impl EntryCheck<'_> {
    /// Every block of array `name` against its recorded hash, after its metadata (type,
    /// shape, chunk grid) against the entry's.
    fn verify_array(
        &self,
        name: &'static str,
        dtype: Dtype,
        channels: Option<usize>,
        acc: &mut Acc,
    ) {
        let (root, m) = (self.root, self.meta);
        let block_shape = m.shard_zyx.unwrap_or(m.chunk_zyx);
        let meta_path = m.dir.join(name).join(ZARR_JSON);
        let meta_rel = rel_path(root, &meta_path);
        let layout = std::fs::read(&meta_path)
            .map_err(|e| format!("cannot read: {e}"))
            .and_then(|b| {
                ArrayLayout::from_json(&meta_path, &b)
                    .map_err(|e| super::file_message(root, &meta_path, &e.to_string()))
            });
        match layout {
            Err(msg) => {
                acc.other(Problem::error("metadata", msg).path(meta_rel));
                return;
            }
            Ok(l) if l.dtype != dtype => {
                acc.other(
                    Problem::error(
                        "metadata",
                        format!("data type {} but the entry records {dtype}", l.dtype),
                    )
                    .path(meta_rel),
                );
                return;
            }
            Ok(_) => {}
        }
        let array = match Array::open(self.store.clone(), &format!("/{name}")) {
            Ok(a) => a,
            Err(e) => {
                acc.other(
                    Problem::error("metadata", format!("not a readable Zarr array: {e}"))
                        .path(meta_rel),
                );
                return;
            }
        };
        let lead: Vec<u64> = channels.map(|c| c as u64).into_iter().collect();
        let shape: Vec<u64> = lead
            .iter()
            .copied()
            .chain(m.shape_zyx.iter().map(|&v| v as u64))
            .collect();
        let expected_grid: Vec<u64> = lead
            .iter()
            .copied()
            .chain((0..3).map(|a| (m.shape_zyx[a] as u64).div_ceil(block_shape[a].max(1) as u64)))
            .collect();
        if array.shape() != shape.as_slice() || array.chunk_grid_shape() != expected_grid.as_slice()
        {
            acc.other(
                Problem::error(
                    "metadata",
                    format!(
                        "array shape {:?} with a chunk grid of {:?} does not match the entry ({:?} in blocks of {:?})",
                        array.shape(),
                        array.chunk_grid_shape(),
                        m.shape_zyx,
                        block_shape
                    ),
                )
                .path(meta_rel),
            );
            return;
        }
        let empty = std::collections::BTreeMap::new();
        let recorded = self.sums.of(name).unwrap_or(&empty);
        let block_len = block_shape.iter().product::<usize>() * dtype.size();
        let check = ArrayCheck {
            root,
            meta: m,
            name,
            array: &array,
            dtype,
            recorded,
            zero_hash: ChunkChecksums::hash(&vec![0u8; block_len]),
        };
        let indices = grid_indices(&expected_grid);
        let names: std::collections::HashSet<String> =
            indices.iter().map(|i| block_name(i)).collect();
        for k in recorded.keys() {
            if !names.contains(k) {
                acc.other(
                    Problem::error(
                        "metadata",
                        format!("{CHECKSUMS_AT} records {name} block {k}, outside the array"),
                    )
                    .path(self.sums_rel.to_string()),
                );
            }
        }
        let outcomes: Vec<Outcome> = if block_len <= PARALLEL_BLOCK_BYTES {
            indices.par_iter().map(|i| check.block(i)).collect()
        } else {
            indices.iter().map(|i| check.block(i)).collect()
        };
        for o in outcomes {
            acc.sum.blocks_checked += 1;
            match o {
                Outcome::Ok => acc.sum.blocks_ok += 1,
                Outcome::Absent => acc.sum.blocks_absent += 1,
                Outcome::Corrupt(p) => {
                    acc.sum.corrupt += 1;
                    acc.problems.push(p);
                }
                Outcome::Missing(p) => {
                    acc.sum.missing += 1;
                    acc.problems.push(p);
                }
                Outcome::Other(p) => acc.other(p),
            }
        }
    }

    /// The fg array decodes, holds the rows the entry records, and (when the label verified:
    /// `label_ok`) each row is foreground of its class.
    fn verify_fg(&self, label_ok: bool, acc: &mut Acc) {
        let (root, m) = (self.root, self.meta);
        let fg_rel = || rel_path(root, &m.dir.join(FG_ARRAY));
        let fg = Array::open(self.store.clone(), &format!("/{FG_ARRAY}"))
            .map_err(|e| e.to_string())
            .and_then(|a| {
                let subset = zarrs::array::ArraySubset::new_with_shape(a.shape().to_vec());
                a.retrieve_array_subset::<Vec<u32>>(&subset)
                    .map_err(|e| e.to_string())
            });
        match fg {
            Ok(rows) if rows.len() as u64 == m.fg_rows * 4 => {
                let checked = if label_ok { check_fg_rows(m) } else { Ok(()) };
                if let Err(msg) = checked {
                    acc.other(Problem::error("corrupt-chunk", msg).path(fg_rel()));
                }
            }
            Ok(rows) => acc.other(
                Problem::error(
                    "corrupt-chunk",
                    format!(
                        "holds {} rows, the entry's fg_index says {}",
                        rows.len() / 4,
                        m.fg_rows
                    ),
                )
                .path(fg_rel()),
            ),
            Err(e) => acc.other(
                Problem::error("corrupt-chunk", format!("the fg array does not read: {e}"))
                    .path(fg_rel()),
            ),
        }
    }
}

/// Every index of a chunk grid, in C order.
fn grid_indices(grid: &[u64]) -> Vec<Vec<u64>> {
    let mut out = vec![Vec::new()];
    for &n in grid {
        out = out
            .into_iter()
            .flat_map(|p| {
                (0..n).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    out
}

/// Every foreground row names a voxel of its class: inside the volume, no voxel twice, and
/// the label there holds that class (what the sampler trusts when it centres a patch).
fn check_fg_rows(m: &EntryMeta) -> Result<(), String> {
    let entry = EntryReader::open(&m.dir).map_err(|e| e.to_string())?;
    for class in entry.classes() {
        let coords = entry.fg_coords(class).map_err(|e| e.to_string())?;
        // fg_coords has refused repeated or unordered rows.
        let mut label = [0u16; 1];
        for p in coords {
            let at = [p[0] as i64, p[1] as i64, p[2] as i64];
            entry
                .read_label(at, [1, 1, 1], &mut label)
                .map_err(|e| e.to_string())?;
            if label[0] != class {
                return Err(format!(
                    "class {class}: voxel {p:?} holds label {} in the label array",
                    label[0]
                ));
            }
        }
    }
    Ok(())
}
