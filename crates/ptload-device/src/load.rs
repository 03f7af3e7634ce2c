//! Executing a device map: every storage once, where the map says, or on the
//! host with the reason when its device is missing or full. The result is
//! a [`Loaded`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ptload_reader::advice::Hint;
use ptload_reader::checkpoint::ByteOrder;
use ptload_reader::placement::{Device, DeviceMap};
use ptload_reader::state_dict::Selected;
use ptload_reader::tp::EvenRuns;
use ptload_reader::{Checkpoint, DType};

use crate::cuda::{self, Arena, Copied, Upload, UploadBytes, UploadError, WorkerTime};
use crate::error::{Fallback, LoadError};
use crate::loaded::{
    CudaStorage, DeviceReport, HostRepr, HostStorage, Loaded, LoadedTensor, Placed,
};
use crate::probe::{Gpu, Gpus};
use crate::staging::{Fill, Staging};

pub use ptload_reader::export::Progress;

/// How to load.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Fail before copying anything when a planned GPU is missing, with
    /// torch's message, instead of falling back to the host.
    pub strict: bool,
    /// Staging pool sizes.
    pub staging: Staging,
    /// Convert floating tensors to this dtype (F64 F32 F16 BF16 F8_E4M3
    /// F8_E5M2); others are loaded as they are. Explicit, never implied.
    pub dtype: Option<DType>,
    /// Told how many bytes of the checkpoint each step finished: read
    /// for a conversion, or placed (copied to a device, or handed out on
    /// the host). For progress bars.
    pub progress: Option<Progress>,
    /// Set (from any thread) to stop the copies to GPUs: no new copy is
    /// queued, the copies already queued finish, the device memory is
    /// freed, and the load returns [`LoadError::Cancelled`] (unless every
    /// copy was already queued). Host work (conversions) is not stopped.
    pub cancel: Option<Arc<AtomicBool>>,
    /// For a file read by ranges (a URL, a bucket object, `--pread`):
    /// leave the storages placed on the host as they are in the file,
    /// fetched when a reader asks and not by the load, as a mapped file's
    /// host storages are its pages. [`Loaded::visit_elements`] then
    /// streams each tensor through memory without keeping it, so a load
    /// whose host tensors are read once (hashed, written) holds no copy of
    /// the file; [`HostStorage::bytes`](crate::HostStorage::bytes) fetches
    /// a storage and keeps it. A failed request is then the read's error,
    /// not the load's. Off by default: the load fetches them.
    pub host_on_read: bool,
}

impl LoadOptions {
    fn cancelled(&self) -> bool {
        self.cancel
            .as_deref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("strict", &self.strict)
            .field("staging", &self.staging)
            .field("dtype", &self.dtype)
            .field("progress", &self.progress.is_some())
            .field("cancel", &self.cancel.is_some())
            .field("host_on_read", &self.host_on_read)
            .finish()
    }
}

const ARENA_ALIGN: usize = 256;

/// A storage to place: the checkpoint's, or a tensor's converted bytes.
struct Source {
    bytes: SourceBytes,
    /// The bytes' order, and the unit it applies to (see
    /// [`ByteOrder::to_host`]).
    order: ByteOrder,
    unit: usize,
    device: Device,
    fallback: Option<Fallback>,
}

enum SourceBytes {
    /// Storage `index` of the checkpoint.
    Checkpoint(usize),
    Converted(Vec<u8>),
    /// A tensor-parallel rank's slice of storage `storage`, as evenly
    /// spaced runs (of a file read by ranges, one run): gathered straight
    /// into the staging buffers of its device (or into a buffer of its own
    /// if it falls back to the host).
    Runs {
        storage: usize,
        runs: EvenRuns,
    },
    /// A contiguous tensor of a file in the host's byte order, converted
    /// from `from` to `to` on its way to a device: bytes `offset..` of
    /// storage `storage` read and converted piece by piece into the
    /// staging buffers (never whole on the host); converted whole, into a
    /// buffer of its own, if it falls back to the host. `len` is its
    /// converted size.
    Cast {
        storage: usize,
        offset: u64,
        from: DType,
        to: DType,
        len: usize,
    },
}

