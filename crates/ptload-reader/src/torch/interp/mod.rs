//! The interpreter behind the pickle VM for torch files: globals, calls,
//! BUILD and persistent ids, each handed to the module that knows it.

mod numpy;
mod rebuild;
mod storage;

pub(crate) use storage::PendingStorage;

use std::hash::BuildHasher;

use super::dtype::DType;
use super::policy::{always_blocked, torch_allows, Policy};
use super::{
    describe, Global, Known, Layout, NdArray, NumpyDtype, QuantParams, TensorMeta, TorchHeap,
    TorchObj,
};
use crate::advice::Hint;
use crate::error::{Error, ErrorKind, Result};
use crate::pickle::{Heap, Interpreter, Obj, Object, Tag, Value};

/// A global as it appeared in a pickle.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GlobalRef {
    /// The module part (`torch._utils`).
    pub module: String,
    /// The name part (`_rebuild_tensor_v2`).
    pub name: String,
    /// The record (or legacy section) where it first appears.
    pub record: String,
    /// Byte offset of its first appearance in that record.
    pub offset: u64,
    /// Whether torch's `weights_only=True` allowlist admits it.
    pub torch_allowed: bool,
    /// Whether a REDUCE called it (it is used as a function).
    pub called: bool,
    /// Whether NEWOBJ, INST or OBJ instantiated it (it is used as a class).
    pub instantiated: bool,
}

impl GlobalRef {
    /// `module.name`.
    pub fn path(&self) -> String {
        format!("{}.{}", self.module, self.name)
    }
}

pub(crate) struct TorchInterp<'p> {
    pub(crate) storages: Vec<PendingStorage>,
    /// Storage ids by key, one table per storage folder (`data/`,
    /// `constants/`; one for legacy files).
    namespaces: Vec<(Option<String>, hashbrown::HashTable<usize>)>,
    hasher: hashbrown::DefaultHashBuilder,
    namespace: usize,
    pub(crate) globals: Vec<GlobalRef>,
    seen: hashbrown::HashMap<(String, String, String), usize>,
    policy: Policy,
    allowed: &'p [String],
    /// The pickle record being run, for errors and the global list.
    pub(crate) record: String,
    /// Zip: the folder of storage records for this pickle (`archive/data/`).
    pub(crate) storage_dir: Option<String>,
}

fn err(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Pickle, message)
}

fn int(heap: &Heap, v: Value, what: &str) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(i),
        Value::Bool(b) => Ok(i64::from(b)),
        _ => Err(err(format!(
            "{what} must be an int, found {}",
            describe(heap, v)
        ))),
    }
}

fn float(heap: &Heap, v: Value, what: &str) -> Result<f64> {
    match v {
        Value::Float(f) => Ok(f),
        Value::Int(i) => Ok(i as f64),
        _ => Err(err(format!(
            "{what} must be a float, found {}",
            describe(heap, v)
        ))),
    }
}

/// Check that `v` is a tuple (or list) of ints, and keep it as it is.
fn int_tuple(heap: &Heap, v: Value, what: &str) -> Result<Value> {
    let items = heap.sequence(v).ok_or_else(|| {
        err(format!(
            "{what} must be a tuple, found {}",
            describe(heap, v)
        ))
    })?;
    heap.charge_work(items.len() as u64)?;
    if let Some(&bad) = items.iter().find(|i| !matches!(i, Value::Int(_))) {
        return Err(err(format!(
            "{what} must hold ints, found {}",
            describe(heap, bad)
        )));
    }
    Ok(v)
}

fn truthy(v: Value) -> bool {
    match v {
        Value::Bool(b) => b,
        Value::Int(i) => i != 0,
        _ => false,
    }
}

/// Whether `v` could be called (REDUCE) or instantiated (NEWOBJ) in Python:
/// a global, or an instance of a class we keep inert (it may define
/// `__call__`). Plain values never are; Python raises TypeError.
fn could_be_callable(heap: &Heap, v: Value) -> bool {
    matches!(heap.torch(v), Some(TorchObj::Global(_)))
        || matches!(heap.get(v), Some(Obj::Object(_)))
}

