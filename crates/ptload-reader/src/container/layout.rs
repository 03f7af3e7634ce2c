//! torch's zip layout: which records of the archive hold what. One folder
//! (any name) holds `data.pkl`, an optional `byteorder`, TorchScript's
//! `constants.pkl`, and the storages under `data/` (and `constants/`),
//! named by the pickles' persistent ids.

use std::borrow::Cow;

use super::zip::{self, Archive, Entry, Method};
use crate::bytes::ByteOrder;
use crate::error::{Error, ErrorKind, Result};
use crate::ranged::FileView;

/// The records that make a zip a torch checkpoint.
#[derive(Debug)]
pub(crate) struct TorchRecords<'a, 'd> {
    /// The folder all records live in, with its trailing `/` (may be empty).
    pub(crate) prefix: String,
    pub(crate) data_pkl: &'a Entry<'d>,
    /// TorchScript's constants table, when present.
    pub(crate) constants_pkl: Option<&'a Entry<'d>>,
    pub(crate) byte_order: ByteOrder,
}

/// Where a storage's bytes are once its record is found.
#[derive(Debug)]
pub(crate) enum StorageBytes {
    /// At this offset of the file, stored uncompressed.
    File(u64),
    /// In a deflated record, inflated when first read.
    Deflated(zip::Deflated),
}

/// Find the records of torch's layout in `archive`; `budget` is charged for
/// what is inflated. A file without a `byteorder` record (older torch, or
/// `_disable_byteorder_record`) is read in `assumed` order.
pub(crate) fn torch_records<'a, 'd>(
    data: FileView<'_>,
    archive: &'a Archive<'d>,
    budget: &mut u64,
    assumed: ByteOrder,
) -> Result<TorchRecords<'a, 'd>> {
    // A record torch reads that lost its local header fails the load, as
    // it fails torch.load (both weights_only modes, 2.15): data.pkl, the
    // storages, and these; any other such entry is only named (see
    // `decode_zip`).
    let data_pkl = find_data_pkl(archive)?;
    let prefix = data_pkl
        .name
        .len()
        .checked_sub("data.pkl".len())
        .and_then(|at| data_pkl.name.get(..at))
        .map(str::to_owned)
        .ok_or_else(|| Error::new(ErrorKind::Zip, "data.pkl record without its name"))?;
    for record in [
        "byteorder",
        "constants.pkl",
        "version",
        ".data/version",
        ".format_version",
        ".storage_alignment",
        ".data/serialization_id",
    ] {
        let name = format!("{prefix}{record}");
        if let Some(at) = archive.broken(&name) {
            return Err(Archive::broken_err(&name, at));
        }
    }
    let byte_order = match archive.get(&format!("{prefix}byteorder")) {
        None => assumed,
        Some(entry) => {
            let raw = record_bytes(data, entry, 64, budget)?;
            match std::str::from_utf8(&raw).map(str::trim) {
                Ok("little") => ByteOrder::Little,
                Ok("big") => ByteOrder::Big,
                _ => {
                    return Err(Error::new(
                        ErrorKind::Zip,
                        format!(
                            "Unknown endianness type: {:?}",
                            String::from_utf8_lossy(&raw)
                        ),
                    )
                    .in_record(entry.name))
                }
            }
        }
    };
    let constants_pkl = archive.get(&format!("{prefix}constants.pkl"));
    Ok(TorchRecords {
        prefix,
        data_pkl,
        constants_pkl,
        byte_order,
    })
}

/// Whether `name` is `data.pkl` directly under one folder (or at the
/// root), letter case aside, as torch's reader finds it.
fn is_data_pkl(name: &str) -> bool {
    // The tail first: an archive of many records checks every name.
    let bytes = name.as_bytes();
    let ends = bytes
        .len()
        .checked_sub(8)
        .and_then(|at| bytes.get(at..))
        .is_some_and(|tail| tail.eq_ignore_ascii_case(b"data.pkl"));
    if !ends {
        return false;
    }
    let folders = bytes.iter().filter(|&&b| b == b'/').count();
    folders == 0 && bytes.len() == 8 || folders == 1 && bytes.get(bytes.len() - 9) == Some(&b'/')
}

/// The entry named `data.pkl` directly under one folder (or at the root),
/// letter case aside; of names equal but for case, the last (what torch
/// reads).
pub(crate) fn find_data_pkl<'a, 'd>(archive: &'a Archive<'d>) -> Result<&'a Entry<'d>> {
    let mut candidates = archive
        .entries()
        .iter()
        .filter(|e| is_data_pkl(e.name))
        .filter_map(|e| archive.get(e.name));
    let Some(first) = candidates.next() else {
        let broken = archive
            .broken_locals()
            .iter()
            .find(|&&(name, _)| is_data_pkl(name));
        return Err(match broken {
            Some(&(name, at)) => Archive::broken_err(name, at),
            None => Error::new(
                ErrorKind::NotACheckpoint,
                "zip archive without a data.pkl record: not a torch checkpoint",
            ),
        });
    };
    if let Some(second) = candidates.find(|e| !std::ptr::eq(*e, first)) {
        return Err(Error::new(
            ErrorKind::Zip,
            format!(
                "two pickles could be the checkpoint: {} and {}",
                first.name, second.name
            ),
        ));
    }
    Ok(first)
}

/// The bytes of a small record (a pickle, `byteorder`), CRC-checked.
pub(crate) fn record_bytes<'d>(
    data: impl Into<FileView<'d>>,
    entry: &Entry<'_>,
    limit: u64,
    budget: &mut u64,
) -> Result<Cow<'d, [u8]>> {
    let data = data.into();
    if entry.size > limit {
        return Err(
            Error::limit_needing("max_pickle_bytes", limit, entry.size).in_record(entry.name)
        );
    }
    match entry.method {
        Method::Stored => {
            let bytes = data.slice(entry.data_start, entry.size).ok_or_else(|| {
                Error::new(ErrorKind::Zip, "record lies outside the file").in_record(entry.name)
            })?;
            zip::check_crc(bytes, entry)?;
            Ok(Cow::Borrowed(bytes))
        }
        Method::Deflated => zip::inflate(data, entry, budget).map(Cow::Owned),
    }
}

/// Locate the storage record `record`, which the pickle says holds `nbytes`
/// bytes (`key` names the storage in errors). Stored records stay in the
/// file; deflated ones are charged to `budget` and inflated when read.
pub(crate) fn storage_bytes(
    data: FileView<'_>,
    archive: &Archive<'_>,
    record: &str,
    key: &str,
    nbytes: Option<u64>,
    budget: &mut u64,
) -> Result<StorageBytes> {
    let entry = archive
        .get(record)
        .ok_or_else(|| match archive.broken(record) {
            Some(at) => Archive::broken_err(record, at),
            None => Error::new(
                ErrorKind::Tensor,
                format!("storage record is missing (storage key {key:?})"),
            )
            .in_record(record),
        })?;
    let expected = nbytes
        .ok_or_else(|| Error::new(ErrorKind::Tensor, "storage size overflows").in_record(record))?;
    if entry.size != expected {
        return Err(Error::new(
            ErrorKind::Tensor,
            format!(
                "record size ({} bytes) does not match expected size ({expected} bytes)",
                entry.size
            ),
        )
        .in_record(record));
    }
    Ok(match entry.method {
        Method::Stored => StorageBytes::File(entry.data_start),
        Method::Deflated => StorageBytes::Deflated(zip::Deflated::charge(data, entry, budget)?),
    })
}
