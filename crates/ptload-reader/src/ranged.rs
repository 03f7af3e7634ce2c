//! Files read by ranges: a remote object (HTTP, object storage) or any
//! storage an engine reaches through its own client.
//!
//! Parsing never sees a byte that was not fetched. It reads through a
//! `FileView`: the whole file (a map, a buffer), or the `Extents`
//! fetched so far. A read of a range that is not fetched answers `None`,
//! exactly as a read past the end of a file does, and notes the range as
//! missed; the parse then fails. The caller (`fetch_until`) fetches what
//! was missed (with its neighbourhood) and parses again from the start,
//! until a parse misses nothing: its result, success or error, is the
//! file's. Unfetched bytes are never zeros, never stale.
//!
//! An engine reads checkpoints from its own storage by implementing
//! [`RangeRead`]:
//!
//! ```
//! use std::sync::Arc;
//! use ptload_reader::ranged::RangeRead;
//! use ptload_reader::OpenOptions;
//!
//! /// Stands for an object store client: here, bytes in memory.
//! #[derive(Debug)]
//! struct Store(Vec<u8>);
//!
//! impl RangeRead for Store {
//!     fn len(&self) -> u64 {
//!         self.0.len() as u64
//!     }
//!     fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
//!         let (start, end) = (offset as usize, (offset + len) as usize);
//!         self.0.get(start..end).map(<[u8]>::to_vec).ok_or_else(|| {
//!             std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "past the end")
//!         })
//!     }
//!     fn name(&self) -> &str {
//!         "store://basic.pt"
//!     }
//! }
//!
//! # fn main() -> Result<(), ptload_reader::Error> {
//! let bytes = std::fs::read("../../fixtures/files/basic.pt").expect("fixture");
//! let ckpt = OpenOptions::new().open_ranged(Arc::new(Store(bytes)))?;
//! let weight = ckpt.tensor("0.weight").expect("a tensor");
//! assert_eq!(weight.to_vec::<f32>()?.len(), 32); // fetched when read
//! let (fetched, reads) = ckpt.fetched_bytes().expect("read by ranges");
//! assert!(fetched > 0 && reads > 0);
//! # Ok(())
//! # }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, ErrorKind, Result};

/// A file read by ranges: what an engine implements to open checkpoints
/// from its own storage (see
/// [`OpenOptions::open_ranged`](crate::OpenOptions::open_ranged)).
pub trait RangeRead: Send + Sync + std::fmt::Debug {
    /// The file's length in bytes, as known when it was opened.
    fn len(&self) -> u64;

    /// Whether the file is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Exactly `len` bytes at `offset`. The reader checks the length of
    /// what comes back and refuses anything else; an implementation
    /// should fail (naming the file and why) rather than answer short.
    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>>;

    /// Exactly `out.len()` bytes at `offset`, written into `out`: what a
    /// reader with a buffer of its own (a staging buffer on its way to a
    /// GPU) asks for, so that the bytes are not held twice. The default
    /// reads with [`read_at`](Self::read_at) and copies; implement it
    /// where the bytes can land in `out` directly.
    fn read_into(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let bytes = self.read_at(offset, out.len() as u64)?;
        if bytes.len() != out.len() {
            return Err(std::io::Error::other(format!(
                "asked for {} bytes at {offset}, received {}",
                out.len(),
                bytes.len()
            )));
        }
        out.copy_from_slice(&bytes);
        Ok(())
    }

    /// What to call the file in messages (its URL).
    fn name(&self) -> &str;
}

/// A local file read by positioned reads (`pread`), never mapped: for
/// network file systems, where a map's faults and readahead are slow or
/// stall, and for files that may shrink while read (an error, not
/// SIGBUS). See [`OpenOptions::positioned`](crate::OpenOptions::positioned).
#[derive(Debug)]
pub struct LocalFile {
    file: std::fs::File,
    len: u64,
    name: String,
}

impl LocalFile {
    /// Open `path`; its length is taken now.
    pub fn open(path: &std::path::Path) -> Result<LocalFile> {
        Ok(LocalFile::open_with_metadata(path)?.0)
    }

