//! Executing a plan: every storage once, where the plan says, or on the
//! host with the reason when its device is missing or full.
//!
//! The result, [`Loaded`], owns what it placed and shares the checkpoint
//! (host storages that need no change stay slices of its memory map), so an
//! engine can keep it in a struct of its own.

use crate::error::{DeviceError, DeviceErrorKind, Fallback};
use ptload_reader::advice::{Hint, Neutral, Terms};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaView;
use ptload_reader::placement::{Device, Plan};
use ptload_reader::state_dict::Selected;
use ptload_reader::{ByteOrder, Checkpoint, DType, Element, TensorInfo};

use crate::cuda::{self, Arena, Copied, Staging, Upload, UploadError};
use crate::probe::{Gpu, Gpus};

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
            .finish()
    }
}

/// Why a load failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Strict mode: a planned device does not exist, with what to do.
    #[error("{}", render_strict(message, hint.as_ref(), &Neutral))]
    Strict {
        /// What is missing.
        message: String,
        /// What the caller could do about it.
        hint: Option<Hint>,
    },
    /// Strict mode: a planned device could not be opened.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Reading the checkpoint failed.
    #[error(transparent)]
    Reader(#[from] ptload_reader::Error),
    /// The CUDA driver failed (other than running out of memory).
    #[error("cuda:{ordinal}: {message}")]
    Cuda {
        /// The device.
        ordinal: u32,
        /// The driver's message.
        message: String,
    },
    /// A tensor was asked for where it is not (its host bytes while it is
    /// on a GPU, a selection entry the checkpoint does not have).
    #[error("{0}")]
    Access(String),
    /// [`LoadOptions::cancel`] was set before the load finished.
    #[error("the load was cancelled")]
    Cancelled,
}

/// Where a storage's bytes are after the load.
#[derive(Debug)]
#[non_exhaustive]
pub enum Placed {
    /// Host memory.
    Host(HostStorage),
    /// A sub-slice of a device arena.
    Cuda(CudaStorage),
    /// Shape only: no data was read.
    Meta,
}

/// A storage in host memory, in host byte order: a slice of the
/// checkpoint's memory map when its bytes needed no change, an owned
/// buffer when they were swapped or converted.
#[derive(Debug)]
pub struct HostStorage {
    repr: HostRepr,
}

#[derive(Debug)]
enum HostRepr {
    /// Storage `index` of the checkpoint, as it lies in the file.
    Mapped(Arc<Checkpoint>, usize),
    Owned(Vec<u8>),
}

impl HostStorage {
    /// The storage's bytes.
    pub fn bytes(&self) -> Result<&[u8], LoadError> {
        match &self.repr {
            HostRepr::Mapped(ckpt, index) => Ok(ckpt.storage_bytes(*index)?),
            HostRepr::Owned(bytes) => Ok(bytes),
        }
    }

    /// Whether the bytes are the checkpoint's own (not copied).
    pub fn is_mapped(&self) -> bool {
        matches!(self.repr, HostRepr::Mapped(..))
    }
}

/// A storage on a CUDA device: `len` bytes at `offset` of an arena, which
/// stays allocated while any of its storages is alive.
#[derive(Debug, Clone)]
pub struct CudaStorage {
    ordinal: u32,
    offset: usize,
    len: usize,
    arena: Arc<Arena>,
}

impl CudaStorage {
    /// The device (`cuda:N`).
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The storage as a cudarc view, for kernels launched through cudarc.
    pub fn view(&self) -> Option<CudaView<'_, u8>> {
        self.arena.view(self.offset, self.len)
    }

    /// The device address of the first byte, for other CUDA bindings.
    pub fn device_ptr(&self) -> u64 {
        self.arena.device_ptr() + self.offset as u64
    }

    /// Copy the bytes back to the host.
    pub fn read_back(&self) -> Result<Vec<u8>, DeviceError> {
        self.arena.read_back(self.offset, self.len)
    }

    /// Copy `len` bytes from byte `start` of the storage back to the host.
    pub fn read_range(&self, start: usize, len: usize) -> Result<Vec<u8>, DeviceError> {
        match start.checked_add(len) {
            Some(end) if end <= self.len => self.arena.read_back(self.offset + start, len),
            _ => Err(DeviceError::new(
                DeviceErrorKind::OutOfRange,
                Some(self.ordinal),
                format!(
                    "bytes {start}..+{len} are outside a {}-byte storage",
                    self.len
                ),
            )),
        }
    }
}

