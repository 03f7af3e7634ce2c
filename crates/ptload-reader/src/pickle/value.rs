//! Values of the pickle VM.
//!
//! Every compound value lives in one arena (`Heap`) and is referred to by
//! index. The memo and the stack hold `Value`s, which are `Copy`: a memo
//! reference (BINGET, DUP) costs nothing and never deep-copies, cycles are
//! just indices, and dropping the arena never recurses however deep the
//! structure is. Strings, bytes and tuples (immutable in Python) live in
//! append-only pools, so most values cost no allocation of their own.

use std::any::Any;
use std::cell::Cell;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::error::{Error, Result};
use crate::limits::Limits;

pub(crate) type ObjId = u32;

/// A pickle value: a scalar, or a reference into the heap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Obj(ObjId),
}

/// A range of one of the heap's pools.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    start: u32,
    len: u32,
}

impl Span {
    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.start as usize + self.len as usize
    }
}

/// A compound value.
#[derive(Debug)]
pub(crate) enum Obj {
    Str(Span),
    Bytes(Span),
    /// An integer beyond i64: little-endian two's complement.
    BigInt(Span),
    Tuple(Span),
    List(Vec<Value>),
    Dict(Dict),
    /// A set or frozenset: its members are the keys of a dict (values
    /// `None`), so equal members collapse as in Python.
    Set(Dict),
    /// An instance of a class the reader does not interpret: kept inert.
    Object(Box<Object>),
    /// Something a layer above gives meaning to (the torch layer's
    /// globals, storages, tensors...): the VM only stores it.
    Ext(Box<dyn Extension>),
}

/// A value the interpreter above the VM makes (see [`Obj::Ext`]). The
/// pickle layer knows nothing of it but its name, for messages.
pub(crate) trait Extension: Any + std::fmt::Debug {
    /// What it is, in messages: "tensor", "storage", "global".
    fn kind_name(&self) -> &'static str;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// What Python type a heap value has beyond its kind, where the kind alone
/// would lose it (kept beside the value, so readers of the kind are
/// unchanged; see [`Heap::tag`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tag {
    /// A dict made by `collections.OrderedDict`.
    OrderedDict,
    /// A set made by `frozenset` (FROZENSET or the global).
    FrozenSet,
    /// Bytes made by `bytearray` (BYTEARRAY8 or the global).
    ByteArray,
    /// A tuple made by `torch.Size`.
    Size,
    /// An inert object made by NEWOBJ/OBJ/INST (`cls.__new__(cls, *args)`),
    /// not by REDUCE (`callable(*args)`).
    NewObj,
}

/// An inert instance: what was called, with what, and what was set on it.
#[derive(Debug)]
pub(crate) struct Object {
    pub(crate) class: Value,
    pub(crate) args: Value,
    pub(crate) state: Option<Value>,
    /// Items set by SETITEM(S) on a dict subclass.
    pub(crate) items: Dict,
    /// Items added by APPEND(S) on a list subclass.
    pub(crate) list: Vec<Value>,
}

