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

use super::{Known, QuantParams, TorchObj};
use crate::error::{Error, Result};
use crate::pickle::{Heap, Obj, ObjId, Value};

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
#[derive(Debug, Default)]
pub(crate) struct Walked {
    pub(crate) tensors: Vec<(String, Value)>,
    pub(crate) values: Vec<(String, Scalar)>,
    pub(crate) warnings: Vec<String>,
}

enum Frame {
    Enter {
        value: Value,
        name: String,
        in_module: bool,
    },
    Leave(ObjId),
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// A dict key as it appears in a name.
fn key_text(heap: &Heap, key: Value) -> String {
    match key {
        Value::None => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => format!("{f:?}"),
        Value::Obj(_) => match heap.get(key) {
            Some(Obj::Str(_)) => heap.str(key).unwrap_or_default().to_owned(),
            Some(Obj::Bytes(_)) => {
                String::from_utf8_lossy(heap.bytes(key).unwrap_or_default()).into_owned()
            }
            Some(Obj::Tuple(_)) => {
                let items = heap.tuple(key).unwrap_or_default();
                let parts: Vec<String> = items.iter().map(|&i| key_text(heap, i)).collect();
                format!("({})", parts.join(", "))
            }
            Some(other) => format!("<{}>", crate::pickle::kind_name_of(other)),
            None => "?".into(),
        },
    }
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
    on_path: HashSet<ObjId>,
    out: Walked,
}

impl<'h> Walker<'h> {
    pub(crate) fn new(heap: &'h Heap, max_steps: u64) -> Self {
        Walker {
            heap,
            max_steps,
            steps: 0,
            on_path: HashSet::new(),
            out: Walked::default(),
        }
    }

    pub(crate) fn finish(self) -> Walked {
        self.out
    }

