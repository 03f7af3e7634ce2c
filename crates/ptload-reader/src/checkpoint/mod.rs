//! Opening a checkpoint ([`Checkpoint`], [`OpenOptions`], both also at
//! the crate root) and what it holds besides tensors: its plain values
//! ([`Scalar`]), the globals its pickles name ([`GlobalRef`]), a quantized
//! tensor's parameters ([`Quantization`]), the file's layout ([`Format`])
//! and byte order ([`ByteOrder`]), and how protocol-0-2 strings are
//! decoded ([`StringEncoding`]).

use std::path::Path;

use crate::advice::Hint;
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

/// Options for opening a checkpoint.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    limits: Limits,
    policy: Policy,
    encoding: StringEncoding,
    allowed_globals: Vec<String>,
    in_memory: bool,
    positioned: bool,
    objects: bool,
    cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    assumed_byte_order: ByteOrder,
    refuse_at: Option<crate::scan::Level>,
    scan: bool,
}

impl OpenOptions {
    /// Default limits, the default policy, UTF-8 for Python 2 strings.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn limits_ref(&self) -> &Limits {
        &self.limits
    }

    pub(crate) fn in_memory_ref(&self) -> bool {
        self.in_memory
    }

    /// Bounds on the work the file may cause.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// What to do with globals outside torch's safe allowlist.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Refuse a file the scanner ([`crate::scan`], `ptload scan`) puts at
    /// `level` or above, with an error of kind
    /// [`Refused`](crate::ErrorKind::Refused) naming what it found; read
    /// the rest as the policy says. `Level::Dangerous` refuses what runs
    /// code, spawns processes, touches files or the network and gadgets,
    /// and reads ordinary training files (argparse namespaces, full
    /// models); `Level::UnknownCall` also refuses calls of anything
    /// outside the known-safe set; `Level::NeedsCode` every pickled class.
    /// Off by default (`None`): the default policy reads any checkpoint's
    /// tensors, running nothing, and lists the globals it did not allow.
    ///
    /// The scan reads the file's pickles a second time (for a file read by
    /// ranges, fetching what it needs); tensors' bytes are not read.
    pub fn refuse_at(mut self, level: Option<crate::scan::Level>) -> Self {
        self.refuse_at = level;
        self
    }

    /// Scan the file as [`crate::scan`] does while it is decoded, on a
    /// second thread, and keep the report: [`Checkpoint::suspicious`] then
    /// scans nothing more, and a caller that wants both (`inspect`) waits
    /// for the longer of the two, not their sum. [`refuse_at`](Self::refuse_at)
    /// scans this way too. A file read by ranges is scanned when
    /// `suspicious` asks, over what the decode fetched (to refuse, before
    /// it is decoded). Off by default.
    pub fn scan(mut self, yes: bool) -> Self {
        self.scan = yes;
        self
    }

    /// How Python 2 strings decode (torch.load's `encoding`).
    pub fn encoding(mut self, encoding: StringEncoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// The byte order of a zip checkpoint that has no `byteorder` record
    /// (torch before 1.12, or saved with `_disable_byteorder_record`):
    /// little-endian unless told otherwise, as torch's
    /// `set_default_load_endianness` tells it. Files with the record, and
    /// legacy files (whose header says), are read as they say.
    pub fn assume_byte_order(mut self, order: ByteOrder) -> Self {
        self.assumed_byte_order = order;
        self
    }

    /// Allow `module.name` under [`Policy::Strict`] (torch's
    /// `add_safe_globals`), or every global a glob matches (`mymodels.*`,
    /// see [`Policy::allowlist_admits`]). Globals of `sys`, `os`, `posix`
    /// and `nt` stay refused.
    pub fn allow_global(mut self, path: impl Into<String>) -> Self {
        self.allowed_globals.push(path.into());
        self
    }

    /// Keep the unpickled object as a graph of nodes (see
    /// [`Checkpoint::objects`]): what `torch.load` returns, built without
    /// running anything. Off by default (it costs a node per value).
    ///
    /// torch.load never refuses two tensors whose flattened names agree
    /// (`{"a.b": t, "a": {"b": u}}`), so with objects the later one is
    /// named by its Python path (`['a']['b']`) instead of the open failing;
    /// without, such a file is refused as ambiguous.
    pub fn objects(mut self, yes: bool) -> Self {
        self.objects = yes;
        self
    }

    /// Stop the open with an error of kind
    /// [`Cancelled`](crate::ErrorKind::Cancelled) soon after `flag` is set
    /// (from another thread: a Ctrl-C handler, a request timeout). The
    /// pickle machine looks at it every few thousand opcodes.
    pub fn cancel(mut self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.cancel = Some(flag);
        self
    }

    /// Read the whole file into memory at open instead of mapping it.
    ///
    /// A mapped file must not change while its `Checkpoint` is alive: if
    /// another process truncates it, reading the lost pages kills this
    /// process with SIGBUS, and if it rewrites it, tensors show the new
    /// bytes. Services that read files they do not control (uploads, shared
    /// volumes) should open in memory: it costs one read of the file and
    /// its size in memory, and nothing done to the file afterwards reaches
    /// the checkpoint.
    pub fn in_memory(mut self, yes: bool) -> Self {
        self.in_memory = yes;
        self
    }

    /// Read the file by positioned reads (`pread`) instead of mapping it:
    /// opening reads only the parts it parses, as for a URL (see
    /// [`open_ranged`](Self::open_ranged)), and each storage's bytes are
    /// read into memory when a tensor over it is first read.
    ///
    /// For network file systems, where a map's page faults and readahead
    /// are slow or stall, and for files that may change underneath: a
    /// shrunk file gives an error, never SIGBUS. [`in_memory`](Self::in_memory)
    /// takes precedence. The `.distcp` files of a distributed checkpoint
    /// are mapped whatever this says.
    pub fn positioned(mut self, yes: bool) -> Self {
        self.positioned = yes;
        self
    }

    /// Open the file at `path`: memory-mapped, read into memory with
    /// [`in_memory`](Self::in_memory), or by positioned reads with
    /// [`positioned`](Self::positioned).
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        // Every error names the file (an engine's log has nothing else).
        let named = |e: Error| e.in_file(&path.display().to_string());
        let source = if self.in_memory {
            Source::read(path).map_err(named)?
        } else if self.positioned {
            let (file, meta) = crate::ranged::LocalFile::open_with_metadata(path).map_err(named)?;
            let fetcher = Fetcher::new(std::sync::Arc::new(file));
            return self
                .open_fetched(fetcher, crate::source::FileId::of(&meta))
                .map_err(named);
        } else {
            Source::map(path).map_err(named)?
        };
        Checkpoint::load(source, self).map_err(named)
    }

    /// Open a file read by ranges: `reader` fetches the parts of it that
    /// opening parses (the end of a zip, its directory, the pickles and
    /// their neighbourhood; a legacy file's pickle stream), at most
    /// [`Limits::max_open_fetch_bytes`] in all, and later each storage's
    /// bytes when a tensor over it is first read (coalesced with the
    /// storages after it that are not read yet, each range read once).
    /// Tensors' bytes are then owned buffers, never borrowed from a map.
    pub fn open_ranged(&self, reader: std::sync::Arc<dyn RangeRead>) -> Result<Checkpoint> {
        self.open_fetched(Fetcher::new(reader), None)
    }

    /// Open what `fetcher` reads; `identity` is the local file it reads,
    /// if it is one (outputs never overwrite it).
    fn open_fetched(
        &self,
        fetcher: Fetcher,
        identity: Option<crate::source::FileId>,
    ) -> Result<Checkpoint> {
        let fetcher = std::sync::Arc::new(fetcher);
        fetch_until(&fetcher, self.limits.max_open_fetch_bytes, |extents| {
            Checkpoint::load(Source::ranged(fetcher.clone(), extents, identity), self)
        })?
        .map_err(|e| e.in_file(fetcher.name()))
    }

    /// Open the checkpoint at a URL by ranged requests (see
    /// [`open_ranged`](Self::open_ranged)): `http://` and `https://`
    /// (feature `http`, `http::HttpFile`), `s3://`, `gs://`, `az://`
    /// (feature `object-store`, `bucket::BucketFile`). A scheme whose
    /// feature is not compiled in is an error naming the feature; see
    /// [`remote::open_url`](crate::remote::open_url).
    pub fn open_url(&self, url: &str) -> Result<Checkpoint> {
        self.open_ranged(crate::remote::open_url(url)?)
    }

    /// Read a checkpoint held in memory, without copying it: `bytes` may be
    /// a `Vec<u8>`, a `&'static [u8]` (`include_bytes!`), an `Arc<[u8]>`
    /// shared with the caller, or any other owner of bytes; the checkpoint
    /// keeps it alive and its tensors borrow from it.
    pub fn open_bytes(
        &self,
        bytes: impl AsRef<[u8]> + Send + Sync + 'static,
    ) -> Result<Checkpoint> {
        Checkpoint::load(Source::given(bytes), self)
    }
}

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
    warnings: Vec<String>,
    /// The limits it was opened with, for [`Checkpoint::suspicious`].
    limits: Limits,
    /// The scanner's report, when it was scanned while opened
    /// ([`OpenOptions::scan`]).
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