/// How a dict key is compared, as Python would: by value for scalars,
/// strings, bytes and tuples of those, by identity for everything else.
/// Borrowed from the heap, so indexing a key allocates nothing (but for
/// tuple keys, which are rare).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key<'h> {
    None,
    Int(i64),
    Float(u64),
    Str(&'h str),
    Bytes(&'h [u8]),
    BigInt(&'h [u8]),
    /// A tuple's members, encoded so that equal tuples encode the same.
    Tuple(Vec<u8>),
    Id(ObjId),
}

/// Tuple keys with more members than this (counting nested tuples' members)
/// compare by identity, so a huge tuple used as a key many times cannot
/// make every lookup expensive.
const MAX_TUPLE_KEY_ITEMS: usize = 64;

/// Tuple keys whose members hold more bytes than this compare by identity
/// too: comparing by value would copy them on every lookup.
const MAX_TUPLE_KEY_BYTES: usize = 64 << 10;

/// An insertion-ordered dict with Python's replace-on-equal-key semantics.
/// Its table is allocated with its first item: an empty dict (torch saves
/// one as `_metadata` per tensor) costs no allocation.
#[derive(Debug, Default)]
pub(crate) struct Dict {
    table: Option<Box<DictTable>>,
}

#[derive(Debug, Default)]
struct DictTable {
    entries: Vec<(Value, Value)>,
    /// Indices into `entries`, hashed by key content.
    index: HashTable<u32>,
}

impl Dict {
    pub(crate) fn entries(&self) -> &[(Value, Value)] {
        self.table.as_ref().map_or(&[], |t| &t.entries)
    }

    pub(crate) fn get_str(&self, heap: &Heap, key: &str) -> Option<Value> {
        // Python 2 pickles may key by bytes: looked up by hash too, so a
        // missing key costs one probe however large the dict.
        self.find(heap, Key::Str(key))
            .or_else(|| self.find(heap, Key::Bytes(key.as_bytes())))
    }

    fn find(&self, heap: &Heap, wanted: Key<'_>) -> Option<Value> {
        let table = self.table.as_ref()?;
        let hash = heap.hasher.hash_one(&wanted);
        table
            .index
            .find(hash, |&i| {
                table
                    .entries
                    .get(i as usize)
                    .is_some_and(|&(k, _)| heap.key(k) == wanted)
            })
            .and_then(|&i| table.entries.get(i as usize))
            .map(|&(_, v)| v)
    }
}

/// The arena of compound values, with the budgets that bound it.
#[derive(Debug)]
pub(crate) struct Heap {
    objs: Vec<Obj>,
    max_objects: usize,
    max_container_len: usize,
    decoded_bytes: u64,
    max_decoded_bytes: u64,
    hasher: hashbrown::DefaultHashBuilder,
    /// Contents of every `Obj::Str`.
    text: String,
    /// Contents of every `Obj::Bytes` and `Obj::BigInt`.
    blob: Vec<u8>,
    /// Items of every `Obj::Tuple`.
    pool: Vec<Value>,
    /// Work done so far: one unit per opcode, plus one per byte or item
    /// an operation touches (hashing a key, copying a referenced value).
    /// A cell, so lookups through `&self` charge it too.
    work: Cell<u64>,
    /// Work allowed so far: `max_work_per_byte` for each pickle byte run.
    work_allowed: u64,
    work_per_byte: u64,
    /// Python types beyond the kind (see [`Tag`]), by object id: one
    /// entry per object of `objs`.
    tags: Vec<Option<Tag>>,
    /// State a BUILD set on a dict (an OrderedDict's `_metadata`).
    dict_states: hashbrown::HashMap<ObjId, Value>,
}

/// The most pickle bytes room is reserved for before a pickle runs (a
/// legacy file's pickles are followed by all of its tensors' bytes, which
/// make no value; an allocator that commits what is reserved would hold
/// memory in proportion to the file): larger pickles grow the pools as
/// they fill.
const RESERVE_MAX_LEN: usize = 4 << 20;

/// Pickles shorter than this are allowed the work of one this long, so
/// tiny files are not held to a tiny budget.
const MIN_WORK_BYTES: u64 = 64 << 10;

fn span(start: usize, len: usize) -> Result<Span> {
    match (u32::try_from(start), u32::try_from(len)) {
        (Ok(start), Ok(len)) if start.checked_add(len).is_some() => Ok(Span { start, len }),
        _ => Err(Error::limit("max_decoded_bytes", u64::from(u32::MAX))),
    }
}

impl Heap {
    pub(crate) fn new(limits: &Limits) -> Heap {
        Heap {
            objs: Vec::new(),
            max_objects: limits.max_objects,
            max_container_len: limits.max_container_len,
            decoded_bytes: 0,
            max_decoded_bytes: limits.max_decoded_bytes,
            hasher: Default::default(),
            text: String::new(),
            blob: Vec::new(),
            pool: Vec::new(),
            work: Cell::new(0),
            work_allowed: 0,
            work_per_byte: limits.max_work_per_byte,
            tags: Default::default(),
            dict_states: Default::default(),
        }
    }

    /// Allow the work of running a pickle of `len` bytes.
    pub(crate) fn allow_work_for(&mut self, len: usize) {
        let len = (len as u64).max(MIN_WORK_BYTES);
        self.work_allowed = self
            .work_allowed
            .saturating_add(len.saturating_mul(self.work_per_byte));
    }

    /// Work done so far (see [`Limits::max_work_per_byte`]).
    pub(crate) fn work(&self) -> u64 {
        self.work.get()
    }

    /// Charge `n` units of work; an error once past the allowance.
    pub(crate) fn charge_work(&self, n: u64) -> Result<()> {
        self.work.set(self.work.get().saturating_add(n));
        self.check_work()
    }

    fn add_work(&self, n: usize) {
        self.work.set(self.work.get().saturating_add(n as u64));
    }

    pub(crate) fn check_work(&self) -> Result<()> {
        if self.work.get() > self.work_allowed {
            return Err(Error::limit("max_work_per_byte", self.work_per_byte));
        }
        Ok(())
    }

    /// Reserve room for what a pickle of `len` bytes can create at most
    /// about, so the pools grow without repeated copies. Sized by bytes
    /// that are present, never by a length the file claims.
    pub(crate) fn reserve_for(&mut self, len: usize) {
        // torch's pickles spend about 9 bytes a value.
        // Room in all, not more room: a file of several pickles (legacy
        // files have five) reserves once, instead of growing (and copying)
        // every pool at each pickle.
        let len = len.min(RESERVE_MAX_LEN);
        let objects = len / 8;
        self.objs.reserve(objects.saturating_sub(self.objs.len()));
        self.tags.reserve(objects.saturating_sub(self.tags.len()));
        self.pool.reserve((len / 6).saturating_sub(self.pool.len()));
        self.text.reserve((len / 4).saturating_sub(self.text.len()));
    }

    pub(crate) fn alloc_str(&mut self, s: &str) -> Result<Value> {
        self.charge_bytes(s.len())?;
        let sp = span(self.text.len(), s.len())?;
        self.text.push_str(s);
        self.alloc(Obj::Str(sp))
    }

    pub(crate) fn alloc_bytes(&mut self, b: &[u8]) -> Result<Value> {
        self.charge_bytes(b.len())?;
        let sp = span(self.blob.len(), b.len())?;
        self.blob.extend_from_slice(b);
        self.alloc(Obj::Bytes(sp))
    }

    pub(crate) fn alloc_bigint(&mut self, le: &[u8]) -> Result<Value> {
        self.charge_bytes(le.len())?;
        let sp = span(self.blob.len(), le.len())?;
        self.blob.extend_from_slice(le);
        self.alloc(Obj::BigInt(sp))
    }

    pub(crate) fn alloc_tuple(&mut self, items: &[Value]) -> Result<Value> {
        self.check_len(items.len())?;
        self.charge_work(items.len() as u64)?;
        let sp = span(self.pool.len(), items.len())?;
        self.pool.extend_from_slice(items);
        self.alloc(Obj::Tuple(sp))
    }

    // Spans are made by the pools' own appends, so these always find them.
    fn span_str(&self, sp: Span) -> Option<&str> {
        self.text.get(sp.range())
    }

    fn span_bytes(&self, sp: Span) -> Option<&[u8]> {
        self.blob.get(sp.range())
    }

    fn span_values(&self, sp: Span) -> Option<&[Value]> {
        self.pool.get(sp.range())
    }

    pub(crate) fn alloc(&mut self, obj: Obj) -> Result<Value> {
        if self.objs.len() >= self.max_objects {
            return Err(Error::limit("max_objects", self.max_objects as u64));
        }
        let id = ObjId::try_from(self.objs.len())
            .map_err(|_| Error::limit("max_objects", self.max_objects as u64))?;
        self.objs.push(obj);
        self.tags.push(None);
        Ok(Value::Obj(id))
    }

    /// Charge `n` decoded bytes (strings, bytes, big integers, and text
    /// the torch layer copies out of them), as memory and as work.
    pub(crate) fn charge_bytes(&mut self, n: usize) -> Result<()> {
        self.charge_work(n as u64)?;
        self.decoded_bytes = self.decoded_bytes.saturating_add(n as u64);
        if self.decoded_bytes > self.max_decoded_bytes {
            return Err(Error::limit("max_decoded_bytes", self.max_decoded_bytes));
        }
        Ok(())
    }

    pub(crate) fn check_len(&self, len: usize) -> Result<()> {
        if len > self.max_container_len {
            return Err(Error::limit(
                "max_container_len",
                self.max_container_len as u64,
            ));
        }
        Ok(())
    }

    /// Record that `v` has the Python type `tag` (scalars take none).
    pub(crate) fn tag(&mut self, v: Value, tag: Tag) {
        if let Value::Obj(id) = v {
            if let Some(slot) = self.tags.get_mut(id as usize) {
                *slot = Some(tag);
            }
        }
    }

    /// The Python type recorded for `v`, if any.
    pub(crate) fn tag_of(&self, v: Value) -> Option<Tag> {
        match v {
            Value::Obj(id) => self.tags.get(id as usize).copied().flatten(),
            _ => None,
        }
    }

    /// Keep the state a BUILD gave the dict `v`.
    pub(crate) fn set_dict_state(&mut self, v: Value, state: Value) {
        if let Value::Obj(id) = v {
            self.dict_states.insert(id, state);
        }
    }

    /// The state a BUILD gave the dict `v`.
    pub(crate) fn dict_state(&self, v: Value) -> Option<Value> {
        match v {
            Value::Obj(id) => self.dict_states.get(&id).copied(),
            _ => None,
        }
    }

    /// Number of values in the arena.
    pub(crate) fn len(&self) -> usize {
        self.objs.len()
    }

    pub(crate) fn get(&self, v: Value) -> Option<&Obj> {
        match v {
            Value::Obj(id) => self.objs.get(id as usize),
            _ => None,
        }
    }

    pub(crate) fn get_mut(&mut self, v: Value) -> Option<&mut Obj> {
        match v {
            Value::Obj(id) => self.objs.get_mut(id as usize),
            _ => None,
        }
    }

    pub(crate) fn str(&self, v: Value) -> Option<&str> {
        match self.get(v) {
            Some(Obj::Str(s)) => self.span_str(*s),
            _ => None,
        }
    }

    pub(crate) fn bytes(&self, v: Value) -> Option<&[u8]> {
        match self.get(v) {
            Some(Obj::Bytes(b)) => self.span_bytes(*b),
            _ => None,
        }
    }

    /// The objects used as keys of dicts and members of sets, in order of
    /// creation: Python hashes each (and compares equal hashes), running
    /// its class's `__hash__` and `__eq__`.
    #[cfg(feature = "scan")]
    pub(crate) fn hashed_objects(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for o in &self.objs {
            if let Obj::Dict(d) | Obj::Set(d) = o {
                out.extend(
                    d.entries()
                        .iter()
                        .map(|&(k, _)| k)
                        .filter(|k| matches!(k, Value::Obj(_))),
                );
            }
        }
        out
    }

    /// Every bytes value, in order of creation.
    #[cfg(feature = "scan")]
    pub(crate) fn byte_strings(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.objs.iter().filter_map(|o| match o {
            Obj::Bytes(b) => self.span_bytes(*b),
            _ => None,
        })
    }

    pub(crate) fn bigint(&self, v: Value) -> Option<&[u8]> {
        match self.get(v) {
            Some(Obj::BigInt(b)) => self.span_bytes(*b),
            _ => None,
        }
    }

    /// A string, or bytes that are valid UTF-8 (Python 2 `str` kept as bytes).
    pub(crate) fn text(&self, v: Value) -> Option<&str> {
        match self.get(v) {
            Some(Obj::Str(s)) => self.span_str(*s),
            Some(Obj::Bytes(b)) => self
                .span_bytes(*b)
                .and_then(|b| std::str::from_utf8(b).ok()),
            _ => None,
        }
    }

    pub(crate) fn tuple(&self, v: Value) -> Option<&[Value]> {
        match self.get(v) {
            Some(Obj::Tuple(t)) => self.span_values(*t),
            _ => None,
        }
    }

    /// Elements of a tuple or list.
    pub(crate) fn sequence(&self, v: Value) -> Option<&[Value]> {
        match self.get(v) {
            Some(Obj::Tuple(t)) => self.span_values(*t),
            Some(Obj::List(l)) => Some(l),
            _ => None,
        }
    }

    /// Elements of a tuple, list or set.
    pub(crate) fn members(&self, v: Value) -> Option<Vec<Value>> {
        let members = match self.get(v) {
            Some(Obj::Set(s)) => Some(s.entries().iter().map(|&(k, _)| k).collect()),
            _ => self.sequence(v).map(<[Value]>::to_vec),
        };
        self.add_work(members.as_ref().map_or(0, Vec::len));
        members
    }

    pub(crate) fn dict(&self, v: Value) -> Option<&Dict> {
        match self.get(v) {
            Some(Obj::Dict(d)) => Some(d),
            _ => None,
        }
    }

    /// The extension value `v` refers to, when it is one of type `T`.
    pub(crate) fn ext<T: Extension>(&self, v: Value) -> Option<&T> {
        match self.get(v) {
            Some(Obj::Ext(e)) => e.as_any().downcast_ref(),
            _ => None,
        }
    }

    /// Append a by-value encoding of the key `v`; false when it holds
    /// something compared by identity or is nested too deep.
    fn encode_key(&self, v: Value, budget: &mut usize, out: &mut Vec<u8>) -> bool {
        if *budget == 0 || out.len() > MAX_TUPLE_KEY_BYTES {
            return false;
        }
        *budget -= 1;
        fn bytes(out: &mut Vec<u8>, tag: u8, b: &[u8]) {
            out.push(tag);
            out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend_from_slice(b);
        }
        if let Some(items) = self.tuple(v) {
            bytes(out, b'T', &(items.len() as u64).to_le_bytes());
            return items.iter().all(|&i| self.encode_key(i, budget, out));
        }
        if let Some(Obj::Set(members)) = self.get(v) {
            // A frozenset: equal by members, in any order.
            let mut encoded = Vec::new();
            for &(m, _) in members.entries() {
                let mut e = Vec::new();
                if !self.encode_key(m, budget, &mut e) {
                    return false;
                }
                if e.len() > MAX_TUPLE_KEY_BYTES {
                    return false;
                }
                encoded.push(e);
            }
            encoded.sort_unstable();
            bytes(out, b'Z', &(encoded.len() as u64).to_le_bytes());
            encoded.iter().for_each(|e| out.extend_from_slice(e));
            return true;
        }
        let (tag, content): (u8, std::borrow::Cow<'_, [u8]>) = match self.key(v) {
            Key::None => (b'N', (&[][..]).into()),
            Key::Int(i) => (b'I', i.to_le_bytes().to_vec().into()),
            Key::Float(f) => (b'F', f.to_le_bytes().to_vec().into()),
            Key::Str(s) => (b'S', s.as_bytes().into()),
            Key::Bytes(b) => (b'B', b.into()),
            Key::BigInt(b) => (b'L', b.into()),
            Key::Tuple(_) | Key::Id(_) => return false,
        };
        if out.len().saturating_add(content.len()) > MAX_TUPLE_KEY_BYTES {
            return false;
        }
        bytes(out, tag, &content);
        true
    }

    fn key(&self, v: Value) -> Key<'_> {
        match v {
            Value::None => Key::None,
            Value::Bool(b) => Key::Int(i64::from(b)),
            Value::Int(i) => Key::Int(i),
            Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Key::Int(f as i64),
            Value::Float(f) => Key::Float(f.to_bits()),
            // Hashing or comparing a key reads all of it: charged, since a
            // memo reference lets a few bytes of pickle name a long key.
            Value::Obj(id) => match self.objs.get(id as usize) {
                Some(Obj::Str(s)) => {
                    self.add_work(s.len as usize);
                    self.span_str(*s).map_or(Key::Id(id), Key::Str)
                }
                Some(Obj::Bytes(b)) => {
                    self.add_work(b.len as usize);
                    self.span_bytes(*b).map_or(Key::Id(id), Key::Bytes)
                }
                Some(Obj::BigInt(b)) => {
                    self.add_work(b.len as usize);
                    self.span_bytes(*b).map_or(Key::Id(id), Key::BigInt)
                }
                Some(Obj::Tuple(_) | Obj::Set(_)) => {
                    let mut enc = Vec::new();
                    let by_value = self.encode_key(v, &mut { MAX_TUPLE_KEY_ITEMS }, &mut enc)
                        && enc.len() <= MAX_TUPLE_KEY_BYTES;
                    self.add_work(enc.len());
                    if by_value {
                        Key::Tuple(enc)
                    } else {
                        Key::Id(id)
                    }
                }
                _ => Key::Id(id),
            },
        }
    }

    /// `target[key] = value` for a dict, or for the items of an inert object.
    pub(crate) fn set_item(
        &mut self,
        target: Value,
        key: Value,
        value: Value,
    ) -> Result<(), &'static str> {
        self.set_items(target, &[key, value])
    }

    /// SETITEMS: each `(key, value)` pair of `pairs` set in order, the
    /// dict taken out of the arena once (its keys are compared with values
    /// that live in the arena) and grown once for them (they are on the
    /// VM's stack already, so the room is bounded by what was charged);
    /// stops at the first error.
    pub(crate) fn set_items(&mut self, target: Value, pairs: &[Value]) -> Result<(), &'static str> {
        let mut dict = match self.get_mut(target) {
            Some(Obj::Dict(d)) => std::mem::take(d),
            Some(Obj::Object(o)) => std::mem::take(&mut o.items),
            Some(other) => return Err(kind_name(other)),
            None => return Err("scalar"),
        };
        let more = (pairs.len() / 2).min(self.max_container_len);
        if more > 1 {
            let table = dict.table.get_or_insert_with(Box::default);
            table.entries.reserve(more);
            let entries = &table.entries;
            table.index.reserve(more, |&j| {
                entries
                    .get(j as usize)
                    .map_or(0, |&(e, _)| self.hasher.hash_one(self.key(e)))
            });
        }
        let mut result = Ok(());
        for pair in pairs.chunks_exact(2) {
            if let [k, v] = *pair {
                result = self.insert(&mut dict, k, v);
                if result.is_err() {
                    break;
                }
            }
        }
        match self.get_mut(target) {
            Some(Obj::Dict(d)) => *d = dict,
            Some(Obj::Object(o)) => o.items = dict,
            _ => {}
        }
        result
    }

    fn insert(&self, dict: &mut Dict, key: Value, value: Value) -> Result<(), &'static str> {
        // Python refuses mutable keys (TypeError: unhashable type).
        match self.get(key) {
            Some(Obj::List(_)) => return Err("dict or set with an unhashable list key"),
            Some(Obj::Dict(_)) => return Err("dict or set with an unhashable dict key"),
            _ => {}
        }
        let k = self.key(key);
        let hash = self.hasher.hash_one(&k);
        let dict = dict.table.get_or_insert_with(Box::default);
        let entries = &mut dict.entries;
        let found = dict
            .index
            .find(hash, |&i| {
                entries
                    .get(i as usize)
                    .is_some_and(|&(e, _)| self.key(e) == k)
            })
            .copied();
        if self.check_work().is_err() {
            return Err("work over Limits::max_work_per_byte");
        }
        if let Some(i) = found {
            if let Some(slot) = entries.get_mut(i as usize) {
                slot.1 = value;
            }
            return Ok(());
        }
        if entries.len() >= self.max_container_len {
            return Err("dict over Limits::max_container_len");
        }
        let i = u32::try_from(entries.len()).map_err(|_| "dict too large")?;
        entries.push((key, value));
        let entries = &*entries;
        dict.index.insert_unique(hash, i, |&j| {
            entries
                .get(j as usize)
                .map_or(0, |&(e, _)| self.hasher.hash_one(self.key(e)))
        });
        Ok(())
    }

    /// Append to a list, or to the list items of an inert object.
    pub(crate) fn append(&mut self, target: Value, values: &[Value]) -> Result<(), &'static str> {
        let max = self.max_container_len;
        let list = match self.get_mut(target) {
            Some(Obj::List(l)) => l,
            Some(Obj::Object(o)) => &mut o.list,
            Some(other) => return Err(kind_name(other)),
            None => return Err("scalar"),
        };
        if list.len().saturating_add(values.len()) > max {
            return Err("list over Limits::max_container_len");
        }
        list.extend_from_slice(values);
        Ok(())
    }

    pub(crate) fn add_to_set(
        &mut self,
        target: Value,
        values: &[Value],
    ) -> Result<(), &'static str> {
        let mut set = match self.get_mut(target) {
            Some(Obj::Set(s)) => std::mem::take(s),
            Some(other) => return Err(kind_name(other)),
            None => return Err("scalar"),
        };
        let result = values
            .iter()
            .try_for_each(|&v| self.insert(&mut set, v, Value::None));
        if let Some(Obj::Set(s)) = self.get_mut(target) {
            *s = set;
        }
        result
    }

    pub(crate) fn new_set_from(&mut self, members: &[Value]) -> Result<Value> {
        let s = self.alloc(Obj::Set(Dict::default()))?;
        self.add_to_set(s, members)
            .map_err(|m| self.container_error("", m))?;
        Ok(s)
    }

    /// The error for a failed container operation `op` (SETITEM, ...):
    /// a named limit, or what the operation was applied to.
    pub(crate) fn container_error(&self, op: &str, message: &'static str) -> Error {
        if message.contains("max_container_len") {
            Error::limit("max_container_len", self.max_container_len as u64)
        } else if message.contains("max_work_per_byte") {
            Error::limit("max_work_per_byte", self.work_per_byte)
        } else if op.is_empty() {
            Error::new(crate::error::ErrorKind::Pickle, message)
        } else {
            Error::new(
                crate::error::ErrorKind::Pickle,
                format!("{op} on a {message}"),
            )
        }
    }

    pub(crate) fn new_dict_from(&mut self, pairs: &[Value]) -> Result<Value> {
        let d = self.alloc(Obj::Dict(Dict::default()))?;
        for pair in pairs.chunks(2) {
            if let [k, v] = pair {
                self.set_item(d, *k, *v)
                    .map_err(|m| self.container_error("", m))?;
            }
        }
        Ok(d)
    }
}

pub(crate) fn kind_name(obj: &Obj) -> &'static str {
    match obj {
        Obj::Str(_) => "str",
        Obj::Bytes(_) => "bytes",
        Obj::BigInt(_) => "int",
        Obj::Tuple(_) => "tuple",
        Obj::List(_) => "list",
        Obj::Dict(_) => "dict",
        Obj::Set(_) => "set",
        Obj::Object(_) => "object",
        Obj::Ext(e) => e.kind_name(),
    }
}
