//! Models on S3: `predict --model s3://BUCKET/PREFIX`, a run folder (or one checkpoint folder)
//! uploaded as it is (`aws s3 sync runs/x s3://...`), is brought into a local folder first.
//! Only what predicting needs comes: `run.json`, `postprocessing.json` and the one checkpoint
//! folder `--checkpoint` picks (best, else the newest step), each object again only when its
//! ETag changed; the folder is then opened as any local model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::model_dir::Which;
use crate::cache::s3::{url_folder, RemoteOptions};
use crate::error::{Error, Result};
use crate::format::crossval::POSTPROCESSING_FILE;
use crate::format::run::RUN_FILE;
use crate::model::checkpoint::{
    BEST_DIR, CHECKPOINTS_DIR, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, STEP_PREFIX,
};
use crate::remote::s3::{Client, Listed};
use crate::remote::S3Url;

/// Beside the downloaded files: each one's ETag, to know when it changed in the bucket.
const ETAGS_FILE: &str = ".voxcache-etags.json";

/// A model brought from S3.
#[derive(Clone, Debug)]
pub struct FetchedModel {
    /// The local folder to open.
    pub dir: PathBuf,
    /// Objects downloaded now.
    pub fetched: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Objects the folder already held unchanged.
    pub reused: usize,
}

/// The objects of the run folder (`rel` -> listing) a prediction with `which` needs.
fn needed<'a>(
    url: &S3Url,
    objects: &'a BTreeMap<String, Listed>,
    which: &Which,
) -> Result<Vec<(&'a String, &'a Listed)>> {
    if !objects.contains_key(RUN_FILE) {
        return Err(Error::remote(
            url.to_string(),
            format!(
                "no {RUN_FILE} here: not a run folder made by train (or a checkpoint folder \
                 copied from one), uploaded as it is"
            ),
        ));
    }
    let root = [
        RUN_FILE,
        POSTPROCESSING_FILE,
        MODEL_FILE,
        OPTIMIZER_FILE,
        STATE_FILE,
    ];
    let mut out: Vec<_> = objects
        .iter()
        .filter(|(rel, _)| root.contains(&rel.as_str()))
        .collect();
    if objects.contains_key(MODEL_FILE) {
        // A checkpoint folder on its own.
        return Ok(out);
    }
    let folder = |name: &str| format!("{CHECKPOINTS_DIR}/{name}/");
    let has = |name: &str, file: &str| objects.contains_key(&format!("{}{file}", folder(name)));
    let chosen = match which {
        Which::Path(p) => {
            return Err(Error::Config(format!(
                "--checkpoint {}: a checkpoint folder path applies to local models; for {url} \
                 give best or latest, or give the checkpoint folder's own URL as --model",
                p.display()
            )))
        }
        // A best checkpoint with any file is the one: one that lost its weights is reported,
        // never silently replaced by the newest step.
        Which::Best if objects.keys().any(|k| k.starts_with(&folder(BEST_DIR))) => {
            BEST_DIR.to_string()
        }
        Which::Best | Which::Latest => objects
            .keys()
            .filter_map(|rel| {
                let name = rel.strip_prefix(CHECKPOINTS_DIR)?.strip_prefix('/')?;
                let (name, file) = name.split_once('/')?;
                let step: u64 = name.strip_prefix(STEP_PREFIX)?.parse().ok()?;
                (file == STATE_FILE).then(|| (step, name.to_string()))
            })
            .max()
            .map(|(_, name)| name)
            .ok_or_else(|| {
                Error::remote(
                    url.to_string(),
                    format!("the run has no checkpoint under {CHECKPOINTS_DIR}/ to predict with"),
                )
            })?,
    };
    let prefix = folder(&chosen);
    if !has(&chosen, MODEL_FILE) {
        return Err(Error::remote(
            url.join(&format!("{prefix}{MODEL_FILE}")).to_string(),
            format!(
                "the checkpoint {chosen} has no {MODEL_FILE} in the bucket (removed, or not \
                 uploaded yet): nothing to predict with"
            ),
        ));
    }
    out.extend(objects.iter().filter(|(rel, _)| {
        rel.strip_prefix(&prefix)
            .is_some_and(|f| [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, RUN_FILE].contains(&f))
    }));
    Ok(out)
}

