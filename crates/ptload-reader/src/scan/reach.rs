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

use hashbrown::HashSet;

use super::recorder::{Recorder, WALK_VISITS};
use super::report::{Ambiguity, Effect, GlobalUse, PickleSource, ScanReport, ScannedPickle, Usage};
use super::{classify, torchscript, Danger};
use crate::bytes::find;
use crate::container::zip::{self, Archive, Headers, Method, Rules};
use crate::error::Result;
use crate::limits::Limits;
use crate::pickle::{Heap, Obj, StringEncoding, Vm};
use crate::ranged::{fetch_more_until, Extents, Fetcher, FileView, RangeRead};
use crate::torch::dtype::DType;
use crate::torch::plain::KeptPlain;

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
        last: LastResult::default(),
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
    /// What the last pickle read to its STOP returned, as torch's tar
    /// loader reads it (see [`Scanner::tar_records`]).
    last: LastResult,
}

/// Of the value the last pickle returned: the integer it is, and the
/// global that is its third member (a tar record's storage class); and
/// where the file's next unbuffered read starts when its STOP was inside
/// a FRAME (the frame's end).
#[derive(Default)]
struct LastResult {
    int: Option<i64>,
    third: Option<String>,
    frame_end: Option<usize>,
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
        self.last = match &outcome {
            Ok(out) => LastResult {
                int: match out.value {
                    crate::pickle::Value::Int(i) => Some(i),
                    crate::pickle::Value::Bool(b) => Some(i64::from(b)),
                    _ => None,
                },
                third: heap
                    .tuple(out.value)
                    .and_then(|t| t.get(2).copied())
                    .and_then(|v| recorder.global_name(v)),
                frame_end: out.frame_end,
            },
            Err(_) => LastResult::default(),
        };
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
            if let Some(frame_end) = self.last.frame_end.filter(|_| index < reached) {
                // CPython's C unpickler reads a frame by `peek` when the
                // file's buffer holds all of it (the next pickle then
                // starts after the STOP) and by `read` when it does not
                // (at the frame's end): which, torch's file decides.
                self.report.ambiguities.push(Ambiguity {
                    record: PickleSource::Stream {
                        index,
                        offset: offset as u64,
                    }
                    .to_string(),
                    offset: end as u64,
                    what: format!(
                        "the pickle stops {} bytes before the end of its FRAME: torch reads the \
                         next pickle from after the STOP or from the frame's end, as its file \
                         buffers",
                        frame_end - end
                    ),
                });
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
                let read = self.run(member, 0, source(), reachable, 0, base);
                if read.is_none() && reachable && self.report.pickles.len() < MAX_PICKLES {
                    self.report.ambiguities.push(Ambiguity {
                        record: m.name.clone(),
                        offset: target.start as u64,
                        what: "tar: torch unpickles this member, and the scanner could not read \
                               it to its end"
                            .into(),
                    });
                }
            } else {
                self.tar_records(member, &m.name, reachable, base);
            }
        }
    }

    /// The pickles of a tar layout's `storages` or `tensors` member, as
    /// torch reads them from the member extracted and opened unbuffered:
    /// a count, then per record a pickle of its arguments followed by raw
    /// bytes (a storage: `(key, location, storage_type)`, then an int64
    /// element count and the elements, sized by `storage_type`; a tensor:
    /// an int32 rank, 4 bytes, the sizes and strides and an int64
    /// offset), and after the storages a pickle of their views. A pickle
    /// whose STOP is inside a FRAME leaves the file at the frame's end
    /// (CPython's C unpickler read the whole frame from a file without
    /// `peek`). The raw bytes are stepped over, so a pickle behind them
    /// is read as torch reads it; where they cannot be (a storage class of
    /// unknown element size, a length past the member), or a pickle torch
    /// reads does not parse to its end, that is an ambiguity, and the rest
    /// is read from where pickles parse.
    fn tar_records(&mut self, member: &[u8], name: &str, reachable: bool, base: Option<u64>) {
        let source = || PickleSource::TarMember(name.to_owned());
        let mut offset = 0;
        // Pickles torch reads: the count, its records, the storages'
        // views; then none (what follows is scanned as not reached).
        let mut expected: Option<u64> = None;
        let mut reached = reachable;
        while self.report.pickles.len() < MAX_PICKLES {
            // Every pickle here is torch's own data: the count goes to
            // `range` (its `__index__`), a record's arguments are unpacked.
            self.result_used = reached;
            self.result_iterated = reached;
            let Some((stop, _)) = self.run(member, offset, source(), reached, 0, base) else {
                if reached && self.report.pickles.len() < MAX_PICKLES {
                    self.report.ambiguities.push(Ambiguity {
                        record: name.to_owned(),
                        offset: base.unwrap_or(0).saturating_add(offset as u64),
                        what: "tar: torch unpickles this pickle of the member, and the scanner \
                               could not read it to its end: what follows is not scanned"
                            .into(),
                    });
                }
                break;
            };
            let end = self.last.frame_end.unwrap_or(stop);
            if end <= offset {
                break;
            }
            let third = self.last.third.take();
            let record = match expected {
                // The count: records follow (a storages member's views
                // after them).
                None => {
                    let count = self
                        .last
                        .int
                        .and_then(|n| u64::try_from(n).ok())
                        .unwrap_or(0);
                    expected = Some(count.saturating_add(u64::from(name == "storages")));
                    false
                }
                Some(0) => {
                    reached = false;
                    false
                }
                Some(n) => {
                    expected = Some(n - 1);
                    // The last pickle of a storages member is the views.
                    reached && !(name == "storages" && n == 1)
                }
            };
            let raw = record.then(|| match name {
                "storages" => {
                    let count = read_i64(member, end);
                    third
                        .as_deref()
                        .and_then(|path| {
                            path.strip_prefix("torch.cuda.")
                                .or_else(|| path.strip_prefix("torch."))
                        })
                        .and_then(storage_element_size)
                        .zip(count)
                        .and_then(|(size, n)| u64::try_from(n).ok()?.checked_mul(size))
                        .and_then(|n| n.checked_add(8))
                }
                _ => {
                    let rank = read_i32(member, end).and_then(|r| u64::try_from(r).ok());
                    rank.and_then(|r| r.checked_mul(16)?.checked_add(16))
                }
            });
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

#[cfg(test)]
mod tests {
    use super::*;

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