/// A tensor the walk named, checked against its storage: a rebuilt
/// tensor, or a storage pickled on its own.
fn walked_tensor(
    heap: &Heap,
    name: String,
    value: Value,
    storages: &[StorageInfo],
    limits: &Limits,
) -> Result<TensorInfo> {
    match heap.torch(value) {
        Some(TorchObj::Tensor(meta)) => tensor_info(heap, name, meta, storages, limits),
        Some(TorchObj::Storage { index, dtype }) => bare_storage(name, *index, *dtype, storages),
        _ => Err(Error::new(
            ErrorKind::Tensor,
            format!(
                "'{name}' is a tensor component but holds a {}",
                crate::torch::describe(heap, value)
            ),
        )),
    }
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

/// Whether `source` is worth scanning on a thread of its own while it is
/// decoded: an archive of many records (each a storage, so a pickle of
/// many tensors, whose scan takes milliseconds). A legacy file, a
/// safetensors file and a small archive are scanned on the caller's.
fn worth_a_thread(source: &Source) -> bool {
    /// Records from which a torch archive's pickle takes longer to scan
    /// than a thread to start (measured: 20,000 records scan in about
    /// 30 ms, 150 in a fraction of the 0.3 ms a thread costs).
    const MANY_RECORDS: u16 = 1_000;
    crate::container::zip::records_hint(source.bytes()).is_some_and(|n| n >= MANY_RECORDS)
}

/// The scanner's verdict (`report`): an error of kind `Refused` naming
/// the worst finding when it is at `level` or above.
fn refuse_at(report: &crate::scan::ScanReport, level: crate::scan::Level) -> Result<()> {
    let found = report.level();
    if found < level {
        return Ok(());
    }
    let worst = report
        .pickles
        .iter()
        .flat_map(|p| p.globals.iter().map(move |g| (p, g)))
        .filter(|(_, g)| g.level() == found)
        .map(|(p, g)| {
            format!(
                "{} {} ({}) in {}",
                g.path(),
                g.usage.name(),
                g.class.label(),
                p.source
            )
        })
        .next()
        .or_else(|| {
            report
                .ambiguities
                .first()
                .map(|a| format!("{} ({} at offset {})", a.what, a.record, a.offset))
        })
        .unwrap_or_else(|| "the file's structure".to_owned());
    Err(Error::new(
        ErrorKind::Refused,
        format!(
            "scan: {worst}: the file is at {}, and files at {} or above are refused",
            found.name(),
            level.name()
        ),
    ))
}

/// Torch names the first global it refuses; a user fixing a file one
/// global per run needs the whole list. Read the file again without the
/// policy (nothing is ever run either way) and name every global the
/// policy would refuse, when there is more than one.
fn every_refusal(first: Error, source: &Source, opts: &OpenOptions) -> Error {
    let mut lenient = opts.clone();
    lenient.policy = Policy::Default;
    let Ok(ckpt) = Checkpoint::decode(source.clone(), &lenient) else {
        return first;
    };
    let refused = ckpt.refused_globals(&opts.allowed_globals);
    if refused.len() < 2 {
        return first;
    }
    let note = format!(
        "The file names {} globals outside the allowlist: {}",
        refused.len(),
        refused.join(", ")
    );
    first.with_note(note, Some(Hint::AllowGlobals(refused)))
}

/// The decoded storages as the checkpoint describes them, and the
/// deflated records whose bytes are inflated on first use.
fn storage_infos(
    pending: Vec<PendingStorage>,
    bytes: Vec<StorageBytes>,
) -> (Vec<StorageInfo>, Vec<Inflated>) {
    let mut inflated = Vec::new();
    let storages = pending
        .into_iter()
        .zip(bytes)
        .map(|(p, bytes)| {
            let nbytes = p.numel.saturating_mul(p.dtype.size() as u64);
            let data = match bytes {
                StorageBytes::File(offset) => StorageData::File(offset),
                StorageBytes::Deflated(record) => {
                    inflated.push(Inflated {
                        record,
                        bytes: std::sync::OnceLock::new(),
                    });
                    StorageData::Deflated(inflated.len() - 1)
                }
            };
            StorageInfo {
                file_offset: match data {
                    StorageData::File(o) => Some(o),
                    StorageData::Owned(_) | StorageData::Deflated(_) | StorageData::Lazy(_) => None,
                },
                key: p.key,
                location: p.location,
                dtype: p.dtype,
                numel: p.numel,
                nbytes,
                record: p.record,
                data,
                quantized: p.quantized,
            }
        })
        .collect();
    (storages, inflated)
}

/// The source's pickles run onto `heap`, read as the container they are
/// found in; with them, the globals a pickle before a zip archive names
/// (bytes torch's reader skips, and scan reports).
fn decode_pickles(
    source: &Source,
    detected: Detected,
    opts: &OpenOptions,
    heap: &mut Heap,
    interp: &mut TorchInterp<'_>,
) -> Result<(Decoded, Vec<GlobalRef>)> {
    let data = source.view();
    let mut vm = Vm::new(&opts.limits, opts.encoding);
    vm.cancel = opts.cancel.clone();
    let mut leading = Vec::new();
    let decoded = match detected {
        Detected::Zip => {
            if data.up_to(0, 4) != b"PK\x03\x04" {
                let all = data.get(0..data.len()).ok_or_else(|| {
                    Error::new(ErrorKind::Zip, "bytes before the archive not fetched yet")
                })?;
                leading = leading_globals(all, opts)?;
            }
            decode_zip(
                data,
                source.file(),
                opts.assumed_byte_order,
                &opts.limits,
                heap,
                interp,
                &mut vm,
            )?
        }
        Detected::Legacy => decode_legacy(data, heap, interp, &mut vm)?,
        // Read by `Checkpoint::from_safetensors` before any pickle.
        Detected::Safetensors => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "a safetensors file holds no pickle",
            ))
        }
    };
    Ok((decoded, leading))
}