/// A loaded tensor: its metadata as placed ([`TensorInfo`], the reader's
/// type: name in the state dict, dtype after any conversion, shape,
/// strides, offset, and `storage` as an index into [`Loaded::storages`]),
/// and where it went.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoadedTensor {
    /// The tensor as placed. Its `conj` and `neg` bits are always clear:
    /// a tensor saved with them is placed with them applied.
    pub info: TensorInfo,
    /// Its index among the checkpoint's tensors, where its metadata as
    /// saved is ([`Checkpoint::tensor_at`]).
    pub index: usize,
    /// The part of the saved tensor a tensor-parallel rank holds, when it
    /// was sliced (its `info` is then the slice's).
    pub slice: Option<ptload_reader::parallel::Slice>,
    /// Where the plan put it.
    pub target: Device,
    /// Where it is.
    pub device: Device,
    /// Why `device` differs from `target`, or `None`.
    pub fallback: Option<Fallback>,
    /// `Some(original dtype)` when converted.
    pub converted_from: Option<DType>,
    /// Placed as its own row-major buffer, read on the host (a conversion,
    /// or conj/neg bits applied).
    rewritten: bool,
}

impl LoadedTensor {
    /// Its name in the state dict.
    pub fn name(&self) -> &str {
        &self.info.name
    }
}

/// Per-device totals.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DeviceReport {
    /// The device.
    pub device: Device,
    /// Tensors placed there.
    pub tensors: usize,
    /// Bytes of storages placed there.
    pub bytes: u64,
    /// Seconds spent copying to it (0 for the host and meta).
    pub seconds: f64,
    /// Host-to-device copies made (each at most the staging buffer size;
    /// many small storages share one).
    pub copies: usize,
    /// Page-locked staging bytes allocated for it.
    pub pinned_bytes: usize,
}

/// The result of a load: the checkpoint, every placed storage, and the
/// tensors viewing them, looked up by name.
#[derive(Debug)]
pub struct Loaded {
    ckpt: Arc<Checkpoint>,
    storages: Vec<Placed>,
    tensors: Vec<LoadedTensor>,
    by_name: HashMap<String, usize>,
    devices: Vec<DeviceReport>,
    seconds: f64,
}

impl Loaded {
    /// The checkpoint the tensors came from.
    pub fn checkpoint(&self) -> &Arc<Checkpoint> {
        &self.ckpt
    }

    /// Tensors, in selection order.
    pub fn tensors(&self) -> &[LoadedTensor] {
        &self.tensors
    }

    /// The tensor named `name` (its state-dict name).
    pub fn get(&self, name: &str) -> Option<&LoadedTensor> {
        self.tensors.get(*self.by_name.get(name)?)
    }

    /// Storages, each once; tensors index into this.
    pub fn storages(&self) -> &[Placed] {
        &self.storages
    }

    /// The storage `tensor` views; `None` for meta tensors.
    pub fn storage_of(&self, tensor: &LoadedTensor) -> Option<&Placed> {
        self.storages.get(tensor.info.storage?)
    }

