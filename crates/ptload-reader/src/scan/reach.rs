//! Which pickles `torch.load` would run in a file, and what each one would
//! import and call: the scanner's view.
//!
//! torch decides the layout by the first four bytes alone: `PK\x03\x04`
//! is a zip, and anything else goes to the legacy path, which unpickles
//! the first pickle of the stream (with the full unpickler) before it
//! checks the magic number. So a pickle followed by a real checkpoint zip
//! runs its pickle; a bare pickle at any protocol runs. In a zip, torch
//! reads `<prefix>/data.pkl` (the last of duplicate names, whatever its
//! CRC), and TorchScript archives also `constants.pkl`. Everything else
//! that holds a pickle (other `.pkl` entries, a zip behind a pickle,
//! pickles stored as bytes inside a pickle) is reported too, as not
//! reachable by `torch.load`.
//!
//! Each pickle runs in the VM with a recording interpreter that gives
//! meaning to nothing: it notes every global, and how it is used (called,
//! instantiated, or only referenced). A pickle that breaks keeps what it
//! recorded before the break: the scan fails closed.

use std::borrow::Cow;

use hashbrown::{HashMap, HashSet};

use super::{
    classify, conditional_data, known_enum, torchscript, wrapper_class, Danger, GlobalClass, Level,
};
use crate::bytes::find;
use crate::container::zip::{self, Archive, Headers, Method, Rules};
use crate::error::Result;
use crate::limits::Limits;
use crate::pickle::{Heap, Interpreter, Obj, ObjId, Object, StringEncoding, Value, Vm};
use crate::ranged::{fetch_more_until, Extents, Fetcher, FileView, RangeRead};
use crate::torch::dtype::DType;
use crate::torch::plain::KeptPlain;

/// How a global is used by the pickle that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Usage {
    /// Named only (imported by `find_class`, never called).
    Referenced,
    /// Constructed without a call the file chose: NEWOBJ(_EX) (the class's
    /// `__new__`), `copyreg._reconstructor`'s class over `object`,
    /// `copyreg.__newobj__`, the type of `_rebuild_from_type_v2`; then
    /// filled by BUILD (its `__setstate__` or `__dict__`). A
    /// `functools.partial` made and kept, never called, counts here too.
    Instantiated,
    /// A class of a package (or `__main__`) called with one constant, and
    /// in no other way: how an `Enum` member pickles (`Format('NCHW')`,
    /// looked up by its value). The package is not the standard library,
    /// torch, numpy or another library every loading machine has, which
    /// any file can name and whose enums are listed by name (a class of
    /// theirs may act: a re-exported `Popen`); the name is a class's
    /// (capitalized, no attribute path). Its code runs as an instantiated class's does, and the file
    /// chose only the constant: loading needs the code
    /// ([`Level::NeedsCode`]), as for the class instantiated.
    LookedUp,
    /// Called: REDUCE, OBJ and INST (`cls(*args)`: `__init__` runs, or the
    /// function), `copyreg._reconstructor`'s base (its `__init__`), the
    /// function of `_rebuild_from_type_v2`, calling an instance (its
    /// class's `__call__`) or a partial (its function), `instance.__new__`.
    Called,
}

impl Usage {
    /// `referenced`, `instantiated` or `called`.
    pub fn name(self) -> &'static str {
        match self {
            Usage::Referenced => "referenced",
            Usage::Instantiated => "instantiated",
            Usage::LookedUp => "looked-up",
            Usage::Called => "called",
        }
    }
}

/// One global a pickle names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GlobalUse {
    /// Module, as the pickle names it (Python 2 names mapped as Python 3
    /// maps them).
    pub module: String,
    /// Name: protocol 4 may name an attribute path (`a.b.c`).
    pub name: String,
    /// Offset of its first GLOBAL / STACK_GLOBAL / INST opcode in the pickle.
    pub offset: u64,
    /// The strongest use seen.
    pub usage: Usage,
    /// What it is.
    pub class: GlobalClass,
}

impl GlobalUse {
    /// `module.name`.
    pub fn path(&self) -> String {
        format!("{}.{}", self.module, self.name)
    }

    /// What this use lets the file make happen: a dangerous global is
    /// dangerous in any use (a wrapper such as `functools.partial` only once
    /// called); an unknown one is an unknown call when called, and needs its
    /// code otherwise. TorchScript's own types (`__torch__.*`) are built by
    /// the TorchScript loader from the archive, not imported.
    pub fn level(&self) -> Level {
        match self.class {
            GlobalClass::Dangerous(_)
                if self.usage < Usage::Called && wrapper_class(&self.module, &self.name) =>
            {
                Level::NeedsCode
            }
            GlobalClass::Dangerous(_) => Level::Dangerous,
            GlobalClass::Unknown if self.module.starts_with("__torch__") => Level::Clean,
            GlobalClass::Unknown if self.usage == Usage::Called => Level::UnknownCall,
            GlobalClass::Unknown => Level::NeedsCode,
            _ => Level::Clean,
        }
    }

    /// Whether this use fails a gate at the default line
    /// ([`Level::UnknownCall`]).
    pub fn is_finding(&self) -> bool {
        self.level() >= Level::UnknownCall
    }
}

/// Where a pickle lies in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PickleSource {
    /// A zip entry.
    Entry(String),
    /// The `index`th pickle of a stream (the legacy layout, or a bare
    /// pickle), starting at `offset`.
    Stream {
        /// 0 for the first pickle.
        index: usize,
        /// Byte offset in the file.
        offset: u64,
    },
    /// A member of a pre-1.0 tar checkpoint.
    TarMember(String),
    /// The data of a numpy object array (a `.npy` file, or an entry of a
    /// `.npz` zip), which `numpy.load(allow_pickle=True)` unpickles: the
    /// file, or the entry's name.
    NumpyArray(String),
    /// Bytes inside another pickle, at the offset of the bytes value.
    Nested {
        /// The pickle holding it.
        parent: String,
        /// Which bytes value of the parent, in order of creation.
        index: usize,
    },
}

impl std::fmt::Display for PickleSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PickleSource::Entry(name) => write!(f, "{name}"),
            PickleSource::Stream { index, offset } => {
                write!(f, "stream pickle {index} at offset {offset:#x}")
            }
            PickleSource::TarMember(name) => write!(f, "tar member {name}"),
            PickleSource::NumpyArray(name) => write!(f, "numpy object array {name}"),
            PickleSource::Nested { parent, index } => {
                write!(f, "bytes value {index} inside {parent}")
            }
        }
    }
}

/// One pickle of the file and what it names.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ScannedPickle {
    /// Where it is.
    pub source: PickleSource,
    /// Whether `torch.load(weights_only=False)` would unpickle it.
    pub reachable: bool,
    /// Where its bytes start in the file, when they lie there as they are
    /// (not inflated, not nested): a global's offset plus this is its
    /// offset in the file.
    pub base: Option<u64>,
    /// Every global it names, once each, in order of first appearance.
    pub globals: Vec<GlobalUse>,
    /// Whether it ran to its STOP.
    pub complete: bool,
    /// Why it did not, when it did not (the globals before the error are
    /// still listed).
    pub error: Option<String>,
}

/// Structure that other readers read differently from these bytes: where
/// it is and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ambiguity {
    /// The record (zip entry, pickle) it concerns, or the file's layout
    /// for the container as a whole.
    pub record: String,
    /// Byte offset: in the file for container structure, in the pickle
    /// for a pickle's opcodes.
    pub offset: u64,
    /// What other readers would see differently.
    pub what: String,
}

/// What torch's own reading of the container does beyond unpickling (a
/// pre-1.0 tar checkpoint's members are extracted to disk): where and
/// what, at a danger's level.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Effect {
    /// The record it concerns.
    pub record: String,
    /// Byte offset in the file (the member's header).
    pub offset: u64,
    /// What kind of harm it can do.
    pub danger: Danger,
    /// What happens.
    pub what: String,
}

/// The scanner's judgement of a file: its [`Level`], or unreadable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// A dangerous global, anywhere in the file, or a gadget that reaches
    /// a call.
    Dangerous,
    /// Structure other readers read differently.
    Ambiguous,
    /// An unknown global that is called.
    UnknownCall,
    /// Classes that are only named or constructed: loading needs their
    /// code, not a payload.
    NeedsCode,
    /// Nothing but tensors and plain data.
    Clean,
    /// No pickle torch.load would unpickle could be read (not a
    /// checkpoint, or too broken for torch to unpickle anything either),
    /// and nothing at or above [`Level::UnknownCall`] was found.
    Unreadable,
}

impl Verdict {
    /// The level's name, or `unreadable`.
    pub fn name(self) -> &'static str {
        match self.level() {
            Some(level) => level.name(),
            None => "unreadable",
        }
    }

    /// The level, `None` when unreadable.
    pub fn level(self) -> Option<Level> {
        match self {
            Verdict::Dangerous => Some(Level::Dangerous),
            Verdict::Ambiguous => Some(Level::Ambiguous),
            Verdict::UnknownCall => Some(Level::UnknownCall),
            Verdict::NeedsCode => Some(Level::NeedsCode),
            Verdict::Clean => Some(Level::Clean),
            Verdict::Unreadable => None,
        }
    }

    fn of(level: Level) -> Verdict {
        match level {
            Level::Dangerous => Verdict::Dangerous,
            Level::Ambiguous => Verdict::Ambiguous,
            Level::UnknownCall => Verdict::UnknownCall,
            Level::NeedsCode => Verdict::NeedsCode,
            Level::Clean => Verdict::Clean,
        }
    }
}

/// What a scan found in one file.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ScanReport {
    /// How torch would read the file: `zip`, `legacy`, `tar`.
    pub layout: &'static str,
    /// Every pickle found, reachable ones first.
    pub pickles: Vec<ScannedPickle>,
    /// Structure other readers read differently (each makes the file
    /// [`Level::Ambiguous`] at least).
    pub ambiguities: Vec<Ambiguity>,
    /// What torch's reading of the container itself does (each makes the
    /// file [`Level::Dangerous`]).
    pub effects: Vec<Effect>,
    /// Problems with the container itself (a zip directory torch could not
    /// read either, ...).
    pub notes: Vec<String>,
    /// A file that holds no pickle and whose header was read and checked
    /// (a safetensors file): nothing in it can run.
    pub holds_no_pickle: bool,
}

impl ScanReport {
    /// The highest level of the file's findings, wherever they are (a
    /// pickle torch.load would not reach, or a broken file, included).
    pub fn level(&self) -> Level {
        let globals = self.pickles.iter().flat_map(|p| &p.globals);
        let level = globals.map(GlobalUse::level).max().unwrap_or(Level::Clean);
        if !self.effects.is_empty() {
            Level::Dangerous
        } else if self.ambiguities.is_empty() {
            level
        } else {
            level.max(Level::Ambiguous)
        }
    }

    /// Whether a pickle torch.load would unpickle was read to its end.
    pub fn readable(&self) -> bool {
        self.pickles.iter().any(|p| p.complete && p.reachable)
    }

    /// The verdict: a level at or above [`Level::UnknownCall`] wherever it
    /// was found (a broken file included); else unreadable when no pickle
    /// torch.load would reach could be read (and the file is no checked
    /// safetensors file); else the level.
    pub fn verdict(&self) -> Verdict {
        let level = self.level();
        if level < Level::UnknownCall && !self.readable() && !self.holds_no_pickle {
            Verdict::Unreadable
        } else {
            Verdict::of(level)
        }
    }
}

/// Scan the bytes of a file as `torch.load` would read them.
pub fn scan_bytes(data: &[u8], limits: &Limits) -> ScanReport {
    scan_view(FileView::Whole(data), limits)
}

/// Scan a file read by ranges (a URL): only the parts the scan reads are
/// fetched (a zip's directory, its pickles and their neighbourhood; a
/// legacy file's pickle stream), at most
/// [`Limits::max_open_fetch_bytes`]. The report, and the bytes and reads
/// fetched.
pub fn scan_ranged(
    reader: std::sync::Arc<dyn RangeRead>,
    limits: &Limits,
) -> Result<(ScanReport, (u64, u64))> {
    let fetcher = Fetcher::new(reader);
    let report = scan_fetched(&fetcher, None, limits)?;
    Ok((report, (fetcher.bytes_read(), fetcher.requests())))
}

/// [`scan_ranged`] through a fetcher already in use (a checkpoint's, whose
/// opening fetched most of what the scan reads).
pub(crate) fn scan_fetched(
    fetcher: &Fetcher,
    held: Option<&Extents>,
    limits: &Limits,
) -> Result<ScanReport> {
    let held = held.map_or_else(|| Extents::new(fetcher.len()), Extents::copy);
    fetch_more_until(fetcher, limits.max_open_fetch_bytes, held, |extents| {
        scan_view(FileView::Fetched(&extents), limits)
    })
    .map_err(|e| e.in_file(fetcher.name()))
}

/// Scan the file at a URL by ranged requests (see [`scan_ranged`]):
/// `http(s)://` (feature `http`), `s3://`, `gs://`, `az://` (feature
/// `object-store`); see [`remote::open_url`](crate::remote::open_url).
pub fn scan_url(url: &str, limits: &Limits) -> Result<(ScanReport, (u64, u64))> {
    scan_ranged(crate::remote::open_url(url)?, limits)
}

/// [`scan_bytes`] over the whole file or the ranges fetched of it: what
/// is not fetched is noted as missed (see `ranged`), and a pickle stream
/// that ran out of fetched bytes asks for more.
fn scan_view(view: FileView<'_>, limits: &Limits) -> ScanReport {
    scan_view_with(view, limits, true, Headers::Map, None)
}

/// [`scan_bytes`] of the mapped bytes of `file`, whose zip local headers
/// are read from the file with positioned reads where the archive's
/// records lie far apart (as the decode reads them), instead of faulting
/// in a page of the map for each, and each once.
/// The archive is parsed twice (as a tolerant reader and as torch reads
/// it) and looked at between its records: `kept` reads each header once,
/// and keeps it for the caller (a decode of the same file).
pub(crate) fn scan_file_bytes<'f>(
    data: &[u8],
    kept: &'f crate::container::zip::KeptReads<'f>,
    kept_plain: Option<&'f KeptPlain>,
    limits: &Limits,
) -> ScanReport {
    scan_view_with(
        FileView::Whole(data),
        limits,
        true,
        Headers::Kept(kept),
        kept_plain,
    )
}

/// [`scan_bytes`] with the general machine for every pickle: what the
/// shortcut for plain state dicts must report alike.
#[cfg(test)]
pub(crate) fn scan_bytes_general(data: &[u8], limits: &Limits) -> ScanReport {
    scan_view_with(FileView::Whole(data), limits, false, Headers::Map, None)
}

/// [`scan_view`], with `plain` whether a zip's pickles are first tried as
/// plain state dicts ([`Scanner::plain_pickle`]), `headers` how the
/// local headers of the zip the file is read, and `kept_plain` where a
/// plain read of the file's `data.pkl` is kept for the decode after.
fn scan_view_with<'f>(
    view: FileView<'_>,
    limits: &Limits,
    plain: bool,
    headers: Headers<'f>,
    kept_plain: Option<&'f KeptPlain>,
) -> ScanReport {
    let mut vm = Vm::new(limits, StringEncoding::Bytes);
    vm.read_short_frames = true;
    vm.lone_surrogates = true;
    let mut scan = Scanner {
        limits,
        vm,
        report: ScanReport::default(),
        nested: Vec::new(),
        ran_out: false,
        result_used: false,
        result_iterated: false,
        plain,
        headers,
        kept_plain,
        zip_records: 0,
    };
    let head = view.up_to(0, 512);
    let safetensors =
        crate::container::detect(view).ok() == Some(crate::container::Detected::Safetensors);
    if safetensors {
        // torch 2.15 hands a `.safetensors` path to safetensors, which runs
        // nothing; any other name (and every older torch) is unpickled from
        // byte 0, so the stream below is scanned too: a header that is also
        // a pickle program is what it is.
        let sizes = |name: &str| DType::from_safetensors_name(name).map(|d| d.size() as u64);
        match crate::container::safetensors::parse(view, limits, sizes) {
            Ok(header) => {
                scan.report.holds_no_pickle = true;
                scan.report.notes.push(format!(
                    "a safetensors file: {} tensors under a JSON header; what a pickle reader \
                     makes of its first bytes is scanned too",
                    header.entries.len()
                ));
            }
            // A header not fetched yet is read in a later round.
            Err(_) if view.incomplete() => {}
            Err(e) => scan.report.notes.push(e.to_string()),
        }
    }
    if head.starts_with(b"PK\x03\x04") {
        scan.report.layout = "zip";
        scan.zip_file(view);
    } else if crate::container::is_tar_header(head) {
        // torch.load tries `tarfile` first on any file that is no zip: a
        // header its checksum makes valid (the `ustar` magic or not) is
        // read as a pre-1.0 tar checkpoint, whatever its bytes also are.
        scan.report.layout = "tar";
        if let Some(all) = view.get(0..view.len()) {
            scan.tar(all);
        }
    } else {
        scan.report.layout = "legacy";
        let data = view.prefix();
        scan.stream(data);
        if scan.ran_out {
            view.grow();
        }
        if let Some(start) = npy_pickle(data) {
            let source = PickleSource::NumpyArray("file".into());
            scan.run(data, start, source, false, 0, Some(0));
        }
        // A zip behind the stream: torch never reads it, other tools may.
        if zip::find_eocd_in(view).is_some() {
            let read = scan.report.pickles.first().is_some_and(|p| p.complete);
            if read {
                scan.report.ambiguities.push(Ambiguity {
                    record: "file".into(),
                    offset: 0,
                    what: "a pickle stream before a zip archive: torch runs the stream, zip readers see the archive".into(),
                });
            }
            let mut seen = HashSet::new();
            scan.zip(view, false, &mut seen);
        }
    }
    scan.nested_pickles();
    if safetensors {
        scan.report.layout = "safetensors";
    }
    scan.report
}

/// Scan the file at `path`: mapped, or read into memory with `in_memory`
/// (see [`OpenOptions::in_memory`](crate::OpenOptions::in_memory)). Only
/// opening the file can fail; everything after is in the report.
pub fn scan_file(path: &std::path::Path, limits: &Limits, in_memory: bool) -> Result<ScanReport> {
    let source = if in_memory {
        crate::source::Source::read(path)?
    } else {
        crate::source::Source::map(path)?
    };
    Ok(match source.file() {
        Some(file) => scan_file_bytes(
            source.bytes(),
            &crate::container::zip::KeptReads::new(file),
            None,
            limits,
        ),
        None => scan_bytes(source.bytes(), limits),
    })
}

/// torch's legacy magic number, 0x1950a86a20f9469cfc6c, as the VM's
/// little-endian two's complement.
const MAGIC: [u8; 10] = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];

/// At most this many pickles are scanned in one file (zip entries, nested
/// bytes); the rest are reported as not scanned.
const MAX_PICKLES: usize = 4096;

/// Pickles inside pickles are followed this deep.
const MAX_NESTING: usize = 3;

struct Scanner<'l, 'f> {
    limits: &'l Limits,
    /// How the local headers of the file's own zip are read.
    headers: Headers<'f>,
    /// Where a plain read of the file's `data.pkl` is kept for the decode
    /// that follows (see [`KeptPlain`]).
    kept_plain: Option<&'f KeptPlain>,
    /// The records of the archive whose pickles are being scanned.
    zip_records: usize,
    vm: Vm<'l>,
    report: ScanReport,
    /// Bytes values that look like pickles: (parent, index, depth, bytes).
    nested: Vec<(String, usize, usize, Vec<u8>)>,
    /// A pickle ran to the end of the bytes it was given: of a file read
    /// by ranges, more may need fetching.
    ran_out: bool,
    /// The next pickle's result is a value torch's loader itself uses as
    /// data (a legacy header: compared, iterated), not one it returns.
    result_used: bool,
    /// That value is iterated (a legacy file's storage keys, a tar
    /// record's count and arguments): a library's object there runs its
    /// own methods. One compared with a number (the magic number) is not
    /// counted: its class's comparison is rarely its own.
    result_iterated: bool,
    /// Whether a zip entry's pickle is first read as a plain state dict.
    plain: bool,
}

