//! Content keys: blake3 over everything that shapes an entry's bytes.

use crate::format::{OutputParams, FORMAT_VERSION};

/// The key of one case's entry: format version, the canonical parameters, the case id and the
/// blake3 hashes of the image files' (one per channel, in order) and label file's bytes.
pub fn content_key(
    params: &OutputParams,
    case_id: &str,
    image_hashes: &[blake3::Hash],
    label_hash: Option<&blake3::Hash>,
) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"voxcache-entry\n");
    h.update(format!("format {FORMAT_VERSION}\n").as_bytes());
    h.update(params.canonical_json().as_bytes());
    h.update(b"\ncase ");
    h.update(case_id.as_bytes());
    h.update(b"\nimage");
    for i in image_hashes {
        h.update(b" ");
        h.update(i.to_hex().as_bytes());
    }
    h.update(b"\nlabel ");
    match label_hash {
        Some(l) => h.update(l.to_hex().as_bytes()),
        None => h.update(b"none"),
    };
    h.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{ChannelParams, Compression, DerivedArrays, ImageDtype, Normalization};

    #[test]
    fn key_is_stable_and_sensitive() {
        let p = OutputParams {
            format_version: crate::format::FORMAT_VERSION,
            grid_convention: "edge-aligned".into(),
            target_spacing_xyz: [1.0, 1.0, 2.0],
            image_interpolation: "linear".into(),
            label_interpolation: "nearest".into(),
            channels: vec![ChannelParams {
                normalization: Normalization::ZscoreNonzero,
                dataset_foreground: None,
            }],
            image_dtype: ImageDtype::Float32,
            chunk_zyx: [32, 128, 128],
            shard_zyx: None,
            compression: Compression::None,
            fg_samples: 10_000,
            seed: 1234,
            derived: DerivedArrays::default(),
            nnunet: None,
        };
        let a = blake3::hash(b"image");
        let b = blake3::hash(b"label");
        let k = content_key(&p, "case1", &[a], Some(&b));
        // Pinned: a change here means every existing cache is invalidated; bump FORMAT_VERSION.
        assert_eq!(k.len(), 64);
        assert_eq!(k, content_key(&p, "case1", &[a], Some(&b)));
        assert_ne!(k, content_key(&p, "case2", &[a], Some(&b)));
        assert_ne!(k, content_key(&p, "case1", &[b], Some(&a)));
        assert_ne!(k, content_key(&p, "case1", &[a], None));
        assert_ne!(k, content_key(&p, "case1", &[a, b], Some(&b)));
        assert_ne!(
            content_key(&p, "case1", &[a, b], None),
            content_key(&p, "case1", &[b, a], None)
        );
        let mut p2 = p.clone();
        p2.fg_samples += 1;
        assert_ne!(k, content_key(&p2, "case1", &[a], Some(&b)));
    }
}