fn known(heap: &Heap, v: Value) -> Option<(Known, &Global)> {
    match heap.torch(v) {
        Some(TorchObj::Global(g)) => Some((g.known, g)),
        _ => None,
    }
}

/// Arguments copied out of the heap (so the heap can be mutated while
/// they are used), inline: no call torch pickles takes more than 8.
#[derive(Debug, Clone, Copy)]
struct Args {
    items: [Value; 8],
    len: usize,
}

impl std::ops::Deref for Args {
    type Target = [Value];
    fn deref(&self) -> &[Value] {
        // `len` never exceeds the inline capacity (`copy_args` checks).
        self.items.split_at(self.len.min(self.items.len())).0
    }
}

fn copy_args(items: &[Value], what: &str) -> Result<Args> {
    let mut args = Args {
        items: [Value::None; 8],
        len: items.len(),
    };
    let slots = args
        .items
        .get_mut(..items.len())
        .ok_or_else(|| err(format!("{what} with {} items", items.len())))?;
    slots.copy_from_slice(items);
    Ok(args)
}

fn args_of(heap: &Heap, args: Value, func: &str) -> Result<Args> {
    let items = heap.tuple(args).ok_or_else(|| {
        err(format!(
            "arguments of {func} must be a tuple, found {}",
            describe(heap, args)
        ))
    })?;
    copy_args(items, func)
}

fn arity(args: &[Value], func: &str, allowed: &[usize]) -> Result<()> {
    if allowed.contains(&args.len()) {
        Ok(())
    } else {
        Err(err(format!("{func} called with {} arguments", args.len())))
    }
}

fn get(args: &[Value], i: usize) -> Value {
    args.get(i).copied().unwrap_or(Value::None)
}

impl<'p> TorchInterp<'p> {
    pub(crate) fn new(policy: Policy, allowed: &'p [String]) -> Self {
        TorchInterp {
            storages: Vec::new(),
            namespaces: vec![(None, hashbrown::HashTable::new())],
            hasher: Default::default(),
            namespace: 0,
            globals: Vec::new(),
            seen: hashbrown::HashMap::new(),
            policy,
            allowed,
            record: String::new(),
            storage_dir: None,
        }
    }

    /// Run the next pickle as `record`, its storages under `storage_dir`
    /// (zip) or in the stream after it (legacy: `None`).
    pub(crate) fn enter(&mut self, record: &str, storage_dir: Option<String>) {
        record.clone_into(&mut self.record);
        self.namespace = match self.namespaces.iter().position(|(d, _)| *d == storage_dir) {
            Some(i) => i,
            None => {
                self.namespaces
                    .push((storage_dir.clone(), hashbrown::HashTable::new()));
                self.namespaces.len() - 1
            }
        };
        self.storage_dir = storage_dir;
    }

    fn inert(&self, heap: &mut Heap, class: Value, args: Value) -> Result<Value> {
        heap.alloc(Obj::Object(Box::new(Object {
            class,
            args,
            state: None,
            items: Default::default(),
            list: Vec::new(),
        })))
    }
}