    /// Walk `root`, naming everything under `prefix`.
    pub(crate) fn walk(&mut self, root: Value, prefix: &str) -> Result<()> {
        let heap = self.heap;
        let mut stack = vec![Frame::Enter {
            value: root,
            name: prefix.to_owned(),
            in_module: false,
        }];
        while let Some(frame) = stack.pop() {
            self.steps += 1;
            if self.steps > self.max_steps {
                return Err(Error::limit("max_walk_steps", self.max_steps));
            }
            let (value, name, in_module) = match frame {
                Frame::Leave(id) => {
                    self.on_path.remove(&id);
                    continue;
                }
                Frame::Enter {
                    value,
                    name,
                    in_module,
                } => (value, name, in_module),
            };
            let leaf = |out: &mut Walked, scalar: Scalar| {
                if !in_module {
                    out.values.push((name.clone(), scalar));
                }
            };
            let id = match value {
                Value::None => {
                    leaf(&mut self.out, Scalar::None);
                    continue;
                }
                Value::Bool(b) => {
                    leaf(&mut self.out, Scalar::Bool(b));
                    continue;
                }
                Value::Int(i) => {
                    leaf(&mut self.out, Scalar::Int(i));
                    continue;
                }
                Value::Float(f) => {
                    leaf(&mut self.out, Scalar::Float(f));
                    continue;
                }
                Value::Obj(id) => id,
            };
            if self.on_path.contains(&id) {
                continue;
            }
            // Children are pushed in reverse so they pop in order.
            let mut children: Vec<(String, Value, bool)> = Vec::new();
            match heap.get(value) {
                None => continue,
                Some(Obj::Str(_)) => leaf(
                    &mut self.out,
                    Scalar::Str(heap.str(value).unwrap_or_default().to_owned()),
                ),
                Some(Obj::Bytes(_)) => leaf(
                    &mut self.out,
                    Scalar::Bytes(heap.bytes(value).unwrap_or_default().to_vec()),
                ),
                Some(Obj::BigInt(_)) => leaf(
                    &mut self.out,
                    Scalar::BigInt(heap.bigint(value).unwrap_or_default().to_vec()),
                ),
                Some(Obj::Tuple(_) | Obj::List(_) | Obj::Set(_)) => {
                    for (i, &v) in heap.items(value).unwrap_or_default().iter().enumerate() {
                        children.push((join(&name, &i.to_string()), v, in_module));
                    }
                }
                Some(Obj::Dict(d)) => {
                    for &(k, v) in d.entries() {
                        children.push((join(&name, &key_text(heap, k)), v, in_module));
                    }
                }
                Some(Obj::Object(o)) => {
                    let class = global_path(heap, o.class).unwrap_or_else(|| "?".into());
                    let state = o.state.and_then(|s| heap.dict(s));
                    if let Some(state) = state.filter(|s| {
                        s.get_str(heap, "_parameters").is_some()
                            && s.get_str(heap, "_modules").is_some()
                    }) {
                        self.module_children(state, &name, &mut children);
                    } else {
                        let script_module = class.starts_with("__torch__.");
                        let inside = in_module || script_module;
                        if let Some(state) = o.state {
                            match heap.tuple(state) {
                                // (state, slotstate) from __reduce_ex__.
                                Some([a, b])
                                    if heap.dict(*a).is_some() || heap.dict(*b).is_some() =>
                                {
                                    for part in [*a, *b] {
                                        if let Some(d) = heap.dict(part) {
                                            for &(k, v) in d.entries() {
                                                children.push((
                                                    join(&name, &key_text(heap, k)),
                                                    v,
                                                    inside,
                                                ));
                                            }
                                        }
                                    }
                                }
                                _ => match heap.dict(state) {
                                    Some(d) => {
                                        for &(k, v) in d.entries() {
                                            children.push((
                                                join(&name, &key_text(heap, k)),
                                                v,
                                                inside,
                                            ));
                                        }
                                    }
                                    None => children.push((name.clone(), state, inside)),
                                },
                            }
                        } else if let Some(args) = heap.tuple(o.args).filter(|a| !a.is_empty()) {
                            for (i, &v) in args.iter().enumerate() {
                                children.push((join(&name, &i.to_string()), v, inside));
                            }
                        }
                        for &(k, v) in o.items.entries() {
                            children.push((join(&name, &key_text(heap, k)), v, inside));
                        }
                        for (i, &v) in o.list.iter().enumerate() {
                            children.push((join(&name, &i.to_string()), v, inside));
                        }
                        if class.starts_with("torch._utils._rebuild_") {
                            self.out.warnings.push(format!(
                                "'{name}': tensors rebuilt by {class} are not read; they are not listed"
                            ));
                        } else if children.is_empty() {
                            leaf(&mut self.out, Scalar::Object(class));
                        }
                    }
                }
                Some(Obj::Torch(t)) => match t {
                    TorchObj::Tensor(meta) => {
                        if let Some(QuantParams::PerChannel {
                            scales,
                            zero_points,
                            ..
                        }) = &meta.quant
                        {
                            let (s, z) = (join(&name, "scales"), join(&name, "zero_points"));
                            self.out.tensors.push((name, value));
                            self.out.tensors.push((s, *scales));
                            self.out.tensors.push((z, *zero_points));
                        } else {
                            self.out.tensors.push((name, value));
                        }
                        continue;
                    }
                    TorchObj::Storage(_) => {
                        self.out.tensors.push((name, value));
                        continue;
                    }
                    TorchObj::Sparse { layout, components } => {
                        for (part, &v) in layout.components().iter().zip(components) {
                            self.out.tensors.push((join(&name, part), v));
                        }
                        continue;
                    }
                    TorchObj::Global(g) => {
                        let text = match g.known {
                            Known::Dtype(d) => format!("torch.{}", d.name()),
                            _ => format!("{}.{}", g.module, g.name),
                        };
                        leaf(&mut self.out, Scalar::Global(text));
                    }
                    TorchObj::Device(d) => leaf(&mut self.out, Scalar::Device(d.to_string())),
                    TorchObj::Layout(l) => {
                        leaf(&mut self.out, Scalar::Global(format!("torch.{l:?}")))
                    }
                    TorchObj::NumpyDtype(d) => leaf(
                        &mut self.out,
                        Scalar::Global(format!("numpy.dtype({})", d.descr)),
                    ),
                    TorchObj::NdArray(a) => leaf(
                        &mut self.out,
                        Scalar::Array {
                            dtype: a.dtype.clone(),
                            shape: a.shape.clone(),
                        },
                    ),
                },
            }
            if !children.is_empty() {
                self.on_path.insert(id);
                stack.push(Frame::Leave(id));
                stack.extend(children.into_iter().rev().map(|(name, value, in_module)| {
                    Frame::Enter {
                        value,
                        name,
                        in_module,
                    }
                }));
            }
        }
        Ok(())
    }

    /// `nn.Module.state_dict()` order: parameters, persistent buffers, children.
    fn module_children(
        &self,
        state: &crate::pickle::Dict,
        name: &str,
        children: &mut Vec<(String, Value, bool)>,
    ) {
        let heap = self.heap;
        let non_persistent: Vec<&str> = state
            .get_str(heap, "_non_persistent_buffers_set")
            .and_then(|s| heap.items(s))
            .map(|items| items.iter().filter_map(|&i| heap.text(i)).collect())
            .unwrap_or_default();
        for (field, skip) in [("_parameters", false), ("_buffers", true)] {
            if let Some(d) = state.get_str(heap, field).and_then(|v| heap.dict(v)) {
                for &(k, v) in d.entries() {
                    let key = key_text(heap, k);
                    if v == Value::None || skip && non_persistent.contains(&key.as_str()) {
                        continue;
                    }
                    children.push((join(name, &key), v, true));
                }
            }
        }
        if let Some(d) = state.get_str(heap, "_modules").and_then(|v| heap.dict(v)) {
            for &(k, v) in d.entries() {
                if v != Value::None {
                    children.push((join(name, &key_text(heap, k)), v, true));
                }
            }
        }
    }
}
