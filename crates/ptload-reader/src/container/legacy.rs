//! The legacy layout (torch < 1.6, `_use_new_zipfile_serialization=False`):
//! a stream of pickles (magic number, protocol version, system info, the
//! object, the sorted storage keys) followed by each storage as an int64
//! element count and its raw bytes.

use crate::bytes::ByteReader;
use crate::checkpoint::{ByteOrder, LegacyParts};
use crate::container::detect::LEGACY_MAGIC;
use crate::error::{Error, ErrorKind, Result};
use crate::pickle::{Heap, Value, Vm};
use crate::torch::TorchInterp;

const PROTOCOL_VERSION: i64 = 1001;

fn legacy_err(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Legacy, message)
}

pub(crate) fn load(
    data: &[u8],
    heap: &mut Heap,
    interp: &mut TorchInterp<'_>,
    vm: &mut Vm<'_>,
) -> Result<LegacyParts> {
    let mut run = |heap: &mut Heap, interp: &mut TorchInterp<'_>, start: usize, section: &str| {
        interp.enter(&format!("legacy {section} pickle"), None);
        vm.run(heap, interp, data, start)
            .map_err(|e| e.in_record(&interp.record))
    };
    let magic = run(heap, interp, 0, "magic number")?;
    // The LONG1 payload: the magic number's 10 little-endian bytes.
    let magic_bytes = LEGACY_MAGIC.get(4..).unwrap_or_default();
    if heap.bigint(magic.value) != Some(magic_bytes) {
        return Err(legacy_err("Invalid magic number; corrupt file?"));
    }
    let version = run(heap, interp, magic.end, "protocol version")?;
    if version.value != Value::Int(PROTOCOL_VERSION) {
        return Err(legacy_err("Invalid protocol version").at(magic.end as u64));
    }
    let sys_info = run(heap, interp, version.end, "sys_info")?;
    let little = heap
        .dict(sys_info.value)
        .and_then(|d| d.get_str(heap, "little_endian"))
        .is_none_or(|v| v != Value::Bool(false));
    let object = run(heap, interp, sys_info.end, "object")?;
    let keys = run(heap, interp, object.end, "storage keys")?;
    let key_list: Vec<String> = heap
        .sequence(keys.value)
        .ok_or_else(|| legacy_err("storage key list is not a list").at(object.end as u64))?
        .iter()
        .map(|&k| match k {
            Value::Int(i) => Some(i.to_string()),
            other => heap.text(other).map(str::to_owned),
        })
        .collect::<Option<_>>()
        .ok_or_else(|| legacy_err("storage key is not a str").at(object.end as u64))?;

    let mut offsets: Vec<Option<u64>> = vec![None; interp.storages.len()];
    let mut r = ByteReader::at(data, keys.end, ErrorKind::Legacy);
    for key in &key_list {
        let at = r.pos() as u64;
        let id = interp.storage_by_key(key).ok_or_else(|| {
            legacy_err(format!("storage key {key:?} is listed but never used")).at(at)
        })?;
        let storage = interp
            .storages
            .get(id)
            .ok_or_else(|| legacy_err("storage index"))?;
        if storage.view.is_some() {
            return Err(
                legacy_err(format!("storage key {key:?} names a view, not a storage")).at(at),
            );
        }
        let header: [u8; 8] = r.array()?;
        let count = if little {
            i64::from_le_bytes(header)
        } else {
            i64::from_be_bytes(header)
        };
        if count != i64::try_from(storage.numel).unwrap_or(-1) {
            return Err(legacy_err(format!(
                "storage {key:?}: the data header says {count} elements, the pickle says {}",
                storage.numel
            ))
            .at(at));
        }
        let nbytes = storage
            .numel
            .checked_mul(storage.dtype.size() as u64)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| legacy_err("storage size overflows").at(at))?;
        let start = r.pos() as u64;
        r.bytes(nbytes).map_err(|_| {
            legacy_err(format!(
                "storage {key:?} ({nbytes} bytes) runs past the end of the file"
            ))
            .at(at)
        })?;
        if let Some(slot) = offsets.get_mut(id) {
            if slot.is_some() {
                return Err(legacy_err(format!("storage key {key:?} is listed twice")).at(at));
            }
            *slot = Some(start);
        }
    }
    // Views (very old files) are slices of their root storage.
    for id in 0..interp.storages.len() {
        let Some(storage) = interp.storages.get(id) else {
            continue;
        };
        let Some(view) = storage.view else { continue };
        let root = interp
            .storages
            .get(view.root)
            .ok_or_else(|| legacy_err("view root index"))?;
        let end = view.elem_offset.checked_add(storage.numel);
        if end.is_none_or(|e| e > root.numel) {
            return Err(legacy_err(format!(
                "storage view {:?} lies outside storage {:?}",
                storage.key, root.key
            )));
        }
        let elem = root.dtype.size() as u64;
        let start = offsets
            .get(view.root)
            .copied()
            .flatten()
            .map(|o| o + view.elem_offset * elem);
        if let Some(slot) = offsets.get_mut(id) {
            *slot = start;
        }
    }
    Ok(LegacyParts {
        byte_order: if little {
            ByteOrder::Little
        } else {
            ByteOrder::Big
        },
        protocol: object.protocol,
        root: object.value,
        storages: interp.storages.drain(..).zip(offsets).collect(),
    })
}
