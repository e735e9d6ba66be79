//! The flags of every command that takes a cache on S3: the endpoint, and the local folder
//! that stages uploads (`prep build-cache`) and serves reads (`prep inspect`, `train`).

use std::path::{Path, PathBuf};

use crate::cache::reader::ReaderOptions;
use crate::cache::s3::{fill_tier, Fill, RemoteCache, RemoteOptions, Tier, TierReport};
use crate::cache::store::Blocks;
use crate::error::{Error, Result};
use crate::remote::Location;

/// `--s3-endpoint`, `--local-cache`, `--local-cache-gb`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct S3Flags {
    /// An S3-compatible server for `s3://` caches (default: AWS_ENDPOINT_URL, the profile's
    /// endpoint_url, else AWS itself).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// For an `s3://` cache: the local folder entries are built in before upload, and read
    /// from after download (default: ~/.cache/voxcache/s3/BUCKET/PREFIX).
    #[arg(long, value_name = "DIR")]
    pub local_cache: Option<PathBuf>,
    /// For an `s3://` cache: the most the local folder may hold, in GiB; entries of other
    /// caches are removed (least recently used first) to stay under it, and `train` removes
    /// the chunk files it read least recently when the cache itself is larger. Not with `prep
    /// build-cache`, which reads through no tier.
    #[arg(long, value_name = "GB")]
    pub local_cache_gb: Option<f64>,
}

impl S3Flags {
    /// The flags, checked, for a command on `location`: given with a location that is not on
    /// S3 they do not apply and are refused, naming the flag (so is `--local-cache-gb` where
    /// nothing is read through a tier: `reads` false).
    pub fn options_for(&self, location: &Path, reads: bool) -> Result<RemoteOptions> {
        let typed = [
            ("--s3-endpoint", self.s3_endpoint.is_some()),
            ("--local-cache", self.local_cache.is_some()),
            ("--local-cache-gb", self.local_cache_gb.is_some()),
        ];
        if let Some((flag, _)) = typed.iter().find(|t| t.1) {
            // A malformed s3:// URL is named as such, not taken for a local path.
            if let Location::Local(_) = Location::parse(location)? {
                let path = match location.as_os_str().is_empty() {
                    true => String::new(),
                    false => format!(" ({})", location.display()),
                };
                return Err(Error::Config(format!(
                    "{flag} does not apply to a local path{path}: it is for caches on S3 \
                     (s3://BUCKET/PREFIX)"
                )));
            }
        }
        if !reads && self.local_cache_gb.is_some() {
            return Err(Error::Config(
                "--local-cache-gb does not apply to build-cache: it bounds the local tier that \
                 inspect and train read a cache on S3 through"
                    .into(),
            ));
        }
        self.options()
    }

    /// The flags, checked.
    pub fn options(&self) -> Result<RemoteOptions> {
        let budget = match self.local_cache_gb {
            None => None,
            Some(g) if g.is_finite() && g > 0.0 && g <= 1e6 => {
                Some((g * (1u64 << 30) as f64) as u64)
            }
            Some(g) => {
                return Err(Error::Config(format!(
                    "--local-cache-gb {g}: give a number above 0 (GiB), at most 1000000"
                )))
            }
        };
        if let Some(p) = &self.local_cache {
            Location::local_only(p, "--local-cache")?;
        }
        Ok(RemoteOptions {
            endpoint: self.s3_endpoint.clone(),
            local: self.local_cache.clone(),
            budget,
        })
    }
}

/// clap's parser of a path that must be local (outputs, run and model folders): a URL such
/// as `s3://b/p` is refused instead of becoming a folder named `s3:`.
pub fn local_path(text: &str) -> std::result::Result<PathBuf, String> {
    Location::local_only(Path::new(text), "this path").map_err(|e| e.to_string())
}

/// A cache made readable as a local folder.
pub struct LocalView {
    /// The folder to read.
    pub path: PathBuf,
    /// For `s3://`: the URL, and what was fetched to bring the folder up to date.
    pub fetched: Option<(String, TierReport)>,
    /// Removed when the view is dropped (a fresh download for `--verify`).
    temporary: bool,
    /// The tier, closed with the view (its prefetch stops).
    tier: Option<std::sync::Arc<Tier>>,
}