/// For the object graph: the first walked entry of each heap value, by
/// object id (`NOT_WALKED` where none); empty without the graph.
struct FirstWalked(Vec<u32>);

impl FirstWalked {
    const NOT_WALKED: u32 = u32::MAX;

    fn of(heap: &Heap, tensors: &[(String, Value)], objects: bool) -> Self {
        let mut walked_at: Vec<u32> = Vec::new();
        if objects {
            walked_at.resize(heap.len(), Self::NOT_WALKED);
            for (i, (_, v)) in tensors.iter().enumerate() {
                if let (Value::Obj(id), Ok(i)) = (v, u32::try_from(i)) {
                    match walked_at.get_mut(*id as usize) {
                        Some(slot) if *slot == Self::NOT_WALKED => *slot = i,
                        _ => {}
                    }
                }
            }
        }
        FirstWalked(walked_at)
    }

    /// The walked entry of `v`, if the walk reached it.
    fn entry(&self, v: Value) -> Option<usize> {
        match v {
            Value::Obj(id) => self
                .0
                .get(id as usize)
                .filter(|&&i| i != Self::NOT_WALKED)
                .map(|&i| i as usize),
            _ => None,
        }
    }
}

/// The DTensors among a file's tensors: each one's index and its layout.
type DTensors = Vec<(u32, DTensorSpec)>;

