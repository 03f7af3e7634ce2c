//! `.metadata`: the pickle of `torch.distributed.checkpoint.metadata.Metadata`,
//! run in the pickle VM with an interpreter that knows exactly the classes
//! torch writes there and refuses every other global.

use std::any::Any;

use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::pickle::{Extension, Heap, Interpreter, Obj, StringEncoding, Value, Vm};
use crate::torch::dtype::DType;

const METADATA: &str = "torch.distributed.checkpoint.metadata";
const FILESYSTEM: &str = "torch.distributed.checkpoint.filesystem";

/// The globals a DCP `.metadata` may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Metadata,
    TensorStorage,
    Properties,
    Chunk,
    BytesStorage,
    Index,
    StorageMeta,
    MemFormat,
    StorageInfo,
    Size,
    GetLayout,
    Path,
}

impl Class {
    fn of(module: &str, name: &str) -> Option<Class> {
        Some(match (module, name) {
            (METADATA, "Metadata") => Class::Metadata,
            (METADATA, "TensorStorageMetadata") => Class::TensorStorage,
            (METADATA, "TensorProperties") => Class::Properties,
            (METADATA, "ChunkStorageMetadata") => Class::Chunk,
            (METADATA, "BytesStorageMetadata") => Class::BytesStorage,
            (METADATA, "MetadataIndex") => Class::Index,
            (METADATA, "StorageMeta") => Class::StorageMeta,
            (METADATA, "_MEM_FORMAT_ENCODING") => Class::MemFormat,
            (FILESYSTEM, "_StorageInfo") => Class::StorageInfo,
            ("torch", "Size") => Class::Size,
            ("torch.serialization", "_get_layout") => Class::GetLayout,
            // StorageMeta.checkpoint_id: the path the writer was given.
            ("pathlib", "PosixPath" | "PurePosixPath" | "WindowsPath" | "PureWindowsPath") => {
                Class::Path
            }
            _ => return None,
        })
    }

    /// Classes NEWOBJ may instantiate (the dataclasses); the rest are
    /// called with REDUCE.
    fn is_dataclass(self) -> bool {
        matches!(
            self,
            Class::Metadata
                | Class::TensorStorage
                | Class::Properties
                | Class::Chunk
                | Class::BytesStorage
                | Class::Index
                | Class::StorageMeta
                | Class::StorageInfo
        )
    }
}

/// What the interpreter makes: inert records, never anything that runs.
#[derive(Debug)]
enum DcpObj {
    Class(Class),
    DType(DType),
    Layout,
    Path,
    Instance { class: Class, state: Option<Value> },
}

impl Extension for DcpObj {
    fn kind_name(&self) -> &'static str {
        match self {
            DcpObj::Class(_) => "global",
            DcpObj::DType(_) => "torch.dtype",
            DcpObj::Layout => "torch.layout",
            DcpObj::Path => "path",
            DcpObj::Instance { .. } => "DCP record",
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

fn err(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Pickle, message)
}

struct DcpInterp;

impl Interpreter for DcpInterp {
    fn global(&mut self, heap: &mut Heap, module: &str, name: &str, offset: u64) -> Result<Value> {
        if module == "torch" {
            if let Some(dtype) = DType::from_torch_name(name) {
                return heap.alloc(Obj::Ext(Box::new(DcpObj::DType(dtype))));
            }
        }
        match Class::of(module, name) {
            Some(class) => heap.alloc(Obj::Ext(Box::new(DcpObj::Class(class)))),
            None => Err(Error::new(
                ErrorKind::UnsupportedGlobal,
                format!(
                    "global {module}.{name} is not one of the classes of DCP metadata \
                     (torch.distributed.checkpoint)"
                ),
            )
            .at(offset)),
        }
    }