    /// [`open`](Self::open), with the file's metadata (which file it is).
    pub(crate) fn open_with_metadata(
        path: &std::path::Path,
    ) -> Result<(LocalFile, std::fs::Metadata)> {
        let name = path.display().to_string();
        let file =
            std::fs::File::open(path).map_err(|e| Error::io(format!("cannot open {name}"), e))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("cannot stat {name}"), e))?;
        if !meta.is_file() {
            return Err(Error::new(ErrorKind::Io, format!("{name} is not a file")));
        }
        Ok((
            LocalFile {
                file,
                len: meta.len(),
                name,
            },
            meta,
        ))
    }
}

impl RangeRead for LocalFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        let size = usize::try_from(len)
            .map_err(|_| std::io::Error::other(format!("{len} bytes do not fit in memory")))?;
        let mut out = Vec::new();
        out.try_reserve_exact(size)
            .map_err(|_| std::io::Error::other(format!("cannot hold {len} bytes in memory")))?;
        out.resize(size, 0);
        read_exact_at(&self.file, &mut out, offset)?;
        Ok(out)
    }

    fn read_into(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        read_exact_at(&self.file, out, offset)
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(unix)]
pub(crate) fn read_exact_at(
    file: &std::fs::File,
    buf: &mut [u8],
    offset: u64,
) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
pub(crate) fn read_exact_at(
    file: &std::fs::File,
    mut buf: &mut [u8],
    mut offset: u64,
) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

/// The schemes of object storage (feature `object-store`), as
/// `object_store` parses them.
const BUCKET_SCHEMES: [&str; 8] = ["s3", "s3a", "gs", "az", "adl", "azure", "abfs", "abfss"];

/// The scheme of `s` if it is a URL ptload reads (`http`, `https`, or an
/// object storage scheme), lower-cased.
pub(crate) fn scheme_of(s: &str) -> Option<String> {
    let (scheme, rest) = s.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let known = scheme == "http" || scheme == "https" || BUCKET_SCHEMES.contains(&scheme.as_str());
    (known && !rest.is_empty()).then_some(scheme)
}

/// Whether `s` is a URL ptload reads by ranges rather than a local path:
/// `http://`, `https://`, `s3://` (`s3a://`), `gs://`, `az://`
/// (`adl://`, `azure://`, `abfs://`, `abfss://`). It says so whether or
/// not the feature that reads the scheme is compiled in: opening one
/// that is not is an error saying which feature it needs.
///
/// ```
/// use ptload_reader::ranged::is_url;
/// assert!(is_url("s3://bucket/model.pt"));
/// assert!(is_url("HTTPS://example.com/model.pt"));
/// assert!(!is_url("model.pt"));
/// assert!(!is_url("ftp://example.com/model.pt"));
/// ```
pub fn is_url(s: &str) -> bool {
    scheme_of(s).is_some()
}

/// Bytes fetched past the start and end of what a parse missed: the
/// records torch writes next to each other (`data.pkl`, `byteorder`,
/// `version`) come in one request.
const NEIGHBOURHOOD: u64 = 64 * 1024;

/// The neighbourhood when a round missed more than [`FEW_MISSES`] ranges:
/// then they are scattered headers (a zip's local headers, one before
/// each storage), each a few dozen bytes; 64 KiB around each would fetch
/// 128 KiB per tensor.
const SCATTERED_NEIGHBOURHOOD: u64 = 4 * 1024;
const FEW_MISSES: usize = 2;

/// The head and the tail fetched first: detection reads the first bytes,
/// the zip directory's end record lies in the last 64 KiB + 22.
const FIRST_FETCH: u64 = 128 * 1024;

/// Parses tried before giving up: each round fetches every range the
/// previous one missed.
const MAX_ROUNDS: usize = 64;

/// Ranges closer than this are fetched in one request.
pub(crate) const COALESCE_GAP: u64 = 64 * 1024;

/// A [`RangeRead`] with what it has fetched counted, and every answer's
/// length checked.
#[derive(Debug)]
pub(crate) struct Fetcher {
    reader: Arc<dyn RangeRead>,
    bytes: AtomicU64,
    requests: AtomicU64,
}

