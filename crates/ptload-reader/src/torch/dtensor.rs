//! DTensors (`torch.distributed.tensor.DTensor`) as `torch.save` pickles
//! them: `_rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor,
//! (DTensor, dtype, size, stride, offset, layout, device, requires_grad),
//! (None, {"_local_tensor": t, "_spec": DTensorSpec(...)}))`. The local
//! tensor is read as any tensor; the spec (its `DeviceMesh`, with the
//! mesh's layout and this rank's coordinate on it, and its placements)
//! is read from the inert objects the VM made of it, by their exact
//! classes. Nothing is constructed or called.

use super::describe;
use super::{Known, TorchHeap, TorchObj};
use crate::error::{Error, ErrorKind, Result};
use crate::pickle::{Heap, Obj, Value};

/// How a DTensor lies on one dimension of its device mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MeshPlacement {
    /// `Shard(dim)`: the tensor's dimension `dim` is cut among the mesh
    /// dimension's ranks as `torch.chunk` cuts it (the last pieces
    /// shorter, or empty).
    Shard(u64),
    /// `Replicate()`: every rank of the mesh dimension holds the same data.
    Replicate,
    /// `Partial(reduce_op)`: every rank holds a term of a reduction not
    /// yet done; no one rank's data is the tensor's.
    Partial(String),
    /// `_StridedShard(dim, split_factor)` (FSDP2 over tensor parallelism):
    /// named, not read.
    StridedShard {
        /// The sharded dimension.
        dim: u64,
        /// Its split factor.
        split_factor: u64,
    },
}

impl std::fmt::Display for MeshPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MeshPlacement::Shard(d) => write!(f, "Shard({d})"),
            MeshPlacement::Replicate => write!(f, "Replicate()"),
            MeshPlacement::Partial(op) => write!(f, "Partial({op})"),
            MeshPlacement::StridedShard { dim, split_factor } => {
                write!(f, "_StridedShard(dim={dim}, split_factor={split_factor})")
            }
        }
    }
}

/// What a saved DTensor records beside its local tensor: the whole
/// tensor's shape, the device mesh and this rank's place on it, and how the
/// tensor lies on each mesh dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DTensorSpec {
    /// The whole (global) tensor's shape.
    pub global_shape: Vec<u64>,
    /// The mesh's size along each of its dimensions.
    pub mesh: Vec<u64>,
    /// The saving rank's coordinate on the mesh.
    pub coordinate: Vec<u64>,
    /// The saving rank's global rank, as the mesh recorded it.
    pub rank: Option<u64>,
    /// One placement per mesh dimension.
    pub placements: Vec<MeshPlacement>,
}

/// The DTensor classes `torch.distributed.tensor` registers as safe for
/// `weights_only=True` when it is imported (torch 2.15), by module and
/// name: the reader admits exactly these where torch does.
pub(crate) const DTENSOR_CLASSES: &[(&str, &str)] = &[
    ("torch.distributed.tensor", "DTensor"),
    ("torch.distributed.device_mesh", "DeviceMesh"),
    ("torch.distributed.tensor._dtensor_spec", "DTensorSpec"),
    ("torch.distributed.tensor._dtensor_spec", "TensorMeta"),
    ("torch.distributed.tensor._dtensor_spec", "ShardOrderEntry"),
    ("torch.distributed.tensor.placement_types", "Shard"),
    ("torch.distributed.tensor.placement_types", "Replicate"),
    ("torch.distributed.tensor.placement_types", "Partial"),
    ("torch.distributed.tensor.placement_types", "_StridedShard"),
    ("torch.distributed._mesh_layout", "_MeshLayout"),
    ("torch.distributed._mesh_layout", "_FlatLayout"),
];

/// Whether `module.name` is one of [`DTENSOR_CLASSES`].
pub(crate) fn dtensor_class(module: &str, name: &str) -> bool {
    DTENSOR_CLASSES
        .iter()
        .any(|&(m, n)| m == module && n == name)
}

fn err(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Pickle, format!("DTensor: {}", message.into()))
}