impl Source {
    /// The bytes to copy to a device, as the upload reads them.
    fn upload_bytes<'a>(
        &'a self,
        ckpt: &'a Checkpoint,
        ranged: bool,
        fill: Fill,
    ) -> Result<UploadBytes<'a>, LoadError> {
        Ok(match &self.bytes {
            // Read by ranges: taken from the read-ahead, or fetched when
            // a copy needs it, and never kept. Mapped: by positioned reads
            // when asked.
            SourceBytes::Checkpoint(index)
                if ranged || (fill == Fill::Read && ckpt.is_mapped()) =>
            {
                UploadBytes::Read {
                    ckpt,
                    index: *index,
                    offset: 0,
                    len: self.len(ckpt),
                }
            }
            // A rank's contiguous slice of a file read by ranges: its own
            // ranges, read into the staging buffers (the storage is never
            // fetched whole).
            SourceBytes::Runs { storage, runs }
                if ranged && (runs.count == 1 || runs.step == runs.len) =>
            {
                UploadBytes::Read {
                    ckpt,
                    index: *storage,
                    offset: runs.first,
                    len: self.len(ckpt),
                }
            }
            // A column split of a file read by ranges: the rows it crosses
            // read a span at a time and gathered into the staging buffers.
            SourceBytes::Runs { storage, runs } if ranged => UploadBytes::RangedRuns {
                ckpt,
                index: *storage,
                runs: *runs,
                len: self.len(ckpt),
            },
            SourceBytes::Checkpoint(i) => UploadBytes::Ready(ckpt.storage_bytes(*i)?),
            SourceBytes::Converted(b) => UploadBytes::Ready(b),
            SourceBytes::Cast {
                storage,
                offset,
                from,
                to,
                len,
            } => UploadBytes::Cast {
                ckpt,
                index: *storage,
                offset: *offset,
                from: *from,
                to: *to,
                len: *len,
            },
            SourceBytes::Runs { storage, runs } => UploadBytes::Runs {
                storage: ckpt.storage_bytes(*storage)?,
                runs: *runs,
                len: self.len(ckpt),
            },
        })
    }

    fn len(&self, ckpt: &Checkpoint) -> usize {
        match &self.bytes {
            SourceBytes::Checkpoint(i) => ckpt
                .storages()
                .get(*i)
                .map_or(0, |s| usize::try_from(s.nbytes).unwrap_or(usize::MAX)),
            SourceBytes::Converted(b) => b.len(),
            SourceBytes::Runs { runs, .. } => usize::try_from(runs.bytes()).unwrap_or(usize::MAX),
            SourceBytes::Cast { len, .. } => *len,
        }
    }
}

fn strict_error(gpus: &Gpus, ordinal: u32) -> LoadError {
    let (message, to) = match gpus {
        Gpus::Devices(d) if !d.is_empty() => (
            format!(
                "Attempting to deserialize object on CUDA device {ordinal} but this machine has {} \
                 CUDA device(s). Map your storages to an existing device",
                d.len()
            ),
            None,
        ),
        _ => (
            format!(
                "Attempting to deserialize object on a CUDA device but no CUDA device is usable \
                 ({}). If you are running on a CPU-only machine, map your storages to the CPU",
                gpus.why_none()
            ),
            Some("cpu".to_owned()),
        ),
    };
    LoadError::Strict {
        message,
        hint: Some(Hint::MapLocation { from: None, to }),
    }
}

/// What one device's upload took.
struct DeviceWork {
    ordinal: u32,
    seconds: f64,
    copied: Copied,
}