    /// A host tensor's elements, row-major and in host byte order, with its
    /// offset and strides applied: borrowed when they lie that way (in the
    /// map, or in a converted buffer), gathered otherwise. An error for a
    /// tensor on a GPU or a meta tensor.
    pub fn host_data(&self, tensor: &LoadedTensor) -> Result<Cow<'_, [u8]>, LoadError> {
        let storage = match self.storage_of(tensor) {
            Some(Placed::Host(h)) => h,
            _ => {
                return Err(LoadError::Access(format!(
                    "{}: on {}, not in host memory",
                    tensor.info.name, tensor.device
                )))
            }
        };
        match &storage.repr {
            // A converted (or conj/neg-applied) tensor: its own row-major
            // buffer, the bits already applied.
            HostRepr::Owned(bytes) if tensor.rewritten => Ok(Cow::Borrowed(bytes)),
            // The checkpoint's bytes, as they lie or swapped: the
            // checkpoint's view gathers, swaps and applies the conj/neg
            // bits, borrowing from the map when nothing needs doing.
            _ => Ok(self.view(tensor)?.data()?),
        }
    }

    /// A tensor's elements, row-major and in host byte order, wherever it
    /// landed: a tensor on a GPU is copied back (the bytes its view spans,
    /// not its whole storage); a host tensor is [`Loaded::host_data`]. For
    /// checking an upload; an error for a meta tensor.
    pub fn elements(&self, tensor: &LoadedTensor) -> Result<Cow<'_, [u8]>, LoadError> {
        let cuda = match self.storage_of(tensor) {
            Some(Placed::Cuda(c)) => c,
            _ => return self.host_data(tensor),
        };
        let info = &tensor.info;
        let elem = info.dtype.size() as u64;
        let fail =
            |why: String| LoadError::Access(format!("{}: on {}: {why}", info.name, tensor.device));
        if info.numel == 0 {
            return Ok(Cow::Owned(Vec::new()));
        }
        // The span of elements the view reaches (validated when the
        // checkpoint was opened, or made row-major by the load).
        let last = info
            .shape
            .iter()
            .zip(&info.stride)
            .try_fold(info.storage_offset, |acc, (&n, &s)| {
                acc.checked_add(n.saturating_sub(1).checked_mul(s)?)
            });
        let span = last
            .and_then(|l| {
                l.checked_add(1)?
                    .checked_sub(info.storage_offset)?
                    .checked_mul(elem)
            })
            .and_then(|b| usize::try_from(b).ok());
        let start = info
            .storage_offset
            .checked_mul(elem)
            .and_then(|b| usize::try_from(b).ok());
        let (Some(start), Some(span)) = (start, span) else {
            return Err(fail("its extent overflows".into()));
        };
        let bytes = cuda
            .read_range(start, span)
            .map_err(|e| fail(e.message().to_owned()))?;
        let mut from_start = info.clone();
        from_start.storage_offset = 0;
        Ok(Cow::Owned(from_start.gather(&bytes)?))
    }

    /// A host tensor's elements as `T` (see [`Loaded::host_data`]): a
    /// wrong `T` is an error.
    pub fn host_vec<T: Element>(&self, tensor: &LoadedTensor) -> Result<Vec<T>, LoadError> {
        if T::DTYPE != tensor.info.dtype {
            return Err(LoadError::Access(format!(
                "{}: holds {} elements, not {}",
                tensor.info.name,
                tensor.info.dtype,
                T::DTYPE
            )));
        }
        let bytes = self.host_data(tensor)?;
        let mut out = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>().max(1)];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
        Ok(out)
    }

    /// Totals per device, in device order.
    pub fn devices(&self) -> &[DeviceReport] {
        &self.devices
    }

    /// Seconds for the whole load.
    pub fn seconds(&self) -> f64 {
        self.seconds
    }

    /// Bytes moved to CUDA devices per second of the whole load.
    pub fn device_gbps(&self) -> f64 {
        let bytes: u64 = self
            .devices
            .iter()
            .filter(|d| matches!(d.device, Device::Cuda(_)))
            .map(|d| d.bytes)
            .sum();
        if self.seconds > 0.0 {
            bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }

    fn view(&self, tensor: &LoadedTensor) -> Result<ptload_reader::TensorView<'_>, LoadError> {
        self.ckpt.tensor_at(tensor.index).ok_or_else(|| {
            LoadError::Access(format!("{}: no tensor {}", tensor.info.name, tensor.index))
        })
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
}

impl Source {
    fn bytes<'a>(&'a self, ckpt: &'a Checkpoint) -> Result<&'a [u8], LoadError> {
        match &self.bytes {
            SourceBytes::Checkpoint(i) => Ok(ckpt.storage_bytes(*i)?),
            SourceBytes::Converted(b) => Ok(b),
        }
    }

