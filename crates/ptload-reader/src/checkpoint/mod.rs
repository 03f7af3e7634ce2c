//! Opening a checkpoint ([`Checkpoint`], [`OpenOptions`], both also at
//! the crate root) and what it holds besides tensors: its plain values
//! ([`Scalar`]), the globals its pickles name ([`GlobalRef`]), a quantized
//! tensor's parameters ([`Quantization`]), the file's layout ([`Format`])
//! and byte order ([`ByteOrder`]), and how protocol-0-2 strings are
//! decoded ([`StringEncoding`]).

use std::path::Path;

use crate::advice::{Hint, Warning};
use crate::bytes::slice;
use crate::container::layout::StorageBytes;
use crate::container::{detect, Detected};
use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::name_index::NameIndex;
use crate::object::Objects;
use crate::pickle::{Heap, Value, Vm};
use crate::ranged::{
    fetch_until, read_unheld, read_unheld_into, Fetcher, FileView, RangeRead, COALESCE_GAP,
};
use crate::source::Source;
use crate::torch::decode::{decode_legacy, decode_zip, Decoded};
use crate::torch::dtensor::DTensorSpec;
use crate::torch::dtype::DType;
use crate::torch::names::walk_all;
use crate::torch::policy::Policy;
use crate::torch::tensor::{bare_storage, tensor_info, StorageData, StorageInfo, TensorInfo};
use crate::torch::{PendingStorage, TorchHeap, TorchInterp, TorchObj};
use crate::view::{Storages, TensorView};

pub use crate::bytes::ByteOrder;
pub use crate::container::Format;
pub use crate::pickle::StringEncoding;
pub use crate::torch::interp::GlobalRef;
pub use crate::torch::names::Scalar;
pub use crate::torch::Quantization;

/// A tensor of [`Checkpoint::assembled`]: name, dtype, shape, and its
/// row-major host-order bytes when they are held.
pub(crate) type AssembledTensor = (String, DType, Vec<u64>, Option<Vec<u8>>);

/// Where a whole tensor's bytes are (see `Checkpoint::of_parts`).
enum Held {
    /// In memory of the checkpoint's own, row-major, in host order.
    Owned(Vec<u8>),
    /// In the checkpoint's file, at this offset, row-major.
    File(u64),
    /// Elsewhere: the tensor has no storage here.
    Elsewhere,
}

/// A decoded checkpoint: tensor metadata and values, with tensor bytes left
/// in the (memory-mapped) file until asked for.
#[derive(Debug)]
pub struct Checkpoint {
    source: Source,
    /// Storages' bytes held in memory (tensors put together from a
    /// distributed checkpoint's chunks).
    owned: Vec<Vec<u8>>,
    /// Storages read on demand (a distributed checkpoint's tensors).
    lazy: Option<Lazy>,
    /// The files a checkpoint put together from others was read from
    /// (DCP `.distcp` files, FSDP rank files): outputs never overwrite them.
    inputs: Vec<Source>,
    /// Deflated storage records (repacked archives; torch writes none),
    /// each inflated when first read: opening, `inspect` and `scan` never
    /// pay for data they do not read.
    inflated: Vec<Inflated>,
    format: Format,
    byte_order: ByteOrder,
    pickle_protocol: u8,
    storages: Vec<StorageInfo>,
    tensors: Vec<TensorInfo>,
    /// The DTensor specs of the tensors that are a DTensor's local part,
    /// by tensor index, in index order.
    dtensors: Vec<(u32, DTensorSpec)>,
    values: Vec<(String, Scalar)>,
    /// Values found inside call records: (index into `values`, index into
    /// `callables`), by value index.
    value_calls: Vec<(usize, usize)>,
    callables: Vec<String>,
    globals: Vec<GlobalRef>,
    warnings: Vec<Warning>,
    /// The limits it was opened with, for [`Checkpoint::suspicious`].
    limits: Limits,
    /// The scanner's report, when it was scanned while opened
    /// ([`OpenOptions::scan`]).
    #[cfg(feature = "scan")]
    scanned: Option<crate::scan::ScanReport>,
    /// Indices into `tensors`, by name.
    by_name: NameIndex,
    work: u64,
    objects: Option<Objects>,
    /// Read in scattered pieces (see `advise_scattered`): views ask for
    /// their pages before they read them.
    scattered: std::sync::atomic::AtomicBool,
    end: u64,
    fetched: Fetched,
}

