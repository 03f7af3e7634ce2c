//! Executing a plan: every storage once, where the plan says, or on the
//! host with the reason when its device is missing or full.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use ptload_reader::placement::{Device, Plan};
use ptload_reader::state_dict::Selected;
use ptload_reader::{ByteOrder, Checkpoint, DType};

use crate::cuda::{self, Arena, Staging, Upload, UploadError};
use crate::probe::Gpus;

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
    /// Told how many bytes each step placed (for progress bars).
    pub progress: Option<Progress>,
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("strict", &self.strict)
            .field("staging", &self.staging)
            .field("dtype", &self.dtype)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// Why a load failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Strict mode: a planned device does not exist.
    #[error("{0}")]
    Strict(String),
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
}

/// Where a storage's bytes are after the load.
#[derive(Debug)]
pub enum Placed<'c> {
    /// Host memory: borrowed from the checkpoint (the memory map) when the
    /// bytes are usable as they are, owned when swapped or converted.
    Host(Cow<'c, [u8]>),
    /// A sub-slice of a device arena.
    Cuda(CudaStorage),
    /// Shape only: no data was read.
    Meta,
}

/// A storage on a CUDA device: `len` bytes at `offset` of an arena.
#[derive(Debug, Clone)]
pub struct CudaStorage {
    /// Device ordinal.
    pub ordinal: u32,
    /// Offset in the arena.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
    arena: Arc<Arena>,
}

impl CudaStorage {
    /// Raw device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.arena.device_ptr() + self.offset as u64
    }

    /// Copy the bytes back to the host.
    pub fn read_back(&self) -> Result<Vec<u8>, String> {
        self.arena.read_back(self.offset, self.len)
    }
}

/// A loaded tensor: a view (offset, shape, stride, dtype) into its storage.
#[derive(Debug, Clone)]
pub struct LoadedTensor {
    /// Name (after state-dict selection).
    pub name: String,
    /// Element type (after conversion, if any).
    pub dtype: DType,
    /// Sizes.
    pub shape: Vec<u64>,
    /// Strides, in elements.
    pub stride: Vec<u64>,
    /// Offset in its storage, in elements.
    pub storage_offset: u64,
    /// Index into [`Loaded::storages`]; `None` for meta tensors.
    pub storage: Option<usize>,
    /// Where the plan put it.
    pub target: Device,
    /// Where it is.
    pub device: Device,
    /// Why `device` differs from `target`, or `None`.
    pub fallback: Option<String>,
    /// `Some(original dtype)` when converted.
    pub converted_from: Option<DType>,
}

/// Per-device totals.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReport {
    /// The device.
    pub device: Device,
    /// Tensors placed there.
    pub tensors: usize,
    /// Bytes of storages placed there.
    pub bytes: u64,
    /// Seconds spent copying to it (0 for the host and meta).
    pub seconds: f64,
}

/// The result of a load.
#[derive(Debug)]
pub struct Loaded<'c> {
    /// Storages, each once; tensors index into this.
    pub storages: Vec<Placed<'c>>,
    /// Tensors, in selection order.
    pub tensors: Vec<LoadedTensor>,
    /// Totals per device, in device order.
    pub devices: Vec<DeviceReport>,
    /// Seconds for the whole load.
    pub seconds: f64,
}

impl Loaded<'_> {
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
}

const ARENA_ALIGN: usize = 256;

/// A storage to place: the checkpoint's, or a tensor's converted bytes.
struct Source<'c> {
    bytes: Cow<'c, [u8]>,
    /// The bytes' order, and the unit it applies to (see
    /// [`ByteOrder::to_host`]).
    order: ByteOrder,
    unit: usize,
    device: Device,
    fallback: Option<String>,
}

fn strict_message(gpus: &Gpus, ordinal: u32) -> String {
    match gpus {
        Gpus::Devices(d) if !d.is_empty() => format!(
            "Attempting to deserialize object on CUDA device {ordinal} but this machine has {} CUDA device(s). \
             Map your storages to an existing device with a Mapper (placement::MapLocation \
             is torch's map_location).",
            d.len()
        ),
        _ => format!(
            "Attempting to deserialize object on a CUDA device but no CUDA device is usable ({}). \
             If you are running on a CPU-only machine, map your storages to the CPU with a \
             Mapper (placement::To(Device::Host), or placement::MapLocation \"cpu\").",
            gpus.why_none()
        ),
    }
}

