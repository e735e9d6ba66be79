//! nnU-Net checkpoints made in code as torch.save writes them (a zip archive of `data.pkl` and
//! one `data/KEY` entry per storage), from a real fixture's weights, with a hook on each
//! tensor's pickle so a test can make it hostile; and the hostile checkpoints themselves, each
//! with the words its refusal must contain. Shared by `tests/suite/hostile_checkpoints.rs`, the
//! checkpoint fuzzer's seeds and its corpus test.

use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};

use voxcache::format::nnunet::pickle::Value;
use voxcache::format::nnunet::torch_archive::{ArchiveLimits, TorchArchive};

/// The archive's folder name, as torch.save names it after the file.
const PREFIX: &str = "checkpoint_final";

/// A fixture's results folder (`ct3d`, `ct2d`, `regions_resenc`).
pub(crate) fn results_dir(fixture: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nnunet_models")
        .join(fixture);
    std::fs::read_dir(&dir)
        .expect("the nnU-Net fixtures")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().contains("__"))
        })
        .expect("a TRAINER__PLANS__CONFIGURATION folder")
}

/// One parameter: its state-dict name, shape and float32 bytes.
#[derive(Clone)]
pub(crate) struct Param {
    pub(crate) name: String,
    pub(crate) shape: Vec<u64>,
    pub(crate) data: Vec<u8>,
}

/// The `network_weights` of a fixture's fold-0 checkpoint, read with the library.
pub(crate) fn fixture_params(fixture: &str) -> Vec<Param> {
    let path = results_dir(fixture).join("fold_0/checkpoint_final.pth");
    let mut a = TorchArchive::open(&path, ArchiveLimits::default()).expect("the fixture reads");
    let pk = a.pickle();
    let weights = pk.dict_get(pk.root(), "network_weights").unwrap();
    let Value::Dict(entries) = pk.value(weights) else {
        panic!("network_weights is not a dict")
    };
    let tensors: Vec<(String, _)> = entries
        .iter()
        .map(|&(k, v)| match pk.value(v) {
            Value::Tensor(t) => (pk.text(k).unwrap().to_string(), (**t).clone()),
            _ => panic!("not a tensor"),
        })
        .collect();
    tensors
        .into_iter()
        .map(|(name, t)| {
            let raw = a.read_tensor(&name, &t).unwrap();
            Param {
                name,
                shape: t.shape,
                data: raw.bytes,
            }
        })
        .collect()
}

/// BINUNICODE.
pub(crate) fn text(s: &str) -> Vec<u8> {
    let mut v = vec![b'X'];
    v.extend((s.len() as u32).to_le_bytes());
    v.extend(s.as_bytes());
    v
}

/// The shortest int opcode for `n`.
pub(crate) fn int(n: i64) -> Vec<u8> {
    if (0..256).contains(&n) {
        vec![b'K', n as u8]
    } else if let Ok(n) = i32::try_from(n) {
        let mut v = vec![b'J'];
        v.extend(n.to_le_bytes());
        v
    } else {
        let mut v = vec![0x8a, 8];
        v.extend(n.to_le_bytes());
        v
    }
}

/// GLOBAL.
pub(crate) fn global(module: &str, name: &str) -> Vec<u8> {
    format!("c{module}\n{name}\n").into_bytes()
}

/// MARK items... TUPLE.
pub(crate) fn tuple(items: &[Vec<u8>]) -> Vec<u8> {
    let mut v = vec![b'('];
    for i in items {
        v.extend(i);
    }
    v.push(b't');
    v
}

