//! A zip reader for torch archives: one canonical view of the central
//! directory, checked against the local headers, with stored entries as
//! ranges of the file (zero-copy) and deflated ones inflated within a limit.
//!
//! The archive may begin after a prefix: every offset the directory records
//! is shifted by where the directory really is.

use std::hash::BuildHasher;

use crate::bytes::ByteReader;
use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::ranged::FileView;

const EOCD_SIG: u32 = 0x0605_4b50;
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;
const EOCD_LEN: usize = 22;
const CENTRAL_LEN: usize = 46;
const LOCAL_LEN: u64 = 30;

/// How an entry's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Stored,
    Deflated,
}

/// One entry of the archive, with its data located in the file.
#[derive(Debug, Clone)]
pub(crate) struct Entry<'d> {
    /// Borrowed from the central directory.
    pub(crate) name: &'d str,
    pub(crate) method: Method,
    /// Offset of the entry's (possibly compressed) data in the file.
    pub(crate) data_start: u64,
    pub(crate) compressed_size: u64,
    pub(crate) size: u64,
    /// 0 means "not computed".
    pub(crate) crc32: u32,
    /// The central directory marks it encrypted (flag bits 0x1, 0x40) or
    /// its header masked (0x2000): torch's reader refuses it. Kept only
    /// under [`Rules::Tolerant`].
    #[cfg_attr(not(feature = "scan"), allow(dead_code))]
    pub(crate) encrypted: bool,
    /// Where its local header starts in the file.
    #[cfg_attr(not(feature = "scan"), allow(dead_code))]
    pub(crate) local: u64,
}

/// A local header in the bytes before the central directory that no
/// listed entry accounts for: a record the directory does not list.
#[derive(Debug, Clone)]
#[cfg(feature = "scan")]
pub(crate) struct Hidden<'d> {
    /// Its local header, read as a record (sizes from the local header).
    pub(crate) entry: Entry<'d>,
    /// The local header's sizes are deferred to a data descriptor: where
    /// its data ends is not known.
    pub(crate) sizes_unknown: bool,
}

/// How local headers are read. Each sits just before its record's data,
/// scattered through the file: when records are far apart (large tensors),
/// one positioned read per header is cheaper than faulting in a page of
/// the map for each; when they are dense, the map is cheaper.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Headers<'a> {
    Map,
    File(&'a std::fs::File),
    /// As `File`, keeping what was read for the next reader of the same
    /// bytes (the scanner parses a zip twice, then looks between its
    /// records): see [`KeptReads`].
    #[cfg(feature = "scan")]
    Kept(&'a KeptReads<'a>),
}

/// Average bytes per entry from which local headers are read with `pread`.
const SPREAD_FOR_PREAD: u64 = 256 * 1024;

/// Whether `count` records in `len` bytes lie far enough apart that their
/// local headers are read with `pread`.
fn spread_out(len: u64, count: usize) -> bool {
    len / (count.max(1) as u64) >= SPREAD_FOR_PREAD
}

/// Positioned reads of a file, kept: a read inside bytes read before is
/// answered from them. Each read also takes the [`KeptReads::BEHIND`]
/// bytes before it, where a torch archive keeps the data descriptor of the
/// record before (what [`Archive::hidden_locals`] looks at). What is kept
/// is bounded by the reads made, one per local header and gap.
#[cfg(feature = "scan")]
#[derive(Debug)]
pub(crate) struct KeptReads<'a> {
    file: &'a std::fs::File,
    kept: std::cell::RefCell<std::collections::BTreeMap<u64, Vec<u8>>>,
}

#[cfg(feature = "scan")]
impl<'a> KeptReads<'a> {
    /// A data descriptor with 64-bit sizes, and its signature.
    const BEHIND: u64 = 24;

    pub(crate) fn new(file: &'a std::fs::File) -> Self {
        KeptReads {
            file,
            kept: Default::default(),
        }
    }

    fn read<'b>(&self, offset: u64, buf: &'b mut [u8]) -> Result<&'b [u8]> {
        let want = buf.len() as u64;
        {
            let kept = self.kept.borrow();
            if let Some((&start, bytes)) = kept.range(..=offset).next_back() {
                let from = usize::try_from(offset - start).unwrap_or(usize::MAX);
                let kept_here = bytes.get(from..).unwrap_or_default();
                // Whole, or all the file has (a short read at its end).
                if let Some(here) = kept_here.get(..buf.len()) {
                    buf.copy_from_slice(here);
                    return Ok(buf);
                }
            }
        }
        let behind = offset.min(Self::BEHIND);
        let mut read = vec![0u8; usize::try_from(behind + want).unwrap_or(usize::MAX)];
        let filled = read_at_full(self.file, offset - behind, &mut read)?;
        read.truncate(filled);
        let got = read
            .get(usize::try_from(behind).unwrap_or(usize::MAX)..)
            .unwrap_or_default();
        let n = got.len().min(buf.len());
        if let (Some(to), Some(from)) = (buf.get_mut(..n), got.get(..n)) {
            to.copy_from_slice(from);
        }
        self.kept.borrow_mut().insert(offset - behind, read);
        Ok(buf.get(..n).unwrap_or_default())
    }
}

/// Read `buf.len()` bytes at `offset`, or as many as the file has: the
/// count read. A read the system fails (other than an interrupted one,
/// tried again) is an I/O error, never taken for a short file.
#[cfg(unix)]
fn read_at_full(file: &std::fs::File, offset: u64, buf: &mut [u8]) -> Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut filled = 0;
    while filled < buf.len() {
        let Some(rest) = buf.get_mut(filled..) else {
            break;
        };
        match file.read_at(rest, offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::io(
                    format!("cannot read the local header at offset {offset}"),
                    e,
                ))
            }
        }
    }
    Ok(filled)
}

/// Elsewhere, through the platform's seek and read.
#[cfg(not(unix))]
fn read_at_full(mut file: &std::fs::File, offset: u64, buf: &mut [u8]) -> Result<usize> {
    use std::io::{Read, Seek, SeekFrom};
    let io = |e| {
        Error::io(
            format!("cannot read the local header at offset {offset}"),
            e,
        )
    };
    file.seek(SeekFrom::Start(offset)).map_err(io)?;
    let mut filled = 0;
    while filled < buf.len() {
        let Some(rest) = buf.get_mut(filled..) else {
            break;
        };
        match file.read(rest) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    Ok(filled)
}

impl Headers<'_> {
    /// Read `buf.len()` bytes at `offset`, or as many as the file has. A
    /// read the system fails (other than an interrupted one, tried again)
    /// is an I/O error, never taken for a short file.
    fn read<'b>(&self, data: FileView<'b>, offset: u64, buf: &'b mut [u8]) -> Result<&'b [u8]> {
        match self {
            Headers::File(file) => {
                let filled = read_at_full(file, offset, buf)?;
                Ok(buf.get(..filled).unwrap_or_default())
            }
            #[cfg(feature = "scan")]
            Headers::Kept(kept) => kept.read(offset, buf),
            Headers::Map => {
                Ok(data.up_to(usize::try_from(offset).unwrap_or(usize::MAX), buf.len()))
            }
        }
    }
}

