//! The parser: one opcode at a time, iterative, each bound checked before it allocates.

use std::collections::HashMap;

use super::{
    describe, Callable, Limits, ObjId, Pickle, PickleError, Storage, TensorRef, TorchDtype, Value,
    STORAGES,
};

/// Longest module or name of a `GLOBAL`.
const MAX_GLOBAL_LEN: usize = 256;
/// Most dimensions of a tensor.
const MAX_RANK: usize = 16;
/// Modules whose names may appear as opaque values.
const INERT_MODULES: &[&str] = &[
    "torch",
    "numpy",
    "_codecs",
    "builtins",
    "collections",
    "pathlib",
    "datetime",
];

/// What a `GLOBAL` names, or why it is refused.
fn resolve(module: &str, name: &str) -> Result<Callable, String> {
    Ok(match (module, name) {
        ("torch._utils", "_rebuild_tensor_v2") => Callable::RebuildTensor,
        ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => {
            Callable::RebuildParameter
        }
        ("torch._tensor", "_rebuild_from_type_v2") => Callable::RebuildFromType,
        ("collections", "OrderedDict") => Callable::OrderedDict,
        ("torch", n) if STORAGES.iter().any(|(s, _)| *s == n) => Callable::StorageClass(
            STORAGES
                .iter()
                .find(|(s, _)| *s == n)
                .map_or(TorchDtype::U8, |(_, d)| *d),
        ),
        _ => {
            let root = module.split('.').next().unwrap_or("");
            if !INERT_MODULES.contains(&root) {
                return Err(format!("global {module}.{name}: not something torch.save writes in a checkpoint (refused; nothing in a checkpoint is ever run)"));
            }
            Callable::Inert(format!("{module}.{name}"))
        }
    })
}

/// Why an opcode is refused.
fn refused_opcode(op: u8) -> String {
    format!("opcode 0x{op:02x}: not one torch.save writes for a checkpoint")
}

pub(super) struct Parser<'a> {
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
    pub(super) op_at: usize,
    pub(super) limits: &'a Limits,
    pub(super) values: Vec<Value>,
    pub(super) stack: Vec<ObjId>,
    pub(super) marks: Vec<usize>,
    pub(super) memo: HashMap<u32, ObjId>,
    pub(super) pushes: usize,
    pub(super) text_bytes: usize,
}

type Step<T> = Result<T, String>;

