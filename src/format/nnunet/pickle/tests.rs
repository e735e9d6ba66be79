//! Unit tests of the pickle reader: hand-written pickles, hostile ones included. Each hostile
//! one is refused or read within its bounds, fast, with the reason in the message.

use super::*;

fn parse(data: &[u8]) -> Result<Pickle, PickleError> {
    Pickle::parse(data, &Limits::default())
}

/// SHORT_BINUNICODE.
fn s(text: &str) -> Vec<u8> {
    let mut v = vec![0x8c, text.len() as u8];
    v.extend(text.as_bytes());
    v
}

/// BININT.
fn int(n: i32) -> Vec<u8> {
    let mut v = vec![b'J'];
    v.extend(n.to_le_bytes());
    v
}

/// GLOBAL.
fn g(module: &str, name: &str) -> Vec<u8> {
    format!("c{module}\n{name}\n").into_bytes()
}

/// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)` pickled, with
/// `pid` the persistent id's items and `args` how many of the six arguments to give.
fn tensor_pickle(pid: &[Vec<u8>], shape: &[i32], args: usize) -> Vec<u8> {
    let mut p = vec![0x80, 2];
    p.extend(g("torch._utils", "_rebuild_tensor_v2"));
    p.push(b'(');
    p.push(b'(');
    for item in pid {
        p.extend(item);
    }
    p.extend([b't', b'Q']);
    let mut rest: Vec<Vec<u8>> = vec![int(0)];
    let dims = |v: Vec<i32>| {
        let mut t = vec![b'('];
        for d in v {
            t.extend(int(d));
        }
        t.push(b't');
        t
    };
    rest.push(dims(shape.to_vec()));
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    rest.push(dims(strides));
    rest.push(vec![0x89]);
    let mut hooks = g("collections", "OrderedDict");
    hooks.extend([b')', b'R']);
    rest.push(hooks);
    for r in rest.into_iter().take(args.saturating_sub(1)) {
        p.extend(r);
    }
    p.extend([b't', b'R', b'.']);
    p
}

fn storage_pid(numel: i32) -> Vec<Vec<u8>> {
    vec![
        s("storage"),
        g("torch", "FloatStorage"),
        s("0"),
        s("cpu"),
        int(numel),
    ]
}

#[test]
fn a_small_dict_reads() {
    // {'a': [1, 2.5, 'x'], 'b': (None, True)}
    let mut p = vec![0x80, 2, b'}', b'q', 0, b'('];
    p.extend([0x8c, 1, b'a', b']', b'(', b'K', 1, b'G']);
    p.extend(2.5f64.to_be_bytes());
    p.extend([
        0x8c, 1, b'x', b'e', 0x8c, 1, b'b', b'N', 0x88, 0x86, b'u', b'.',
    ]);
    let pk = parse(&p).unwrap();
    let a = pk.dict_get(pk.root(), "a").unwrap();
    let items = pk.items(a).unwrap();
    assert_eq!(pk.value(items[0]), &Value::Int(1));
    assert_eq!(pk.value(items[1]), &Value::Float(2.5));
    assert_eq!(pk.text(items[2]), Some("x"));
    let b = pk.dict_get(pk.root(), "b").unwrap();
    assert_eq!(pk.items(b).unwrap().len(), 2);
}

#[test]
fn a_tensor_reads_with_its_storage() {
    let pk = parse(&tensor_pickle(&storage_pid(36), &[4, 9], 6)).unwrap();
    let Value::Tensor(t) = pk.value(pk.root()) else {
        panic!("{}", pk.describe(pk.root()));
    };
    assert_eq!(t.shape, [4, 9]);
    assert_eq!(t.strides, [9, 1]);
    assert_eq!(t.storage.numel, 36);
    assert_eq!(t.storage.key, "0");
    assert_eq!(t.storage.dtype, TorchDtype::F32);
}

#[test]
fn two_million_nested_lists_read_without_recursion() {
    // [[[...]]]: two million lists, each appended into the one before.
    let n = 2_000_000;
    let mut p = vec![b']'; n];
    p.extend(vec![b'a'; n - 1]);
    p.push(b'.');
    let pk = parse(&p).unwrap();
    assert_eq!(pk.describe(pk.root()), "a list of 1");
    drop(pk); // a flat arena: dropping does not recurse either
              // Two million open MARKs are refused at the depth bound.
    let e = parse(&vec![b'('; n]).unwrap_err();
    assert!(e.message.contains("1000 deep"), "{e}");
}