/// An entry name as torch's zip reader (miniz) looks it up: without
/// regard to ASCII letter case (torch 2.15 reads `ARCHIVE/DATA.PKL` for
/// `archive/data.pkl`, and of names equal but for case, the last).
#[derive(Clone, Copy)]
struct Folded<'n>(&'n str);

impl std::hash::Hash for Folded<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Folded a block at a time: names equal but for case are the same
        // bytes in the same blocks, so they hash alike (a byte at a time
        // costs a round of the hash per byte).
        let mut block = [0u8; 64];
        for chunk in self.0.as_bytes().chunks(block.len()) {
            let Some(folded) = block.get_mut(..chunk.len()) else {
                break;
            };
            folded.copy_from_slice(chunk);
            folded.make_ascii_lowercase();
            state.write(folded);
        }
        state.write_u8(0xff);
    }
}

/// Whether two entry names are one name to torch.
pub(crate) fn same_name(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// The archive's directory, borrowing names from the file.
#[derive(Debug)]
pub(crate) struct Archive<'d> {
    entries: Vec<Entry<'d>>,
    /// Indices of `entries`, hashed by name.
    by_name: hashbrown::HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
    end: usize,
    /// Where the central directory starts in the bytes.
    #[cfg_attr(not(feature = "scan"), allow(dead_code))]
    cd_start: u64,
    /// How far every recorded offset was shifted to find the directory
    /// (bytes before the archive).
    #[cfg_attr(not(feature = "scan"), allow(dead_code))]
    prefix_len: u64,
    /// Where the first local header of an entry read lies (the length of
    /// the file when there is none).
    #[cfg_attr(not(feature = "scan"), allow(dead_code))]
    first_local: u64,
    /// Under [`Rules::Tolerant`], what [`Rules::Canonical`] would have
    /// refused, each with its offset.
    #[cfg_attr(not(feature = "scan"), allow(dead_code))]
    disagreements: Vec<(String, u64)>,
    /// Entries left out because their local header is not there (torch
    /// fails on them only if it reads them): name, where it should be.
    broken_locals: Vec<(&'d str, u64)>,
}

/// What `read_central` found: an entry, or (tolerant rules only) a central
/// entry whose local header is missing.
enum Central<'d> {
    Entry(Entry<'d>, u64),
    BrokenLocal(&'d str, u64),
}

fn zip_err(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Zip, message)
}

/// Position of the end-of-central-directory record, searching back over the
/// largest possible comment.
pub(crate) fn find_eocd(data: &[u8]) -> Option<usize> {
    let last = data.len().checked_sub(EOCD_LEN)?;
    let first = last.saturating_sub(u16::MAX as usize);
    (first..=last).rev().find(|&pos| {
        let mut r = ByteReader::at(data, pos, ErrorKind::Zip);
        if r.u32().ok() != Some(EOCD_SIG) {
            return false;
        }
        let comment_len = ByteReader::at(data, pos + 20, ErrorKind::Zip)
            .u16()
            .map(usize::from)
            .unwrap_or(usize::MAX);
        pos.checked_add(EOCD_LEN)
            .and_then(|end| end.checked_add(comment_len))
            .is_some_and(|end| end <= data.len())
    })
}

/// Position of the end-of-central-directory record in the file `data`
/// views: searched in its last 64 KiB + 22 bytes.
pub(crate) fn find_eocd_in(data: FileView<'_>) -> Option<usize> {
    let tail_start = data.len().saturating_sub(EOCD_LEN + u16::MAX as usize);
    let tail = data.get(tail_start..data.len())?;
    find_eocd(tail).map(|pos| tail_start + pos)
}

/// How many records the end-of-central-directory record of the archive
/// `data` says it holds (`u16::MAX` for a zip64 archive, which says more
/// elsewhere); `None` when no such record is found. A size hint only
/// (nothing is checked), read from the last 64 KiB + 22 bytes.
#[cfg(feature = "scan")]
pub(crate) fn records_hint(data: &[u8]) -> Option<u16> {
    let tail_start = data.len().saturating_sub(EOCD_LEN + u16::MAX as usize);
    let pos = tail_start.checked_add(find_eocd(data.get(tail_start..)?)?)?;
    ByteReader::at(data, pos.checked_add(10)?, ErrorKind::Zip)
        .u16()
        .ok()
}

/// `len` bytes at `pos` of the file, for reading fields.
fn reader_at(data: FileView<'_>, pos: usize, len: usize) -> Result<ByteReader<'_>> {
    let bytes = data
        .get(pos..pos.saturating_add(len))
        .ok_or_else(|| zip_err("directory record lies outside the file").at(pos as u64))?;
    Ok(ByteReader::new(bytes, ErrorKind::Zip))
}

/// Where the first archive of bytes holding several ends: the first
/// end-of-central-directory record, from the start, whose directory lies
/// right before it as recorded (an archive that starts at byte 0). One pass
/// over the bytes.
pub(crate) fn first_archive_end(data: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = data
        .get(from..)?
        .windows(4)
        .position(|w| w == EOCD_SIG.to_le_bytes())
    {
        let pos = from + found;
        from = pos + 1;
        let Ok(dir) = read_directory_location(FileView::Whole(data), pos, true) else {
            continue;
        };
        let starts_at_zero = dir.cd_offset.checked_add(dir.cd_size) == Some(dir.cd_end_actual);
        let comment_len = ByteReader::at(data, pos + 20, ErrorKind::Zip).u16().ok();
        let end = comment_len.and_then(|c| (pos + EOCD_LEN).checked_add(usize::from(c)));
        if let (true, Some(end)) = (starts_at_zero, end) {
            if end <= data.len() {
                return Some(end);
            }
        }
    }
    None
}

struct Directory {
    count: u64,
    cd_size: u64,
    cd_offset: u64,
    /// Where the directory really ends in the file.
    cd_end_actual: u64,
}

/// The directory the end record at `eocd` describes. With `adjacent`, a
/// ZIP64 end record right before its locator is taken even where the
/// locator records another offset (an archive after a prefix); without,
/// only the recorded offset counts, as torch's reader (miniz) reads it.
fn read_directory_location(data: FileView<'_>, eocd: usize, adjacent: bool) -> Result<Directory> {
    let mut r = reader_at(data, eocd + 4, EOCD_LEN - 4)?;
    let disk = r.u16()?;
    let cd_disk = r.u16()?;
    let count_disk = r.u16()?;
    let count = r.u16()?;
    let cd_size = r.u32()?;
    let cd_offset = r.u32()?;
    if disk != 0 && disk != 0xffff || cd_disk != 0 && cd_disk != 0xffff || count_disk != count {
        return Err(zip_err("multi-disk archives are not supported").at(eocd as u64));
    }
    let needs_zip64 = count == 0xffff || cd_size == 0xffff_ffff || cd_offset == 0xffff_ffff;
    // A ZIP64 locator sits right before the EOCD when the writer used ZIP64
    // (torch always does).
    let locator = eocd.checked_sub(20).and_then(|pos| {
        let mut l = reader_at(data, pos, 4).ok()?;
        (l.u32().ok()? == ZIP64_LOCATOR_SIG).then_some(pos)
    });
    let Some(locator) = locator else {
        if needs_zip64 {
            return Err(zip_err("ZIP64 values without a ZIP64 locator").at(eocd as u64));
        }
        return Ok(Directory {
            count: count.into(),
            cd_size: cd_size.into(),
            cd_offset: cd_offset.into(),
            cd_end_actual: eocd as u64,
        });
    };
    let mut l = reader_at(data, locator + 8, 8)?;
    let recorded = l.u64()?;
    // The ZIP64 EOCD normally ends where the locator starts; with a prefix,
    // the recorded offset is shifted, so try the adjacent position first.
    let candidates = [
        locator
            .checked_sub(56)
            .map(|p| p as u64)
            .filter(|_| adjacent),
        Some(recorded),
    ];
    let z64 = candidates
        .into_iter()
        .flatten()
        .find(|&pos| {
            usize::try_from(pos).ok().is_some_and(|p| {
                reader_at(data, p, 4).and_then(|mut r| r.u32()).ok() == Some(ZIP64_EOCD_SIG)
            })
        })
        .ok_or_else(|| {
            zip_err("ZIP64 end-of-central-directory record not found").at(locator as u64)
        })?;
    let z64_pos = usize::try_from(z64).map_err(|_| zip_err("ZIP64 record offset out of range"))?;
    let mut z = reader_at(data, z64_pos + 24, 32)?;
    let _count_disk = z.u64()?;
    let count = z.u64()?;
    let cd_size = z.u64()?;
    let cd_offset = z.u64()?;
    Ok(Directory {
        count,
        cd_size,
        cd_offset,
        cd_end_actual: z64,
    })
}

/// Values from a ZIP64 extended-information extra field, for the fields the
/// fixed header marks 0xffffffff.
fn apply_zip64_extra(
    extra: &[u8],
    size: &mut u64,
    csize: &mut u64,
    offset: &mut u64,
) -> Result<()> {
    let mut r = ByteReader::new(extra, ErrorKind::Zip);
    while r.remaining() >= 4 {
        let id = r.u16()?;
        let len = usize::from(r.u16()?);
        let body = r.bytes(len)?;
        if id != 0x0001 {
            continue;
        }
        let mut b = ByteReader::new(body, ErrorKind::Zip);
        for field in [size, csize, offset] {
            if *field == 0xffff_ffff {
                *field = b
                    .u64()
                    .map_err(|_| zip_err("ZIP64 extra field too short"))?;
            }
        }
        return Ok(());
    }
    Ok(())
}

/// How strictly the directory is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rules {
    /// One canonical view: duplicates, local/central name disagreement,
    /// encryption and overlapping entries are errors.
    Canonical,
    /// What torch's own zip reader tolerates (duplicates, name mismatches,
    /// overlaps; encrypted entries are kept but cannot be read): the
    /// scanner's view, which must see every record torch could unpickle.
    Tolerant,
}

impl<'d> Archive<'d> {
    pub(crate) fn parse(
        data: impl Into<FileView<'d>>,
        headers: Headers<'_>,
        limits: &Limits,
    ) -> Result<Archive<'d>> {
        Archive::parse_with(data, headers, limits, Rules::Canonical)
    }

    pub(crate) fn parse_with(
        data: impl Into<FileView<'d>>,
        headers: Headers<'_>,
        limits: &Limits,
        rules: Rules,
    ) -> Result<Archive<'d>> {
        Archive::parse_inner(data.into(), headers, limits, rules, false)
    }

    /// The archive as torch's reader (miniz) finds it: tolerant rules, the
    /// end record searched from the end of the bytes, and every offset it
    /// records counted from byte 0, never shifted. In bytes holding two
    /// archives whose second counts its offsets from its own start, those
    /// offsets land in the first: on its directory when both have the same
    /// layout (torch then reads the first archive), elsewhere on bytes that
    /// are no directory (torch fails: "invalid header").
    #[cfg(feature = "scan")]
    pub(crate) fn parse_as_torch(
        data: impl Into<FileView<'d>>,
        headers: Headers<'_>,
        limits: &Limits,
    ) -> Result<Archive<'d>> {
        Archive::parse_inner(data.into(), headers, limits, Rules::Tolerant, true)
    }

    fn parse_inner(
        data: FileView<'d>,
        headers: Headers<'_>,
        limits: &Limits,
        rules: Rules,
        absolute: bool,
    ) -> Result<Archive<'d>> {
        let (mut data, mut absolute) = (data, absolute);
        let mut searched = false;
        let (eocd, dir, prefix_len) = loop {
            let eocd = find_eocd_in(data).ok_or_else(|| {
                zip_err("no end-of-central-directory record (truncated archive?)")
            })?;
            let dir = read_directory_location(data, eocd, !absolute)?;
            let prefix_len = prefix_len(&dir, eocd, absolute)?;
            // Several archives: the first is read, once (its own bytes are
            // never searched again, whatever its comment holds).
            match first_of_several(data, rules, prefix_len)?.filter(|_| !searched) {
                Some(first) => {
                    (data, absolute, searched) = (FileView::Whole(first), false, true);
                }
                None => break (eocd, dir, prefix_len),
            }
        };
        let cd_start = prefix_len + dir.cd_offset;
        let (cd, count) = central_directory(data, &dir, cd_start, eocd, limits)?;
        let mut listing = Listing::with_capacity(count);
        let spread = spread_out(data.len() as u64, count);
        let headers = match headers {
            Headers::File(_) if !spread => Headers::Map,
            #[cfg(feature = "scan")]
            Headers::Kept(_) if !spread => Headers::Map,
            h => h,
        };
        if let FileView::Fetched(_) = data {
            // Ask for every local header at once: one round of reads, not
            // one per entry.
            if !want_local_headers(data, cd, prefix_len, count) {
                return Err(zip_err("local headers not fetched yet"));
            }
        }
        let mut r = ByteReader::new(cd, ErrorKind::Zip);
        let mut scratch = Vec::new();
        for _ in 0..count {
            let at = cd_start + r.pos() as u64;
            let read = read_central(
                &mut r,
                data,
                headers,
                &mut scratch,
                prefix_len,
                cd_start,
                (rules == Rules::Tolerant).then_some(&mut listing.disagreements),
            )
            .map_err(|e| e.at(at))?;
            listing.add(read, at, rules)?;
        }
        if rules == Rules::Canonical {
            listing.refuse_broken_duplicates()?;
        }
        let first_local = listing.check_overlaps(data.len() as u64, rules)?;
        Ok(Archive {
            entries: listing.entries,
            by_name: listing.by_name,
            hasher: listing.hasher,
            end: eocd_end(data, eocd).unwrap_or(data.len()),
            cd_start,
            prefix_len,
            first_local,
            disagreements: listing.disagreements,
            broken_locals: listing.broken_locals,
        })
    }

    /// Where the archive ends in the bytes: just past its directory's end
    /// record and comment.
    pub(crate) fn end(&self) -> usize {
        self.end
    }

    /// Where the central directory starts in the bytes.
    #[cfg(feature = "scan")]
    pub(crate) fn cd_start(&self) -> u64 {
        self.cd_start
    }

    /// How far the recorded offsets were shifted to find the directory: 0
    /// for an archive that starts at byte 0 (or read as torch reads it).
    #[cfg(feature = "scan")]
    pub(crate) fn prefix_len(&self) -> u64 {
        self.prefix_len
    }

    /// Where the first local header of an entry lies: bytes before it
    /// are no part of the entries read.
    #[cfg(feature = "scan")]
    pub(crate) fn first_local(&self) -> u64 {
        self.first_local
    }

    pub(crate) fn entries(&self) -> &[Entry<'d>] {
        &self.entries
    }

    /// Under [`Rules::Tolerant`]: what canonical rules would refuse (a
    /// message and its offset), in the order met.
    #[cfg(feature = "scan")]
    pub(crate) fn disagreements(&self) -> &[(String, u64)] {
        &self.disagreements
    }

    /// The entries left out because their local header is missing (name,
    /// where it should be).
    pub(crate) fn broken_locals(&self) -> &[(&'d str, u64)] {
        &self.broken_locals
    }

    /// Local headers in the bytes before the central directory that lie
    /// outside every listed entry (its header, name, extra field and
    /// data), at most `max` of them; the second value says whether there
    /// were more. Only those gaps are searched: one pass over bytes that
    /// are normally none.
    #[cfg(feature = "scan")]
    pub(crate) fn hidden_locals(
        &self,
        data: impl Into<FileView<'d>>,
        max: usize,
        mut headers: Headers<'_>,
    ) -> (Vec<Hidden<'d>>, bool) {
        /// Gaps up to this long are read with a positioned read when the
        /// local headers are (a data descriptor between two records, in
        /// torch's archives): a page of the map faulted in for each costs
        /// more.
        const SMALL_GAP: usize = 4096;
        let data: FileView<'d> = data.into();
        // Read by ranges, an entry whose local header is not fetched yet
        // looks broken and its bytes look like a gap: search in the round
        // that has every header (the parse has asked for them), never
        // fetching the entries' data to search it.
        if data.incomplete() {
            return (Vec::new(), false);
        }
        // As the parse reads the headers: dense records' gaps lie on pages
        // of the map the headers' reads faulted in already.
        if !spread_out(data.len() as u64, self.entries.len()) {
            headers = Headers::Map;
        }
        let mut covered: Vec<(u64, u64)> = self
            .entries
            .iter()
            .map(|e| (e.local, e.data_start.saturating_add(e.compressed_size)))
            .collect();
        covered.sort_unstable();
        let limit = self.cd_start.min(data.len() as u64);
        let mut found = Vec::new();
        let mut from = 0u64;
        let mut gaps = Vec::new();
        for &(start, end) in &covered {
            if start > from {
                gaps.push((from, start.min(limit)));
            }
            from = from.max(end);
        }
        if from < limit {
            gaps.push((from, limit));
        }
        let mut small = [0u8; SMALL_GAP];
        for (start, end) in gaps {
            let (Ok(s), Ok(e)) = (usize::try_from(start), usize::try_from(end)) else {
                continue;
            };
            let read = match headers {
                Headers::File(_) | Headers::Kept(_) if e.saturating_sub(s) <= SMALL_GAP => small
                    .get_mut(..e.saturating_sub(s))
                    .and_then(|buf| headers.read(data, start, buf).ok())
                    .filter(|got| got.len() == e - s),
                _ => None,
            };
            let Some(gap) = read.or_else(|| data.get(s..e)) else {
                continue;
            };
            let mut at = 0;
            while let Some(pos) = gap
                .get(at..)
                .and_then(|g| g.windows(4).position(|w| w == LOCAL_SIG.to_le_bytes()))
            {
                let header = s + at + pos;
                at += pos + 4;
                if let Some(hidden) = local_at(data, header) {
                    if found.len() == max {
                        return (found, true);
                    }
                    found.push(hidden);
                }
            }
        }
        (found, false)
    }

    /// Where the missing local header of `name` should be, when `name` is
    /// an entry left out for that.
    pub(crate) fn broken(&self, name: &str) -> Option<u64> {
        self.broken_locals
            .iter()
            .find(|&&(n, _)| same_name(n, name))
            .map(|&(_, at)| at)
    }

    /// The error for a record that is an entry without its local header.
    pub(crate) fn broken_err(name: &str, at: u64) -> Error {
        zip_err(format!(
            "entry {name:?} has no local header (at {at:#x}): its bytes cannot be read (torch fails on it too)"
        ))
        .at(at)
        .in_record(name)
    }

    /// The entry torch reads for `name`: names compared without regard to
    /// ASCII letter case, as torch's reader compares them; of several such
    /// (tolerant rules only), the last.
    pub(crate) fn get(&self, name: &str) -> Option<&Entry<'d>> {
        let hash = self.hasher.hash_one(Folded(name));
        let &i = self
            .by_name
            .find(hash, |&i| same_name(name_of(&self.entries, i), name))?;
        self.entries.get(i as usize)
    }
}

