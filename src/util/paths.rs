//! Where a command writes against what it reads: an output folder that is, holds or lies inside
//! a model or input folder would overwrite or mix with what the command reads (a results
//! folder's plans.json truncated, a prediction written over its input). Paths are compared
//! canonicalized (links and `..` resolved); an output that does not exist yet is resolved
//! through its nearest existing ancestor.

use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// `path` made absolute and canonical as far as it exists: its nearest existing ancestor
/// canonicalized, the rest appended (with `.` dropped and `..` taken back lexically).
pub fn resolved(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    };
    let mut existing = absolute.as_path();
    let mut rest: Vec<Component> = Vec::new();
    let base = loop {
        if let Ok(c) = existing.canonicalize() {
            break c;
        }
        match (existing.parent(), existing.components().next_back()) {
            (Some(parent), Some(last)) => {
                rest.push(last);
                existing = parent;
            }
            _ => break existing.to_path_buf(),
        }
    };
    let mut out = base;
    for c in rest.into_iter().rev() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// How an output stands to a path the command reads.
fn relation(out: &Path, read: &Path) -> Option<&'static str> {
    if out == read {
        Some("is")
    } else if read.starts_with(out) {
        Some("holds")
    } else if out.starts_with(read) {
        Some("is inside")
    } else {
        None
    }
}

/// Refuse an output folder (`flag`, `out`) that is, holds or is inside one of `read` (each the
/// flag or argument that named it, and the path): the error names both and the fix. Paths the
/// command reads that do not exist are left to the command to report.
pub fn refuse_overlap(flag: &str, out: &Path, read: &[(&str, &Path)]) -> Result<()> {
    let o = resolved(out);
    for (what, path) in read {
        // Remote models (s3://) are not local paths: they come into a cache of their own.
        if path.to_string_lossy().contains("://") || path.symlink_metadata().is_err() {
            continue;
        }
        let r = resolved(path);
        if let Some(how) = relation(&o, &r) {
            return Err(Error::Config(format!(
                "{flag} {}: the output folder {how} {what} {} ({} and {}): it would write over or among what it reads; give an output folder apart from it",
                out.display(),
                path.display(),
                o.display(),
                r.display()
            )));
        }
    }
    Ok(())
}

/// Refuse an output file (`flag`, `out`) that is one of `read`, or a file inside one of those
/// folders that the command reads there: a NIfTI image or `dataset.json`/`plans.json` (a report
/// written beside the inputs is fine).
pub fn refuse_overwrite(flag: &str, out: &Path, read: &[(&str, &Path)]) -> Result<()> {
    let o = resolved(out);
    let name = o
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let read_there = name.ends_with(".nii")
        || name.ends_with(".nii.gz")
        || name == "dataset.json"
        || name == "plans.json";
    for (what, path) in read {
        if path.symlink_metadata().is_err() {
            continue;
        }
        let r = resolved(path);
        let hit = o == r || r.starts_with(&o) || (read_there && o.starts_with(&r));
        if hit {
            return Err(Error::Config(format!(
                "{flag} {}: would write over {what} {} (the command reads it); give another file",
                out.display(),
                path.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_are_found_through_links_dots_and_missing_folders() {
        let root = std::env::temp_dir().join(format!("voxcache-paths-{}", std::process::id()));
        let model = root.join("model");
        std::fs::create_dir_all(model.join("fold_0")).unwrap();
        let link = root.join("link");
        let _ = std::os::unix::fs::symlink(&model, &link);
        let read = [("--model", model.as_path())];
        for (out, refused) in [
            (model.clone(), true),
            (link.clone(), true),
            (root.join("model/./fold_0/../x/y"), true),
            (root.clone(), true),
            (root.join("other/../model"), true),
            (root.join("predictions"), false),
            (root.join("modelx"), false),
        ] {
            let r = refuse_overlap("--out", &out, &read);
            assert_eq!(r.is_err(), refused, "{}: {r:?}", out.display());
            if let Err(e) = r {
                let m = e.to_string();
                assert!(m.contains("--out") && m.contains("--model"), "{m}");
            }
        }
        let file = model.join("plans.json");
        std::fs::write(&file, b"{}").unwrap();
        let read = [("the reference", model.as_path())];
        assert!(refuse_overwrite("--summary", &file, &read).is_err());
        assert!(refuse_overwrite("--summary", &model.join("case.nii.gz"), &read).is_err());
        assert!(refuse_overwrite("--summary", &model.join("summary.json"), &read).is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }
}