/// `OrderedDict()`.
fn ordered_dict() -> Vec<u8> {
    let mut v = global("collections", "OrderedDict");
    v.extend([b')', b'R']);
    v
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// How the tensor of parameter `i` is pickled: its persistent id's items and the arguments
/// of `_rebuild_tensor_v2`, as torch.save writes them; a hook may change either.
pub(crate) type Edit<'a> = &'a mut dyn FnMut(usize, &mut Vec<Vec<u8>>, &mut Vec<Vec<u8>>);

/// `data.pkl` of an nnU-Net checkpoint holding `params` (storage `i` for parameter `i`).
pub(crate) fn checkpoint_pickle(params: &[Param], configuration: &str, edit: Edit) -> Vec<u8> {
    let mut p = vec![0x80, 2, b'}', b'('];
    p.extend(text("network_weights"));
    p.extend(ordered_dict());
    p.push(b'(');
    for (i, param) in params.iter().enumerate() {
        let numel = param.data.len() as i64 / 4;
        let mut pid = vec![
            text("storage"),
            global("torch", "FloatStorage"),
            text(&i.to_string()),
            text("cpu"),
            int(numel),
        ];
        let dims = |v: &[u64]| tuple(&v.iter().map(|&d| int(d as i64)).collect::<Vec<_>>());
        let mut args = vec![
            int(0),
            dims(&param.shape),
            dims(&strides(&param.shape)),
            vec![0x89],
            ordered_dict(),
        ];
        edit(i, &mut pid, &mut args);
        p.extend(text(&param.name));
        p.extend(global("torch._utils", "_rebuild_tensor_v2"));
        p.push(b'(');
        p.extend(tuple(&pid));
        p.push(b'Q');
        for a in &args {
            p.extend(a);
        }
        p.extend([b't', b'R']);
    }
    p.push(b'u');
    p.extend(text("trainer_name"));
    p.extend(text("nnUNetTrainer"));
    p.extend(text("init_args"));
    p.extend([b'}', b'(']);
    p.extend(text("configuration"));
    p.extend(text(configuration));
    p.push(b'u');
    p.extend(text("inference_allowed_mirroring_axes"));
    p.extend(tuple(&[int(0), int(1), int(2)]));
    p.extend([b'u', b'.']);
    p
}

/// A torch.save archive of `pickle` and `storages` (the pickle deflated if `deflate`).
pub(crate) fn archive(pickle: &[u8], storages: &[Vec<u8>], deflate: bool) -> Vec<u8> {
    let mut es = vec![
        (format!("{PREFIX}/data.pkl"), pickle.to_vec()),
        (format!("{PREFIX}/byteorder"), b"little".to_vec()),
    ];
    for (i, s) in storages.iter().enumerate() {
        es.push((format!("{PREFIX}/data/{i}"), s.clone()));
    }
    es.push((format!("{PREFIX}/version"), b"3\n".to_vec()));
    archive_entries(&es, deflate)
}

/// A checkpoint of `params` (for `configuration`), each tensor's pickle passed through `edit`.
pub(crate) fn checkpoint(params: &[Param], configuration: &str, edit: Edit) -> Vec<u8> {
    let pickle = checkpoint_pickle(params, configuration, edit);
    let storages: Vec<Vec<u8>> = params.iter().map(|p| p.data.clone()).collect();
    archive(&pickle, &storages, false)
}

/// `params` with every value of parameter `i` replaced by `value`.
fn poisoned(params: &[Param], i: usize, value: f32) -> Vec<Param> {
    let mut p = params.to_vec();
    p[i].data = value.to_le_bytes().repeat(p[i].data.len() / 4);
    p
}

/// A hostile checkpoint: its name, its bytes, the words its refusal must hold.
pub(crate) type Hostile = (&'static str, Vec<u8>, Vec<String>);

/// The hostile checkpoints, made from the ct3d fixture's weights: (name, bytes, the words its
/// refusal must hold). Parameter 0 is `encoder.stages.0.0.convs.0.conv.weight` (4, 1, 1,
/// 3, 3) on storage 0 of 36 floats (144 bytes).
pub(crate) fn hostile() -> Vec<Hostile> {
    // The first four parameters are enough: each refusal comes before the rest is missed, and
    // the committed files stay small.
    let mut params = fixture_params("ct3d");
    params.truncate(4);
    let cfg = "3d_fullres";
    let mut out: Vec<Hostile> = Vec::new();
    let first = params[0].name.clone();
    let bias = params
        .iter()
        .position(|p| p.name.ends_with("conv.bias"))
        .unwrap();
    let bias_name = params[bias].name.clone();
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // Two million nested lists (deflated: 4 MB of pickle in a few kB).
    let n = 2_000_000;
    let mut p = vec![0x80, 2];
    p.extend(vec![b']'; n]);
    p.extend(vec![b'a'; n - 1]);
    p.push(b'.');
    out.push((
        "nested-lists",
        archive(&p, &[], true),
        words(&["a list of 1, not a dictionary"]),
    ));
    let mut p = vec![0x80, 2];
    p.extend(vec![b'('; n]);
    out.push((
        "nested-marks",
        archive(&p, &[], true),
        words(&["nested more than 1000 deep"]),
    ));
    // l0 = []; l(k+1) = [lk, lk] sixty times over: 2^60 lists if memo gets copied.
    let mut p = vec![0x80, 2, b']', b'q', 0];
    for _ in 0..60 {
        p.extend([b'(', b'h', 0, b'h', 0, b'l', b'q', 0]);
    }
    p.extend([b'2', b'a', b'.']);
    out.push((
        "memo-doubling",
        archive(&p, &[], false),
        words(&["a list of 3, not a dictionary"]),
    ));
    // 1024^4 elements claimed on the 36-float storage, then with the storage claiming as many.
    let huge = vec![1024u64; 4];
    let huge_args = |args: &mut Vec<Vec<u8>>| {
        let dims = |v: &[u64]| tuple(&v.iter().map(|&d| int(d as i64)).collect::<Vec<_>>());
        args[1] = dims(&huge);
        args[2] = dims(&strides(&huge));
    };
    out.push((
        "huge-shape",
        checkpoint(&params, cfg, &mut |i, _, args| {
            if i == 0 {
                huge_args(args)
            }
        }),
        vec![
            first.clone(),
            "reaches beyond storage 0, which holds 36 elements".into(),
        ],
    ));
    out.push((
        "huge-storage",
        checkpoint(&params, cfg, &mut |i, pid, args| {
            if i == 0 {
                huge_args(args);
                pid[4] = int(1 << 40);
            }
        }),
        vec![
            first.clone(),
            "is 144 bytes in the archive, but the pickle says 1099511627776 elements".into(),
        ],
    ));
    out.push((
        "short-rebuild",
        checkpoint(&params, cfg, &mut |i, _, args| {
            if i == 3 {
                args.truncate(2)
            }
        }),
        words(&["_rebuild_tensor_v2 with 3 arguments"]),
    ));
    out.push((
        "short-persid",
        checkpoint(&params, cfg, &mut |i, pid, _| {
            if i == 3 {
                pid.truncate(3)
            }
        }),
        words(&["persistent id of 3 items"]),
    ));
    let nan = poisoned(&params, 0, f32::NAN);
    let all_nan: Vec<Param> = (0..params.len()).fold(nan, |p, i| poisoned(&p, i, f32::NAN));
    out.push((
        "all-nan",
        checkpoint(&all_nan, cfg, &mut |_, _, _| {}),
        vec![first.clone(), "NaN or infinite".into()],
    ));
    out.push((
        "bias-inf",
        checkpoint(
            &poisoned(&params, bias, f32::INFINITY),
            cfg,
            &mut |_, _, _| {},
        ),
        vec![bias_name, "NaN or infinite".into()],
    ));
    out
}

/// The entries of a zip archive (name, bytes), in order; `None` if it does not read.
pub(crate) fn entries_of(zip_bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let mut z = zip::ZipArchive::new(Cursor::new(zip_bytes)).ok()?;
    (0..z.len())
        .map(|i| {
            let mut f = z.by_index(i).ok()?;
            let mut b = Vec::new();
            f.read_to_end(&mut b).ok()?;
            Some((f.name().ok()?.to_string(), b))
        })
        .collect()
}

/// A zip archive of `entries` (stored; data.pkl deflated if `deflate`).
pub(crate) fn archive_entries(entries: &[(String, Vec<u8>)], deflate: bool) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let stored =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in entries {
        let options = if deflate && name.ends_with("data.pkl") {
            stored.compression_method(zip::CompressionMethod::Deflated)
        } else {
            stored
        };
        // A repeated name is refused by the writer: write it under another.
        if z.start_file(name.as_str(), options).is_err() {
            let _ = z.start_file(format!("{name}.again"), options);
        }
        let _ = z.write_all(bytes);
    }
    z.finish().map(Cursor::into_inner).unwrap_or_default()
}