/// How far every offset the directory `dir` records is shifted in the
/// bytes (bytes before the archive); none when offsets are `absolute`.
fn prefix_len(dir: &Directory, eocd: usize, absolute: bool) -> Result<u64> {
    let recorded_end = dir
        .cd_offset
        .checked_add(dir.cd_size)
        .ok_or_else(|| zip_err("central directory offset overflows"))?;
    if absolute {
        return Ok(0);
    }
    dir.cd_end_actual.checked_sub(recorded_end).ok_or_else(|| {
        zip_err(format!(
            "central directory (offset {:#x}, {} bytes) lies outside the file",
            dir.cd_offset, dir.cd_size
        ))
        .at(eocd as u64)
    })
}

/// The first archive of several one after another, where there are such.
///
/// Bytes that start with a local header yet end with the directory of an
/// archive further on hold several archives one after another (torch.save
/// called twice on one stream): the archive they start with is the
/// checkpoint, as torch's reader reads it, not the last.
fn first_of_several<'d>(
    data: FileView<'d>,
    rules: Rules,
    prefix_len: u64,
) -> Result<Option<&'d [u8]>> {
    if rules == Rules::Canonical && prefix_len > 0 && data.up_to(0, 4) == b"PK\x03\x04" {
        // Several archives: only whole bytes can be searched for the
        // first one's end (a view of fetched ranges asks for them all).
        let all = data
            .get(0..data.len())
            .ok_or_else(|| zip_err("several archives one after another"))?;
        if let Some(end) = first_archive_end(all).filter(|&end| end < all.len()) {
            return Ok(Some(all.get(..end).unwrap_or(all)));
        }
    }
    Ok(None)
}