/// Load the `selection` of `ckpt` where the device map `plan` says. The result shares
/// `ckpt`: host storages that need no change stay slices of its map.
pub fn load(
    ckpt: Arc<Checkpoint>,
    selection: &[Selected],
    plan: &DeviceMap,
    gpus: &Gpus,
    opts: &LoadOptions,
) -> Result<Loaded, LoadError> {
    let start = Instant::now();
    if opts.strict {
        check_strict(&ckpt, selection, plan, gpus)?;
    }
    let (mut sources, mut tensors) = resolve(&ckpt, selection, plan, gpus, opts)?;
    // Read by ranges: every storage placed, fetched ahead of the copies
    // and of the host's share, several requests in flight.
    let ahead = ahead_of(&ckpt, &sources, opts.host_on_read);
    let (storages, work) = reading_ahead(&ckpt, &ahead, || {
        let (placed, work) = upload_all(&ckpt, &mut sources, gpus, opts)?;
        Ok((place_rest(&ckpt, &mut sources, placed, opts)?, work))
    })?;
    // Fallbacks decided during allocation reach the tensors.
    for t in &mut tensors {
        if let Some(s) = t.info.storage.and_then(|k| sources.get(k)) {
            t.device = s.device;
            t.fallback.clone_from(&s.fallback);
        }
    }
    let devices = reports(&tensors, &storages, &work);
    let by_name = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.info.name.clone(), i))
        .collect();
    Ok(Loaded {
        ckpt,
        storages,
        tensors,
        by_name,
        devices,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Everything not on a GPU: the host (swapped into an owned copy if
/// needed), or meta.
fn place_rest(
    ckpt: &Arc<Checkpoint>,
    sources: &mut [Source],
    mut placed: Vec<Option<Placed>>,
    opts: &LoadOptions,
) -> Result<Vec<Placed>, LoadError> {
    let ranged = ckpt.fetched_bytes().is_some();
    let mut storages = Vec::with_capacity(sources.len());
    for (k, source) in sources.iter_mut().enumerate() {
        let done = placed.get_mut(k).and_then(Option::take);
        storages.push(match (done, source.device) {
            (Some(p), _) => p,
            (None, Device::Meta) => Placed::Meta,
            (None, _) => {
                source.device = Device::Host;
                let counted_at_conversion = matches!(source.bytes, SourceBytes::Converted(_));
                let repr = match std::mem::replace(
                    &mut source.bytes,
                    SourceBytes::Converted(Vec::new()),
                ) {
                    SourceBytes::Checkpoint(i) if source.order.needs_swap(source.unit) => {
                        let mut owned = ckpt.storage_bytes(i)?.to_vec();
                        source.order.to_host(&mut owned, source.unit);
                        HostRepr::Owned(owned)
                    }
                    SourceBytes::Checkpoint(i) => {
                        // Read by ranges: the load has the bytes (fetched
                        // ahead, or now), and a failed request is its
                        // error; or they are fetched when read.
                        if ranged && !opts.host_on_read {
                            ckpt.storage_bytes(i)?;
                        }
                        HostRepr::Mapped(Arc::clone(ckpt), i)
                    }
                    SourceBytes::Converted(bytes) => HostRepr::Owned(bytes),
                    // A rank's slice meant for a device that fell back:
                    // gathered now, into a buffer of its own.
                    SourceBytes::Runs { storage, runs } => {
                        let len = usize::try_from(runs.bytes()).map_err(|_| {
                            LoadError::Access(format!("storage {storage}: a slice of {runs:?}"))
                        })?;
                        let mut owned = host_buffer(storage, len)?;
                        if ranged {
                            // The rows it crosses, a span at a time.
                            crate::cuda::gather_ranged(ckpt, storage, &runs, 0, &mut owned)
                                .map_err(|e| match e {
                                    crate::cuda::CopyError::Read(e) => LoadError::Reader(e),
                                    crate::cuda::CopyError::Outside => LoadError::Access(format!(
                                        "storage {storage}: a slice outside it ({runs:?})"
                                    )),
                                })?;
                        } else {
                            runs.copy(ckpt.storage_bytes(storage)?, 0, &mut owned)
                                .ok_or_else(|| {
                                    LoadError::Access(format!(
                                        "storage {storage}: a slice outside it ({runs:?})"
                                    ))
                                })?;
                        }
                        source.order.to_host(&mut owned, source.unit);
                        HostRepr::Owned(owned)
                    }
                    // A conversion meant for a device that fell back:
                    // converted now, into a buffer of its own.
                    SourceBytes::Cast {
                        storage,
                        offset,
                        from,
                        to,
                        len,
                    } => {
                        let mut raw = host_buffer(storage, len / to.size() * from.size())?;
                        ckpt.read_storage_at(storage, offset, &mut raw)?;
                        HostRepr::Owned(ptload_reader::cast::convert(&raw, from, to)?)
                    }
                };
                let storage = HostStorage { repr };
                // Converted buffers were counted when converted.
                if let (Some(p), false) = (&opts.progress, counted_at_conversion) {
                    p(storage.len());
                }
                Placed::Host(storage)
            }
        });
    }
    Ok(storages)
}

/// `len` zeroed bytes on the host for a part of storage `storage`, or an
/// error saying the host cannot hold them.
fn host_buffer(storage: usize, len: usize) -> Result<Vec<u8>, LoadError> {
    let mut owned = Vec::new();
    owned.try_reserve_exact(len).map_err(|_| {
        LoadError::Access(format!(
            "storage {storage}: cannot hold {len} bytes on the host"
        ))
    })?;
    owned.resize(len, 0);
    Ok(owned)
}

/// The storages of `sources` to fetch ahead when `ckpt` is read by
/// ranges (a URL, or a local file opened by positioned reads): those
/// placed somewhere (not meta; not the host's when `host_on_read`); none
/// for a mapped or in-memory file.
fn ahead_of(ckpt: &Checkpoint, sources: &[Source], host_on_read: bool) -> Vec<usize> {
    if ckpt.fetched_bytes().is_none() {
        return Vec::new();
    }
    sources
        .iter()
        .filter(|s| s.device != Device::Meta && !(host_on_read && s.device == Device::Host))
        .filter_map(|s| match s.bytes {
            SourceBytes::Checkpoint(i) => Some(i),
            // A conversion of a whole storage reads every byte of it (a
            // part is read as it is asked for, not fetched whole).
            SourceBytes::Cast {
                storage,
                offset: 0,
                from,
                to,
                len,
            } if ckpt.storages().get(storage).map(|st| st.nbytes)
                == Some((len / to.size() * from.size()) as u64) =>
            {
                Some(storage)
            }
            SourceBytes::Converted(_) | SourceBytes::Runs { .. } | SourceBytes::Cast { .. } => None,
        })
        .collect()
}

/// Run `work` while `storages` of `ckpt` are prefetched beside it (see
/// [`ptload_reader::checkpoint::while_prefetching`]): the copies read what
/// landed, wait for what is in flight, and fetch what is not asked yet.
fn reading_ahead<T>(
    ckpt: &Checkpoint,
    storages: &[usize],
    work: impl FnOnce() -> Result<T, LoadError>,
) -> Result<T, LoadError> {
    ptload_reader::checkpoint::while_prefetching(&[(ckpt, storages)], work)
}

/// Upload whole storages, as torch's `map_location` moves them: storage
/// `storage` of `ckpt` to `cuda:ordinal`, for each pair of `targets`
/// (each storage once). The answer has one entry per target: the storage
/// on its device, in host byte order, or why it stays on the host (the
/// device is missing or unusable, or lacks the memory). The caller keeps
/// the host storages and the strict policy; nothing here reads a
/// storage that is not a target. Storages of one device share one arena,
/// freed when the last of them is dropped.
pub fn upload_storages(
    ckpt: &Checkpoint,
    targets: &[(usize, u32)],
    gpus: &Gpus,
    opts: &LoadOptions,
) -> Result<Vec<Result<CudaStorage, Fallback>>, LoadError> {
    let mut sources = Vec::with_capacity(targets.len());
    let mut seen = vec![false; ckpt.storages().len()];
    for &(index, ordinal) in targets {
        let storage = ckpt
            .storages()
            .get(index)
            .ok_or_else(|| LoadError::Access(format!("no storage {index}")))?;
        match seen.get_mut(index) {
            Some(s) if !*s => *s = true,
            _ => {
                return Err(LoadError::Access(format!(
                    "storage {index} is a target twice"
                )))
            }
        }
        let (device, fallback) = match usable(gpus, ordinal) {
            Ok(_) => (Device::Cuda(ordinal), None),
            Err(why) => (Device::Host, Some(why)),
        };
        sources.push(Source {
            bytes: SourceBytes::Checkpoint(index),
            order: ckpt.byte_order(),
            unit: storage.dtype.swap_unit(),
            device,
            fallback,
        });
    }
    let ahead = ahead_of(ckpt, &sources, false);
    let (mut placed, _work) =
        reading_ahead(ckpt, &ahead, || upload_all(ckpt, &mut sources, gpus, opts))?;
    Ok(sources
        .into_iter()
        .enumerate()
        .map(
            |(k, source)| match placed.get_mut(k).and_then(Option::take) {
                Some(Placed::Cuda(c)) => Ok(c),
                _ => Err(source.fallback.unwrap_or(Fallback::NotUploaded)),
            },
        )
        .collect())
}

/// Strict mode fails before anything is copied.
fn check_strict(
    ckpt: &Checkpoint,
    selection: &[Selected],
    plan: &DeviceMap,
    gpus: &Gpus,
) -> Result<(), LoadError> {
    for s in selection {
        let t = tensor(ckpt, s)?;
        if let Device::Cuda(i) = plan.tensor_target(t.info()) {
            match gpus.get(i) {
                None => return Err(strict_error(gpus, i)),
                Some(gpu) => {
                    gpu.context()?;
                }
            }
        }
    }
    Ok(())
}

/// The device `cuda:ordinal`, opened; or why a tensor planned there goes
/// to the host instead.
fn usable(gpus: &Gpus, ordinal: u32) -> Result<&Gpu, Fallback> {
    let Some(gpu) = gpus.get(ordinal) else {
        return Err(match gpus.none() {
            Some(why) => Fallback::NoDevice(why),
            None => Fallback::NoSuchDevice {
                ordinal,
                count: gpus.devices().len(),
            },
        });
    };
    gpu.context().map_err(|e| Fallback::Unopened(e.clone()))?;
    Ok(gpu)
}

fn tensor<'c>(
    ckpt: &'c Checkpoint,
    s: &'c Selected,
) -> Result<ptload_reader::TensorView<'c>, LoadError> {
    if s.file != 0 {
        // A set's entry names its file; `ckpt` is one checkpoint.
        return Err(LoadError::Access(format!(
            "{}: an entry of file {} of a set; load each file with its own checkpoint and \
             entries (StateDict::of_file)",
            s.name, s.file
        )));
    }
    s.view(ckpt).ok_or_else(|| {
        LoadError::Access(format!(
            "{}: the checkpoint has no tensor {} ({} tensors)",
            s.name,
            s.index,
            ckpt.len()
        ))
    })
}

/// Each selected tensor's storage (the checkpoint's, shared, or a converted
/// copy) and where it goes.
fn resolve(
    ckpt: &Checkpoint,
    selection: &[Selected],
    plan: &DeviceMap,
    gpus: &Gpus,
    opts: &LoadOptions,
) -> Result<(Vec<Source>, Vec<LoadedTensor>), LoadError> {
    let mut sources = Sources::new(ckpt);
    let mut tensors = Vec::with_capacity(selection.len());
    for s in selection {
        tensors.push(resolve_one(&mut sources, s, plan, gpus, opts)?);
    }
    Ok((sources.list, tensors))
}

/// Where a tensor goes: the plan's target, the device it lands on, and
/// why that is the host when the target GPU cannot take it.
fn destination(
    plan: &DeviceMap,
    gpus: &Gpus,
    info: &ptload_reader::TensorInfo,
) -> (Device, Device, Option<Fallback>) {
    let target = plan.tensor_target(info);
    match target {
        Device::Cuda(i) => match usable(gpus, i) {
            Ok(_) => (target, target, None),
            Err(why) => (target, Device::Host, Some(why)),
        },
        other => (other, other, None),
    }
}

/// One selected tensor: where it goes and which source it reads.
fn resolve_one(
    sources: &mut Sources<'_>,
    s: &Selected,
    plan: &DeviceMap,
    gpus: &Gpus,
    opts: &LoadOptions,
) -> Result<LoadedTensor, LoadError> {
    let view = tensor(sources.ckpt, s)?;
    let info = view.info();
    let (target, device, fallback) = destination(plan, gpus, info);
    let convert = ptload_reader::cast::target(info.dtype, opts.dtype);
    // A pending conj/neg bit is applied on the host, like a conversion:
    // what lands anywhere holds the tensor's values.
    let bits = (info.conj && info.dtype.is_complex()) || info.neg;
    // A rank's slice is gathered on the host from its own bytes (never
    // its whole storage) into a buffer of its own, like a conversion.
    let rewrite = convert.or((bits || s.slice.is_some()).then_some(info.dtype));
    let mut placed_info = info.clone();
    placed_info.name.clone_from(&s.name);
    placed_info.storage = None;
    let mut loaded = LoadedTensor {
        info: placed_info,
        index: s.index,
        slice: s.slice,
        target,
        device,
        fallback: fallback.clone(),
        converted_from: None,
        rewritten: false,
    };
    match (info.storage, rewrite) {
        (None, _) => {
            loaded.device = Device::Meta;
            loaded.fallback = None;
        }
        _ if target == Device::Meta => {
            loaded.device = Device::Meta;
            loaded.fallback = None;
        }
        (Some(si), Some(to)) => {
            let rewrite = Rewrite {
                entry: s,
                view: &view,
                storage: si,
                to,
                convert: convert.is_some(),
                bits,
                device,
                fallback,
            };
            let k = sources.rewritten(rewrite, opts)?;
            loaded.converted_from = convert.map(|_| info.dtype);
            loaded.rewritten = true;
            let placed = &mut loaded.info;
            placed.dtype = to;
            placed.stride = contiguous_strides(&info.shape);
            placed.storage_offset = 0;
            placed.nbytes = info.numel.saturating_mul(to.size() as u64);
            // The elements were read with the bits applied.
            placed.conj = false;
            placed.neg = false;
            placed.storage = Some(k);
        }
        (Some(si), None) => {
            loaded.info.storage = Some(sources.storage(si, &s.name, device, fallback)?);
        }
    }
    Ok(loaded)
}

/// A view as a key: its storage, offset, shape, strides, the dtype it
/// lands as and its conj/neg bits.
type ViewKey = (usize, u64, Vec<u64>, Vec<u64>, DType, bool, bool);

/// The sources a load copies from, made as the selection is resolved: a
/// storage read as it is, once for every view of it; a rewritten view
/// (converted, bits applied, a rank's slice), once for identical views
/// (tied weights).
struct Sources<'c> {
    ckpt: &'c Checkpoint,
    list: Vec<Source>,
    of_storage: Vec<Option<usize>>,
    of_view: HashMap<ViewKey, usize>,
}

