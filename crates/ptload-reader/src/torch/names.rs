//! The flattening walk: names every tensor and plain value in the pickled
//! object graph.
//!
//! Convention: dict keys and sequence indices joined with `.`; a pickled
//! `nn.Module` yields exactly its `state_dict()` names (parameters, then
//! persistent buffers, then children); TorchScript modules and other objects
//! are named by attribute path. The walk is iterative (no recursion however
//! deep the graph), skips cycles, and charges every step against
//! `Limits::max_walk_steps`, so shared references cannot explode it.

use hashbrown::HashSet;

use super::{Known, QuantParams, TorchHeap, TorchObj};
use crate::advice::Warning;
use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::name_index::NameIndex;
use crate::pickle::{Heap, Obj, ObjId, Tag, Value};

/// A heap value whose accessor disagrees with its kind: never made by the
/// VM, but an error rather than an empty value if it were.
fn mismatch(v: Value) -> Error {
    Error::new(
        ErrorKind::Pickle,
        format!("heap value {v:?} does not hold what its kind says"),
    )
}

/// A non-tensor value of the checkpoint, named by the flattening convention.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Scalar {
    /// `None`
    None,
    /// A bool.
    Bool(bool),
    /// An int that fits in i64.
    Int(i64),
    /// An int beyond i64, as little-endian two's complement bytes.
    BigInt(Vec<u8>),
    /// A float.
    Float(f64),
    /// A str.
    Str(String),
    /// Bytes.
    Bytes(Vec<u8>),
    /// A `torch.device`, e.g. `cuda:0`.
    Device(String),
    /// A reference to a class or function (`module.name`), including dtypes.
    Global(String),
    /// A numpy array (kept as a value, not a tensor): dtype and shape.
    Array {
        /// numpy dtype code, e.g. `i8`.
        dtype: String,
        /// Shape.
        shape: Vec<u64>,
    },
    /// An instance of a class the reader keeps inert, with nothing inside
    /// to name (e.g. an empty object).
    Object(String),
}

/// What the walk found.
#[derive(Default)]
pub(crate) struct Walked {
    pub(crate) tensors: Vec<(String, Value)>,
    pub(crate) values: Vec<(String, Scalar)>,
    /// For each value found inside a call record (an object the file asks
    /// to make by calling a global with arguments, `callable(*args)`, not
    /// by constructing a class): its index in `values` and the callable's
    /// index in `callables`, in value order.
    pub(crate) value_calls: Vec<(usize, usize)>,
    /// The callables of `value_calls`, as `module.name`.
    pub(crate) callables: Vec<String>,
    pub(crate) warnings: Vec<Warning>,
    /// Indices into `tensors`, by name.
    pub(crate) by_name: NameIndex,
    /// Steps the walk took.
    pub(crate) steps: u64,
}

