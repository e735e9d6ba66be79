//! A fuzzer for the loaders of voxcache's metadata files: run.json (parsed and checked, then
//! its network options turned into a network shape), dataset.json, an entry's zarr.json
//! attributes, manifest.json and postprocessing.json. Stable Rust, no cargo-fuzz: each input
//! runs under `catch_unwind`.
//!
//!   cargo run --release --example fuzz_records -- --iterations 1000000 [--seed N]
//!
//! Seeds: the valid files in `tests/fixtures/records/`. Each iteration takes one and mutates
//! it, either as JSON (a random node replaced by a hostile value: huge, negative, zero, NaN-like
//! strings, empty or deep containers; a key removed; a node copied elsewhere) or as bytes (flips,
//! truncation, insertion), and hands it to its loader. A loader may refuse an input (that is
//! its job); it must not panic. Exit status 1 if anything panicked, with one line per place.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use clap::Parser;
use serde_json::{json, Value};
use voxcache::format::crossval::Postprocessing;
use voxcache::format::dataset_json::DatasetDescription;
use voxcache::format::run::RunRecord;
use voxcache::format::{EntryAttrs, Manifest};
use voxcache::util::rng::Rng;

#[derive(Parser)]
#[command(about = "Fuzz the loaders of run.json, dataset.json, entry attributes, manifests")]
struct Args {
    /// Inputs to run.
    #[arg(long, default_value_t = 100_000)]
    iterations: u64,
    /// Seed of the mutation stream.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Folder of seed files.
    #[arg(long, default_value = "tests/fixtures/records")]
    seeds: PathBuf,
}

/// Which loader a seed file goes to.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Run,
    Dataset,
    Entry,
    Manifest,
    Postprocessing,
}

fn kind_of(name: &str) -> Option<Kind> {
    Some(match name {
        "run.json" => Kind::Run,
        n if n.starts_with("dataset") => Kind::Dataset,
        "entry.zarr.json" => Kind::Entry,
        "manifest.json" => Kind::Manifest,
        "postprocessing.json" => Kind::Postprocessing,
        _ => return None,
    })
}

/// Run one input through its loader (and, for a run record, the network shape it implies).
fn load(kind: Kind, bytes: &[u8], scratch: &Path) {
    let path = Path::new("fuzz.json");
    match kind {
        Kind::Run => {
            if let Ok(r) = serde_json::from_slice::<RunRecord>(bytes) {
                if r.check(path).is_ok() {
                    let n = r.config.network();
                    if let Ok(c) = n.unet_config(r.channels.len().max(1), r.num_classes) {
                        let _ = c.validate();
                    }
                }
            }
        }
        Kind::Dataset => {
            if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
                let _ = DatasetDescription::from_value(&v);
            }
        }
        Kind::Entry => {
            let _ = EntryAttrs::from_group_json(path, bytes);
        }
        Kind::Manifest => {
            let _ = Manifest::from_json(path, bytes);
        }
        Kind::Postprocessing => {
            // Through the file reader: its checks are the point.
            let file = scratch.join("postprocessing.json");
            if std::fs::write(&file, bytes).is_ok() {
                let _ = Postprocessing::read(&file);
            }
        }
    }
}

/// Values a hostile editor would write.
fn hostile(rng: &mut Rng) -> Value {
    let deep = (0..64).fold(json!(0), |v, _| json!([v]));
    let choices = [
        json!(0),
        json!(-1),
        json!(1),
        json!(2),
        json!(1_000_000_000_000u64),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e308),
        json!(-1e308),
        json!(1e-300),
        json!(0.5),
        json!("NaN"),
        json!(""),
        json!("../../etc/passwd"),
        json!("x".repeat(10_000)),
        json!(null),
        json!(true),
        json!([]),
        json!({}),
        json!([0, 0, 0]),
        json!([0, 128, 128]),
        json!([-1, 1, 1]),
        json!([1_000_000, 1_000_000, 1_000_000]),
        deep,
    ];
    choices[rng.below(choices.len() as u64) as usize].clone()
}

