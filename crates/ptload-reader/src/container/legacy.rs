//! The legacy layout (torch < 1.6, `_use_new_zipfile_serialization=False`):
//! a stream of pickles (magic number, protocol version, system info, the
//! object, the sorted storage keys) followed by each storage as an int64
//! element count and its raw bytes. The pickles are the layers above's to
//! run; this module locates the raw part that follows them.

use crate::bytes::ByteOrder;
use crate::error::{Error, ErrorKind, Result};
use crate::ranged::FileView;

/// The protocol version the second pickle holds.
pub(crate) const PROTOCOL_VERSION: i64 = 1001;

fn legacy_err(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Legacy, message)
}

/// A storage as the object pickle describes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LegacyStorage<'a> {
    pub(crate) key: &'a str,
    pub(crate) numel: u64,
    /// Bytes per element.
    pub(crate) elem_size: u64,
    /// For views (very old files): the index of the storage it is a slice
    /// of, and the element it starts at.
    pub(crate) view: Option<(usize, u64)>,
}

/// Note the element count before each listed storage as wanted (where
/// the pickle's sizes put them): one round of ranged reads for them all.
/// Whether all are at hand; what does not add up is left to the full read.
fn want_headers(
    data: FileView<'_>,
    start: usize,
    listed: &[String],
    storages: &[LegacyStorage<'_>],
    index_of: &impl Fn(&str) -> Option<usize>,
) -> bool {
    let mut pos = start as u64;
    let mut all = true;
    for key in listed {
        let Some(s) = index_of(key).and_then(|id| storages.get(id)) else {
            break;
        };
        all &= data.want(pos, pos.saturating_add(8));
        let Some(next) = s
            .numel
            .checked_mul(s.elem_size)
            .and_then(|n| n.checked_add(8))
            .and_then(|n| pos.checked_add(n))
        else {
            break;
        };
        pos = next;
    }
    all
}

/// The file offset of each storage's bytes, in the order of `storages`,
/// and the offset just past the last one (where the stream ends).
/// The raw part starts at `start`, just after the storage-key pickle, and
/// holds the storages `listed` there in that order; `index_of` finds a
/// listed key among `storages`. Views lie inside their root storage.
pub(crate) fn storage_offsets(
    data: FileView<'_>,
    start: usize,
    byte_order: ByteOrder,
    listed: &[String],
    storages: &[LegacyStorage<'_>],
    index_of: impl Fn(&str) -> Option<usize>,
) -> Result<(Vec<u64>, u64)> {
    let mut offsets: Vec<Option<u64>> = vec![None; storages.len()];
    if data.whole().is_none() && !want_headers(data, start, listed, storages, &index_of) {
        return Err(legacy_err("storage headers not fetched yet"));
    }
    let mut pos = start;
    for key in listed {
        let at = pos as u64;
        let (id, storage) = index_of(key)
            .and_then(|id| Some((id, storages.get(id)?)))
            .ok_or_else(|| {
                legacy_err(format!("storage key {key:?} is listed but never used")).at(at)
            })?;
        if storage.view.is_some() {
            return Err(
                legacy_err(format!("storage key {key:?} names a view, not a storage")).at(at),
            );
        }
        let header: [u8; 8] = data
            .get(pos..pos.saturating_add(8))
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| legacy_err("unexpected end of file").at(at))?;
        let count = match byte_order {
            ByteOrder::Little => i64::from_le_bytes(header),
            ByteOrder::Big => i64::from_be_bytes(header),
        };
        if u64::try_from(count).ok() != Some(storage.numel) {
            return Err(legacy_err(format!(
                "storage {key:?}: the data header says {count} elements, the pickle says {}",
                storage.numel
            ))
            .at(at));
        }
        let nbytes = storage
            .numel
            .checked_mul(storage.elem_size)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| legacy_err("storage size overflows").at(at))?;
        let start = pos + 8;
        pos = start
            .checked_add(nbytes)
            .filter(|&end| end <= data.len())
            .ok_or_else(|| {
                legacy_err(format!(
                    "storage {key:?} ({nbytes} bytes) runs past the end of the file"
                ))
                .at(at)
            })?;
        let start = start as u64;
        let slot = offsets
            .get_mut(id)
            .ok_or_else(|| legacy_err(format!("storage key {key:?}: no such storage")).at(at))?;
        if slot.is_some() {
            return Err(legacy_err(format!("storage key {key:?} is listed twice")).at(at));
        }
        *slot = Some(start);
    }
    let end = pos as u64;
    // Views (very old files) are slices of their root storage.
    for (id, storage) in storages.iter().enumerate() {
        let Some((root_id, elem_offset)) = storage.view else {
            continue;
        };
        let root = storages
            .get(root_id)
            .ok_or_else(|| legacy_err(format!("storage view {:?}: no root", storage.key)))?;
        let end = elem_offset.checked_add(storage.numel);
        if end.is_none_or(|e| e > root.numel) {
            return Err(legacy_err(format!(
                "storage view {:?} lies outside storage {:?}",
                storage.key, root.key
            )));
        }
        let root_start = offsets.get(root_id).copied().flatten();
        let start =
            root_start.and_then(|o| o.checked_add(elem_offset.checked_mul(root.elem_size)?));
        if let Some(slot) = offsets.get_mut(id) {
            *slot = start;
        }
    }
    let offsets = storages
        .iter()
        .zip(offsets)
        .map(|(s, offset)| {
            offset.ok_or_else(|| {
                Error::new(
                    ErrorKind::Tensor,
                    format!("storage {} has no data in the file", s.key),
                )
            })
        })
        .collect::<Result<_>>()?;
    Ok((offsets, end))
}
