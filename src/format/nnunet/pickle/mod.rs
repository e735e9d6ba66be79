//! The pickle `torch.save` writes (`data.pkl` in a checkpoint's zip archive), read without
//! Python and without running anything: a value graph of dicts, lists, tuples, numbers, text,
//! storages and tensor descriptions.
//!
//! Only the opcodes pickle protocols 2 to 5 use for such data are read. Every value lives in
//! one arena and is referred to by its [`ObjId`]: a memo get or a `DUP` pushes the same id
//! again, so shared and self-referencing structures cost one id each, never a copy. Nothing
//! recurses on the input's nesting. Each bound of [`Limits`] is checked before what it bounds
//! is allocated, so memory stays within a constant times the pickle's length.
//!
//! Globals: the names torch.save writes for tensors (`torch._utils._rebuild_tensor_v2`,
//! `_rebuild_parameter`, `torch._tensor._rebuild_from_type_v2`, the `torch.*Storage`
//! classes) and `collections.OrderedDict` are understood. Other names from the modules a
//! checkpoint's optimizer state and logs use (`torch`, `numpy`, `_codecs`, `builtins`,
//! `collections`, `pathlib`, `datetime`) become opaque values named after them: never
//! called, only skipped. Any other module is refused by name.

use std::collections::HashMap;
use std::fmt;

/// A value of a [`Pickle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ObjId(u32);

/// Bounds of one parse; each is checked before what it bounds is allocated.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Values pushed on the stack (made or fetched from the memo).
    pub max_objects: usize,
    /// Memo entries.
    pub max_memo: usize,
    /// Bytes of all text and byte strings together.
    pub max_text_bytes: usize,
    /// Nesting of `MARK`s (the open tuples, lists and dicts being built).
    pub max_depth: usize,
}

impl Default for Limits {
    /// A real nnU-Net checkpoint's pickle holds tens of thousands of values (optimizer state,
    /// logs of every epoch, the plans): these leave two orders of magnitude.
    fn default() -> Self {
        Limits {
            max_objects: 4_000_000,
            max_memo: 4_000_000,
            max_text_bytes: 256 << 20,
            max_depth: 1000,
        }
    }
}

/// Element type of a torch storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchDtype {
    /// float64.
    F64,
    /// float32.
    F32,
    /// float16.
    F16,
    /// bfloat16.
    BF16,
    /// int64.
    I64,
    /// int32.
    I32,
    /// int16.
    I16,
    /// int8.
    I8,
    /// uint8.
    U8,
    /// bool (one byte).
    Bool,
}

/// The storage classes torch.save names, with their element types.
const STORAGES: &[(&str, TorchDtype)] = &[
    ("DoubleStorage", TorchDtype::F64),
    ("FloatStorage", TorchDtype::F32),
    ("HalfStorage", TorchDtype::F16),
    ("BFloat16Storage", TorchDtype::BF16),
    ("LongStorage", TorchDtype::I64),
    ("IntStorage", TorchDtype::I32),
    ("ShortStorage", TorchDtype::I16),
    ("CharStorage", TorchDtype::I8),
    ("ByteStorage", TorchDtype::U8),
    ("BoolStorage", TorchDtype::Bool),
];

impl TorchDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            TorchDtype::F64 | TorchDtype::I64 => 8,
            TorchDtype::F32 | TorchDtype::I32 => 4,
            TorchDtype::F16 | TorchDtype::BF16 | TorchDtype::I16 => 2,
            TorchDtype::I8 | TorchDtype::U8 | TorchDtype::Bool => 1,
        }
    }

    /// torch's storage class name (`FloatStorage`, ...).
    pub fn storage_name(self) -> &'static str {
        STORAGES
            .iter()
            .find(|(_, d)| *d == self)
            .map_or("?", |(n, _)| n)
    }
}

/// A storage named by a persistent id: its bytes are the archive's `data/KEY` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Storage {
    /// Element type.
    pub dtype: TorchDtype,
    /// Its key (a plain name: letters, digits, `_`).
    pub key: String,
    /// Elements the pickle says it holds.
    pub numel: u64,
}

/// A tensor as `_rebuild_tensor_v2` describes it: a view of a storage. Sizes are checked
/// against the storage where the bytes are read, not here.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRef {
    /// The storage it views.
    pub storage: Storage,
    /// First element, in elements of the storage.
    pub offset: u64,
    /// Sizes, outermost first.
    pub shape: Vec<u64>,
    /// Strides in elements, as long as `shape`.
    pub strides: Vec<u64>,
}