impl Scanner<'_, '_> {
    /// Scan a zip entry's `bytes` (read from `entry`): an `.npz` member's
    /// pickle only when it is an object array, any other entry from its
    /// first byte; offsets in the file only for a stored entry.
    fn entry_pickle(&mut self, bytes: &[u8], entry: &zip::Entry<'_>, reach: bool) {
        let base = match entry.method {
            Method::Stored => Some(entry.data_start),
            Method::Deflated => None,
        };
        if entry.name.ends_with(".npy") {
            if let Some(start) = npy_pickle(bytes) {
                let source = PickleSource::NumpyArray(entry.name.to_owned());
                self.run(bytes, start, source, false, 0, base);
            }
        } else {
            let source = PickleSource::Entry(entry.name.to_owned());
            if !self.plain_pickle(bytes, &source, reach, base) {
                self.run(bytes, 0, source, reach, 0, base);
            }
        }
    }

    /// Record `bytes` as the general machine would, when they are a plain
    /// state dict's pickle (`torch/plain.rs`: torch's rebuild of tensors
    /// from its storage classes, in a dict or an `OrderedDict`, with an
    /// `nn.Module`'s `_metadata`). Such a pickle calls only those, makes
    /// no object whose methods run, holds no bytes and stays within the
    /// limits with room: all the general machine records of it is its
    /// globals, each called or referenced. False, recording nothing, for
    /// any other pickle (the general machine then runs it); tests compare
    /// both on every fixture and on damaged copies.
    fn plain_pickle(
        &mut self,
        bytes: &[u8],
        source: &PickleSource,
        reachable: bool,
        base: Option<u64>,
    ) -> bool {
        if !self.plain || self.report.pickles.len() >= MAX_PICKLES {
            return false;
        }
        let record = source.to_string();
        let cancel = self.vm.cancel.as_deref();
        // The `data.pkl` torch reads, stored in the file: read as the
        // decode after the scan reads it (its storages under its folder's
        // `data/`), and kept for it.
        let keep = self.kept_plain.filter(|_| reachable && base.is_some());
        let read = match keep {
            Some(kept) => {
                let folder = record
                    .len()
                    .checked_sub("data.pkl".len())
                    .and_then(|at| record.get(..at))
                    .unwrap_or_default();
                let dir = format!("{folder}data/");
                kept.read_and_keep(
                    bytes,
                    (&record, &dir, self.zip_records),
                    self.limits,
                    cancel,
                )
            }
            None => crate::torch::plain::read(bytes, (&record, "", 0), self.limits, cancel)
                .map(|read| read.map(|plain| (plain.globals, plain.opcodes))),
        };
        let Ok(Some((globals, opcodes))) = read else {
            return false;
        };
        if !self.vm.count_opcodes(opcodes) {
            return false;
        }
        let globals = globals
            .into_iter()
            .map(|g| GlobalUse {
                class: classify(&g.module, &g.name),
                usage: if g.called {
                    Usage::Called
                } else {
                    Usage::Referenced
                },
                offset: g.offset,
                module: g.module,
                name: g.name,
            })
            .collect();
        self.report.pickles.push(ScannedPickle {
            source: source.clone(),
            reachable,
            base,
            globals,
            complete: true,
            error: None,
        });
        true
    }

    /// Run one pickle of `data` from `start`; record it; return its end and
    /// whether its value is the legacy magic number.
    fn run(
        &mut self,
        data: &[u8],
        start: usize,
        source: PickleSource,
        reachable: bool,
        depth: usize,
        base: Option<u64>,
    ) -> Option<(usize, bool)> {
        if self.report.pickles.len() >= MAX_PICKLES {
            if self.report.pickles.len() == MAX_PICKLES {
                self.report.notes.push(format!(
                    "more than {MAX_PICKLES} pickles: the rest were not scanned"
                ));
            }
            return None;
        }
        let mut heap = Heap::new(self.limits);
        let mut recorder = Recorder::default();
        let mut outcome = self.vm.run(&mut heap, &mut recorder, data, start);
        // Keys of dicts and members of sets are hashed (and compared) as
        // they are put in: their classes' `__hash__` and `__eq__` run.
        let hashed = heap.hashed_objects();
        let hashing = heap
            .charge_work(hashed.len() as u64)
            .and_then(|()| recorder.used_unargued(&heap, &hashed));
        if let Err(e) = hashing {
            if outcome.is_ok() {
                outcome = Err(e);
            }
        }
        let iterated = std::mem::take(&mut self.result_iterated);
        if std::mem::take(&mut self.result_used) {
            // torch compares it with a number, or iterates it: an object
            // the pickle made runs its methods.
            if let Ok(out) = &outcome {
                // Iterated, the value and its members run their methods:
                // a library's object among them is a call into the
                // library (a CSV reader's rows read as storage keys).
                let mut consumed = vec![out.value];
                if let Some(seq) = heap.sequence(out.value).filter(|_| iterated) {
                    consumed.extend_from_slice(seq);
                }
                if iterated {
                    recorder.library_methods_run(&consumed);
                }
                if let Err(e) = heap
                    .charge_work(consumed.len() as u64)
                    .and_then(|()| recorder.used(&heap, &[out.value]))
                {
                    outcome = Err(e);
                }
            }
        }
        // What the load does not return is freed when it ends (the
        // unpickler's stack and memo go): finalizers run.
        // What it returns is freed later, when the caller lets it go: the
        // same finalizers run then, with what the objects hold (a
        // `functools.partial` or bound method among it is called; a bare
        // function, given no argument, is judged by what it is).
        if let Ok(out) = &outcome {
            let freed = recorder
                .unreturned(&heap, out.value)
                .and_then(|(freed, kept)| {
                    recorder.used(&heap, &freed)?;
                    recorder.finalized(&heap, &kept)
                });
            if let Err(e) = freed {
                outcome = Err(e);
            }
        }
        recorder.settle_lookups();
        recorder.settle_effects();
        let parent = source.to_string();
        if recorder.overflowed.get() {
            self.report.ambiguities.push(Ambiguity {
                record: parent.clone(),
                offset: start as u64,
                what: format!(
                    "an object holds more than the scanner follows ({WALK_VISITS} values from \
                     one object): what the rest calls is not known"
                ),
            });
        }
        if self.vm.frame_crossed {
            // CPython's C unpickler and its Python one read different
            // opcodes here: what runs is not what the bytes show.
            self.report.ambiguities.push(Ambiguity {
                record: parent.clone(),
                offset: outcome
                    .as_ref()
                    .err()
                    .and_then(|e| e.offset())
                    .unwrap_or(start as u64),
                what: "an opcode reads past the end of its FRAME".into(),
            });
        }
        if self.vm.frame_short {
            // Read on, fail closed: what the frame holds is recorded.
            self.report.ambiguities.push(Ambiguity {
                record: parent.clone(),
                offset: start as u64,
                what: "a FRAME declares more bytes than are left: Python's C unpickler stops there, its pure-Python unpickler runs what the frame holds".into(),
            });
        }
        let result = match &outcome {
            // The magic number, or an object a call or NEWOBJ made, which
            // torch's `!=` may find equal (`int("1950a86a...", 16)`, a
            // `Decimal`): torch reads on.
            Ok(out) => Some((
                out.end,
                heap.bigint(out.value) == Some(&MAGIC[..])
                    || matches!(heap.get(out.value), Some(Obj::Object(_))),
            )),
            Err(e) => {
                // Only a pickle read from the file's first bytes (a
                // stream) is read over a prefix that may be too short.
                self.ran_out |= base == Some(0) && crate::ranged::ran_out(e);
                None
            }
        };
        if depth < MAX_NESTING {
            for (index, bytes) in heap.byte_strings().enumerate() {
                if looks_like_pickle(bytes) {
                    self.nested
                        .push((parent.clone(), index, depth + 1, bytes.to_vec()));
                }
            }
        }
        // Bytes torch never unpickles that do not parse as a pickle and
        // name nothing (tensor data after a legacy stream) are not pickles.
        if !reachable && outcome.is_err() && recorder.globals.is_empty() {
            return result;
        }
        self.report.pickles.push(ScannedPickle {
            source,
            reachable,
            base,
            globals: recorder.globals,
            complete: outcome.is_ok(),
            error: outcome.err().map(|e| e.to_string()),
        });
        result
    }

    /// The legacy path: torch unpickles the first pickle, and the next four
    /// (protocol, sys_info, the object, the storage keys) only when the
    /// first is the magic number. Pickles after those, or after a first one
    /// that is not the magic number, are scanned too, as not reached.
    fn stream(&mut self, data: &[u8]) {
        let mut offset = 0;
        let mut reached = 1;
        for index in 0.. {
            let source = PickleSource::Stream {
                index,
                offset: offset as u64,
            };
            // The magic number, the protocol, sys_info and the storage keys
            // are torch's own data; the object (the fourth) is returned.
            self.result_used = index < reached && index != 3;
            self.result_iterated = index < reached && index == 4;
            let Some((end, magic)) = self.run(data, offset, source, index < reached, 0, Some(0))
            else {
                if index > 0 && index < reached && !self.ran_out {
                    // torch unpickles this one and reads on; the scanner
                    // cannot follow it past here.
                    self.report.ambiguities.push(Ambiguity {
                        record: PickleSource::Stream {
                            index,
                            offset: offset as u64,
                        }
                        .to_string(),
                        offset: offset as u64,
                        what: "torch unpickles this pickle of the stream, and the scanner \
                               could not read it to its end: what follows is not scanned"
                            .into(),
                    });
                }
                break;
            };
            if index == 0 && magic {
                reached = 5;
            }
            // A pickle of tensor data follows the storage keys in legacy
            // files: only what parses as a pickle from here is scanned.
            if end <= offset || end >= data.len() {
                break;
            }
            offset = end;
        }
    }

    /// A file torch reads as a zip (it starts with a local header). Zip
    /// readers find the directory in different ways: torch's (miniz) takes
    /// every recorded offset from byte 0; Python's zipfile and most others
    /// shift them by where the directory really is; bytes holding two
    /// archives end to end also hold the first one whole. Each archive
    /// these find is scanned once, only the one torch reads as reachable,
    /// and two readable archives in one file are an ambiguity.
    fn zip_file(&mut self, data: FileView<'_>) {
        let limits = self.limits;
        let shifted = Archive::parse_with(data, self.headers, limits, Rules::Tolerant);
        let Some(prefix) = shifted
            .as_ref()
            .ok()
            .map(Archive::prefix_len)
            .filter(|&p| p > 0)
        else {
            // Offsets counted from byte 0 (or no directory at all): torch's
            // reader and the others agree. Entries that start past byte 0
            // may follow another archive.
            let after = shifted.as_ref().is_ok_and(|a| a.first_local() > 0);
            let mut seen = HashSet::new();
            let first = self.zip_archive(data, shifted, true, &mut seen);
            if after {
                self.other_archive(data, first, &mut seen);
            }
            return;
        };
        let mut seen = HashSet::new();
        let torch = Archive::parse_as_torch(data, self.headers, limits);
        let torch_start = torch.as_ref().ok().map(Archive::cd_start);
        if let Err(e) = &torch {
            self.report.notes.push(format!(
                "torch's reader counts the directory's offsets from the first byte and finds no archive there ({e}): torch.load fails"
            ));
        }
        if torch.is_ok() {
            self.zip_archive(data, torch, true, &mut seen);
        }
        if let Ok(archive) = shifted {
            let start = archive.cd_start();
            if torch_start != Some(start) {
                self.report.ambiguities.push(Ambiguity {
                    record: "zip directory".into(),
                    offset: start,
                    what: format!(
                        "zip: the directory found from the end records offsets {prefix} bytes before it: readers that shift them (Python's zipfile) read the archive whose directory is at {start:#x}; torch reads {}",
                        match torch_start {
                            Some(t) => format!("the one whose directory is at {t:#x}"),
                            None => "none".into(),
                        }
                    ),
                });
                self.zip_archive(data, Ok(archive), false, &mut seen);
            }
        }
        self.other_archive(data, torch_start, &mut seen);
    }

    /// Bytes that begin with a whole archive and go on past its end: the
    /// first archive, scanned unless it is one already scanned (whose
    /// directory starts at `scanned`), and reported as a second archive.
    fn other_archive(&mut self, data: FileView<'_>, scanned: Option<u64>, seen: &mut HashSet<u64>) {
        // Found by searching all the bytes (of a file read by ranges: all
        // fetched).
        let Some(data) = data.get(0..data.len()) else {
            return;
        };
        let Some(end) = zip::first_archive_end(data).filter(|&end| end < data.len()) else {
            return;
        };
        let Some(first) = data.get(..end) else {
            return;
        };
        let Ok(archive) = Archive::parse_with(first, Headers::Map, self.limits, Rules::Tolerant)
        else {
            return;
        };
        self.report.ambiguities.push(Ambiguity {
            record: "zip directory".into(),
            offset: end as u64,
            what: format!(
                "zip: a second archive follows the one that ends at {end:#x}: readers that take the first and readers that take the last read different archives"
            ),
        });
        if scanned != Some(archive.cd_start()) {
            self.zip_archive(first.into(), Ok(archive), false, seen);
        }
    }

    /// A zip behind a pickle stream: torch never reads it.
    fn zip(&mut self, data: FileView<'_>, reachable: bool, seen: &mut HashSet<u64>) {
        let archive = Archive::parse_with(data, Headers::Map, self.limits, Rules::Tolerant);
        self.zip_archive(data, archive, reachable, seen);
    }