/// Each tensor the walk named, checked against its storage, and the
/// DTensors among them by index.
fn walked_tensors(
    heap: &Heap,
    walked: Vec<(String, Value)>,
    storages: &[StorageInfo],
    limits: &Limits,
) -> Result<(Vec<TensorInfo>, DTensors)> {
    let mut tensors = Vec::with_capacity(walked.len());
    let mut dtensors = Vec::new();
    for (name, value) in walked {
        // Indices must stay those of `by_name`: nothing is skipped.
        if let Some(TorchObj::Tensor(meta)) = heap.torch(value) {
            if let Some(spec) = &meta.dtensor {
                let at = u32::try_from(tensors.len())
                    .map_err(|_| Error::limit("max_tensors", u64::from(u32::MAX)))?;
                dtensors.push((at, (**spec).clone()));
            }
        }
        tensors.push(walked_tensor(heap, name, value, storages, limits)?);
    }
    Ok((tensors, dtensors))
}

/// The object graph under `root`: a tensor the walk reached is copied from
/// its entry, any other described as `<node N>`.
fn object_graph(
    heap: &Heap,
    root: Value,
    first_walked: &FirstWalked,
    tensors: &[TensorInfo],
    storages: &[StorageInfo],
    limits: &Limits,
) -> Result<Objects> {
    let walked = |v: Value| first_walked.entry(v).and_then(|i| tensors.get(i));
    let mut make = |v: Value, node: usize| match (walked(v), heap.torch(v)) {
        (Some(t), _) => Ok(t.clone()),
        (None, Some(TorchObj::Tensor(meta))) => {
            tensor_info(heap, format!("<node {node}>"), meta, storages, limits)
        }
        _ => Err(Error::new(ErrorKind::Tensor, "not a tensor")),
    };
    crate::object::build(heap, root, limits, tensors.len(), &mut make)
}

