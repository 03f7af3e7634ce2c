//! The unpickled object, as a flat graph of inert nodes.
//!
//! [`Checkpoint::objects`](crate::Checkpoint::objects) gives what
//! `torch.load` would return, without running anything: every dict, list,
//! tuple, set, scalar, tensor, parameter, numpy value and foreign object,
//! each once, children referred to by [`NodeId`]. A value reached twice in
//! the pickle (tied weights, a shared list) is one node reached twice, and
//! cycles are just ids, so consumers can rebuild the object without
//! recursion. Ask for it with [`OpenOptions::objects`](crate::OpenOptions::objects).
//!
//! Node ids follow the order in which the pickle made the values: the
//! members of an immutable value (tuple, frozenset, `torch.Size`,
//! parameter, sparse or quantized tensor) always have smaller ids than the
//! value itself (or are scalars), so building nodes in id order builds
//! every immutable value after its members. Mutable containers (lists,
//! dicts, sets, foreign objects) may refer to later nodes: create them
//! empty, fill them once every node exists.

use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::pickle::{Heap, Obj, Tag, Value};
use crate::torch::dtype::DType;
use crate::torch::tensor::TensorInfo;
use crate::torch::{QuantParams, TorchHeap, TorchObj};

/// Index of a node in [`Objects::nodes`].
pub type NodeId = usize;

/// One value of the unpickled object.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Node {
    /// `None`
    None,
    /// A bool.
    Bool(bool),
    /// An int that fits in i64.
    Int(i64),
    /// An int beyond i64: little-endian two's complement.
    BigInt(Vec<u8>),
    /// A float.
    Float(f64),
    /// A str.
    Str(String),
    /// Bytes.
    Bytes(Vec<u8>),
    /// A bytearray.
    ByteArray(Vec<u8>),
    /// A tuple.
    Tuple(Vec<NodeId>),
    /// A `torch.Size`.
    Size(Vec<NodeId>),
    /// A list.
    List(Vec<NodeId>),
    /// A dict, in insertion order.
    Dict {
        /// Made by `collections.OrderedDict`.
        ordered: bool,
        /// Its items.
        items: Vec<(NodeId, NodeId)>,
        /// Attributes a BUILD set on it (a state dict's `_metadata`): a dict
        /// node, or a `(dict, slots)` tuple.
        state: Option<NodeId>,
    },
    /// A set.
    Set(Vec<NodeId>),
    /// A frozenset.
    FrozenSet(Vec<NodeId>),
    /// A tensor: [`Objects::tensors`]`[tensor]`.
    Tensor {
        /// Index into [`Objects::tensors`].
        tensor: usize,
        /// For a per-channel quantized tensor, its scales and zero points
        /// (tensor nodes).
        qparams: Option<(NodeId, NodeId)>,
        /// Python attributes saved with it (`t.foo = 1`): a dict node, or a
        /// `(dict, slots)` tuple, set as pickle's BUILD sets a state.
        attrs: Option<NodeId>,
    },
    /// A storage saved as itself (not under a tensor).
    Storage {
        /// Index into [`Checkpoint::storages`](crate::Checkpoint::storages).
        storage: usize,
        /// The dtype this reference types it as (torch types each
        /// reference on its own).
        dtype: DType,
    },
    /// `nn.Parameter(data, requires_grad)`.
    Parameter {
        /// The tensor node.
        data: NodeId,
        /// `requires_grad` as saved.
        requires_grad: bool,
        /// Python attributes saved with it, as for [`Node::Tensor`].
        attrs: Option<NodeId>,
    },
    /// A sparse tensor, as `torch._utils._rebuild_sparse_tensor(layout, data)`
    /// takes it.
    Sparse {
        /// `sparse_coo`, `sparse_csr`, `sparse_csc`, `sparse_bsr`, `sparse_bsc`.
        layout: &'static str,
        /// The data tuple: component tensors, then size (and flags).
        data: NodeId,
    },
    /// A `torch.device`, e.g. `cuda:0`.
    Device(String),
    /// A torch dtype.
    Dtype {
        /// The element type.
        dtype: DType,
        /// torch's name for it (`float32`, `qint8`...).
        name: String,
    },
    /// A `torch.layout` (`strided`, `sparse_coo`, ...).
    Layout(&'static str),
    /// A reference to a class or function the file names (nothing imported).
    Global {
        /// Its module.
        module: String,
        /// Its name.
        name: String,
    },
    /// A `numpy.dtype`.
    NumpyDtype {
        /// Its code (`f8`, `<i4`...).
        descr: String,
        /// Whether its byte order is big-endian.
        big_endian: bool,
        /// Whether it has fields or a subarray, which `descr` (`V12`) does
        /// not describe.
        structured: bool,
    },
    /// A numpy scalar: its dtype and raw bytes.
    NumpyScalar {
        /// Its dtype code.
        descr: String,
        /// Whether the raw bytes are big-endian.
        big_endian: bool,
        /// The raw bytes.
        raw: Vec<u8>,
    },
    /// A numpy array.
    NdArray {
        /// Its dtype code and byte order (`None` when the state had no dtype).
        descr: Option<(String, bool)>,
        /// Shape.
        shape: Vec<u64>,
        /// Elements in column-major order.
        fortran: bool,
        /// The raw elements: a bytes node, or a list for object arrays.
        data: NodeId,
    },
    /// An instance of a class the reader keeps inert: what was called, with
    /// what, and what was set on it. Nothing was ever called.
    Object {
        /// Made as `class.__new__(class, *args)` (NEWOBJ), not `class(*args)`.
        new: bool,
        /// The callable (a [`Node::Global`], usually).
        class: NodeId,
        /// Its arguments (a tuple node).
        args: NodeId,
        /// State from BUILD.
        state: Option<NodeId>,
        /// Items set on it (a dict subclass).
        items: Vec<(NodeId, NodeId)>,
        /// Items appended to it (a list subclass).
        list: Vec<NodeId>,
    },
}