    fn call(&mut self, heap: &mut Heap, callable: Value, args: Value) -> Result<Value> {
        let class = match heap.ext::<DcpObj>(callable) {
            Some(DcpObj::Class(c)) => *c,
            _ => return Err(err("REDUCE on something that is not a DCP class")),
        };
        let args: Vec<Value> = heap
            .tuple(args)
            .ok_or_else(|| err("REDUCE arguments are not a tuple"))?
            .to_vec();
        heap.charge_work(args.len() as u64)?;
        match (class, args.as_slice()) {
            (Class::Size, [dims]) => {
                let items = heap
                    .sequence(*dims)
                    .ok_or_else(|| err("torch.Size of something that is not a tuple"))?;
                heap.charge_work(items.len() as u64)?;
                if items.iter().any(|v| !matches!(v, Value::Int(_))) {
                    return Err(err("torch.Size holds something that is not an int"));
                }
                Ok(*dims)
            }
            (Class::Size, []) => heap.alloc_tuple(&[]),
            (Class::GetLayout, [name]) if heap.str(*name) == Some("torch.strided") => {
                heap.alloc(Obj::Ext(Box::new(DcpObj::Layout)))
            }
            (Class::GetLayout, _) => Err(Error::new(
                ErrorKind::Unsupported,
                "a tensor layout other than torch.strided",
            )),
            (Class::MemFormat, [Value::Int(i)]) if (0..=2).contains(i) => Ok(Value::Int(*i)),
            (Class::Path, parts) => {
                if parts.iter().any(|p| heap.str(*p).is_none()) {
                    return Err(err("a path made of something that is not a string"));
                }
                heap.alloc(Obj::Ext(Box::new(DcpObj::Path)))
            }
            (c, _) => Err(err(format!("{c:?} called with arguments it does not take"))),
        }
    }

    fn new_object(&mut self, heap: &mut Heap, cls: Value, args: Value) -> Result<Value> {
        let class = match heap.ext::<DcpObj>(cls) {
            Some(DcpObj::Class(c)) if c.is_dataclass() => *c,
            _ => return Err(err("NEWOBJ of something that is not a DCP record class")),
        };
        if heap.tuple(args).is_none_or(|a| !a.is_empty()) {
            return Err(err("NEWOBJ of a DCP record with arguments"));
        }
        heap.alloc(Obj::Ext(Box::new(DcpObj::Instance { class, state: None })))
    }

    fn build(&mut self, heap: &mut Heap, obj: Value, state: Value) -> Result<()> {
        match heap.get_mut(obj) {
            Some(Obj::Ext(ext)) => match ext.as_any_mut().downcast_mut::<DcpObj>() {
                Some(DcpObj::Instance { state: slot, .. }) if slot.is_none() => {
                    *slot = Some(state);
                    Ok(())
                }
                _ => Err(err("BUILD twice, or on something that is not a DCP record")),
            },
            _ => Err(err("BUILD on something that is not a DCP record")),
        }
    }

    fn persistent_load(&mut self, _heap: &mut Heap, _pid: Value) -> Result<Value> {
        Err(err("a persistent id in DCP metadata"))
    }
}

/// One chunk of a tensor as the metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawChunk {
    pub(crate) offsets: Vec<u64>,
    pub(crate) sizes: Vec<u64>,
}

/// One key of the state dict.
#[derive(Debug, Clone)]
pub(crate) enum RawItem {
    Tensor {
        dtype: DType,
        size: Vec<u64>,
        chunks: Vec<RawChunk>,
    },
    Bytes,
}