/// Bring the model at `url` into its local folder (under `opts.local`, else the user's cache
/// folder, per bucket and prefix).
pub fn fetch_model(url: &S3Url, opts: &RemoteOptions, which: &Which) -> Result<FetchedModel> {
    let client = Client::connect(url, opts.endpoint.as_deref())?;
    let base = url.key("");
    let base = if base.is_empty() || base.ends_with('/') {
        base
    } else {
        format!("{base}/")
    };
    let mut objects: BTreeMap<String, Listed> = BTreeMap::new();
    for o in client.list(&base)? {
        let Some(rel) = o.key.strip_prefix(&base) else {
            continue;
        };
        // Only what predicting needs is ever written; a key that is not a plain relative
        // path is refused all the same, before anything is written.
        if !crate::format::rel_path_is_plain(rel) {
            return Err(Error::remote(
                client.url(&o.key),
                "listed in the model folder, but its key is not a relative path of plain \
                 components (an empty component, `.` or `..`): refused before anything is \
                 written; remove it from the bucket",
            ));
        }
        objects.insert(rel.to_string(), o);
    }
    let wanted = needed(url, &objects, which)?;
    let dir = match &opts.local {
        Some(d) => url_folder(d, url),
        None => opts.staging_for(url),
    };
    crate::cache::s3::claim(
        &dir,
        &url.to_string(),
        crate::cache::s3::Holds::Model,
        opts.local.is_some(),
    )?;
    let etags_path = dir.join(ETAGS_FILE);
    let mut etags: BTreeMap<String, String> = crate::util::files::read_capped(&etags_path, 1 << 20)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    // Files from an earlier download that this one does not take (another checkpoint, or
    // one removed from the bucket since): left, they could be taken for the model's own.
    remove_unwanted(&dir, &wanted)?;
    let mut report = FetchedModel {
        dir: dir.clone(),
        fetched: 0,
        bytes: 0,
        reused: 0,
    };
    for (rel, o) in wanted {
        let path = dir.join(rel);
        let same = o.etag.is_some()
            && etags.get(rel) == o.etag.as_ref()
            && std::fs::metadata(&path).is_ok_and(|m| m.len() == o.size);
        if same {
            report.reused += 1;
            continue;
        }
        if let Some(p) = path.parent() {
            std::fs::create_dir_all(p).map_err(|e| Error::io(p, e))?;
        }
        // Streamed beside its place and renamed into it: a reader sees a whole file or none.
        let part = path.with_file_name(format!(
            ".{}.part-{}",
            path.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default(),
            std::process::id()
        ));
        let got = client.get_to_file(&o.key, &part, o.size);
        if !matches!(got, Ok(true)) {
            let _ = std::fs::remove_file(&part);
            got?;
            return Err(Error::remote(
                client.url(&o.key),
                "object vanished while the model was read",
            ));
        }
        std::fs::rename(&part, &path).map_err(|e| Error::io(&path, e))?;
        match &o.etag {
            Some(e) => etags.insert(rel.clone(), e.clone()),
            None => etags.remove(rel),
        };
        report.fetched += 1;
        report.bytes += o.size;
    }
    let json = serde_json::to_vec_pretty(&etags).map_err(|e| Error::Config(e.to_string()))?;
    crate::util::files::write_atomic(&etags_path, &json)?;
    Ok(report)
}

/// Remove every file of the local folder that is not among `wanted` (but the folder's own
/// records), and the folders left empty.
fn remove_unwanted(dir: &Path, wanted: &[(&String, &Listed)]) -> Result<()> {
    let keep: std::collections::BTreeSet<&str> = wanted.iter().map(|(r, _)| r.as_str()).collect();
    let mut stack = vec![dir.to_path_buf()];
    let mut folders = Vec::new();
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(rel) = p.strip_prefix(dir) else {
                continue;
            };
            let rel = rel.to_string_lossy().replace('\\', "/");
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                stack.push(p.clone());
                folders.push(p);
            } else if !keep.contains(rel.as_str())
                && rel != ETAGS_FILE
                && rel != crate::cache::s3::LOCAL_COPY_MARK
            {
                std::fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
            }
        }
    }
    // Deepest first; a folder still holding a wanted file stays.
    folders.sort_by_key(|f| std::cmp::Reverse(f.components().count()));
    for f in folders {
        let _ = std::fs::remove_dir(&f);
    }
    Ok(())
}
