//! Entry points into single layers of the reader, for fuzz targets and
//! differential tests. Behind the `fuzzing` feature and hidden from the docs:
//! these are not a stable API.

use crate::container::layout::record_bytes;
use crate::container::{detect, zip, Detected};
use crate::error::Result;
use crate::limits::Limits;
use crate::pickle::StringEncoding;
use crate::pickle::{Heap, Obj, Value, Vm};
use crate::torch::decode::decode_legacy;
use crate::torch::policy::Policy;
use crate::torch::TorchInterp;

/// A pickle value made only of Python's plain data types.
#[derive(Debug, Clone, PartialEq)]
pub enum Plain {
    /// `None`.
    None,
    /// `True` or `False`.
    Bool(bool),
    /// An int that fits in i64.
    Int(i64),
    /// A larger int, as little-endian two's complement bytes (minimal length).
    BigInt(Vec<u8>),
    /// A float.
    Float(f64),
    /// A str.
    Str(String),
    /// bytes (also bytearray).
    Bytes(Vec<u8>),
    /// A list.
    List(Vec<Plain>),
    /// A tuple.
    Tuple(Vec<Plain>),
    /// A dict, in insertion order.
    Dict(Vec<(Plain, Plain)>),
    /// A set or frozenset, in insertion order.
    Set(Vec<Plain>),
}

/// How far [`run_pickle`] expands the object graph into a [`Plain`] tree.
const MAX_DEPTH: usize = 64;
const MAX_NODES: usize = 100_000;

/// What one pickle gave.
#[derive(Debug, Clone)]
pub struct PickleRun {
    /// The value, when it is plain data (not objects, globals or cycles)
    /// and small enough to expand as a tree.
    pub plain: Option<Plain>,
    /// Offset just past STOP: bytes after it are not read.
    pub end: usize,
    /// PUTs that replaced an already defined memo entry.
    pub memo_overwrites: usize,
    /// Every global the pickle names, as `module.name`.
    pub globals: Vec<String>,
}

/// Run one pickle through the VM with the torch interpreter (default policy),
/// as a checkpoint's `data.pkl` would be.
pub fn run_pickle(data: &[u8], limits: &Limits, encoding: StringEncoding) -> Result<PickleRun> {
    let mut heap = Heap::new(limits);
    let allowed = Vec::new();
    let mut interp = TorchInterp::new(Policy::Default, &allowed);
    interp.enter("data.pkl", Some("data/".to_owned()));
    let mut vm = Vm::new(limits, encoding);
    let out = vm.run(&mut heap, &mut interp, data, 0)?;
    let mut nodes = 0;
    Ok(PickleRun {
        plain: to_plain(&heap, out.value, 0, &mut nodes),
        end: out.end,
        memo_overwrites: out.memo_overwrites,
        globals: interp.globals.iter().map(|g| g.path()).collect(),
    })
}

fn to_plain(heap: &Heap, v: Value, depth: usize, nodes: &mut usize) -> Option<Plain> {
    *nodes += 1;
    if depth > MAX_DEPTH || *nodes > MAX_NODES {
        return None;
    }
    let list = |items: &[Value], nodes: &mut usize| -> Option<Vec<Plain>> {
        items
            .iter()
            .map(|&i| to_plain(heap, i, depth + 1, nodes))
            .collect()
    };
    Some(match v {
        Value::None => Plain::None,
        Value::Bool(b) => Plain::Bool(b),
        Value::Int(i) => Plain::Int(i),
        Value::Float(f) => Plain::Float(f),
        Value::Obj(_) => match heap.get(v)? {
            Obj::Str(_) => Plain::Str(heap.str(v)?.to_owned()),
            Obj::Bytes(_) => Plain::Bytes(heap.bytes(v)?.to_vec()),
            Obj::BigInt(_) => Plain::BigInt(heap.bigint(v)?.to_vec()),
            Obj::Tuple(_) => Plain::Tuple(list(heap.tuple(v)?, nodes)?),
            Obj::List(items) => Plain::List(list(items, nodes)?),
            Obj::Set(members) => Plain::Set(
                members
                    .entries()
                    .iter()
                    .map(|&(k, _)| to_plain(heap, k, depth + 1, nodes))
                    .collect::<Option<_>>()?,
            ),
            Obj::Dict(d) => Plain::Dict(
                d.entries()
                    .iter()
                    .map(|&(k, v)| {
                        Some((
                            to_plain(heap, k, depth + 1, nodes)?,
                            to_plain(heap, v, depth + 1, nodes)?,
                        ))
                    })
                    .collect::<Option<_>>()?,
            ),
            Obj::Object(_) | Obj::Ext(_) => return None,
        },
    })
}

/// The container layer alone: detect the layout, then for a zip read every
/// record (inflating and checking CRCs within the limits), for a legacy file
/// walk its pickles and storage headers. Returns the number of records.
pub fn read_container(data: &[u8], limits: &Limits) -> Result<usize> {
    match detect(data)? {
        Detected::Zip => {
            let archive = zip::Archive::parse(data, zip::Headers::Map, limits)?;
            let mut budget = limits.max_decompressed_bytes;
            for entry in archive.entries() {
                record_bytes(data, entry, u64::MAX, &mut budget)?;
            }
            Ok(archive.entries().len())
        }
        Detected::Safetensors => {
            let header = crate::container::safetensors::parse(data.into(), limits, |name| {
                crate::torch::dtype::DType::from_safetensors_name(name).map(|d| d.size() as u64)
            })?;
            Ok(header.entries.len())
        }
        Detected::Legacy => {
            let mut heap = Heap::new(limits);
            let allowed = Vec::new();
            let mut interp = TorchInterp::new(Policy::Default, &allowed);
            let mut vm = Vm::new(limits, StringEncoding::Utf8);
            let decoded = decode_legacy(data, &mut heap, &mut interp, &mut vm)?;
            Ok(decoded.storages.len())
        }
    }
}
