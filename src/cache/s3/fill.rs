//! Filling a local tier from a cache on S3: its manifest, its entries' metadata, and their
//! chunk and shard files now or on first read (the [`Tier`] a reader is then given).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::local_copy::{claim, sweep_parts, Holds};
use super::tier::Tier;
use super::{files_under, Files, RemoteCache};
use crate::cache::layout::{dir_bytes, CacheDir};
use crate::error::{Error, Result};
use crate::format::{
    Manifest, DISTANCE_ARRAY, IMAGE_ARRAY, LABEL_ARRAY, MANIFEST_FILE, NORM_MASK_ARRAY,
    SKELETON_ARRAY, ZARR_JSON,
};

/// What a [`fill_tier`] did.
#[derive(Clone, Debug, Default)]
pub struct TierReport {
    /// Entries brought into the tier now (their metadata; all their files with
    /// [`Fill::Whole`]).
    pub fetched: usize,
    /// Entries the tier already held.
    pub reused: usize,
    /// Bytes fetched.
    pub bytes: u64,
    /// Entries removed to stay within the budget.
    pub evicted: usize,
    /// Chunk and shard files still to come (on first read or by the prefetch).
    pub pending: usize,
    /// Their bytes.
    pub pending_bytes: u64,
    /// Entries in the bucket with objects but no commit (interrupted uploads).
    pub uncommitted: usize,
}

/// How a tier gets an entry's chunk and shard files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// All of them before the command reads (`prep inspect`, which also reads files directly).
    Whole,
    /// On first read (`train` starts at once); `prefetch`: meanwhile all of them, several at
    /// a time, in the background.
    OnRead {
        /// Fetch the rest in the background.
        prefetch: bool,
    },
}

/// Whether an entry's file (its path in the entry) is a chunk or shard of an array the reader
/// fetches on first read; everything else (metadata, the small foreground index) comes first.
fn on_read(rel: &str) -> bool {
    let mut parts = rel.split('/');
    let array = parts.next().unwrap_or_default();
    [
        IMAGE_ARRAY,
        LABEL_ARRAY,
        DISTANCE_ARRAY,
        SKELETON_ARRAY,
        NORM_MASK_ARRAY,
    ]
    .contains(&array)
        && parts.next() == Some("c")
}

/// Bring the cache at `remote` into the local cache folder `tier`: its manifest (always
/// fresh), its `splits_final.json` when there is one, and what the tier lacks of the entries
/// the manifest names, as `fill` says. Readers given the tier as their block source fetch
/// the rest (close it when done). With `budget`, entries the manifest does not name are removed, least
/// recently used first, to make room; a cache larger than the budget is refused, with figures.
/// `tier` must be new, empty or marked as this URL's ([`claim`]; `given`: the
/// user named it).
pub fn fill_tier(
    remote: &Arc<RemoteCache>,
    tier: &Path,
    given: bool,
    budget: Option<u64>,
    fill: Fill,
) -> Result<(TierReport, Arc<Tier>)> {
    let url = remote.url().to_string();
    let manifest = remote.manifest()?.ok_or_else(|| {
        Error::remote(
            &url,
            format!(
                "no cache here: {MANIFEST_FILE} is missing (build one with \
                 `prep build-cache DATA --cache-dir {url}`)"
            ),
        )
    })?;
    claim(tier, &url, Holds::Cache, given)?;
    let local = CacheDir::new(tier);
    local.prepare()?;
    let _ = local.sweep_tmp();
    let f = Filling {
        remote,
        tier,
        url,
        local,
        budget,
        fill,
    };
    let cases: BTreeMap<&String, &String> = manifest
        .datasets
        .values()
        .flat_map(|d| d.cases.iter().map(|(id, c)| (&c.key, id)))
        .collect();
    let wanted: BTreeSet<String> = cases.keys().map(|k| k.to_string()).collect();
    let objects = remote.entry_objects()?;
    let mut report = TierReport {
        uncommitted: objects
            .values()
            .filter(|objs| !objs.iter().any(|(r, _)| r == ZARR_JSON))
            .count(),
        ..TierReport::default()
    };
    let plan = f.plan(&wanted, &cases, &objects)?;
    report.reused = plan.reused;
    let meta: u64 = plan.missing.iter().map(|m| m.2).sum();
    let blocks: u64 = plan.pending.iter().map(|p| p.1).sum();
    // The chunk and shard files of the entries in use the tier holds now: with a budget and
    // files fetched on read, what may go (oldest first) when others come.
    let held_blocks = if budget.is_some() {
        local_blocks(&f.local, &wanted)
    } else {
        Vec::new()
    };
    if let Some(budget) = budget {
        report.evicted = f.make_room(&wanted, budget, meta, blocks, &held_blocks)?;
    }
    f.fetch_metadata(plan.missing, &wanted, &manifest, &mut report)?;
    let filled = f.open_tier(held_blocks, plan.listed);
    f.start(&filled, plan.pending, blocks, &mut report)?;
    Ok((report, filled))
}