/// The central directory's bytes, starting at `cd_start`, and its entry
/// count, checked against the bytes and the limits before anything is
/// allocated for it.
fn central_directory<'d>(
    data: FileView<'d>,
    dir: &Directory,
    cd_start: u64,
    eocd: usize,
    limits: &Limits,
) -> Result<(&'d [u8], usize)> {
    let cd = data
        .slice(cd_start, dir.cd_size)
        .ok_or_else(|| zip_err("central directory lies outside the file").at(cd_start))?;
    // Every central entry takes at least 46 bytes: a count that cannot fit
    // is a lie, and is rejected before anything is allocated for it.
    let count = usize::try_from(dir.count).unwrap_or(usize::MAX);
    if count > cd.len() / CENTRAL_LEN {
        return Err(zip_err(format!(
            "entry count {} does not fit in a {}-byte central directory",
            dir.count,
            cd.len()
        ))
        .at(eocd as u64));
    }
    if count > limits.max_zip_entries {
        return Err(Error::limit(
            "max_zip_entries",
            limits.max_zip_entries as u64,
        ));
    }
    Ok((cd, count))
}

/// The central directory's entries as they are read, indexed by name, with
/// what an [`Archive`] notes of them.
struct Listing<'d> {
    entries: Vec<Entry<'d>>,
    /// Indices of `entries`, hashed by name.
    by_name: hashbrown::HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
    /// Each entry's local header offset and its index in `entries`.
    locals: Vec<(u64, usize)>,
    disagreements: Vec<(String, u64)>,
    broken_locals: Vec<(&'d str, u64)>,
}