/// The `module.name` of the class `v` is an instance of, if it is an
/// inert instance of a global.
fn class_of(heap: &Heap, v: Value) -> Option<(&str, &str)> {
    let Some(Obj::Object(o)) = heap.get(v) else {
        return None;
    };
    match heap.torch(o.class) {
        Some(TorchObj::Global(g)) => Some((&g.module, &g.name)),
        _ => None,
    }
}

/// The attribute `key` of the instance `v` of `module.name`: from the
/// dict its BUILD set (or the slot dict of a `(dict, slots)` state).
fn attr(heap: &Heap, v: Value, (module, name): (&str, &str), key: &str) -> Result<Value> {
    if class_of(heap, v) != Some((module, name)) {
        return Err(err(format!(
            "expected a {module}.{name}, found {}",
            describe(heap, v)
        )));
    }
    let state = match heap.get(v) {
        Some(Obj::Object(o)) => o.state,
        _ => None,
    };
    let found = state.and_then(|s| lookup(heap, s, key));
    found.ok_or_else(|| err(format!("{module}.{name} without its {key}")))
}

/// `key` in a state that is a dict or a `(dict, slots)` pair.
fn lookup(heap: &Heap, state: Value, key: &str) -> Option<Value> {
    if let Some(d) = heap.dict(state) {
        return d.get_str(heap, key);
    }
    let pair = heap.tuple(state)?;
    pair.iter().find_map(|&s| heap.dict(s)?.get_str(heap, key))
}

fn uint(heap: &Heap, v: Value, what: &str) -> Result<u64> {
    match v {
        Value::Int(i) => u64::try_from(i).map_err(|_| err(format!("{what} is negative"))),
        _ => Err(err(format!(
            "{what} must be an int, found {}",
            describe(heap, v)
        ))),
    }
}

/// An int or a tuple of ints (a CuTe shape, one level deep), as ints.
fn ints(heap: &Heap, v: Value, what: &str) -> Result<Vec<u64>> {
    if let Value::Int(_) = v {
        return Ok(vec![uint(heap, v, what)?]);
    }
    let items = heap
        .sequence(v)
        .ok_or_else(|| err(format!("{what} must be a tuple of ints")))?;
    heap.charge_work(items.len() as u64)?;
    items.iter().map(|&i| uint(heap, i, what)).collect()
}

const MESH: (&str, &str) = ("torch.distributed.device_mesh", "DeviceMesh");
const SPEC: (&str, &str) = ("torch.distributed.tensor._dtensor_spec", "DTensorSpec");
const MESH_LAYOUT: (&str, &str) = ("torch.distributed._mesh_layout", "_MeshLayout");
const FLAT_LAYOUT: (&str, &str) = ("torch.distributed._mesh_layout", "_FlatLayout");
const PLACEMENTS: &str = "torch.distributed.tensor.placement_types";

/// Whether `ty` (the second argument of `_rebuild_from_type_v2`) is the
/// DTensor class.
pub(crate) fn is_dtensor_type(heap: &Heap, ty: Value) -> bool {
    matches!(heap.torch(ty), Some(TorchObj::Global(g))
        if &*g.module == "torch.distributed.tensor" && &*g.name == "DTensor")
}

/// Whether `func` is `torch._utils._rebuild_wrapper_subclass`.
pub(crate) fn is_wrapper_subclass(heap: &Heap, func: Value) -> bool {
    matches!(heap.torch(func), Some(TorchObj::Global(g))
        if g.known == Known::RebuildUnsupported && &*g.name == "_rebuild_wrapper_subclass")
}