/// A class or function named by `GLOBAL`: what it means here (nothing is ever called).
#[derive(Clone, Debug, PartialEq)]
pub enum Callable {
    /// `torch._utils._rebuild_tensor_v2`.
    RebuildTensor,
    /// `torch._utils._rebuild_parameter` (and `_with_state`): its first argument.
    RebuildParameter,
    /// `torch._tensor._rebuild_from_type_v2`: a tensor subclass around a rebuilt tensor.
    RebuildFromType,
    /// `collections.OrderedDict`: an empty dict, filled by `SETITEMS`.
    OrderedDict,
    /// A `torch.*Storage` class, for persistent ids.
    StorageClass(TorchDtype),
    /// Any other allowed name: calling it makes an opaque value (`module.name`).
    Inert(String),
}

/// One value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True`, `False`.
    Bool(bool),
    /// An int that fits 64 bits.
    Int(i64),
    /// A float.
    Float(f64),
    /// A `str`.
    Text(Box<str>),
    /// A `bytes`.
    Bytes(Box<[u8]>),
    /// A tuple.
    Tuple(Box<[ObjId]>),
    /// A list.
    List(Vec<ObjId>),
    /// A dict (or OrderedDict), in insertion order; a repeated key's last entry counts.
    Dict(Vec<(ObjId, ObjId)>),
    /// A class or function.
    Global(Box<Callable>),
    /// A storage from a persistent id.
    Storage(Box<Storage>),
    /// A tensor.
    Tensor(Box<TensorRef>),
    /// Something we do not interpret (a numpy scalar, a `torch.device`, a huge int): its
    /// maker's name.
    Opaque(Box<str>),
}

/// Why a pickle does not read.
#[derive(Clone, Debug, PartialEq)]
pub struct PickleError {
    /// Byte offset of the opcode.
    pub offset: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for PickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte {}: {}", self.offset, self.message)
    }
}

impl std::error::Error for PickleError {}

/// A parsed pickle: every value, and the one `STOP` returned.
#[derive(Debug)]
pub struct Pickle {
    values: Vec<Value>,
    root: ObjId,
}

impl Pickle {
    /// Parse `data` within `limits`.
    pub fn parse(data: &[u8], limits: &Limits) -> Result<Pickle, PickleError> {
        parser::Parser {
            data,
            pos: 0,
            op_at: 0,
            limits,
            values: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            pushes: 0,
            text_bytes: 0,
        }
        .run()
    }

    /// The value the pickle returns.
    pub fn root(&self) -> ObjId {
        self.root
    }

    /// The value `id` (ids come from this pickle; a foreign one reads as `None`).
    pub fn value(&self, id: ObjId) -> &Value {
        self.values.get(id.0 as usize).unwrap_or(&Value::None)
    }

    /// The entry `key` of the dict `id` (its last, as Python keeps); `None` if `id` is not a
    /// dict or has no such text key.
    pub fn dict_get(&self, id: ObjId, key: &str) -> Option<ObjId> {
        match self.value(id) {
            Value::Dict(items) => items
                .iter()
                .rev()
                .find(|(k, _)| self.text(*k) == Some(key))
                .map(|(_, v)| *v),
            _ => None,
        }
    }

    /// The text of `id`, if it is one.
    pub fn text(&self, id: ObjId) -> Option<&str> {
        match self.value(id) {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The items of a tuple or list.
    pub fn items(&self, id: ObjId) -> Option<&[ObjId]> {
        match self.value(id) {
            Value::Tuple(t) => Some(t),
            Value::List(l) => Some(l),
            _ => None,
        }
    }

    /// A short description of `id` for messages (never walks into it).
    pub fn describe(&self, id: ObjId) -> String {
        describe(self.values.get(id.0 as usize))
    }
}

/// A value in a few words (never walks into it).
fn describe(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::None) => "None".into(),
        Some(Value::Bool(b)) => if *b { "True" } else { "False" }.into(),
        Some(Value::Int(i)) => format!("the int {i}"),
        Some(Value::Float(x)) => format!("the float {x}"),
        Some(Value::Text(s)) => {
            let short: String = s.chars().take(40).collect();
            format!("the text {short:?}")
        }
        Some(Value::Bytes(b)) => format!("{} bytes", b.len()),
        Some(Value::Tuple(t)) => format!("a tuple of {}", t.len()),
        Some(Value::List(l)) => format!("a list of {}", l.len()),
        Some(Value::Dict(d)) => format!("a dict of {}", d.len()),
        Some(Value::Global(g)) => format!("the global {g:?}"),
        Some(Value::Storage(s)) => format!("storage {}", s.key),
        Some(Value::Tensor(t)) => format!("a tensor {:?}", t.shape),
        Some(Value::Opaque(n)) => format!("a {n} object"),
    }
}

mod parser;
#[cfg(test)]
mod tests;