/// The warning for a file holding DTensors: what each of its entries is.
fn dtensor_warning(dtensors: &[(u32, DTensorSpec)]) -> Option<String> {
    let (_, spec) = dtensors.first()?;
    Some(format!(
        "{} tensors are DTensors: each is listed as this file's local part (rank {} at \
         {:?} on a mesh of {:?}); open every rank's file as one set for whole tensors",
        dtensors.len(),
        spec.rank.map_or_else(|| "?".to_owned(), |r| r.to_string()),
        spec.coordinate,
        spec.mesh
    ))
}

impl Checkpoint {
    /// Open the checkpoint at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        OpenOptions::new().open(path)
    }

    /// Read a checkpoint held in memory, with default options (see
    /// [`OpenOptions::open_bytes`]).
    pub fn from_bytes(bytes: impl AsRef<[u8]> + Send + Sync + 'static) -> Result<Checkpoint> {
        OpenOptions::new().open_bytes(bytes)
    }

    fn load(source: Source, opts: &OpenOptions) -> Result<Checkpoint> {
        source.advise(true);
        let checkpoint = Checkpoint::scan_and_decode(&source, opts);
        source.advise(false);
        checkpoint
    }

    /// Decode `source`; scanned too when `opts` asks (its report kept, and
    /// a file at `refuse_at` or above refused): bytes at hand are scanned
    /// on a second thread while they are decoded, a file read by ranges
    /// first when it may be refused.
    fn scan_and_decode(source: &Source, opts: &OpenOptions) -> Result<Checkpoint> {
        let scan_here = || crate::scan::scan_bytes(source.bytes(), &opts.limits);
        let (report, decoded) = match (opts.scan || opts.refuse_at.is_some(), source.fetcher()) {
            (false, _) => (None, None),
            // Read by ranges: scanned first only to refuse (else when
            // asked, over what the decode fetched, as without the option).
            (true, Some(_)) if opts.refuse_at.is_none() => (None, None),
            (true, Some(fetcher)) => {
                let report = crate::scan::scan_fetched(fetcher, source.extents(), &opts.limits)?;
                (Some(report), None)
            }
            // A small archive's pickle scans in less time than a thread
            // takes to start: scanned here, before the decode.
            (true, None) if !worth_a_thread(source) => (Some(scan_here()), None),
            (true, None) => std::thread::scope(|scope| {
                let scan = std::thread::Builder::new()
                    .name("ptload-scan".into())
                    .spawn_scoped(scope, scan_here);
                let decoded = Checkpoint::decode(source.clone(), opts);
                // A thread the system refused to start: scanned here.
                let report = scan.ok().and_then(|h| h.join().ok());
                (Some(report.unwrap_or_else(scan_here)), Some(decoded))
            }),
        };
        if let (Some(level), Some(report)) = (opts.refuse_at, &report) {
            refuse_at(report, level)?;
        }
        let decoded = decoded.unwrap_or_else(|| Checkpoint::decode(source.clone(), opts));
        let mut checkpoint = match decoded {
            Err(e) if e.kind() == ErrorKind::UnsupportedGlobal => {
                Err(every_refusal(e, source, opts))
            }
            other => other,
        }?;
        checkpoint.scanned = report;
        Ok(checkpoint)
    }

    fn decode(source: Source, opts: &OpenOptions) -> Result<Checkpoint> {
        let detected = detect(source.view())?;
        if detected == Detected::Safetensors {
            return Checkpoint::from_safetensors(source, opts);
        }
        let mut heap = Heap::new(&opts.limits);
        let mut interp = TorchInterp::new(opts.policy, &opts.allowed_globals);
        let (decoded, leading) = decode_pickles(&source, detected, opts, &mut heap, &mut interp)?;
        let walked = walk_all(
            &heap,
            &decoded.roots,
            &opts.limits,
            decoded.storages.len(),
            opts.objects,
        )?;
        let objects_root = decoded.roots.first().map(|&(v, _)| v);
        if walked.tensors.len() > opts.limits.max_tensors {
            return Err(Error::limit_needing(
                "max_tensors",
                opts.limits.max_tensors as u64,
                walked.tensors.len() as u64,
            ));
        }
        let (storages, inflated) = storage_infos(decoded.storages, decoded.bytes);
        let first_walked = FirstWalked::of(&heap, &walked.tensors, opts.objects);
        let mut warnings = decoded.notes;
        warnings.extend(walked.warnings);
        let (tensors, dtensors) = walked_tensors(&heap, walked.tensors, &storages, &opts.limits)?;
        let objects = match objects_root.filter(|_| opts.objects) {
            None => None,
            Some(root) => Some(object_graph(
                &heap,
                root,
                &first_walked,
                &tensors,
                &storages,
                &opts.limits,
            )?),
        };
        warnings.extend(dtensor_warning(&dtensors));
        let fetched = match source.fetcher() {
            None => Fetched::default(),
            Some(_) => Fetched::for_storages(&storages, &opts.limits),
        };
        Ok(Checkpoint {
            source,
            owned: Vec::new(),
            lazy: None,
            inputs: Vec::new(),
            inflated,
            format: decoded.format,
            byte_order: decoded.byte_order,
            pickle_protocol: decoded.protocol,
            storages,
            tensors,
            dtensors,
            values: walked.values,
            value_calls: walked.value_calls,
            callables: walked.callables,
            globals: leading.into_iter().chain(interp.globals).collect(),
            warnings,
            limits: opts.limits.clone(),
            scanned: None,
            by_name: walked.by_name,
            work: heap.work().saturating_add(walked.steps),
            objects,
            scattered: std::sync::atomic::AtomicBool::new(false),
            end: decoded.end,
            fetched,
        })
    }

    /// A checkpoint of tensors put together in memory (a DCP directory's
    /// chunks): each `(name, dtype, shape, row-major host-order bytes)` its
    /// own storage (without bytes, a tensor with no storage, whose data
    /// lies elsewhere), with the values and warnings given; `protocol` is
    /// that of the pickle that described them.
    pub(crate) fn assembled(
        parts: Vec<AssembledTensor>,
        values: Vec<(String, Scalar)>,
        warnings: Vec<String>,
        protocol: u8,
        format: Format,
    ) -> Result<Checkpoint> {
        let parts = parts.into_iter().map(|(name, dtype, shape, bytes)| {
            let held = bytes.map_or(Held::Elsewhere, Held::Owned);
            (name, dtype, shape, held)
        });
        Checkpoint::of_parts(parts, values, warnings, protocol, format)
    }

    /// A checkpoint of whole row-major tensors, each its own storage: the
    /// body of [`assembled`](Self::assembled), whose storages may also lie
    /// in the checkpoint's own file (a safetensors file's).
    fn of_parts(
        parts: impl ExactSizeIterator<Item = (String, DType, Vec<u64>, Held)>,
        values: Vec<(String, Scalar)>,
        warnings: Vec<String>,
        protocol: u8,
        format: Format,
    ) -> Result<Checkpoint> {
        let mut by_name = NameIndex::with_capacity(parts.len());
        let mut storages = Vec::with_capacity(parts.len());
        let mut tensors: Vec<TensorInfo> = Vec::with_capacity(parts.len());
        let mut owned = Vec::with_capacity(parts.len());
        for (i, (name, dtype, shape, held)) in parts.enumerate() {
            let at =
                u32::try_from(i).map_err(|_| Error::limit("max_tensors", u64::from(u32::MAX)))?;
            let numel = shape
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d))
                .ok_or_else(|| {
                    Error::new(ErrorKind::Tensor, "shape overflows").for_tensor(&name)
                })?;
            let nbytes = numel
                .checked_mul(dtype.size() as u64)
                .ok_or_else(|| Error::new(ErrorKind::Tensor, "size overflows").for_tensor(&name))?;
            if matches!(&held, Held::Owned(b) if b.len() as u64 != nbytes) {
                return Err(Error::new(
                    ErrorKind::Tensor,
                    format!("{nbytes} bytes for {numel} elements of {dtype}"),
                )
                .for_tensor(&name));
            }
            let mut stride = vec![1u64; shape.len()];
            let mut acc = 1u64;
            for (s, &d) in stride.iter_mut().zip(&shape).rev() {
                *s = acc;
                acc = acc.saturating_mul(d.max(1));
            }
            let hash = by_name.hash(name.as_str());
            let name_of = |j: u32| tensors.get(j as usize).map(|t| t.name.as_str());
            if by_name.find_hashed(hash, &name, name_of).is_some() {
                return Err(
                    Error::new(ErrorKind::DuplicateName, "two tensors of this name")
                        .for_tensor(&name),
                );
            }
            let (file_offset, data) = match held {
                Held::Owned(bytes) => {
                    owned.push(bytes);
                    (None, Some(StorageData::Owned(owned.len() - 1)))
                }
                Held::File(at) => (Some(at), Some(StorageData::File(at))),
                Held::Elsewhere => (None, None),
            };
            let storage = data.map(|data| {
                storages.push(StorageInfo {
                    key: storages.len().to_string(),
                    location: "cpu".to_owned(),
                    dtype,
                    numel,
                    nbytes,
                    record: None,
                    file_offset,
                    data,
                    quantized: None,
                });
                storages.len() - 1
            });
            tensors.push(TensorInfo {
                name,
                dtype,
                shape,
                stride,
                storage_offset: 0,
                storage,
                numel,
                nbytes,
                requires_grad: false,
                conj: false,
                neg: false,
                quantization: None,
            });
            by_name.insert_hashed(hash, at, |j| {
                tensors.get(j as usize).map(|t| t.name.as_str())
            });
        }
        Ok(Checkpoint {
            source: Source::owned(Vec::new(), None),
            owned,
            lazy: None,
            inputs: Vec::new(),
            inflated: Vec::new(),
            format,
            byte_order: ByteOrder::HOST,
            pickle_protocol: protocol,
            storages,
            tensors,
            dtensors: Vec::new(),
            values,
            value_calls: Vec::new(),
            callables: Vec::new(),
            globals: Vec::new(),
            warnings,
            limits: Limits::default(),
            scanned: None,
            by_name,
            work: 0,
            objects: None,
            scattered: std::sync::atomic::AtomicBool::new(false),
            end: 0,
            fetched: Fetched::default(),
        })
    }

    /// A safetensors file: each tensor its own storage, a view of the
    /// file's bytes (little-endian, as the format stores them); the
    /// header's `__metadata__` as string values; with `opts.objects`, the
    /// `{name: tensor}` dict safetensors' `load_file` returns.
    fn from_safetensors(source: Source, opts: &OpenOptions) -> Result<Checkpoint> {
        let header = crate::container::safetensors::parse(source.view(), &opts.limits, |name| {
            DType::from_safetensors_name(name).map(|d| d.size() as u64)
        })?;
        let start = header.data_start;
        let mut parts = Vec::with_capacity(header.entries.len());
        for e in header.entries {
            let at = start
                .checked_add(e.begin)
                .ok_or_else(|| Error::new(ErrorKind::Tensor, "offset overflows"))?;
            let dtype = DType::from_safetensors_name(&e.dtype).ok_or_else(|| {
                Error::new(
                    ErrorKind::Tensor,
                    format!("dtype {:?} is not one ptload reads", e.dtype),
                )
            })?;
            parts.push((e.name, dtype, e.shape, Held::File(at)));
        }
        let values = header
            .metadata
            .into_iter()
            .map(|(k, v)| (k, Scalar::Str(v)))
            .collect();
        let mut ckpt = Checkpoint::of_parts(
            parts.into_iter(),
            values,
            Vec::new(),
            0,
            Format::Safetensors,
        )?;
        ckpt.byte_order = ByteOrder::Little;
        ckpt.end = header.end;
        ckpt.limits = opts.limits.clone();
        if opts.objects {
            ckpt.objects = Some(crate::object::name_dict(&ckpt.tensors));
        }
        ckpt.fetched = match source.fetcher() {
            None => Fetched::default(),
            Some(_) => Fetched::for_storages(&ckpt.storages, &ckpt.limits),
        };
        ckpt.source = source;
        Ok(ckpt)
    }

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
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