/// Load the `selection` of `ckpt` where `plan` says.
pub fn load<'c>(
    ckpt: &'c Checkpoint,
    selection: &[Selected],
    plan: &Plan,
    gpus: &Gpus,
    opts: &LoadOptions,
) -> Result<Loaded<'c>, LoadError> {
    let start = Instant::now();
    // Strict mode fails before anything is copied.
    if opts.strict {
        for s in selection {
            let Some(t) = ckpt.tensor_at(s.index) else {
                continue;
            };
            if let Device::Cuda(i) = plan.tensor_target(t.info()) {
                if gpus.get(i).is_none() {
                    return Err(LoadError::Strict(strict_message(gpus, i)));
                }
            }
        }
    }
    let mut sources: Vec<Source<'c>> = Vec::new();
    let mut index_of: Vec<Option<usize>> = vec![None; ckpt.storages().len()];
    let mut tensors = Vec::with_capacity(selection.len());
    // Identical views of one storage (tied weights) share one converted copy.
    type View = (usize, u64, Vec<u64>, Vec<u64>);
    let mut converted: Vec<(View, usize)> = Vec::new();
    for s in selection {
        let Some(view) = ckpt.tensor_at(s.index) else {
            continue;
        };
        let info = view.info();
        let target = plan.tensor_target(info);
        let (device, fallback) = match target {
            Device::Cuda(i) if gpus.get(i).is_none() => (
                Device::Host,
                Some(match gpus {
                    Gpus::Devices(d) if !d.is_empty() => {
                        format!("cuda:{i} does not exist ({} CUDA device(s))", d.len())
                    }
                    _ => gpus.why_none(),
                }),
            ),
            other => (other, None),
        };
        let convert = opts.dtype.filter(|&to| {
            info.dtype.is_float()
                && info.dtype != to
                && ptload_reader::convert::can_convert(info.dtype, to)
        });
        let mut loaded = LoadedTensor {
            name: s.name.clone(),
            dtype: info.dtype,
            shape: info.shape.clone(),
            stride: info.stride.clone(),
            storage_offset: info.storage_offset,
            storage: None,
            target,
            device,
            fallback: fallback.clone(),
            converted_from: None,
        };
        if target == Device::Meta || info.storage.is_none() {
            loaded.device = Device::Meta;
            loaded.fallback = None;
        } else if let Some(to) = convert {
            // Conversion happens on the host, from the row-major elements,
            // into a storage of its own; it is never fused into a copy.
            let key: View = (
                info.storage.unwrap_or(usize::MAX),
                info.storage_offset,
                info.shape.clone(),
                info.stride.clone(),
            );
            let existing = converted.iter().find(|(v, _)| *v == key).map(|&(_, k)| k);
            let k = match existing {
                Some(k) => k,
                None => {
                    let data = view.data()?;
                    let bytes = ptload_reader::convert::convert(&data, info.dtype, to)?;
                    sources.push(Source {
                        bytes: Cow::Owned(bytes),
                        order: ByteOrder::HOST,
                        unit: to.swap_unit(),
                        device,
                        fallback,
                    });
                    converted.push((key, sources.len() - 1));
                    sources.len() - 1
                }
            };
            loaded.converted_from = Some(info.dtype);
            loaded.dtype = to;
            loaded.stride = contiguous_strides(&info.shape);
            loaded.storage_offset = 0;
            loaded.storage = Some(k);
        } else if let Some(si) = info.storage {
            let existing = index_of.get(si).copied().flatten();
            loaded.storage = Some(match existing {
                Some(k) => k,
                None => {
                    let bytes = Cow::Borrowed(ckpt.storage_bytes(si)?);
                    sources.push(Source {
                        bytes,
                        order: ckpt.byte_order(),
                        unit: info.dtype.swap_unit(),
                        device,
                        fallback,
                    });
                    if let Some(slot) = index_of.get_mut(si) {
                        *slot = Some(sources.len() - 1);
                    }
                    sources.len() - 1
                }
            });
        }
        tensors.push(loaded);
    }

    // CUDA storages: one arena per device, in source order (file order).
    let mut placed: Vec<Option<Placed<'c>>> = (0..sources.len()).map(|_| None).collect();
    let mut seconds_per_device: Vec<(u32, f64)> = Vec::new();
    let mut prepared = Vec::new();
    let mut ordinals: Vec<u32> = sources
        .iter()
        .filter_map(|s| match s.device {
            Device::Cuda(i) => Some(i),
            _ => None,
        })
        .collect();
    ordinals.sort_unstable();
    ordinals.dedup();
    for ordinal in ordinals {
        let Some(gpu) = gpus.get(ordinal) else {
            continue;
        };
        let members: Vec<usize> = (0..sources.len())
            .filter(|&k| {
                sources
                    .get(k)
                    .is_some_and(|s| s.device == Device::Cuda(ordinal))
            })
            .collect();
        let (mut offsets, mut total) = layout(&sources, &members);
        let mut members = members;
        let arena = match cuda::allocate(gpu, total) {
            Ok(a) => a,
            Err(UploadError::OutOfMemory(_)) => {
                // Keep what fits in the free memory, in order; the rest
                // falls back to the host with the reason.
                let free = gpu.context().mem_get_info().map(|(f, _)| f).unwrap_or(0);
                let budget = free.saturating_sub(free / 20);
                let keep = offsets.iter().zip(&members).take_while(|(&o, &k)| {
                    o + sources.get(k).map_or(0, |s| s.bytes.len()) <= budget
                });
                let kept: Vec<usize> = keep.map(|(_, &k)| k).collect();
                for &k in members.iter().filter(|k| !kept.contains(k)) {
                    if let Some(s) = sources.get_mut(k) {
                        s.device = Device::Host;
                        s.fallback = Some(format!(
                            "out of memory on cuda:{ordinal} ({} bytes free)",
                            free
                        ));
                    }
                }
                members = kept;
                (offsets, total) = layout(&sources, &members);
                match cuda::allocate(gpu, total) {
                    Ok(a) => a,
                    Err(UploadError::OutOfMemory(m) | UploadError::Driver(m)) => {
                        for &k in &members {
                            if let Some(s) = sources.get_mut(k) {
                                s.device = Device::Host;
                                s.fallback = Some(format!("out of memory on cuda:{ordinal}: {m}"));
                            }
                        }
                        continue;
                    }
                }
            }
            Err(UploadError::Driver(message)) => return Err(LoadError::Cuda { ordinal, message }),
        };
        prepared.push((ordinal, gpu, arena, members, offsets));
    }
    // Feed every device at once: one thread per device, each driving its
    // own streams.
    let sources_ref = &sources;
    let results: Vec<(u32, Result<(), UploadError>, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = prepared
            .iter()
            .map(|(ordinal, gpu, arena, members, offsets)| {
                let uploads: Vec<Upload<'_>> = members
                    .iter()
                    .zip(offsets)
                    .filter_map(|(&k, &arena_offset)| {
                        let s = sources_ref.get(k)?;
                        Some(Upload {
                            bytes: &s.bytes,
                            order: s.order,
                            unit: s.unit,
                            arena_offset,
                        })
                    })
                    .collect();
                let staging = &opts.staging;
                let progress = opts.progress.as_deref();
                scope.spawn(move || {
                    let started = Instant::now();
                    let result = cuda::upload(gpu, arena, &uploads, staging, progress);
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
    for (ordinal, result, seconds) in results {
        result.map_err(|e| match e {
            UploadError::OutOfMemory(message) | UploadError::Driver(message) => {
                LoadError::Cuda { ordinal, message }
            }
        })?;
        seconds_per_device.push((ordinal, seconds));
    }
    for (ordinal, _, arena, members, offsets) in prepared {
        let arena = Arc::new(arena);
        for (&k, &offset) in members.iter().zip(&offsets) {
            let len = sources.get(k).map_or(0, |s| s.bytes.len());
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

    // Everything else: the host (swapped into an owned copy if needed), or meta.
    let mut storages = Vec::with_capacity(sources.len());
    for (k, source) in sources.iter_mut().enumerate() {
        let done = placed.get_mut(k).and_then(Option::take);
        storages.push(match (done, source.device) {
            (Some(p), _) => p,
            (None, Device::Meta) => Placed::Meta,
            (None, _) => {
                source.device = Device::Host;
                // Moved out: each source is placed once.
                let bytes = std::mem::take(&mut source.bytes);
                if let Some(p) = &opts.progress {
                    p(bytes.len() as u64);
                }
                Placed::Host(if source.order.needs_swap(source.unit) {
                    let mut owned = bytes.into_owned();
                    source.order.to_host(&mut owned, source.unit);
                    Cow::Owned(owned)
                } else {
                    bytes
                })
            }
        });
    }
    // Fallbacks decided during allocation reach the tensors.
    for t in &mut tensors {
        if let Some(s) = t.storage.and_then(|k| sources.get(k)) {
            t.device = s.device;
            t.fallback = s.fallback.clone();
        }
    }
    let mut devices: Vec<DeviceReport> = Vec::new();
    for t in &tensors {
        match devices.iter_mut().find(|d| d.device == t.device) {
            Some(d) => d.tensors += 1,
            None => devices.push(DeviceReport {
                device: t.device,
                tensors: 1,
                bytes: 0,
                seconds: 0.0,
            }),
        }
    }
    for p in &storages {
        let (device, len) = match p {
            Placed::Host(b) => (Device::Host, b.len() as u64),
            Placed::Cuda(c) => (Device::Cuda(c.ordinal), c.len as u64),
            Placed::Meta => (Device::Meta, 0),
        };
        if let Some(d) = devices.iter_mut().find(|d| d.device == device) {
            d.bytes += len;
        }
    }
    for (ordinal, seconds) in seconds_per_device {
        if let Some(d) = devices
            .iter_mut()
            .find(|d| d.device == Device::Cuda(ordinal))
        {
            d.seconds = seconds;
        }
    }
    devices.sort_by_key(|d| d.device);
    Ok(Loaded {
        storages,
        tensors,
        devices,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Offsets of `members` in an arena, each aligned, and the arena's size.
fn layout(sources: &[Source<'_>], members: &[usize]) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(members.len());
    let mut total = 0usize;
    for &k in members {
        offsets.push(total);
        let len = sources.get(k).map_or(0, |s| s.bytes.len());
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
