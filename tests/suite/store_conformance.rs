//! One conformance suite for the cache's storage seam (src/cache/store.rs): every backend a
//! cache can live in passes the same checks, through the code the commands use
//! (`prep build-cache` to write; `local_for_reading` and the reader it configures to read).
//!
//! - here: the cache folder itself (always runs);
//! - tests/suite/s3/conformance.rs: a bucket, built through a staging folder and read through
//!   a local tier that fetches chunk files on first read (needs the S3 server, as every S3
//!   test).
//!
//! What a backend promises: an entry is there once committed and never before; committing a
//! key again keeps the first content; builders recording into the manifest at once each land
//! their cases, and other parameters replace a dataset; what a reader reads is, bit for bit,
//! what a local build of the same data holds; a block the reader's folder lacks comes from the
//! store when the store holds it, and is refused as missing when it does not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use voxcache::cache::manifest::ManifestDataset;
use voxcache::cache::reader::CacheReader;
use voxcache::cache::s3::{Fill, RemoteOptions};
use voxcache::cache::store::Commit;
use voxcache::config::location::{local_for_reading, LocalView};

use voxcache::cache::reader::EntryReader;

use crate::common::fixtures::{bundled_cache, bundled_data, files_under, s, text};

/// A backend under test.
pub(crate) struct Store {
    /// `--cache-dir` as a user gives it: a folder, or `s3://BUCKET/PREFIX`.
    pub location: String,
    /// How builds reach it (for a bucket: the endpoint and the staging folder).
    pub build: RemoteOptions,
    /// How reads reach it (for a bucket: the endpoint and the local tier).
    pub read: RemoteOptions,
    /// Environment for the binaries (a bucket's endpoint).
    pub env: Vec<(String, String)>,
    /// Remove a committed entry's file from the store itself: `rel` is its path under the
    /// cache root (`entries/ab/KEY/image/c/0/0/0/0`).
    pub remove_stored: Box<dyn Fn(&str)>,
}

impl Store {
    /// The folder itself at `root`.
    pub(crate) fn folder(root: &Path) -> Store {
        let r = root.to_path_buf();
        Store {
            location: s(root).to_string(),
            build: RemoteOptions::default(),
            read: RemoteOptions::default(),
            env: Vec::new(),
            remove_stored: Box::new(move |rel| std::fs::remove_file(r.join(rel)).unwrap()),
        }
    }

    /// `prep build-cache` of the bundled data into the store; what it printed.
    fn build_bundled(&self) -> String {
        let data = bundled_data();
        let mut args = vec!["build-cache", s(&data), "--cache-dir", &self.location, "-q"];
        let stage;
        if let Some(p) = &self.build.local {
            stage = p.clone();
            args.extend(["--local-cache", s(&stage)]);
        }
        let o = Command::new(env!("CARGO_BIN_EXE_prep"))
            .args(&args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}: {}", self.location, text(&o));
        text(&o)
    }

    /// The store made readable, chunk files on first read (as `train` reads it).
    fn view(&self) -> LocalView {
        let fill = Fill::OnRead { prefetch: false };
        local_for_reading(Path::new(&self.location), &self.read, false, fill).unwrap()
    }

    /// A reader of the view, given the view's block source.
    fn reader(view: &LocalView) -> CacheReader {
        CacheReader::open_with(&view.path, view.reader_options()).unwrap()
    }

    /// The folder a build writes in, committing into the store.
    fn writer(&self) -> voxcache::cache::CacheDir {
        let c = voxcache::cache::open_for_build(Path::new(&self.location), &self.build).unwrap();
        c.prepare().unwrap();
        c
    }
}

/// Every case of the bundled dataset ("vessels"), opened (the suite records other datasets
/// beside it).
fn vessels(reader: &CacheReader) -> Vec<EntryReader> {
    let cases = reader.cases("vessels").unwrap();
    cases
        .iter()
        .map(|c| reader.open_entry("vessels", &c.case_id).unwrap())
        .collect()
}

