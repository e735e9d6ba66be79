//! A cache on S3: the same layout as a local one (`manifest.json`, `entries/ab/KEY/...`), so
//! zarr-python opens an entry over `s3://` as it opens a local one.
//!
//! Writing, with no rename on object storage: an entry is built in a local staging folder,
//! then its chunk and shard objects are uploaded under its content key, and its group
//! `zarr.json` last: that one object is the commit. A reader (and a re-run) counts an entry as
//! present only when that object exists, so a builder killed mid-upload leaves nothing that
//! looks complete, and the next run uploads the entry again under the same key. The manifest is
//! merged by compare-and-swap: read it with its ETag, merge, write it back `If-Match` that ETag
//! (`If-None-Match: *` when there is none yet); a conflict re-reads and merges again, so
//! concurrent `--part` builders each land their cases.
//!
//! Reading: [`fill_tier`] brings a cache's manifest and its entries' metadata into a local tier
//! (a local cache folder keyed by content, so a file once fetched is never fetched again),
//! which the reader memory-maps as any local cache. Chunk and shard files come on first read
//! (the [`Tier`] is the reader's [`super::store::BlockSource`]) or from a background prefetch,
//! or all before the command reads ([`Fill::Whole`]); a budget bounds the tier's size.
//!
//! [`RemoteCache`] is the [`Backend`] of a build's staging folder: the build code is the same
//! for a local cache and a bucket.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rayon::prelude::*;

mod fill;
mod local_copy;
mod tier;

pub use self::fill::{fill_tier, Fill, TierReport};
pub use self::local_copy::{claim, Holds, LOCAL_COPY_MARK};
pub use self::tier::{Tier, TierStats};

use super::layout::CacheDir;
use super::store::{Backend, Commit};
use crate::error::{Error, Result};
use crate::format::{Manifest, ManifestDataset, ENTRIES_DIR, MANIFEST_FILE, ZARR_JSON};
use crate::remote::s3::{Client, Condition, Listed, Put};
use crate::remote::S3Url;

/// Uploads and downloads in flight at once (they wait on the network, not the CPU).
const TRANSFERS: usize = 8;

/// The largest manifest read from a bucket (one of 100,000 cases is about 60 MiB).
const MANIFEST_MAX: u64 = 256 << 20;
/// The largest `splits_final.json` read from a bucket.
const SPLITS_MAX: u64 = 16 << 20;

/// How a command reaches a cache on S3, from its flags.
#[derive(Clone, Debug, Default)]
pub struct RemoteOptions {
    /// `--s3-endpoint` (else AWS_ENDPOINT_URL and the profile's, else AWS).
    pub endpoint: Option<String>,
    /// Where entries are built before upload (`--staging`), or the local tier that reads are
    /// served from (`--local-cache`); default under `$XDG_CACHE_HOME/voxcache` (or
    /// `~/.cache/voxcache`), per bucket and prefix.
    pub local: Option<PathBuf>,
    /// The local tier's budget in bytes (`--local-cache-gb`); `None`: unbounded.
    pub budget: Option<u64>,
}

impl RemoteOptions {
    /// The local folder for `url`: the one given, else one per bucket and prefix under the
    /// user's cache folder (the system's temporary folder when there is no home).
    pub fn staging_for(&self, url: &S3Url) -> PathBuf {
        if let Some(p) = &self.local {
            return p.clone();
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        url_folder(&base.join("voxcache").join("s3"), url)
    }
}

/// `base/BUCKET/PREFIX...`: the local folder of `url` under `base`.
pub fn url_folder(base: &Path, url: &S3Url) -> PathBuf {
    let mut p = base.join(&url.bucket);
    p.extend(url.prefix.split('/').filter(|s| !s.is_empty()));
    p
}

/// Objects under `entries/` per entry key (each with its path in the entry as its key).
type Listing = BTreeMap<String, Vec<Listed>>;
/// Files of an entry: path in the entry, bytes.
pub(crate) type Files = Vec<(String, u64)>;

/// A cache prefix in a bucket, and a client for it.
pub struct RemoteCache {
    client: Client,
    url: S3Url,
}

impl std::fmt::Debug for RemoteCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteCache({})", self.url)
    }
}