impl Fetcher {
    pub(crate) fn new(reader: Arc<dyn RangeRead>) -> Fetcher {
        Fetcher {
            reader,
            bytes: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.reader.len()
    }

    pub(crate) fn name(&self) -> &str {
        self.reader.name()
    }

    /// Bytes received so far.
    pub(crate) fn bytes_read(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Reads made so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Refuse a range past the file's end; count the request.
    fn start_request(&self, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{}: range of {len} bytes at {offset} lies past its end ({} bytes)",
                    self.reader.name(),
                    self.len()
                ),
            ));
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// `len` bytes at `offset`, within the file, exactly.
    pub(crate) fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let name = self.reader.name();
        self.start_request(offset, len)?;
        let bytes = self.reader.read_at(offset, len).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("cannot read {len} bytes at {offset} of {name}: {e}"),
            )
        })?;
        self.bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if bytes.len() as u64 != len {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{name}: asked for {len} bytes at {offset}, received {}",
                    bytes.len()
                ),
            ));
        }
        Ok(bytes)
    }

    /// `out.len()` bytes at `offset`, within the file, read into `out`.
    pub(crate) fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let name = self.reader.name();
        let len = out.len() as u64;
        self.start_request(offset, len)?;
        self.reader.read_into(offset, out).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("cannot read {len} bytes at {offset} of {name}: {e}"),
            )
        })?;
        self.bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }
}

/// The parts of a file fetched so far, and what parsing asked for that
/// is not among them.
#[derive(Debug)]
pub(crate) struct Extents {
    len: u64,
    /// Sorted by offset, disjoint and not touching.
    runs: Vec<(u64, Vec<u8>)>,
    missed: Mutex<Vec<(u64, u64)>>,
}

impl Extents {
    pub(crate) fn new(len: u64) -> Extents {
        Extents {
            len,
            runs: Vec::new(),
            missed: Mutex::new(Vec::new()),
        }
    }

    /// A copy of what is held, with nothing missed.
    #[cfg(feature = "scan")]
    pub(crate) fn copy(&self) -> Extents {
        Extents {
            len: self.len,
            runs: self.runs.clone(),
            missed: Mutex::new(Vec::new()),
        }
    }

    /// The bytes `start..end`, if one fetched run holds them all.
    fn find(&self, start: u64, end: u64) -> Option<&[u8]> {
        let i = self.runs.partition_point(|(o, _)| *o <= start);
        let (offset, bytes) = self.runs.get(i.checked_sub(1)?)?;
        let from = usize::try_from(start - offset).ok()?;
        let to = usize::try_from(end - offset).ok()?;
        bytes.get(from..to)
    }

    fn miss(&self, start: u64, end: u64) {
        if let Ok(mut missed) = self.missed.lock() {
            missed.push((start, end));
        }
    }

    fn take_missed(&self) -> Vec<(u64, u64)> {
        self.missed
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default()
    }

    /// The parts of `start..end` not fetched yet.
    fn holes(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = start;
        for (offset, bytes) in &self.runs {
            let run_end = offset + bytes.len() as u64;
            if run_end <= at {
                continue;
            }
            if *offset >= end {
                break;
            }
            if *offset > at {
                out.push((at, *offset));
            }
            at = run_end;
            if at >= end {
                break;
            }
        }
        if at < end {
            out.push((at, end));
        }
        out
    }

    /// Add the bytes fetched at `offset` (a hole: no run overlaps it),
    /// joining the runs it touches.
    fn insert(&mut self, offset: u64, bytes: Vec<u8>) {
        let end = offset + bytes.len() as u64;
        let i = self.runs.partition_point(|(o, _)| *o < offset);
        self.runs.insert(i, (offset, bytes));
        // Join with the next run if it starts where this one ends.
        if let Some((next_offset, _)) = self.runs.get(i + 1) {
            if *next_offset == end {
                let (_, next) = self.runs.remove(i + 1);
                if let Some((_, this)) = self.runs.get_mut(i) {
                    this.extend_from_slice(&next);
                }
            }
        }
        // Join with the previous run if it ends where this one starts.
        if let Some(prev) = i.checked_sub(1) {
            let touches = self
                .runs
                .get(prev)
                .is_some_and(|(o, b)| o + b.len() as u64 == offset);
            if touches {
                let (_, this) = self.runs.remove(i);
                if let Some((_, before)) = self.runs.get_mut(prev) {
                    before.extend_from_slice(&this);
                }
            }
        }
    }

