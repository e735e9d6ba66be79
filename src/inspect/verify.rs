//! `--verify`: decode every write block of an entry (a chunk, or a shard when sharded) and compare
//! its blake3 with the one recorded in `voxcache_chunks.json` at build time. A block whose file is
//! absent is fine only when its recorded hash is that of an all-fill-value (zero) block: Zarr
//! does not write such blocks.

use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;
use serde::Serialize;
use serde_json::Value;
use zarrs::array::Array;
use zarrs::filesystem::FilesystemStore;

use super::entry_meta::{dtype_bytes, read_json, EntryMeta};
use super::{rel_path, Problem};
use crate::cache::writer::CHECKSUMS_FILE;

/// Counts over the blocks checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VerifySummary {
    pub entries: usize,
    pub blocks_checked: u64,
    pub blocks_ok: u64,
    /// Absent files whose recorded content is all fill value (legitimately not written).
    pub blocks_absent: u64,
    pub corrupt: u64,
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

fn short_hash(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex()[..32].to_string()
}

/// Decode one block into the little-endian bytes the build hashed.
fn block_bytes(
    array: &Array<FilesystemStore>,
    dtype: &str,
    idx: &[u64],
) -> Result<Vec<u8>, String> {
    let e = |e: zarrs::array::ArrayError| e.to_string();
    Ok(match dtype {
        "float32" => array
            .retrieve_chunk::<Vec<f32>>(idx)
            .map_err(e)?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        "float16" => array
            .retrieve_chunk::<Vec<half::f16>>(idx)
            .map_err(e)?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        "uint8" => array.retrieve_chunk::<Vec<u8>>(idx).map_err(e)?,
        "uint16" => array
            .retrieve_chunk::<Vec<u16>>(idx)
            .map_err(e)?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        other => return Err(format!("data type {other} is not one voxcache writes")),
    })
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
    array: &'a Array<FilesystemStore>,
    dtype: &'a str,
    recorded: &'a serde_json::Map<String, Value>,
    zero_hash: String,
}