/// Where one item's bytes are.
#[derive(Debug, Clone)]
pub(crate) struct RawStorage {
    pub(crate) fqn: String,
    /// The chunk's offsets; `None` for bytes items.
    pub(crate) offset: Option<Vec<u64>>,
    pub(crate) relative_path: String,
    pub(crate) start: u64,
    pub(crate) length: u64,
    pub(crate) transforms: Vec<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct RawMetadata {
    /// The pickle's protocol.
    pub(crate) protocol: u8,
    pub(crate) items: Vec<(String, RawItem)>,
    pub(crate) storages: Vec<RawStorage>,
    /// Saved without collectives: the tensor chunks a higher rank wrote
    /// again (replicated), beside the lowest rank's that `storages` keeps.
    pub(crate) copies: Vec<RawCopy>,
}

/// A tensor chunk a rank wrote that a lower rank wrote too.
#[derive(Debug, Clone)]
pub(crate) struct RawCopy {
    pub(crate) storage: RawStorage,
    /// The rank that wrote this copy.
    pub(crate) rank: usize,
    /// The rank whose copy `storages` keeps.
    pub(crate) kept: usize,
}

/// Reads fields of the decoded records, charging the heap's work budget.
struct Fields<'h> {
    heap: &'h Heap,
}

impl Fields<'_> {
    fn instance(&self, v: Value, want: Class, what: &str) -> Result<Option<Value>> {
        match self.heap.ext::<DcpObj>(v) {
            Some(DcpObj::Instance { class, state }) if *class == want => Ok(*state),
            _ => Err(err(format!("{what} is not a {want:?} record"))),
        }
    }

    /// The dataclass's field `name` from its state dict (`None` when the
    /// record has no state or lacks the field).
    fn field(&self, v: Value, want: Class, name: &str, what: &str) -> Result<Value> {
        let Some(state) = self.instance(v, want, what)? else {
            return Ok(Value::None);
        };
        let dict = self
            .heap
            .dict(state)
            .ok_or_else(|| err(format!("the state of {what} is not a dict")))?;
        Ok(dict.get_str(self.heap, name).unwrap_or(Value::None))
    }

    fn string(&self, v: Value, what: &str) -> Result<String> {
        self.heap
            .str(v)
            .map(str::to_owned)
            .ok_or_else(|| err(format!("{what} is not a string")))
    }

    fn uint(&self, v: Value, what: &str) -> Result<u64> {
        match v {
            Value::Int(i) => u64::try_from(i).map_err(|_| err(format!("{what} is negative: {i}"))),
            _ => Err(err(format!("{what} is not an int"))),
        }
    }

    fn dims(&self, v: Value, what: &str) -> Result<Vec<u64>> {
        let items = self
            .heap
            .sequence(v)
            .ok_or_else(|| err(format!("{what} is not a torch.Size")))?;
        self.heap.charge_work(items.len() as u64)?;
        items.iter().map(|&i| self.uint(i, what)).collect()
    }

    fn list(&self, v: Value, what: &str) -> Result<&[Value]> {
        let items = self
            .heap
            .sequence(v)
            .ok_or_else(|| err(format!("{what} is not a list")))?;
        self.heap.charge_work(items.len() as u64)?;
        Ok(items)
    }
}