/// A zip behind other bytes: torch.load reads such a file as a pickle
/// stream from its first byte. The globals of the pickles it would run
/// there are listed first (under the record `(bytes before the zip)`), and
/// under the strict policy they must be allowed too: a code-running pickle
/// followed by a real checkpoint is refused, as torch refuses it.
fn leading_globals(data: &[u8], opts: &OpenOptions) -> Result<Vec<GlobalRef>> {
    let report = crate::scan::scan_bytes(data, &opts.limits);
    let stream = report
        .pickles
        .iter()
        .filter(|p| p.reachable && matches!(p.source, crate::scan::PickleSource::Stream { .. }));
    let globals: Vec<GlobalRef> = stream
        .flat_map(|p| &p.globals)
        .map(|g| GlobalRef {
            module: g.module.clone(),
            name: g.name.clone(),
            record: "(bytes before the zip)".into(),
            offset: g.offset,
            torch_allowed: crate::torch::policy::torch_allows(&g.module, &g.name),
            called: matches!(
                g.usage,
                crate::scan::Usage::Called | crate::scan::Usage::LookedUp
            ),
            instantiated: g.usage == crate::scan::Usage::Instantiated,
        })
        .collect();
    if opts.policy != Policy::Strict {
        return Ok(globals);
    }
    let refused: Vec<String> = globals
        .iter()
        .filter(|g| {
            !g.torch_allowed
                && !crate::torch::policy::user_allows(&opts.allowed_globals, &g.module, &g.name)
        })
        .map(GlobalRef::path)
        .collect();
    match refused.first() {
        None => Ok(globals),
        Some(first) => Err(Error::new(
            ErrorKind::UnsupportedGlobal,
            format!(
                "Unsupported global: GLOBAL {first} was not an allowed global by default; the \
                 file does not start with a zip header, so torch.load unpickles the bytes before \
                 the archive, which name {}",
                refused.join(", ")
            ),
        )),
    }
}

mod fetch;
pub use fetch::while_prefetching;
use fetch::Fetched;
