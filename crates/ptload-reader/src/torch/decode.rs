//! Running a container's pickles with the torch interpreter: every layout
//! comes out as the same parts (the root values to name, and each storage
//! with where its bytes are).

use super::plain::{self, PlainTensor};
use super::{PendingStorage, TorchInterp};
use crate::advice::Warning;
use crate::bytes::ByteOrder;
use crate::container::layout::{self, StorageBytes};
use crate::container::legacy::{self, LegacyStorage};
use crate::container::zip::{Archive, Headers, Method};
use crate::container::{Format, LEGACY_MAGIC_VALUE};
use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::name_index::NameIndex;
use crate::pickle::{Heap, Value, Vm};
use crate::ranged::FileView;

/// A checkpoint's pickles run, its storages located.
pub(crate) struct Decoded {
    pub(crate) format: Format,
    pub(crate) byte_order: ByteOrder,
    pub(crate) protocol: u8,
    /// The values to name, with the name of their root (`""` for the
    /// object, `constants` for TorchScript's constants table).
    pub(crate) roots: Vec<(Value, &'static str)>,
    pub(crate) storages: Vec<PendingStorage>,
    /// Where the bytes of each of `storages` are, in the same order.
    pub(crate) bytes: Vec<StorageBytes>,
    /// The offset just past the checkpoint's last byte: a stream reader
    /// (torch.load on a file object) leaves the stream there.
    pub(crate) end: u64,
    /// What the reader passed over (entries of the archive it never
    /// needed whose local header is broken).
    pub(crate) notes: Vec<Warning>,
    /// A plain state dict's tensors, read without the general machine
    /// (`roots` is then empty).
    pub(crate) plain: Option<PlainTensors>,
}

/// The tensors of a plain state dict (see [`plain`]).
pub(crate) struct PlainTensors {
    pub(crate) tensors: Vec<PlainTensor>,
    pub(crate) by_name: NameIndex,
    pub(crate) work: u64,
}

/// torch's zip layout (and TorchScript's). With `plain_ok`, a plain
/// state dict is read without the general machine (see [`plain`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_zip(
    data: FileView<'_>,
    headers: Headers<'_>,
    assumed: ByteOrder,
    limits: &Limits,
    heap: &mut Heap,
    interp: &mut TorchInterp<'_>,
    vm: &mut Vm<'_>,
    plain_ok: bool,
    kept: Option<&plain::KeptPlain>,
) -> Result<Decoded> {
    let archive = Archive::parse(data, headers, limits)?;
    let mut budget = limits.max_decompressed_bytes;
    let records = layout::torch_records(data, &archive, &mut budget, assumed)?;
    let prefix = &records.prefix;
    let mut roots = Vec::new();
    let mut protocol = 0;
    let mut plain = None;
    // data.pkl's bytes, read once: by the shortcut, then (when it gives
    // up) by the general machine.
    let data_pkl = records.data_pkl;
    let mut data_bytes = Some(layout::record_bytes(
        data,
        data_pkl,
        limits.max_pickle_bytes,
        &mut budget,
    )?);
    if plain_ok && records.constants_pkl.is_none() {
        let dir = format!("{prefix}data/");
        let bytes = data_bytes.as_deref().unwrap_or_default();
        let at = (data_pkl.name, dir.as_str(), archive.entries().len());
        // The scan before this decode may have read the same bytes so.
        let stored = data_pkl.method == Method::Stored;
        let kept = kept.filter(|_| stored).and_then(|k| k.take(bytes, at));
        let read = match kept {
            Some(plain) => Some(plain),
            None => plain::read(bytes, at, limits, vm.cancel.as_deref())
                .map_err(|e| e.in_record(data_pkl.name))?,
        };
        if let Some(read) = read {
            interp.globals = read.globals;
            interp.storages = read.storages;
            protocol = read.protocol;
            plain = Some(PlainTensors {
                tensors: read.tensors,
                by_name: read.by_name,
                work: read.work,
            });
        }
    }
    for (entry, dir, root_name) in [
        (Some(data_pkl), "data/", ""),
        (records.constants_pkl, "constants/", "constants"),
    ] {
        let Some(entry) = entry.filter(|_| plain.is_none()) else {
            continue;
        };
        let bytes = match data_bytes.take().filter(|_| root_name.is_empty()) {
            Some(bytes) => bytes,
            None => layout::record_bytes(data, entry, limits.max_pickle_bytes, &mut budget)?,
        };
        interp.enter(entry.name, Some(format!("{prefix}{dir}")));
        if root_name.is_empty() {
            // A storage's bytes are a record of its own, so the archive's
            // entries (counted from bytes present, within max_zip_entries)
            // bound how many storages a file that opens can name.
            interp.reserve_storages(archive.entries().len());
        }
        let out = vm
            .run(heap, interp, &bytes, 0)
            .map_err(|e| e.in_record(entry.name))?;
        if root_name.is_empty() {
            protocol = out.protocol;
        }
        // An empty constants table names nothing.
        if !(root_name == "constants" && heap.tuple(out.value).is_some_and(<[Value]>::is_empty)) {
            roots.push((out.value, root_name));
        }
    }
    // The storages stay where the interpreter made them; only where their
    // bytes are is collected beside them.
    let storages = std::mem::take(&mut interp.storages);
    let mut located = Vec::with_capacity(storages.len());
    for p in &storages {
        let record = p.record.as_deref().ok_or_else(|| {
            Error::new(
                ErrorKind::Tensor,
                format!("storage {:?} names no record", p.key),
            )
        })?;
        let nbytes = p.numel.checked_mul(p.dtype.size() as u64);
        let bytes = layout::storage_bytes(data, &archive, record, &p.key, nbytes, &mut budget)?;
        located.push(bytes);
    }
    Ok(Decoded {
        format: if records.constants_pkl.is_some() {
            Format::TorchScript
        } else {
            Format::Zip
        },
        byte_order: records.byte_order,
        protocol,
        roots,
        storages,
        bytes: located,
        end: archive.end() as u64,
        notes: archive
            .broken_locals()
            .iter()
            .map(|&(name, at)| Warning::NoLocalHeader {
                entry: name.to_owned(),
                at,
            })
            .collect(),
        plain,
    })
}