impl Parser<'_> {
    pub(super) fn run(mut self) -> Result<Pickle, PickleError> {
        loop {
            self.op_at = self.pos;
            match self.step() {
                Ok(Some(root)) => {
                    return Ok(Pickle {
                        values: self.values,
                        root,
                    })
                }
                Ok(None) => {}
                Err(message) => {
                    return Err(PickleError {
                        offset: self.op_at,
                        message,
                    })
                }
            }
        }
    }

    fn bytes(&mut self, n: usize) -> Step<&[u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| {
                format!(
                    "{n} bytes wanted, {} left: truncated",
                    self.data.len() - self.pos
                )
            })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Step<[u8; N]> {
        let mut a = [0; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Step<u8> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Step<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A length field: it must fit what is left of the input and the text budget.
    fn string_len(&mut self, len: u64) -> Step<usize> {
        let left = self.data.len() - self.pos;
        if len > left as u64 {
            return Err(format!("a string of {len} bytes, {left} left: truncated"));
        }
        let len = len as usize;
        self.text_bytes += len;
        if self.text_bytes > self.limits.max_text_bytes {
            return Err(format!(
                "more than {} bytes of strings (limit)",
                self.limits.max_text_bytes
            ));
        }
        Ok(len)
    }

    fn text(&mut self, len: u64) -> Step<Box<str>> {
        let len = self.string_len(len)?;
        let b = self.bytes(len)?;
        std::str::from_utf8(b)
            .map(Box::from)
            .map_err(|_| "a string that is not UTF-8".to_string())
    }

    fn raw_bytes(&mut self, len: u64) -> Step<Box<[u8]>> {
        let len = self.string_len(len)?;
        Ok(Box::from(self.bytes(len)?))
    }

    /// One `\n`-ended line of a `GLOBAL`.
    fn line(&mut self) -> Step<String> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .take(MAX_GLOBAL_LEN + 1)
            .position(|&b| b == b'\n')
            .ok_or_else(|| {
                format!("GLOBAL without a name line of at most {MAX_GLOBAL_LEN} bytes")
            })?;
        let s = std::str::from_utf8(&rest[..n])
            .map_err(|_| "GLOBAL name is not UTF-8".to_string())?
            .to_string();
        self.pos += n + 1;
        Ok(s)
    }

    fn push(&mut self, id: ObjId) -> Step<()> {
        self.pushes += 1;
        if self.pushes > self.limits.max_objects {
            return Err(format!(
                "more than {} values (limit)",
                self.limits.max_objects
            ));
        }
        self.stack.push(id);
        Ok(())
    }

    /// A new value, pushed.
    fn make(&mut self, v: Value) -> Step<()> {
        // `push` bounds the count: values never outnumber pushes.
        let id = ObjId(u32::try_from(self.values.len()).map_err(|_| "more than 2^32 values")?);
        self.push(id)?;
        self.values.push(v);
        Ok(())
    }

    fn pop(&mut self) -> Step<ObjId> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err("pops across a MARK".into());
        }
        self.stack.pop().ok_or_else(|| "pops an empty stack".into())
    }

    fn top(&self) -> Step<ObjId> {
        self.stack
            .last()
            .copied()
            .ok_or_else(|| "reads an empty stack".into())
    }

    fn pop_mark(&mut self) -> Step<Vec<ObjId>> {
        let m = self.marks.pop().ok_or("no MARK to pop to")?;
        Ok(self.stack.split_off(m.min(self.stack.len())))
    }

    fn describe(&self, id: ObjId) -> String {
        describe(self.values.get(id.0 as usize))
    }

    fn memo_put(&mut self, key: u32) -> Step<()> {
        let id = self.top()?;
        if !self.memo.contains_key(&key) && self.memo.len() >= self.limits.max_memo {
            return Err(format!(
                "more than {} memo entries (limit)",
                self.limits.max_memo
            ));
        }
        self.memo.insert(key, id);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Step<()> {
        let id = *self
            .memo
            .get(&key)
            .ok_or_else(|| format!("memo entry {key} read before it is written"))?;
        self.push(id)
    }

    /// One opcode; `Some(root)` at `STOP`.
    fn step(&mut self) -> Step<Option<ObjId>> {
        let op = self.u8()?;
        match op {
            0x80 => {
                let v = self.u8()?;
                if !(2..=5).contains(&v) {
                    return Err(format!("pickle protocol {v}: torch.save writes 2"));
                }
            }
            0x95 => {
                self.bytes(8)?; // FRAME: a length hint only
            }
            b'(' | b'q' | b'r' | 0x94 | b'h' | b'j' | b'0' | b'1' | b'2' => self.stack_op(op)?,
            b'J' | b'K' | b'M' | 0x8a | b'G' | b'N' | 0x88 | 0x89 => self.scalar_op(op)?,
            0x8c | b'X' | 0x8d | b'C' | b'B' | 0x8e => self.string_op(op)?,
            b'}' | b']' | b')' | 0x85..=0x87 | b't' | b'l' | b'd' => self.container_op(op)?,
            b'a' | b'e' | b's' | b'u' => self.container_op(op)?,
            b'c' | 0x93 | b'R' | 0x81 | b'b' | b'Q' => self.object_op(op)?,
            b'.' => return self.pop().map(Some),
            other => return Err(refused_opcode(other)),
        }
        Ok(None)
    }

    /// `MARK`, the memo, `POP` and `DUP`: opcodes that move ids and never make a value.
    fn stack_op(&mut self, op: u8) -> Step<()> {
        match op {
            b'(' => {
                if self.marks.len() >= self.limits.max_depth {
                    return Err(format!(
                        "nested more than {} deep (limit)",
                        self.limits.max_depth
                    ));
                }
                self.marks.push(self.stack.len());
            }
            b'q' => {
                let k = self.u8()?;
                self.memo_put(k.into())?
            }
            b'r' => {
                let k = self.u32()?;
                self.memo_put(k)?
            }
            0x94 => {
                let k = u32::try_from(self.memo.len()).map_err(|_| "memo too large")?;
                self.memo_put(k)?
            }
            b'h' => {
                let k = self.u8()?;
                self.memo_get(k.into())?
            }
            b'j' => {
                let k = self.u32()?;
                self.memo_get(k)?
            }
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let id = self.top()?;
                self.push(id)?
            }
            // `step` sends no other opcode here.
            other => return Err(refused_opcode(other)),
        }
        Ok(())
    }

    /// Ints, floats, `None`, `True` and `False`.
    fn scalar_op(&mut self, op: u8) -> Step<()> {
        match op {
            b'J' => {
                let v = i32::from_le_bytes(self.array()?);
                self.make(Value::Int(v.into()))?
            }
            b'K' => {
                let v = self.u8()?;
                self.make(Value::Int(v.into()))?
            }
            b'M' => {
                let v = u16::from_le_bytes(self.array()?);
                self.make(Value::Int(v.into()))?
            }
            0x8a => {
                let n = self.u8()? as usize;
                let b = self.bytes(n)?;
                let v = if n == 0 {
                    Value::Int(0)
                } else if n <= 8 {
                    let fill = if b[n - 1] & 0x80 != 0 { 0xff } else { 0 };
                    let mut a = [fill; 8];
                    a[..n].copy_from_slice(b);
                    Value::Int(i64::from_le_bytes(a))
                } else {
                    Value::Opaque("int wider than 64 bits".into())
                };
                self.make(v)?
            }
            b'G' => {
                let v = f64::from_be_bytes(self.array()?);
                self.make(Value::Float(v))?
            }
            b'N' => self.make(Value::None)?,
            0x88 => self.make(Value::Bool(true))?,
            0x89 => self.make(Value::Bool(false))?,
            // `step` sends no other opcode here.
            other => return Err(refused_opcode(other)),
        }
        Ok(())
    }

    /// Text and bytes, each length checked against the input and the text budget.
    fn string_op(&mut self, op: u8) -> Step<()> {
        match op {
            0x8c => {
                let n = self.u8()?;
                let t = self.text(n.into())?;
                self.make(Value::Text(t))?
            }
            b'X' => {
                let n = self.u32()?;
                let t = self.text(n.into())?;
                self.make(Value::Text(t))?
            }
            0x8d => {
                let n = u64::from_le_bytes(self.array()?);
                let t = self.text(n)?;
                self.make(Value::Text(t))?
            }
            b'C' => {
                let n = self.u8()?;
                let b = self.raw_bytes(n.into())?;
                self.make(Value::Bytes(b))?
            }
            b'B' => {
                let n = self.u32()?;
                let b = self.raw_bytes(n.into())?;
                self.make(Value::Bytes(b))?
            }
            0x8e => {
                let n = u64::from_le_bytes(self.array()?);
                let b = self.raw_bytes(n)?;
                self.make(Value::Bytes(b))?
            }
            // `step` sends no other opcode here.
            other => return Err(refused_opcode(other)),
        }
        Ok(())
    }

    /// Tuples, lists and dicts: made empty or from the stack, or filled by `APPEND`, `SETITEM`.
    fn container_op(&mut self, op: u8) -> Step<()> {
        match op {
            b'}' => self.make(Value::Dict(Vec::new()))?,
            b']' => self.make(Value::List(Vec::new()))?,
            b')' => self.make(Value::Tuple(Box::new([])))?,
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let mut items = vec![ObjId(0); n];
                for slot in items.iter_mut().rev() {
                    *slot = self.pop()?;
                }
                self.make(Value::Tuple(items.into()))?
            }
            b't' => {
                let items = self.pop_mark()?;
                self.make(Value::Tuple(items.into()))?
            }
            b'l' => {
                let items = self.pop_mark()?;
                self.make(Value::List(items))?
            }
            b'd' => {
                let items = self.pop_mark()?;
                let pairs = self.pairs(items)?;
                self.make(Value::Dict(pairs))?
            }
            b'a' => {
                let v = self.pop()?;
                self.extend(vec![v])?
            }
            b'e' => {
                let items = self.pop_mark()?;
                self.extend(items)?
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.set_items(vec![k, v])?
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.set_items(items)?
            }
            // `step` sends no other opcode here.
            other => return Err(refused_opcode(other)),
        }
        Ok(())
    }

    /// Globals, calls (`REDUCE`, `NEWOBJ`), `BUILD` and persistent ids; nothing is run.
    fn object_op(&mut self, op: u8) -> Step<()> {
        match op {
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                let c = resolve(&module, &name)?;
                self.make(Value::Global(Box::new(c)))?
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Some(Value::Text(m)), Some(Value::Text(n))) = (
                    self.values.get(module.0 as usize),
                    self.values.get(name.0 as usize),
                ) else {
                    return Err("STACK_GLOBAL of values that are not text".into());
                };
                if m.len() > MAX_GLOBAL_LEN || n.len() > MAX_GLOBAL_LEN {
                    return Err("STACK_GLOBAL name too long".into());
                }
                let c = resolve(m, n)?;
                self.make(Value::Global(Box::new(c)))?
            }
            b'R' | 0x81 => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = self.call(callable, args)?;
                match v {
                    Made::New(v) => self.make(v)?,
                    Made::Same(id) => self.push(id)?,
                }
            }
            b'b' => {
                let _state = self.pop()?;
                let obj = self.top()?;
                // The state of an OrderedDict (`_metadata`), a numpy scalar or a tensor
                // subclass is not needed; on anything else BUILD means a checkpoint we do not
                // know.
                match self.values.get(obj.0 as usize) {
                    Some(Value::Dict(_) | Value::Opaque(_) | Value::Tensor(_)) => {}
                    _ => return Err(format!("BUILD on {}", self.describe(obj))),
                }
            }
            b'Q' => {
                let pid = self.pop()?;
                let s = self.persistent(pid)?;
                self.make(Value::Storage(Box::new(s)))?
            }
            // `step` sends no other opcode here.
            other => return Err(refused_opcode(other)),
        }
        Ok(())
    }

    fn pairs(&self, items: Vec<ObjId>) -> Step<Vec<(ObjId, ObjId)>> {
        if !items.len().is_multiple_of(2) {
            return Err(format!(
                "{} items for a dict: not key-value pairs",
                items.len()
            ));
        }
        Ok(items.chunks_exact(2).map(|p| (p[0], p[1])).collect())
    }

    fn extend(&mut self, items: Vec<ObjId>) -> Step<()> {
        let target = self.top()?;
        let what = self.describe(target);
        match self.values.get_mut(target.0 as usize) {
            Some(Value::List(l)) => {
                l.extend(items);
                Ok(())
            }
            _ => Err(format!("APPEND to {what}")),
        }
    }

    fn set_items(&mut self, items: Vec<ObjId>) -> Step<()> {
        let pairs = self.pairs(items)?;
        let target = self.top()?;
        let what = self.describe(target);
        match self.values.get_mut(target.0 as usize) {
            Some(Value::Dict(d)) => {
                d.extend(pairs);
                Ok(())
            }
            _ => Err(format!("SETITEM on {what}")),
        }
    }

    fn tuple(&self, id: ObjId) -> Option<&[ObjId]> {
        match self.values.get(id.0 as usize) {
            Some(Value::Tuple(t)) => Some(t),
            _ => None,
        }
    }

    fn int(&self, id: ObjId) -> Option<i64> {
        match self.values.get(id.0 as usize) {
            Some(Value::Int(i)) => Some(*i),
            _ => None,
        }
    }

    /// `('storage', torch.XStorage, key, location, numel)`.
    fn persistent(&self, pid: ObjId) -> Step<Storage> {
        let t = self
            .tuple(pid)
            .ok_or_else(|| format!("persistent id {}: not a tuple", self.describe(pid)))?;
        let [tag, class, key, _location, numel] = *t else {
            return Err(format!(
                "persistent id of {} items: torch.save writes 5 ('storage', class, key, location, size)",
                t.len()
            ));
        };
        let text = |id: ObjId| match self.values.get(id.0 as usize) {
            Some(Value::Text(s)) => Some(&**s),
            _ => None,
        };
        if text(tag) != Some("storage") {
            return Err(format!(
                "persistent id tagged {}, not 'storage'",
                self.describe(tag)
            ));
        }
        let Some(Value::Global(g)) = self.values.get(class.0 as usize) else {
            return Err(format!("storage of class {}", self.describe(class)));
        };
        let Callable::StorageClass(dtype) = **g else {
            return Err(format!("storage of class {g:?}: not a torch storage"));
        };
        let key = text(key)
            .filter(|k| {
                !k.is_empty()
                    && k.len() <= 64
                    && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            })
            .ok_or_else(|| format!("storage key {}: not a plain name", self.describe(key)))?;
        let numel = self
            .int(numel)
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| format!("storage {key} of size {}", self.describe(numel)))?;
        Ok(Storage {
            dtype,
            key: key.to_string(),
            numel,
        })
    }

    /// A tuple of non-negative ints (a size or a stride).
    fn dims(&self, id: ObjId, what: &str) -> Step<Vec<u64>> {
        let t = self
            .tuple(id)
            .ok_or_else(|| format!("tensor {what} is {}, not a tuple", self.describe(id)))?;
        if t.len() > MAX_RANK {
            return Err(format!(
                "tensor of {} dimensions (at most {MAX_RANK})",
                t.len()
            ));
        }
        t.iter()
            .map(|&d| {
                self.int(d)
                    .and_then(|n| u64::try_from(n).ok())
                    .ok_or_else(|| format!("tensor {what} holds {}", self.describe(d)))
            })
            .collect()
    }

    /// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])`.
    fn tensor(&self, args: &[ObjId]) -> Step<TensorRef> {
        if !(6..=7).contains(&args.len()) {
            return Err(format!("_rebuild_tensor_v2 with {} arguments: torch.save writes 6 or 7 (storage, offset, size, stride, requires_grad, hooks[, metadata])", args.len()));
        }
        let Some(Value::Storage(s)) = self.values.get(args[0].0 as usize) else {
            return Err(format!(
                "_rebuild_tensor_v2 of {}, not a storage",
                self.describe(args[0])
            ));
        };
        let offset = self
            .int(args[1])
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| format!("tensor offset {}", self.describe(args[1])))?;
        let shape = self.dims(args[2], "size")?;
        let strides = self.dims(args[3], "stride")?;
        if strides.len() != shape.len() {
            return Err(format!(
                "tensor of {} sizes and {} strides",
                shape.len(),
                strides.len()
            ));
        }
        Ok(TensorRef {
            storage: (**s).clone(),
            offset,
            shape,
            strides,
        })
    }

    /// What REDUCE or NEWOBJ makes of `callable(*args)`; nothing is run.
    fn call(&self, callable: ObjId, args: ObjId) -> Step<Made> {
        let Some(Value::Global(c)) = self.values.get(callable.0 as usize) else {
            return Err(format!("calls {}, not a global", self.describe(callable)));
        };
        let a = self
            .tuple(args)
            .ok_or_else(|| format!("calls {c:?} with {}, not a tuple", self.describe(args)))?;
        Ok(match &**c {
            Callable::OrderedDict if a.is_empty() => Made::New(Value::Dict(Vec::new())),
            Callable::OrderedDict => return Err("OrderedDict built from arguments".into()),
            Callable::RebuildTensor => Made::New(Value::Tensor(Box::new(self.tensor(a)?))),
            Callable::RebuildParameter => match a.first() {
                Some(&t) if matches!(self.values.get(t.0 as usize), Some(Value::Tensor(_))) => {
                    Made::Same(t)
                }
                _ => return Err("_rebuild_parameter without a tensor".into()),
            },
            Callable::RebuildFromType => {
                // (func, type, args, state): the tensor is func(*args).
                let [func, _, inner, _] = *a else {
                    return Err(format!(
                        "_rebuild_from_type_v2 with {} arguments, not 4",
                        a.len()
                    ));
                };
                match self.values.get(func.0 as usize) {
                    Some(Value::Global(f)) if **f == Callable::RebuildTensor => {
                        let inner = self
                            .tuple(inner)
                            .ok_or("_rebuild_from_type_v2 without argument tuple")?;
                        Made::New(Value::Tensor(Box::new(self.tensor(inner)?)))
                    }
                    _ => return Err(format!("_rebuild_from_type_v2 of {}", self.describe(func))),
                }
            }
            Callable::StorageClass(d) => {
                return Err(format!("calls the storage class {}", d.storage_name()))
            }
            Callable::Inert(name) => Made::New(Value::Opaque(name.as_str().into())),
        })
    }
}

/// What a call made: a new value, or one of its arguments.
enum Made {
    New(Value),
    Same(ObjId),
}