    /// Fetch `ranges` (merged when closer than [`COALESCE_GAP`]), only the
    /// parts not held yet, charging every byte to `budget`.
    fn fetch(&mut self, fetcher: &Fetcher, ranges: &[(u64, u64)], budget: &mut u64) -> Result<()> {
        let mut wanted: Vec<(u64, u64)> = ranges
            .iter()
            .map(|&(a, b)| (a.min(self.len), b.min(self.len)))
            .filter(|(a, b)| a < b)
            .collect();
        wanted.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (a, b) in wanted {
            match merged.last_mut() {
                Some(last) if a <= last.1.saturating_add(COALESCE_GAP) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        let holes: Vec<(u64, u64)> = merged.iter().flat_map(|&(a, b)| self.holes(a, b)).collect();
        let total: u64 = holes.iter().map(|(a, b)| b - a).sum();
        if total > *budget {
            return Err(Error::limit("max_open_fetch_bytes", *budget).with_note(
                format!(
                    "reading {} by ranges needs {total} more bytes before any tensor is \
                         read; download it, or raise the limit",
                    fetcher.name()
                ),
                None,
            ));
        }
        *budget -= total;
        for ((a, _), bytes) in holes.iter().zip(read_all(fetcher, &holes)?) {
            self.insert(*a, bytes);
        }
        Ok(())
    }
}

/// Requests in flight at once when a round of parsing misses many
/// ranges (a zip's local headers, one per storage): the round costs a few
/// round trips, not one per header.
const IN_FLIGHT: usize = 8;

/// The bytes of each of `ranges`, in order, read with up to [`IN_FLIGHT`]
/// requests at once; the first error (in order) is the answer.
fn read_all(fetcher: &Fetcher, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
    if ranges.len() <= 1 {
        return ranges
            .iter()
            .map(|&(a, b)| fetcher.read(a, b - a))
            .collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<Vec<u8>>>>> =
        ranges.iter().map(|_| Mutex::new(None)).collect();
    let failed = std::sync::atomic::AtomicBool::new(false);
    let work = || loop {
        if failed.load(Ordering::Relaxed) {
            break;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(&(a, b)) = ranges.get(i) else { break };
        let got = fetcher.read(a, b - a);
        if got.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        if let Some(Ok(mut slot)) = results.get(i).map(Mutex::lock) {
            *slot = Some(got);
        }
    };
    std::thread::scope(|scope| {
        // This thread is one of the readers; a thread the system refuses
        // to start leaves fewer in flight, never a panic.
        for _ in 1..IN_FLIGHT.min(ranges.len()) {
            let _ = std::thread::Builder::new()
                .name("ptload-fetch".into())
                .spawn_scoped(scope, work);
        }
        work();
    });
    let mut out = Vec::with_capacity(ranges.len());
    for (slot, &(a, b)) in results.into_iter().zip(ranges) {
        match slot.into_inner().ok().flatten() {
            Some(got) => out.push(got?),
            // Claimed in order, so every range before a failed one was
            // read: only a poisoned lock leaves one unread. Read it again.
            None => out.push(fetcher.read(a, b - a)?),
        }
    }
    Ok(out)
}

/// The bytes of a file that parsing may read: all of them, or those
/// fetched so far.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FileView<'d> {
    Whole(&'d [u8]),
    Fetched(&'d Extents),
}

impl<'d> From<&'d [u8]> for FileView<'d> {
    fn from(data: &'d [u8]) -> FileView<'d> {
        FileView::Whole(data)
    }
}

impl<'d> From<&'d Vec<u8>> for FileView<'d> {
    fn from(data: &'d Vec<u8>) -> FileView<'d> {
        FileView::Whole(data)
    }
}

impl<'d> FileView<'d> {
    /// The file's length.
    pub(crate) fn len(&self) -> usize {
        match self {
            FileView::Whole(d) => d.len(),
            FileView::Fetched(e) => usize::try_from(e.len).unwrap_or(usize::MAX),
        }
    }

    /// The whole file, when it is at hand.
    pub(crate) fn whole(&self) -> Option<&'d [u8]> {
        match self {
            FileView::Whole(d) => Some(d),
            FileView::Fetched(_) => None,
        }
    }

    /// `range` of the file: `None` past its end, or (noted as missed) when
    /// not fetched.
    pub(crate) fn get(&self, range: std::ops::Range<usize>) -> Option<&'d [u8]> {
        match self {
            FileView::Whole(d) => d.get(range),
            FileView::Fetched(e) => {
                let (start, end) = (range.start as u64, range.end as u64);
                if start > end || end > e.len {
                    return None;
                }
                if start == end {
                    return Some(&[]);
                }
                let found = e.find(start, end);
                if found.is_none() {
                    e.miss(start, end);
                }
                found
            }
        }
    }

    /// Whether a read of this round found bytes not fetched yet: the
    /// parse will run again with more. A search over every byte (for what
    /// a well-formed file does not hold) waits for a round that misses
    /// nothing, so that it never fetches what the parse alone would not.
    #[cfg(feature = "scan")]
    pub(crate) fn incomplete(&self) -> bool {
        match self {
            FileView::Whole(_) => false,
            FileView::Fetched(e) => e.missed.lock().map_or(true, |m| !m.is_empty()),
        }
    }

    /// `len` bytes at `start`, as [`get`](Self::get).
    pub(crate) fn slice(&self, start: u64, len: u64) -> Option<&'d [u8]> {
        let start = usize::try_from(start).ok()?;
        let len = usize::try_from(len).ok()?;
        self.get(start..start.checked_add(len)?)
    }

    /// Up to `len` bytes from `start`: as many as the file has.
    pub(crate) fn up_to(&self, start: usize, len: usize) -> &'d [u8] {
        let end = start.saturating_add(len).min(self.len());
        self.get(start.min(end)..end).unwrap_or_default()
    }

    /// The parts of `start..end` not at hand: none of a whole file.
    pub(crate) fn holes(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        match self {
            FileView::Whole(_) => Vec::new(),
            FileView::Fetched(e) => e.holes(start, end.min(e.len)),
        }
    }

    /// `len` bytes at `start` if they are at hand, without noting a miss.
    pub(crate) fn held(&self, start: u64, len: u64) -> Option<&'d [u8]> {
        let end = start.checked_add(len)?;
        match self {
            FileView::Whole(d) => crate::bytes::slice(d, start, len),
            FileView::Fetched(e) => e.find(start, end),
        }
    }

