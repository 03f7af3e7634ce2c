//! A plain state dict read straight from its pickle: the shape
//! `torch.save(model.state_dict())` writes (a dict or `OrderedDict` of
//! tensors, each `_rebuild_tensor_v2` of a storage, with the `_metadata`
//! an `nn.Module`'s state dict carries), decoded without the general
//! machine's heap, memo of values or walk.
//!
//! It is only a shortcut. Anything outside that shape (another opcode, a
//! callable, a value that is not a tensor, a key twice, a limit that could
//! be reached) makes it give up with nothing changed, and the general
//! machine reads the file from the start: what it returns is what the
//! general path would have made of the same bytes (a test runs both on
//! every fixture and on damaged copies of them).

use std::ops::Range;

use super::dtype::DType;
use super::interp::GlobalRef;
use super::policy::torch_allows;
use super::{Known, PendingStorage};
use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::name_index::NameIndex;

/// A tensor of the state dict, named by its key.
#[derive(Debug)]
pub(crate) struct PlainTensor {
    pub(crate) name: String,
    pub(crate) storage: usize,
    pub(crate) dtype: DType,
    pub(crate) offset: u64,
    pub(crate) shape: Vec<u64>,
    pub(crate) stride: Vec<u64>,
    pub(crate) requires_grad: bool,
}

/// A plain read the scan made of a file's `data.pkl`, kept for the decode
/// that follows on the same thread: the same bytes read with the same
/// arguments give the same [`Plain`], so the decode takes it instead of
/// reading the pickle again. Keyed by where the pickle lies in the file
/// (a stored record), its length and [`read`]'s arguments.
#[derive(Debug, Default)]
pub(crate) struct KeptPlain(std::cell::RefCell<Option<(PlainKey, Plain)>>);

/// Which bytes were read, and how: the pickle's address and length (bytes
/// of the file's map, so one address is one place of the file) and
/// [`read`]'s arguments.
#[derive(Debug, PartialEq)]
struct PlainKey {
    at: usize,
    len: usize,
    record: String,
    storage_dir: String,
    records: usize,
}

impl PlainKey {
    fn new(pickle: &[u8], (record, storage_dir, records): (&str, &str, usize)) -> Self {
        PlainKey {
            at: pickle.as_ptr() as usize,
            len: pickle.len(),
            record: record.to_owned(),
            storage_dir: storage_dir.to_owned(),
            records,
        }
    }
}

impl KeptPlain {
    /// [`read`] of `pickle`, bytes of the file's map; a plain state dict
    /// is kept for [`KeptPlain::take`], its globals and opcodes handed
    /// back.
    #[cfg_attr(not(feature = "scan"), allow(dead_code))]
    pub(crate) fn read_and_keep(
        &self,
        pickle: &[u8],
        at: (&str, &str, usize),
        limits: &Limits,
        cancel: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<Option<(Vec<GlobalRef>, u64)>> {
        let Some(plain) = read(pickle, at, limits, cancel)? else {
            return Ok(None);
        };
        let seen = (plain.globals.clone(), plain.opcodes);
        *self.0.borrow_mut() = Some((PlainKey::new(pickle, at), plain));
        Ok(Some(seen))
    }

    /// Whether a read is kept.
    #[cfg(all(test, feature = "scan"))]
    pub(crate) fn holds(&self) -> bool {
        self.0.borrow().is_some()
    }

    /// The kept read of these bytes of the map, read with these
    /// arguments; `None` for any other.
    pub(crate) fn take(&self, pickle: &[u8], at: (&str, &str, usize)) -> Option<Plain> {
        let mut kept = self.0.borrow_mut();
        let key = PlainKey::new(pickle, at);
        if kept.as_ref().is_some_and(|(k, _)| *k == key) {
            kept.take().map(|(_, plain)| plain)
        } else {
            None
        }
    }
}

/// What the pickle of a plain state dict holds.
#[derive(Debug)]
pub(crate) struct Plain {
    pub(crate) storages: Vec<PendingStorage>,
    pub(crate) tensors: Vec<PlainTensor>,
    /// Indices into `tensors`, by name.
    pub(crate) by_name: NameIndex,
    pub(crate) globals: Vec<GlobalRef>,
    pub(crate) protocol: u8,
    /// Work done, counted as the general machine counts it or more.
    pub(crate) work: u64,
    /// Opcodes run, to STOP (counted by the scanner against the file's
    /// limit).
    #[cfg_attr(not(feature = "scan"), allow(dead_code))]
    pub(crate) opcodes: u64,
}

/// The globals the shape uses.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Global {
    OrderedDict,
    RebuildV2,
    Storage(DType),
}