/// The unpickled object of a checkpoint (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Objects {
    nodes: Vec<Node>,
    root: NodeId,
    tensors: Vec<TensorInfo>,
}

impl Objects {
    /// The node `torch.load` returns.
    pub fn root(&self) -> NodeId {
        self.root
    }

    /// Every node; ids index this slice.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node `id`.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id)
    }

    /// The tensors the nodes refer to, one per tensor object of the pickle
    /// (named as the flattening walk names them where it reaches them,
    /// else by their node: `<node N>`).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
}

/// The object of a file that holds only named tensors (a safetensors
/// file): a dict of each name to its tensor, in `tensors`' order.
pub(crate) fn name_dict(tensors: &[TensorInfo]) -> Objects {
    let mut nodes = Vec::with_capacity(tensors.len() * 2 + 1);
    let mut items = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        nodes.push(Node::Str(t.name.clone()));
        nodes.push(Node::Tensor {
            tensor: i,
            qparams: None,
            attrs: None,
        });
        items.push((2 * i, 2 * i + 1));
    }
    nodes.push(Node::Dict {
        ordered: false,
        items,
        state: None,
    });
    Objects {
        root: nodes.len() - 1,
        nodes,
        tensors: tensors.to_vec(),
    }
}

/// Build the graph under `root`. `make_tensor` describes a tensor heap
/// value (validated against its storage), given the id of its node: named
/// as the walk named it where the walk reached it, else `<node N>`. Work
/// is one step per value and per edge, charged against `max_walk_steps`.
pub(crate) fn build(
    heap: &Heap,
    root: Value,
    limits: &Limits,
    tensors_hint: usize,
    make_tensor: &mut dyn FnMut(Value, NodeId) -> Result<TensorInfo>,
) -> Result<Objects> {
    const UNSEEN: u32 = u32::MAX;
    let mut steps: u64 = 0;
    let mut charge = |n: usize| -> Result<()> {
        steps = steps.saturating_add(n as u64);
        if steps > limits.max_walk_steps {
            return Err(Error::limit("max_walk_steps", limits.max_walk_steps));
        }
        Ok(())
    };
    // Pass 1: every heap value reachable from the root, without recursion.
    let mut reached = vec![false; heap.len()];
    let mut todo = vec![root];
    let mut children = Vec::new();
    while let Some(v) = todo.pop() {
        let Value::Obj(id) = v else { continue };
        match reached.get_mut(id as usize) {
            Some(seen) if !*seen => *seen = true,
            _ => continue,
        }
        children.clear();
        children_of(heap, v, &mut children);
        charge(1 + children.len())?;
        todo.extend(children.iter().copied());
    }
    // Node ids in the order the pickle made the values: the reached ids,
    // ascending.
    let found: Vec<u32> = reached
        .iter()
        .enumerate()
        .filter(|&(_, &r)| r)
        .filter_map(|(id, _)| u32::try_from(id).ok())
        .collect();
    let mut node_of = vec![UNSEEN; heap.len()];
    for (i, &id) in found.iter().enumerate() {
        if let Some(slot) = node_of.get_mut(id as usize) {
            *slot =
                u32::try_from(i).map_err(|_| Error::limit("max_objects", u64::from(u32::MAX)))?;
        }
    }
    let mut out = Objects {
        nodes: Vec::with_capacity(found.len()),
        root: 0,
        tensors: Vec::with_capacity(tensors_hint.min(found.len())),
    };
    // Scalars get nodes of their own, after the heap values'.
    let mut scalars: Vec<Node> = Vec::new();
    let base = found.len();
    let id_of = |v: Value, scalars: &mut Vec<Node>| -> Result<NodeId> {
        let scalar = match v {
            Value::None => Node::None,
            Value::Bool(b) => Node::Bool(b),
            Value::Int(i) => Node::Int(i),
            Value::Float(f) => Node::Float(f),
            Value::Obj(id) => {
                return match node_of.get(id as usize) {
                    Some(&n) if n != UNSEEN => Ok(n as usize),
                    _ => Err(Error::new(
                        ErrorKind::Pickle,
                        format!("heap value {id} was not reached"),
                    )),
                }
            }
        };
        scalars.push(scalar);
        Ok(base + scalars.len() - 1)
    };
    for &id in &found {
        let v = Value::Obj(id);
        let node = node(heap, v, &mut |c| id_of(c, &mut scalars))?;
        let node = match node {
            Made::Node(n) => n,
            Made::Tensor { qparams, attrs } => {
                let index = out.tensors.len();
                out.tensors.push(make_tensor(v, out.nodes.len())?);
                Node::Tensor {
                    tensor: index,
                    qparams,
                    attrs,
                }
            }
        };
        out.nodes.push(node);
    }
    out.root = id_of(root, &mut scalars)?;
    out.nodes.append(&mut scalars);
    Ok(out)
}