/// A case's whole image (as bits) and label.
pub(crate) fn whole_case(e: &EntryReader) -> voxcache::Result<(Vec<u32>, Vec<u8>)> {
    let sh = e.shape_zyx();
    let n = sh.iter().product::<usize>();
    let mut img = vec![0f32; n * e.channels()];
    let mut lab = vec![0u8; n];
    e.read_image([0, 0, 0], sh, &mut img)?;
    e.read_label([0, 0, 0], sh, &mut lab)?;
    Ok((img.iter().map(|v| v.to_bits()).collect(), lab))
}

/// The bundled data built locally with the defaults: what every store must read back.
fn reference() -> &'static Path {
    bundled_cache("store-reference", &[])
}

/// The whole suite against `store` (empty when called).
pub(crate) fn conforms(store: &Store) {
    absent_until_built(store);
    reads_what_a_local_build_holds(store);
    commits_once_per_key(store);
    records_from_several_builders_at_once(store);
    missing_blocks_come_from_the_store_or_are_refused(store);
}

/// Nothing is there before a build: no entry, no cache to read.
fn absent_until_built(store: &Store) {
    let w = store.writer();
    assert!(!w.has_entry(&"ab".repeat(32)), "{}", store.location);
    let fill = Fill::OnRead { prefetch: false };
    let err = local_for_reading(Path::new(&store.location), &store.read, false, fill)
        .and_then(|v| CacheReader::open_with(&v.path, v.reader_options()).map(|_| ()))
        .expect_err("an empty store is no cache")
        .to_string();
    assert!(err.contains("manifest.json"), "{}: {err}", store.location);
}

/// Built through the store and read back through its reader: the same manifest cases and,
/// bit for bit, the same voxels as a local build (content keys do not depend on where an
/// entry is stored). A second build finds every entry committed.
fn reads_what_a_local_build_holds(store: &Store) {
    let out = store.build_bundled();
    assert!(out.contains("10 built, 0 cached, 0 failed"), "{out}");
    let again = store.build_bundled();
    assert!(again.contains("0 built, 10 cached"), "{again}");
    let view = store.view();
    let got = Store::reader(&view);
    let want = CacheReader::open(reference()).unwrap();
    assert_eq!(
        got.manifest().datasets["vessels"].cases,
        want.manifest().datasets["vessels"].cases
    );
    let w = store.writer();
    for c in want.cases("vessels").unwrap() {
        assert!(w.has_entry(&c.key), "{}: {}", store.location, c.case_id);
    }
    for (a, b) in vessels(&got).iter().zip(&vessels(&want)) {
        assert!(
            whole_case(a).unwrap() == whole_case(b).unwrap(),
            "{}: {}",
            store.location,
            a.dir().display()
        );
    }
}

/// Files of a small made-up entry: its group metadata and one image chunk.
fn fake_entry(dir: &Path, tag: &str) {
    std::fs::create_dir_all(dir.join("image/c/0/0/0")).unwrap();
    std::fs::write(dir.join("zarr.json"), format!("{{\"tag\": \"{tag}\"}}")).unwrap();
    std::fs::write(dir.join("image/c/0/0/0/0"), tag.repeat(100)).unwrap();
}

/// A temporary entry is no entry; committed it is, and its folder is gone; a second commit
/// of the key keeps the first content (content keys: the same key is the same content).
fn commits_once_per_key(store: &Store) {
    let w = store.writer();
    let key = "cd".repeat(32);
    let first = w.new_tmp_entry(&key).unwrap();
    fake_entry(&first, "first");
    assert!(!w.has_entry(&key), "{}: uncommitted", store.location);
    assert_eq!(w.commit(&first, &key).unwrap(), Commit::Placed);
    assert!(!first.exists());
    assert!(w.has_entry(&key));
    let second = w.new_tmp_entry(&key).unwrap();
    fake_entry(&second, "second");
    assert_eq!(w.commit(&second, &key).unwrap(), Commit::AlreadyThere);
    assert!(!second.exists());
    // Read back through the store's reading side: named in a dataset, then fetched whole.
    let mut ds = built_dataset(store);
    ds.cases = BTreeMap::from([(
        "made_up".to_string(),
        voxcache::cache::manifest::ManifestCase {
            key: key.clone(),
            entry: voxcache::cache::CacheDir::entry_rel(&key),
            out_shape_zyx: [1, 1, 1],
        },
    )]);
    w.record("made-up", ds).unwrap();
    let fill = Fill::Whole;
    let view = local_for_reading(Path::new(&store.location), &store.read, false, fill).unwrap();
    let entry = view.path.join(voxcache::cache::CacheDir::entry_rel(&key));
    assert_eq!(
        std::fs::read_to_string(entry.join("zarr.json")).unwrap(),
        "{\"tag\": \"first\"}"
    );
    assert_eq!(
        std::fs::read(entry.join("image/c/0/0/0/0")).unwrap(),
        "first".repeat(100).into_bytes()
    );
}