    fn len(&self, ckpt: &Checkpoint) -> usize {
        match &self.bytes {
            SourceBytes::Checkpoint(i) => ckpt
                .storages()
                .get(*i)
                .map_or(0, |s| usize::try_from(s.nbytes).unwrap_or(usize::MAX)),
            SourceBytes::Converted(b) => b.len(),
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

fn render_strict(message: &str, hint: Option<&Hint>, terms: &dyn Terms) -> String {
    let clause = hint.map(|h| h.clause(terms)).unwrap_or_default();
    format!("{message}{clause}")
}

impl LoadError {
    /// The error for a user, with hints in `terms` (a front end's words)
    /// and each source after a colon.
    pub fn render(&self, terms: &dyn Terms) -> String {
        match self {
            LoadError::Strict { message, hint } => render_strict(message, hint.as_ref(), terms),
            LoadError::Reader(e) => e.render(terms),
            other => other.to_string(),
        }
    }
}

/// What one device's upload took.
struct DeviceWork {
    ordinal: u32,
    seconds: f64,
    copied: Copied,
}

/// Load the `selection` of `ckpt` where `plan` says. The result shares
/// `ckpt`: host storages that need no change stay slices of its map.
pub fn load(
    ckpt: Arc<Checkpoint>,
    selection: &[Selected],
    plan: &Plan,
    gpus: &Gpus,
    opts: &LoadOptions,
) -> Result<Loaded, LoadError> {
    let start = Instant::now();
    if opts.strict {
        check_strict(&ckpt, selection, plan, gpus)?;
    }
    let (mut sources, mut tensors) = resolve(&ckpt, selection, plan, gpus, opts)?;
    let (mut placed, work) = upload_all(&ckpt, &mut sources, gpus, opts)?;

    // Everything else: the host (swapped into an owned copy if needed), or meta.
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
                    SourceBytes::Checkpoint(i) => HostRepr::Mapped(Arc::clone(&ckpt), i),
                    SourceBytes::Converted(bytes) => HostRepr::Owned(bytes),
                };
                let storage = HostStorage { repr };
                // Converted buffers were counted when converted.
                if let (Some(p), false) = (&opts.progress, counted_at_conversion) {
                    p(storage.bytes()?.len() as u64);
                }
                Placed::Host(storage)
            }
        });
    }
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
    let (mut placed, _work) = upload_all(ckpt, &mut sources, gpus, opts)?;
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
    plan: &Plan,
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
    plan: &Plan,
    gpus: &Gpus,
    opts: &LoadOptions,
) -> Result<(Vec<Source>, Vec<LoadedTensor>), LoadError> {
    let mut sources: Vec<Source> = Vec::new();
    let mut source_of_storage: Vec<Option<usize>> = vec![None; ckpt.storages().len()];
    // Identical views of one storage (tied weights) share one converted copy.
    type View = (usize, u64, Vec<u64>, Vec<u64>, DType, bool, bool);
    let mut converted: HashMap<View, usize> = HashMap::new();
    let mut tensors = Vec::with_capacity(selection.len());
    for s in selection {
        let view = tensor(ckpt, s)?;
        let info = view.info();
        let target = plan.tensor_target(info);
        let (device, fallback) = match target {
            Device::Cuda(i) => match usable(gpus, i) {
                Ok(_) => (target, None),
                Err(why) => (Device::Host, Some(why)),
            },
            other => (other, None),
        };
        let convert = ptload_reader::convert::target(info.dtype, opts.dtype);
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
                // Conversion happens on the host, from the row-major
                // elements, into a storage of its own; it is never fused
                // into a copy.
                let key: View = (
                    si,
                    info.storage_offset,
                    info.shape.clone(),
                    info.stride.clone(),
                    to,
                    info.conj,
                    info.neg,
                );
                let k = match converted.get(&key) {
                    Some(&k) => k,
                    None => {
                        let data = view.data()?;
                        let read = data.len() as u64;
                        let bytes = if to == info.dtype {
                            data.into_owned()
                        } else {
                            ptload_reader::convert::convert(&data, info.dtype, to)?
                        };
                        // Conversion is most of such a load's time: it
                        // counts the bytes it read.
                        if let Some(p) = &opts.progress {
                            p(read);
                        }
                        sources.push(Source {
                            bytes: SourceBytes::Converted(bytes),
                            order: ByteOrder::HOST,
                            unit: to.swap_unit(),
                            device,
                            fallback,
                        });
                        converted.insert(key, sources.len() - 1);
                        sources.len() - 1
                    }
                };
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
                let slot = source_of_storage
                    .get_mut(si)
                    .ok_or_else(|| LoadError::Access(format!("{}: no storage {si}", s.name)))?;
                loaded.info.storage = Some(match *slot {
                    Some(k) => k,
                    None => {
                        // Swapped as torch swaps it: by the storage's type.
                        let storage = ckpt.storages().get(si).ok_or_else(|| {
                            LoadError::Access(format!("{}: no storage {si}", s.name))
                        })?;
                        sources.push(Source {
                            bytes: SourceBytes::Checkpoint(si),
                            order: ckpt.byte_order(),
                            unit: storage.dtype.swap_unit(),
                            device,
                            fallback,
                        });
                        *slot = Some(sources.len() - 1);
                        sources.len() - 1
                    }
                });
            }
        }
        tensors.push(loaded);
    }
    Ok((sources, tensors))
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
    let mut ordinals: Vec<u32> = members_of.keys().copied().collect();
    ordinals.sort_unstable();
    let mut prepared: Vec<(u32, &Gpu, Arena, Vec<usize>, Vec<usize>)> = Vec::new();
    for ordinal in ordinals {
        let Some(gpu) = gpus.get(ordinal) else {
            continue;
        };
        let members = members_of.remove(&ordinal).unwrap_or_default();
        if let Some((arena, members, offsets)) = allocate(ckpt, sources, gpu, ordinal, members)? {
            prepared.push((ordinal, gpu, arena, members, offsets));
        }
    }
    // Feed every device at once: one thread per device, each driving its
    // own streams.
    let mut uploads_per_device = Vec::with_capacity(prepared.len());
    for (_, _, _, members, offsets) in &prepared {
        let mut uploads = Vec::with_capacity(members.len());
        for (&k, &arena_offset) in members.iter().zip(offsets) {
            let s = sources
                .get(k)
                .ok_or_else(|| LoadError::Access(format!("source {k}")))?;
            uploads.push(Upload {
                bytes: s.bytes(ckpt)?,
                order: s.order,
                unit: s.unit,
                arena_offset,
                counted: matches!(s.bytes, SourceBytes::Checkpoint(_)),
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
            }),
        }
    }
    for p in storages {
        let (device, len) = match p {
            Placed::Host(h) => (Device::Host, h.bytes().map_or(0, |b| b.len() as u64)),
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
        total = total.saturating_add(len.div_ceil(ARENA_ALIGN) * ARENA_ALIGN);
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