/// A value on the stack or in the memo.
#[derive(Debug, Clone, Copy, PartialEq)]
enum V {
    None,
    Bool(bool),
    /// An int that fits 32 bits; larger ones are `Long`.
    Int(i32),
    /// An index into `Reader::longs`.
    Long(u32),
    Float,
    /// An index into `Reader::strs`.
    Str(u32),
    /// A global, and the index of its entry in the globals seen.
    Global(Global, u32),
    /// An index into `Reader::tuples`.
    Tuple(u32),
    /// A storage, typed by the class of the persistent id that named it.
    Storage(u32, DType),
    /// An index into `Reader::dicts`.
    Dict(u32),
    /// An index into `Reader::made`.
    Tensor(u32),
}

/// A dict the pickle made: the root (tensors by name) or one of the
/// values of an `nn.Module` state dict's `_metadata` (no tensors).
#[derive(Debug, Default)]
struct DictMade {
    /// Items set so far.
    len: usize,
    /// Whether an item's value is a tensor.
    tensors: bool,
    /// Whether an item's value is not a tensor.
    values: bool,
}

/// A tensor the rebuild made, before a key names it.
#[derive(Debug)]
struct Made {
    storage: u32,
    dtype: DType,
    offset: u64,
    geometry: Range<usize>,
    requires_grad: bool,
}

/// Gives up: the general machine reads the file.
struct GiveUp;

type Step<T = ()> = std::result::Result<T, GiveUp>;

/// Opcodes between looks at the cancel flag, as the general machine.
const CANCEL_EVERY: u64 = 1 << 12;

/// The most work a byte of this shape costs the general machine, by a
/// wide margin: the shortcut runs only where the limit leaves room for
/// it, so a file the general machine would refuse for work never passes
/// here.
const WORK_PER_BYTE: u64 = 16;

/// The most values room is made for before the pickle runs.
const RESERVE_MAX: usize = 1 << 20;

/// The most tensors room is made for before the pickle runs (each takes
/// a few hundred bytes across the lists).
const TENSORS_RESERVE_MAX: usize = 1 << 18;

struct Reader<'a, 'c> {
    data: &'a [u8],
    limits: &'c Limits,
    pos: usize,
    record: &'c str,
    storage_dir: &'c str,
    stack: Vec<V>,
    marks: Vec<usize>,
    memo: Vec<V>,
    items: Vec<V>,
    /// Each tuple's range of `items`.
    tuples: Vec<(u32, u32)>,
    /// Ints beyond 32 bits.
    longs: Vec<i64>,
    /// The text values, checked UTF-8.
    strs: Vec<&'a str>,
    dicts: Vec<DictMade>,
    made: Vec<Made>,
    /// Shapes and strides of `made`, one after the other.
    geometry: Vec<u64>,
    storages: Vec<PendingStorage>,
    storage_index: NameIndex,
    tensors: Vec<PlainTensor>,
    by_name: NameIndex,
    /// The dict whose items are `tensors`.
    root: Option<u32>,
    globals: Vec<GlobalRef>,
    protocol: u8,
    work: u64,
}