/// The bundled dataset's record as the store's manifest holds it.
fn built_dataset(store: &Store) -> ManifestDataset {
    let view = store.view();
    Store::reader(&view).manifest().datasets["vessels"].clone()
}

/// Four builders recording at once (as `--part I/4` array jobs finish together) each land
/// their case; a build with other parameters replaces the dataset.
fn records_from_several_builders_at_once(store: &Store) {
    let base = built_dataset(store);
    let cases: Vec<_> = base.cases.clone().into_iter().take(4).collect();
    std::thread::scope(|sc| {
        for (id, case) in &cases {
            let (w, mut ds) = (store.writer(), base.clone());
            ds.cases = BTreeMap::from([(id.clone(), case.clone())]);
            sc.spawn(move || w.record("parts", ds).unwrap());
        }
    });
    let view = store.view();
    let m = Store::reader(&view).manifest().clone();
    let got: Vec<&String> = m.datasets["parts"].cases.keys().collect();
    assert_eq!(got, cases.iter().map(|c| &c.0).collect::<Vec<_>>());
    let mut other = base.clone();
    other.params_key = "0".repeat(64);
    other.cases = BTreeMap::from([cases[0].clone()]);
    let m = store.writer().record("parts", other).unwrap();
    assert_eq!(m.datasets["parts"].cases.len(), 1);
    assert_eq!(m.datasets["parts"].params_key, "0".repeat(64));
    // Datasets recorded by other builds are untouched.
    assert_eq!(m.datasets["vessels"].cases, base.cases);
}

/// The first image chunk file of the first case: its path under the cache root.
fn first_chunk(reader: &CacheReader) -> String {
    let e = &vessels(reader)[0];
    let dir = e.dir().to_path_buf();
    let root = reader.root().to_path_buf();
    let file: PathBuf = files_under(&dir.join("image"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("/c/"))
        .min()
        .expect("an image chunk file");
    file.strip_prefix(&root)
        .unwrap()
        .to_string_lossy()
        .to_string()
}

/// A block file the reader's folder lacks: read from the store when the store holds it
/// (the voxels unchanged), refused as missing when the store lost it too.
fn missing_blocks_come_from_the_store_or_are_refused(store: &Store) {
    let want = whole_case(&vessels(&CacheReader::open(reference()).unwrap())[0]).unwrap();
    let view = store.view();
    let reader = Store::reader(&view);
    // Read once, so that a tier holds the case's files.
    assert!(whole_case(&vessels(&reader)[0]).unwrap() == want);
    let rel = first_chunk(&reader);
    let in_folder = view.path.join(&rel);
    let folder_is_store = store.build.local.is_none();
    if !folder_is_store {
        if in_folder.exists() {
            std::fs::remove_file(&in_folder).unwrap();
        }
        let e = &vessels(&Store::reader(&view))[0];
        assert!(
            whole_case(e).unwrap() == want,
            "{}: refetched",
            store.location
        );
        assert!(in_folder.is_file(), "{}", in_folder.display());
    }
    (store.remove_stored)(&rel);
    if in_folder.exists() {
        std::fs::remove_file(&in_folder).unwrap();
    }
    let view = store.view();
    let e = &vessels(&Store::reader(&view))[0];
    let err = whole_case(e).unwrap_err().to_string();
    assert!(err.contains("missing"), "{}: {err}", store.location);
}

#[test]
fn the_cache_folder_conforms() {
    let t = tempfile::tempdir().unwrap();
    conforms(&Store::folder(&t.path().join("cache")));
}