impl<'d> Listing<'d> {
    fn with_capacity(count: usize) -> Self {
        Listing {
            entries: Vec::with_capacity(count),
            by_name: hashbrown::HashTable::with_capacity(count),
            hasher: hashbrown::DefaultHashBuilder::default(),
            locals: Vec::with_capacity(count),
            disagreements: Vec::new(),
            broken_locals: Vec::new(),
        }
    }

    /// Take what `read_central` read of the central entry at `at`: an
    /// entry under its name (a duplicate refused under canonical rules,
    /// noted under tolerant ones, where lookups find the last), or an entry
    /// left out for its broken local header.
    fn add(&mut self, read: Central<'d>, at: u64, rules: Rules) -> Result<()> {
        let (entry, local) = match read {
            Central::Entry(entry, local) => (entry, local),
            Central::BrokenLocal(name, local) => {
                self.broken_locals.push((name, local));
                return Ok(());
            }
        };
        let hash = self.hasher.hash_one(Folded(entry.name));
        let index = u32::try_from(self.entries.len()).map_err(|_| zip_err("too many entries"))?;
        let (entries, hasher) = (&self.entries, &self.hasher);
        match self.by_name.entry(
            hash,
            |&i: &u32| same_name(name_of(entries, i), entry.name),
            |&i: &u32| hasher.hash_one(Folded(name_of(entries, i))),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut slot) => {
                let earlier = name_of(entries, *slot.get());
                let message = if earlier == entry.name {
                    format!("duplicate entry name {:?}", entry.name)
                } else {
                    format!(
                        "duplicate entry name {:?}: torch finds names without regard to letter \
                         case, and {earlier:?} is the same name",
                        entry.name
                    )
                };
                if rules == Rules::Canonical {
                    return Err(zip_err(message).at(at));
                }
                self.disagreements.push((message, at));
                // Lookups find the last of duplicates.
                *slot.get_mut() = index;
            }
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert(index);
            }
        }
        self.locals.push((local, self.entries.len()));
        self.entries.push(entry);
        Ok(())
    }

    /// A name left out with a broken local header must still be one name
    /// once: torch's lookup may find the broken one.
    fn refuse_broken_duplicates(&self) -> Result<()> {
        let mut names = std::collections::HashSet::with_capacity(self.broken_locals.len());
        for &(name, local) in &self.broken_locals {
            let listed = self
                .by_name
                .find(self.hasher.hash_one(Folded(name)), |&i| {
                    same_name(name_of(&self.entries, i), name)
                })
                .is_some();
            if listed || !names.insert(name.to_ascii_lowercase()) {
                return Err(zip_err(format!("duplicate entry name {name:?}")).at(local));
            }
        }
        Ok(())
    }

    /// No two entries may share bytes: each entry's data must end before
    /// the next local header starts. Where the first local header lies
    /// (`file_len` when there is none).
    fn check_overlaps(&mut self, file_len: u64, rules: Rules) -> Result<u64> {
        self.locals.sort_unstable();
        let first_local = self.locals.first().map_or(file_len, |&(at, _)| at);
        for pair in self.locals.windows(2) {
            if let [(_, a), (next_local, _)] = pair {
                let a = self.entries.get(*a).ok_or_else(|| zip_err("entry index"))?;
                if a.data_start.saturating_add(a.compressed_size) > *next_local {
                    let message = format!("entry {:?} overlaps the next entry", a.name);
                    if rules == Rules::Canonical {
                        return Err(zip_err(message).at(a.data_start));
                    }
                    self.disagreements.push((message, a.data_start));
                }
            }
        }
        Ok(first_local)
    }
}

/// Just past the end record at `eocd` and its comment.
fn eocd_end(data: FileView<'_>, eocd: usize) -> Option<usize> {
    let comment_len = reader_at(data, eocd.checked_add(20)?, 2).ok()?.u16().ok()?;
    eocd.checked_add(EOCD_LEN)?
        .checked_add(usize::from(comment_len))
}

/// Note the local header (fixed part and name) of each of the `count`
/// entries of the central directory `cd` as wanted. Whether all are at
/// hand. Entries that do not parse are left to the full read to report.
fn want_local_headers(data: FileView<'_>, cd: &[u8], prefix_len: u64, count: usize) -> bool {
    let mut r = ByteReader::new(cd, ErrorKind::Zip);
    let mut all = true;
    for _ in 0..count {
        let Ok(fixed) = r.bytes(CENTRAL_LEN) else {
            break;
        };
        let le = |at: usize, n: usize| -> u64 {
            fixed.get(at..at + n).map_or(0, |b| {
                b.iter().rev().fold(0u64, |v, &x| v << 8 | u64::from(x))
            })
        };
        let (name_len, extra_len, comment_len) = (le(28, 2), le(30, 2), le(32, 2));
        let (mut size, mut csize, mut local) = (le(24, 4), le(20, 4), le(42, 4));
        let Ok(extra) = r
            .bytes(name_len as usize)
            .and_then(|_| r.bytes(extra_len as usize))
        else {
            break;
        };
        let _ = apply_zip64_extra(extra, &mut size, &mut csize, &mut local);
        if r.bytes(comment_len as usize).is_err() {
            break;
        }
        let start = prefix_len.saturating_add(local);
        all &= data.want(start, start.saturating_add(LOCAL_LEN + name_len));
    }
    all
}

fn name_of<'d>(entries: &[Entry<'d>], i: u32) -> &'d str {
    entries.get(i as usize).map_or("", |e| e.name)
}