/// A DTensor's local tensor (a tensor value of the heap) and its spec,
/// from the arguments of `_rebuild_wrapper_subclass` and the state
/// `_rebuild_from_type_v2` sets.
pub(crate) fn read(heap: &Heap, wrapper_args: Value, state: Value) -> Result<(Value, DTensorSpec)> {
    // (cls, dtype, size, stride, storage_offset, layout, device, requires_grad)
    let args = heap
        .tuple(wrapper_args)
        .ok_or_else(|| err("the wrapper's arguments are not a tuple"))?;
    let size = *args
        .get(2)
        .ok_or_else(|| err("the wrapper's arguments lack the size"))?;
    let global_shape = ints(heap, size, "its size")?;
    let local =
        lookup(heap, state, "_local_tensor").ok_or_else(|| err("no _local_tensor in its state"))?;
    let local_dtype = match heap.torch(local) {
        Some(TorchObj::Tensor(meta)) if meta.quant.is_none() => meta.dtype,
        _ => {
            return Err(err(format!(
                "its _local_tensor is a {}, not a tensor",
                describe(heap, local)
            )))
        }
    };
    match args.get(1).map(|&d| heap.torch(d)) {
        Some(Some(TorchObj::Global(g))) if g.known == Known::Dtype(local_dtype) => {}
        _ => {
            return Err(err(format!(
                "its dtype is not its local tensor's ({local_dtype})"
            )))
        }
    }
    let spec = lookup(heap, state, "_spec").ok_or_else(|| err("no _spec in its state"))?;
    let mesh = attr(heap, spec, SPEC, "mesh")?;
    let layout = attr(heap, mesh, MESH, "_layout")?;
    let axes = attr(heap, layout, MESH_LAYOUT, "axes")?;
    let axes = heap
        .sequence(axes)
        .ok_or_else(|| err("the mesh layout's axes are not a tuple"))?;
    heap.charge_work(axes.len() as u64)?;
    let mut mesh_shape = Vec::with_capacity(axes.len());
    for &axis in axes {
        let shape = ints(heap, attr(heap, axis, FLAT_LAYOUT, "shape")?, "a mesh axis")?;
        let size = shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| err("a mesh axis's size overflows"))?;
        mesh_shape.push(size);
    }
    let coordinate = attr(heap, mesh, MESH, "_coordinate_on_dim")?;
    if coordinate == Value::None {
        return Err(err(
            "the saving rank is not on its mesh (_coordinate_on_dim is None)",
        ));
    }
    let coordinate = ints(heap, coordinate, "_coordinate_on_dim")?;
    let rank = match attr(heap, mesh, MESH, "_rank") {
        Ok(v) => Some(uint(heap, v, "_rank")?),
        Err(_) => None,
    };
    if coordinate.len() != mesh_shape.len()
        || coordinate.iter().zip(&mesh_shape).any(|(c, n)| c >= n)
    {
        return Err(err(format!(
            "the coordinate {coordinate:?} is not on its mesh {mesh_shape:?}"
        )));
    }
    let placements = attr(heap, spec, SPEC, "placements")?;
    let placements = heap
        .sequence(placements)
        .ok_or_else(|| err("its placements are not a tuple"))?;
    heap.charge_work(placements.len() as u64)?;
    let mut out = Vec::with_capacity(placements.len());
    for &p in placements {
        let class = class_of(heap, p).filter(|(m, _)| *m == PLACEMENTS);
        let placement = match class.map(|(_, n)| n) {
            Some("Shard") => MeshPlacement::Shard(uint(
                heap,
                attr(heap, p, (PLACEMENTS, "Shard"), "dim")?,
                "Shard's dim",
            )?),
            Some("Replicate") => MeshPlacement::Replicate,
            Some("Partial") => {
                let op = attr(heap, p, (PLACEMENTS, "Partial"), "reduce_op")
                    .ok()
                    .and_then(|v| heap.text(v))
                    .unwrap_or("?");
                MeshPlacement::Partial(op.to_owned())
            }
            Some("_StridedShard") => {
                let c = (PLACEMENTS, "_StridedShard");
                MeshPlacement::StridedShard {
                    dim: uint(heap, attr(heap, p, c, "dim")?, "dim")?,
                    split_factor: uint(heap, attr(heap, p, c, "split_factor")?, "split_factor")?,
                }
            }
            _ => {
                return Err(err(format!(
                    "a placement is a {}, not Shard, Replicate or Partial",
                    describe(heap, p)
                )))
            }
        };
        out.push(placement);
    }
    if out.len() != mesh_shape.len() {
        return Err(err(format!(
            "{} placements on a mesh of {} dimensions",
            out.len(),
            mesh_shape.len()
        )));
    }
    Ok((
        local,
        DTensorSpec {
            global_shape,
            mesh: mesh_shape,
            coordinate,
            rank,
            placements: out,
        },
    ))
}