/// The legacy stream: five pickles (magic number, protocol version,
/// sys_info, the object, the storage keys), then the storages' bytes.
pub(crate) fn decode_legacy<'d>(
    view: impl Into<FileView<'d>>,
    heap: &mut Heap,
    interp: &mut TorchInterp<'_>,
    vm: &mut Vm<'_>,
) -> Result<Decoded> {
    let view = view.into();
    // The pickles start the file: they run over the bytes at hand from its
    // start; one that fails before the file ends asks for more.
    let data = view.prefix();
    let legacy_err = |message: &str| Error::new(ErrorKind::Legacy, message);
    let mut run = |heap: &mut Heap, interp: &mut TorchInterp<'_>, start: usize, section: &str| {
        interp.enter(&format!("legacy {section} pickle"), None);
        vm.run(heap, interp, data, start).map_err(|e| {
            if crate::ranged::ran_out(&e) {
                view.grow();
            }
            e.in_record(&interp.record)
        })
    };
    let magic = run(heap, interp, 0, "magic number")?;
    if heap.bigint(magic.value) != Some(&LEGACY_MAGIC_VALUE[..]) {
        return Err(legacy_err("Invalid magic number; corrupt file?"));
    }
    let version = run(heap, interp, magic.end, "protocol version")?;
    if version.value != Value::Int(legacy::PROTOCOL_VERSION) {
        return Err(legacy_err("Invalid protocol version").at(magic.end as u64));
    }
    let sys_info = run(heap, interp, version.end, "sys_info")?;
    let little = heap
        .dict(sys_info.value)
        .and_then(|d| d.get_str(heap, "little_endian"))
        .is_none_or(|v| v != Value::Bool(false));
    let byte_order = if little {
        ByteOrder::Little
    } else {
        ByteOrder::Big
    };
    let object = run(heap, interp, sys_info.end, "object")?;
    let keys = run(heap, interp, object.end, "storage keys")?;
    let listed: Vec<String> = heap
        .sequence(keys.value)
        .ok_or_else(|| legacy_err("storage key list is not a list").at(object.end as u64))?
        .iter()
        .map(|&k| match k {
            Value::Int(i) => Some(i.to_string()),
            other => heap.text(other).map(str::to_owned),
        })
        .collect::<Option<_>>()
        .ok_or_else(|| legacy_err("storage key is not a str").at(object.end as u64))?;
    let described: Vec<LegacyStorage<'_>> = interp
        .storages
        .iter()
        .map(|s| LegacyStorage {
            key: &s.key,
            numel: s.numel,
            elem_size: s.dtype.size() as u64,
            view: s.view.map(|v| (v.root, v.elem_offset)),
        })
        .collect();
    let (offsets, end) =
        legacy::storage_offsets(view, keys.end, byte_order, &listed, &described, |k| {
            interp.storage_by_key(k)
        })?;
    // Each storage with its offset; a storage past the last offset is left
    // out (`storage_offsets` gives one per storage).
    let mut storages = std::mem::take(&mut interp.storages);
    storages.truncate(offsets.len());
    let bytes: Vec<StorageBytes> = offsets
        .into_iter()
        .take(storages.len())
        .map(StorageBytes::File)
        .collect();
    Ok(Decoded {
        format: Format::Legacy,
        byte_order,
        protocol: object.protocol,
        roots: vec![(object.value, "")],
        storages,
        bytes,
        end,
        notes: Vec::new(),
        plain: None,
    })
}