impl ArrayCheck<'_> {
    fn block(&self, idx: [u64; 3]) -> Outcome {
        let name = format!("{}.{}.{}", idx[0], idx[1], idx[2]);
        let key = self.array.chunk_key(&idx);
        let path = self.meta.dir.join(key.as_str());
        let rel = rel_path(self.root, &path);
        let problem = |kind: &'static str, msg: String| {
            Problem::error(kind, msg)
                .case(&self.meta.case_id)
                .path(rel.clone())
                .block(self.name, name.clone())
        };
        let Some(want) = self.recorded.get(&name).and_then(Value::as_str) else {
            return Outcome::Other(problem(
                "unrecorded-chunk",
                format!("no checksum recorded for this block in {CHECKSUMS_FILE}"),
            ));
        };
        if !path.is_file() {
            return if want == self.zero_hash {
                Outcome::Absent
            } else {
                Outcome::Missing(problem(
                    "missing-chunk",
                    "the chunk file is missing, and the block it held was not all fill value"
                        .into(),
                ))
            };
        }
        match block_bytes(self.array, self.dtype, &idx) {
            Err(e) => Outcome::Corrupt(problem("corrupt-chunk", format!("does not decode: {e}"))),
            Ok(bytes) => {
                let got = short_hash(&bytes);
                if got == want {
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

fn usize3(v: Option<&Value>) -> Option<[usize; 3]> {
    let a = v?.as_array()?;
    (a.len() == 3).then_some(())?;
    let n = |i: usize| a[i].as_u64().map(|x| x as usize);
    Some([n(0)?, n(1)?, n(2)?])
}

/// Verify one entry: every block of its image and label, and that its fg array decodes.
pub fn verify_entry(root: &Path, m: &EntryMeta) -> (VerifySummary, Vec<Problem>) {
    let mut acc = Acc {
        sum: VerifySummary::default(),
        problems: Vec::new(),
        case: &m.case_id,
    };
    let sums_path = m.dir.join(m.checksums.as_deref().unwrap_or(CHECKSUMS_FILE));
    let sums = match read_json(root, &sums_path) {
        Ok(v) => v,
        Err(p) => {
            acc.other(*p);
            return acc.done();
        }
    };
    let block_shape = m.shard_zyx.unwrap_or(m.chunk_zyx);
    if usize3(sums.get("block_shape_zyx")) != Some(block_shape) {
        acc.other(
            Problem::error(
                "metadata",
                format!(
                    "block_shape_zyx is {}, but the entry's layout writes blocks of {:?}",
                    sums.get("block_shape_zyx").cloned().unwrap_or(Value::Null),
                    block_shape
                ),
            )
            .path(rel_path(root, &sums_path)),
        );
        return acc.done();
    }
    let store = match FilesystemStore::new(&m.dir) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            acc.other(
                Problem::error("metadata", format!("cannot open the entry: {e}"))
                    .path(m.rel.clone()),
            );
            return acc.done();
        }
    };

    let mut arrays = vec![("image", m.image_dtype.as_str())];
    if let Some(l) = &m.label_dtype {
        arrays.push(("label", l.as_str()));
    }
    for (name, dtype) in arrays {
        let meta_path = m.dir.join(name).join("zarr.json");
        let meta_rel = rel_path(root, &meta_path);
        if let Err(p) = read_json(root, &meta_path) {
            acc.other(*p);
            continue;
        }
        let array = match Array::open(store.clone(), &format!("/{name}")) {
            Ok(a) => a,
            Err(e) => {
                acc.other(
                    Problem::error("metadata", format!("not a readable Zarr array: {e}"))
                        .path(meta_rel),
                );
                continue;
            }
        };
        let shape: Vec<u64> = m.shape_zyx.iter().map(|&v| v as u64).collect();
        let expected_grid: Vec<u64> = (0..3)
            .map(|a| shape[a].div_ceil(block_shape[a].max(1) as u64))
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
            continue;
        }
        let Some(bpe) = dtype_bytes(dtype) else {
            acc.other(
                Problem::error("metadata", format!("unknown data type {dtype}")).path(meta_rel),
            );
            continue;
        };
        let empty = serde_json::Map::new();
        let recorded = sums.get(name).and_then(Value::as_object).unwrap_or(&empty);
        let block_len = block_shape.iter().product::<usize>() * bpe;
        let check = ArrayCheck {
            root,
            meta: m,
            name,
            array: &array,
            dtype,
            recorded,
            zero_hash: short_hash(&vec![0u8; block_len]),
        };
        let g = &expected_grid;
        let indices: Vec<[u64; 3]> = (0..g[0])
            .flat_map(|z| (0..g[1]).flat_map(move |y| (0..g[2]).map(move |x| [z, y, x])))
            .collect();
        let names: std::collections::HashSet<String> = indices
            .iter()
            .map(|i| format!("{}.{}.{}", i[0], i[1], i[2]))
            .collect();
        for k in recorded.keys() {
            if !names.contains(k) {
                acc.other(
                    Problem::error(
                        "metadata",
                        format!("{CHECKSUMS_FILE} records {name} block {k}, outside the array"),
                    )
                    .path(rel_path(root, &sums_path)),
                );
            }
        }
        let outcomes: Vec<Outcome> = if block_len <= PARALLEL_BLOCK_BYTES {
            indices.par_iter().map(|&i| check.block(i)).collect()
        } else {
            indices.iter().map(|&i| check.block(i)).collect()
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

    if m.fg_rows > 0 {
        let fg = Array::open(store.clone(), "/fg")
            .map_err(|e| e.to_string())
            .and_then(|a| {
                let subset = zarrs::array::ArraySubset::new_with_shape(a.shape().to_vec());
                a.retrieve_array_subset::<Vec<u32>>(&subset)
                    .map_err(|e| e.to_string())
            });
        match fg {
            Ok(rows) if rows.len() as u64 == m.fg_rows * 4 => {}
            Ok(rows) => acc.other(
                Problem::error(
                    "corrupt-chunk",
                    format!(
                        "holds {} rows, the entry's fg_index says {}",
                        rows.len() / 4,
                        m.fg_rows
                    ),
                )
                .path(rel_path(root, &m.dir.join("fg"))),
            ),
            Err(e) => acc.other(
                Problem::error("corrupt-chunk", format!("the fg array does not read: {e}"))
                    .path(rel_path(root, &m.dir.join("fg"))),
            ),
        }
    }
    acc.done()
}