/// The heap values `v` refers to.
fn children_of(heap: &Heap, v: Value, out: &mut Vec<Value>) {
    match heap.get(v) {
        Some(Obj::Tuple(_) | Obj::List(_)) => {
            // The kind says it is a sequence, and the accessor agrees.
            if let Some(items) = heap.sequence(v) {
                out.extend(items);
            }
        }
        Some(Obj::Dict(d) | Obj::Set(d)) => {
            out.extend(d.entries().iter().flat_map(|&(k, v)| [k, v]));
            out.extend(heap.dict_state(v));
        }
        Some(Obj::Object(o)) => {
            out.extend([o.class, o.args]);
            out.extend(o.state);
            out.extend(o.items.entries().iter().flat_map(|&(k, v)| [k, v]));
            out.extend(o.list.iter().copied());
        }
        Some(Obj::Ext(_)) => match heap.torch(v) {
            Some(TorchObj::Tensor(meta)) => {
                if let Some(QuantParams::PerChannel {
                    scales,
                    zero_points,
                    ..
                }) = &meta.quant
                {
                    out.extend([*scales, *zero_points]);
                }
                out.extend(meta.attrs);
            }
            Some(TorchObj::Sparse { data, .. }) => out.push(*data),
            Some(TorchObj::Parameter { data, attrs, .. }) => {
                out.push(*data);
                out.extend(*attrs);
            }
            Some(TorchObj::NdArray(a)) => out.push(a.data),
            _ => {}
        },
        Some(Obj::Str(_) | Obj::Bytes(_) | Obj::BigInt(_)) | None => {}
    }
}

fn ids(id: &mut dyn FnMut(Value) -> Result<NodeId>, items: &[Value]) -> Result<Vec<NodeId>> {
    items.iter().map(|&c| id(c)).collect()
}

enum Made {
    Node(Node),
    Tensor {
        qparams: Option<(NodeId, NodeId)>,
        attrs: Option<NodeId>,
    },
}

