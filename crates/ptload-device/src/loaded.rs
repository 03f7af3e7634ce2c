//! The result of a load: [`Loaded`] owns what it placed and shares the
//! checkpoint (host storages that need no change stay slices of its
//! memory map), so an engine can keep it in a struct of its own.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::CudaView;
use ptload_reader::placement::Device;
use ptload_reader::{Checkpoint, DType, Element, TensorInfo};

use crate::cuda::{Arena, WorkerTime};
use crate::error::{DeviceError, DeviceErrorKind, Fallback, LoadError};

/// Bytes of a GPU tensor copied back at a time by
/// [`Loaded::visit_elements`].
const READ_BACK_PIECE: usize = 8 << 20;

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
    pub(crate) repr: HostRepr,
}

#[derive(Debug)]
pub(crate) enum HostRepr {
    /// Storage `index` of the checkpoint, as it lies in the file.
    Mapped(Arc<Checkpoint>, usize),
    Owned(Vec<u8>),
}

impl HostStorage {
    /// The storage's bytes. A storage of a file read by ranges that the
    /// load left to be fetched when read
    /// ([`LoadOptions::host_on_read`](crate::LoadOptions::host_on_read))
    /// is fetched now and kept.
    pub fn bytes(&self) -> Result<&[u8], LoadError> {
        match &self.repr {
            HostRepr::Mapped(ckpt, index) => Ok(ckpt.storage_bytes(*index)?),
            HostRepr::Owned(bytes) => Ok(bytes),
        }
    }

    /// Bytes it holds, without reading them.
    pub fn len(&self) -> u64 {
        match &self.repr {
            HostRepr::Mapped(ckpt, index) => ckpt.storages().get(*index).map_or(0, |s| s.nbytes),
            HostRepr::Owned(bytes) => bytes.len() as u64,
        }
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
    pub(crate) ordinal: u32,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) arena: Arc<Arena>,
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
    pub slice: Option<ptload_reader::tp::Slice>,
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
    pub(crate) rewritten: bool,
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
    /// Staging bytes page-locked for it (buffers kept from an earlier
    /// load, [`Staging::keep`](crate::Staging::keep), are not counted).
    pub pinned_bytes: usize,
    /// Driver calls that page-locked them: one per round of buffers (at
    /// most two for a load), none when kept buffers served it.
    pub pinnings: usize,
    /// Where its copy workers spent their time (zero for the host and
    /// meta).
    pub time: WorkerTime,
}

/// The result of a load: the checkpoint, every placed storage, and the
/// tensors viewing them, looked up by name.
#[derive(Debug)]
pub struct Loaded {
    pub(crate) ckpt: Arc<Checkpoint>,
    pub(crate) storages: Vec<Placed>,
    pub(crate) tensors: Vec<LoadedTensor>,
    pub(crate) by_name: HashMap<String, usize>,
    pub(crate) devices: Vec<DeviceReport>,
    pub(crate) seconds: f64,
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

    /// A tensor's elements, row-major and in host byte order, wherever it
    /// landed, handed to `f` a piece at a time: what
    /// [`elements`](Self::elements) returns, without holding it whole where
    /// that can be helped. A contiguous tensor on a GPU is copied back
    /// 8 MiB at a time (a strided one is copied back
    /// and gathered whole); a host tensor of a file read by ranges is
    /// streamed from the file in pieces when the checkpoint keeps no copy
    /// of it ([`LoadOptions::host_on_read`](crate::LoadOptions::host_on_read)),
    /// and borrowed otherwise. For hashing or writing what landed; an
    /// error for a meta tensor.
    pub fn visit_elements(
        &self,
        tensor: &LoadedTensor,
        mut f: impl FnMut(&[u8]),
    ) -> Result<(), LoadError> {
        let info = &tensor.info;
        match self.storage_of(tensor) {
            Some(Placed::Cuda(cuda)) if info.is_contiguous() => {
                let elem = info.dtype.size() as u64;
                let range = info
                    .storage_offset
                    .checked_mul(elem)
                    .zip(info.numel.checked_mul(elem))
                    .and_then(|(s, n)| Some((usize::try_from(s).ok()?, usize::try_from(n).ok()?)));
                let Some((start, len)) = range else {
                    return Err(LoadError::Access(format!(
                        "{}: on {}: its extent overflows",
                        info.name, tensor.device
                    )));
                };
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(READ_BACK_PIECE);
                    let piece = cuda.read_range(start + at, n).map_err(|e| {
                        LoadError::Access(format!(
                            "{}: on {}: {}",
                            info.name,
                            tensor.device,
                            e.message()
                        ))
                    })?;
                    f(&piece);
                    at += n;
                }
                Ok(())
            }
            Some(Placed::Host(HostStorage {
                repr: HostRepr::Mapped(..),
            })) => Ok(self.view(tensor)?.visit_bytes(f)?),
            _ => {
                f(&self.elements(tensor)?);
                Ok(())
            }
        }
    }

    /// Run `work` while the file's storages that host tensors read are
    /// fetched ahead of it, several requests in flight, in tensor order:
    /// for a reader that visits every tensor in turn
    /// ([`visit_elements`](Self::visit_elements)) after a load that left
    /// them to be fetched when read
    /// ([`LoadOptions::host_on_read`](crate::LoadOptions::host_on_read)).
    /// What the reader takes is dropped when it is done, so the memory
    /// held stays bounded. Fetches nothing for a mapped file or storages
    /// the load fetched.
    pub fn while_reading_ahead<T>(&self, work: impl FnOnce() -> T) -> T {
        let storages: Vec<usize> = self
            .tensors
            .iter()
            .filter_map(|t| match self.storage_of(t)? {
                Placed::Host(HostStorage {
                    repr: HostRepr::Mapped(_, index),
                }) => Some(*index),
                _ => None,
            })
            .collect();
        ptload_reader::checkpoint::while_prefetching(&[(&self.ckpt, &storages)], work)
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