/// Decode `.metadata` (`data`) into plain records. Nothing of the file is
/// trusted yet: `super` checks the geometry and the files.
pub(crate) fn decode(data: &[u8], limits: &Limits) -> Result<RawMetadata> {
    if data.len() as u64 > limits.max_pickle_bytes {
        return Err(Error::limit("max_pickle_bytes", limits.max_pickle_bytes));
    }
    let mut heap = Heap::new(limits);
    let mut vm = Vm::new(limits, StringEncoding::Utf8);
    let out = vm.run(&mut heap, &mut DcpInterp, data, 0)?;
    if out.end != data.len() {
        return Err(err(format!(
            "{} bytes after the pickle's STOP",
            data.len() - out.end
        ))
        .at(out.end as u64));
    }
    let f = Fields { heap: &heap };
    let root = out.value;
    let sd = f.field(root, Class::Metadata, "state_dict_metadata", "the root")?;
    let sd = heap
        .dict(sd)
        .ok_or_else(|| err("state_dict_metadata is not a dict"))?;
    if sd.entries().len() > limits.max_tensors {
        return Err(Error::limit("max_tensors", limits.max_tensors as u64));
    }
    let mut items = Vec::with_capacity(sd.entries().len());
    let mut chunk_count: usize = 0;
    for &(key, md) in sd.entries() {
        let name = f.string(key, "a state_dict_metadata key")?;
        let item = match heap.ext::<DcpObj>(md) {
            Some(DcpObj::Instance {
                class: Class::BytesStorage,
                ..
            }) => RawItem::Bytes,
            Some(DcpObj::Instance {
                class: Class::TensorStorage,
                ..
            }) => decode_tensor(&f, md, &name, &mut chunk_count, limits)?,
            _ => {
                return Err(err(
                    "its metadata is neither TensorStorageMetadata nor BytesStorageMetadata",
                )
                .for_tensor(&name))
            }
        };
        items.push((name, item));
    }
    let storage = f.field(root, Class::Metadata, "storage_data", "the root")?;
    let storage = heap.dict(storage).ok_or_else(|| {
        Error::new(
            ErrorKind::Unsupported,
            "storage_data is not the dict FileSystemWriter writes (another storage writer?)",
        )
    })?;
    if storage.entries().len() > chunk_count.saturating_add(items.len()) {
        return Err(err(format!(
            "storage_data has {} entries for {} chunks and items",
            storage.entries().len(),
            chunk_count.saturating_add(items.len())
        )));
    }
    let mut storages = Vec::with_capacity(storage.entries().len());
    for &(index, info) in storage.entries() {
        let fqn = f.string(
            f.field(index, Class::Index, "fqn", "a storage_data key")?,
            "a MetadataIndex's fqn",
        )?;
        let offset = match f.field(index, Class::Index, "offset", "a storage_data key")? {
            Value::None => None,
            v => Some(
                f.dims(v, "a MetadataIndex's offset")
                    .map_err(|e| e.for_tensor(&fqn))?,
            ),
        };
        let what = "a storage_data value";
        let relative_path = f.string(
            f.field(info, Class::StorageInfo, "relative_path", what)?,
            "relative_path",
        )?;
        let start = f.uint(f.field(info, Class::StorageInfo, "offset", what)?, "offset")?;
        let length = f.uint(f.field(info, Class::StorageInfo, "length", what)?, "length")?;
        let mut transforms = Vec::new();
        match f.field(info, Class::StorageInfo, "transform_descriptors", what)? {
            Value::None => {}
            v => {
                for &t in f.list(v, "transform_descriptors")? {
                    transforms.push(f.string(t, "a transform descriptor")?);
                }
            }
        }
        storages.push(RawStorage {
            fqn,
            offset,
            relative_path,
            start,
            length,
            transforms,
        });
    }
    Ok(RawMetadata {
        protocol: out.protocol,
        items,
        storages,
        copies: Vec::new(),
    })
}