#[test]
fn memo_doubling_costs_one_value_per_step() {
    // l0 = []; l(k+1) = [lk, lk]: 2^60 lists if gets copied; 61 values here.
    let mut p = vec![b']', b'q', 0];
    for _ in 0..60 {
        p.extend([b'(', b'h', 0, b'h', 0, b'l', b'q', 0]);
    }
    // And a list appended to itself, by DUP and by memo get.
    p.extend([
        b']', b'2', b'a', b'q', 1, b'(', b'h', 1, b'h', 1, b'e', b'.',
    ]);
    let start = std::time::Instant::now();
    let pk = parse(&p).unwrap();
    assert!(start.elapsed().as_secs_f64() < 1.0);
    assert!(pk.values.len() < 70, "{} values", pk.values.len());
    let root = pk.root();
    assert_eq!(pk.items(root).unwrap(), [root, root, root]);
}

#[test]
fn each_bound_is_enforced_before_allocating() {
    let small = Limits {
        max_objects: 100,
        max_memo: 10,
        max_text_bytes: 64,
        max_depth: 4,
    };
    let e = Pickle::parse(&vec![b'N'; 1000], &small).unwrap_err();
    assert!(e.message.contains("more than 100 values"), "{e}");
    let mut p = vec![b'N'];
    for k in 0..20u32 {
        p.push(b'r');
        p.extend(k.to_le_bytes());
    }
    let e = Pickle::parse(&p, &small).unwrap_err();
    assert!(e.message.contains("memo entries"), "{e}");
    let e = Pickle::parse(&[s(&"x".repeat(65)), vec![b'.']].concat(), &small).unwrap_err();
    assert!(e.message.contains("bytes of strings"), "{e}");
    // Claimed lengths beyond the input: refused before anything is allocated.
    let mut p = vec![0x8d];
    p.extend((1u64 << 60).to_le_bytes());
    let e = parse(&p).unwrap_err();
    assert!(e.message.contains("truncated"), "{e}");
    let mut p = vec![b'B'];
    p.extend(u32::MAX.to_le_bytes());
    assert!(parse(&p).unwrap_err().message.contains("truncated"));
    // The largest memo index is one entry, not four billion.
    let mut p = vec![b'N', b'r'];
    p.extend(u32::MAX.to_le_bytes());
    p.push(b'j');
    p.extend(u32::MAX.to_le_bytes());
    p.extend([b'.']);
    assert!(parse(&p).is_ok());
}

#[test]
fn short_rebuild_tuples_and_persistent_ids_are_refused_by_name() {
    let e = parse(&tensor_pickle(&storage_pid(36), &[4, 9], 3)).unwrap_err();
    assert!(
        e.message.contains("_rebuild_tensor_v2 with 3 arguments"),
        "{e}"
    );
    let e = parse(&tensor_pickle(&storage_pid(36)[..3], &[4, 9], 6)).unwrap_err();
    assert!(e.message.contains("persistent id of 3 items"), "{e}");
    let mut pid = storage_pid(36);
    pid[1] = g("torch", "device");
    let e = parse(&tensor_pickle(&pid, &[4, 9], 6)).unwrap_err();
    assert!(e.message.contains("not a torch storage"), "{e}");
    let mut pid = storage_pid(36);
    pid[2] = s("../../etc/passwd");
    let e = parse(&tensor_pickle(&pid, &[4, 9], 6)).unwrap_err();
    assert!(e.message.contains("not a plain name"), "{e}");
    let e = parse(&tensor_pickle(&storage_pid(36), &[4, -9], 6)).unwrap_err();
    assert!(e.message.contains("size holds the int -9"), "{e}");
}

#[test]
fn unknown_globals_are_refused_and_known_ones_stay_inert() {
    let mut p = g("os", "system");
    p.extend(s("rm -rf /"));
    p.extend([0x85, b'R', b'.']);
    let e = parse(&p).unwrap_err();
    assert!(e.message.contains("os.system"), "{e}");
    // numpy.dtype('f4') as an optimizer's logs hold it: an opaque value, never called.
    let mut p = g("numpy", "dtype");
    p.extend(s("f4"));
    p.extend([0x85, b'R', b'.']);
    let pk = parse(&p).unwrap();
    assert_eq!(pk.value(pk.root()), &Value::Opaque("numpy.dtype".into()));
    // The same name by STACK_GLOBAL.
    let p = [s("posix"), s("system"), vec![0x93, b'.']].concat();
    assert!(parse(&p).unwrap_err().message.contains("posix.system"));
}

#[test]
fn malformed_streams_are_refused_not_panicking() {
    for (p, want) in [
        (&b""[..], "truncated"),
        (b"a", "empty stack"),
        (b"(.", "across a MARK"),
        (b"t", "no MARK"),
        (b"(K\x01d.", "not key-value pairs"),
        (b"K\x01K\x02a.", "APPEND to the int 1"),
        (b")K\x01b.", "BUILD on a tuple of 0"),
        (b"h\x05", "read before it is written"),
        (b"\x80\x09", "protocol 9"),
        (b"I1\n.", "opcode 0x49"),
        (b"K\x01)R.", "not a global"),
        (b"cos\nsys", "GLOBAL without a name line"),
    ] {
        let e = parse(p).unwrap_err();
        assert!(e.message.contains(want), "{p:?}: {e}");
    }
}