    /// One archive: with `reachable`, the `data.pkl` torch would read (and
    /// `constants.pkl` of a TorchScript archive); every other `.pkl` entry
    /// as not reachable. Entries whose data starts at an offset in `seen`
    /// were scanned already (by another reading of the same bytes); the
    /// others are added to it. Returns where the directory starts.
    fn zip_archive(
        &mut self,
        data: FileView<'_>,
        archive: Result<Archive<'_>>,
        reachable: bool,
        seen: &mut HashSet<u64>,
    ) -> Option<u64> {
        let archive = match archive {
            Ok(a) => a,
            Err(e) => {
                self.report.notes.push(format!(
                    "zip directory unreadable ({e}); torch cannot read it either"
                ));
                // Read by ranges, the directory may need bytes not
                // fetched yet: search every byte only once it reads.
                if !data.incomplete() {
                    if let Some(all) = data.get(0..data.len()) {
                        self.local_headers(all);
                    }
                }
                return None;
            }
        };
        // What a strict zip reader refuses and torch's tolerates: duplicate
        // names, local and central names that differ, encryption flags,
        // overlaps. Entries without a local header are left out: torch
        // fails on one only if it reads it.
        if reachable {
            for (what, offset) in archive.disagreements() {
                self.report.ambiguities.push(Ambiguity {
                    record: "zip directory".into(),
                    offset: *offset,
                    what: format!("zip: {what}: zip readers disagree on this archive"),
                });
            }
        }
        for (name, offset) in archive.broken_locals() {
            self.report.notes.push(format!(
                "{name}: no local header at {offset:#x}; torch fails on this entry only if it reads it"
            ));
        }
        // torch's reader takes the folder of the first entry as the archive
        // name, and looks records up under it.
        let prefix = archive
            .entries()
            .first()
            .and_then(|e| e.name.split_once('/'))
            .map(|(p, _)| p.to_owned());
        // torch's reader refuses an entry marked encrypted.
        let reached: Vec<String> = match &prefix {
            Some(p) if reachable => ["data.pkl", "constants.pkl"]
                .iter()
                .map(|r| format!("{p}/{r}"))
                .filter(|n| archive.get(n).is_some_and(|e| !e.encrypted))
                .collect(),
            _ => Vec::new(),
        };
        for e in archive.entries().iter().filter(|e| e.encrypted) {
            self.report.notes.push(format!(
                "{}: marked encrypted; torch refuses to read it",
                e.name
            ));
        }
        if reachable && reached.is_empty() {
            self.report
                .notes
                .push("no data.pkl where torch looks for it".into());
        }
        let mut budget = self.limits.max_decompressed_bytes;
        // The reached records, each the last of its duplicates (what
        // `get` finds); then every other `.pkl` entry.
        let mut order: Vec<(&zip::Entry<'_>, bool)> = reached
            .iter()
            .filter_map(|n| archive.get(n))
            .map(|e| (e, true))
            .collect();
        for e in archive.entries() {
            let is_reached = order
                .iter()
                .any(|(r, _)| std::ptr::eq(*r, e) || r.data_start == e.data_start);
            if pickle_name(e.name) && !is_reached {
                order.push((e, false));
            }
        }
        self.zip_records = archive.entries().len();
        for (entry, reach) in order {
            if !seen.insert(entry.data_start) {
                continue;
            }
            let bytes = match record(data, entry, self.limits, &mut budget) {
                Ok(b) => b,
                Err(e) => {
                    self.report
                        .notes
                        .push(format!("{}: cannot be read ({e})", entry.name));
                    continue;
                }
            };
            // torch does not check CRCs; Python's zipfile refuses the entry.
            if let Err(e) = zip::check_crc(&bytes, entry) {
                self.report.ambiguities.push(Ambiguity {
                    record: entry.name.to_owned(),
                    offset: entry.data_start,
                    what: format!("{e}; torch reads it anyway"),
                });
            }
            self.entry_pickle(&bytes, entry, reach);
        }
        // A TorchScript archive (it has `constants.pkl`): torch.load hands it
        // to torch.jit.load, which compiles the archive's `code/` and runs
        // it (a scripted `__setstate__` on load). Its ops are TorchScript's,
        // not Python's; those that reach the file system, `from_file` (it
        // creates the file it maps when asked to share) and `save` (it
        // writes one), are reported as calls of `torch.from_file` and
        // `torch.save` in that record.
        let torchscript = prefix
            .as_ref()
            .is_some_and(|p| reachable && archive.get(&format!("{p}/constants.pkl")).is_some());
        if torchscript {
            self.torchscript_code(data, &archive, &mut budget);
        }
        self.hidden_locals(data, &archive, seen, &mut budget);
        Some(archive.cd_start())
    }

    /// The `code/` records of a TorchScript archive, searched for the ops
    /// that reach outside the process (`from_file`, `save`) and the ops
    /// of namespaces other than the computing ones; and the code a load
    /// runs (every `__setstate__` and what it names), for its output
    /// (`print`, `warn`). torch finds records by name without regard to
    /// case (`CODE/__torch__.PY` is the code too).
    fn torchscript_code(&mut self, data: FileView<'_>, archive: &Archive<'_>, budget: &mut u64) {
        let mut records: Vec<(&str, Cow<'_, [u8]>)> = Vec::new();
        for entry in archive.entries() {
            let name = entry.name.to_ascii_lowercase();
            let code = name.contains("/code/") && name.ends_with(".py");
            if !code || entry.encrypted {
                continue;
            }
            match record(data, entry, self.limits, budget) {
                Ok(bytes) => records.push((entry.name, bytes)),
                Err(_) => self.report.notes.push(format!(
                    "{}: TorchScript code that cannot be read",
                    entry.name
                )),
            }
        }
        let codes: Vec<&[u8]> = records.iter().map(|(_, bytes)| bytes.as_ref()).collect();
        for ((name, _), calls) in records.iter().zip(torchscript::calls(&codes)) {
            let globals: Vec<GlobalUse> = calls
                .into_iter()
                .map(|c| GlobalUse {
                    module: c.module.into(),
                    name: c.name,
                    offset: c.offset as u64,
                    usage: Usage::Called,
                    class: c.class,
                })
                .collect();
            if globals.is_empty() {
                continue;
            }
            self.report.pickles.push(ScannedPickle {
                source: PickleSource::Entry((*name).to_owned()),
                reachable: true,
                base: None,
                globals,
                complete: true,
                error: None,
            });
        }
    }

    /// Local headers the central directory does not list (a shadow
    /// `data.pkl` between entries): torch goes by the directory and never
    /// reads them; readers that walk local headers (streaming unzip) do.
    /// Each is an ambiguity at its offset, and a pickle among them is
    /// scanned as not read by torch.load.
    fn hidden_locals(
        &mut self,
        data: FileView<'_>,
        archive: &Archive<'_>,
        seen: &mut HashSet<u64>,
        budget: &mut u64,
    ) {
        let (hidden, more) = archive.hidden_locals(data, MAX_PICKLES, self.headers);
        if more {
            self.report.notes.push(format!(
                "more than {MAX_PICKLES} local headers the directory does not list: the rest were not looked at"
            ));
        }
        for h in hidden {
            let entry = &h.entry;
            self.report.ambiguities.push(Ambiguity {
                record: entry.name.to_owned(),
                offset: entry.local,
                what: "zip: a local header the central directory does not list: torch does not read it; readers that walk local headers do".into(),
            });
            let pickle = pickle_name(entry.name);
            if !pickle || !seen.insert(entry.data_start) {
                continue;
            }
            if h.sizes_unknown {
                // Its end is in a data descriptor: read as far as a pickle
                // goes from its start (fail closed).
                if let Ok(start) = usize::try_from(entry.data_start) {
                    if let Some(all) = data.get(0..data.len()).filter(|_| start < data.len()) {
                        let source = PickleSource::Entry(entry.name.to_owned());
                        self.run(all, start, source, false, 0, Some(0));
                    }
                }
                continue;
            }
            let bytes = match record(data, entry, self.limits, budget) {
                Ok(b) => b,
                Err(e) => {
                    self.report
                        .notes
                        .push(format!("{}: cannot be read ({e})", entry.name));
                    continue;
                }
            };
            self.entry_pickle(&bytes, entry, false);
        }
    }

    /// A zip whose directory torch cannot read: every local header that
    /// names a `.pkl` entry, scanned as not reachable (fail closed).
    fn local_headers(&mut self, data: &[u8]) {
        let mut at = 0;
        while let Some(found) = find(crate::bytes::after(data, at), b"PK\x03\x04") {
            let header = at + found;
            at = header + 4;
            let Some(fixed) = data.get(header..header + 30) else {
                break;
            };
            let le16 = |i: usize| {
                fixed
                    .get(i..i + 2)
                    .and_then(|b| <[u8; 2]>::try_from(b).ok())
                    .map_or(0, |b| usize::from(u16::from_le_bytes(b)))
            };
            let (method, name_len, extra_len) = (le16(8), le16(26), le16(28));
            let name_start = header + 30;
            let Some(name) = data.get(name_start..name_start + name_len) else {
                break;
            };
            if method != 0 || !name.ends_with(b".pkl") {
                continue;
            }
            let start = name_start + name_len + extra_len;
            if start < data.len() {
                let source = PickleSource::Entry(String::from_utf8_lossy(name).into_owned());
                self.run(data, start, source, false, 0, Some(0));
            }
        }
    }

    /// The pre-1.0 tar layout: torch unpickles `sys_info`, the first
    /// records of `storages` and `tensors`, and `pickle`.
    fn tar(&mut self, data: &[u8]) {
        let mut stopped = None;
        let members = tar_members(data, &mut self.report.notes, &mut stopped);
        // A header the listing cannot read (a number field, a member past
        // the end): tarfile would stop there too, but what follows is not
        // looked at, and a reader that reads the field otherwise reads on.
        if let Some((offset, what)) = stopped {
            self.report.ambiguities.push(Ambiguity {
                record: "tar".into(),
                offset: offset as u64,
                what: format!("tar: {what}: the members after it are not read"),
            });
        }
        let Some(members) = members else {
            return;
        };
        // torch opens the tar with Python's tarfile, which names a member
        // by its PAX `path` record, a GNU long name or its ustar prefix, and
        // finds the last member of a name (torch 2.15: `tests/scan/t_tar_*`).
        let last_of = |name: &str| members.iter().rposition(|m| m.name == name);
        for (i, m) in members.iter().enumerate() {
            let read = matches!(
                m.name.as_str(),
                "sys_info" | "pickle" | "storages" | "tensors"
            );
            if !read {
                continue;
            }
            let reachable = last_of(&m.name) == Some(i);
            if !reachable {
                self.report.ambiguities.push(Ambiguity {
                    record: m.name.clone(),
                    offset: m.header as u64,
                    what: format!(
                        "tar: two members named {:?}: torch reads the last, other readers may read this one",
                        m.name
                    ),
                });
            }
            if m.sparse {
                self.report.ambiguities.push(Ambiguity {
                    record: m.name.clone(),
                    offset: m.header as u64,
                    what: "tar: a sparse member: tarfile reads it with its holes filled with \
                           zeros, not as its bytes lie"
                        .into(),
                });
            }
            if let Some(header_name) = &m.renamed {
                self.report.ambiguities.push(Ambiguity {
                    record: m.name.clone(),
                    offset: m.header as u64,
                    what: format!(
                        "tar: the member's header names it {header_name:?}, and a PAX or GNU \
                         long-name record {:?}, which torch reads",
                        m.name
                    ),
                });
            }
            // torch extracts `storages` and `tensors` to a folder of its
            // own (tarfile's `extract`, no filter) and reads them from
            // there: a link among them is made on disk, a hard link to
            // the file its target names (resolved from that folder, so
            // `../` and absolute paths reach any file), whose mode, time
            // and owner are then set from the member's header; a
            // symbolic link makes torch unpickle whatever it points to.
            // Whatever member of the archive bears the target's name.
            if let (Some(link), "storages" | "tensors") = (&m.link, m.name.as_str()) {
                self.report.effects.push(Effect {
                    record: m.name.clone(),
                    offset: m.header as u64,
                    danger: Danger::FileSystem,
                    what: format!(
                        "tar: torch extracts this member, a link to {link:?}: it links that \
                         path into its folder and sets the header's mode, time and owner \
                         on it (a symbolic link is unpickled from wherever it points)"
                    ),
                });
            }
            // A link: tarfile reads the member it links to (the last of
            // that name, links followed a few times); one that leads out
            // of the archive reads whatever is there when the file is
            // loaded (`/proc/self/fd/3`: the tar itself, from byte 0).
            let mut target = m;
            let mut hops = 0;
            while let Some(link) = &target.link {
                let found = members
                    .iter()
                    .rposition(|x| &x.name == link && !std::ptr::eq(x, target));
                match found.and_then(|j| members.get(j)).filter(|_| hops < 8) {
                    Some(next) => {
                        target = next;
                        hops += 1;
                    }
                    _ => break,
                }
            }
            if let Some(link) = &target.link {
                self.report.ambiguities.push(Ambiguity {
                    record: m.name.clone(),
                    offset: m.header as u64,
                    what: format!(
                        "tar: the member is a link to {link:?}, outside the archive: torch reads \
                         whatever is there when the file is loaded"
                    ),
                });
                continue;
            }
            let Some(member) = data.get(target.start..target.start.saturating_add(target.size))
            else {
                continue;
            };
            let source = || PickleSource::TarMember(m.name.clone());
            let base = Some(target.start as u64);
            if matches!(m.name.as_str(), "sys_info" | "pickle") {
                self.run(member, 0, source(), reachable, 0, base);
            } else {
                self.tar_records(member, &m.name, reachable, base);
            }
        }
    }

    /// The pickles of a tar layout's `storages` or `tensors` member, as
    /// torch reads them: a count, then per record a pickle of its
    /// arguments followed by raw bytes (a storage: an int64 element count
    /// and the elements, sized by the storage class the arguments name; a
    /// tensor: an int32 rank, 4 bytes, the sizes and strides and an int64
    /// offset), and after the storages a pickle of their views. The raw
    /// bytes are stepped over, so a pickle behind them is read as torch
    /// reads it; where they cannot be (a storage class of unknown element
    /// size, a length past the member), that is an ambiguity and the rest
    /// is read from where pickles parse.
    fn tar_records(&mut self, member: &[u8], name: &str, reachable: bool, base: Option<u64>) {
        let source = || PickleSource::TarMember(name.to_owned());
        let mut offset = 0;
        while self.report.pickles.len() < MAX_PICKLES {
            let scanned = self.report.pickles.len();
            // Every pickle here is torch's own data: the count goes to
            // `range` (its `__index__`), a record's arguments are unpacked.
            self.result_used = reachable;
            self.result_iterated = reachable;
            let Some((end, _)) = self.run(member, offset, source(), reachable, 0, base) else {
                break;
            };
            if end <= offset || end >= member.len() {
                break;
            }
            // What the pickle just read names: a storage or a tensor
            // record's arguments are followed by raw bytes.
            let named = |suffix: &str| {
                self.report
                    .pickles
                    .get(scanned)
                    .into_iter()
                    .flat_map(|p| p.globals.iter())
                    .find(|g| {
                        (g.module == "torch" || g.module == "torch.cuda")
                            && g.name.ends_with(suffix)
                    })
                    .map(|g| g.name.clone())
            };
            let raw = match name {
                "storages" => named("Storage").map(|class| {
                    let count = read_i64(member, end);
                    storage_element_size(&class)
                        .zip(count)
                        .and_then(|(size, n)| u64::try_from(n).ok()?.checked_mul(size))
                        .and_then(|n| n.checked_add(8))
                }),
                _ => named("Tensor").map(|_| {
                    let rank = read_i32(member, end).and_then(|r| u64::try_from(r).ok());
                    rank.and_then(|r| r.checked_mul(16)?.checked_add(16))
                }),
            };
            offset = match raw {
                None => end,
                Some(Some(n)) => match usize::try_from(n).ok().and_then(|n| end.checked_add(n)) {
                    Some(next) if next <= member.len() => next,
                    _ => {
                        self.tar_raw_ambiguity(name, end, base);
                        end
                    }
                },
                Some(None) => {
                    self.tar_raw_ambiguity(name, end, base);
                    end
                }
            };
            if offset >= member.len() {
                break;
            }
        }
    }

    fn tar_raw_ambiguity(&mut self, name: &str, at: usize, base: Option<u64>) {
        self.report.ambiguities.push(Ambiguity {
            record: name.to_owned(),
            offset: base.unwrap_or(0).saturating_add(at as u64),
            what: format!(
                "tar: the raw bytes after a record of {name:?} cannot be stepped over as torch \
                 does (unknown element size, or a length past the member): what torch unpickles \
                 after them is not known"
            ),
        });
    }

    /// Pickles found as bytes values, breadth first, to a bounded depth.
    fn nested_pickles(&mut self) {
        let mut next = 0;
        while next < self.nested.len() && self.report.pickles.len() < MAX_PICKLES {
            let Some(slot) = self.nested.get_mut(next) else {
                break;
            };
            let (parent, index, depth, bytes) = std::mem::take(slot);
            next += 1;
            let source = PickleSource::Nested { parent, index };
            self.run(&bytes, 0, source, false, depth, None);
        }
    }
}

/// Bytes per element of a legacy storage class (`FloatStorage`...).
fn storage_element_size(class: &str) -> Option<u64> {
    Some(match class.strip_suffix("Storage")? {
        "Double" | "Long" | "ComplexFloat" => 8,
        "Float" | "Int" | "QInt32" => 4,
        "Half" | "BFloat16" | "Short" => 2,
        "Char" | "Byte" | "Bool" | "QInt8" | "QUInt8" | "QUInt4x2" | "QUInt2x4" => 1,
        "ComplexDouble" => 16,
        _ => return None,
    })
}

fn read_i64(data: &[u8], at: usize) -> Option<i64> {
    let bytes: [u8; 8] = data.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(i64::from_le_bytes(bytes))
}

fn read_i32(data: &[u8], at: usize) -> Option<i32> {
    let bytes: [u8; 4] = data.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(i32::from_le_bytes(bytes))
}

/// The bytes of a zip record, inflated if need be; the CRC is not checked
/// (torch does not check it either).
fn record<'d>(
    data: FileView<'d>,
    entry: &zip::Entry<'_>,
    limits: &Limits,
    budget: &mut u64,
) -> Result<Cow<'d, [u8]>> {
    if entry.size > limits.max_pickle_bytes {
        return Err(crate::error::Error::limit(
            "max_pickle_bytes",
            limits.max_pickle_bytes,
        ));
    }
    match entry.method {
        Method::Stored => data
            .slice(entry.data_start, entry.compressed_size)
            .map(Cow::Borrowed)
            .ok_or_else(|| {
                crate::error::Error::new(
                    crate::error::ErrorKind::Zip,
                    "record lies outside the file",
                )
            }),
        Method::Deflated => zip::inflate(data, entry, budget).map(Cow::Owned),
    }
}

/// Where the pickle of a numpy object array starts in a `.npy` file: after
/// the magic, the version and the header, when the header's dtype is
/// `object` (`'|O'`).
fn npy_pickle(data: &[u8]) -> Option<usize> {
    let rest = data.strip_prefix(b"\x93NUMPY")?;
    let le = |at: usize, n: usize| -> Option<usize> {
        let bytes = rest.get(at..at.checked_add(n)?)?;
        Some(
            bytes
                .iter()
                .rev()
                .fold(0usize, |acc, &b| (acc << 8) | usize::from(b)),
        )
    };
    // Version 1: a 2-byte header length; 2 and 3: 4 bytes.
    let (len, header_start): (usize, usize) = match rest.first()? {
        1 => (le(2, 2)?, 10),
        2 | 3 => (le(2, 4)?, 12),
        _ => return None,
    };
    let end = header_start.checked_add(len)?;
    find(data.get(header_start..end)?, b"'|O'")?;
    Some(end)
}

/// A pickle starts with PROTO 2 to 5 (protocols 0 and 1 have no header to
/// tell them from other bytes).
/// Whether an entry's name says it holds a pickle (`.pkl`) or a numpy
/// array that may (`.npy`), letter case aside (torch's reader finds names
/// so).
fn pickle_name(name: &str) -> bool {
    let tail = name.len().checked_sub(4).and_then(|at| name.get(at..));
    tail.is_some_and(|t| t.eq_ignore_ascii_case(".pkl") || t.eq_ignore_ascii_case(".npy"))
}

fn looks_like_pickle(bytes: &[u8]) -> bool {
    matches!(bytes, [0x80, 2..=5, ..]) && bytes.len() > 3
}

/// A regular member of a tar archive, as Python's tarfile names it.
struct TarMember {
    /// Its name: a PAX `path` record's, a GNU long name's, or the ustar
    /// prefix and name of its header.
    name: String,
    /// The header's own name when a PAX or GNU record gave another one.
    renamed: Option<String>,
    /// Offset of its header, and of its data and the data's length.
    header: usize,
    start: usize,
    size: usize,
    /// For a hard link (`1`) or a symbolic link (`2`): the name it links
    /// to (its header's, a PAX `linkpath` record's or a GNU long link
    /// name's); Python's tarfile reads the target's data for it.
    link: Option<String>,
    /// A sparse member (GNU type `S`, or PAX `GNU.sparse` records):
    /// tarfile reads it with its holes filled with zeros, not as its
    /// bytes lie.
    sparse: bool,
}

/// Most members of a tar archive looked at.
const MAX_TAR_MEMBERS: usize = 4096;

