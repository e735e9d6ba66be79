//! Models on S3: `predict --model s3://BUCKET/PREFIX`, a run folder (or one checkpoint folder)
//! uploaded as it is (`aws s3 sync runs/x s3://...`), is brought into a local folder first.
//! Only what predicting needs comes: `run.json`, `postprocessing.json` and the one checkpoint
//! folder `--checkpoint` picks (best, else the newest step), each object again only when its
//! ETag changed; the folder is then opened as any local model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::model_dir::Which;
use crate::cache::remote::{url_folder, RemoteOptions};
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
        Which::Best if has(BEST_DIR, MODEL_FILE) => BEST_DIR.to_string(),
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
    let objects: BTreeMap<String, Listed> = client
        .list(&base)?
        .into_iter()
        .filter_map(|o| Some((o.key.strip_prefix(&base)?.to_string(), o)))
        .collect();
    let wanted = needed(url, &objects, which)?;
    let dir = match &opts.local {
        Some(d) => url_folder(d, url),
        None => opts.staging_for(url),
    };
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let etags_path = dir.join(ETAGS_FILE);
    let mut etags: BTreeMap<String, String> = std::fs::read(&etags_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    // Checkpoint folders from an earlier download that this one does not pick: left, they
    // could be taken for the newest.
    remove_unpicked(&dir, &wanted)?;
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
        let got = client.get_to_file(&o.key, &part);
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
    crate::cache::layout::write_atomic(&etags_path, &json)?;
    Ok(report)
}

/// Remove the local checkpoint folders that are not among `wanted`'s.
fn remove_unpicked(dir: &Path, wanted: &[(&String, &Listed)]) -> Result<()> {
    let ck = dir.join(CHECKPOINTS_DIR);
    let Ok(rd) = std::fs::read_dir(&ck) else {
        return Ok(());
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let prefix = format!("{CHECKPOINTS_DIR}/{name}/");
        if !wanted.iter().any(|(rel, _)| rel.starts_with(&prefix)) {
            let p = e.path();
            std::fs::remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
        }
    }
    Ok(())
}