fn pool() -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(TRANSFERS)
        .thread_name(|i| format!("s3-transfer-{i}"))
        .build()
        .map_err(|e| Error::Config(format!("cannot start transfer threads: {e}")))
}

/// The `/`-separated paths of the files under `dir`, sorted.
pub(crate) fn files_under(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))? {
            let e = e.map_err(|e| Error::io(&d, e))?;
            let p = e.path();
            if e.file_type().map_err(|e| Error::io(&p, e))?.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(dir) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

impl RemoteCache {
    /// Connect to the cache at `url` (endpoint from `endpoint`, else the environment) and check
    /// that its bucket exists and answers.
    pub fn connect(url: &S3Url, endpoint: Option<&str>) -> Result<RemoteCache> {
        Ok(RemoteCache {
            client: Client::connect(url, endpoint)?,
            url: url.clone(),
        })
    }

    /// The cache's URL.
    pub fn url(&self) -> &S3Url {
        &self.url
    }

    fn entry_key(&self, key: &str, rel: &str) -> String {
        self.url.key(&format!("{}/{rel}", CacheDir::entry_rel(key)))
    }

    /// Whether the entry of `key` is committed (its group `zarr.json` exists).
    pub fn committed(&self, key: &str) -> Result<bool> {
        Ok(self.client.head(&self.entry_key(key, ZARR_JSON))?.is_some())
    }

    /// Upload the complete local entry at `dir` as `key`: every object but the group's
    /// `zarr.json`, then that one, written only if absent (another builder may have placed
    /// the same content first).
    fn upload_entry(&self, dir: &Path, key: &str) -> Result<Commit> {
        if self.committed(key)? {
            return Ok(Commit::AlreadyThere);
        }
        let files = files_under(dir)?;
        if !files.iter().any(|f| f == ZARR_JSON) {
            return Err(Error::cache(dir, "entry has no group zarr.json to commit"));
        }
        pool()?.install(|| {
            files
                .par_iter()
                .filter(|f| *f != ZARR_JSON)
                .try_for_each(|f| {
                    self.client
                        .upload_file(&self.entry_key(key, f), &dir.join(f))
                })
        })?;
        let root = dir.join(ZARR_JSON);
        let bytes = std::fs::read(&root).map_err(|e| Error::io(&root, e))?;
        match self
            .client
            .put(&self.entry_key(key, ZARR_JSON), &bytes, Condition::Absent)?
        {
            Put::Written(_) => Ok(Commit::Placed),
            Put::Conflict => Ok(Commit::AlreadyThere),
        }
    }

    /// The manifest and its ETag, or `None` when no build has finished here.
    fn manifest_with_etag(&self) -> Result<Option<(Manifest, Option<String>)>> {
        let key = self.url.key(MANIFEST_FILE);
        let Some(obj) = self.client.get(&key, MANIFEST_MAX)? else {
            return Ok(None);
        };
        let m = Manifest::from_json(Path::new(&self.client.url(&key)), &obj.bytes)?;
        Ok(Some((m, obj.etag)))
    }

    /// The manifest, or `None` when no build has finished here.
    pub fn manifest(&self) -> Result<Option<Manifest>> {
        Ok(self.manifest_with_etag()?.map(|(m, _)| m))
    }

    /// Merge one build's cases for `name` into the manifest by compare-and-swap.
    fn merge_manifest(&self, name: &str, dataset: &ManifestDataset) -> Result<Manifest> {
        let key = self.url.key(MANIFEST_FILE);
        for attempt in 0..64u32 {
            let (mut m, etag) = match self.manifest_with_etag()? {
                Some((m, etag)) => (m, etag),
                None => (Manifest::default(), None),
            };
            m.merge(name, dataset.clone());
            let cond = match &etag {
                Some(e) => Condition::Matches(e),
                None => Condition::Absent,
            };
            if let Put::Written(_) = self.client.put(&key, &m.to_json(), cond)? {
                return Ok(m);
            }
            // Another builder wrote in between: wait a little (spread apart), read again.
            let jitter = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| u64::from(d.subsec_nanos() ^ std::process::id()) % 50)
                .unwrap_or(0);
            std::thread::sleep(Duration::from_millis(
                20 * u64::from(attempt.min(10)) + jitter,
            ));
        }
        Err(Error::remote(
            self.client.url(&key),
            "the manifest kept changing under 64 merges in a row; run the build again",
        ))
    }

    /// A small file at the cache's root (`splits_final.json`), or `None`.
    pub fn get_root_file(&self, name: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .client
            .get(&self.url.key(name), SPLITS_MAX)?
            .map(|o| o.bytes))
    }

    /// Every object under `entries/` (its path in the entry as `key`, its size and time),
    /// per entry key; and the URLs of the objects whose key is not `ab/KEY/REL` with `ab` the
    /// key's first two digits, a content key, and a relative path of plain components (a
    /// bucket keeps any key verbatim, `..` and `//` included): those must never name a file.
    fn entry_listing(&self) -> Result<(Listing, Vec<String>)> {
        let base = self.url.key(&format!("{ENTRIES_DIR}/"));
        let mut out: BTreeMap<String, Vec<Listed>> = BTreeMap::new();
        let mut bad = Vec::new();
        for o in self.client.list(&base)? {
            let Some(rest) = o.key.strip_prefix(&base) else {
                continue;
            };
            // ab/KEY/rel...
            let mut parts = rest.splitn(3, '/');
            let ok = match (parts.next(), parts.next(), parts.next()) {
                (Some(shard), Some(key), Some(rel)) => {
                    crate::format::key_is_valid(key)
                        && key.get(..2) == Some(shard)
                        && crate::format::rel_path_is_plain(rel)
                }
                _ => false,
            };
            if !ok {
                bad.push(self.client.url(&o.key));
                continue;
            }
            let (key, rel) = rest[3..].split_once('/').unwrap_or_default();
            out.entry(key.to_string()).or_default().push(Listed {
                key: rel.to_string(),
                ..o
            });
        }
        Ok((out, bad))
    }

    /// Every object under `entries/` (its path in the entry, its size), per entry key. A
    /// listing with a key that could not be an entry's file is refused, naming it, before
    /// anything is written.
    fn entry_objects(&self) -> Result<BTreeMap<String, Vec<(String, u64)>>> {
        let (listing, bad) = self.entry_listing()?;
        if let Some(url) = bad.first() {
            return Err(bad_key(url));
        }
        Ok(listing
            .into_iter()
            .map(|(k, v)| (k, v.into_iter().map(|o| (o.key, o.size)).collect()))
            .collect())
    }

    /// Remove what interrupted uploads left under `entries/` more than `older_than` ago:
    /// the objects of entries never committed (no group `zarr.json`) whose newest object is
    /// that old, and multipart uploads started that long ago and never finished. Younger ones
    /// may be another builder's upload in progress: they are counted, not touched.
    pub fn sweep_orphans(&self, older_than: Duration) -> Result<Orphans> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let old = |t: Option<u64>| t.is_some_and(|t| t + older_than.as_secs() <= now);
        let mut out = Orphans::default();
        let mut doomed = Vec::new();
        // Objects whose keys are not an entry's are not ours: left alone.
        for (key, objs) in self.entry_listing()?.0 {
            if objs.iter().any(|o| o.key == ZARR_JSON) {
                continue;
            }
            // The newest object says when the upload was last alive.
            let newest = objs.iter().map(|o| o.modified).max().flatten();
            if objs.iter().any(|o| o.modified.is_none()) || !old(newest) {
                out.recent += 1;
                continue;
            }
            out.entries += 1;
            out.bytes += objs.iter().map(|o| o.size).sum::<u64>();
            doomed.extend(objs.into_iter().map(|o| self.entry_key(&key, &o.key)));
        }
        out.objects = doomed.len();
        pool()?.install(|| doomed.par_iter().try_for_each(|k| self.client.delete(k)))?;
        let base = self.url.key(&format!("{ENTRIES_DIR}/"));
        for u in self.client.uploads(&base)? {
            if old(u.initiated) {
                self.client.abort_upload(&u)?;
                out.uploads += 1;
            }
        }
        Ok(out)
    }

    /// Download the object at `rel` under `entries/` (`ab/KEY/...`), listed as `size`
    /// bytes, to `path`, streamed; `Ok(false)` when there is none.
    pub fn get_entry_object(&self, rel: &str, path: &Path, size: u64) -> Result<bool> {
        self.client
            .get_to_file(&self.url.key(&format!("{ENTRIES_DIR}/{rel}")), path, size)
    }

    /// Download entry `key` (its objects `rels`, with their listed sizes) into `tier`,
    /// atomically (a temporary folder renamed into place).
    fn fetch_entry(&self, tier: &CacheDir, key: &str, rels: &[(String, u64)]) -> Result<()> {
        let tmp = tier.new_tmp_entry(key)?;
        let got = pool()?.install(|| {
            rels.par_iter().try_for_each(|(rel, size)| {
                let k = self.entry_key(key, rel);
                let path = tmp.join(rel);
                if let Some(p) = path.parent() {
                    std::fs::create_dir_all(p).map_err(|e| Error::io(p, e))?;
                }
                // Streamed to disk: a large shard never sits in memory whole.
                if self.client.get_to_file(&k, &path, *size)? {
                    Ok(())
                } else {
                    Err(Error::remote(
                        self.client.url(&k),
                        "object vanished while the entry was read",
                    ))
                }
            })
        });
        if let Err(e) = got {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        tier.commit(&tmp, key).map(|_| ())
    }
}