    /// Note `start..end` as wanted without reading it: a parse that knows
    /// every range it will need asks for them all in one round. Whether
    /// they are all at hand.
    pub(crate) fn want(&self, start: u64, end: u64) -> bool {
        match self {
            FileView::Whole(_) => true,
            FileView::Fetched(e) => {
                let end = end.min(e.len);
                if start >= end || e.find(start, end).is_some() {
                    return true;
                }
                e.miss(start, end);
                false
            }
        }
    }

    /// The bytes from the start of the file that are at hand, contiguous:
    /// for a pickle stream that starts the file. When what runs over them
    /// fails for want of more, [`grow`](Self::grow) asks for more.
    pub(crate) fn prefix(&self) -> &'d [u8] {
        match self {
            FileView::Whole(d) => d,
            FileView::Fetched(e) => match e.runs.first() {
                Some((0, bytes)) => bytes,
                _ => &[],
            },
        }
    }

    /// After a read of [`prefix`](Self::prefix) failed: if the file goes
    /// on past it, note the next part (as long again, 1 MiB at least) as
    /// missed, so the read is tried again with more. Whether it did.
    pub(crate) fn grow(&self) -> bool {
        let have = self.prefix().len() as u64;
        let total = self.len() as u64;
        if have >= total {
            return false;
        }
        self.want(have, have.saturating_add(have.max(1 << 20)).min(total));
        true
    }
}