fn node(heap: &Heap, v: Value, id: &mut dyn FnMut(Value) -> Result<NodeId>) -> Result<Made> {
    let missing = || {
        Error::new(
            ErrorKind::Pickle,
            "heap value does not hold what its kind says",
        )
    };
    let tag = heap.tag_of(v);
    let node = match heap.get(v).ok_or_else(missing)? {
        Obj::Str(_) => Node::Str(heap.str(v).ok_or_else(missing)?.to_owned()),
        Obj::Bytes(_) => {
            let b = heap.bytes(v).ok_or_else(missing)?.to_vec();
            if tag == Some(Tag::ByteArray) {
                Node::ByteArray(b)
            } else {
                Node::Bytes(b)
            }
        }
        Obj::BigInt(_) => Node::BigInt(heap.bigint(v).ok_or_else(missing)?.to_vec()),
        Obj::Tuple(_) => {
            let items = ids(id, heap.tuple(v).ok_or_else(missing)?)?;
            if tag == Some(Tag::Size) {
                Node::Size(items)
            } else {
                Node::Tuple(items)
            }
        }
        Obj::List(items) => Node::List(ids(id, items)?),
        Obj::Dict(d) => {
            let mut items = Vec::with_capacity(d.entries().len());
            for &(k, val) in d.entries() {
                items.push((id(k)?, id(val)?));
            }
            let state = match heap.dict_state(v) {
                Some(s) => Some(id(s)?),
                None => None,
            };
            Node::Dict {
                ordered: tag == Some(Tag::OrderedDict),
                items,
                state,
            }
        }
        Obj::Set(d) => {
            let members: Vec<Value> = d.entries().iter().map(|&(k, _)| k).collect();
            let members = ids(id, &members)?;
            if tag == Some(Tag::FrozenSet) {
                Node::FrozenSet(members)
            } else {
                Node::Set(members)
            }
        }
        Obj::Object(o) => {
            let mut items = Vec::with_capacity(o.items.entries().len());
            for &(k, val) in o.items.entries() {
                items.push((id(k)?, id(val)?));
            }
            Node::Object {
                new: tag == Some(Tag::NewObj),
                class: id(o.class)?,
                args: id(o.args)?,
                state: match o.state {
                    Some(s) => Some(id(s)?),
                    None => None,
                },
                items,
                list: ids(id, &o.list)?,
            }
        }
        Obj::Ext(_) => match heap.torch(v).ok_or_else(missing)? {
            TorchObj::Tensor(meta) => {
                let qparams = match &meta.quant {
                    Some(QuantParams::PerChannel {
                        scales,
                        zero_points,
                        ..
                    }) => Some((id(*scales)?, id(*zero_points)?)),
                    _ => None,
                };
                let attrs = match meta.attrs {
                    Some(a) => Some(id(a)?),
                    None => None,
                };
                return Ok(Made::Tensor { qparams, attrs });
            }
            TorchObj::Storage { index, dtype } => Node::Storage {
                storage: *index,
                dtype: *dtype,
            },
            TorchObj::Parameter {
                data,
                requires_grad,
                attrs,
            } => Node::Parameter {
                data: id(*data)?,
                requires_grad: *requires_grad,
                attrs: match attrs {
                    Some(a) => Some(id(*a)?),
                    None => None,
                },
            },
            TorchObj::Sparse { layout, data, .. } => Node::Sparse {
                layout: layout.name(),
                data: id(*data)?,
            },
            TorchObj::Device(d) => Node::Device(d.to_string()),
            TorchObj::Layout(l) => Node::Layout(l.name()),
            TorchObj::Global(g) => match g.known {
                crate::torch::Known::Dtype(d) => Node::Dtype {
                    dtype: d,
                    name: g.name.to_string(),
                },
                _ => Node::Global {
                    module: g.module.to_string(),
                    name: g.name.to_string(),
                },
            },
            TorchObj::NumpyDtype(d) => Node::NumpyDtype {
                descr: d.descr.clone(),
                big_endian: d.big_endian,
                structured: d.structured,
            },
            TorchObj::NumpyScalar {
                descr,
                big_endian,
                raw,
                ..
            } => Node::NumpyScalar {
                descr: descr.clone(),
                big_endian: *big_endian,
                raw: raw.clone(),
            },
            TorchObj::NdArray(a) => Node::NdArray {
                descr: a.descr.clone(),
                shape: a.shape.clone(),
                fortran: a.fortran,
                data: id(a.data)?,
            },
        },
    };
    Ok(Made::Node(node))
}