fn decode_tensor(
    f: &Fields<'_>,
    md: Value,
    name: &str,
    chunk_count: &mut usize,
    limits: &Limits,
) -> Result<RawItem> {
    let at = |e: Error| e.for_tensor(name);
    let what = "a TensorStorageMetadata";
    let props = f
        .field(md, Class::TensorStorage, "properties", what)
        .map_err(at)?;
    // TensorProperties' state is the tuple its __getstate__ returns:
    // (dtype, layout, requires_grad, memory format, pin_memory[, strides]).
    let state = f
        .instance(props, Class::Properties, "its properties")
        .map_err(at)?
        .ok_or_else(|| at(err("its TensorProperties has no state")))?;
    let state = f
        .heap
        .tuple(state)
        .ok_or_else(|| at(err("its TensorProperties' state is not a tuple")))?;
    let dtype = match state.first().and_then(|&d| f.heap.ext::<DcpObj>(d)) {
        Some(DcpObj::DType(d)) => *d,
        _ => return Err(at(err("its TensorProperties has no dtype"))),
    };
    match state.get(1).and_then(|&l| f.heap.ext::<DcpObj>(l)) {
        Some(DcpObj::Layout) => {}
        _ => return Err(at(err("its TensorProperties has no strided layout"))),
    }
    let size = f
        .dims(
            f.field(md, Class::TensorStorage, "size", what)
                .map_err(at)?,
            "its size",
        )
        .map_err(at)?;
    let list = f
        .list(
            f.field(md, Class::TensorStorage, "chunks", what)
                .map_err(at)?,
            "its chunks",
        )
        .map_err(at)?;
    *chunk_count = chunk_count.saturating_add(list.len());
    if *chunk_count > limits.max_tensors {
        return Err(Error::limit("max_tensors", limits.max_tensors as u64));
    }
    let mut chunks = Vec::with_capacity(list.len());
    for &c in list {
        let w = "a ChunkStorageMetadata";
        let offsets = f
            .dims(
                f.field(c, Class::Chunk, "offsets", w).map_err(at)?,
                "a chunk's offsets",
            )
            .map_err(at)?;
        let sizes = f
            .dims(
                f.field(c, Class::Chunk, "sizes", w).map_err(at)?,
                "a chunk's sizes",
            )
            .map_err(at)?;
        chunks.push(RawChunk { offsets, sizes });
    }
    Ok(RawItem::Tensor {
        dtype,
        size,
        chunks,
    })
}

/// The metadata of a save without collectives, one per rank (rank order),
/// as one: every key once (its dtype and size the same in every rank),
/// each tensor's chunks and every storage entry once. A replicated tensor
/// that every rank wrote is taken from the lowest rank.
pub(crate) fn merge(ranks: Vec<RawMetadata>) -> Result<RawMetadata> {
    use std::collections::{HashMap, HashSet};
    let protocol = ranks.first().map_or(0, |r| r.protocol);
    let mut items: Vec<(String, RawItem)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    let mut seen_chunks: HashSet<(String, Vec<u64>, Vec<u64>)> = HashSet::new();
    let mut storages: Vec<RawStorage> = Vec::new();
    let mut seen_storage: HashMap<(String, Option<Vec<u64>>), usize> = HashMap::new();
    let mut copies = Vec::new();
    for (rank, md) in ranks.into_iter().enumerate() {
        for (name, item) in md.items {
            let Some(&i) = at.get(&name) else {
                if let RawItem::Tensor { chunks, .. } = &item {
                    for c in chunks {
                        seen_chunks.insert((name.clone(), c.offsets.clone(), c.sizes.clone()));
                    }
                }
                at.insert(name.clone(), items.len());
                items.push((name, item));
                continue;
            };
            let Some((_, first)) = items.get_mut(i) else {
                continue;
            };
            match (first, item) {
                (RawItem::Bytes, RawItem::Bytes) => {}
                (
                    RawItem::Tensor {
                        dtype,
                        size,
                        chunks,
                    },
                    RawItem::Tensor {
                        dtype: d,
                        size: z,
                        chunks: more,
                    },
                ) if *dtype == d && *size == z => {
                    for c in more {
                        if seen_chunks.insert((name.clone(), c.offsets.clone(), c.sizes.clone())) {
                            chunks.push(c);
                        }
                    }
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::Tensor,
                        format!("rank {rank} describes it otherwise than a lower rank"),
                    )
                    .for_tensor(&name))
                }
            }
        }
        for s in md.storages {
            match seen_storage.entry((s.fqn.clone(), s.offset.clone())) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(rank);
                    storages.push(s);
                }
                // A tensor chunk written again is kept, to be compared
                // with the first when it is read.
                std::collections::hash_map::Entry::Occupied(o) if s.offset.is_some() => {
                    copies.push(RawCopy {
                        storage: s,
                        rank,
                        kept: *o.get(),
                    });
                }
                std::collections::hash_map::Entry::Occupied(_) => {}
            }
        }
    }
    Ok(RawMetadata {
        protocol,
        items,
        storages,
        copies,
    })
}