/// The bytes `start..end` of the file: the parts `view` holds (fetched
/// while opening) copied, only the others fetched, so no range is read
/// twice.
pub(crate) fn read_unheld(
    view: FileView<'_>,
    fetcher: &Fetcher,
    start: u64,
    end: u64,
) -> Result<Vec<u8>> {
    let FileView::Fetched(extents) = view else {
        return fetcher.read(start, end.saturating_sub(start));
    };
    let holes = extents.holes(start, end);
    if let [(a, b)] = holes[..] {
        if (a, b) == (start, end) {
            return fetcher.read(start, end - start);
        }
    }
    // Partly held: a buffer of its own, filled as a reader's would be.
    let size = usize::try_from(end.saturating_sub(start))
        .map_err(|_| Error::new(ErrorKind::Io, "range too large"))?;
    let mut out = Vec::new();
    out.try_reserve_exact(size).map_err(|_| {
        Error::new(
            ErrorKind::Io,
            format!("{}: cannot hold {size} bytes in memory", fetcher.name()),
        )
    })?;
    out.resize(size, 0);
    read_unheld_into(view, fetcher, start, &mut out)?;
    Ok(out)
}

/// [`read_unheld`] into `out` (the bytes `start..start + out.len()`):
/// held parts copied, the others read straight into their place.
pub(crate) fn read_unheld_into(
    view: FileView<'_>,
    fetcher: &Fetcher,
    start: u64,
    out: &mut [u8],
) -> Result<()> {
    let end = start
        .checked_add(out.len() as u64)
        .ok_or_else(|| Error::new(ErrorKind::Io, "range too large"))?;
    let FileView::Fetched(extents) = view else {
        return fetcher.read_into(start, out);
    };
    // The part of `out` for file bytes `a..b` (within `start..end`).
    fn place(out: &mut [u8], start: u64, a: u64, b: u64) -> Result<&mut [u8]> {
        let from = usize::try_from(a.saturating_sub(start)).unwrap_or(usize::MAX);
        let to = usize::try_from(b.saturating_sub(start)).unwrap_or(usize::MAX);
        let len = out.len();
        out.get_mut(from..to)
            .ok_or_else(|| Error::new(ErrorKind::Io, format!("bytes {a}..{b} outside {len}")))
    }
    let held = |a: u64, b: u64| {
        extents.find(a, b).ok_or_else(|| {
            Error::new(
                ErrorKind::Io,
                format!(
                    "{}: bytes {a}..{b} neither held nor fetched",
                    fetcher.name()
                ),
            )
        })
    };
    let mut at = start;
    for (a, b) in extents.holes(start, end) {
        if at < a {
            place(out, start, at, a)?.copy_from_slice(held(at, a)?);
        }
        fetcher.read_into(a, place(out, start, a, b)?)?;
        at = b;
    }
    if at < end {
        place(out, start, at, end)?.copy_from_slice(held(at, end)?);
    }
    Ok(())
}

/// Whether `e` is a read that ran out of bytes (a pickle run over a
/// prefix of the file that may be too short): the byte reader's end of
/// data, or a length past the bytes left.
pub(crate) fn ran_out(e: &Error) -> bool {
    e.ran_out()
}

/// Run `attempt` over the extents fetched so far, fetching what it missed
/// and running it again, until it misses nothing; its answer is then the
/// file's. The first round has the head and the tail of the file;
/// `budget` bounds the bytes all rounds fetch.
pub(crate) fn fetch_until<T>(
    fetcher: &Fetcher,
    budget: u64,
    attempt: impl FnMut(Arc<Extents>) -> T,
) -> Result<T> {
    fetch_more_until(fetcher, budget, Extents::new(fetcher.len()), attempt)
}