impl Storages for Checkpoint {
    fn storages(&self) -> &[StorageInfo] {
        Checkpoint::storages(self)
    }

    fn storage_bytes(&self, index: usize) -> Result<&[u8]> {
        Checkpoint::storage_bytes(self, index)
    }

    fn byte_order(&self) -> ByteOrder {
        Checkpoint::byte_order(self)
    }

    fn is_scattered(&self) -> bool {
        Checkpoint::is_scattered(self)
    }

    fn source(&self) -> &Source {
        Checkpoint::source(self)
    }

    fn lazy_read(&self, index: usize) -> Option<Result<std::borrow::Cow<'_, [u8]>>> {
        Checkpoint::lazy_read(self, index)
    }

    fn fetch_span(&self, info: &TensorInfo) -> Option<Result<Vec<u8>>> {
        Checkpoint::fetch_span(self, info)
    }

    fn stream_span(&self, info: &TensorInfo, f: &mut dyn FnMut(&[u8])) -> Option<Result<()>> {
        Checkpoint::stream_span(self, info, f)
    }
}

/// Where the bytes of storages read on demand come from: each call reads
/// (puts together) storage `index` of the lazy ones afresh.
pub(crate) trait LazyStorages: std::fmt::Debug + Send + Sync {
    fn read(&self, index: usize) -> Result<Vec<u8>>;
}

/// Storages read on demand, and those a borrowing reader asked for, kept.
#[derive(Debug)]
struct Lazy {
    source: std::sync::Arc<dyn LazyStorages>,
    kept: Vec<std::sync::OnceLock<Vec<u8>>>,
}

/// A deflated storage record and, once read, its bytes.
#[derive(Debug)]
struct Inflated {
    record: crate::container::zip::Deflated,
    bytes: std::sync::OnceLock<Vec<u8>>,
}

impl Inflated {
    /// Inflated from `file`, or from its compressed bytes fetched by
    /// `fetcher` when the file is read by ranges.
    fn bytes(&self, file: FileView<'_>, fetcher: Option<&Fetcher>) -> Result<&[u8]> {
        if let Some(done) = self.bytes.get() {
            return Ok(done);
        }
        let made = match (file.whole(), fetcher) {
            (Some(whole), _) => self.record.inflate(whole)?,
            (None, Some(f)) => {
                let (offset, len) = self.record.range();
                match file.held(offset, len) {
                    Some(held) => self.record.inflate_raw(Some(held))?,
                    None => self.record.inflate_raw(Some(&f.read(offset, len)?))?,
                }
            }
            (None, None) => self.record.inflate_raw(None)?,
        };
        // Two threads may inflate at once; the first to finish is kept.
        Ok(self.bytes.get_or_init(|| made))
    }

    /// Inflated into `out` (the record's size exactly), kept nowhere: an
    /// owning reader of the whole storage. Copied from the kept bytes when
    /// a borrowing reader inflated them already.
    fn inflate_into(
        &self,
        file: FileView<'_>,
        fetcher: Option<&Fetcher>,
        out: &mut [u8],
    ) -> Result<()> {
        if let Some(done) = self.bytes.get() {
            if done.len() != out.len() {
                return Err(Error::new(
                    ErrorKind::Tensor,
                    "an inflated storage of another size",
                ));
            }
            out.copy_from_slice(done);
            return Ok(());
        }
        match (file.whole(), fetcher) {
            (Some(whole), _) => {
                let (offset, len) = self.record.range();
                self.record
                    .inflate_raw_into(crate::bytes::slice(whole, offset, len), out)
            }
            (None, Some(f)) => {
                let (offset, len) = self.record.range();
                match file.held(offset, len) {
                    Some(held) => self.record.inflate_raw_into(Some(held), out),
                    None => self
                        .record
                        .inflate_raw_into(Some(&f.read(offset, len)?), out),
                }
            }
            (None, None) => self.record.inflate_raw_into(None, out),
        }
    }
}