fn read_central<'d>(
    r: &mut ByteReader<'d>,
    data: FileView<'d>,
    headers: Headers<'_>,
    scratch: &mut Vec<u8>,
    prefix_len: u64,
    cd_start: u64,
    // `None` under canonical rules; under tolerant ones, where what
    // canonical rules refuse is noted.
    mut disagreements: Option<&mut Vec<(String, u64)>>,
) -> Result<Central<'d>> {
    let canonical = disagreements.is_none();
    // Canonical rules refuse what tolerant ones note and read on.
    let mut refuse = |message: String, at: u64| -> Result<()> {
        match disagreements.as_deref_mut() {
            Some(noted) => {
                noted.push((message, at));
                Ok(())
            }
            None => Err(zip_err(message).at(at)),
        }
    };
    let central_at = cd_start + r.pos() as u64;
    if r.u32()? != CENTRAL_SIG {
        return Err(zip_err("bad central directory entry signature"));
    }
    let _made_by = r.u16()?;
    let _needed = r.u16()?;
    let flags = r.u16()?;
    let method = r.u16()?;
    let _time = r.u32()?;
    let crc32 = r.u32()?;
    let mut csize = u64::from(r.u32()?);
    let mut size = u64::from(r.u32()?);
    let name_len = usize::from(r.u16()?);
    let extra_len = usize::from(r.u16()?);
    let comment_len = usize::from(r.u16()?);
    let _disk = r.u16()?;
    let _internal = r.u16()?;
    let _external = r.u32()?;
    let mut local = u64::from(r.u32()?);
    let name_bytes = r.bytes(name_len)?;
    let extra = r.bytes(extra_len)?;
    r.bytes(comment_len)?;
    let name = std::str::from_utf8(name_bytes).map_err(|_| zip_err("entry name is not UTF-8"))?;
    // Tolerant rules keep an encrypted entry, marked: torch refuses it,
    // so its bytes are no disagreement with torch.
    let encrypted = flags & 0x2041 != 0;
    if flags & 0x0041 != 0 && canonical {
        return Err(zip_err(format!("entry {name:?} is encrypted")));
    }
    let method = match method {
        0 => Method::Stored,
        8 => Method::Deflated,
        m => {
            return Err(zip_err(format!(
                "entry {name:?} uses unsupported compression method {m}"
            )))
        }
    };
    apply_zip64_extra(extra, &mut size, &mut csize, &mut local)?;
    // An encrypted stored entry carries its encryption header.
    if method == Method::Stored && csize != size && (canonical || !encrypted) {
        refuse(
            format!("stored entry {name:?} has compressed size {csize} != size {size}"),
            central_at,
        )?;
    }
    // The local header must agree with the central directory on the name:
    // two readers must never see two different archives in the same bytes.
    let local_abs = prefix_len
        .checked_add(local)
        .ok_or_else(|| zip_err("local header offset overflows"))?;
    // The fixed header and, if it agrees, the name: one read.
    scratch.clear();
    scratch.resize(LOCAL_LEN as usize + name.len(), 0);
    let read = headers.read(data, local_abs, scratch)?;
    // An entry without its local header cannot be read by anyone: it is
    // left out, named, and fails only a read that needs it (as in torch).
    let Some(header) = read.get(..LOCAL_LEN as usize) else {
        return Ok(Central::BrokenLocal(name, local_abs));
    };
    let mut h = ByteReader::new(header, ErrorKind::Zip);
    if h.u32()? != LOCAL_SIG {
        return Ok(Central::BrokenLocal(name, local_abs));
    }
    let _needed = h.u16()?;
    let local_flags = h.u16()?;
    let _method = h.u16()?;
    let _time = h.u32()?;
    let _crc = h.u32()?;
    let _csize = h.u32()?;
    let _size = h.u32()?;
    let local_name_len = u64::from(h.u16()?);
    let local_extra_len = u64::from(h.u16()?);
    // Both headers marking it encrypted agree: torch refuses it.
    if local_flags & 0x0041 != 0 && (canonical || !encrypted) {
        refuse(
            format!("entry {name:?} is encrypted (local header)"),
            local_abs,
        )?;
    }
    let local_name = read
        .get(LOCAL_LEN as usize..)
        .and_then(|n| n.get(..usize::try_from(local_name_len).unwrap_or(usize::MAX)))
        .or_else(|| data.slice(local_abs + LOCAL_LEN, local_name_len))
        .ok_or_else(|| zip_err(format!("local name of {name:?} lies outside the file")))?;
    if local_name != name.as_bytes() {
        refuse(
            format!(
                "local header name {:?} differs from central directory name {name:?}",
                String::from_utf8_lossy(local_name)
            ),
            local_abs,
        )?;
    }
    let data_start = local_abs + LOCAL_LEN + local_name_len + local_extra_len;
    let data_end = data_start
        .checked_add(csize)
        .ok_or_else(|| zip_err(format!("size of {name:?} overflows")))?;
    if data_end > cd_start {
        refuse(
            format!(
                "data of {name:?} ({csize} bytes at {data_start:#x}) runs past the central directory"
            ),
            central_at,
        )?;
    }
    Ok(Central::Entry(
        Entry {
            name,
            method,
            data_start,
            compressed_size: csize,
            size,
            crc32,
            encrypted,
            local: local_abs,
        },
        local_abs,
    ))
}

/// The local header at `at`, read alone as a record: `None` when it does
/// not fit in the bytes or its name is not UTF-8.
#[cfg(feature = "scan")]
fn local_at(data: FileView<'_>, at: usize) -> Option<Hidden<'_>> {
    let mut h = ByteReader::new(data.get(at..at.checked_add(30)?)?, ErrorKind::Zip);
    if h.u32().ok()? != LOCAL_SIG {
        return None;
    }
    let _needed = h.u16().ok()?;
    let flags = h.u16().ok()?;
    let method = match h.u16().ok()? {
        0 => Method::Stored,
        8 => Method::Deflated,
        _ => return None,
    };
    let _time = h.u32().ok()?;
    let crc32 = h.u32().ok()?;
    let csize = u64::from(h.u32().ok()?);
    let size = u64::from(h.u32().ok()?);
    let name_len = usize::from(h.u16().ok()?);
    let extra_len = usize::from(h.u16().ok()?);
    let name_at = at.checked_add(30)?;
    let name = std::str::from_utf8(data.get(name_at..name_at.checked_add(name_len)?)?).ok()?;
    // The extra field must be in the file too.
    let extra_end = name_at.checked_add(name_len)?.checked_add(extra_len)?;
    if extra_end > data.len() {
        return None;
    }
    Some(Hidden {
        entry: Entry {
            name,
            method,
            data_start: at as u64 + LOCAL_LEN + name_len as u64 + extra_len as u64,
            compressed_size: csize,
            size,
            crc32,
            encrypted: flags & 0x41 != 0,
            local: at as u64,
        },
        sizes_unknown: flags & 0x8 != 0 && csize == 0,
    })
}

/// Inflate a deflated entry, charging its size against `budget`.
pub(crate) fn inflate<'d>(
    data: impl Into<FileView<'d>>,
    entry: &Entry<'_>,
    budget: &mut u64,
) -> Result<Vec<u8>> {
    let data = data.into();
    let record = Deflated::charge(data, entry, budget)?;
    record.inflate_raw(data.slice(entry.data_start, entry.compressed_size))
}