/// Read `pickle` (the record `record`, its storages under `storage_dir`,
/// in an archive of `records` records) as a plain state dict. `Ok(None)`
/// when it is not one, or when a limit could be reached: the general
/// machine then reads it.
pub(crate) fn read(
    pickle: &[u8],
    (record, storage_dir, records): (&str, &str, usize),
    limits: &Limits,
    cancel: Option<&std::sync::atomic::AtomicBool>,
) -> Result<Option<Plain>> {
    if !room_for(pickle.len(), limits) {
        return Ok(None);
    }
    // Room for what the pickle can make, so nothing grows by copies: a
    // tensor per storage record (each record is a storage; the archive's
    // records are bounded by its bytes), and by the pickle's length what
    // torch's pickles spend per value; larger pickles grow from there.
    let tensors = records.min(pickle.len() / 16).min(TENSORS_RESERVE_MAX);
    let values = (pickle.len() / 8).min(RESERVE_MAX);
    let mut r = Reader {
        data: pickle,
        limits,
        pos: 0,
        record,
        storage_dir,
        stack: Vec::with_capacity(64),
        marks: Vec::with_capacity(8),
        memo: Vec::with_capacity(values),
        items: Vec::with_capacity(values.saturating_mul(2)),
        tuples: Vec::with_capacity(values / 2),
        longs: Vec::new(),
        // A name and a key a tensor, and the few words they share.
        strs: Vec::with_capacity(tensors.saturating_mul(2).saturating_add(64)),
        dicts: Vec::with_capacity(tensors.saturating_add(8)),
        made: Vec::with_capacity(tensors),
        // Size and stride: 2-D weights take four.
        geometry: Vec::with_capacity(tensors.saturating_mul(4)),
        storages: Vec::with_capacity(tensors),
        storage_index: NameIndex::with_capacity(tensors),
        tensors: Vec::with_capacity(tensors),
        by_name: NameIndex::with_capacity(tensors),
        root: None,
        globals: Vec::new(),
        protocol: 0,
        work: 0,
    };
    let mut opcodes = 0u64;
    let root = loop {
        opcodes += 1;
        if opcodes % CANCEL_EVERY == 0
            && cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
        {
            return Err(Error::new(ErrorKind::Cancelled, "the open was cancelled").at(r.pos as u64));
        }
        match r.step() {
            Ok(None) => {}
            Ok(Some(root)) => break root,
            Err(GiveUp) => return Ok(None),
        }
    };
    r.work = r.work.saturating_add(opcodes);
    let allowed = (pickle.len() as u64)
        .max(64 << 10)
        .saturating_mul(limits.max_work_per_byte);
    if opcodes > limits.max_opcodes || r.work.saturating_mul(2) > allowed {
        return Ok(None);
    }
    match r.finish(root) {
        Ok(plain) => Ok(Some(Plain { opcodes, ..plain })),
        Err(GiveUp) => Ok(None),
    }
}

/// Whether the counts the general machine keeps that are not followed
/// here cannot reach their limits on a pickle of `len` bytes (each costs
/// at least a byte of the pickle), and the work a byte of this shape
/// costs fits with room to spare. The stack, the memo and containers are
/// counted as the general machine counts them; tensors by the caller.
fn room_for(len: usize, limits: &Limits) -> bool {
    let n = len as u64;
    [
        limits.max_objects as u64,
        limits.max_decoded_bytes,
        limits.max_walk_steps,
        limits.max_name_bytes,
    ]
    .iter()
    .all(|&max| max > n)
        && limits.max_work_per_byte >= WORK_PER_BYTE
}