impl<'c> Sources<'c> {
    fn new(ckpt: &'c Checkpoint) -> Sources<'c> {
        Sources {
            ckpt,
            list: Vec::new(),
            of_storage: vec![None; ckpt.storages().len()],
            of_view: HashMap::new(),
        }
    }

    fn push(&mut self, source: Source) -> usize {
        self.list.push(source);
        self.list.len() - 1
    }

    /// The source of storage `si` as it is, made for its first view.
    fn storage(
        &mut self,
        si: usize,
        name: &str,
        device: Device,
        fallback: Option<Fallback>,
    ) -> Result<usize, LoadError> {
        let missing = || LoadError::Access(format!("{name}: no storage {si}"));
        if let Some(k) = *self.of_storage.get(si).ok_or_else(missing)? {
            return Ok(k);
        }
        // Swapped as torch swaps it: by the storage's type.
        let storage = self.ckpt.storages().get(si).ok_or_else(missing)?;
        let k = self.push(Source {
            bytes: SourceBytes::Checkpoint(si),
            order: self.ckpt.byte_order(),
            unit: storage.dtype.swap_unit(),
            device,
            fallback,
        });
        if let Some(slot) = self.of_storage.get_mut(si) {
            *slot = Some(k);
        }
        Ok(k)
    }

    /// The source of a rewritten view, made for the first of identical
    /// views.
    fn rewritten(&mut self, r: Rewrite<'_, '_>, opts: &LoadOptions) -> Result<usize, LoadError> {
        let info = r.view.info();
        let key: ViewKey = (
            r.storage,
            info.storage_offset,
            info.shape.clone(),
            info.stride.clone(),
            r.to,
            info.conj,
            info.neg,
        );
        if let Some(&k) = self.of_view.get(&key) {
            return Ok(k);
        }
        let source = rewritten(self.ckpt, r, opts)?;
        let k = self.push(source);
        self.of_view.insert(key, k);
        Ok(k)
    }
}

/// What `resolve` asks of [`rewritten`]: a selected tensor whose bytes are
/// rewritten on their way (converted, bits applied, or a rank's slice).
struct Rewrite<'a, 'c> {
    entry: &'a Selected,
    view: &'a ptload_reader::TensorView<'c>,
    storage: usize,
    /// The dtype it lands as.
    to: DType,
    /// Converted to `to` (else `to` is its own dtype).
    convert: bool,
    /// A conj/neg bit to apply.
    bits: bool,
    device: Device,
    fallback: Option<Fallback>,
}

/// The source of a rewritten tensor: a rank's slice bound for a GPU as it
/// is stored is gathered into the staging buffers instead (of a mapped
/// file, from the map; of a file read by ranges, a contiguous one by its
/// range, a column split by spans of the rows it crosses); a conversion
/// of a contiguous tensor bound for a GPU is converted into them a piece
/// at a time; anything else is rewritten on the host, from the row-major
/// elements, into a storage of its own (never fused into a copy).
fn rewritten(
    ckpt: &Checkpoint,
    r: Rewrite<'_, '_>,
    opts: &LoadOptions,
) -> Result<Source, LoadError> {
    let info = r.view.info();
    let direct = || {
        if r.convert || r.bits || !matches!(r.device, Device::Cuda(_)) {
            return None;
        }
        r.entry.slice?;
        let storage = ckpt.storages().get(r.storage)?;
        storage.file_offset?;
        info.even_runs(storage.nbytes)
    };
    // A conversion bound for a GPU, of a contiguous tensor whose bytes
    // need no swap: converted piece by piece as the staging buffers fill.
    let cast = || {
        if !r.convert || r.bits || r.entry.slice.is_some() || !matches!(r.device, Device::Cuda(_)) {
            return None;
        }
        if ckpt.byte_order().needs_swap(info.dtype.swap_unit()) || !info.is_contiguous() {
            return None;
        }
        let size = info.dtype.size() as u64;
        let offset = info.storage_offset.checked_mul(size)?;
        let read = info.numel.checked_mul(size)?;
        let storage = ckpt.storages().get(r.storage)?;
        if offset.checked_add(read)? > storage.nbytes {
            return None;
        }
        let len = usize::try_from(info.numel.checked_mul(r.to.size() as u64)?).ok()?;
        Some((offset, len))
    };
    if let Some((offset, len)) = cast() {
        r.view.will_read();
        return Ok(Source {
            bytes: SourceBytes::Cast {
                storage: r.storage,
                offset,
                from: info.dtype,
                to: r.to,
                len,
            },
            order: ByteOrder::HOST,
            unit: r.to.swap_unit(),
            device: r.device,
            fallback: r.fallback,
        });
    }
    if let Some(runs) = direct() {
        r.view.will_read();
        return Ok(Source {
            bytes: SourceBytes::Runs {
                storage: r.storage,
                runs,
            },
            order: ckpt.byte_order(),
            unit: info.dtype.swap_unit(),
            device: r.device,
            fallback: r.fallback,
        });
    }
    let data = r.view.data()?;
    let read = data.len() as u64;
    let bytes = if r.to == info.dtype {
        data.into_owned()
    } else {
        ptload_reader::cast::convert(&data, info.dtype, r.to)?
    };
    // Conversion is most of such a load's time: it counts the bytes it read.
    if let Some(p) = &opts.progress {
        p(read);
    }
    Ok(Source {
        bytes: SourceBytes::Converted(bytes),
        order: ByteOrder::HOST,
        unit: r.to.swap_unit(),
        device: r.device,
        fallback: r.fallback,
    })
}

/// CUDA storages: one arena per device, in source order (file order), all
/// devices fed at once. What does not fit falls back to the host (the
/// source's device and reason are updated). Returns what was placed, by
/// source, and the seconds each device took.
#[allow(clippy::type_complexity)]
fn upload_all(
    ckpt: &Checkpoint,
    sources: &mut [Source],
    gpus: &Gpus,
    opts: &LoadOptions,
) -> Result<(Vec<Option<Placed>>, Vec<DeviceWork>), LoadError> {
    if opts.cancelled() {
        return Err(LoadError::Cancelled);
    }
    let mut placed: Vec<Option<Placed>> = (0..sources.len()).map(|_| None).collect();
    let mut members_of: HashMap<u32, Vec<usize>> = HashMap::new();
    for (k, s) in sources.iter().enumerate() {
        if let Device::Cuda(i) = s.device {
            members_of.entry(i).or_default().push(k);
        }
    }
    let mut by_device: Vec<(u32, Vec<usize>)> = members_of.into_iter().collect();
    by_device.sort_unstable_by_key(|&(ordinal, _)| ordinal);
    let mut prepared: Vec<(u32, &Gpu, Arena, Vec<usize>, Vec<usize>)> = Vec::new();
    for (ordinal, members) in by_device {
        let Some(gpu) = gpus.get(ordinal) else {
            continue;
        };
        if let Some((arena, members, offsets)) = allocate(ckpt, sources, gpu, ordinal, members)? {
            prepared.push((ordinal, gpu, arena, members, offsets));
        }
    }
    // Feed every device at once: one thread per device, each driving its
    // own streams.
    let ranged = ckpt.fetched_bytes().is_some();
    let mut uploads_per_device = Vec::with_capacity(prepared.len());
    for (_, _, _, members, offsets) in &prepared {
        let mut uploads = Vec::with_capacity(members.len());
        for (&k, &arena_offset) in members.iter().zip(offsets) {
            let s = sources
                .get(k)
                .ok_or_else(|| LoadError::Access(format!("source {k}")))?;
            uploads.push(Upload {
                bytes: s.upload_bytes(ckpt, ranged, opts.staging.fill)?,
                order: s.order,
                unit: s.unit,
                arena_offset,
                // A converted buffer was counted when it was converted.
                counted: !matches!(s.bytes, SourceBytes::Converted(_)),
            });
        }
        uploads_per_device.push(uploads);
    }
    let results: Vec<(u32, Result<Copied, UploadError>, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = prepared
            .iter()
            .zip(&uploads_per_device)
            .map(|((ordinal, gpu, arena, _, _), uploads)| {
                let staging = &opts.staging;
                let progress = opts.progress.as_deref();
                let cancel = opts.cancel.as_deref();
                scope.spawn(move || {
                    let started = Instant::now();
                    let result = cuda::upload(gpu, arena, uploads, staging, progress, cancel);
                    (*ordinal, result, started.elapsed().as_secs_f64())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or((
                    u32::MAX,
                    Err(UploadError::Driver("upload thread panicked".into())),
                    0.0,
                ))
            })
            .collect()
    });
    drop(uploads_per_device);
    let mut work = Vec::with_capacity(results.len());
    for (ordinal, result, seconds) in results {
        let copied = result.map_err(|e| match e {
            UploadError::OutOfMemory(message) | UploadError::Driver(message) => {
                LoadError::Cuda { ordinal, message }
            }
            UploadError::Cancelled => LoadError::Cancelled,
            UploadError::Read(e) => LoadError::Reader(e),
        })?;
        work.push(DeviceWork {
            ordinal,
            seconds,
            copied,
        });
    }
    for (ordinal, _, arena, members, offsets) in prepared {
        let arena = Arc::new(arena);
        for (&k, &offset) in members.iter().zip(&offsets) {
            let len = sources.get(k).map_or(0, |s| s.len(ckpt));
            if let Some(slot) = placed.get_mut(k) {
                *slot = Some(Placed::Cuda(CudaStorage {
                    ordinal,
                    offset,
                    len,
                    arena: Arc::clone(&arena),
                }));
            }
        }
    }
    Ok((placed, work))
}

/// One arena for `members` on `gpu`; when the device lacks the memory, the
/// members that fit in its free memory, in order, and the rest fall back
/// to the host with the reason. `None` when nothing could be allocated.
#[allow(clippy::type_complexity)]
fn allocate(
    ckpt: &Checkpoint,
    sources: &mut [Source],
    gpu: &Gpu,
    ordinal: u32,
    members: Vec<usize>,
) -> Result<Option<(Arena, Vec<usize>, Vec<usize>)>, LoadError> {
    let (offsets, total) = layout(ckpt, sources, &members);
    let fall_back = |sources: &mut [Source], ks: &[usize], why: Fallback| {
        for &k in ks {
            if let Some(s) = sources.get_mut(k) {
                s.device = Device::Host;
                s.fallback = Some(why.clone());
            }
        }
    };
    match cuda::allocate(gpu, total) {
        Ok(a) => Ok(Some((a, members, offsets))),
        Err(UploadError::Driver(message)) => Err(LoadError::Cuda { ordinal, message }),
        Err(UploadError::Cancelled) => Err(LoadError::Cancelled),
        Err(UploadError::Read(e)) => Err(LoadError::Reader(e)),
        Err(UploadError::OutOfMemory(_)) => {
            // Keep what fits in the free memory, in order.
            let free = gpu
                .free_memory()
                .ok()
                .and_then(|f| usize::try_from(f).ok())
                .unwrap_or(0);
            let budget = free.saturating_sub(free / 20);
            let fits = offsets
                .iter()
                .zip(&members)
                .take_while(|(&o, &k)| o + sources.get(k).map_or(0, |s| s.len(ckpt)) <= budget)
                .count();
            let (kept, rest) = members.split_at(fits.min(members.len()));
            let why = Fallback::OutOfMemory {
                ordinal,
                free: Some(free as u64),
                message: None,
            };
            fall_back(sources, rest, why);
            let kept = kept.to_vec();
            let (offsets, total) = layout(ckpt, sources, &kept);
            match cuda::allocate(gpu, total) {
                Ok(a) => Ok(Some((a, kept, offsets))),
                Err(UploadError::OutOfMemory(m) | UploadError::Driver(m)) => {
                    let why = Fallback::OutOfMemory {
                        ordinal,
                        free: Some(free as u64),
                        message: Some(m),
                    };
                    fall_back(sources, &kept, why);
                    Ok(None)
                }
                Err(UploadError::Cancelled) => Err(LoadError::Cancelled),
                Err(UploadError::Read(e)) => Err(LoadError::Reader(e)),
            }
        }
    }
}

/// Tensors and bytes per device (a handful of devices: found by scanning).
fn reports(
    tensors: &[LoadedTensor],
    storages: &[Placed],
    work: &[DeviceWork],
) -> Vec<DeviceReport> {
    let mut devices: Vec<DeviceReport> = Vec::new();
    for t in tensors {
        match devices.iter_mut().find(|d| d.device == t.device) {
            Some(d) => d.tensors += 1,
            None => devices.push(DeviceReport {
                device: t.device,
                tensors: 1,
                bytes: 0,
                seconds: 0.0,
                copies: 0,
                pinned_bytes: 0,
                pinnings: 0,
                time: WorkerTime::default(),
            }),
        }
    }
    for p in storages {
        let (device, len) = match p {
            Placed::Host(h) => (Device::Host, h.len()),
            Placed::Cuda(c) => (Device::Cuda(c.ordinal), c.len as u64),
            Placed::Meta => (Device::Meta, 0),
        };
        if let Some(d) = devices.iter_mut().find(|d| d.device == device) {
            d.bytes += len;
        }
    }
    for w in work {
        if let Some(d) = devices
            .iter_mut()
            .find(|d| d.device == Device::Cuda(w.ordinal))
        {
            d.seconds = w.seconds;
            d.copies = w.copied.copies;
            d.pinned_bytes = w.copied.pinned;
            d.pinnings = w.copied.pinnings;
            d.time = w.copied.time;
        }
    }
    devices.sort_by_key(|d| d.device);
    devices
}

/// Offsets of `members` in an arena, each aligned, and the arena's size.
fn layout(ckpt: &Checkpoint, sources: &[Source], members: &[usize]) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(members.len());
    let mut total = 0usize;
    for &k in members {
        offsets.push(total);
        let len = sources.get(k).map_or(0, |s| s.len(ckpt));
        let padded = len
            .checked_next_multiple_of(ARENA_ALIGN)
            .unwrap_or(usize::MAX);
        total = total.saturating_add(padded);
    }
    (offsets, total)
}

fn contiguous_strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; shape.len()];
    let mut acc = 1u64;
    for (s, &n) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(n.max(1));
    }
    strides
}