/// A deflated record, located and paid for: what inflating it needs, owned,
/// so that it can be inflated when it is first read rather than at open.
#[derive(Debug, Clone)]
pub(crate) struct Deflated {
    name: String,
    data_start: u64,
    compressed_size: u64,
    size: u64,
    crc32: u32,
}

impl Deflated {
    /// `entry`, its compressed bytes checked to lie in `data` and its
    /// declared size charged to `budget` (so every inflation a file can
    /// cause is bounded at open, before any is done).
    pub(crate) fn charge(
        data: FileView<'_>,
        entry: &Entry<'_>,
        budget: &mut u64,
    ) -> Result<Deflated> {
        // Only the bounds: a view of fetched ranges need not hold the
        // bytes before they are inflated.
        let within = entry
            .data_start
            .checked_add(entry.compressed_size)
            .is_some_and(|end| end <= data.len() as u64);
        if !within {
            return Err(zip_err("deflated data lies outside the file")
                .at(entry.data_start)
                .in_record(entry.name));
        }
        if entry.size > *budget {
            return Err(Error::limit("max_decompressed_bytes", *budget).in_record(entry.name));
        }
        *budget -= entry.size;
        Ok(Deflated {
            name: entry.name.to_owned(),
            data_start: entry.data_start,
            compressed_size: entry.compressed_size,
            size: entry.size,
            crc32: entry.crc32,
        })
    }

    /// The record's bytes, inflated from `data` (the file it was found
    /// in), exactly its declared size, CRC-checked.
    pub(crate) fn inflate(&self, data: &[u8]) -> Result<Vec<u8>> {
        self.inflate_raw(crate::bytes::slice(
            data,
            self.data_start,
            self.compressed_size,
        ))
    }

    /// Where the compressed bytes lie: offset and length.
    pub(crate) fn range(&self) -> (u64, u64) {
        (self.data_start, self.compressed_size)
    }

    /// Inflate `raw`, the record's compressed bytes (`None`: not in the file).
    pub(crate) fn inflate_raw(&self, raw: Option<&[u8]>) -> Result<Vec<u8>> {
        let raw =
            raw.ok_or_else(|| zip_err("deflated data lies outside the file").at(self.data_start))?;
        // Reserve only what the compressed bytes could plausibly produce; the
        // declared size is not trusted for the allocation.
        let reserve = self
            .size
            .min(self.compressed_size.saturating_mul(4).saturating_add(4096));
        let mut out = Vec::with_capacity(usize::try_from(reserve).unwrap_or(0));
        inflate_into(raw, self.size, &mut out)
            .map_err(|e| zip_err(format!("inflating failed: {e}")).in_record(&self.name))?;
        if out.len() as u64 != self.size {
            return Err(zip_err(format!(
                "inflated to {} bytes, the directory says {}",
                out.len(),
                self.size
            ))
            .in_record(&self.name));
        }
        crc_matches(&out, self.crc32, &self.name)?;
        Ok(out)
    }
}

impl Deflated {
    /// Inflate `raw` (the record's compressed bytes; `None`: not in the
    /// file) into `out`, which must be exactly the record's size: for a
    /// reader that owns its buffer (nothing is allocated here). A stream
    /// shorter or longer than the record says, and a CRC mismatch, are
    /// errors.
    pub(crate) fn inflate_raw_into(&self, raw: Option<&[u8]>, out: &mut [u8]) -> Result<()> {
        let raw =
            raw.ok_or_else(|| zip_err("deflated data lies outside the file").at(self.data_start))?;
        if out.len() as u64 != self.size {
            return Err(zip_err(format!(
                "a buffer of {} bytes for a record of {}",
                out.len(),
                self.size
            ))
            .in_record(&self.name));
        }
        inflate_exact(raw, out)
            .map_err(|e| zip_err(format!("inflating failed: {e}")).in_record(&self.name))?;
        crc_matches(out, self.crc32, &self.name)
    }
}

/// Inflate `raw` into `out`, filling it exactly: fewer bytes, or more
/// after it, are an error.
#[cfg(feature = "deflate")]
fn inflate_exact(raw: &[u8], out: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    let mut decoder = flate2::read::DeflateDecoder::new(raw);
    decoder.read_exact(out)?;
    let mut more = [0u8; 1];
    if decoder.read(&mut more)? != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the stream inflates to more bytes than the record says",
        ));
    }
    Ok(())
}

#[cfg(not(feature = "deflate"))]
fn inflate_exact(_: &[u8], _: &mut [u8]) -> std::io::Result<()> {
    inflate_into(&[], 0, &mut Vec::new())
}

/// Inflate `raw` into `out`, at most `size` bytes (fewer when the stream
/// ends first: the caller compares), an error when it goes on past them.
/// First as much as `out` has room for (what the compressed bytes could
/// plausibly make), growing nothing; a stream that goes on past that (a
/// run of zeros, or a bomb) gets the rest of `size` (charged to the limits
/// when the record was found) reserved at once and filled in place as its
/// bytes come: never copied to a larger buffer, so the peak is the bytes
/// inflated, not twice them.
#[cfg(feature = "deflate")]
fn inflate_into(raw: &[u8], size: u64, out: &mut Vec<u8>) -> std::io::Result<()> {
    use std::io::Read;
    let mut decoder = flate2::read::DeflateDecoder::new(raw);
    let first = (out.capacity() as u64).min(size);
    (&mut decoder).take(first).read_to_end(out)?;
    if (out.len() as u64) < first {
        return Ok(());
    }
    let whole = usize::try_from(size)
        .map_err(|_| std::io::Error::other(format!("a record of {size} bytes")))?;
    if out.len() < whole {
        let old = out.len();
        out.try_reserve_exact(whole - old).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot hold {size} inflated bytes"),
            )
        })?;
        // Filled a step at a time: a record that declares more than its
        // stream makes touches only the pages its bytes fill.
        const STEP: usize = 1 << 20;
        while out.len() < whole {
            let from = out.len();
            out.resize(from.saturating_add(STEP).min(whole), 0);
            let mut filled = from;
            while let Some(rest) = out.get_mut(filled..).filter(|r| !r.is_empty()) {
                match decoder.read(rest)? {
                    0 => break,
                    n => filled += n,
                }
            }
            let ended = filled < out.len();
            out.truncate(filled);
            if ended {
                return Ok(());
            }
        }
    }
    let mut more = [0u8; 1];
    if decoder.read(&mut more)? != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("inflated to more than {size} bytes, the directory says {size}"),
        ));
    }
    Ok(())
}

/// Without feature `deflate`, a deflated record is refused, naming it.
#[cfg(not(feature = "deflate"))]
fn inflate_into(_: &[u8], _: u64, _: &mut Vec<u8>) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "deflated records need ptload-reader's feature `deflate` (off in this build)",
    ))
}