impl LocalView {
    /// Where the view's readers get a block file the folder lacks: the tier's bucket, for a
    /// cache on S3 whose files come on first read; nowhere for a complete folder.
    pub fn blocks(&self) -> Blocks {
        match &self.tier {
            Some(t) => Blocks::new(t.clone()),
            None => Blocks::default(),
        }
    }

    /// Reader options for this view: the defaults with its block source.
    pub fn reader_options(&self) -> ReaderOptions {
        ReaderOptions {
            blocks: self.blocks(),
            ..ReaderOptions::default()
        }
    }

    /// A line for the command to print about what was fetched (`None` for a local cache).
    pub fn describe(&self) -> Option<String> {
        let (url, r) = self.fetched.as_ref()?;
        let h = crate::util::sysinfo::human_bytes;
        Some(format!(
            "{url}: {} entries fetched ({}), {} already in {}{}{}{}",
            r.fetched,
            h(r.bytes),
            r.reused,
            self.path.display(),
            if r.pending > 0 {
                format!(
                    "; {} chunk files ({}) to come on first read",
                    r.pending,
                    h(r.pending_bytes)
                )
            } else {
                String::new()
            },
            if r.evicted > 0 {
                format!("; {} older entries removed to stay in budget", r.evicted)
            } else {
                String::new()
            },
            if r.uncommitted > 0 {
                format!(
                    "; {} uncommitted entries in the bucket (interrupted uploads, never read; \
                     `prep build-cache` removes them a day on)",
                    r.uncommitted
                )
            } else {
                String::new()
            }
        ))
    }
}

impl Drop for LocalView {
    fn drop(&mut self) {
        if let Some(t) = self.tier.take() {
            t.close();
        }
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The local folder to read the cache at `cache_dir` from: itself, or for `s3://` the local
/// tier, its metadata brought up to date first and its chunk files as `fill` says (they come
/// on first read while the view lives). `fresh`: download every entry again into a temporary
/// folder (removed with the view), so that what is checked is what the bucket holds now.
pub fn local_for_reading(
    cache_dir: &Path,
    opts: &RemoteOptions,
    fresh: bool,
    fill: Fill,
) -> Result<LocalView> {
    match Location::parse(cache_dir)? {
        Location::Local(p) => Ok(LocalView {
            path: p,
            fetched: None,
            temporary: false,
            tier: None,
        }),
        Location::S3(url) => {
            let remote = std::sync::Arc::new(RemoteCache::connect(&url, opts.endpoint.as_deref())?);
            let tier = if fresh {
                let base = opts.staging_for(&url);
                base.with_file_name(format!(
                    "{}.verify.{}",
                    base.file_name()
                        .map(|n| n.to_string_lossy())
                        .unwrap_or_default(),
                    std::process::id()
                ))
            } else {
                opts.staging_for(&url)
            };
            let mut view = LocalView {
                path: tier,
                fetched: None,
                temporary: fresh,
                tier: None,
            };
            // On failure the view is dropped: a fresh download leaves nothing behind.
            let fill = if fresh { Fill::Whole } else { fill };
            let given = opts.local.is_some() || fresh;
            let (report, tier) = fill_tier(&remote, &view.path, given, opts.budget, fill)?;
            view.tier = Some(tier);
            view.fetched = Some((url.to_string(), report));
            Ok(view)
        }
    }
}

/// Each model folder as a local one: an `s3://` one is brought into a local folder first
/// (what a prediction with `which` needs). Also a line per model fetched, to print.
pub fn local_models(
    paths: &[PathBuf],
    opts: &RemoteOptions,
    which: &crate::infer::model_dir::Which,
) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let mut dirs = Vec::with_capacity(paths.len());
    let mut lines = Vec::new();
    for p in paths {
        match Location::parse(p)? {
            Location::Local(p) => dirs.push(p),
            Location::S3(url) => {
                let f = crate::infer::model_fetch::fetch_model(&url, opts, which)?;
                lines.push(format!(
                    "{url}: {} files fetched ({}), {} unchanged in {}",
                    f.fetched,
                    crate::util::sysinfo::human_bytes(f.bytes),
                    f.reused,
                    f.dir.display()
                ));
                dirs.push(f.dir);
            }
        }
    }
    Ok((dirs, lines))
}