/// The regular members of the tar archive `data`, named and sized as
/// Python's tarfile names and sizes them (PAX `path` and `size` records,
/// global ones too, GNU long names, ustar prefixes), in order; what cannot
/// be read is noted and ends the list. `None` when nothing is.
fn tar_members(
    data: &[u8],
    notes: &mut Vec<String>,
    stopped: &mut Option<(usize, &'static str)>,
) -> Option<Vec<TarMember>> {
    let mut members = Vec::new();
    let mut global: Vec<(String, String)> = Vec::new();
    let mut pax: Vec<(String, String)> = Vec::new();
    let mut long_name: Option<String> = None;
    let mut long_link: Option<String> = None;
    let mut at = 0usize;
    let text = |b: &[u8]| -> String {
        let b = crate::bytes::head(b, b.iter().position(|&c| c == 0).unwrap_or(b.len()));
        String::from_utf8_lossy(b).into_owned()
    };
    while let Some(header) = data.get(at..at.saturating_add(512)) {
        if header.iter().all(|&b| b == 0) || members.len() >= MAX_TAR_MEMBERS {
            break;
        }
        // The size field as `tarfile.nti` reads it (base-256, `0o`,
        // underscores, text cut at a NUL).
        let Some(header_size) = header
            .get(124..136)
            .and_then(crate::container::tar_number)
            .and_then(|s| usize::try_from(s).ok())
        else {
            notes.push("tar header with a bad size".into());
            *stopped = Some((at, "a header with a size field tarfile may read otherwise"));
            break;
        };
        let kind = header.get(156).copied().unwrap_or(0);
        let find = |records: &[(String, String)], key: &str| {
            records
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        // A PAX size applies to the member it describes, read as
        // Python's `int` reads it (0 when it cannot be). tarfile reads that
        // many bytes; it steps to the next header by it only when the
        // member has PAX records of its own (which carry the global ones
        // with them), else by the header's size.
        let (size, step) = if matches!(kind, b'x' | b'g' | b'L' | b'K') {
            (header_size, header_size)
        } else {
            let pax_size = find(&pax, "size")
                .or_else(|| find(&global, "size"))
                .map(|v| {
                    crate::container::python_int(&v, 10)
                        .and_then(|n| usize::try_from(n).ok())
                        .unwrap_or(0)
                });
            match pax_size {
                Some(n) if !pax.is_empty() => (n, n),
                Some(n) => (n, header_size),
                None => (header_size, header_size),
            }
        };
        let start = at.saturating_add(512);
        if data.get(start..start.saturating_add(size)).is_none() {
            notes.push("tar member runs past the end".into());
            *stopped = Some((at, "a member runs past the end of the file"));
            break;
        }
        // tarfile reads a PAX or GNU long-name header's data in whole
        // blocks and parses all of it: what lies between the declared
        // size and the block's end counts too.
        let padded = start.saturating_add(size.div_ceil(512).saturating_mul(512));
        let body = data.get(start..padded.min(data.len())).unwrap_or_default();
        match kind {
            b'x' | b'g' => {
                let records = pax_records(body);
                if kind == b'x' {
                    pax.extend(records);
                } else {
                    global.extend(records);
                }
            }
            b'L' => long_name = Some(text(body)),
            b'K' => long_link = Some(text(body)),
            _ => {
                let own = {
                    let name = text(header.get(..100).unwrap_or_default());
                    let ustar = header.get(257..262) == Some(b"ustar".as_slice());
                    let prefix = text(header.get(345..500).unwrap_or_default());
                    if ustar && !prefix.is_empty() {
                        format!("{prefix}/{name}")
                    } else {
                        name
                    }
                };
                let given = find(&pax, "path")
                    .or_else(|| long_name.take())
                    .or_else(|| find(&global, "path"));
                let renamed = given.as_ref().filter(|g| **g != own).map(|_| own.clone());
                let sparse = kind == b'S'
                    || pax
                        .iter()
                        .chain(&global)
                        .any(|(k, _)| k.starts_with("GNU.sparse"));
                let link = matches!(kind, b'1' | b'2').then(|| {
                    find(&pax, "linkpath")
                        .or_else(|| long_link.take())
                        .or_else(|| find(&global, "linkpath"))
                        .unwrap_or_else(|| text(header.get(157..257).unwrap_or_default()))
                });
                // Links have no data of their own.
                let size = if link.is_some() { 0 } else { size };
                members.push(TarMember {
                    name: given.unwrap_or(own),
                    renamed,
                    header: at,
                    start,
                    size,
                    sparse,
                    link: link.map(|target| {
                        if kind == b'2' {
                            symlink_target(
                                &name_dir(&text(header.get(..100).unwrap_or_default())),
                                &target,
                            )
                        } else {
                            target
                        }
                    }),
                });
                pax.clear();
                long_name = None;
                long_link = None;
            }
        }
        at = start.saturating_add(step.div_ceil(512).saturating_mul(512));
    }
    (!members.is_empty()).then_some(members)
}

/// The folder part of a member's name (`a/b` of `a/b/c`; empty for `c`).
fn name_dir(name: &str) -> String {
    name.rsplit_once('/')
        .map_or_else(String::new, |(d, _)| d.to_owned())
}

/// Where a symbolic link in folder `dir` points, as tarfile finds its
/// target among the members: relative to the link's folder, normalized
/// (`.` and `..` resolved). An absolute target stays as it is (it is
/// outside the archive).
fn symlink_target(dir: &str, target: &str) -> String {
    if target.starts_with('/') {
        return target.to_owned();
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in dir.split('/').chain(target.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// The `key=value` records of a PAX extended header: each `LEN key=value\n`,
/// LEN counting the whole record; a malformed one ends the list.
fn pax_records(body: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < body.len() && out.len() < 256 {
        let rest = crate::bytes::after(body, at);
        let Some(space) = rest.iter().position(|&b| b == b' ') else {
            break;
        };
        let Some(len) = std::str::from_utf8(crate::bytes::head(rest, space))
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n > space + 1)
        else {
            break;
        };
        let Some(record) = rest.get(space + 1..len) else {
            break;
        };
        // Python's tarfile (3.11) takes the value up to the record's last
        // byte, which it drops whatever it is (a newline when well formed).
        let record = crate::bytes::head(record, record.len().saturating_sub(1));
        if let Some(eq) = record.iter().position(|&b| b == b'=') {
            let key = String::from_utf8_lossy(crate::bytes::head(record, eq)).into_owned();
            let value = String::from_utf8_lossy(crate::bytes::after(record, eq + 1)).into_owned();
            out.push((key, value));
        }
        at += len;
    }
    out
}

/// What a value of the scanned pickle came from.
#[derive(Debug, Clone, Copy)]
enum Origin {
    /// The global at this index.
    Global(usize),
    /// An instance of (or a value returned by) the global at this index.
    Made(usize),
}

/// The recording interpreter: every value it creates is inert.
#[derive(Default)]
struct Recorder {
    globals: Vec<GlobalUse>,
    by_path: HashMap<(String, String), usize>,
    origins: HashMap<ObjId, Origin>,
    /// What calling a wrapper (a `functools.partial`) calls: the function
    /// it was made with, and any its BUILD state put in.
    wrapped: HashMap<ObjId, Vec<Value>>,
    /// The instance attributes BUILD set that the unpickler itself calls
    /// later (`append`, `extend`: see [`IMPLICIT_METHODS`]), by object.
    methods: HashMap<ObjId, Vec<(String, Value)>>,
    /// By global: whether every call of it so far had one constant for
    /// its arguments (a candidate for [`Usage::LookedUp`]).
    lookups: HashMap<usize, bool>,
    /// What an object was given besides its items: the arguments of its
    /// constructor (NEWOBJ, or the call of a class ptload does not know)
    /// and each BUILD's state. Walked (see [`Recorder::walk`]) when the
    /// unpickler calls a method of the object.
    held: HashMap<ObjId, Vec<Value>>,
    /// Objects a BUILD has filled (a second BUILD runs the class's code
    /// with what the first set).
    built: HashSet<ObjId>,
    /// `builtins.getattr` globals used only to take a named attribute of
    /// an instance the pickle made (a bound method: how torch pickles a
    /// module's hook).
    instance_getattr: HashSet<usize>,
    /// A walk of what an object holds stopped at its limit
    /// ([`WALK_VISITS`]) before it had seen everything: what the rest
    /// calls is not known, and the pickle is reported ambiguous (a file
    /// padded to hide a callable behind thousands of values fails closed).
    overflowed: std::cell::Cell<bool>,
    /// What each call's result was made from (its arguments), in call
    /// order: a result keeps what it was given alive (a parameter the
    /// state it set), for [`Recorder::unreturned`].
    given: Vec<(ObjId, Value)>,
    /// Bound methods: `getattr(instance, "name")` of an instance the
    /// pickle made, by value: the instance's class and the name. Calling
    /// one calls that method (see [`Recorder::calls`]).
    bound: HashMap<ObjId, (usize, String)>,
}

/// Arguments `(name, bases, namespace)`: what `type` and every metaclass
/// (`abc.ABCMeta`, typing's) make a class of. The namespace, when so.
fn class_args(heap: &Heap, items: &[Value]) -> Option<Value> {
    match items {
        [name, bases, namespace]
            if heap.str(*name).is_some()
                && heap.tuple(*bases).is_some()
                && heap.dict(*namespace).is_some() =>
        {
            Some(*namespace)
        }
        _ => None,
    }
}

/// How many levels below what is used [`Recorder::used`] follows: a
/// model's modules nest a dozen levels deep at most (a module and its
/// `_modules` dict are two).
const USED_DEPTH: usize = 32;

/// The methods of torch's base classes (`nn.Module`, `optim.Optimizer`,
/// torchmetrics' `Metric`) that their own code calls on an instance while
/// it is loaded or used, sorted: an instance attribute of one of these
/// names is what runs (torch 2.15's `dir()` of each, dunders aside).
const TORCH_BASE_METHODS: &[&str] = &[
    "OptimizerPostHook",
    "OptimizerPreHook",
    "_accelerator_graph_capture_health_check",
    "_apply",
    "_call_impl",
    "_copy_state_dict",
    "_cuda_graph_capture_health_check",
    "_filter_kwargs",
    "_forward_full_state_update",
    "_forward_reduce_state_update",
    "_get_backward_hooks",
    "_get_backward_pre_hooks",
    "_get_name",
    "_group_tensors_by_device_and_dtype",
    "_load_from_state_dict",
    "_maybe_warn_non_full_backward_hook",
    "_move_list_states_to_cpu",
    "_named_members",
    "_optimizer_step_code",
    "_patch_step_function",
    "_plot",
    "_process_value_according_to_param_policy",
    "_reduce_states",
    "_register_load_state_dict_pre_hook",
    "_register_state_dict_hook",
    "_replicate_for_data_parallel",
    "_save_to_state_dict",
    "_slow_forward",
    "_sync_dist",
    "_wrap_compute",
    "_wrap_update",
    "_wrapped_call_impl",
    "add_module",
    "add_param_group",
    "add_state",
    "apply",
    "bfloat16",
    "buffers",
    "children",
    "clone",
    "compile",
    "compute",
    "cpu",
    "cuda",
    "double",
    "eval",
    "extra_repr",
    "float",
    "forward",
    "get_buffer",
    "get_extra_state",
    "get_parameter",
    "get_submodule",
    "half",
    "ipu",
    "load_state_dict",
    "merge_state",
    "modules",
    "mtia",
    "named_buffers",
    "named_children",
    "named_modules",
    "named_parameters",
    "parameters",
    "persistent",
    "plot",
    "profile_hook_step",
    "register_backward_hook",
    "register_buffer",
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_full_backward_pre_hook",
    "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook",
    "register_module",
    "register_parameter",
    "register_state_dict_post_hook",
    "register_state_dict_pre_hook",
    "register_step_post_hook",
    "register_step_pre_hook",
    "requires_grad_",
    "reset",
    "set_dtype",
    "set_extra_state",
    "set_submodule",
    "share_memory",
    "state_dict",
    "step",
    "sync",
    "sync_context",
    "to",
    "to_empty",
    "train",
    "type",
    "unsync",
    "update",
    "xpu",
    "zero_grad",
];

/// Words of the names finalizers call on their instance (`close`,
/// `teardown`, `_tearDownAsyncioRunner`, `detach`, `cleanup`...).
const FINALIZER_WORDS: &[&str] = &[
    "close",
    "closed",
    "teardown",
    "tear",
    "cleanup",
    "clean",
    "detach",
    "release",
    "shutdown",
    "shut",
    "stop",
    "flush",
    "terminate",
    "kill",
    "join",
    "dispose",
    "finalize",
    "finalizer",
    "free",
    "exit",
    "destroy",
    "unregister",
    "disconnect",
    "del",
    "delete",
    "unlink",
    "remove",
    "dealloc",
    "finish",
    "end",
    "reset",
    "abort",
    "cancel",
    "quit",
];

/// How values given to code are used ([`Recorder::used_as`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    /// Anyhow: any method may run, with arguments the file chose.
    Any,
    /// Hashed, compared or converted: the methods that run are given
    /// nothing the file chose.
    Unargued,
    /// Iterated, measured or tested for truth (a rebuild's metadata, the
    /// `args` of `func(*args)`, a sparse tensor's parts, an object's
    /// state): as [`Use::Unargued`], but an object of a class the scanner
    /// does not know runs its own `__iter__`, `__len__`, `__bool__` or
    /// `items`, which may call a function it keeps as an attribute with
    /// what it holds (a filtering view's predicate, called on each key).
    Iterated,
}

/// How many levels below an object [`Recorder::walk`] looks: an item of
/// an attribute of an attribute (a policy object's attribute, a module's
/// `_modules` entry, a `UserDict`'s `data`).
const WALK_DEPTH: usize = 4;

/// Most values one walk visits (each charged as work).
const WALK_VISITS: usize = 4096;

/// Classes the scanner does not know whose `__setitem__`, `append` and
/// `extend` store what they are given and call nothing the object holds:
/// mappings of Lightning and transformers that checkpoints hold. (torch's
/// module containers are not: their methods call others, `add_module`,
/// `_key_to_attr`, that an instance attribute can replace.)
fn plain_container(module: &str, name: &str) -> bool {
    matches!(
        (module, name),
        ("collections", "UserDict" | "UserList")
            | (
                "pytorch_lightning.utilities.parsing"
                    | "lightning.pytorch.utilities.parsing"
                    | "lightning.fabric.utilities.data"
                    | "lightning_fabric.utilities.data",
                "AttributeDict"
            )
            | ("transformers.tokenization_utils_base", "BatchEncoding")
            | ("transformers.feature_extraction_utils", "BatchFeature")
    ) || (module.starts_with("transformers.") && super::model_output(name))
}

/// Whether `module.name` is one of torch's optimizers (`torch.optim.Adam`,
/// `torch.optim.sgd.SGD`, a subclass in torch's tree), whose
/// `__setstate__` calls methods of the values in its state. Not the
/// learning-rate schedulers and averaging helpers beside them.
fn torch_optimizer(module: &str, name: &str) -> bool {
    let sub = module.strip_prefix("torch.optim");
    matches!(sub, Some(rest) if rest.is_empty() || rest.starts_with('.'))
        && !matches!(module, "torch.optim.lr_scheduler" | "torch.optim.swa_utils")
        && !name.ends_with("LR")
        && !name.contains("Scheduler")
}

/// The methods the unpickler calls on an object the pickle made: APPEND
/// calls `append`, APPENDS `extend` (or `append`). Python looks them up on
/// the instance first, so a BUILD that set one chose what is called.
/// (SETITEM and SETITEMS go through the type's `__setitem__`, and BUILD's
/// `__setstate__` set by an earlier BUILD is a dunder, a gadget already.)
const IMPLICIT_METHODS: [&str; 2] = ["append", "extend"];

impl Recorder {
    /// A container in a legacy persistent id (`('module', container,
    /// source_file, source)` in a stream, `(container, source_file,
    /// source)` in a tar): when the other fields are all truthy, torch's
    /// `_check_container_source` reads the container's source with
    /// `inspect.getsource` and, when it differs from the saved one and
    /// `container.dump_patches` is true, writes a diff to
    /// `container.__name__ + ".patch"`. A class named there (what
    /// `torch.save` writes) is torch's own case; an object the pickle
    /// made (a module object with a chosen `__name__`, `__file__` and
    /// `dump_patches`) chooses the file written: the global that made it
    /// is dangerous.
    fn container_source(&mut self, heap: &Heap, items: &[Value]) {
        let (container, fields) = match items {
            [first, container, fields @ ..] if heap.text(*first) == Some("module") => {
                (*container, fields)
            }
            [container, fields @ ..] => (*container, fields),
            [] => return,
        };
        let truthy = |v: Value| match v {
            Value::None | Value::Bool(false) | Value::Int(0) => false,
            Value::Float(f) => f != 0.0,
            _ => heap.text(v) != Some(""),
        };
        if fields.is_empty() || !fields.iter().all(|&f| truthy(f)) {
            return;
        }
        if let Some(Origin::Made(g)) = self.origin(container) {
            if let Some(u) = self.globals.get_mut(g) {
                u.class = GlobalClass::Dangerous(Danger::FileSystem);
            }
        }
    }

    /// Once the pickle has run: the classes of a package (not the standard
    /// library, torch or numpy) called only with one constant are enum
    /// member lookups ([`Usage::LookedUp`]). Whether the same pickle
    /// instantiates another class of the package does not matter: a file
    /// can always add one, and a user's enum is often the only object of
    /// its package in a file (a training script's hyper-parameters).
    fn settle_lookups(&mut self) {
        // Not the code every loading machine has: any file can name a
        // class of that, and a capitalized name of it may be a class that
        // acts (`subprocess.Popen` re-exported by a module of CPython's
        // test suite, or of a library): its enums are listed by name.
        let own = |module: &str| !super::libraries::shipped(module);
        let class_like = |name: &str| {
            !name.contains('.') && name.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        };
        for (&g, &only) in &self.lookups {
            let Some(u) = self.globals.get_mut(g) else {
                continue;
            };
            if only
                && u.usage == Usage::Called
                && u.class == GlobalClass::Unknown
                && class_like(&u.name)
                && own(&u.module)
            {
                u.usage = Usage::LookedUp;
            }
        }
    }

    /// Once the pickle has run: a callable the scanner does not know that
    /// the file calls (not a lookup) is at the level its name says it
    /// acts at ([`super::dangerous_when_called`]).
    fn settle_effects(&mut self) {
        for &g in &self.instance_getattr {
            if let Some(u) = self.globals.get_mut(g) {
                if u.usage == Usage::Referenced {
                    u.class = GlobalClass::Data;
                    u.usage = Usage::LookedUp;
                }
            }
        }
        for u in &mut self.globals {
            if u.usage == Usage::Called && u.class == GlobalClass::Unknown {
                // An attribute path (`chararray.tofile`) is a method: its
                // last name says what it does.
                let effect = match u.name.rsplit_once('.') {
                    Some((_, method)) => super::dangerous_method(method)
                        .or_else(|| super::dangerous_when_called(&u.name)),
                    None => super::dangerous_when_called(&u.name),
                };
                if let Some(d) = effect {
                    u.class = GlobalClass::Dangerous(d);
                }
            }
        }
        // What is still an unknown call, into code every loading machine
        // has (not the file's own model code), is no checkpoint's call:
        // a payload's. Its enums are listed by name (`KNOWN_ENUMS`): a
        // capitalized class of it called with one word may be `Popen`.
        for u in &mut self.globals {
            if u.usage == Usage::Called
                && u.class == GlobalClass::Unknown
                && super::libraries::shipped(&u.module)
            {
                u.class = GlobalClass::Dangerous(Danger::LibraryCall);
            }
        }
    }

    /// Objects the pickle made among the members of plain sequences and
    /// sets in `values`, and the keys of plain dicts, two levels down (a
    /// list of pairs), not below an object the pickle made; the globals
    /// among the first level's members go to `named` (a library's table in
    /// the list `OrderedDict` unpacks). Each value looked at is charged as
    /// work.
    fn made_members(
        &self,
        heap: &Heap,
        values: &[Value],
        named: &mut Vec<Value>,
    ) -> Result<Vec<Value>> {
        let made = |v: Value| matches!(self.origin(v), Some(Origin::Made(_)));
        // The members of a container (a dict's keys), with no copy of a
        // sequence's; none of anything else, an object the pickle made
        // included.
        let members = |v: Value| -> Cow<'_, [Value]> {
            if !matches!(v, Value::Obj(_)) || made(v) {
                return Cow::Borrowed(&[]);
            }
            if let Some(seq) = heap.sequence(v) {
                return Cow::Borrowed(seq);
            }
            if let Some(d) = heap.dict(v) {
                return Cow::Owned(d.entries().iter().map(|&(k, _)| k).collect());
            }
            Cow::Owned(heap.members(v).unwrap_or_default())
        };
        let mut found = Vec::new();
        let mut nested = Vec::new();
        let mut looked = 0u64;
        for &v in values {
            for &m in members(v).iter() {
                looked += 1;
                if made(m) {
                    found.push(m);
                    continue;
                }
                if matches!(self.origin(m), Some(Origin::Global(_))) {
                    named.push(m);
                    continue;
                }
                for &n in members(m).iter() {
                    looked += 1;
                    if made(n) {
                        found.push(n);
                    } else if hashed_whole(heap, n) {
                        nested.push(n);
                    }
                }
            }
        }
        // Hashing a tuple or a frozenset hashes its members, however deep
        // (`Counter([((x,),)])`): below two levels, those are followed,
        // each once, at most [`WALK_VISITS`] values.
        let mut seen = HashSet::new();
        while let Some(t) = nested.pop() {
            let Value::Obj(id) = t else {
                continue;
            };
            if !seen.insert(id) {
                continue;
            }
            for &x in members(t).iter() {
                looked += 1;
                if looked > WALK_VISITS as u64 {
                    self.overflowed.set(true);
                    nested.clear();
                    break;
                }
                if made(x) {
                    found.push(x);
                } else if hashed_whole(heap, x) {
                    nested.push(x);
                }
            }
        }
        heap.charge_work(looked)?;
        Ok(found)
    }

    /// Objects of classes the scanner does not know that the pickle made,
    /// that hold something, and that `result` does not reach: the load
    /// frees them as it ends (left on the stack, kept only in the memo,
    /// dropped by POP or replaced), and their classes' `__del__` run. One
    /// pass over what `result` reaches, each value charged as work; none
    /// when no such object was made.
    fn unreturned(&self, heap: &Heap, result: Value) -> Result<(Vec<Value>, Vec<Value>)> {
        let mut candidates: Vec<ObjId> = self
            .origins
            .iter()
            .filter(|&(_, o)| {
                matches!(o, Origin::Made(g) if self.globals.get(*g).is_some_and(|u| {
                    u.class == GlobalClass::Unknown && !plain_container(&u.module, &u.name)
                }))
            })
            .map(|(&id, _)| id)
            .filter(|&id| {
                self.held.contains_key(&id)
                    || matches!(heap.get(Value::Obj(id)), Some(Obj::Object(o))
                        if !o.items.entries().is_empty() || !o.list.is_empty())
            })
            .collect();
        heap.charge_work(self.origins.len() as u64)?;
        if candidates.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        heap.charge_work(self.given.len() as u64)?;
        let given: HashMap<ObjId, Value> = self.given.iter().copied().collect();
        let mut reached = HashSet::new();
        let mut queue = vec![result];
        while let Some(v) = queue.pop() {
            let Value::Obj(id) = v else {
                continue;
            };
            if !reached.insert(id) {
                continue;
            }
            let below = self.children(heap, v, id);
            heap.charge_work(below.len() as u64 + 1)?;
            queue.extend(below.into_iter().map(|(_, x)| x));
            queue.extend(given.get(&id).copied());
        }
        candidates.sort_unstable();
        let (kept, freed): (Vec<ObjId>, Vec<ObjId>) =
            candidates.into_iter().partition(|id| reached.contains(id));
        Ok((
            freed.into_iter().map(Value::Obj).collect(),
            kept.into_iter().map(Value::Obj).collect(),
        ))
    }

    fn inert(&mut self, heap: &mut Heap, origin: Option<Origin>) -> Result<Value> {
        let v = heap.alloc(Obj::Object(Box::new(Object {
            class: Value::None,
            args: Value::None,
            state: None,
            items: Default::default(),
            list: Vec::new(),
        })))?;
        if let (Value::Obj(id), Some(o)) = (v, origin) {
            self.origins.insert(id, o);
        }
        Ok(v)
    }

    fn origin(&self, v: Value) -> Option<Origin> {
        match v {
            Value::Obj(id) => self.origins.get(&id).copied(),
            _ => None,
        }
    }

    /// Whether `v` is something calling runs code the file chose: a global
    /// (a function, a class), a wrapper (a partial, what a builtin handed
    /// back), or a bound method of an instance.
    fn is_callable(&self, v: Value) -> bool {
        matches!(self.origin(v), Some(Origin::Global(_)))
            || matches!(v, Value::Obj(id) if self.wrapped.contains_key(&id) || self.bound.contains_key(&id))
    }

    fn global_index(&self, v: Value) -> Option<usize> {
        match self.origin(v) {
            Some(Origin::Global(i)) => Some(i),
            _ => None,
        }
    }

    /// The functions and classes (bare globals) and wrappers among
    /// `values` and their members one level down (a tuple, list or dict
    /// passed in).
    fn callables_among(&self, heap: &Heap, values: &[Value]) -> Result<Vec<Value>> {
        let callable = |v: Value| self.is_callable(v);
        let mut found = Vec::new();
        for &v in values {
            if callable(v) {
                found.push(v);
                continue;
            }
            let members = match heap.dict(v) {
                Some(d) => d.entries().iter().map(|&(_, x)| x).collect(),
                None => heap.members(v).unwrap_or_default(),
            };
            heap.charge_work(members.len() as u64)?;
            found.extend(members.into_iter().filter(|&m| callable(m)));
        }
        Ok(found)
    }

    /// The origin of the first of `values`, or of their members one level
    /// down (a tuple or list passed in), that has one.
    fn origin_within(&self, heap: &Heap, values: &[Value]) -> Result<Option<Origin>> {
        for &v in values {
            if let Some(o) = self.origin(v) {
                return Ok(Some(o));
            }
            // A value that is no container has no members to look in.
            let Some(members) = heap.members(v) else {
                continue;
            };
            heap.charge_work(members.len() as u64)?;
            if let Some(o) = members.iter().find_map(|&m| self.origin(m)) {
                return Ok(Some(o));
            }
        }
        Ok(None)
    }

    fn mark(&mut self, global: Option<usize>, usage: Usage) {
        if let (Some(i), Usage::Called) = (global, usage) {
            // A call by any other way than `call`'s with one constant.
            self.lookups.insert(i, false);
        }
        if let Some(g) = global.and_then(|i| self.globals.get_mut(i)) {
            g.usage = g.usage.max(usage);
            // Plain data only for the arguments `call` checks: called any
            // other way (by `map`, a wrapper, as what a call made), it is
            // a call of an unknown callable.
            if usage == Usage::Called
                && g.class == GlobalClass::Data
                && conditional_data(&g.module, &g.name)
            {
                g.class = GlobalClass::Unknown;
            }
        }
    }

    /// What a call of known data does when its arguments make it act:
    /// `re._compile(pattern, flags)` with `re.DEBUG` among the flags
    /// prints the pattern's parse tree (a library call outside its data
    /// use, as any uncatalogued one);
    /// `_codecs.encode` or `decode` with a codec other than the text
    /// codecs pickles name imports `encodings.<codec>`, the module the
    /// codec registry finds for it (an import). `None` for any other call.
    fn acting_arguments(
        &self,
        heap: &Heap,
        callable: Value,
        items: &[Value],
    ) -> Option<GlobalClass> {
        let (module, name) = self.path_of(callable)?;
        match (module, name) {
            ("re", "_compile") => match items.get(1).copied()? {
                Value::Int(flags) if flags & RE_DEBUG == 0 => None,
                _ => Some(GlobalClass::Dangerous(Danger::LibraryCall)),
            },
            ("_codecs" | "codecs", "encode" | "decode") => {
                match heap.text(items.get(1).copied()?) {
                    Some(codec) if pickle_codec(codec) => None,
                    _ => Some(GlobalClass::Dangerous(Danger::Import)),
                }
            }
            _ => None,
        }
    }

    /// Whether `v` is a global that is plain data for some arguments only
    /// (and not yet seen called with others).
    fn conditional(&self, v: Value) -> bool {
        self.global_index(v)
            .and_then(|i| self.globals.get(i))
            .is_some_and(|g| g.class == GlobalClass::Data && conditional_data(&g.module, &g.name))
    }

    /// The global `v` is when it is one of typing's forms or aliases
    /// (`typing.Union`, `typing_extensions.Literal`: a capitalized name of
    /// the module, no attribute path), whose subscription only builds an
    /// alias.
    fn typing_form(&self, v: Value) -> Option<usize> {
        let g = self.global_index(v)?;
        let u = self.globals.get(g)?;
        (matches!(u.module.as_str(), "typing" | "typing_extensions")
            && u.class == GlobalClass::Unknown
            && !u.name.contains('.')
            && u.name.starts_with(|c: char| c.is_ascii_uppercase()))
        .then_some(g)
    }

    /// Whether `v` is an alias a typing form's subscription built.
    fn typing_alias(&self, v: Value) -> bool {
        matches!(self.origin(v), Some(Origin::Made(g))
        if self.globals.get(g).is_some_and(|u| {
            matches!(u.module.as_str(), "typing" | "typing_extensions")
                && u.usage == Usage::Instantiated
        }))
    }

    fn path_of(&self, v: Value) -> Option<(&str, &str)> {
        let g = self.globals.get(self.global_index(v)?)?;
        Some((g.module.as_str(), g.name.as_str()))
    }

    /// `v` is called: the global it is or came from, and through a
    /// wrapper what the wrapper holds (each wrapper opened once, so a
    /// cycle of wrappers ends).
    fn calls(&mut self, heap: &Heap, v: Value) -> Result<()> {
        let mut stack = vec![v];
        while let Some(v) = stack.pop() {
            heap.charge_work(1)?;
            let method = match v {
                Value::Obj(id) => self.bound.get(&id).cloned(),
                _ => None,
            };
            if let Some((class, name)) = method {
                self.method_called(class, &name);
            } else if let Some(Origin::Global(g) | Origin::Made(g)) = self.origin(v) {
                self.mark(Some(g), Usage::Called);
            }
            if let Value::Obj(id) = v {
                if let Some(wrapped) = self.wrapped.remove(&id) {
                    stack.extend(wrapped);
                }
            }
        }
        Ok(())
    }

    /// Method `name` of an instance of global `class` is called: recorded
    /// as a global of its own (`module.Class.name`), called, at the level
    /// the method's effect has (`Path.touch`, `ndarray.tofile`: files),
    /// else an unknown call: a method of data is still code the file chose
    /// to run, with arguments it chose.
    fn method_called(&mut self, class: usize, name: &str) {
        if let Some(index) = self.method_global(class, name) {
            self.lookups.insert(index, false);
            if let Some(u) = self.globals.get_mut(index) {
                u.usage = Usage::Called;
            }
        }
    }

    /// The global a bound method is recorded as (`module.Class.name`),
    /// made when first seen, named only: dangerous in any use when it is
    /// a method of data the scanner knows (a path, an array, a tensor)
    /// that reaches the file system (`Path.touch`, `ndarray.tofile`), as
    /// `os.system` is wherever it is; else an unknown callable (the
    /// model's own method: a module's hook). The index.
    fn method_global(&mut self, class: usize, name: &str) -> Option<usize> {
        let owner = self.globals.get(class)?;
        let key = (owner.module.clone(), format!("{}.{name}", owner.name));
        if let Some(&i) = self.by_path.get(&key) {
            return Some(i);
        }
        let data = owner.class != GlobalClass::Unknown;
        let danger = if data {
            super::dangerous_method(name)
        } else {
            None
        };
        let i = self.globals.len();
        self.globals.push(GlobalUse {
            module: key.0.clone(),
            name: key.1.clone(),
            offset: owner.offset,
            usage: Usage::Referenced,
            class: danger.map_or(GlobalClass::Unknown, GlobalClass::Dangerous),
        });
        self.by_path.insert(key, i);
        Some(i)
    }

    /// The attributes BUILD's `state` sets on `obj` (from a dict state, or
    /// either dict of a `(state, slotstate)` pair) that the unpickler may
    /// call later: see [`IMPLICIT_METHODS`].
    fn note_methods(&mut self, heap: &Heap, obj: Value, state: Value) -> Result<()> {
        let Value::Obj(id) = obj else {
            return Ok(());
        };
        let parts = match heap.tuple(state) {
            Some(items) => items.to_vec(),
            None => vec![state],
        };
        heap.charge_work(parts.len() as u64)?;
        for part in parts {
            let Some(dict) = heap.dict(part) else {
                continue;
            };
            heap.charge_work(dict.entries().len() as u64)?;
            for &(k, v) in dict.entries() {
                if let Some(name) = heap.text(k).filter(|k| IMPLICIT_METHODS.contains(k)) {
                    self.methods
                        .entry(id)
                        .or_default()
                        .push((name.to_owned(), v));
                }
            }
        }
        Ok(())
    }

    /// The wrapper `made` holds `func`: calling it calls `func`.
    fn wrap(&mut self, made: Value, func: Value) {
        if let Value::Obj(id) = made {
            self.wrapped.entry(id).or_default().push(func);
        }
    }

    /// `obj` was given `v` (constructor arguments, a BUILD state).
    fn hold(&mut self, obj: Value, v: Value) {
        if let Value::Obj(id) = obj {
            self.held.entry(id).or_default().push(v);
        }
    }

    /// Visit what `start` holds, breadth first, at most [`WALK_DEPTH`]
    /// levels down and [`WALK_VISITS`] values: a container's members, an
    /// object's items and elements, and what it was given ([`hold`]);
    /// `visit` gets each value with the key it is stored under, when that
    /// is a string. Never recursive; each visit charged as work.
    fn walk(
        &self,
        heap: &Heap,
        start: Value,
        mut visit: impl FnMut(Option<&str>, Value),
    ) -> Result<()> {
        let mut queue = std::collections::VecDeque::from([(start, 0usize)]);
        let mut seen = HashSet::new();
        let mut visits = 0usize;
        while let Some((v, depth)) = queue.pop_front() {
            let Value::Obj(id) = v else {
                continue;
            };
            if depth >= WALK_DEPTH || !seen.insert(id) {
                continue;
            }
            let below = self.children(heap, v, id);
            heap.charge_work(below.len() as u64 + 1)?;
            for (key, x) in below {
                visits += 1;
                if visits > WALK_VISITS {
                    self.overflowed.set(true);
                    return Ok(());
                }
                visit(key, x);
                queue.push_back((x, depth + 1));
            }
        }
        Ok(())
    }

    /// What `v` (object `id`) holds one level down: a container's members,
    /// a mapping's values and keys (a key may be a callable: iterating a
    /// mapping, `keys()`, `reversed` hand it out), an object's items and
    /// elements, and what it was given ([`hold`]), each value with the key
    /// it is stored under when that is text.
    fn children<'h>(&self, heap: &'h Heap, v: Value, id: ObjId) -> Vec<(Option<&'h str>, Value)> {
        let mut below: Vec<(Option<&str>, Value)> = Vec::new();
        let keys = |entries: &[(Value, Value)]| -> Vec<(Option<&'h str>, Value)> {
            entries
                .iter()
                .filter(|&&(k, _)| matches!(k, Value::Obj(_)) && heap.text(k).is_none())
                .map(|&(k, _)| (None, k))
                .collect()
        };
        match heap.get(v) {
            Some(Obj::Dict(d)) => {
                below.extend(d.entries().iter().map(|&(k, x)| (heap.text(k), x)));
                below.extend(keys(d.entries()));
            }
            Some(Obj::Object(o)) => {
                below.extend(o.items.entries().iter().map(|&(k, x)| (heap.text(k), x)));
                below.extend(keys(o.items.entries()));
                below.extend(o.list.iter().map(|&x| (None, x)));
            }
            _ => {
                if let Some(members) = heap.members(v) {
                    below.extend(members.into_iter().map(|x| (None, x)));
                }
            }
        }
        if let Some(given) = self.held.get(&id) {
            below.extend(given.iter().map(|&x| (None, x)));
        }
        below
    }

    /// The values stored under any of `names` in what `obj` holds: an
    /// instance attribute BUILD set, or an item a class's `__getattr__`
    /// answers attribute lookups with (a dict subclass's items, a
    /// `UserDict`'s `data`, a module's `_modules`).
    fn held_by_name(&self, heap: &Heap, obj: Value, names: &[&str]) -> Result<Vec<Value>> {
        let mut found = Vec::new();
        self.walk(heap, obj, |key, v| {
            if key.is_some_and(|k| names.contains(&k)) {
                found.push(v);
            }
        })?;
        Ok(found)
    }

    /// The callables `obj` holds: globals (functions, classes) and
    /// wrappers of them, anywhere [`walk`](Self::walk) reaches.
    fn held_callables(&self, heap: &Heap, obj: Value) -> Result<Vec<Value>> {
        let mut found = Vec::new();
        self.walk(heap, obj, |_, v| {
            if self.is_callable(v) {
                found.push(v);
            }
        })?;
        Ok(found)
    }

    /// The callables among `values` and anywhere below them that
    /// [`walk`](Self::walk) reaches: what a builtin handed these values may
    /// hand back or call (`next`, `min`, `reversed`, `dict`...), in order.
    fn callables_within(&self, heap: &Heap, values: &[Value]) -> Result<Vec<Value>> {
        let callable = |v: Value| self.is_callable(v);
        let mut found: Vec<Value> = values.iter().copied().filter(|&v| callable(v)).collect();
        for &v in values {
            found.extend(self.held_callables(heap, v)?);
        }
        Ok(found)
    }

    /// `values` are handed to code that uses them (a call's arguments, the
    /// fields of a persistent id torch formats and compares, a legacy
    /// header torch compares): Python runs the methods of any object the
    /// pickle made among them (`repr`, `str`, `format`, `len`, `==`,
    /// iteration, `keys()`, `items()`...), and what such an object holds
    /// (an attribute BUILD set, an item, what it was given) may be what
    /// those methods call. Each callable below an object the pickle made
    /// is called; callables in plain containers alone are not (a call
    /// given functions is judged by what it is). One breadth-first pass,
    /// at most [`USED_DEPTH`] levels (deeper, an object that holds
    /// anything makes the pickle ambiguous) and [`WALK_VISITS`] values,
    /// each charged as work.
    fn used(&mut self, heap: &Heap, values: &[Value]) -> Result<()> {
        self.used_as(heap, values, Use::Any)
    }

    /// [`used`](Self::used), for values only hashed, compared or converted
    /// ([`Use::Unargued`]): the methods that run (`__hash__`, `__eq__`,
    /// `__index__`, `__iter__`) are given nothing the file chose, so a
    /// bare function or class below an object (a frozen dataclass's or a
    /// namedtuple's field: `act=F.gelu` in a dict key) is not taken for
    /// called: calling it would give it no argument. Wrappers
    /// (`functools.partial`, a bound method) carry their arguments and are
    /// called as under [`used`](Self::used); a bare callable of a known
    /// effect is at its level wherever it is.
    fn used_unargued(&mut self, heap: &Heap, values: &[Value]) -> Result<()> {
        self.used_as(heap, values, Use::Unargued)
    }

    /// [`used_unargued`](Self::used_unargued), for values iterated,
    /// measured or tested for truth ([`Use::Iterated`]): a bare function
    /// kept under an attribute's name by an object of a class the scanner
    /// does not know is called.
    fn used_iterated(&mut self, heap: &Heap, values: &[Value]) -> Result<()> {
        self.used_as(heap, values, Use::Iterated)
    }

    fn used_as(&mut self, heap: &Heap, values: &[Value], how: Use) -> Result<()> {
        if values.is_empty() || self.nothing_to_call(heap)? {
            return Ok(());
        }
        let mut any = false;
        for &v in values {
            if self.may_hold(heap, v)? {
                any = true;
                break;
            }
        }
        if !any {
            return Ok(());
        }
        let made = |r: &Recorder, v: Value| matches!(r.origin(v), Some(Origin::Made(_)));
        let callable = |r: &Recorder, v: Value| r.is_callable(v);
        // Each value with its depth, whether an object the pickle made is
        // above it, the class of the nearest such object, and whether that
        // object is one of `values` (whose own methods run).
        let mut queue: std::collections::VecDeque<(Value, usize, bool, Option<usize>, bool)> =
            values
                .iter()
                .map(|&v| (v, 0, made(self, v), None, false))
                .collect();
        let mut seen = HashSet::new();
        let mut visits = 0usize;
        let mut called = Vec::new();
        while let Some((v, depth, inside, owner, owner_given)) = queue.pop_front() {
            let Value::Obj(id) = v else {
                continue;
            };
            if !seen.insert((id, inside)) {
                continue;
            }
            // Deeper than the walk follows: what lies below is not known,
            // and the pickle is ambiguous (a chain of objects, each
            // calling the next, hides a callable at its end).
            if depth >= USED_DEPTH {
                if self.may_hold(heap, v)? {
                    self.overflowed.set(true);
                }
                continue;
            }
            // An instance holds its own class (what made it was given it):
            // its methods are that class's, not a call of it.
            let (own, own_given) = match self.origin(v) {
                Some(Origin::Made(c)) => (Some(c), depth == 0),
                _ => (owner, owner_given),
            };
            let below = self.children(heap, v, id);
            heap.charge_work(below.len() as u64 + 1)?;
            for (key, x) in below {
                visits += 1;
                if visits > WALK_VISITS {
                    self.overflowed.set(true);
                    break;
                }
                let own_class = own.is_some() && self.global_index(x) == own;
                let bare = match how {
                    Use::Any => false,
                    Use::Unargued => self.global_index(x).is_some(),
                    // An attribute of an object given, whose class the
                    // scanner does not know: its own methods may call it.
                    Use::Iterated => {
                        self.global_index(x).is_some()
                            && !(key.is_some() && own_given && own.is_some_and(|c| !self.plain(c)))
                    }
                };
                if inside && callable(self, x) && !own_class && !bare {
                    called.push(x);
                }
                queue.push_back((x, depth + 1, inside || made(self, x), own, own_given));
            }
            if visits > WALK_VISITS {
                break;
            }
        }
        for v in called {
            self.calls(heap, v)?;
        }
        Ok(())
    }

    /// Objects the pickle constructed and torch's own functions iterate,
    /// measure or convert (`OrderedDict(x)` runs `x.keys()` and
    /// `x[key]`): the methods of their class run on the state the file
    /// gave them. Of a class of code every loading machine has that the
    /// scanner has no entry for, that is library code no checkpoint runs,
    /// acting on what the file chose (a mapping whose lookup imports the
    /// module its state names): an uncatalogued library call.
    fn library_methods_run(&mut self, values: &[Value]) {
        for &v in values {
            match self.origin(v) {
                Some(Origin::Made(c)) => {
                    if let Some(u) = self.globals.get_mut(c) {
                        if u.class == GlobalClass::Unknown
                            && u.usage == Usage::Instantiated
                            && super::libraries::shipped(&u.module)
                        {
                            u.class = GlobalClass::Dangerous(Danger::LibraryCall);
                        }
                    }
                }
                Some(Origin::Global(_)) => self.library_objects_used(&[v]),
                None => {}
            }
        }
    }

    /// [`library_methods_run`](Self::library_methods_run) on `values` and
    /// on the members of the containers among them, one level down (a
    /// list's elements, a dict's keys: `dict([pair])` unpacks each pair).
    fn library_methods_run_within(&mut self, heap: &Heap, values: &[Value]) -> Result<()> {
        let mut all = values.to_vec();
        for &v in values {
            if self.origin(v).is_some() {
                continue;
            }
            if let Some(seq) = heap.sequence(v) {
                all.extend_from_slice(seq);
            } else if let Some(d) = heap.dict(v) {
                all.extend(d.entries().iter().map(|&(k, _)| k));
            }
        }
        heap.charge_work(all.len() as u64)?;
        self.library_methods_run(&all);
        Ok(())
    }

    /// Objects a library already holds, named by the file and given to a
    /// callable that iterates, converts or compares them
    /// (`dict(transformers.CONFIG_MAPPING)`, `str(builtins.license)`):
    /// their methods run, which no entry of the scanner's covers. A name
    /// in a class's spelling (`BertConfig`) is passed over: a class given
    /// to a builtin is converted or compared by `type`'s methods.
    fn library_objects_used(&mut self, values: &[Value]) {
        for &v in values {
            let Some(Origin::Global(c)) = self.origin(v) else {
                continue;
            };
            if let Some(u) = self.globals.get_mut(c) {
                let last = u.name.rsplit('.').next().unwrap_or_default();
                // Capitalized, with lower case letters or as one word:
                // `BertConfig`, `GRU`; not `CONFIG_MAPPING` or `license`.
                let word = last.trim_start_matches('_');
                let class_like = word.starts_with(|ch: char| ch.is_ascii_uppercase())
                    && (word.bytes().any(|b| b.is_ascii_lowercase()) || !word.contains('_'));
                if u.class == GlobalClass::Unknown
                    && !class_like
                    && super::libraries::shipped(&u.module)
                {
                    u.class = GlobalClass::Dangerous(Danger::LibraryCall);
                }
            }
        }
    }

    /// Whether the global at `g` is a library's (see
    /// [`libraries`](super::libraries)), not a model's own code.
    fn is_library(&self, g: usize) -> bool {
        self.globals
            .get(g)
            .is_some_and(|u| super::libraries::shipped(&u.module))
    }

    /// Whether the pickle has named nothing that calling could run: no
    /// wrapper or bound method, and every global torch's allowlist or
    /// known data. Then [`used`](Self::used) has nothing to find, however
    /// deep what it is given (a key of nested tuples) goes. Charged as
    /// work, one unit per global.
    fn nothing_to_call(&self, heap: &Heap) -> Result<bool> {
        if !self.wrapped.is_empty() || !self.bound.is_empty() {
            return Ok(false);
        }
        heap.charge_work(self.globals.len() as u64)?;
        Ok(self
            .globals
            .iter()
            .all(|u| matches!(u.class, GlobalClass::Tensor | GlobalClass::Data)))
    }

    /// Whether `v` may hold anything [`used`](Self::used) would find: an
    /// object the pickle made that holds something (items, elements, what
    /// it was given), or a container with such a member or a container
    /// among its members (one level is looked at, without recursion).
    /// Cheap, and never wrong the other way: a tensor's rebuild arguments
    /// (numbers, tuples of numbers, an empty `OrderedDict`) are passed over.
    fn may_hold(&self, heap: &Heap, v: Value) -> Result<bool> {
        // `v` itself, then (for a container) each member, where a
        // container member is enough.
        let holds = |x: Value, top: bool| -> Option<bool> {
            let Value::Obj(id) = x else {
                return Some(false);
            };
            match heap.get(x) {
                Some(Obj::Object(o)) => Some(
                    self.held.contains_key(&id)
                        || !o.items.entries().is_empty()
                        || !o.list.is_empty(),
                ),
                Some(Obj::Tuple(_) | Obj::List(_) | Obj::Dict(_) | Obj::Set(_)) => {
                    if top {
                        None
                    } else {
                        Some(true)
                    }
                }
                _ => Some(false),
            }
        };
        if let Some(answer) = holds(v, true) {
            return Ok(answer);
        }
        let member = |m: Value| holds(m, false).unwrap_or(true);
        if let Some(d) = heap.dict(v) {
            heap.charge_work(d.entries().len() as u64)?;
            return Ok(d.entries().iter().any(|&(k, x)| member(k) || member(x)));
        }
        if let Some(seq) = heap.sequence(v) {
            heap.charge_work(seq.len() as u64)?;
            return Ok(seq.iter().any(|&m| member(m)));
        }
        let members = heap.members(v).unwrap_or_default();
        heap.charge_work(members.len() as u64)?;
        Ok(members.into_iter().any(member))
    }

    /// What `v` stands for, as the value a builtin hands back from
    /// `values` (`next(it, default)`, `min`, `reversed`, an item taken by
    /// a key the scanner cannot follow): the origin of the first value
    /// with one, and every callable among or below them wrapped in, so
    /// that calling it calls each of them.
    fn any_of(&mut self, heap: &mut Heap, values: &[Value]) -> Result<Value> {
        let origin = self.origin_within(heap, values)?;
        let candidates = self.callables_within(heap, values)?;
        let v = self.inert(heap, origin)?;
        for c in candidates {
            self.wrap(v, c);
        }
        Ok(v)
    }

    /// The values a BUILD state part that is a mapping made by a call sets
    /// as dunders or under names the scanner cannot read: of a `dict`,
    /// `OrderedDict` or `defaultdict`, the pairs it was given (a dict, or
    /// a sequence of pairs) and its items, those whose key is a dunder or
    /// no text; of a class the scanner does not know, every callable it
    /// holds (its `keys()` and `__getitem__` may answer anything). Nothing
    /// for other values.
    fn smuggled_by(&self, heap: &Heap, part: Value) -> Result<Vec<Value>> {
        let Some(Origin::Made(m)) = self.origin(part) else {
            return Ok(Vec::new());
        };
        let unknown = self
            .globals
            .get(m)
            .is_some_and(|u| u.class == GlobalClass::Unknown);
        if unknown {
            return self.callables_within(heap, &[part]);
        }
        if !self.unknown_or_mapping(m) {
            return Ok(Vec::new());
        }
        let mut pairs: Vec<(Value, Value)> = Vec::new();
        if let Some(Obj::Object(o)) = heap.get(part) {
            pairs.extend(o.items.entries().iter().copied());
        }
        let given = match part {
            Value::Obj(id) => self.held.get(&id).cloned().unwrap_or_default(),
            _ => Vec::new(),
        };
        for args in given {
            for a in heap.tuple(args).map(<[Value]>::to_vec).unwrap_or_default() {
                if let Some(d) = heap.dict(a) {
                    pairs.extend(d.entries().iter().copied());
                } else if let Some(items) = heap.sequence(a) {
                    heap.charge_work(items.len() as u64)?;
                    for &item in items {
                        match heap.sequence(item) {
                            Some(&[k, v]) => pairs.push((k, v)),
                            // Pairs the scanner cannot read: anything.
                            _ => pairs.push((Value::None, item)),
                        }
                    }
                }
            }
        }
        heap.charge_work(pairs.len() as u64)?;
        let mut found = Vec::new();
        for (k, v) in pairs {
            // A number is no attribute name (setattr refuses it); a
            // computed key may be any.
            let unreadable = matches!(k, Value::Obj(_)) && heap.text(k).is_none();
            if unreadable || dunder(heap, k) {
                found.extend(self.callables_within(heap, &[v])?);
            }
        }
        Ok(found)
    }

    /// Whether global `g` is a class the scanner does not know, or one
    /// that makes a mapping of what it is given (`dict`, `OrderedDict`,
    /// `defaultdict`).
    fn unknown_or_mapping(&self, g: usize) -> bool {
        self.globals.get(g).is_some_and(|u| {
            u.class == GlobalClass::Unknown
                || matches!(
                    (u.module.as_str(), u.name.as_str()),
                    ("builtins" | "__builtin__", "dict")
                        | ("collections", "OrderedDict" | "defaultdict")
                )
        })
    }

    /// The objects the pickle made within `v`'s tuples, however deep
    /// (each tuple once, at most [`WALK_VISITS`] values), other than plain
    /// mappings (a `__setstate__` that keeps a dict of hooks it is given
    /// calls none of them).
    fn made_in_tuples(&self, heap: &Heap, v: Value) -> Result<Vec<Value>> {
        let mut found = Vec::new();
        let mut stack = vec![v];
        let mut seen = HashSet::new();
        let mut looked = 0u64;
        while let Some(t) = stack.pop() {
            let Value::Obj(id) = t else {
                continue;
            };
            if !seen.insert(id) {
                continue;
            }
            for &x in heap.tuple(t).unwrap_or_default() {
                looked += 1;
                if looked > WALK_VISITS as u64 {
                    self.overflowed.set(true);
                    stack.clear();
                    break;
                }
                if heap.tuple(x).is_some() {
                    stack.push(x);
                } else if matches!(self.origin(x), Some(Origin::Made(_))) && !self.plain_mapping(x)
                {
                    found.push(x);
                }
            }
        }
        heap.charge_work(looked)?;
        Ok(found)
    }

    /// Objects of classes the scanner does not know that the load returns:
    /// freed when the caller lets them go, their `__del__` runs then. What
    /// a finalizer calls is the instance's own cleanup (`self.close()`,
    /// `self.teardown(...)`, `self.file.close()`): a callable stored, at
    /// any depth below the object, under a name whose words say cleanup
    /// ([`FINALIZER_WORDS`]) is called. (Every callable a returned model
    /// holds would be too many: hooks, activations, partials of layers.)
    fn finalized(&mut self, heap: &Heap, kept: &[Value]) -> Result<()> {
        // A class known to have a finalizer that calls through the
        // instance (`super::finalizers`): all it holds is used, as for an
        // object the load frees.
        let known: Vec<Value> = kept
            .iter()
            .copied()
            .filter(|&v| match self.origin(v) {
                Some(Origin::Made(g)) => self
                    .path_of_global(g)
                    .is_some_and(|(m, n)| super::finalizers::has_finalizer(m, n)),
                _ => false,
            })
            .collect();
        self.used(heap, &known)?;
        // One pass over all of them (a model's modules hold each other):
        // each value once, charged as work.
        let mut called = Vec::new();
        let mut queue: std::collections::VecDeque<Value> = kept.iter().copied().collect();
        let mut seen = HashSet::new();
        // Objects of one class share their attributes' names: each name's
        // words are looked at once.
        let mut named: HashMap<&str, bool> = HashMap::new();
        while let Some(v) = queue.pop_front() {
            let Value::Obj(id) = v else {
                continue;
            };
            if !seen.insert(id) {
                continue;
            }
            let below = self.children(heap, v, id);
            heap.charge_work(below.len() as u64 + 1)?;
            for (key, x) in below {
                let cleanup = key.is_some_and(|k| {
                    *named.entry(k).or_insert_with(|| {
                        super::words(k)
                            .iter()
                            .any(|w| FINALIZER_WORDS.contains(&w.as_str()))
                    })
                });
                if cleanup
                    && (self.is_callable(x) || matches!(self.origin(x), Some(Origin::Made(_))))
                {
                    called.push(x);
                }
                queue.push_back(x);
            }
        }
        for &v in &called {
            self.calls(heap, v)?;
        }
        self.used_unargued(heap, &called)
    }

    /// A weak reference made with a callback (`weakref.ref(target, cb)`,
    /// `KeyedRef`, `WeakMethod`): the target may die as the load ends
    /// (kept only by the unpickler), and Python calls the callback with
    /// the reference. A callable object there runs its `__call__` (a
    /// module's `forward`), with what it holds at hand.
    fn weak_callback(&mut self, heap: &Heap, cls: Value, items: &[Value]) -> Result<()> {
        let weak = matches!(
            self.path_of(cls),
            Some((
                "weakref" | "_weakref",
                "ref" | "ReferenceType" | "KeyedRef" | "WeakMethod"
            ))
        );
        if !weak {
            return Ok(());
        }
        let callbacks: Vec<Value> = items.iter().skip(1).copied().collect();
        for &c in &callbacks {
            if matches!(self.origin(c), Some(Origin::Made(_))) || self.is_callable(c) {
                self.calls(heap, c)?;
            }
        }
        self.used(heap, &callbacks)
    }

    /// `module.name` of global `g`.
    fn path_of_global(&self, g: usize) -> Option<(&str, &str)> {
        self.globals
            .get(g)
            .map(|u| (u.module.as_str(), u.name.as_str()))
    }

    /// Whether `v` is a mapping that runs nothing of the file's when asked
    /// whether it holds a key: a dict the pickle built, or one a call of
    /// `dict`, `OrderedDict` or `defaultdict` made; or no object at all.
    fn plain_mapping(&self, v: Value) -> bool {
        match self.origin(v) {
            Some(Origin::Made(g)) => matches!(
                self.path_of_global(g),
                Some((
                    "builtins" | "__builtin__" | "collections",
                    "dict" | "OrderedDict" | "defaultdict"
                ))
            ),
            Some(Origin::Global(_)) => false,
            None => true,
        }
    }

    /// Whether an instance of global `g` keeps what APPEND, SETITEM or
    /// ADDITEMS put in it as it is, calling none of its methods (a list,
    /// a dict and their kin; keys are hashed apart from this).
    fn stores_as_given(&self, g: usize) -> bool {
        self.globals.get(g).is_some_and(|u| {
            matches!(
                (u.module.as_str(), u.name.as_str()),
                (
                    "builtins" | "__builtin__",
                    "dict" | "list" | "set" | "frozenset" | "object"
                ) | (
                    "collections",
                    "OrderedDict" | "defaultdict" | "Counter" | "deque" | "ChainMap"
                )
            ) || plain_container(&u.module, &u.name)
        })
    }

    /// Whether an instance of global `g` stores what its `__setitem__`,
    /// `append` or `extend` are given and calls nothing else: a class the
    /// scanner knows as data or tensor machinery, or a known container.
    fn plain(&self, g: usize) -> bool {
        self.globals.get(g).is_some_and(|u| {
            matches!(u.class, GlobalClass::Tensor | GlobalClass::Data)
                || plain_container(&u.module, &u.name)
        })
    }

    /// `cls.__new__(cls, *items)` (NEWOBJ, `copyreg.__newobj__`): a class
    /// made by `type` or a metaclass from `(name, bases, namespace)`; a
    /// `map` or `filter`, which calls its function as it is consumed; a
    /// class the scanner does not know, given functions or classes (a
    /// weak reference's callback): they may be called. Bare functions and
    /// classes given to the `__new__` of a class outside the standard
    /// library are not: such a `__new__` is a namedtuple's (which stores
    /// its fields: `Pair("warm", warmup)`) or an `object.__new__` that
    /// ignores its arguments; wrappers (`functools.partial`, a bound
    /// method) still are.
    fn new_with(&mut self, heap: &Heap, cls: Value, items: &[Value]) -> Result<()> {
        let Some(g) = self.global_index(cls) else {
            return Ok(());
        };
        if let Some(namespace) = class_args(heap, items) {
            self.makes_class(heap, g, namespace)?;
        }
        let path = self.path_of(cls);
        if matches!(path, Some(("builtins" | "__builtin__", "map" | "filter"))) {
            if let Some(&f) = items.first() {
                self.calls(heap, f)?;
            }
        }
        self.weak_callback(heap, cls, items)?;
        // A builtin type's or torch's `__new__` consumes what it is given
        // (`tuple.__new__(tuple, reader)` iterates it): an object of a
        // library class there runs its methods, as given to a call.
        let consumes = self
            .globals
            .get(g)
            .is_some_and(|u| matches!(u.class, GlobalClass::Data | GlobalClass::Tensor));
        if consumes {
            self.library_methods_run(items);
        }
        let unknown = self
            .globals
            .get(g)
            .is_some_and(|u| u.class == GlobalClass::Unknown);
        if unknown {
            let stdlib = self.path_of(cls).is_some_and(|(module, _)| {
                super::stdlib::is_stdlib(module.split('.').next().unwrap_or(module))
            });
            for c in self.callables_among(heap, items)? {
                if stdlib || self.global_index(c).is_none() {
                    self.calls(heap, c)?;
                }
            }
        }
        Ok(())
    }

    /// `type(name, bases, namespace)` through global `g`: a class whose
    /// methods are what the file put in the namespace; Python calls its
    /// dunders itself (`__setstate__` on BUILD, `__init__` when called,
    /// `__lt__` in `sorted`, `__hash__`...): a gadget, each value called.
    fn makes_class(&mut self, heap: &Heap, g: usize, namespace: Value) -> Result<()> {
        if let Some(u) = self.globals.get_mut(g) {
            u.class = GlobalClass::Dangerous(Danger::Gadget);
        }
        let values: Vec<Value> = heap
            .dict(namespace)
            .map(|d| d.entries().iter().map(|&(_, v)| v).collect())
            .unwrap_or_default();
        heap.charge_work(values.len() as u64)?;
        for v in values {
            self.calls(heap, v)?;
        }
        Ok(())
    }
}

/// `re.DEBUG`: a pattern compiled with it prints its parse tree.
const RE_DEBUG: i64 = 128;

/// Whether `codec` names one of the text codecs pickles use (protocol 2
/// writes bytes as `_codecs.encode(text, "latin1")`), spelt as Python's
/// codec registry accepts it (any case, `-` or ` ` for `_`).
fn pickle_codec(codec: &str) -> bool {
    let normal: String = codec
        .chars()
        .map(|c| match c {
            '-' | ' ' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    matches!(
        normal.as_str(),
        "latin1"
            | "latin_1"
            | "latin"
            | "l1"
            | "iso8859_1"
            | "iso_8859_1"
            | "utf8"
            | "utf_8"
            | "u8"
            | "ascii"
            | "us_ascii"
    )
}

/// A constant: None, a bool, a number, a string or bytes, or a tuple of
/// those (an enum's value may be a tuple).
fn constant(heap: &Heap, v: Value) -> bool {
    let scalar = |v: Value| match v {
        Value::Obj(_) => matches!(
            heap.get(v),
            Some(Obj::Str(_) | Obj::Bytes(_) | Obj::BigInt(_))
        ),
        _ => true,
    };
    scalar(v)
        || heap
            .tuple(v)
            .is_some_and(|items| items.iter().all(|&i| scalar(i)))
}

/// What an enum member of a package's own enum class pickles with: a
/// number, or a word (at most 64 letters, digits, `_`, `-` and `.`:
/// `"train"`, `"bf16-mixed"`, `"NCHW"`), or a tuple of those. A string an
/// enum value seldom is (a path, code, a sentence) makes the call of an
/// unknown class a call: a constructor that evaluates or opens its
/// argument (`pydantic.TypeAdapter("...")`) is not taken for a lookup.
fn enum_value(heap: &Heap, v: Value) -> bool {
    let scalar = |v: Value| match v {
        Value::Obj(_) => match heap.get(v) {
            Some(Obj::BigInt(_)) => true,
            Some(Obj::Str(_)) => heap.text(v).is_some_and(|t| {
                !t.is_empty()
                    && t.len() <= 64
                    && t.chars()
                        .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
            }),
            _ => false,
        },
        _ => true,
    };
    scalar(v)
        || heap
            .tuple(v)
            .is_some_and(|items| items.iter().all(|&i| scalar(i)))
}

/// A tuple or a set the pickle built, whose hash is its members' (a
/// frozenset's; a set is unhashable, and followed all the same).
fn hashed_whole(heap: &Heap, v: Value) -> bool {
    matches!(heap.get(v), Some(Obj::Tuple(_) | Obj::Set(_)))
}

/// A list, tuple or dict the pickle built (not an object a global made).
fn container(heap: &Heap, v: Value) -> bool {
    matches!(
        heap.get(v),
        Some(Obj::List(_) | Obj::Tuple(_) | Obj::Dict(_))
    )
}

/// Whether `key` names a dunder attribute (`__setstate__`,
/// `__pydantic_fields_set__`...).
fn dunder(heap: &Heap, key: Value) -> bool {
    heap.text(key)
        .is_some_and(|k| k.len() > 4 && k.starts_with("__") && k.ends_with("__"))
}

/// Dunders Python looks up on an instance by `getattr` and calls (pickle's
/// BUILD and reduce, `copy`): an entry of the instance's dict shadows the
/// class's method. Special methods Python calls by syntax (`__hash__`,
/// `__eq__`, `__del__`...) are looked up on the type, and an entry named
/// so in the instance's dict is only data.
const INSTANCE_DUNDERS: [&str; 8] = [
    "__setstate__",
    "__reduce__",
    "__reduce_ex__",
    "__getstate__",
    "__getnewargs__",
    "__getnewargs_ex__",
    "__deepcopy__",
    "__copy__",
];

/// The methods BUILD (`items`) and `__setstate__` methods (pydantic's
/// `get`, `Module`'s `keys` and `__getitem__`...) call on a state that is
/// not a dict.
const STATE_METHODS: [&str; 9] = [
    "items",
    "keys",
    "values",
    "get",
    "__getitem__",
    "__iter__",
    "__contains__",
    "setdefault",
    "pop",
];

/// Whether BUILD setting `key` changes what a later opcode or copy calls:
/// one of [`INSTANCE_DUNDERS`], or, set by `setattr` (a slot state),
/// `__class__` or `__dict__` (the instance's type or its whole dict; put
/// into the dict, they are entries its descriptors ignore).
fn shadows(heap: &Heap, key: Value, by_setattr: bool) -> bool {
    heap.text(key).is_some_and(|k| {
        INSTANCE_DUNDERS.contains(&k) || (by_setattr && matches!(k, "__class__" | "__dict__"))
    })
}

impl Interpreter for Recorder {
    fn global(&mut self, heap: &mut Heap, module: &str, name: &str, offset: u64) -> Result<Value> {
        heap.charge_bytes(module.len() + name.len())?;
        let key = (module.to_owned(), name.to_owned());
        let index = match self.by_path.get(&key) {
            Some(&i) => i,
            None => {
                let i = self.globals.len();
                self.globals.push(GlobalUse {
                    module: key.0.clone(),
                    name: key.1.clone(),
                    offset,
                    usage: Usage::Referenced,
                    class: classify(module, name),
                });
                self.by_path.insert(key, i);
                i
            }
        };
        self.inert(heap, Some(Origin::Global(index)))
    }

    fn call(&mut self, heap: &mut Heap, callable: Value, args: Value) -> Result<Value> {
        // Arguments that are no tuple: none are looked at (torch would
        // fail the call).
        let items = heap.tuple(args).map_or_else(Vec::new, <[Value]>::to_vec);
        // A `defaultdict`'s factory runs on any lookup of a key it lacks
        // (`__setstate__`s that index their state, `__getattr__`s that
        // index their data): called, as soon as it is made.
        self.weak_callback(heap, callable, &items)?;
        if self.path_of(callable) == Some(("collections", "defaultdict")) {
            // It is called with nothing: a bare function or class is judged
            // by what it is (`defaultdict(list)`, a module's own function),
            // a wrapper or an object that carries arguments is called.
            if let Some(&factory) = items.first() {
                match self.global_index(factory) {
                    None => self.calls(heap, factory)?,
                    // A library's function or object (`cgi.print_environ`,
                    // `builtins.help`) is called as it stands; a model's
                    // own factory is judged by what it is.
                    Some(g) if self.is_library(g) => self.mark(Some(g), Usage::Called),
                    Some(_) => {}
                }
            }
        }
        heap.charge_work(items.len() as u64)?;
        // Known data that its arguments can make act: judged by what
        // they make it do.
        if let Some(class) = self.acting_arguments(heap, callable, &items) {
            if let Some(u) = self
                .global_index(callable)
                .and_then(|g| self.globals.get_mut(g))
            {
                if !matches!(u.class, GlobalClass::Dangerous(_)) {
                    u.class = class;
                }
            }
        }
        // What a builtin handed back may be any of what it was given
        // (`any_of`): calling it calls each.
        if let Value::Obj(id) = callable {
            let stands_for_several = self.wrapped.contains_key(&id)
                && !matches!(self.origin(callable), Some(Origin::Made(_)));
            if stands_for_several {
                self.calls(heap, callable)?;
            }
        }
        let arg = |i: usize| items.get(i).copied().unwrap_or(Value::None);
        match self.origin(callable) {
            // A partial made and kept calls nothing; calling it later calls
            // its function (see `calls`).
            Some(Origin::Global(g)) if self.path_of(callable) == Some(("functools", "partial")) => {
                self.mark(Some(g), Usage::Instantiated);
                let made = self.inert(heap, Some(Origin::Made(g)))?;
                self.wrap(made, arg(0));
                Ok(made)
            }
            // An enum member looked up by its value, an item taken from a
            // container the pickle built: plain data. Any other call of
            // these is a call of an unknown callable.
            Some(Origin::Global(g)) if self.conditional(callable) => {
                // `conditional` knew the callable by its path; without one
                // it would be a call like any other.
                let enum_lookup = self
                    .path_of(callable)
                    .is_some_and(|(module, name)| known_enum(module, name));
                // `typing.Optional[int]`, `typing.Dict[str, typing.Any]`:
                // how an annotation pickles. A typing form subscripted with
                // constants, globals and such annotations builds an alias.
                let form = if enum_lookup || items.len() != 2 {
                    None
                } else {
                    self.typing_form(arg(0)).filter(|_| {
                        let one = |v: Value| {
                            constant(heap, v)
                                || self.global_index(v).is_some()
                                || self.typing_alias(v)
                                // `type(None)`, in `Optional[...]`.
                                || matches!(self.origin(v), Some(Origin::Made(t))
                                    if self.path_of_global(t) == Some(("builtins", "type")))
                        };
                        one(arg(1))
                            || heap
                                .tuple(arg(1))
                                .is_some_and(|t| t.iter().all(|&v| one(v)))
                    })
                };
                if let Some(form) = form {
                    self.mark(Some(form), Usage::Instantiated);
                    return self.inert(heap, Some(Origin::Made(form)));
                }
                let plain = if enum_lookup {
                    items.len() == 1 && constant(heap, arg(0))
                } else {
                    self.path_of(callable).is_some()
                        && items.len() == 2
                        && container(heap, arg(0))
                        && constant(heap, arg(1))
                };
                if !plain {
                    self.mark(Some(g), Usage::Called);
                    return self.inert(heap, Some(Origin::Made(g)));
                }
                if enum_lookup {
                    self.mark(Some(g), Usage::Instantiated);
                    return self.inert(heap, Some(Origin::Made(g)));
                }
                // The item itself when it can be found (a bool indexes as
                // 0 or 1, a dict by an equal string key); else any of
                // what the container holds.
                let (seq, key) = (heap.sequence(arg(0)), arg(1));
                let index = match key {
                    Value::Int(i) => Some(i),
                    Value::Bool(b) => Some(i64::from(b)),
                    _ => None,
                };
                if let (Some(seq), Some(i)) = (seq, index) {
                    let len = i64::try_from(seq.len()).unwrap_or(i64::MAX);
                    let at = if i < 0 { i.saturating_add(len) } else { i };
                    if let Some(&item) = usize::try_from(at).ok().and_then(|at| seq.get(at)) {
                        return Ok(item);
                    }
                }
                if let (Some(d), Some(k)) = (heap.dict(arg(0)), heap.text(key)) {
                    let found = d
                        .entries()
                        .iter()
                        .find(|&&(dk, _)| heap.text(dk) == Some(k));
                    if let Some(&(_, item)) = found {
                        return Ok(item);
                    }
                }
                self.any_of(heap, &[arg(0)])
            }
            // `getattr(torch._C._VariableFunctionsClass, "tanh")`: how torch
            // pickles its native functions (`torch.tanh`): that function,
            // judged as `torch.<name>` is.
            Some(Origin::Global(g))
                if self.path_of(callable) == Some(("builtins", "getattr"))
                    && items.len() == 2
                    && self.path_of(arg(0)) == Some(("torch._C", "_VariableFunctionsClass"))
                    && heap.text(arg(1)).is_some_and(|n| {
                        !n.is_empty()
                            && !n.starts_with('_')
                            && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    }) =>
            {
                self.instance_getattr.insert(g);
                if let Some(class) = self.global_index(arg(0)) {
                    if let Some(u) = self.globals.get_mut(class) {
                        u.class = GlobalClass::Data;
                    }
                }
                let name = heap.text(arg(1)).unwrap_or_default().to_owned();
                let offset = self.globals.get(g).map_or(0, |u| u.offset);
                self.global(heap, "torch", &name, offset)
            }
            // `getattr(zoneinfo.ZoneInfo, "_unpickle")`: how a zone pickles;
            // the classmethod, data as its class is.
            Some(Origin::Global(g))
                if self.path_of(callable) == Some(("builtins", "getattr"))
                    && items.len() == 2
                    && matches!(
                        self.path_of(arg(0)),
                        Some(("zoneinfo" | "zoneinfo._zoneinfo", "ZoneInfo"))
                    )
                    && heap.text(arg(1)) == Some("_unpickle") =>
            {
                self.instance_getattr.insert(g);
                let (module, offset) = match (self.path_of(arg(0)), self.globals.get(g)) {
                    (Some((m, _)), Some(u)) => (m.to_owned(), u.offset),
                    _ => ("zoneinfo".to_owned(), 0),
                };
                self.global(heap, &module, "ZoneInfo._unpickle", offset)
            }
            // `getattr(instance, "name")`: a bound method or an attribute
            // of an instance the pickle made (torch pickles a module's
            // hook so), not a reach into a module; calling the result
            // calls what the instance's class holds.
            Some(Origin::Global(g))
                if self.path_of(callable) == Some(("builtins", "getattr"))
                    && items.len() == 2
                    && matches!(self.origin(arg(0)), Some(Origin::Made(_)))
                    && heap
                        .str(arg(1))
                        .is_some_and(|n| !n.starts_with("__") && !n.contains('.')) =>
            {
                self.instance_getattr.insert(g);
                let o = self.origin(arg(0));
                let method = self.inert(heap, o)?;
                if let (Value::Obj(id), Some(Origin::Made(class)), Some(name)) =
                    (method, o, heap.text(arg(1)))
                {
                    self.method_global(class, name);
                    self.bound.insert(id, (class, name.to_owned()));
                }
                // The method runs with what its instance holds at hand.
                self.hold(method, arg(0));
                Ok(method)
            }
            Some(Origin::Global(g)) => {
                // Any callable given `(name, bases, namespace)` makes a
                // class as `type` does (a metaclass: `abc.ABCMeta`,
                // typing's).
                if let Some(namespace) = class_args(heap, &items) {
                    self.makes_class(heap, g, namespace)?;
                }
                let lookup = items.len() == 1 && enum_value(heap, arg(0));
                let before = self.lookups.get(&g).copied();
                self.mark(Some(g), Usage::Called);
                if lookup && before != Some(false) {
                    self.lookups.insert(g, true);
                }
                // A callable the scanner does not know, given functions or
                // classes (or wrappers of them): it may call them (a
                // worker's initializer, a cleanup, a `nodetype`, a mapped
                // function).
                let unknown = self
                    .globals
                    .get(g)
                    .is_some_and(|u| u.class == GlobalClass::Unknown);
                if unknown {
                    for c in self.callables_among(heap, &items)? {
                        self.calls(heap, c)?;
                    }
                }
                // Whatever the callable is, the objects the pickle made
                // that it is given have their methods run by it; torch's
                // own functions (rebuilds, storages, OrderedDict) only
                // those given to them directly (a rebuild sets what a
                // state dict holds as attributes, calling none of it).
                let torch_own = self
                    .globals
                    .get(g)
                    .is_some_and(|u| u.class == GlobalClass::Tensor);
                if torch_own {
                    let mut direct: Vec<Value> = items
                        .iter()
                        .copied()
                        .filter(|&v| matches!(self.origin(v), Some(Origin::Made(_))))
                        .collect();
                    // Members of sequences and keys of dicts it is given
                    // are iterated, hashed or converted (a size's
                    // `__index__`, a Counter's or an OrderedDict's keys,
                    // a quantizer's parameters); values a state dict sets
                    // as attributes are not.
                    let mut named = Vec::new();
                    direct.extend(self.made_members(heap, &items, &mut named)?);
                    let path = self
                        .path_of(callable)
                        .map(|(m, n)| (m.to_owned(), n.to_owned()));
                    let path = path.as_ref().map(|(m, n)| (m.as_str(), n.as_str()));
                    // `set_tensor_metadata` reads each value as a bool.
                    if path == Some(("torch._utils", "_rebuild_tensor_v2")) {
                        if let Some(d) = heap.dict(arg(6)) {
                            direct.extend(d.entries().iter().map(|&(_, v)| v));
                        }
                    }
                    // Objects a library holds, named: given directly, or
                    // one level inside what is given.
                    self.library_methods_run(&direct);
                    self.library_methods_run(&items);
                    self.library_methods_run(&named);
                    self.used_iterated(heap, &direct)?;
                    // `_rebuild_from_type_v2(func, type, args, state)` calls
                    // `func(*args)`: what `args` holds is `func`'s
                    // arguments, the values of a dict among them too
                    // (`_rebuild_njt(kwargs)` builds a `NestedTensor` whose
                    // `__init__` calls `kwargs["_metadata_cache"].get`).
                    if matches!(
                        path,
                        Some((
                            "torch._tensor" | "torch._utils",
                            "_rebuild_from_type_v2" | "_rebuild_from_type"
                        ))
                    ) {
                        // A rebuild given to a rebuild as its `func` calls
                        // its own `func(*args)` in turn: followed a few
                        // levels, without recursion. `args` may be a list.
                        let mut given = Vec::new();
                        let (mut func, mut args) = (arg(0), arg(2));
                        for _ in 0..8 {
                            let members = heap.sequence(args).unwrap_or_default();
                            heap.charge_work(members.len() as u64)?;
                            for &a in members {
                                given.push(a);
                                if let Some(d) = heap.dict(a) {
                                    heap.charge_work(d.entries().len() as u64)?;
                                    given.extend(d.entries().iter().map(|&(_, v)| v));
                                } else if let Some(seq) = heap.sequence(a) {
                                    heap.charge_work(seq.len() as u64)?;
                                    given.extend_from_slice(seq);
                                }
                            }
                            let nested = matches!(
                                self.path_of(func),
                                Some((
                                    "torch._tensor" | "torch._utils",
                                    "_rebuild_from_type_v2" | "_rebuild_from_type"
                                ))
                            );
                            if !nested {
                                break;
                            }
                            (func, args) = match members {
                                [f, _, a, ..] => (*f, *a),
                                _ => break,
                            };
                        }
                        given.retain(|&v| matches!(self.origin(v), Some(Origin::Made(_))));
                        self.used_iterated(heap, &given)?;
                    }
                    // `_set_obj_state(obj, state)`: the dict part of the
                    // state has its `items()` called.
                    if matches!(
                        path,
                        Some((
                            "torch._tensor" | "torch._utils",
                            "_rebuild_from_type_v2" | "_rebuild_parameter_with_state"
                        ))
                    ) {
                        let state = arg(3);
                        let dict_state = match heap.tuple(state) {
                            Some(&[first, _]) => first,
                            _ => state,
                        };
                        if matches!(self.origin(dict_state), Some(Origin::Made(_))) {
                            for v in self.held_by_name(heap, dict_state, &STATE_METHODS)? {
                                self.calls(heap, v)?;
                            }
                        }
                        // Each of its halves is set by `setattr` on a
                        // tensor subclass: a wrapper under a dunder or a
                        // `Tensor` method's name shadows what torch calls
                        // later (`Tensor.__setstate__` runs
                        // `self.set_(*state)`, BUILD finds `__setstate__` on
                        // the instance), and a property setter of the class
                        // runs with the value (NestedTensor's stores into
                        // `self._metadata_cache[...]`, an object the file
                        // made). Wrappers are called, objects the pickle
                        // made that are no plain mapping are used. A
                        // tensor's plain attributes (`tag`, `no_decay`) are
                        // data and call nothing.
                        let halves = match heap.tuple(state) {
                            Some(&[a, b]) => vec![a, b],
                            _ => vec![state],
                        };
                        let mut wrappers = Vec::new();
                        let mut objects = Vec::new();
                        for half in halves {
                            let Some(d) = heap.dict(half) else {
                                continue;
                            };
                            heap.charge_work(d.entries().len() as u64)?;
                            for &(k, v) in d.entries() {
                                let made = matches!(self.origin(v), Some(Origin::Made(_)));
                                let shadows = dunder(heap, k)
                                    || heap
                                        .text(k)
                                        .is_some_and(super::tensor_methods::tensor_method);
                                let wrapper =
                                    self.global_index(v).is_none() && (self.is_callable(v) || made);
                                if shadows && wrapper {
                                    wrappers.push(v);
                                } else if made && !self.plain_mapping(v) {
                                    objects.push(v);
                                }
                            }
                        }
                        for v in wrappers {
                            self.calls(heap, v)?;
                        }
                        // Tensors, parameters and buffers have no Python
                        // `__setattr__` or property of their own to run.
                        let plain_tensor = path
                            == Some(("torch._utils", "_rebuild_parameter_with_state"))
                            || matches!(
                                self.path_of(arg(1)),
                                Some((
                                    "torch" | "torch._tensor" | "torch.nn.parameter",
                                    "Tensor" | "Parameter" | "Buffer"
                                ))
                            );
                        if !plain_tensor {
                            self.used_unargued(heap, &objects)?;
                        }
                    }
                } else {
                    // A known-safe callable (a builtin that iterates,
                    // converts or compares) runs the methods of the
                    // objects it is given.
                    let known = self
                        .globals
                        .get(g)
                        .is_some_and(|u| u.class == GlobalClass::Data);
                    if known {
                        let direct: Vec<Value> = items
                            .iter()
                            .copied()
                            .filter(|&v| matches!(self.origin(v), Some(Origin::Made(_))))
                            .collect();
                        self.library_methods_run(&direct);
                        // copyreg's helpers are given classes to make.
                        if !matches!(self.path_of(callable), Some(("copyreg" | "copy_reg", _))) {
                            self.library_methods_run_within(heap, &items)?;
                        }
                    }
                    self.used(heap, &items)?;
                }
                // What comes out: an instance of the class a constructor is
                // given (so that calling it, or its `__new__`, counts against
                // that class), else something the callable made.
                let mut made = g;
                // Calls that call or instantiate what they are given.
                match self.path_of(callable) {
                    Some(("torch._tensor", "_rebuild_from_type_v2")) => {
                        let (func, new_type) = (arg(0), arg(1));
                        self.calls(heap, func)?;
                        self.mark(self.global_index(new_type), Usage::Instantiated);
                        made = self.global_index(new_type).unwrap_or(g);
                    }
                    Some(("copyreg" | "copy_reg", "_reconstructor")) => {
                        let (cls, base) = (arg(0), arg(1));
                        self.mark(self.global_index(cls), Usage::Instantiated);
                        made = self.global_index(cls).unwrap_or(g);
                        let plain_object = self.path_of(base) == Some(("builtins", "object"));
                        if !plain_object {
                            self.calls(heap, base)?;
                        }
                    }
                    Some(("copyreg" | "copy_reg", "__newobj__" | "__newobj_ex__"))
                    | Some(("torch._utils", "_rebuild_wrapper_subclass")) => {
                        self.mark(self.global_index(arg(0)), Usage::Instantiated);
                        made = self.global_index(arg(0)).unwrap_or(g);
                        // `cls.__new__(cls, *args)`: what NEWOBJ of `cls`
                        // does with them.
                        let rest = items.get(1..).unwrap_or_default().to_vec();
                        self.new_with(heap, arg(0), &rest)?;
                    }
                    // A masked array: its class and its base class are
                    // instantiated (`__new__`).
                    Some(("numpy.ma.core", "_mareconstruct")) => {
                        self.mark(self.global_index(arg(1)), Usage::Instantiated);
                        self.mark(self.global_index(arg(0)), Usage::Instantiated);
                        made = self.global_index(arg(0)).unwrap_or(g);
                    }
                    // numpy's generator constructors call the bit generator
                    // class (or constructor) they are given.
                    Some((
                        "numpy.random._pickle",
                        "__randomstate_ctor" | "__generator_ctor" | "__bit_generator_ctor",
                    )) => {
                        self.calls(heap, arg(0))?;
                        self.calls(heap, arg(1))?;
                    }
                    // TorchScript's wrappers return their argument: whatever
                    // it is, it comes out as itself.
                    Some((
                        "torch.jit._pickle",
                        "build_tensorlist" | "build_intlist" | "build_doublelist"
                        | "build_boollist" | "restore_type_tag",
                    )) => return Ok(arg(0)),
                    // Builtins that call what they are given (map, filter,
                    // iter with a sentinel) or hand back one of their
                    // arguments or its members (next, min, max, ...): the
                    // callable is called, and what comes out keeps the
                    // origin of what went in.
                    Some(("builtins" | "__builtin__", name)) => {
                        let calls_first = matches!(name, "map" | "filter")
                            || (name == "iter" && items.len() == 2);
                        let makes_class = name == "type" && items.len() == 3;
                        // `dict(...)` hands back a new mapping, none of
                        // what it was given.
                        let makes_dict = name == "dict";
                        // `type(x)`: the class of what the pickle made, a
                        // module's own class (a BUILD on it patches it).
                        if name == "type" && items.len() == 1 {
                            if let Some(Origin::Made(c)) = self.origin(arg(0)) {
                                return self.inert(heap, Some(Origin::Global(c)));
                            }
                        }
                        if calls_first {
                            self.calls(heap, arg(0))?;
                        }
                        // `type(name, bases, namespace)` makes a class whose
                        // methods are what the file put in the namespace;
                        // Python calls its dunders itself (`__setstate__`
                        // on BUILD, `__lt__` in `sorted`, `__format__`,
                        // `__hash__`...): a gadget, each value called.
                        // (`type(x)`, one argument, as `type(None)` pickles,
                        // is not.)
                        if makes_class {
                            self.makes_class(heap, g, arg(2))?;
                        }
                        // What comes out may be any of what went in (the
                        // last of a reversed list, a `next` default, an
                        // item two levels down): calling it calls each.
                        if !makes_dict
                            && (self.origin_within(heap, &items)?.is_some()
                                || !self.callables_within(heap, &items)?.is_empty())
                        {
                            // It keeps what it was given (`set([...])`'s
                            // members are returned with it, not freed).
                            let v = self.any_of(heap, &items)?;
                            if let Value::Obj(id) = v {
                                self.given.push((id, args));
                            }
                            return Ok(v);
                        }
                    }
                    _ => {}
                }
                let made_value = self.inert(heap, Some(Origin::Made(made)))?;
                if let Value::Obj(id) = made_value {
                    self.given.push((id, args));
                }
                // What a class the scanner does not know was given: its
                // methods may call it later. What a mapping was made of
                // (`dict([...])`, `OrderedDict([...])`): its items, which a
                // BUILD given it as state sets.
                if self.unknown_or_mapping(made) && !items.is_empty() {
                    self.hold(made_value, args);
                }
                Ok(made_value)
            }
            // Calling an instance runs its class's `__call__` (a partial's
            // function), a bound method that method: given functions, it
            // may call them, and it runs the methods of objects it is
            // given (`Pattern.sub` calls a callable replacement).
            Some(Origin::Made(g)) => {
                self.calls(heap, callable)?;
                for c in self.callables_among(heap, &items)? {
                    self.calls(heap, c)?;
                }
                self.used(heap, &items)?;
                self.inert(heap, Some(Origin::Made(g)))
            }
            None => {
                self.used(heap, &items)?;
                self.inert(heap, None)
            }
        }
    }

    fn new_object(&mut self, heap: &mut Heap, cls: Value, args: Value) -> Result<Value> {
        match self.origin(cls) {
            Some(Origin::Global(g)) => {
                self.mark(Some(g), Usage::Instantiated);
                let items = heap.tuple(args).map_or_else(Vec::new, <[Value]>::to_vec);
                self.new_with(heap, cls, &items)?;
                let made = self.inert(heap, Some(Origin::Made(g)))?;
                // `partial.__new__(partial, func, ...)` holds `func`.
                if self.path_of(cls) == Some(("functools", "partial")) {
                    let func = heap.tuple(args).and_then(|a| a.first().copied());
                    self.wrap(made, func.unwrap_or(Value::None));
                }
                self.hold(made, args);
                Ok(made)
            }
            // `instance.__new__`: whatever made the instance runs again.
            Some(Origin::Made(g)) => {
                self.calls(heap, cls)?;
                self.inert(heap, Some(Origin::Made(g)))
            }
            None => self.inert(heap, None),
        }
    }

    fn instantiate(&mut self, heap: &mut Heap, cls: Value, args: Value) -> Result<Value> {
        // OBJ and INST call `cls(*args)`: its `__init__` runs, or the
        // function.
        self.call(heap, cls, args)
    }

    fn build(&mut self, heap: &mut Heap, obj: Value, state: Value) -> Result<()> {
        // BUILD looks `__setstate__` up on the instance: an attribute an
        // earlier BUILD set, or an item its class's `__getattr__` answers
        // with (a dict subclass, a `UserDict`, a module's `_modules`).
        if let Some(Origin::Made(g)) = self.origin(obj) {
            let found = self.held_by_name(heap, obj, &["__setstate__"])?;
            if !found.is_empty() {
                if let Some(u) = self.globals.get_mut(g) {
                    u.class = GlobalClass::Dangerous(Danger::Gadget);
                }
            }
            for v in found {
                self.calls(heap, v)?;
            }
        }
        // A second BUILD on an object: its class's `__setstate__` runs
        // (or the dict is updated again), and what the first put in the
        // instance's dict shadows the class's methods that code calls
        // (`DataNormSparsifier.__setstate__` calls `self._convert_mask`):
        // the wrappers an earlier state held are called.
        if let (Value::Obj(id), Some(Origin::Made(_))) = (obj, self.origin(obj)) {
            if !self.built.insert(id) {
                let earlier = self.held.get(&id).cloned().unwrap_or_default();
                for c in self.callables_within(heap, &earlier)? {
                    if self.global_index(c).is_none() {
                        self.calls(heap, c)?;
                    }
                }
            }
        }
        self.hold(obj, state);
        self.note_methods(heap, obj, state)?;
        match self.origin(obj) {
            // BUILD fills the instance: its class's `__setstate__` (code
            // of the class, not of the file) or its `__dict__`. A partial
            // takes its function from the state. A dunder attribute set
            // here (`__setstate__`, `__reduce__`...) changes what a later
            // BUILD or call runs: a gadget, and its value is called. Not
            // for TorchScript's own classes (`__torch__.*`): TorchScript's
            // loader sets their attributes as slots of the compiled type,
            // calling nothing (TorchScript 1.x wrote `__constants__` and
            // `__overloads__` there), and no Python module of that name
            // exists for Python's unpickler to build them from.
            Some(Origin::Made(g)) => {
                self.mark(Some(g), Usage::Instantiated);
                let torchscript = self
                    .globals
                    .get(g)
                    .is_some_and(|u| u.module == "__torch__" || u.module.starts_with("__torch__."));
                let parts = match heap.tuple(state) {
                    Some(items) => items.to_vec(),
                    None => vec![state],
                };
                heap.charge_work(parts.len() as u64)?;
                if self
                    .globals
                    .get(g)
                    .is_some_and(|u| wrapper_class(&u.module, &u.name))
                {
                    if let Some(&func) = parts.first() {
                        self.wrap(obj, func);
                    }
                }
                let pair_or_single = heap.tuple(state).is_none_or(|t| t.len() == 2);
                let optimizer = self
                    .globals
                    .get(g)
                    .is_some_and(|u| torch_optimizer(&u.module, &u.name));
                let mut smuggled = Vec::new();
                let mut run_on = Vec::new();
                let mut setattr_on = false;
                let mut calls_on_state = Vec::new();
                // Objects the class's code (or torch's) consults as data:
                // a state that is an object (`UUID.__setstate__` reads
                // `state['int']`), what a module's `__setattr__` probes.
                let mut consulted = Vec::new();
                let mut dict_values = Vec::new();
                let pair = heap.tuple(state).is_some_and(|t| t.len() == 2);
                for (n, part) in parts.into_iter().enumerate().filter(|_| !torchscript) {
                    // The second of a pair is set attribute by attribute
                    // (`setattr`), the first into the instance's dict.
                    let by_setattr = pair && n == 1;
                    let Some(dict) = heap.dict(part) else {
                        // A state that is a mapping made by a call
                        // (`dict([...])`, `OrderedDict(...)`, a class the
                        // scanner does not know): the names it sets are not
                        // known, so any callable in it may be what a dunder
                        // or a method now is.
                        // BUILD splits only a pair into state and slot
                        // state; any other tuple goes to `__setstate__`.
                        if pair_or_single {
                            smuggled.extend(self.smuggled_by(heap, part)?);
                        }
                        // An object the pickle made, as state: BUILD calls
                        // its `items()`, a class's `__setstate__` its
                        // mapping methods (`get`, `keys`...): an attribute
                        // of it by such a name is what runs.
                        if matches!(self.origin(part), Some(Origin::Made(_))) {
                            calls_on_state.extend(self.held_by_name(heap, part, &STATE_METHODS)?);
                        }
                        // A state that is an object (made, or named from
                        // a library) is read as a mapping.
                        consulted.push(part);
                        continue;
                    };
                    heap.charge_work(dict.entries().len() as u64)?;
                    // A slot state is set by `setattr`: the class's own
                    // `__setattr__` runs for each, with the name and value
                    // the file chose (transformers' `ModelOutput` calls a
                    // method of itself first).
                    if by_setattr && !dict.entries().is_empty() {
                        setattr_on = true;
                    }
                    dict_values.extend(dict.entries().iter().map(|&(_, v)| v));
                    for &(k, v) in dict.entries() {
                        // A wrapper stored under the name of a method torch's
                        // own code calls on the instance (`Module` re-adding
                        // hooks calls `register_parameter`, an optimizer's
                        // `__setstate__` `_patch_step_function`): the
                        // instance's attribute is what runs.
                        let shadows_method = heap
                            .text(k)
                            .is_some_and(|k| TORCH_BASE_METHODS.binary_search(&k).is_ok())
                            && self.global_index(v).is_none()
                            && (self.is_callable(v)
                                || matches!(self.origin(v), Some(Origin::Made(_))));
                        if shadows(heap, k, by_setattr) || shadows_method {
                            smuggled.push(v);
                        } else if dunder(heap, k) {
                            // Another dunder (pydantic's
                            // `__pydantic_fields_set__`): data the class's
                            // code reads, its methods run.
                            run_on.push(v);
                        }
                    }
                    // A module's `__setstate__` fills in the hook dicts a
                    // state lacks through `Module.__setattr__`, which asks
                    // `name in self._parameters` (then `_buffers`,
                    // `_modules`): an object there that is no plain
                    // mapping runs its `__contains__`.
                    for &(k, v) in dict.entries() {
                        let probed =
                            matches!(heap.text(k), Some("_parameters" | "_buffers" | "_modules"));
                        if probed && !self.plain_mapping(v) {
                            run_on.push(v);
                            consulted.push(v);
                        }
                    }
                    // An optimizer's `__setstate__` (torch's code) calls
                    // methods of what its state holds: `setdefault` of
                    // `defaults` and of each of `param_groups`, `get` and
                    // `values` of `state`.
                    if optimizer {
                        run_on.extend(
                            dict.entries()
                                .iter()
                                .filter(|(k, _)| {
                                    matches!(
                                        heap.text(*k),
                                        Some("defaults" | "param_groups" | "state")
                                    )
                                })
                                .map(|&(_, v)| v),
                        );
                    }
                }
                self.used(heap, &run_on)?;
                if setattr_on {
                    self.used_unargued(heap, &[obj])?;
                    // A library class's own `__setattr__` runs for each
                    // slot, and may consult what the dict state just put
                    // in the instance (`PretrainedConfig` looks names up in
                    // its `attribute_map`).
                    if self.is_library(g) {
                        consulted.extend(dict_values.iter().copied());
                    }
                }
                heap.charge_work(consulted.len() as u64)?;
                self.library_methods_run(&consulted);
                // A state that is a tuple but no pair goes whole to the
                // class's `__setstate__`, which reads its members
                // (numpy's converts a shape's with `__index__`,
                // `Random.setstate` indexes them): they are used.
                if !pair_or_single && !torchscript {
                    let members = self.made_in_tuples(heap, state)?;
                    self.used_unargued(heap, &members)?;
                }
                // A `defaultdict`'s factory set by a slot state.
                if self.path_of_global(g) == Some(("collections", "defaultdict")) {
                    for c in self.callables_within(heap, &[state])? {
                        self.calls(heap, c)?;
                    }
                }
                for v in calls_on_state {
                    self.calls(heap, v)?;
                }
                if !smuggled.is_empty() {
                    if let Some(u) = self.globals.get_mut(g) {
                        u.class = GlobalClass::Dangerous(Danger::Gadget);
                    }
                }
                for v in smuggled {
                    self.calls(heap, v)?;
                }
            }
            // BUILD on a module, class or function itself sets its
            // attributes: whatever is looked up there later (a rebuild
            // function, a method) can be replaced. Dangerous whatever it is.
            Some(Origin::Global(g)) => {
                if let Some(g) = self.globals.get_mut(g) {
                    g.class = GlobalClass::Dangerous(Danger::Gadget);
                }
            }
            None => {}
        }
        Ok(())
    }

    fn dynamic_global(
        &mut self,
        heap: &mut Heap,
        module: Value,
        name: Value,
        offset: u64,
    ) -> Result<Value> {
        // A global named by values computed while unpickling (the result
        // of another global, which BUILD may have turned into a string):
        // nothing here can say what it will resolve to.
        let computed = |r: &Recorder, v: Value| match r.origin(v) {
            Some(Origin::Global(i) | Origin::Made(i)) => r
                .globals
                .get(i)
                .map(|g| format!("<computed from {}.{}>", g.module, g.name)),
            None => None,
        };
        // The scanner keeps protocol-0/1 strings as bytes; torch.load
        // decodes them as UTF-8, so such operands are plain names.
        let text = |v: Value| {
            heap.str(v).map(str::to_owned).or_else(|| {
                heap.bytes(v)
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .map(str::to_owned)
            })
        };
        if let (Some(m), Some(n)) = (text(module), text(name)) {
            return self.global(heap, &m, &n, offset);
        }
        // Operands that are neither text nor traceable to a global (a value
        // a persistent id or a call handed back) may be strings by then.
        let unknown = || "<computed>".to_owned();
        let m = text(module)
            .or_else(|| computed(self, module))
            .unwrap_or_else(unknown);
        let n = text(name)
            .or_else(|| computed(self, name))
            .unwrap_or_else(unknown);
        let v = self.global(heap, &m, &n, offset)?;
        if let Some(i) = self.global_index(v) {
            if let Some(g) = self.globals.get_mut(i) {
                g.class = GlobalClass::Dangerous(Danger::Gadget);
            }
        }
        Ok(v)
    }

    fn method_call(
        &mut self,
        heap: &mut Heap,
        target: Value,
        methods: &[&str],
        values: &[Value],
    ) -> Result<()> {
        match self.origin(target) {
            // An item or element put into a module's own object (a
            // registry, a cache, a list of hooks): the interpreter's state
            // changed, and whatever was put there is called by the code
            // that reads it.
            Some(Origin::Global(g)) => {
                if let Some(u) = self.globals.get_mut(g) {
                    u.class = GlobalClass::Dangerous(Danger::StateChange);
                }
                for &v in values {
                    self.calls(heap, v)?;
                    for c in self.held_callables(heap, v)? {
                        self.calls(heap, c)?;
                    }
                }
            }
            Some(Origin::Made(g)) => {
                // `extend` and `append` are looked up on the instance: an
                // attribute BUILD set, or what the class's `__getattr__`
                // answers with, is what Python calls. (`__setitem__` goes
                // through the type.)
                let by_name: Vec<&str> = methods
                    .iter()
                    .copied()
                    .filter(|m| !m.starts_with("__"))
                    .collect();
                let mut called = if by_name.is_empty() {
                    Vec::new()
                } else {
                    self.held_by_name(heap, target, &by_name)?
                };
                if let Value::Obj(id) = target {
                    if let Some(attrs) = self.methods.get(&id) {
                        called.extend(
                            attrs
                                .iter()
                                .filter(|(k, _)| by_name.contains(&k.as_str()))
                                .map(|&(_, v)| v),
                        );
                    }
                }
                for v in called {
                    self.calls(heap, v)?;
                }
                // A class the scanner does not know runs its own method,
                // with everything the object holds at hand, however deep
                // (a module whose `forward` is another's).
                if !self.plain(g) {
                    self.used(heap, &[target])?;
                }
                // SETITEM(S) on a mapping a call made (`OrderedDict()`,
                // `Counter()`, `dict()`) hashes and compares each key, as a
                // pickle dict's keys are: an object among them runs its
                // `__hash__` and `__eq__`.
                if methods.contains(&"__setitem__") {
                    let keys: Vec<Value> = values.iter().step_by(2).copied().collect();
                    heap.charge_work(keys.len() as u64)?;
                    self.used_unargued(heap, &keys)?;
                }
                // What the values go into, when it is no container that
                // stores them as they are: a `bytearray` or an array
                // converts each (`__index__`, `__int__`, `__float__`); a
                // class the scanner does not know is handed them.
                if !self.stores_as_given(g) {
                    let given: Vec<Value> = if methods.contains(&"__setitem__") {
                        values.iter().skip(1).step_by(2).copied().collect()
                    } else {
                        values.to_vec()
                    };
                    heap.charge_work(given.len() as u64)?;
                    if self.plain(g) {
                        self.used_unargued(heap, &given)?;
                    } else {
                        self.used(heap, &given)?;
                    }
                }
            }
            None => {}
        }
        Ok(())
    }

    fn extension(&mut self, heap: &mut Heap, code: u32, offset: u64) -> Result<Value> {
        // Whatever `copyreg`'s extension registry holds for the code when
        // the file is loaded: nothing in the file says what that is (an
        // earlier part of it may have registered it).
        let v = self.global(
            heap,
            "copyreg",
            &format!("_inverted_registry[{code}]"),
            offset,
        )?;
        if let Some(g) = self.global_index(v).and_then(|i| self.globals.get_mut(i)) {
            g.class = GlobalClass::Dangerous(Danger::Gadget);
        }
        Ok(v)
    }

    fn persistent_load(&mut self, heap: &mut Heap, pid: Value) -> Result<Value> {
        // torch's zip persistent_load builds storages from the id (the
        // storage type is only named); its legacy one returns the id's
        // second item for a `module` id, and the tar loader its first item:
        // a global carried in an id comes back as itself.
        // An id that is no tuple carries nothing.
        let items = heap.tuple(pid).map_or_else(Vec::new, <[Value]>::to_vec);
        heap.charge_work(items.len() as u64)?;
        // torch compares the location with strings and formats the key
        // into a record name: an object among the fields runs its methods;
        // the tar loader converts an id that is no tuple (`int(saved_id)`).
        self.used(heap, &items)?;
        // torch reads the storage type's `dtype`, formats the key: an
        // object of a library class there runs its methods.
        self.library_methods_run(&items);
        if items.is_empty() {
            self.used(heap, &[pid])?;
        }
        self.container_source(heap, &items);
        if let Some(&v) = items.iter().find(|&&v| self.origin(v).is_some()) {
            return Ok(v);
        }
        self.inert(heap, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_method_names_are_sorted_for_their_search() {
        assert!(TORCH_BASE_METHODS.windows(2).all(|w| w[0] < w[1]));
        assert!(TORCH_BASE_METHODS
            .binary_search(&"register_parameter")
            .is_ok());
    }

    /// A PAX record's value is what Python's tarfile (3.11) takes: up to
    /// the record's last byte, dropped whatever it is.
    #[test]
    fn pax_values_drop_the_last_byte_as_tarfile_does() {
        let one = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        assert_eq!(pax_records(b"15 path=pickle\n"), one("path", "pickle"));
        assert_eq!(pax_records(b"16 path=pickleX\n"), one("path", "pickleX"));
        // No newline at the end: its last byte goes all the same.
        assert_eq!(pax_records(b"15 path=pickleX"), one("path", "pickle"));
    }
}