/// A bucket as the backend of a build's staging folder: each entry is uploaded at its commit
/// (its group `zarr.json` last) and its local copy removed; the manifest is merged by
/// compare-and-swap.
impl Backend for RemoteCache {
    fn location(&self, _root: &Path) -> String {
        self.url.to_string()
    }

    fn has_entry(&self, _root: &Path, key: &str) -> bool {
        self.committed(key).unwrap_or(false)
    }

    fn commit(&self, _root: &Path, tmp: &Path, key: &str) -> Result<Commit> {
        let done = self.upload_entry(tmp, key);
        std::fs::remove_dir_all(tmp).map_err(|e| Error::io(tmp, e))?;
        done
    }

    fn record(&self, _root: &Path, name: &str, dataset: ManifestDataset) -> Result<Manifest> {
        self.merge_manifest(name, &dataset)
    }

    fn holds_entries(&self) -> bool {
        false
    }

    fn sweep_abandoned(&self) -> Result<Option<String>> {
        let o = self.sweep_orphans(ORPHAN_AGE)?;
        Ok((o.entries + o.uploads > 0).then(|| {
            format!(
                "removed what interrupted uploads left in {} over a day ago: {} uncommitted \
                 entries ({} objects, {}), {} unfinished multipart uploads",
                self.url,
                o.entries,
                o.objects,
                crate::util::sysinfo::human_bytes(o.bytes),
                o.uploads
            )
        }))
    }
}

/// The error for a listed object whose key cannot name a file of an entry.
fn bad_key(url: &str) -> Error {
    Error::remote(
        url,
        "listed under entries/, but its key is not ENTRIES/ab/KEY/PATH with a content key and \
         a relative path of plain components (an empty component, `.` or `..`): refused before \
         anything is written; remove it from the bucket",
    )
}

/// How long an unfinished upload is left alone before [`RemoteCache::sweep_orphans`] removes
/// it: far longer than one entry's upload takes.
pub const ORPHAN_AGE: Duration = Duration::from_secs(24 * 3600);

/// What [`RemoteCache::sweep_orphans`] removed, and left.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Orphans {
    /// Uncommitted entries removed.
    pub entries: usize,
    /// Their objects.
    pub objects: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Unfinished multipart uploads aborted.
    pub uploads: usize,
    /// Uncommitted entries too recent to remove (perhaps being uploaded now).
    pub recent: usize,
}