impl Interpreter for TorchInterp<'_> {
    fn global(&mut self, heap: &mut Heap, module: &str, name: &str, offset: u64) -> Result<Value> {
        // torch admits the DTensor classes once `torch.distributed.tensor`
        // is imported, as it must be to load one.
        let torch_allowed =
            torch_allows(module, name) || crate::torch::dtensor::dtensor_class(module, name);
        if self.policy == Policy::Strict && !torch_allowed {
            let path = format!("{module}.{name}");
            let user_allowed = crate::torch::policy::user_allows(self.allowed, module, name);
            if !user_allowed {
                let refused = format!(
                    "Unsupported global: GLOBAL {path} was not an allowed global by default"
                );
                if always_blocked(module) {
                    return Err(Error::new(
                        ErrorKind::UnsupportedGlobal,
                        format!("{refused}. globals of `{module}` are never allowed"),
                    ));
                }
                return Err(Error::new(ErrorKind::UnsupportedGlobal, refused)
                    .with_hint(Hint::AllowGlobals(vec![path])));
            }
        }
        let key = (module.to_owned(), name.to_owned(), self.record.clone());
        let next = self.globals.len();
        let seen = *self.seen.entry(key).or_insert(next);
        if seen == next {
            self.globals.push(GlobalRef {
                module: module.to_owned(),
                name: name.to_owned(),
                record: self.record.clone(),
                offset,
                torch_allowed,
                called: false,
                instantiated: false,
            });
        }
        heap.alloc_torch(TorchObj::Global(Global {
            module: module.into(),
            name: name.into(),
            known: Known::of(module, name),
            seen,
        }))
    }

    fn call(&mut self, heap: &mut Heap, callable: Value, args: Value) -> Result<Value> {
        if !could_be_callable(heap, callable) {
            return Err(err(format!(
                "REDUCE calls a {}, which is not callable",
                describe(heap, callable)
            )));
        }
        let Some((which, g)) = known(heap, callable) else {
            return self.inert(heap, callable, args);
        };
        if let Some(r) = self.globals.get_mut(g.seen) {
            r.called = true;
        }
        let func = which.name();
        // The constructors of plain values build them only from the
        // arguments Python would accept; anything else stays an inert
        // call (`None` below), so nothing in its arguments is dropped or
        // invented.
        let built = match which {
            Known::RebuildTensor
            | Known::RebuildTensorV2
            | Known::RebuildTensorV3
            | Known::RebuildQTensor
            | Known::RebuildMetaNoStorage
            | Known::RebuildParameter
            | Known::RebuildParameterWithState
            | Known::RebuildFromTypeV2
            | Known::RebuildSparse => {
                let a = args_of(heap, args, func)?;
                return self.rebuild(heap, which, func, &a);
            }
            Known::OrderedDict => dict(heap, callable, &args_of(heap, args, func)?)?,
            Known::Set | Known::FrozenSet => set(heap, which, &args_of(heap, args, func)?)?,
            Known::Bytearray => bytes(heap, callable, &args_of(heap, args, func)?)?,
            Known::CodecsEncode => Some(codecs_encode(heap, &args_of(heap, args, func)?, func)?),
            Known::TorchScriptWrapper => {
                let a = args_of(heap, args, func)?;
                let g = known(heap, callable).map(|(_, g)| g.name.clone());
                let tag = g.as_deref() == Some("restore_type_tag");
                match (&a[..], tag) {
                    ([list], false) if heap.sequence(*list).is_some() => Some(*list),
                    ([value, ty], true) if heap.str(*ty).is_some() => Some(*value),
                    _ => None,
                }
            }
            Known::Size => Some(size(heap, &args_of(heap, args, func)?)?),
            Known::Device => Some(device(heap, &args_of(heap, args, func)?)?),
            Known::GetLayout => {
                let a = args_of(heap, args, func)?;
                let name = heap
                    .text(get(&a, 0))
                    .ok_or_else(|| err("_get_layout needs a str"))?;
                let layout = Layout::from_name(name)
                    .ok_or_else(|| err(format!("unknown layout {name:?}")))?;
                Some(heap.alloc_torch(TorchObj::Layout(layout))?)
            }
            Known::NumpyDtype => {
                let a = args_of(heap, args, func)?;
                let descr = heap.text(get(&a, 0)).unwrap_or("?").to_owned();
                heap.charge_bytes(descr.len())?;
                let big_endian = descr.starts_with('>');
                Some(heap.alloc_torch(TorchObj::NumpyDtype(NumpyDtype {
                    descr,
                    big_endian,
                    structured: false,
                }))?)
            }
            Known::NumpyScalar => {
                let a = args_of(heap, args, func)?;
                // A scalar of a structured dtype stays the inert call it is
                // (its dtype's code alone would misread its bytes).
                if matches!(heap.torch(get(&a, 0)), Some(TorchObj::NumpyDtype(d)) if d.structured) {
                    None
                } else {
                    return self.numpy_scalar(heap, &a);
                }
            }
            Known::NumpyReconstruct => Some(heap.alloc_torch(TorchObj::NdArray(NdArray {
                dtype: "?".into(),
                shape: Vec::new(),
                descr: None,
                fortran: false,
                data: Value::None,
            }))?),
            Known::Reconstructor | Known::NewObj => {
                let a = args_of(heap, args, func)?;
                let cls = get(&a, 0);
                // No arguments after the class: it is called with none.
                let rest = heap.alloc_tuple(a.get(1..).unwrap_or(&[]))?;
                return self.new_object(heap, cls, rest);
            }
            _ => None,
        };
        match built {
            Some(v) => Ok(v),
            None => self.inert(heap, callable, args),
        }
    }

    fn new_object(&mut self, heap: &mut Heap, cls: Value, args: Value) -> Result<Value> {
        if !could_be_callable(heap, cls) {
            return Err(err(format!(
                "cannot instantiate a {}: not a class",
                describe(heap, cls)
            )));
        }
        if let Some((_, g)) = known(heap, cls) {
            if let Some(r) = self.globals.get_mut(g.seen) {
                r.instantiated = true;
            }
        }
        let ordered = known(heap, cls).is_some_and(|(_, g)| &*g.name == "OrderedDict");
        match known(heap, cls).map(|(k, _)| k) {
            Some(Known::OrderedDict) => {
                let d = heap.alloc(Obj::Dict(Default::default()))?;
                if ordered {
                    heap.tag(d, Tag::OrderedDict);
                }
                Ok(d)
            }
            Some(k @ (Known::Set | Known::FrozenSet)) => {
                let s = heap.alloc(Obj::Set(Default::default()))?;
                if k == Known::FrozenSet {
                    heap.tag(s, Tag::FrozenSet);
                }
                Ok(s)
            }
            _ => {
                let o = self.inert(heap, cls, args)?;
                heap.tag(o, Tag::NewObj);
                Ok(o)
            }
        }
    }

    fn build(&mut self, heap: &mut Heap, obj: Value, state: Value) -> Result<()> {
        // Numpy objects take their real content from BUILD.
        // Numpy's state is a tuple; any other state holds none of it.
        let numpy_state = match heap.tuple(state) {
            Some(items) => items.to_vec(),
            None => Vec::new(),
        };
        heap.charge_work(numpy_state.len() as u64)?;
        let numpy_dtype = match heap.torch(get(&numpy_state, 2)) {
            Some(TorchObj::NumpyDtype(d)) => {
                Some(d.descr.trim_start_matches(['<', '>', '=', '|']).to_owned())
            }
            _ => None,
        };
        let byteorder = heap.text(get(&numpy_state, 1)).map(str::to_owned);
        heap.charge_work(
            heap.sequence(get(&numpy_state, 1))
                .map_or(0, |s| s.len() as u64),
        )?;
        // A structured dtype's array keeps no dtype it could be built with.
        let numpy_full_dtype = match heap.torch(get(&numpy_state, 2)) {
            Some(TorchObj::NumpyDtype(d)) if !d.structured => Some((d.descr.clone(), d.big_endian)),
            _ => None,
        };
        // A dtype's state: (version, byteorder, subarray, names, fields,
        // elsize, alignment, flags[, metadata]).
        let structured = !matches!(get(&numpy_state, 2), Value::None)
            || !matches!(get(&numpy_state, 3), Value::None);
        let time_unit = time_unit(heap, get(&numpy_state, 8));
        let fortran = truthy(get(&numpy_state, 3));
        let raw = get(&numpy_state, 4);
        let shape: Option<Vec<u64>> = heap.sequence(get(&numpy_state, 1)).map(|s| {
            s.iter()
                .filter_map(|v| match v {
                    Value::Int(i) => u64::try_from(*i).ok(),
                    _ => None,
                })
                .collect()
        });
        match heap.get_mut(obj) {
            Some(Obj::Object(o)) => {
                o.state = Some(state);
                Ok(())
            }
            Some(Obj::Ext(e)) => match e.as_any_mut().downcast_mut::<TorchObj>() {
                Some(TorchObj::NumpyDtype(d)) => {
                    if let Some(order) = byteorder {
                        d.big_endian = order == ">";
                    }
                    d.structured = structured;
                    // datetime64/timedelta64 carry their unit in the state:
                    // `M8` + (b"D", 1) is `M8[D]`. One whose unit cannot be
                    // read stays unbuilt rather than lose it.
                    let code = d.descr.trim_start_matches(['<', '>', '=', '|']);
                    if code.starts_with(['M', 'm']) && !code.contains('[') {
                        match &time_unit {
                            Some(unit) if unit.is_empty() => {}
                            Some(unit) => d.descr.push_str(unit),
                            None => d.structured = true,
                        }
                    }
                    Ok(())
                }
                Some(TorchObj::NdArray(a)) => {
                    // numpy's __setstate__ refuses a state without a shape.
                    a.shape = shape.ok_or_else(|| {
                        Error::new(ErrorKind::Pickle, "numpy array state without a shape")
                    })?;
                    a.dtype = numpy_dtype.unwrap_or_else(|| "?".into());
                    a.descr = numpy_full_dtype;
                    a.fortran = fortran;
                    a.data = raw;
                    Ok(())
                }
                // Attributes set on tensors and classes: no effect on the
                // data; nothing is called.
                _ => Ok(()),
            },
            // An OrderedDict's instance attributes (torch's `_metadata`):
            // Python takes only a dict, or (dict, slot dict), as such state.
            Some(Obj::Dict(_)) => {
                let is_state = |v: Value| v == Value::None || heap.dict(v).is_some();
                let ok = is_state(state) && state != Value::None
                    || matches!(heap.tuple(state), Some(&[a, b]) if is_state(a) && is_state(b));
                if ok {
                    heap.set_dict_state(obj, state);
                    Ok(())
                } else {
                    Err(err(format!(
                        "BUILD on a dict with a {} state: state is not a dictionary",
                        describe(heap, state)
                    )))
                }
            }
            Some(other) => Err(err(format!(
                "BUILD on a {}",
                crate::pickle::kind_name_of(other)
            ))),
            None => Err(err("BUILD on a scalar")),
        }
    }

    fn persistent_load(&mut self, heap: &mut Heap, pid: Value) -> Result<Value> {
        self.load_persistent(heap, pid)
    }
}