/// Name everything under `roots`. A name collision is an error that names
/// both paths (found by walking again up to the first of the two).
/// `tensors_hint` is how many tensors to make room for (a count of things
/// already made, such as storages: never a number read from the file).
pub(crate) fn walk_all(
    heap: &Heap,
    roots: &[(Value, &'static str)],
    limits: &Limits,
    tensors_hint: usize,
    rename_duplicates: bool,
) -> Result<Walked> {
    let mut walker = Walker::new(heap, limits);
    walker.rename_duplicates = rename_duplicates;
    walker.out.tensors.reserve(tensors_hint);
    // The index is empty: nothing to look up while it grows.
    walker.by_name.reserve(tensors_hint, |_| None);
    for &(root, prefix) in roots {
        if let Err(e) = walker.walk(root, prefix) {
            let Some(dup) = walker.duplicate.take() else {
                return Err(e);
            };
            let mut again = Walker::new(heap, limits);
            again.rename_duplicates = rename_duplicates;
            again.capture = Some(dup.first);
            for &(root, prefix) in roots {
                if again.walk(root, prefix).is_err() || again.captured.is_some() {
                    break;
                }
            }
            let first = again.captured.unwrap_or_else(|| "an earlier path".into());
            return Err(Error::new(
                ErrorKind::DuplicateName,
                format!(
                    "two tensors flatten to the name '{}': {first} and {}; \
                     the reader refuses the file rather than pick one",
                    dup.name, dup.path
                ),
            ));
        }
    }
    Ok(walker.finish())
}

/// A name collision: the tensor at `first` and the one at `path` share `name`.
#[derive(Debug)]
struct Duplicate {
    first: usize,
    name: String,
    path: String,
}

/// One step of a name: a dict key or attribute, an index, or a fixed word.
#[derive(Debug, Clone, Copy)]
enum Seg {
    Key(Value),
    Index(usize),
    Word(&'static str),
}

enum Frame {
    /// Visit `value` as the child `seg` of the node whose path has `depth` segments.
    Enter {
        value: Value,
        seg: Option<Seg>,
        depth: usize,
        in_module: bool,
        /// The innermost call record around `value` (an index into
        /// `Walked::callables`).
        call: Option<usize>,
    },
    Leave(ObjId),
}

/// Append dict key `key` as it appears in a name to `out`: tuples as
/// `(a, b)`, nested to any depth without recursion. Fails once `out` would
/// grow past `budget` bytes (a tuple key can nest 100,000 deep, or repeat
/// one long member through memo references).
fn key_text(heap: &Heap, key: Value, budget: usize, out: &mut String) -> Result<(), ()> {
    enum Tok {
        Val(Value),
        Text(&'static str),
    }
    let mut todo = vec![Tok::Val(key)];
    while let Some(tok) = todo.pop() {
        let text: std::borrow::Cow<'_, str> = match tok {
            Tok::Text(t) => t.into(),
            Tok::Val(v) => match v {
                Value::None => "None".into(),
                Value::Bool(true) => "True".into(),
                Value::Bool(false) => "False".into(),
                Value::Int(i) => i.to_string().into(),
                Value::Float(f) => format!("{f:?}").into(),
                Value::Obj(_) => match (heap.get(v), heap.str(v), heap.bytes(v), heap.tuple(v)) {
                    (_, Some(s), ..) => s.into(),
                    (_, _, Some(b), _) => String::from_utf8_lossy(b),
                    (_, _, _, Some(items)) => {
                        // Pushed in reverse: "(", a, ", ", b, ")".
                        todo.push(Tok::Text(")"));
                        for (i, &item) in items.iter().enumerate().rev() {
                            todo.push(Tok::Val(item));
                            if i > 0 {
                                todo.push(Tok::Text(", "));
                            }
                        }
                        "(".into()
                    }
                    (Some(other), ..) => format!("<{}>", crate::pickle::kind_name_of(other)).into(),
                    (None, ..) => "?".into(),
                },
            },
        };
        if out.len().saturating_add(text.len()) > budget {
            return Err(());
        }
        out.push_str(&text);
    }
    Ok(())
}

/// A path as Python subscripts (`['a']['b'][0]`), for errors.
fn python_path(heap: &Heap, path: &[Seg], extra: Option<&str>) -> String {
    const MAX: usize = 400;
    let mut out = String::new();
    for seg in path {
        match *seg {
            Seg::Key(k) => {
                let mut text = String::new();
                let complete = key_text(heap, k, MAX, &mut text).is_ok();
                let quote = if heap.text(k).is_some() { "'" } else { "" };
                out.push('[');
                out.push_str(quote);
                out.push_str(&text);
                if !complete {
                    out.push_str("...");
                }
                out.push_str(quote);
                out.push(']');
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
            Seg::Word(w) => out.push_str(&format!("<{w}>")),
        }
        if out.len() > MAX {
            out.push_str("...");
            break;
        }
    }
    if let Some(extra) = extra {
        out.push_str(&format!(" ({extra})"));
    }
    out
}

/// A TorchScript class of torch's quantized convolutions (plain, transposed
/// or fused with ReLU/add), whatever mangling the archive added:
/// `__torch__.torch.ao.nn.quantized.modules.conv.___torch_mangle_1.Conv2d`.
fn quantized_conv(class: &str) -> bool {
    let Some(path) = class.strip_prefix("__torch__.torch.") else {
        return false;
    };
    let mut parts = path
        .split('.')
        .filter(|p| !p.starts_with("___torch_mangle_"));
    let Some(name) = parts.next_back() else {
        return false;
    };
    let module: Vec<&str> = parts.collect();
    let module = module.join(".");
    let known_module = [
        "ao.nn.quantized.modules.conv",
        "nn.quantized.modules.conv",
        "ao.nn.intrinsic.quantized.modules.conv_relu",
        "nn.intrinsic.quantized.modules.conv_relu",
        "ao.nn.intrinsic.quantized.modules.conv_add",
    ]
    .contains(&module.as_str());
    known_module && name.starts_with("Conv")
}

fn global_path(heap: &Heap, v: Value) -> Option<String> {
    match heap.torch(v) {
        Some(TorchObj::Global(g)) => Some(format!("{}.{}", g.module, g.name)),
        _ => None,
    }
}

pub(crate) struct Walker<'h> {
    heap: &'h Heap,
    max_steps: u64,
    steps: u64,
    /// Bytes of names built; a name is as long as its path, so shared
    /// references under long keys could otherwise make them explode.
    name_bytes: u64,
    max_name_bytes: u64,
    /// Containers expanded more than once (reached by another path).
    expanded: HashSet<ObjId>,
    shared_visits: u64,
    max_shared_visits: u64,
    on_path: HashSet<ObjId>,
    /// Indices into `out.tensors`, by name: names must be unique.
    by_name: NameIndex,
    /// When set, the Python path of the tensor emitted at this index is
    /// kept in `captured` (to explain a name collision).
    capture: Option<usize>,
    captured: Option<String>,
    /// Set when the walk stopped at a name collision.
    duplicate: Option<Duplicate>,
    /// Name a tensor whose flattened name is taken by its Python path
    /// instead of stopping (the caller reaches tensors through the object).
    rename_duplicates: bool,
    /// The current node's name, as segments; strings are only built for
    /// what is emitted, so walking a node costs no allocation.
    path: Vec<Seg>,
    children: Vec<(Option<Seg>, Value, bool)>,
    /// The innermost call record around the node being visited.
    call: Option<usize>,
    out: Walked,
}

impl<'h> Walker<'h> {
    pub(crate) fn new(heap: &'h Heap, limits: &Limits) -> Self {
        Walker {
            heap,
            max_steps: limits.max_walk_steps,
            steps: 0,
            name_bytes: 0,
            max_name_bytes: limits.max_name_bytes,
            expanded: HashSet::new(),
            shared_visits: 0,
            max_shared_visits: limits.max_shared_visits,
            on_path: HashSet::new(),
            by_name: NameIndex::default(),
            capture: None,
            captured: None,
            duplicate: None,
            rename_duplicates: false,
            path: Vec::new(),
            children: Vec::new(),
            call: None,
            out: Walked::default(),
        }
    }

    pub(crate) fn finish(mut self) -> Walked {
        self.out.by_name = self.by_name;
        self.out.steps = self.steps;
        self.out
    }

    /// The current path joined with `.`, plus `extra` when given, charged
    /// against `max_name_bytes`.
    fn name(&mut self, extra: Option<&'static str>) -> Result<String> {
        let mut name = String::new();
        let budget = usize::try_from(self.max_name_bytes.saturating_sub(self.name_bytes))
            .unwrap_or(usize::MAX);
        let over = || Error::limit("max_name_bytes", self.max_name_bytes);
        let extra = extra.map(Seg::Word);
        for seg in self.path.iter().chain(extra.as_ref()) {
            if !name.is_empty() {
                name.push('.');
            }
            match *seg {
                Seg::Key(k) => key_text(self.heap, k, budget, &mut name).map_err(|()| over())?,
                Seg::Index(i) => name.push_str(&i.to_string()),
                Seg::Word(w) => name.push_str(w),
            }
            if name.len() > budget {
                return Err(over());
            }
        }
        self.name_bytes = self.name_bytes.saturating_add(name.len() as u64);
        Ok(name)
    }

    /// Emit the value `make` builds, unless inside a module (whose state
    /// dict holds tensors only): built only when kept.
    fn value(&mut self, in_module: bool, make: impl FnOnce() -> Scalar) -> Result<()> {
        if !in_module {
            let scalar = make();
            let name = self.name(None)?;
            // A value is copied out once per path that reaches it: charged
            // with the names, or one long string referenced many times would
            // be copied without bound.
            let copied = match &scalar {
                Scalar::Str(s) => s.len(),
                Scalar::Bytes(b) | Scalar::BigInt(b) => b.len(),
                _ => 0,
            };
            self.name_bytes = self.name_bytes.saturating_add(copied as u64);
            if self.name_bytes > self.max_name_bytes {
                return Err(Error::limit("max_name_bytes", self.max_name_bytes));
            }
            if let Some(call) = self.call {
                self.out.value_calls.push((self.out.values.len(), call));
            }
            self.out.values.push((name, scalar));
        }
        Ok(())
    }

    /// Name the tensor `value` by the current path (plus `extra`); two
    /// tensors may not share a name.
    fn tensor(&mut self, extra: Option<&'static str>, value: Value) -> Result<()> {
        let name = self.name(extra)?;
        let index = self.out.tensors.len();
        if self.capture == Some(index) {
            self.captured = Some(python_path(self.heap, &self.path, extra));
            // The walk that captures stops here: nothing after matters.
            return Err(Error::new(ErrorKind::DuplicateName, name));
        }
        let mut name = name;
        let mut hash = self.by_name.hash(name.as_str());
        let taken = |walker: &Self, hash: u64, name: &str| {
            let tensors = &walker.out.tensors;
            walker.by_name.find_hashed(hash, name, |i| {
                tensors.get(i as usize).map(|(n, _)| n.as_str())
            })
        };
        if self.rename_duplicates && taken(self, hash, &name).is_some() {
            // `['a.b']` and `['a']['b']` both flatten to `a.b`: the later
            // one is named by its Python path, charged as names are.
            let path = python_path(self.heap, &self.path, extra);
            self.name_bytes = self.name_bytes.saturating_add(path.len() as u64);
            if self.name_bytes > self.max_name_bytes {
                return Err(Error::limit("max_name_bytes", self.max_name_bytes));
            }
            hash = self.by_name.hash(path.as_str());
            name = path;
        }
        if let Some(first) = taken(self, hash, &name) {
            let path = python_path(self.heap, &self.path, extra);
            let message =
                format!("two tensors flatten to the name '{name}'; the second is at {path}");
            self.duplicate = Some(Duplicate {
                first: first as usize,
                name,
                path,
            });
            return Err(Error::new(ErrorKind::DuplicateName, message));
        }
        let i =
            u32::try_from(index).map_err(|_| Error::limit("max_tensors", u64::from(u32::MAX)))?;
        let tensors = &self.out.tensors;
        self.by_name.insert_hashed(hash, i, |j| {
            tensors.get(j as usize).map(|(n, _)| n.as_str())
        });
        self.out.tensors.push((name, value));
        Ok(())
    }

    /// Walk `root`, naming everything under `prefix`.
    pub(crate) fn walk(&mut self, root: Value, prefix: &'static str) -> Result<()> {
        let mut stack = vec![Frame::Enter {
            value: root,
            seg: (!prefix.is_empty()).then_some(Seg::Word(prefix)),
            depth: 0,
            in_module: false,
            call: None,
        }];
        while let Some(frame) = stack.pop() {
            self.steps += 1;
            if self.steps > self.max_steps {
                return Err(Error::limit("max_walk_steps", self.max_steps));
            }
            let (value, in_module) = match frame {
                Frame::Leave(id) => {
                    self.on_path.remove(&id);
                    continue;
                }
                Frame::Enter {
                    value,
                    seg,
                    depth,
                    in_module,
                    call,
                } => {
                    self.path.truncate(depth);
                    self.path.extend(seg);
                    self.call = call;
                    (value, in_module)
                }
            };
            let Some(id) = self.inline(value, in_module)? else {
                continue;
            };
            if self.on_path.contains(&id) {
                continue;
            }
            self.children.clear();
            self.visit(value, in_module)?;
            if !self.children.is_empty() {
                self.descend(id, &mut stack)?;
            }
        }
        Ok(())
    }

    /// Emit a value held inline (None, a bool, a number); `Some(id)` for
    /// one on the heap, which the walk visits.
    fn inline(&mut self, value: Value, in_module: bool) -> Result<Option<ObjId>> {
        match value {
            Value::None => self.value(in_module, || Scalar::None)?,
            Value::Bool(b) => self.value(in_module, || Scalar::Bool(b))?,
            Value::Int(i) => self.value(in_module, || Scalar::Int(i))?,
            Value::Float(f) => self.value(in_module, || Scalar::Float(f))?,
            Value::Obj(id) => return Ok(Some(id)),
        }
        Ok(None)
    }

    /// Name the heap value `value` (a string, a tensor...), or collect its
    /// children in `self.children`, in order.
    fn visit(&mut self, value: Value, in_module: bool) -> Result<()> {
        let heap = self.heap;
        match heap.get(value) {
            None => {}
            Some(Obj::Str(_)) => {
                let s = heap.str(value).ok_or_else(|| mismatch(value))?;
                self.value(in_module, || Scalar::Str(s.to_owned()))?
            }
            Some(Obj::Bytes(_)) => {
                let b = heap.bytes(value).ok_or_else(|| mismatch(value))?;
                self.value(in_module, || Scalar::Bytes(b.to_vec()))?
            }
            Some(Obj::BigInt(_)) => {
                let b = heap.bigint(value).ok_or_else(|| mismatch(value))?;
                self.value(in_module, || Scalar::BigInt(b.to_vec()))?
            }
            Some(Obj::Tuple(_) | Obj::List(_) | Obj::Set(_)) => {
                let members = heap.members(value).ok_or_else(|| mismatch(value))?;
                for (i, v) in members.into_iter().enumerate() {
                    self.children.push((Some(Seg::Index(i)), v, in_module));
                }
            }
            Some(Obj::Dict(d)) => {
                for &(k, v) in d.entries() {
                    self.children.push((Some(Seg::Key(k)), v, in_module));
                }
            }
            Some(Obj::Object(o)) => {
                let state = o.state.and_then(|s| heap.dict(s));
                if let Some(state) = state.filter(|s| {
                    s.get_str(heap, "_parameters").is_some()
                        && s.get_str(heap, "_modules").is_some()
                }) {
                    self.module_children(state);
                } else {
                    self.object(o, value, in_module)?;
                }
            }
            Some(Obj::Ext(e)) => {
                if let Some(t) = e.as_any().downcast_ref::<TorchObj>() {
                    self.torch_obj(t, value, in_module)?;
                }
            }
        }
        Ok(())
    }

    /// An object other than a module: named by attribute (its state, its
    /// arguments when it has no state, its items); an object with nothing
    /// inside is a value naming its class.
    fn object(&mut self, o: &crate::pickle::Object, value: Value, in_module: bool) -> Result<()> {
        let heap = self.heap;
        let class = global_path(heap, o.class).unwrap_or_else(|| "?".into());
        let inside = in_module || class.starts_with("__torch__.");
        // Made by calling `class` (REDUCE), not by constructing it: what it
        // holds are the call's arguments and what was set on its result.
        if heap.tag_of(value) != Some(Tag::NewObj) && !inside {
            self.call = Some(self.out.callables.len());
            self.out.callables.push(class.clone());
        }
        if let Some(state) = o.state {
            match heap.tuple(state) {
                // (state, slotstate) from __reduce_ex__.
                Some([a, b]) if heap.dict(*a).is_some() || heap.dict(*b).is_some() => {
                    // Either part may be None instead of a dict.
                    for d in [*a, *b].into_iter().filter_map(|p| heap.dict(p)) {
                        for &(k, v) in d.entries() {
                            self.children.push((Some(Seg::Key(k)), v, inside));
                        }
                    }
                }
                // A quantized convolution's __getstate__: its weight
                // and bias by the names its eager state_dict() uses.
                Some(items) if items.len() == 15 && quantized_conv(&class) => {
                    for (i, word) in [(10, "weight"), (11, "bias")] {
                        if let Some(&v) = items.get(i) {
                            self.children.push((Some(Seg::Word(word)), v, inside));
                        }
                    }
                }
                _ => match heap.dict(state) {
                    Some(d) => {
                        for &(k, v) in d.entries() {
                            self.children.push((Some(Seg::Key(k)), v, inside));
                        }
                    }
                    None => self.children.push((None, state, inside)),
                },
            }
        } else if let Some(args) = heap.tuple(o.args).filter(|a| !a.is_empty()) {
            for (i, &v) in args.iter().enumerate() {
                self.children.push((Some(Seg::Index(i)), v, inside));
            }
        }
        for &(k, v) in o.items.entries() {
            self.children.push((Some(Seg::Key(k)), v, inside));
        }
        for (i, &v) in o.list.iter().enumerate() {
            self.children.push((Some(Seg::Index(i)), v, inside));
        }
        if class.starts_with("torch._utils._rebuild_") {
            let name = self.name(None)?;
            self.out.warnings.push(Warning::NotRead {
                name,
                rebuild: class.to_owned(),
            });
            self.children.clear();
        } else if self.children.is_empty() {
            self.value(in_module, || Scalar::Object(class))?;
        }
        Ok(())
    }

    /// What the torch layer made: tensors and storages are named, wrappers
    /// are named as what they hold, the rest are values.
    fn torch_obj(&mut self, t: &TorchObj, value: Value, in_module: bool) -> Result<()> {
        match t {
            TorchObj::Tensor(meta) => {
                self.tensor(None, value)?;
                if let Some(QuantParams::PerChannel {
                    scales,
                    zero_points,
                    ..
                }) = &meta.quant
                {
                    let (scales, zero_points) = (*scales, *zero_points);
                    self.tensor(Some("scales"), scales)?;
                    self.tensor(Some("zero_points"), zero_points)?;
                }
            }
            TorchObj::Storage { .. } => self.tensor(None, value)?,
            // Transparent: named as what they hold.
            TorchObj::Parameter { data: inner, .. }
            | TorchObj::NumpyScalar { value: inner, .. } => {
                self.children.push((None, *inner, in_module));
            }
            TorchObj::Sparse {
                layout, components, ..
            } => {
                for (part, &v) in layout.components().iter().zip(components) {
                    self.tensor(Some(part), v)?;
                }
            }
            TorchObj::Global(g) => {
                let text = match g.known {
                    Known::Dtype(d) => format!("torch.{}", d.name()),
                    _ => format!("{}.{}", g.module, g.name),
                };
                self.value(in_module, || Scalar::Global(text))?;
            }
            TorchObj::Device(d) => self.value(in_module, || Scalar::Device(d.to_string()))?,
            TorchObj::Layout(l) => {
                self.value(in_module, || Scalar::Global(format!("torch.{l:?}")))?
            }
            TorchObj::NumpyDtype(d) => self.value(in_module, || {
                Scalar::Global(format!("numpy.dtype({})", d.descr))
            })?,
            TorchObj::NdArray(a) => self.value(in_module, || Scalar::Array {
                dtype: a.dtype.clone(),
                shape: a.shape.clone(),
            })?,
        }
        Ok(())
    }

    /// Push the children collected for heap value `id` on `stack` (in
    /// reverse, so they pop in order), with the frame that takes `id` off
    /// the path when they are done.
    fn descend(&mut self, id: ObjId, stack: &mut Vec<Frame>) -> Result<()> {
        // Reached again by another path (tied weights, a module
        // registered twice): legitimate, but rare; a reference bomb
        // is nothing else.
        if !self.expanded.insert(id) {
            self.shared_visits += 1;
            if self.shared_visits > self.max_shared_visits {
                return Err(Error::limit("max_shared_visits", self.max_shared_visits));
            }
        }
        self.on_path.insert(id);
        stack.push(Frame::Leave(id));
        let depth = self.path.len();
        let call = self.call;
        stack.extend(
            self.children
                .drain(..)
                .rev()
                .map(|(seg, value, in_module)| Frame::Enter {
                    value,
                    seg,
                    depth,
                    in_module,
                    call,
                }),
        );
        Ok(())
    }

    /// `nn.Module.state_dict()` order: parameters, persistent buffers, children.
    fn module_children(&mut self, state: &crate::pickle::Dict) {
        let heap = self.heap;
        // A module without the set (saved before torch had it) keeps
        // every buffer.
        let non_persistent: Vec<&str> = match state
            .get_str(heap, "_non_persistent_buffers_set")
            .and_then(|s| heap.members(s))
        {
            Some(items) => items.iter().filter_map(|&i| heap.text(i)).collect(),
            None => Vec::new(),
        };
        for (field, skip) in [("_parameters", false), ("_buffers", true)] {
            if let Some(d) = state.get_str(heap, field).and_then(|v| heap.dict(v)) {
                for &(k, v) in d.entries() {
                    let dropped = skip
                        && heap
                            .text(k)
                            .is_some_and(|key| non_persistent.contains(&key));
                    if v != Value::None && !dropped {
                        self.children.push((Some(Seg::Key(k)), v, true));
                    }
                }
            }
        }
        if let Some(d) = state.get_str(heap, "_modules").and_then(|v| heap.dict(v)) {
            for &(k, v) in d.entries() {
                if v != Value::None {
                    self.children.push((Some(Seg::Key(k)), v, true));
                }
            }
        }
    }
}