impl Checkpoint {
    /// The unpickled object, when opened with
    /// [`OpenOptions::objects`]: what `torch.load` returns, as inert nodes.
    pub fn objects(&self) -> Option<&Objects> {
        self.objects.as_ref()
    }

    /// A tensor of [`objects`](Self::objects) (`Node::Tensor`'s index), as a view.
    pub fn object_tensor(&self, index: usize) -> Option<TensorView<'_>> {
        let info = self.objects.as_ref()?.tensors().get(index)?;
        Some(TensorView { ckpt: self, info })
    }

    /// The layout of the file.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The offset just past the checkpoint's last byte: the end of the
    /// zip archive, or of a legacy stream's last storage. Bytes after it
    /// are not part of the checkpoint (torch.load on a stream leaves the
    /// stream there, so several objects can be saved one after another).
    pub fn end_offset(&self) -> u64 {
        self.end
    }

    /// Byte order of the stored tensor data.
    pub fn byte_order(&self) -> ByteOrder {
        self.byte_order
    }

    /// Protocol of the main pickle (its PROTO opcode; 0 or 1 when absent).
    pub fn pickle_protocol(&self) -> u8 {
        self.pickle_protocol
    }

    /// Mark the map as read in scattered pieces (a rank's slices): each
    /// view then asks the kernel for exactly its pages before reading them
    /// (see `TensorView::visit_bytes`), so the reads arrive as a few large
    /// requests and a fault rarely needs a read-ahead window of its own.
    /// The map's advice stays normal: told it is read at random, the kernel
    /// serves each fault alone, three times slower here (docs/benchmarks.md).
    pub(crate) fn advise_scattered(&self) {
        self.scattered
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Mark storage `index` as read in parts (a rank's slices of the
    /// tensors over it): in a file read by ranges, reading another storage
    /// then never fetches it whole as its neighbour.
    pub(crate) fn read_in_parts(&self, index: usize) {
        if let Some(p) = self.fetched.in_parts.get(index) {
            p.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Whether [`advise_scattered`](Self::advise_scattered) was called:
    /// each view then prefetches exactly its pages before reading them.
    pub(crate) fn is_scattered(&self) -> bool {
        self.scattered.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn source(&self) -> &Source {
        &self.source
    }

    /// Every file this checkpoint's data comes from: its own, and those a
    /// checkpoint put together from others was read from.
    pub(crate) fn inputs(&self) -> impl Iterator<Item = &Source> + '_ {
        std::iter::once(&self.source).chain(&self.inputs)
    }

    /// This checkpoint, recording `inputs` as files its data came from.
    pub(crate) fn read_from(mut self, inputs: Vec<Source>) -> Checkpoint {
        self.inputs = inputs;
        self
    }

    /// Whether the tensor bytes come from a memory map of the file.
    pub fn is_mapped(&self) -> bool {
        self.source.is_mapped()
    }

    /// The tensors, in the order of the flattening walk.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = TensorView<'_>> + '_ {
        self.tensors
            .iter()
            .map(move |info| TensorView { ckpt: self, info })
    }

    /// The tensor named `name` (names are unique; a file where two
    /// tensors flatten to one name does not open).
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.position(name).and_then(|i| self.tensor_at(i))
    }

    /// The index in [`tensors`](Self::tensors) order of the tensor named
    /// `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name
            .find(name, |i| {
                self.tensors.get(i as usize).map(|t| t.name.as_str())
            })
            .map(|i| i as usize)
    }

    /// The work opening took, in the units of
    /// [`Limits::max_work_per_byte`] (opcodes plus bytes and items hashed
    /// or copied) plus the steps of the naming walk. Deterministic for a
    /// file and its options: services can log it, tests can bound it.
    pub fn work(&self) -> u64 {
        self.work
    }

    /// The tensor at `index` in [`tensors`](Self::tensors) order.
    pub fn tensor_at(&self, index: usize) -> Option<TensorView<'_>> {
        self.tensors
            .get(index)
            .map(|info| TensorView { ckpt: self, info })
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Every storage, each once, however many tensors view it.
    pub fn storages(&self) -> &[StorageInfo] {
        &self.storages
    }

    /// Copy bytes `offset..offset + out.len()` of storage `index` into
    /// `out`, in the file's byte order. A storage a memory-mapped file
    /// holds uncompressed is read from the file by a positioned read: the
    /// kernel copies from its page cache and the map's pages are never
    /// touched (no page faults in this process), which suits a reader
    /// filling buffers of its own, such as pinned staging for a GPU. A
    /// storage of a file read by ranges (a URL, a bucket object) that the
    /// checkpoint does not keep is copied from the bytes fetched ahead of
    /// the reader ([`read_ahead`](Self::read_ahead)), released once every
    /// byte of it was read this way, or else fetched part by part, as
    /// asked: nothing is kept, so a reader that reads each byte once holds
    /// no more than the read-ahead and its own buffers. A storage of a
    /// deflated record read whole is inflated straight into `out` (not
    /// kept) unless a borrowing reader inflated it already. Any other
    /// storage is copied from [`storage_bytes`](Self::storage_bytes). An error
    /// when the bytes lie outside the storage or the read fails.
    pub fn read_storage_at(&self, index: usize, offset: u64, out: &mut [u8]) -> Result<()> {
        let s = self.storages.get(index).ok_or_else(|| {
            Error::new(
                ErrorKind::Tensor,
                format!(
                    "no storage {index}: the checkpoint has {}",
                    self.storages.len()
                ),
            )
        })?;
        let end = offset.checked_add(out.len() as u64);
        if end.is_none_or(|end| end > s.nbytes) {
            return Err(Error::new(
                ErrorKind::Tensor,
                format!(
                    "storage {:?}: bytes {offset}..+{} outside its {} bytes",
                    s.key,
                    out.len(),
                    s.nbytes
                ),
            ));
        }
        if let Some(read) = self.read_part(index, offset, out) {
            return read;
        }
        // A deflated record read whole by a reader with a buffer of its
        // own: inflated straight into it, kept nowhere.
        if let StorageData::Deflated(i) = s.data {
            if let (Some(lazy), 0, true) =
                (self.inflated.get(i), offset, out.len() as u64 == s.nbytes)
            {
                return lazy.inflate_into(self.source.view(), self.source.fetcher(), out);
            }
        }
        if let (StorageData::File(at), Some(file)) = (s.data, self.source.file()) {
            let at = at.checked_add(offset).ok_or_else(|| {
                Error::new(ErrorKind::Tensor, format!("storage {:?}: offset", s.key))
            })?;
            return crate::ranged::read_exact_at(file, out, at).map_err(|e| {
                Error::new(
                    ErrorKind::Io,
                    format!(
                        "storage {:?}: reading {} bytes at {at}: {e}",
                        s.key,
                        out.len()
                    ),
                )
            });
        }
        let bytes = self.storage_bytes(index)?;
        let from = usize::try_from(offset).ok();
        let src = from
            .and_then(|f| bytes.get(f..f.checked_add(out.len())?))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Tensor,
                    format!("storage {:?}: shorter than its size", s.key),
                )
            })?;
        out.copy_from_slice(src);
        Ok(())
    }

    /// The bytes of storage `index` (see [`storages`](Self::storages)), in
    /// the file's byte order.
    pub fn storage_bytes(&self, index: usize) -> Result<&[u8]> {
        let s = self.storages.get(index).ok_or_else(|| {
            Error::new(
                ErrorKind::Tensor,
                format!(
                    "no storage {index}: the checkpoint has {}",
                    self.storages.len()
                ),
            )
        })?;
        let bytes = match (s.data, self.source.fetcher()) {
            (StorageData::File(offset), None) => slice(self.source.bytes(), offset, s.nbytes),
            (StorageData::File(_), Some(fetcher)) => Some(self.fetch_storage(index, fetcher)?),
            (StorageData::Owned(i), _) => self.owned.get(i).map(Vec::as_slice),
            (StorageData::Deflated(i), fetcher) => match self.inflated.get(i) {
                Some(lazy) => Some(lazy.bytes(self.source.view(), fetcher)?),
                None => None,
            },
            // A borrowing reader keeps what it asked for; views read
            // their data afresh (`lazy_read`), so a pass over every tensor
            // holds one at a time.
            (StorageData::Lazy(i), _) => match &self.lazy {
                Some(lazy) => match lazy.kept.get(i) {
                    Some(kept) => match kept.get() {
                        Some(done) => Some(done.as_slice()),
                        None => {
                            let made = lazy.source.read(i)?;
                            Some(kept.get_or_init(|| made).as_slice())
                        }
                    },
                    None => None,
                },
                None => None,
            },
        };
        bytes.ok_or_else(|| {
            Error::new(
                ErrorKind::Tensor,
                format!("storage {:?}: its bytes are not in the file", s.key),
            )
        })
    }

    /// This checkpoint (of [`assembled`](Self::assembled) tensors) with
    /// the tensors at `tensors`, which have no storage, given one each
    /// whose bytes `source` reads on demand: storage `k` of `source` is
    /// that of `tensors[k]`.
    #[cfg_attr(not(feature = "dcp"), allow(dead_code))]
    pub(crate) fn with_lazy(
        mut self,
        source: std::sync::Arc<dyn LazyStorages>,
        tensors: &[usize],
    ) -> Result<Checkpoint> {
        let mut kept = Vec::with_capacity(tensors.len());
        for (k, &t) in tensors.iter().enumerate() {
            let storage = self.storages.len();
            let info = self
                .tensors
                .get_mut(t)
                .filter(|i| i.storage.is_none())
                .ok_or_else(|| Error::new(ErrorKind::Tensor, "no such tensor without data"))?;
            info.storage = Some(storage);
            self.storages.push(StorageInfo {
                key: storage.to_string(),
                location: "cpu".to_owned(),
                dtype: info.dtype,
                numel: info.numel,
                nbytes: info.nbytes,
                record: None,
                file_offset: None,
                data: StorageData::Lazy(k),
                quantized: None,
            });
            kept.push(std::sync::OnceLock::new());
        }
        self.lazy = Some(Lazy { source, kept });
        Ok(self)
    }

    /// The bytes of storage `index` when it is read on demand: those kept,
    /// or read afresh (and not kept); `None` for any other storage.
    pub(crate) fn lazy_read(&self, index: usize) -> Option<Result<std::borrow::Cow<'_, [u8]>>> {
        let StorageData::Lazy(i) = self.storages.get(index)?.data else {
            return None;
        };
        let lazy = self.lazy.as_ref()?;
        Some(match lazy.kept.get(i).and_then(std::sync::OnceLock::get) {
            Some(kept) => Ok(std::borrow::Cow::Borrowed(kept.as_slice())),
            None => lazy.source.read(i).map(std::borrow::Cow::Owned),
        })
    }

    /// The plain non-tensor values (epoch, args.lr, ...), named by the
    /// flattening convention.
    pub fn values(&self) -> &[(String, Scalar)] {
        &self.values
    }

    /// The global that the value at `index` of [`values`](Self::values) is
    /// an argument of, when the value lies inside an object the file makes
    /// by calling a global (`os.system("...")`, `pathlib.PosixPath("...")`)
    /// rather than in plain data or in an instance it constructs and fills.
    /// Such a value is what the file would hand to that call, not a setting
    /// of the model: `export` leaves it out of the metadata, unless the
    /// scanner knows the call only makes plain data (a path, a date).
    pub fn value_call(&self, index: usize) -> Option<&str> {
        let at = self
            .value_calls
            .binary_search_by_key(&index, |&(value, _)| value)
            .ok()?;
        let &(_, callable) = self.value_calls.get(at)?;
        self.callables.get(callable).map(String::as_str)
    }

    /// Every global the pickles reference, once per record, in order of
    /// first appearance.
    pub fn globals(&self) -> &[GlobalRef] {
        &self.globals
    }

    /// The globals outside torch's `weights_only=True` allowlist: what
    /// [`Policy::Strict`] refuses (and `allow_global` admits).
    pub fn outside_allowlist(&self) -> impl Iterator<Item = &GlobalRef> {
        self.globals.iter().filter(|g| !g.torch_allowed)
    }

    /// Each global (`module.name`, once, in the file's order) that
    /// [`Policy::Strict`] refuses with the caller's allowlist `allowed`
    /// (names and globs, see [`Policy::allowlist_admits`]): outside
    /// torch's allowlist and not admitted by `allowed`.
    pub fn refused_globals<S: AsRef<str>>(&self, allowed: &[S]) -> Vec<String> {
        let mut refused: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for g in self.outside_allowlist() {
            if !Policy::allowlist_admits(allowed, &g.module, &g.name) {
                let path = g.path();
                if seen.insert(path.clone()) {
                    refused.push(path);
                }
            }
        }
        refused
    }

    /// The globals [`scan`](crate::scan) reports at
    /// [`Level::UnknownCall`](crate::scan::Level::UnknownCall) or above in
    /// this file, the same decision as `ptload scan`: each once, with its
    /// strongest use (its [`level`](crate::scan::GlobalUse::level) is the
    /// highest seen), in order of first appearance. The report of a scan
    /// made while opening ([`OpenOptions::scan`]) is used; else the file's
    /// bytes are scanned again, within the limits it was opened with (a file read
    /// by ranges fetches what the scan reads, which can fail); a file put
    /// together from parts (a distributed checkpoint) has none.
    #[cfg(feature = "scan")]
    pub fn suspicious(&self) -> Result<Vec<crate::scan::GlobalUse>> {
        let report = match (&self.scanned, self.source.fetcher()) {
            (Some(scanned), _) => scanned.clone(),
            (None, Some(fetcher)) => {
                crate::scan::scan_fetched(fetcher, self.source.extents(), &self.limits)?
            }
            (None, None) => crate::scan::scan_bytes(self.source.bytes(), &self.limits),
        };
        let mut found: Vec<crate::scan::GlobalUse> = Vec::new();
        let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for g in report.pickles.into_iter().flat_map(|p| p.globals) {
            if g.level() < crate::scan::Level::UnknownCall {
                continue;
            }
            match at.get(&g.path()) {
                Some(&i) => {
                    if let Some(seen) = found.get_mut(i) {
                        if g.level() > seen.level() {
                            *seen = g;
                        }
                    }
                }
                None => {
                    at.insert(g.path(), found.len());
                    found.push(g);
                }
            }
        }
        Ok(found)
    }

    /// The DTensor spec of the tensor at `index` (see
    /// [`tensor_at`](Self::tensor_at)), when it is the local part of a
    /// DTensor (`torch.save` of an FSDP2 model's state dict): the whole
    /// tensor's shape, the mesh, this rank's place on it and the
    /// placements. [`crate::dcp::fsdp`] puts every rank's parts together.
    pub fn dtensor_at(&self, index: usize) -> Option<&DTensorSpec> {
        let index = u32::try_from(index).ok()?;
        let at = self
            .dtensors
            .binary_search_by_key(&index, |&(i, _)| i)
            .ok()?;
        self.dtensors.get(at).map(|(_, s)| s)
    }

    /// Whether any tensor is a DTensor's local part.
    pub fn has_dtensors(&self) -> bool {
        !self.dtensors.is_empty()
    }

    /// Things the reader saw but does not expose (e.g. tensors of a kind it
    /// does not read), one line each.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }
}

mod decode;
mod fetch;
mod open;
#[cfg(test)]
mod plain_tests;
mod span;
use crate::fetched::Fetched;
pub use fetch::{while_prefetching, ReadAhead};
pub use open::OpenOptions;
