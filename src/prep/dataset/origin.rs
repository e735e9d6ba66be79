//! Where a dataset's files were at build time, recorded in the manifest so that later stages
//! (fold validation) can find a case's own files again.

use std::path::{Path, PathBuf};

use super::DatasetSource;
use crate::format::manifest::DatasetOrigin;

/// `p` made absolute against the working folder (not resolved: a link stays a link).
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The record of `source`; `None` for cases passed one by one (predict's inputs).
pub fn origin_of(source: &DatasetSource) -> Option<DatasetOrigin> {
    match source {
        DatasetSource::Folder(dir) => Some(DatasetOrigin {
            folder: Some(absolute(dir)),
            images: None,
            labels: None,
            previous_stage: None,
        }),
        DatasetSource::Globs { images, labels } => {
            let abs = |g: &String| absolute(Path::new(g)).to_string_lossy().to_string();
            Some(DatasetOrigin {
                folder: None,
                images: Some(abs(images)),
                labels: labels.as_ref().map(abs),
                previous_stage: None,
            })
        }
        DatasetSource::Cases(_) => None,
    }
}

/// The source a record names again; `None` for a record naming neither a folder nor images.
pub fn source_of(origin: &DatasetOrigin) -> Option<DatasetSource> {
    match (&origin.folder, &origin.images) {
        (Some(dir), _) => Some(DatasetSource::Folder(dir.clone())),
        (None, Some(images)) => Some(DatasetSource::Globs {
            images: images.clone(),
            labels: origin.labels.clone(),
        }),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_folder_is_recorded_absolute_and_read_back() {
        let o = origin_of(&DatasetSource::Folder("data/vessels".into())).unwrap();
        let dir = o.folder.clone().unwrap();
        assert!(dir.is_absolute() && dir.ends_with("data/vessels"));
        assert!(matches!(source_of(&o), Some(DatasetSource::Folder(d)) if d == dir));
        let g = origin_of(&DatasetSource::Globs {
            images: "x/*_img.nii.gz".into(),
            labels: None,
        })
        .unwrap();
        assert!(Path::new(g.images.as_deref().unwrap()).is_absolute());
        assert!(origin_of(&DatasetSource::Cases(Vec::new())).is_none());
    }
}