/// Every node's path (object keys and array indices) under `v`.
fn paths(v: &Value, here: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    out.push(here.clone());
    match v {
        Value::Object(o) => {
            for (k, c) in o {
                here.push(json!(k));
                paths(c, here, out);
                here.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                here.push(json!(i));
                paths(c, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

fn node<'a>(v: &'a mut Value, path: &[Value]) -> Option<&'a mut Value> {
    let mut cur = v;
    for p in path {
        cur = match (cur, p) {
            (Value::Object(o), Value::String(k)) => o.get_mut(k)?,
            (Value::Array(a), Value::Number(i)) => a.get_mut(i.as_u64()? as usize)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// One mutation of `seed`.
fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    if rng.chance(0.8) {
        if let Ok(mut v) = serde_json::from_slice::<Value>(seed) {
            for _ in 0..1 + rng.below(3) {
                let mut all = Vec::new();
                paths(&v, &mut Vec::new(), &mut all);
                let at = all[rng.below(all.len() as u64) as usize].clone();
                match rng.below(4) {
                    0 if !at.is_empty() => {
                        // Remove the node from its parent.
                        let (last, parent) = at.split_last().unwrap_or((&Value::Null, &[]));
                        match (node(&mut v, parent), last) {
                            (Some(Value::Object(o)), Value::String(k)) => {
                                o.remove(k);
                            }
                            (Some(Value::Array(a)), Value::Number(i)) => {
                                let i = i.as_u64().unwrap_or(0) as usize;
                                if i < a.len() {
                                    a.remove(i);
                                }
                            }
                            _ => {}
                        }
                    }
                    1 => {
                        // Copy another node here.
                        let from = all[rng.below(all.len() as u64) as usize].clone();
                        let copy = node(&mut v, &from).map(|n| n.clone());
                        if let (Some(c), Some(n)) = (copy, node(&mut v, &at)) {
                            *n = c;
                        }
                    }
                    _ => {
                        if let Some(n) = node(&mut v, &at) {
                            *n = hostile(rng);
                        }
                    }
                }
            }
            return serde_json::to_vec(&v).unwrap_or_default();
        }
    }
    let mut b = seed.to_vec();
    match rng.below(3) {
        0 if !b.is_empty() => {
            let i = rng.below(b.len() as u64) as usize;
            b[i] ^= 1 << rng.below(8);
        }
        1 => b.truncate(rng.below(b.len() as u64 + 1) as usize),
        _ => {
            let i = rng.below(b.len() as u64 + 1) as usize;
            b.insert(i, rng.below(256) as u8);
        }
    }
    b
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut seeds: Vec<(Kind, String, Vec<u8>)> = Vec::new();
    for e in std::fs::read_dir(&args.seeds)? {
        let p = e?.path();
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if let Some(k) = kind_of(&name) {
            seeds.push((k, name, std::fs::read(&p)?));
        }
    }
    seeds.sort_by(|a, b| a.1.cmp(&b.1));
    anyhow::ensure!(!seeds.is_empty(), "no seed in {}", args.seeds.display());
    let scratch = tempfile::tempdir()?;
    // Panics are counted, not printed one by one: the hook keeps the place of the last.
    let place: &'static Mutex<String> = Box::leak(Box::new(Mutex::new(String::new())));
    std::panic::set_hook(Box::new(move |info| {
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        *place.lock().unwrap_or_else(|e| e.into_inner()) = format!("{at}: {info}");
    }));
    let mut rng = Rng::new(args.seed);
    let mut panics: BTreeMap<String, (u64, String)> = BTreeMap::new();
    let started = std::time::Instant::now();
    for i in 0..args.iterations {
        let (kind, name, seed) = &seeds[(i % seeds.len() as u64) as usize];
        let input = if i < seeds.len() as u64 {
            seed.clone()
        } else {
            mutate(seed, &mut rng)
        };
        if catch_unwind(AssertUnwindSafe(|| load(*kind, &input, scratch.path()))).is_err() {
            let at = place.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let e = panics.entry(at).or_insert((0, String::new()));
            e.0 += 1;
            if e.1.is_empty() {
                e.1 = format!("{name}: {}", String::from_utf8_lossy(&input));
            }
        }
    }
    println!(
        "{} inputs ({} seeds) in {:.1} s; {} panicking place(s)",
        args.iterations,
        seeds.len(),
        started.elapsed().as_secs_f64(),
        panics.len()
    );
    for (at, (n, example)) in &panics {
        let example: String = example.chars().take(400).collect();
        println!("PANIC x{n} at {at}\n  e.g. {example}");
    }
    if !panics.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