/// [`fetch_until`] starting from what `held` holds (what opening the file
/// fetched): only what it lacks is fetched.
pub(crate) fn fetch_more_until<T>(
    fetcher: &Fetcher,
    budget: u64,
    held: Extents,
    mut attempt: impl FnMut(Arc<Extents>) -> T,
) -> Result<T> {
    let len = fetcher.len();
    let mut budget = budget;
    let mut extents = held;
    let head = (0, FIRST_FETCH.min(len));
    let tail = (len.saturating_sub(FIRST_FETCH), len);
    extents.fetch(fetcher, &[head, tail], &mut budget)?;
    for _ in 0..MAX_ROUNDS {
        let shared = Arc::new(extents);
        let answer = attempt(Arc::clone(&shared));
        let missed = shared.take_missed();
        if missed.is_empty() {
            return Ok(answer);
        }
        drop(answer);
        extents = match Arc::try_unwrap(shared) {
            Ok(e) => e,
            Err(shared) => Extents {
                len,
                runs: shared.runs.clone(),
                missed: Mutex::new(Vec::new()),
            },
        };
        let near = if missed.len() > FEW_MISSES {
            SCATTERED_NEIGHBOURHOOD
        } else {
            NEIGHBOURHOOD
        };
        let around: Vec<(u64, u64)> = missed
            .iter()
            .map(|&(a, b)| (a.saturating_sub(near), b.saturating_add(near)))
            .collect();
        extents.fetch(fetcher, &around, &mut budget)?;
    }
    Err(Error::new(
        ErrorKind::Io,
        format!(
            "{}: still missing ranges after {MAX_ROUNDS} rounds of ranged reads",
            fetcher.name()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_told_by_their_scheme() {
        for url in [
            "http://h/x.pt",
            "https://h/x.pt",
            "s3://b/x.pt",
            "S3A://b/x.pt",
            "gs://b/x.pt",
            "az://c/x.pt",
            "abfss://c@a.dfs.core.windows.net/x.pt",
        ] {
            assert!(is_url(url), "{url}");
        }
        for path in [
            "x.pt",
            "dir/x.pt",
            "s3:/b/x.pt",
            "s3://",
            "ftp://h/x.pt",
            "C:\\x.pt",
        ] {
            assert!(!is_url(path), "{path}");
        }
    }

    #[derive(Debug)]
    struct Memory(Vec<u8>);

    impl RangeRead for Memory {
        fn len(&self) -> u64 {
            self.0.len() as u64
        }
        fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
            Ok(self.0[offset as usize..(offset + len) as usize].to_vec())
        }
        fn name(&self) -> &str {
            "memory"
        }
    }

    #[derive(Debug)]
    struct Short;

    impl RangeRead for Short {
        fn len(&self) -> u64 {
            100
        }
        fn read_at(&self, _: u64, len: u64) -> std::io::Result<Vec<u8>> {
            Ok(vec![1; len as usize - 1])
        }
        fn name(&self) -> &str {
            "short"
        }
    }

    #[test]
    fn unfetched_bytes_are_never_seen_and_are_noted() {
        let file: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
        let fetcher = Fetcher::new(Arc::new(Memory(file.clone())));
        let mut e = Extents::new(file.len() as u64);
        let mut budget = u64::MAX;
        e.fetch(&fetcher, &[(0, 10), (500_000, 500_010)], &mut budget)
            .unwrap();
        let view = FileView::Fetched(&e);
        assert_eq!(view.get(2..8), Some(&file[2..8]));
        assert_eq!(view.get(500_001..500_010), Some(&file[500_001..500_010]));
        assert_eq!(view.get(5..20), None);
        assert_eq!(view.get(1000..1001), None);
        // Past the end is not a miss: the file has no such bytes.
        assert_eq!(view.get(0..(1 << 20) + 1), None);
        assert_eq!(e.take_missed(), vec![(5, 20), (1000, 1001)]);
        assert_eq!(view.prefix(), &file[..10]);
    }

    #[test]
    fn runs_join_and_only_holes_are_fetched() {
        let file: Vec<u8> = (0..200u8).collect();
        let fetcher = Fetcher::new(Arc::new(Memory(file.clone())));
        let mut e = Extents::new(200);
        let mut budget = u64::MAX;
        e.fetch(&fetcher, &[(10, 20)], &mut budget).unwrap();
        e.fetch(&fetcher, &[(150, 160)], &mut budget).unwrap();
        e.fetch(&fetcher, &[(0, 200)], &mut budget).unwrap();
        assert_eq!(fetcher.bytes_read(), 200);
        assert_eq!(e.runs.len(), 1);
        assert_eq!(FileView::Fetched(&e).get(0..200), Some(&file[..]));
    }

    #[test]
    fn reads_through_held_runs_fetch_only_the_holes() {
        let file: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let fetcher = Fetcher::new(Arc::new(Memory(file.clone())));
        let mut e = Extents::new(10_000);
        let mut budget = u64::MAX;
        // Close together: fetched as one run, 100..5100.
        e.fetch(&fetcher, &[(100, 200), (5000, 5100)], &mut budget)
            .unwrap();
        e.fetch(&fetcher, &[(7000, 7100)], &mut budget).unwrap();
        let before = fetcher.bytes_read();
        let view = FileView::Fetched(&e);
        let got = read_unheld(view, &fetcher, 50, 9050).unwrap();
        assert_eq!(got, &file[50..9050]);
        // Held: 100..5100 and 7000..7100.
        assert_eq!(fetcher.bytes_read() - before, 9000 - 5000 - 100);
        assert_eq!(
            read_unheld(view, &fetcher, 120, 170).unwrap(),
            &file[120..170]
        );
        assert_eq!(fetcher.bytes_read() - before, 9000 - 5000 - 100);
    }

    #[test]
    fn reads_into_a_buffer_copy_held_runs_and_fetch_only_the_holes_into_place() {
        let file: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let fetcher = Fetcher::new(Arc::new(Memory(file.clone())));
        let mut e = Extents::new(10_000);
        let mut budget = u64::MAX;
        e.fetch(&fetcher, &[(100, 200), (5000, 5100)], &mut budget)
            .unwrap();
        e.fetch(&fetcher, &[(7000, 7100)], &mut budget).unwrap();
        let before = (fetcher.bytes_read(), fetcher.requests());
        let view = FileView::Fetched(&e);
        // Starting in a hole, ending in a hole, a held run between.
        let mut out = vec![0xee; 9000];
        read_unheld_into(view, &fetcher, 50, &mut out).unwrap();
        assert_eq!(out, &file[50..9050]);
        // Holes 50..100, 5100..7000, 7100..9050: three requests.
        assert_eq!(fetcher.bytes_read() - before.0, 9000 - 5000 - 100);
        assert_eq!(fetcher.requests() - before.1, 3);
        // Within a held run: nothing fetched.
        let mut out = vec![0; 50];
        read_unheld_into(view, &fetcher, 120, &mut out).unwrap();
        assert_eq!(out, &file[120..170]);
        assert_eq!(fetcher.requests() - before.1, 3);
        // Not opened by ranges' extents: one request, straight in.
        let mut out = vec![0; 10];
        read_unheld_into(FileView::Whole(&[]), &fetcher, 9990, &mut out).unwrap();
        assert_eq!(out, &file[9990..]);
        // Past the end: an error, the buffer's length checked first.
        let mut out = vec![0; 11];
        let err = read_unheld_into(FileView::Whole(&[]), &fetcher, 9990, &mut out)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lies past its end"), "{err}");
    }

    #[test]
    fn a_short_answer_into_a_buffer_is_an_error() {
        let fetcher = Fetcher::new(Arc::new(Short));
        let mut out = [0u8; 10];
        let err = fetcher.read_into(0, &mut out).unwrap_err().to_string();
        assert!(err.contains("asked for 10 bytes at 0, received 9"), "{err}");
    }

    #[test]
    fn a_short_answer_is_an_error() {
        let fetcher = Fetcher::new(Arc::new(Short));
        let err = fetcher.read(0, 10).unwrap_err().to_string();
        assert!(err.contains("asked for 10 bytes at 0, received 9"), "{err}");
        let err = fetcher.read(95, 10).unwrap_err().to_string();
        assert!(err.contains("lies past its end"), "{err}");
    }

    #[test]
    fn fetching_beyond_the_budget_is_refused() {
        let fetcher = Fetcher::new(Arc::new(Memory(vec![0; 1 << 20])));
        let err = fetch_until(&fetcher, 1000, |_| ()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LimitExceeded);
        assert_eq!(fetcher.bytes_read(), 0);
    }

    #[test]
    fn rounds_fetch_what_was_missed() {
        let file: Vec<u8> = (0..=255u8).cycle().take(4 << 20).collect();
        let fetcher = Fetcher::new(Arc::new(Memory(file.clone())));
        let got = fetch_until(&fetcher, u64::MAX, |e| {
            FileView::Fetched(&e)
                .get(2_000_000..2_000_100)
                .map(<[u8]>::to_vec)
        })
        .unwrap();
        assert_eq!(got.as_deref(), Some(&file[2_000_000..2_000_100]));
        // Head, tail, and the missed range with its neighbourhood.
        assert_eq!(
            fetcher.bytes_read(),
            2 * FIRST_FETCH + 100 + 2 * NEIGHBOURHOOD
        );
    }
}