/// Below this many bytes (a pickle, a small record), CRC-32 by tables:
/// crc32fast's first call asks the processor what it supports, which
/// costs more than the whole sum of a small record does (`cpuid` leaves
/// the guest on a virtual machine: 61 µs measured).
const CRC_BY_TABLE: usize = 64 * 1024;

/// The CRC-32 (IEEE, as zip records it) of `bytes`.
fn crc32(bytes: &[u8]) -> u32 {
    if bytes.len() > CRC_BY_TABLE {
        return crc32fast::hash(bytes);
    }
    // A byte's entry: the index is a u8, so always in the table.
    fn at(table: &[u32; 256], byte: u8) -> u32 {
        table.get(usize::from(byte)).copied().unwrap_or(0)
    }
    let [t0, t1, t2, t3, t4, t5, t6, t7] = crc_tables();
    let mut crc = !0u32;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let Ok(&[a, b, c, d, e, f, g, h]) = <&[u8; 8]>::try_from(w) else {
            continue;
        };
        let [a, b, c, d] = (u32::from_le_bytes([a, b, c, d]) ^ crc).to_le_bytes();
        crc = at(t7, a)
            ^ at(t6, b)
            ^ at(t5, c)
            ^ at(t4, d)
            ^ at(t3, e)
            ^ at(t2, f)
            ^ at(t1, g)
            ^ at(t0, h);
    }
    for &b in words.remainder() {
        crc = at(t0, (crc as u8) ^ b) ^ (crc >> 8);
    }
    !crc
}

/// Slicing-by-8 tables of the reflected polynomial 0xEDB88320 (table k
/// advances a byte's contribution by k more bytes), made on first use.
fn crc_tables() -> &'static [[u32; 256]; 8] {
    static TABLES: std::sync::OnceLock<[[u32; 256]; 8]> = std::sync::OnceLock::new();
    TABLES.get_or_init(|| {
        let mut t = [[0u32; 256]; 8];
        let [first, more @ ..] = &mut t;
        for (i, slot) in (0u32..).zip(first.iter_mut()) {
            let mut c = i;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *slot = c;
        }
        let mut prev: [u32; 256] = *first;
        for row in more.iter_mut() {
            for (slot, &p) in row.iter_mut().zip(prev.iter()) {
                *slot = (p >> 8) ^ first.get((p & 0xff) as usize).copied().unwrap_or(0);
            }
            prev = *row;
        }
        t
    })
}

/// Check an entry's CRC-32 (a zero CRC means "not computed" and passes).
pub(crate) fn check_crc(bytes: &[u8], entry: &Entry<'_>) -> Result<()> {
    crc_matches(bytes, entry.crc32, entry.name)
}

fn crc_matches(bytes: &[u8], recorded: u32, record: &str) -> Result<()> {
    if recorded == 0 {
        return Ok(());
    }
    let actual = crc32(bytes);
    if actual != recorded {
        return Err(zip_err(format!(
            "CRC-32 mismatch: computed {actual:08x}, recorded {recorded:08x}"
        ))
        .in_record(record));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Local headers read with `pread` (entries far apart): a read the
    /// system fails is an I/O error, not an entry taken as broken.
    #[test]
    fn a_failed_read_of_a_local_header_is_an_io_error() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/files/llama_wide.pt"
        );
        let data = std::fs::read(path).unwrap();
        let limits = Limits::default();
        let readable = std::fs::File::open(path).unwrap();
        let archive = Archive::parse(&data, Headers::File(&readable), &limits).unwrap();
        assert!(
            (data.len() as u64) / (archive.entries().len() as u64) >= SPREAD_FOR_PREAD,
            "the fixture's entries must be read by pread"
        );
        // A handle that cannot be read from: every read fails (EBADF).
        let copy = std::env::temp_dir().join(format!("ptload-zip-wronly-{}", std::process::id()));
        std::fs::write(&copy, &data).unwrap();
        let unreadable = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
        let e =
            Archive::parse(&data, Headers::File(&unreadable), &limits).expect_err("the reads fail");
        assert_eq!(e.kind(), crate::error::ErrorKind::Io, "{e}");
        assert!(e.to_string().contains("local header"), "{e}");
        #[cfg(feature = "scan")]
        {
            let kept = KeptReads::new(&unreadable);
            let e = Archive::parse(&data, Headers::Kept(&kept), &limits).expect_err("they fail");
            assert_eq!(e.kind(), crate::error::ErrorKind::Io, "{e}");
        }
        let _ = std::fs::remove_file(&copy);
    }

    /// The tables give crc32fast's sums, at every length and alignment.
    #[test]
    fn crc_by_tables_is_crc32() {
        let bytes: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for len in (0..300).chain([1023, 4096]) {
            for start in 0..3 {
                let b = &bytes[start..(start + len).min(bytes.len())];
                assert_eq!(crc32(b), crc32fast::hash(b), "{start} {len}");
            }
        }
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    /// Kept reads: the same archive as plain positioned reads give, each
    /// local header read once (a second parse, and the bytes just before
    /// a header, come from what was kept), and a short read at the end.
    #[cfg(feature = "scan")]
    #[test]
    fn kept_reads_answer_again_from_what_they_read() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/files/llama_wide.pt"
        );
        let data = std::fs::read(path).unwrap();
        let limits = Limits::default();
        let copy = std::env::temp_dir().join(format!("ptload-zip-kept-{}", std::process::id()));
        std::fs::write(&copy, &data).unwrap();
        let file = std::fs::File::open(&copy).unwrap();
        let plain = Archive::parse(&data, Headers::File(&file), &limits).unwrap();
        let kept = KeptReads::new(&file);
        let first = Archive::parse(&data, Headers::Kept(&kept), &limits).unwrap();
        let reads = kept.kept.borrow().len();
        assert_eq!(reads, plain.entries().len());
        // The file changes under the reader: what was kept answers.
        std::fs::write(&copy, vec![0u8; data.len()]).unwrap();
        let again = Archive::parse(&data, Headers::Kept(&kept), &limits).unwrap();
        assert_eq!(kept.kept.borrow().len(), reads, "no read made again");
        let starts =
            |a: &Archive<'_>| -> Vec<u64> { a.entries().iter().map(|e| e.data_start).collect() };
        assert_eq!(starts(&first), starts(&plain));
        assert_eq!(starts(&again), starts(&plain));
        // The bytes before a header were read with it.
        let local = plain.entries()[1].local;
        let mut behind = [0u8; 16];
        let got = kept.read(local - 16, &mut behind).unwrap().to_vec();
        assert_eq!(kept.kept.borrow().len(), reads);
        assert_eq!(got, data[local as usize - 16..local as usize]);
        // At the end of the file: as many bytes as there are.
        let mut tail = [0u8; 64];
        let end = data.len() as u64 - 10;
        assert_eq!(kept.read(end, &mut tail).unwrap(), &[0u8; 10][..]);
        let _ = std::fs::remove_file(&copy);
    }
}