/// What one [`fill_tier`] works with: the remote cache, the local tier, and how to fill it.
struct Filling<'a> {
    remote: &'a Arc<RemoteCache>,
    tier: &'a Path,
    url: String,
    local: CacheDir,
    budget: Option<u64>,
    fill: Fill,
}

/// What the tier lacks of the entries in use, and what it may fetch on read.
struct Plan<'a> {
    /// Per entry the tier lacks: its metadata files, and their bytes.
    missing: Vec<(&'a String, Files, u64)>,
    /// Over all entries: the chunk and shard files to come.
    pending: Vec<(PathBuf, u64)>,
    /// Every chunk and shard file the tier may fetch, with its listed size: nothing else is
    /// fetched, and nothing past that size is written.
    listed: HashMap<PathBuf, u64>,
    /// Entries the tier already holds.
    reused: usize,
}

impl Filling<'_> {
    /// What the tier lacks of the entries `wanted` (their `objects` in the bucket, `cases`
    /// naming them); an entry that is not complete in the bucket is refused.
    fn plan<'w>(
        &self,
        wanted: &'w BTreeSet<String>,
        cases: &BTreeMap<&String, &String>,
        objects: &BTreeMap<String, Files>,
    ) -> Result<Plan<'w>> {
        let mut plan = Plan {
            missing: Vec::new(),
            pending: Vec::new(),
            listed: HashMap::new(),
            reused: 0,
        };
        for k in wanted {
            let objs = objects.get(k).map(Vec::as_slice).unwrap_or(&[]);
            let present = self.local.has_entry(k);
            let dir = self.local.entry_path(k);
            plan.listed.extend(
                objs.iter()
                    .filter(|(r, _)| on_read(r))
                    .map(|(r, n)| (dir.join(r), *n)),
            );
            let todo: Vec<&(String, u64)> = objs
                .iter()
                .filter(|(r, _)| !present || (on_read(r) && !dir.join(r).exists()))
                .collect();
            let committed = objs.iter().any(|(r, _)| r == ZARR_JSON);
            if (!present || !todo.is_empty()) && !committed {
                return Err(Error::remote(
                    &self.url,
                    format!(
                        "case {}: its entry {} is in the manifest but not complete in the bucket \
                         (no {ZARR_JSON}); build the cache again to restore it",
                        cases.get(k).map(|s| s.as_str()).unwrap_or_default(),
                        CacheDir::entry_rel(k)
                    ),
                ));
            }
            let (later, now): (Vec<_>, Vec<_>) = todo.into_iter().partition(|(r, _)| on_read(r));
            plan.pending
                .extend(later.iter().map(|(r, n)| (dir.join(r), *n)));
            if present {
                plan.reused += 1;
            } else {
                let bytes = now.iter().map(|(_, n)| n).sum();
                plan.missing
                    .push((k, now.into_iter().cloned().collect(), bytes));
            }
        }
        Ok(plan)
    }

    /// Within `budget`: refuse a cache that cannot fit (its `meta`data and chunk and shard
    /// files to come, `blocks`, beside the entries in use), then evict entries not `wanted`
    /// to make room. Tells how many went.
    fn make_room(
        &self,
        wanted: &BTreeSet<String>,
        budget: u64,
        meta: u64,
        blocks: u64,
        held_blocks: &[(PathBuf, u64, std::time::SystemTime)],
    ) -> Result<usize> {
        let local = &self.local;
        let held: u64 = wanted
            .iter()
            .filter(|k| local.has_entry(k))
            .map(|k| dir_bytes(&local.entry_path(k)))
            .sum();
        // What must fit at once: every file when the tier is filled whole, else the metadata.
        let floor = match self.fill {
            Fill::Whole => meta + blocks + held,
            Fill::OnRead { .. } => meta + held - held_blocks.iter().map(|b| b.1).sum::<u64>(),
        };
        let h = crate::util::sysinfo::human_bytes;
        if floor > budget {
            return Err(Error::remote(
                &self.url,
                format!(
                    "the cache's {} take {} and the local tier's budget is {}: raise \
                     --local-cache-gb",
                    if self.fill == Fill::Whole {
                        "entries"
                    } else {
                        "metadata"
                    },
                    h(floor),
                    h(budget)
                ),
            ));
        }
        // Entries no cache in use names go first.
        evict(local, wanted, budget.saturating_sub(meta + blocks + held))
    }

    /// Fetch the metadata of the entries the tier lacks (`missing`), mark those `wanted` as
    /// used, and write the manifest and the splits beside them.
    fn fetch_metadata(
        &self,
        missing: Vec<(&String, Files, u64)>,
        wanted: &BTreeSet<String>,
        manifest: &Manifest,
        report: &mut TierReport,
    ) -> Result<()> {
        let local = &self.local;
        for (k, rels, bytes) in missing {
            self.remote.fetch_entry(local, k, &rels)?;
            report.fetched += 1;
            report.bytes += bytes;
        }
        // Mark what this run uses, for the least-recently-used order of later evictions.
        for k in wanted {
            let _ = std::fs::File::open(local.entry_path(k).join(ZARR_JSON))
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        }
        if let Some(bytes) = self.remote.get_root_file(crate::format::SPLITS_FILE)? {
            crate::util::files::write_atomic(&self.tier.join(crate::format::SPLITS_FILE), &bytes)?;
        }
        local.write_manifest(&manifest.to_json())?;
        sweep_parts(&local.entries_dir());
        Ok(())
    }

    /// The tier readers fetch from: with a budget and files fetched on read, it may evict the
    /// chunk and shard files it held (`held_blocks`, oldest first) for others.
    fn open_tier(
        &self,
        mut held_blocks: Vec<(PathBuf, u64, std::time::SystemTime)>,
        listed: HashMap<PathBuf, u64>,
    ) -> Arc<Tier> {
        let (tier, remote) = (self.tier, self.remote.clone());
        match (self.fill, self.budget) {
            (Fill::OnRead { .. }, Some(_)) => {
                held_blocks.sort_by_key(|b| b.2);
                let evictable = held_blocks.into_iter().map(|(p, n, _)| (p, n)).collect();
                let held = dir_bytes(&self.local.entries_dir());
                Tier::open(tier, remote, self.budget, held, evictable, listed)
            }
            // Filled whole, the budget was checked above.
            _ => Tier::open(tier, remote, None, 0, Vec::new(), listed),
        }
    }

    /// Fetch the chunk and shard `files` (`bytes` in all) now when filling whole, else leave
    /// them to first reads (and the prefetch, when asked for); closes the tier on an error.
    fn start(
        &self,
        filled: &Arc<Tier>,
        files: Vec<(PathBuf, u64)>,
        bytes: u64,
        report: &mut TierReport,
    ) -> Result<()> {
        match self.fill {
            Fill::Whole => {
                if let Err(e) = filled.prefetch(files, true) {
                    filled.close();
                    return Err(e);
                }
                report.bytes += bytes;
            }
            Fill::OnRead { prefetch } => {
                report.pending = files.len();
                report.pending_bytes = bytes;
                if prefetch {
                    if let Err(e) = filled.prefetch(files, false) {
                        filled.close();
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The chunk and shard files of the tier's entries in `keys`: path, bytes, last change.
fn local_blocks(
    local: &CacheDir,
    keys: &BTreeSet<String>,
) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    for k in keys {
        let dir = local.entry_path(k);
        for rel in files_under(&dir).unwrap_or_default() {
            if !on_read(&rel) || rel.contains(".part-") {
                continue;
            }
            let p = dir.join(&rel);
            if let Ok(m) = std::fs::metadata(&p) {
                let t = m.modified().unwrap_or(std::time::UNIX_EPOCH);
                out.push((p, m.len(), t));
            }
        }
    }
    out
}

/// Remove tier entries not in `keep`, oldest use first, until the others take at most `room`.
fn evict(tier: &CacheDir, keep: &BTreeSet<String>, room: u64) -> Result<usize> {
    let mut others: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
    let Ok(rd) = std::fs::read_dir(tier.entries_dir()) else {
        return Ok(0);
    };
    for shard in rd.flatten() {
        for e in std::fs::read_dir(shard.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let key = e.file_name().to_string_lossy().to_string();
            if keep.contains(&key) {
                continue;
            }
            let p = e.path();
            let used = std::fs::metadata(p.join(ZARR_JSON))
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            others.push((used, dir_bytes(&p), p));
        }
    }
    others.sort();
    let mut total: u64 = others.iter().map(|o| o.1).sum();
    let mut n = 0;
    for (_, bytes, p) in others {
        if total <= room {
            break;
        }
        std::fs::remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
        total -= bytes;
        n += 1;
    }
    Ok(n)
}