/// A datetime64/timedelta64 dtype's unit from its pickled metadata
/// (`(None, (b"D", 1, 1, 1))`): `"[D]"`, `"[5s]"`, `""` for the generic
/// unit; `None` when it is not that shape or the unit is not one numpy has.
fn time_unit(heap: &Heap, metadata: Value) -> Option<String> {
    let outer = heap.tuple(metadata)?;
    let inner = heap.tuple(*outer.get(1)?)?;
    let unit = heap.bytes(*inner.first()?)?;
    let count = match inner.get(1)? {
        Value::Int(n) if *n >= 1 => *n,
        _ => return None,
    };
    const UNITS: &[&[u8]] = &[
        b"Y", b"M", b"W", b"D", b"h", b"m", b"s", b"ms", b"us", b"ns", b"ps", b"fs", b"as",
    ];
    if unit == b"generic" {
        return Some(String::new());
    }
    let unit = UNITS.iter().find(|u| **u == unit)?;
    let unit = std::str::from_utf8(unit).ok()?;
    Some(if count == 1 {
        format!("[{unit}]")
    } else {
        format!("[{count}{unit}]")
    })
}

/// `dict()` or `OrderedDict()`, empty or from a sequence of pairs; `None`
/// for other arguments.
fn dict(heap: &mut Heap, callable: Value, a: &[Value]) -> Result<Option<Value>> {
    heap.charge_work(
        a.first()
            .and_then(|&p| heap.sequence(p))
            .map_or(0, |items| items.len() as u64),
    )?;
    let pairs = match a {
        [] => Some(Vec::new()),
        [p] => heap.sequence(*p).and_then(|items| {
            items
                .iter()
                .map(|&pair| match heap.sequence(pair) {
                    Some(&[k, v]) => Some((k, v)),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
        }),
        _ => None,
    };
    let Some(pairs) = pairs else {
        return Ok(None);
    };
    let ordered = known(heap, callable).is_some_and(|(_, g)| &*g.name == "OrderedDict");
    let d = heap.alloc(Obj::Dict(Default::default()))?;
    if ordered {
        heap.tag(d, Tag::OrderedDict);
    }
    for (k, v) in pairs {
        heap.set_item(d, k, v)
            .map_err(|m| heap.container_error("OrderedDict item", m))?;
    }
    Ok(Some(d))
}

/// `set()` or `frozenset()`, empty or of a sequence's members; `None` for
/// other arguments.
fn set(heap: &mut Heap, which: Known, a: &[Value]) -> Result<Option<Value>> {
    let members = match a {
        [] => Some(Vec::new()),
        [l] => heap.members(*l),
        _ => None,
    };
    let Some(m) = members else {
        return Ok(None);
    };
    let s = heap.new_set_from(&m)?;
    if which == Known::FrozenSet {
        heap.tag(s, Tag::FrozenSet);
    }
    Ok(Some(s))
}

/// `bytes()` or `bytearray()`, empty or of bytes; `None` for other
/// arguments.
fn bytes(heap: &mut Heap, callable: Value, a: &[Value]) -> Result<Option<Value>> {
    let bytes = match a {
        [] => Some(Vec::new()),
        [b] => heap.bytes(*b).map(<[u8]>::to_vec),
        _ => None,
    };
    let bytearray = known(heap, callable).is_some_and(|(_, g)| &*g.name == "bytearray");
    let Some(b) = bytes else {
        return Ok(None);
    };
    let v = heap.alloc_bytes(&b)?;
    if bytearray {
        heap.tag(v, Tag::ByteArray);
    }
    Ok(Some(v))
}

/// `_codecs.encode(obj, encoding='utf-8', errors='strict')`, the way
/// protocols 0-2 pickle bytes: latin-1 or UTF-8, strict.
fn codecs_encode(heap: &mut Heap, a: &[Value], func: &str) -> Result<Value> {
    arity(a, func, &[1, 2, 3])?;
    if a.get(2).is_some_and(|&e| heap.str(e) != Some("strict")) {
        return Err(err("_codecs.encode: only errors='strict' is read"));
    }
    let text_len = heap.str(get(a, 0)).map_or(0, str::len);
    let enc_len = a.get(1).and_then(|&e| heap.str(e)).map_or(0, str::len);
    heap.charge_work((text_len + enc_len) as u64)?;
    let s = heap
        .str(get(a, 0))
        .ok_or_else(|| err("_codecs.encode needs a str"))?
        .to_owned();
    let enc = match a.get(1) {
        None => "utf-8".to_owned(),
        Some(&e) => heap
            .str(e)
            .ok_or_else(|| err("_codecs.encode: the encoding must be a str"))?
            .to_ascii_lowercase(),
    };
    let bytes: Vec<u8> = match enc.as_str() {
        "latin1" | "latin-1" | "iso-8859-1" | "iso8859-1" => s
            .chars()
            .map(|c| {
                u8::try_from(u32::from(c)).map_err(|_| {
                    err("_codecs.encode: a character outside latin-1 (UnicodeEncodeError in Python)")
                })
            })
            .collect::<Result<_>>()?,
        "utf-8" | "utf8" => s.into_bytes(),
        other => {
            return Err(err(format!(
                "_codecs.encode with unsupported encoding {other:?}"
            )))
        }
    };
    heap.alloc_bytes(&bytes)
}

/// `torch.Size()` is empty; `torch.Size(seq)` holds seq's items.
fn size(heap: &mut Heap, a: &[Value]) -> Result<Value> {
    let items = match a.first() {
        None => Vec::new(),
        Some(&t) => heap
            .sequence(t)
            .ok_or_else(|| err("torch.Size needs a sequence"))?
            .to_vec(),
    };
    let size = heap.alloc_tuple(&items)?;
    heap.tag(size, Tag::Size);
    Ok(size)
}

/// `torch.device(kind)` or `torch.device(kind, index)`.
fn device(heap: &mut Heap, a: &[Value]) -> Result<Value> {
    let kind = heap
        .text(get(a, 0))
        .ok_or_else(|| err("torch.device needs a str"))?
        .to_owned();
    heap.charge_bytes(kind.len())?;
    let text = match get(a, 1) {
        Value::Int(i) => format!("{kind}:{i}"),
        _ => kind,
    };
    heap.alloc_torch(TorchObj::Device(text.into()))
}