impl<'a> Reader<'a, '_> {
    fn byte(&mut self) -> Step<u8> {
        let b = *self.data.get(self.pos).ok_or(GiveUp)?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Step<Range<usize>> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or(GiveUp)?;
        let range = self.pos..end;
        self.pos = end;
        Ok(range)
    }

    fn array<const N: usize>(&mut self) -> Step<[u8; N]> {
        let range = self.take(N)?;
        self.data
            .get(range)
            .and_then(|b| b.try_into().ok())
            .ok_or(GiveUp)
    }

    fn push(&mut self, v: V) -> Step {
        let at = self.stack.len();
        if at + self.marks.len() >= self.limits.max_stack_depth {
            return Err(GiveUp);
        }
        // Between the first dict's MARK and its SETITEMS, the items of the
        // state dict: text keys, and values that are tensors or the
        // rebuild and arguments that make one. Anything else gives up at
        // once (a training checkpoint's dict of dicts at its first value,
        // not at its end).
        if self.marks.as_slice() == [1] && self.stack.first() == Some(&V::Dict(0)) {
            let key = at % 2 == 1;
            let fits = match v {
                V::Str(_) => key,
                V::Global(Global::RebuildV2, _) | V::Tensor(_) => !key,
                V::Tuple(..) => {
                    key && matches!(self.stack.last(), Some(V::Global(Global::RebuildV2, _)))
                }
                _ => false,
            };
            if !fits {
                return Err(GiveUp);
            }
        }
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self) -> Step<V> {
        let base = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= base {
            return Err(GiveUp);
        }
        self.stack.pop().ok_or(GiveUp)
    }

    fn top(&self) -> Step<V> {
        let base = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= base {
            return Err(GiveUp);
        }
        self.stack.last().copied().ok_or(GiveUp)
    }

    /// The values since the last mark, the mark removed.
    fn pop_mark(&mut self) -> Step<Range<usize>> {
        let mark = self.marks.pop().ok_or(GiveUp)?;
        Ok(mark..self.stack.len())
    }

    fn put(&mut self, index: u64) -> Step {
        // Indices in order, each once: anything else is the general
        // machine's (its memo takes any order).
        if index != self.memo.len() as u64 || self.memo.len() >= self.limits.max_memo_entries {
            return Err(GiveUp);
        }
        let v = self.top()?;
        self.memo.push(v);
        Ok(())
    }

    fn get(&mut self, index: u64) -> Step {
        let v = *self
            .memo
            .get(usize::try_from(index).map_err(|_| GiveUp)?)
            .ok_or(GiveUp)?;
        self.push(v)
    }

    fn int(&self, v: V) -> Option<i64> {
        match v {
            V::Int(i) => Some(i.into()),
            V::Long(i) => self.longs.get(i as usize).copied(),
            _ => None,
        }
    }

    fn str_at(&self, v: V) -> Option<&'a str> {
        match v {
            V::Str(i) => self.strs.get(i as usize).copied(),
            _ => None,
        }
    }

    fn text(&mut self, n: usize) -> Step {
        let range = self.take(n)?;
        let data: &'a [u8] = self.data;
        let bytes = data.get(range).ok_or(GiveUp)?;
        let text = std::str::from_utf8(bytes).map_err(|_| GiveUp)?;
        self.work = self.work.saturating_add(n as u64);
        let i = u32::try_from(self.strs.len()).map_err(|_| GiveUp)?;
        self.strs.push(text);
        self.push(V::Str(i))?;
        Ok(())
    }

    fn tuple(&mut self, values: Range<usize>) -> Step {
        if values.len() >= self.limits.max_container_len {
            return Err(GiveUp);
        }
        let start = u32::try_from(self.items.len()).map_err(|_| GiveUp)?;
        let got = self.stack.get(values.clone()).ok_or(GiveUp)?;
        self.items.extend_from_slice(got);
        self.work = self.work.saturating_add(got.len() as u64);
        let len = u32::try_from(got.len()).map_err(|_| GiveUp)?;
        self.stack.truncate(values.start);
        let id = u32::try_from(self.tuples.len()).map_err(|_| GiveUp)?;
        self.tuples.push((start, len));
        self.push(V::Tuple(id))?;
        Ok(())
    }

    fn tuple_items(&self, v: V) -> Step<&[V]> {
        match v {
            V::Tuple(id) => {
                let &(start, len) = self.tuples.get(id as usize).ok_or(GiveUp)?;
                self.items
                    .get(start as usize..start as usize + len as usize)
                    .ok_or(GiveUp)
            }
            _ => Err(GiveUp),
        }
    }

    fn global(&mut self, offset: usize) -> Step {
        let module = self.line()?;
        let name = self.line()?;
        let (module, name) = (
            std::str::from_utf8(module).map_err(|_| GiveUp)?,
            std::str::from_utf8(name).map_err(|_| GiveUp)?,
        );
        let which = match (module, name) {
            ("collections", "OrderedDict") => Global::OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildV2,
            ("torch", class) if quantized(class) => return Err(GiveUp),
            ("torch", class) => match Known::of("torch", class) {
                Known::StorageClass(d) => Global::Storage(d),
                _ => return Err(GiveUp),
            },
            _ => return Err(GiveUp),
        };
        if !torch_allows(module, name) {
            return Err(GiveUp);
        }
        let seen = match self
            .globals
            .iter()
            .position(|g| g.module == module && g.name == name)
        {
            Some(i) => i,
            None => {
                self.globals.push(GlobalRef {
                    module: module.to_owned(),
                    name: name.to_owned(),
                    record: self.record.to_owned(),
                    offset: offset as u64,
                    torch_allowed: true,
                    called: false,
                    instantiated: false,
                });
                self.globals.len() - 1
            }
        };
        self.push(V::Global(which, u32::try_from(seen).map_err(|_| GiveUp)?))?;
        Ok(())
    }

    fn line(&mut self) -> Step<&'a [u8]> {
        let data: &'a [u8] = self.data;
        let rest = data.get(self.pos..).ok_or(GiveUp)?;
        let n = rest.iter().position(|&b| b == b'\n').ok_or(GiveUp)?;
        let line = rest.get(..n).ok_or(GiveUp)?;
        self.pos += n + 1;
        Ok(line)
    }

    fn new_dict(&mut self) -> Step {
        let id = u32::try_from(self.dicts.len()).map_err(|_| GiveUp)?;
        self.dicts.push(DictMade::default());
        self.push(V::Dict(id))?;
        Ok(())
    }

    fn reduce(&mut self) -> Step {
        let args = self.pop()?;
        let callable = self.pop()?;
        let V::Global(which, seen) = callable else {
            return Err(GiveUp);
        };
        if let Some(g) = self.globals.get_mut(seen as usize) {
            g.called = true;
        }
        match which {
            Global::OrderedDict if self.tuple_items(args)?.is_empty() => self.new_dict(),
            Global::RebuildV2 => {
                let made = self.rebuild(args)?;
                let id = u32::try_from(self.made.len()).map_err(|_| GiveUp)?;
                self.made.push(made);
                self.push(V::Tensor(id))?;
                Ok(())
            }
            _ => Err(GiveUp),
        }
    }

    /// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
    /// backward_hooks)`.
    fn rebuild(&mut self, args: V) -> Step<Made> {
        let &[storage, offset, size, stride, requires_grad, hooks] = self.tuple_items(args)? else {
            return Err(GiveUp);
        };
        let (V::Storage(storage, dtype), Some(offset)) = (storage, self.int(offset)) else {
            return Err(GiveUp);
        };
        let offset = u64::try_from(offset).map_err(|_| GiveUp)?;
        let requires_grad = match requires_grad {
            V::Bool(b) => b,
            V::Int(i) => i != 0,
            V::Long(_) => true,
            _ => return Err(GiveUp),
        };
        match hooks {
            V::Dict(d) if self.dicts.get(d as usize).is_some_and(|d| d.len == 0) => {}
            _ => return Err(GiveUp),
        }
        let start = self.geometry.len();
        for part in [size, stride] {
            let n = self.tuple_items(part)?.len();
            for i in 0..n {
                let v = self.tuple_items(part)?.get(i).copied();
                match v {
                    Some(v) => {
                        let x = self.int(v).ok_or(GiveUp)?;
                        self.geometry.push(u64::try_from(x).map_err(|_| GiveUp)?);
                    }
                    None => return Err(GiveUp),
                }
            }
        }
        let dims = self.tuple_items(size)?.len();
        if self.tuple_items(stride)?.len() != dims {
            return Err(GiveUp);
        }
        Ok(Made {
            storage,
            dtype,
            offset,
            geometry: start..self.geometry.len(),
            requires_grad,
        })
    }

    /// BINPERSID: `('storage', class, key, location, numel)`.
    fn persistent(&mut self) -> Step {
        let pid = self.pop()?;
        let &[kind, class, key, location, numel] = self.tuple_items(pid)? else {
            return Err(GiveUp);
        };
        if self.str_at(kind) != Some("storage") {
            return Err(GiveUp);
        }
        let V::Global(Global::Storage(dtype), _) = class else {
            return Err(GiveUp);
        };
        let Some(numel) = self.int(numel) else {
            return Err(GiveUp);
        };
        let numel = u64::try_from(numel).map_err(|_| GiveUp)?;
        let int_key;
        let key = match (key, self.int(key)) {
            (_, Some(i)) => {
                int_key = i.to_string();
                int_key.as_str()
            }
            (other, None) => self.str_at(other).ok_or(GiveUp)?,
        };
        let location = self.str_at(location).ok_or(GiveUp)?;
        self.work = self
            .work
            .saturating_add((key.len() + location.len()) as u64);
        let storages = &self.storages;
        let hash = self.storage_index.hash(key);
        let found = self.storage_index.find_hashed(hash, key, |i| {
            storages.get(i as usize).map(|s| s.key.as_str())
        });
        let index = match found {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.storages.len()).map_err(|_| GiveUp)?;
                let mut record = String::with_capacity(self.storage_dir.len() + key.len());
                record.push_str(self.storage_dir);
                record.push_str(key);
                let storage = PendingStorage {
                    key: key.to_owned(),
                    record: Some(record),
                    dtype,
                    numel,
                    location: location.to_owned(),
                    view: None,
                    quantized: None,
                };
                self.storages.push(storage);
                let storages = &self.storages;
                self.storage_index.insert_hashed(hash, i, |i| {
                    storages.get(i as usize).map(|s| s.key.as_str())
                });
                i
            }
        };
        self.push(V::Storage(index, dtype))?;
        Ok(())
    }

    /// SETITEM(S): `pairs` into the dict under them.
    fn set_items(&mut self, pairs: Range<usize>) -> Step {
        if pairs.len() % 2 != 0 || pairs.start == 0 {
            return Err(GiveUp);
        }
        let V::Dict(d) = *self.stack.get(pairs.start - 1).ok_or(GiveUp)? else {
            return Err(GiveUp);
        };
        let mut i = pairs.start;
        while i < pairs.end {
            let (key, value) = match (self.stack.get(i), self.stack.get(i + 1)) {
                (Some(&k), Some(&v)) => (k, v),
                _ => return Err(GiveUp),
            };
            i += 2;
            let dict = self.dicts.get_mut(d as usize).ok_or(GiveUp)?;
            dict.len += 1;
            if dict.len >= self.limits.max_container_len {
                return Err(GiveUp);
            }
            // The dict that holds tensors is the state dict: it holds
            // nothing else, and nothing holds it (a training checkpoint's
            // nested state dict gives up here, not at its end).
            match value {
                V::Tensor(_) if dict.values => return Err(GiveUp),
                V::Tensor(t) => {
                    dict.tensors = true;
                    self.name_tensor(d, key, t)?;
                }
                V::Dict(inner) if self.root == Some(inner) => return Err(GiveUp),
                _ if dict.tensors => return Err(GiveUp),
                // A state's values: text, numbers, dicts (`_metadata`).
                V::None
                | V::Bool(_)
                | V::Int(_)
                | V::Long(_)
                | V::Float
                | V::Str(_)
                | V::Dict(_) => {
                    dict.values = true;
                    // Keys of a state are hashable in Python: text and
                    // numbers (a dict as a key is the general machine's).
                    if !matches!(
                        key,
                        V::Str(_) | V::Int(_) | V::Long(_) | V::None | V::Bool(_)
                    ) {
                        return Err(GiveUp);
                    }
                    if let Some(k) = self.str_at(key) {
                        self.work = self.work.saturating_add(k.len() as u64);
                    }
                }
                _ => return Err(GiveUp),
            }
        }
        self.stack.truncate(pairs.start);
        Ok(())
    }

    /// The tensor `t` under `key` of dict `d`: a new name of the state
    /// dict (a key set twice is the general machine's).
    fn name_tensor(&mut self, d: u32, key: V, t: u32) -> Step {
        if *self.root.get_or_insert(d) != d {
            return Err(GiveUp);
        }
        let name = self.str_at(key).ok_or(GiveUp)?.to_owned();
        self.work = self.work.saturating_add(name.len() as u64);
        let made = self.made.get(t as usize).ok_or(GiveUp)?;
        let geometry = self.geometry.get(made.geometry.clone()).ok_or(GiveUp)?;
        let (shape, stride) = geometry.split_at(geometry.len() / 2);
        let tensor = PlainTensor {
            name,
            storage: made.storage as usize,
            dtype: made.dtype,
            offset: made.offset,
            shape: shape.to_vec(),
            stride: stride.to_vec(),
            requires_grad: made.requires_grad,
        };
        let index = u32::try_from(self.tensors.len()).map_err(|_| GiveUp)?;
        let tensors = &self.tensors;
        let name_of = |i: u32| tensors.get(i as usize).map(|t| t.name.as_str());
        let hash = self.by_name.hash(&tensor.name);
        if self
            .by_name
            .find_hashed(hash, &tensor.name, name_of)
            .is_some()
        {
            return Err(GiveUp);
        }
        self.tensors.push(tensor);
        let tensors = &self.tensors;
        self.by_name.insert_hashed(hash, index, |i| {
            tensors.get(i as usize).map(|t| t.name.as_str())
        });
        Ok(())
    }

    /// BUILD on a dict: its instance attributes (`_metadata`), a dict.
    fn build(&mut self) -> Step {
        let state = self.pop()?;
        let V::Dict(target) = self.top()? else {
            return Err(GiveUp);
        };
        let V::Dict(s) = state else {
            return Err(GiveUp);
        };
        // The state is kept by the general path, never named: it may
        // hold no tensors (nor be the dict it is set on).
        if s == target || self.dicts.get(s as usize).is_none_or(|d| d.tensors) {
            return Err(GiveUp);
        }
        Ok(())
    }

    /// One opcode; the root at STOP.
    fn step(&mut self) -> Step<Option<V>> {
        let at = self.pos;
        let op = self.byte()?;
        match op {
            // PROTO: first, 2 or more (1 and 0 write other opcodes).
            0x80 if at == 0 => {
                let p = self.byte()?;
                if !(2..=5).contains(&p) {
                    return Err(GiveUp);
                }
                self.protocol = p;
            }
            b'.' => {
                let root = self.pop()?;
                if !self.marks.is_empty() || !self.stack.is_empty() {
                    return Err(GiveUp);
                }
                return Ok(Some(root));
            }
            b'(' => {
                if self.stack.len() + self.marks.len() >= self.limits.max_stack_depth {
                    return Err(GiveUp);
                }
                self.marks.push(self.stack.len());
            }
            b'q' => {
                let i = self.byte()?;
                self.put(i.into())?;
            }
            b'r' => {
                let i = u32::from_le_bytes(self.array()?);
                self.put(i.into())?;
            }
            0x94 => self.put(self.memo.len() as u64)?,
            b'h' => {
                let i = self.byte()?;
                self.get(i.into())?;
            }
            b'j' => {
                let i = u32::from_le_bytes(self.array()?);
                self.get(i.into())?;
            }
            b'N' => self.push(V::None)?,
            0x88 => self.push(V::Bool(true))?,
            0x89 => self.push(V::Bool(false))?,
            b'K' => {
                let v = self.byte()?;
                self.push(V::Int(v.into()))?;
            }
            b'M' => {
                let v = u16::from_le_bytes(self.array()?);
                self.push(V::Int(v.into()))?;
            }
            b'J' => {
                let v = i32::from_le_bytes(self.array()?);
                self.push(V::Int(v))?;
            }
            // LONG1 of up to 8 bytes (little-endian two's complement).
            0x8a => {
                let n = usize::from(self.byte()?);
                if n > 8 {
                    return Err(GiveUp);
                }
                let range = self.take(n)?;
                let bytes = self.data.get(range).ok_or(GiveUp)?;
                let fill = if bytes.last().is_some_and(|&b| b & 0x80 != 0) {
                    0xff
                } else {
                    0
                };
                let mut le = [fill; 8];
                le.get_mut(..n).ok_or(GiveUp)?.copy_from_slice(bytes);
                let v = i64::from_le_bytes(le);
                let v = match i32::try_from(v) {
                    Ok(small) => V::Int(small),
                    Err(_) => {
                        let i = u32::try_from(self.longs.len()).map_err(|_| GiveUp)?;
                        self.longs.push(v);
                        V::Long(i)
                    }
                };
                self.push(v)?;
            }
            b'G' => {
                self.array::<8>()?;
                self.push(V::Float)?;
            }
            b'X' => {
                let n = u32::from_le_bytes(self.array()?);
                self.text(n as usize)?;
            }
            0x8c => {
                let n = self.byte()?;
                self.text(n.into())?;
            }
            b')' => self.tuple(self.stack.len()..self.stack.len())?,
            b't' => {
                let values = self.pop_mark()?;
                self.tuple(values)?;
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let base = self.marks.last().copied().unwrap_or(0);
                let start = self.stack.len().checked_sub(n).filter(|&s| s >= base);
                self.tuple(start.ok_or(GiveUp)?..self.stack.len())?;
            }
            b'}' => self.new_dict()?,
            b'c' => self.global(at)?,
            b'R' => self.reduce()?,
            b'Q' => self.persistent()?,
            b's' => {
                let n = self.stack.len();
                let base = self.marks.last().copied().unwrap_or(0);
                if n < base + 3 {
                    return Err(GiveUp);
                }
                self.set_items(n - 2..n)?;
            }
            b'u' => {
                let pairs = self.pop_mark()?;
                let base = self.marks.last().copied().unwrap_or(0);
                if pairs.start <= base {
                    return Err(GiveUp);
                }
                self.set_items(pairs)?;
            }
            b'b' => self.build()?,
            _ => return Err(GiveUp),
        }
        Ok(None)
    }

    /// The state dict `root` holds, once STOP returned it.
    fn finish(self, root: V) -> Step<Plain> {
        let V::Dict(d) = root else {
            return Err(GiveUp);
        };
        let dict = self.dicts.get(d as usize).ok_or(GiveUp)?;
        // An empty dict is the general machine's too (it names nothing,
        // as here, but nothing is gained).
        if dict.values || !dict.tensors || self.root != Some(d) || self.protocol == 0 {
            return Err(GiveUp);
        }
        Ok(Plain {
            storages: self.storages,
            tensors: self.tensors,
            by_name: self.by_name,
            globals: self.globals,
            protocol: self.protocol,
            work: self.work,
            opcodes: 0,
        })
    }
}

/// The quantized storage classes (their tensors need the general path).
fn quantized(class: &str) -> bool {
    matches!(
        class,
        "QInt8Storage" | "QUInt8Storage" | "QInt32Storage" | "QUInt4x2Storage" | "QUInt2x4Storage"
    )
}
