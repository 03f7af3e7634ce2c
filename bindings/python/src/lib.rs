//! `ptload._ptload`: the Rust half of the Python package. It opens a
//! checkpoint with ptload-reader (the GIL released) and hands Python flat
//! descriptions: the unpickled object's nodes, its tensors and storages.
//! The package's Python half (`python/ptload`) builds torch or numpy
//! objects from them; nothing here imports torch or runs the file.
#![deny(unsafe_code)]
// No unwrap/expect/panic and no unchecked indexing, as in the library
// crates: a failure is a Python exception, never an abort.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod dlpack;
mod terms;

// The reader makes and frees many small values per tensor; mimalloc halves
// the time glibc's allocator takes over them (benches/python_load.py).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;

use ptload_reader::checkpoint::{ByteOrder, Quantization};
use ptload_reader::object::Node;
use ptload_reader::placement::{Device, DeviceMap, To};
use ptload_reader::set::CheckpointSet;
use ptload_reader::state_dict::{KeySelect, Selected, StateDictOptions, Strip};
use ptload_reader::tp::{Shard, Splits};
use ptload_reader::{DType, OpenOptions, TensorInfo, TensorView};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyTuple};
use pyo3::BoundObject;

create_exception!(
    _ptload,
    Error,
    PyException,
    "Base of every error ptload raises: the reader's message, with `kind`, `offset`, `record` and `tensor` attributes."
);

/// The reader's error as the exception the package raises for its kind:
/// `ptload._errors.from_reader` holds the one table of kinds to Python
/// classes (each a `ptload.Error` and the exception torch raises).
fn to_py(err: ptload_reader::Error) -> PyErr {
    Python::with_gil(|py| {
        let kind = format!("{:?}", err.kind());
        let hint = err.hint().map(|h| h.clause(&terms::Kwargs));
        let made = py.import("ptload._errors").and_then(|m| {
            let extra = pyo3::types::PyDict::new(py);
            extra.set_item("file", err.file())?;
            extra.set_item("hint", hint)?;
            m.getattr("from_reader")?.call(
                (
                    kind.as_str(),
                    err.render(&terms::Kwargs),
                    err.offset(),
                    err.record(),
                    err.tensor(),
                ),
                Some(&extra),
            )
        });
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(e) => e,
        }
    })
}

/// Work done on a thread of its own while Python waits: what it counts
/// for progress, and the flag that tells it to stop.
#[derive(Clone, Debug, Default)]
pub struct Work {
    done: Arc<AtomicU64>,
    cancel: Arc<AtomicBool>,
}

impl Work {
    /// Count `n` more bytes done.
    pub fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    /// Whether the caller gave up (Ctrl-C).
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

/// Run `job` on a thread of its own while this one waits with the GIL
/// released, waking every 50 ms to let Python run its signal handlers (a
/// Ctrl-C raises `KeyboardInterrupt` from here) and to call `progress`
/// with the bytes `job` has counted. On an exception the job is told to
/// stop and left to end on its thread; what it made is dropped there.
fn interruptible<T: Send + 'static>(
    py: Python<'_>,
    progress: Option<&Bound<'_, PyAny>>,
    job: impl FnOnce(&Work) -> T + Send + 'static,
) -> PyResult<T> {
    let work = Work::default();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let theirs = work.clone();
    std::thread::Builder::new()
        .name("ptload".into())
        .spawn(move || {
            let _ = tx.send(job(&theirs));
        })
        .map_err(|e| Error::new_err(format!("cannot start a thread: {e}")))?;
    let mut reported = 0;
    let mut rx = Some(rx);
    loop {
        let waiting = rx
            .take()
            .ok_or_else(|| Error::new_err("no reading thread"))?;
        let (got, waiting) = py.allow_threads(move || {
            let got = waiting.recv_timeout(std::time::Duration::from_millis(50));
            (got, waiting)
        });
        rx = Some(waiting);
        let step = (|| {
            if let Some(progress) = progress {
                let done = work.done.load(Ordering::Relaxed);
                if done != reported {
                    reported = done;
                    progress.call1((done,))?;
                }
            }
            py.check_signals()
        })();
        match (got, step) {
            (Ok(value), Ok(())) => return Ok(value),
            (Err(RecvTimeoutError::Timeout), Ok(())) => {}
            (Err(RecvTimeoutError::Disconnected), _) => {
                return Err(Error::new_err(
                    "the reading thread stopped without an answer",
                ))
            }
            (_, Err(e)) => {
                work.cancel.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
    }
}

/// A selected state dict: (name, index into the flattened tensors) pairs,
/// and what the automatic options decided.
type Chosen = (Vec<(String, usize)>, Vec<(&'static str, String)>);

/// An open checkpoint.
#[pyclass(frozen, module = "ptload._ptload")]
struct Checkpoint {
    inner: Arc<ptload_reader::Checkpoint>,
}

/// A tensor as the reader describes it: what Python builds it from.
#[pyclass(frozen, get_all, module = "ptload._ptload")]
struct TensorRecord {
    /// Its flattened name (`<node N>` for a tensor the walk did not name).
    name: String,
    /// ptload's dtype name (`F32`, `BF16`, `F8_E4M3`...).
    dtype: &'static str,
    shape: Vec<u64>,
    /// In elements.
    stride: Vec<u64>,
    /// Into its storage, in elements.
    offset: u64,
    /// Index into the storages; None for a meta tensor.
    storage: Option<usize>,
    requires_grad: bool,
    conj: bool,
    neg: bool,
    /// For a quantized tensor, how its integers map to values.
    quantization: Option<Py<QuantRecord>>,
}

/// A quantized tensor's parameters.
#[pyclass(frozen, get_all, module = "ptload._ptload")]
struct QuantRecord {
    /// `tensor` (one scale and zero point) or `channel` (one per channel
    /// along `axis`, tensors of the object graph).
    per: &'static str,
    /// `qint8`, `quint8`, `qint32`, `quint4x2`, `quint2x4`.
    kind: &'static str,
    /// torch's qscheme name.
    scheme: String,
    scale: Option<f64>,
    zero_point: Option<i64>,
    axis: Option<i64>,
    /// For packed kinds, the shape of the values (the record's shape is
    /// the packed bytes').
    values_shape: Option<Vec<u64>>,
}

/// A storage: its bytes and where they are.
#[pyclass(frozen, get_all, module = "ptload._ptload")]
struct StorageRecord {
    key: String,
    /// Where it was saved (`cpu`, `cuda:1`...).
    location: String,
    dtype: &'static str,
    numel: u64,
    nbytes: u64,
    /// Where its bytes start in the file; None where they are not there as
    /// they are (an inflated record).
    file_offset: Option<u64>,
}

fn tensor_record(py: Python<'_>, t: &TensorInfo) -> PyResult<TensorRecord> {
    let quantization = match &t.quantization {
        None => None,
        Some(Quantization::PerTensor {
            kind,
            scheme,
            scale,
            zero_point,
            values_shape,
        }) => Some(QuantRecord {
            per: "tensor",
            kind,
            scheme: scheme.clone(),
            scale: Some(*scale),
            zero_point: Some(*zero_point),
            axis: None,
            values_shape: values_shape.clone(),
        }),
        Some(Quantization::PerChannel {
            kind,
            scheme,
            axis,
            values_shape,
        }) => Some(QuantRecord {
            per: "channel",
            kind,
            scheme: scheme.clone(),
            scale: None,
            zero_point: None,
            axis: Some(*axis),
            values_shape: values_shape.clone(),
        }),
        Some(_) => None,
    };
    Ok(TensorRecord {
        name: t.name.clone(),
        dtype: t.dtype.name(),
        shape: t.shape.clone(),
        stride: t.stride.clone(),
        offset: t.storage_offset,
        storage: t.storage,
        requires_grad: t.requires_grad,
        conj: t.conj,
        neg: t.neg,
        quantization: quantization.map(|q| Py::new(py, q)).transpose()?,
    })
}

fn tensor_record_bound<'py>(py: Python<'py>, t: &TensorInfo) -> PyResult<Bound<'py, TensorRecord>> {
    Bound::new(py, tensor_record(py, t)?)
}

fn node_tuple<'py>(py: Python<'py>, node: &Node) -> PyResult<Bound<'py, PyAny>> {
    fn t<'py>(py: Python<'py>, v: impl IntoPyObject<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(v.into_pyobject(py)
            .map_err(Into::into)?
            .into_any()
            .into_bound())
    }
    let pairs = |items: &[(usize, usize)]| -> Vec<usize> {
        items.iter().flat_map(|&(k, v)| [k, v]).collect()
    };
    match node {
        Node::None => t(py, ("none",)),
        Node::Bool(b) => t(py, ("bool", *b)),
        Node::Int(i) => t(py, ("int", *i)),
        Node::BigInt(le) => t(py, ("bigint", PyBytes::new(py, le))),
        Node::Float(f) => t(py, ("float", *f)),
        Node::Str(s) => t(py, ("str", s.as_str())),
        Node::Bytes(b) => t(py, ("bytes", PyBytes::new(py, b))),
        Node::ByteArray(b) => t(py, ("bytearray", PyBytes::new(py, b))),
        Node::Tuple(items) => t(py, ("tuple", items.clone())),
        Node::Size(items) => t(py, ("size", items.clone())),
        Node::List(items) => t(py, ("list", items.clone())),
        Node::Dict {
            ordered,
            items,
            state,
        } => t(py, ("dict", *ordered, pairs(items), *state)),
        Node::Set(items) => t(py, ("set", items.clone())),
        Node::FrozenSet(items) => t(py, ("frozenset", items.clone())),
        Node::Tensor {
            tensor,
            qparams,
            attrs,
        } => t(py, ("tensor", *tensor, *qparams, *attrs)),
        Node::Storage { storage, dtype } => t(py, ("storage", *storage, dtype.name())),
        Node::Parameter {
            data,
            requires_grad,
            attrs,
        } => t(py, ("parameter", *data, *requires_grad, *attrs)),
        Node::Sparse { layout, data } => t(py, ("sparse", *layout, *data)),
        Node::Device(d) => t(py, ("device", d.as_str())),
        Node::Dtype { name, .. } => t(py, ("dtype", name.as_str())),
        Node::Layout(l) => t(py, ("layout", *l)),
        Node::Global { module, name } => t(py, ("global", module.as_str(), name.as_str())),
        Node::NumpyDtype {
            descr,
            big_endian,
            structured,
        } => t(py, ("npdtype", descr.as_str(), *big_endian, *structured)),
        Node::NumpyScalar {
            descr,
            big_endian,
            raw,
        } => t(
            py,
            (
                "npscalar",
                descr.as_str(),
                *big_endian,
                PyBytes::new(py, raw),
            ),
        ),
        Node::NdArray {
            descr,
            shape,
            fortran,
            data,
        } => t(
            py,
            ("ndarray", descr.clone(), shape.clone(), *fortran, *data),
        ),
        Node::Object {
            new,
            class,
            args,
            state,
            items,
            list,
        } => t(
            py,
            (
                "object",
                *new,
                *class,
                *args,
                *state,
                pairs(items),
                list.clone(),
            ),
        ),
        _ => t(py, ("unknown",)),
    }
}

#[pymethods]
impl Checkpoint {
    /// The layout: `zip`, `legacy`, `torchscript`, `safetensors`...
    fn format(&self) -> String {
        format!("{:?}", self.inner.format()).to_lowercase()
    }

    /// A safetensors file's `__metadata__` (its string values, in the
    /// header's order); empty for other layouts.
    fn safetensors_metadata(&self) -> Vec<(String, String)> {
        if self.inner.format() != ptload_reader::checkpoint::Format::Safetensors {
            return Vec::new();
        }
        self.inner
            .values()
            .iter()
            .filter_map(|(k, v)| match v {
                ptload_reader::checkpoint::Scalar::Str(s) => Some((k.clone(), s.clone())),
                _ => None,
            })
            .collect()
    }

    /// The offset just past the checkpoint's last byte (where torch.load
    /// leaves a stream it read the checkpoint from).
    fn end_offset(&self) -> u64 {
        self.inner.end_offset()
    }

    /// Byte order of the stored tensor data: `little` or `big`.
    fn byte_order(&self) -> &'static str {
        match self.inner.byte_order() {
            ByteOrder::Big => "big",
            _ => "little",
        }
    }

    /// Whether the tensor bytes come from a memory map of the file.
    fn is_mapped(&self) -> bool {
        self.inner.is_mapped()
    }

    /// The globals (`module.name`, once each) the strict policy refuses
    /// with the caller's `allowed` names and globs: the reader's list.
    fn refused_globals(&self, allowed: Vec<String>) -> Vec<String> {
        self.inner.refused_globals(&allowed)
    }

    /// Every global the pickles name: (module, name, torch_allowed, called,
    /// instantiated, record, offset).
    fn globals<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .inner
            .globals()
            .iter()
            .map(|g| {
                (
                    g.module.as_str(),
                    g.name.as_str(),
                    g.torch_allowed,
                    g.called,
                    g.instantiated,
                    g.record.as_str(),
                    g.offset,
                )
                    .into_pyobject(py)
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// What the reader noticed and did not treat as an error.
    fn warnings(&self) -> Vec<String> {
        self.inner.warnings().to_vec()
    }

    /// The storages, as records.
    fn storages(&self) -> Vec<StorageRecord> {
        self.inner
            .storages()
            .iter()
            .map(|s| StorageRecord {
                key: s.key.clone(),
                location: s.location.clone(),
                dtype: s.dtype.name(),
                numel: s.numel,
                nbytes: s.nbytes,
                file_offset: s.file_offset,
            })
            .collect()
    }

    /// The names of the tensors viewing each storage (the flattened names
    /// `inspect` shows), in checkpoint order: one list per storage.
    fn storage_names(&self) -> Vec<Vec<String>> {
        let mut names = vec![Vec::new(); self.inner.storages().len()];
        for t in self.inner.tensors() {
            if let Some(list) = t.info().storage.and_then(|i| names.get_mut(i)) {
                list.push(t.name().to_owned());
            }
        }
        names
    }

    /// Where `place` rules (pattern, device), a `budget` (ordinal and bytes
    /// of each GPU) or `balance` (a number of GPUs) put each storage, as
    /// the CLI's `--place`, `--budget` and `--balance` decide (place rules
    /// first): per storage, the device one of them chose, or None where
    /// none did (the storage then follows `map_location`).
    #[pyo3(signature = (place=Vec::new(), budget=None, balance=None))]
    fn placement(
        &self,
        place: Vec<(String, String)>,
        budget: Option<Vec<(u32, u64)>>,
        balance: Option<u32>,
    ) -> PyResult<Vec<Option<String>>> {
        use ptload_reader::placement::{Budget, ByName, Choices};
        let mut rules = Vec::with_capacity(place.len());
        for (pattern, device) in place {
            let device: Device = device
                .parse()
                .map_err(|e: ptload_reader::Error| PyValueError::new_err(e.to_string()))?;
            rules.push((pattern, device));
        }
        let choices = Choices {
            by_name: ByName(rules),
            map_location: None,
            budget: budget.map(|gpus| {
                Budget::new(
                    gpus.into_iter()
                        .map(|(i, b)| (Device::Cuda(i), b))
                        .collect(),
                )
            }),
            balance: balance.map(|n| (0..n).map(Device::Cuda).collect()),
        };
        let mut mapper = choices.mapper(&self.inner);
        let plan = DeviceMap::new(&self.inner, mapper.as_mut()).map_err(to_py)?;
        let mut chosen = vec![None; self.inner.storages().len()];
        for p in plan.placements().iter().filter(|p| p.mapped) {
            if let Some(slot) = chosen.get_mut(p.storage) {
                *slot = Some(p.target.to_string());
            }
        }
        Ok(chosen)
    }

    /// (index, location) of each storage not saved on `cpu`.
    fn off_host(&self) -> Vec<(usize, String)> {
        self.inner
            .storages()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.location != "cpu")
            .map(|(i, s)| (i, s.location.clone()))
            .collect()
    }

    /// A copy of storage `index`'s bytes, each `swap_unit`-byte element
    /// reversed when the file is big-endian, as a `bytearray` a tensor can
    /// be made over (writable: no further copy), read straight into it
    /// (`read_storage_at`): a file read by ranges hands the storage over,
    /// a deflated record is inflated into it, nothing is kept behind it.
    fn storage_bytes<'py>(
        &self,
        py: Python<'py>,
        index: usize,
        swap_unit: usize,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let inner = self.inner.clone();
        let len = inner
            .storages()
            .get(index)
            .and_then(|s| usize::try_from(s.nbytes).ok())
            .ok_or_else(|| Error::new_err(format!("no storage {index}")))?;
        // Read (or inflated) straight into the bytearray: one copy of the
        // storage, none kept behind it.
        PyByteArray::new_with(py, len, |buf| {
            py.allow_threads(|| -> Result<(), ptload_reader::Error> {
                inner.read_storage_at(index, 0, buf)?;
                if inner.byte_order() == ByteOrder::Big && swap_unit > 1 {
                    buf.chunks_exact_mut(swap_unit).for_each(<[u8]>::reverse);
                }
                Ok(())
            })
            .map_err(to_py)
        })
    }

    /// The unpickled object: (root node id, nodes, tensors). Each node is a
    /// tuple whose first item names its kind; tensors are
    /// (name, dtype, shape, stride, storage_offset, storage, requires_grad,
    /// conj, neg, quantization).
    fn objects<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let objects = self
            .inner
            .objects()
            .ok_or_else(|| Error::new_err("opened without objects=True"))?;
        let nodes = objects
            .nodes()
            .iter()
            .map(|n| node_tuple(py, n))
            .collect::<PyResult<Vec<_>>>()?;
        let tensors = objects
            .tensors()
            .iter()
            .map(|t| tensor_record_bound(py, t))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(
            py,
            [
                objects.root().into_pyobject(py)?.into_any(),
                PyList::new(py, nodes)?.into_any(),
                PyList::new(py, tensors)?.into_any(),
            ],
        )
    }

    /// The object graph's tensors made as torch tensors in one call, each
    /// a zero-copy DLPack view (`from_dlpack` is torch's consumer) of
    /// private memory holding the file: a copy-on-write map of `source`
    /// (a path) when `mmap`, else one read of it (or a copy of `source`'s
    /// bytes), or of a storage `uploaded` put on a GPU. One storage is one
    /// memory block, so tied tensors share it.
    /// `on_cpu`: which storages stay on the host: a list with one bool per
    /// storage, one bool for all, or None for those saved on `cpu`; with
    /// `host` false the caller reads host storages itself (`shared`: the
    /// map is shared, writes reach the file). A tensor this
    /// cannot make exactly as torch would (another device, big-endian or
    /// misaligned bytes, a dtype DLPack lacks, quantized, seen as two
    /// dtypes or as a storage object) is None, and so is every other
    /// tensor of its storage: the caller makes those.
    /// `progress` is called with the bytes read so far (`mmap=False`).
    /// `flat`: the flattened tensors (`tensors()`, as `safe_open` names
    /// them) instead of the object graph's.
    #[pyo3(signature = (from_dlpack, source, mmap, on_cpu, uploaded=None, progress=None, shared=false, host=true, flat=false))]
    #[allow(clippy::too_many_arguments)]
    fn torch_tensors<'py>(
        &self,
        py: Python<'py>,
        from_dlpack: &Bound<'py, PyAny>,
        source: &Bound<'py, PyAny>,
        mmap: bool,
        on_cpu: &Bound<'py, PyAny>,
        uploaded: Option<PyRef<'py, Uploaded>>,
        progress: Option<&Bound<'py, PyAny>>,
        shared: bool,
        host: bool,
        flat: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let objects = self.inner.objects();
        let tensors: Vec<&TensorInfo> = if flat {
            self.inner.tensors().map(|t| t.info()).collect()
        } else {
            objects
                .ok_or_else(|| Error::new_err("opened without objects=True"))?
                .tensors()
                .iter()
                .collect()
        };
        let storages = self.inner.storages();
        let on_cpu: Vec<bool> = if on_cpu.is_none() {
            storages.iter().map(|s| s.location == "cpu").collect()
        } else if let Ok(all) = on_cpu.extract::<bool>() {
            vec![all; storages.len()]
        } else {
            on_cpu.extract()?
        };
        let on_gpu = |i: usize| {
            uploaded
                .as_ref()
                .and_then(|u| u.storages.get(i))
                .and_then(|s| s.as_ref()?.as_ref().ok())
        };
        // Per storage: None when ineligible, else (dtype, tensors using it).
        // Uploads are in host order, at aligned device addresses.
        let host_order = self.inner.byte_order() != ByteOrder::Big;
        let mut plan: Vec<Option<(DType, Vec<usize>)>> = storages
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let on_host =
                    host && on_cpu.get(i) == Some(&true) && s.file_offset.is_some() && host_order;
                ((on_host || on_gpu(i).is_some()) && s.nbytes > 0).then(|| (s.dtype, Vec::new()))
            })
            .collect();
        // Storages the object graph also holds as storage objects are made
        // by the caller (as torch types each one on its own).
        let graph_nodes = if flat {
            None
        } else {
            objects.map(|o| o.nodes())
        };
        for node in graph_nodes.into_iter().flatten() {
            if let Node::Storage { storage: i, .. } = node {
                if let Some(slot) = plan.get_mut(*i) {
                    *slot = None;
                }
            }
        }
        for (t, info) in tensors.iter().enumerate() {
            let Some(s) = info.storage else { continue };
            let Some(slot) = plan.get_mut(s) else {
                continue;
            };
            let Some((dtype, users)) = slot else { continue };
            let size = info.dtype.size() as u64;
            let Some(storage) = storages.get(s) else {
                *slot = None;
                continue;
            };
            let offset = if on_gpu(s).is_some() {
                0
            } else {
                storage.file_offset.unwrap_or(1)
            };
            let ok = (users.is_empty() || *dtype == info.dtype)
                && info.quantization.is_none()
                && dlpack::dl_dtype(info.dtype).is_some()
                && storage.nbytes % size == 0
                && offset % size == 0;
            if ok {
                *dtype = info.dtype;
                users.push(t);
            } else {
                *slot = None;
            }
        }
        let mut made: Vec<PyObject> = tensors.iter().map(|_| py.None()).collect();
        let wanted = |s: usize, p: &Option<(DType, Vec<usize>)>| {
            p.as_ref().is_some_and(|(_, u)| !u.is_empty()) && on_gpu(s).is_none()
        };
        let host = if plan.iter().enumerate().any(|(s, p)| wanted(s, p)) {
            let memory = if let Ok(bytes) = source.downcast::<PyBytes>() {
                dlpack::Memory::copy(bytes.as_bytes())
            } else if let Ok(bytes) = source.downcast::<PyByteArray>() {
                dlpack::Memory::copy(&bytes.to_vec())
            } else {
                let path: std::path::PathBuf = source.extract()?;
                let read = if mmap && self.inner.is_mapped() {
                    if shared {
                        py.allow_threads(|| dlpack::Memory::map_shared(&path))
                    } else {
                        py.allow_threads(|| dlpack::Memory::map_private(&path))
                    }
                } else {
                    let path = path.clone();
                    interruptible(py, progress, move |work| dlpack::Memory::read(&path, work))?
                };
                read.map_err(|e| Error::new_err(format!("{}: {e}", path.display())))?
            };
            Some(dlpack::Region::Host(Arc::new(memory)))
        } else {
            None
        };
        for (s, slot) in plan.iter().enumerate() {
            let Some((dtype, users)) = slot else { continue };
            if users.is_empty() {
                continue;
            }
            let Some(storage) = storages.get(s) else {
                continue;
            };
            let (region, offset) = match (on_gpu(s), &host) {
                (Some(gpu), _) => (dlpack::Region::Cuda(gpu.clone()), 0),
                (None, Some(host)) => (host.clone(), storage.file_offset.unwrap_or(0)),
                (None, None) => continue,
            };
            let size = dtype.size() as u64;
            let Some(dl) = dlpack::dl_dtype(*dtype) else {
                continue;
            };
            let whole = |t: &TensorInfo| {
                t.storage_offset == 0
                    && dlpack::extent(&t.shape, &t.stride, size) == Some(storage.nbytes)
            };
            if let ([only], Some(t)) = (&users[..], users.first().and_then(|&u| tensors.get(u))) {
                if whole(t) {
                    // The common case: one tensor spanning its storage.
                    let c = dlpack::capsule(py, &region, offset, dl, size, &t.shape, &t.stride)?;
                    let tensor = finish(from_dlpack.call1((c,))?, t)?.unbind();
                    if let Some(m) = made.get_mut(*only) {
                        *m = tensor;
                    }
                    continue;
                }
            }
            // The storage as one flat tensor; each user a strided view.
            let numel = storage.nbytes / size;
            let c = dlpack::capsule(py, &region, offset, dl, size, &[numel], &[1])?;
            let flat = from_dlpack.call1((c,))?;
            for &u in users {
                let (Some(t), Some(m)) = (tensors.get(u), made.get_mut(u)) else {
                    continue;
                };
                let view = flat.call_method1(
                    "as_strided",
                    (t.shape.clone(), t.stride.clone(), t.storage_offset),
                )?;
                *m = finish(view, t)?.unbind();
            }
        }
        PyList::new(py, made)
    }

    /// Upload whole storages to GPUs through ptload-device's pipeline (the
    /// GIL released): `targets` is a list of (storage index, device
    /// ordinal), each storage once. The result holds each storage on its
    /// device, or why it stays on the host.
    /// `progress` is called with the bytes uploaded so far.
    #[pyo3(signature = (targets, progress=None))]
    fn upload(
        &self,
        py: Python<'_>,
        targets: Vec<(usize, u32)>,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Uploaded> {
        let inner = self.inner.clone();
        let count = inner.storages().len();
        let placed = interruptible(py, progress, move |work| {
            let counter = work.clone();
            let opts = ptload_device::LoadOptions {
                progress: Some(Arc::new(move |n| counter.add(n))),
                // Ctrl-C: no new copy is queued and the arenas are freed.
                cancel: Some(Arc::clone(&work.cancel)),
                ..Default::default()
            };
            ptload_device::upload_storages(&inner, &targets, gpus(), &opts)
                .map(|placed| (targets, placed))
        })?;
        let (targets, placed) = placed.map_err(|e| Error::new_err(e.render(&terms::Kwargs)))?;
        let mut storages: Vec<Option<Result<Arc<ptload_device::CudaStorage>, String>>> =
            (0..count).map(|_| None).collect();
        for ((index, _), p) in targets.into_iter().zip(placed) {
            if let Some(slot) = storages.get_mut(index) {
                *slot = Some(p.map(Arc::new).map_err(|why| terms::fallback(&why)));
            }
        }
        Ok(Uploaded { storages })
    }

    /// The unpickled object built here when it holds only plain values
    /// (None, bool, int, float, str, bytes, bytearray, tuple, list, dict,
    /// OrderedDict, set, frozenset) and tensors `made` holds; None when it
    /// holds anything else, or anything here fails (the caller's general
    /// builder takes over); else a 1-tuple of it. A dict's BUILD state goes to
    /// `set_state(obj, state, True)` once every container is filled.
    fn build_plain<'py>(
        &self,
        py: Python<'py>,
        made: &Bound<'py, PyList>,
        set_state: &Bound<'py, PyAny>,
    ) -> PyResult<PyObject> {
        let Some(objects) = self.inner.objects() else {
            return Ok(py.None());
        };
        match build_plain(py, objects, made, set_state) {
            Ok(Some(root)) => Ok(PyTuple::new(py, [root])?.into_any().unbind()),
            _ => Ok(py.None()),
        }
    }

    /// The flattened tensors (the CLI's names), as tensor tuples.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .inner
            .tensors()
            .map(|t| tensor_record_bound(py, t.info()))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// The state dict the CLI would take: ([(name, index into tensors())],
    /// decisions). `key`: "auto", "all" or a dotted path; `strip`: "auto",
    /// "none" or a prefix.
    #[pyo3(signature = (key="auto", strip="auto", include=Vec::new(), exclude=Vec::new()))]
    fn select(
        &self,
        key: &str,
        strip: &str,
        include: Vec<String>,
        exclude: Vec<String>,
    ) -> PyResult<Chosen> {
        let opts = state_dict_options(key, strip, include, exclude);
        let sd = opts.select(&self.inner).map_err(to_py)?;
        let names = sd
            .tensors()
            .map(|(name, view)| {
                let index = self.inner.position(view.name()).unwrap_or(usize::MAX);
                (name.to_owned(), index)
            })
            .collect();
        Ok((names, sd.decisions().iter().map(terms::decision).collect()))
    }

    /// Tensor `index`'s elements in row-major order, host byte order, with
    /// conj/neg bits applied: a copy. `objects` picks the object graph's
    /// tensors instead of the flattened ones.
    #[pyo3(signature = (index, objects=false))]
    fn tensor_bytes<'py>(
        &self,
        py: Python<'py>,
        index: usize,
        objects: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let inner = self.inner.clone();
        let view = if objects {
            inner.object_tensor(index)
        } else {
            inner.tensor_at(index)
        };
        match &view {
            None => return Err(Error::new_err(format!("no tensor {index}"))),
            Some(view) => expansion_allowed(view)?,
        }
        let bytes = py.allow_threads(move || -> Result<Vec<u8>, ptload_reader::Error> {
            let view = if objects {
                inner.object_tensor(index)
            } else {
                inner.tensor_at(index)
            };
            match view {
                Some(view) => Ok(view.data()?.into_owned()),
                None => Ok(Vec::new()),
            }
        });
        Ok(PyBytes::new(py, &bytes.map_err(to_py)?))
    }
}

/// A checkpoint opened from Python describes overlapping views of any size
/// (torch and numpy make them as strided views, reading nothing): the
/// default bound on an expanded view's size applies where one is copied out.
fn expansion_allowed(view: &TensorView<'_>) -> PyResult<()> {
    let limit = ptload_reader::Limits::default().max_expanded_view_bytes;
    let storage = view.storage().map_or(0, |s| s.nbytes);
    let nbytes = view.info().nbytes;
    if nbytes > storage && nbytes > limit {
        return Err(Error::new_err(format!(
            "tensor {}: limit: max_expanded_view_bytes ({limit}) exceeded: \
             an overlapping view of {nbytes} bytes over a {storage}-byte storage is not copied out",
            view.name()
        )));
    }
    Ok(())
}

/// [`Checkpoint::build_plain`]'s work: `Ok(None)` when a node is not plain.
/// Scalars first (their ids follow the containers'), then every other node
/// in id order (an immutable value's members come before it), mutable
/// containers made empty and filled at the end; never recursive.
fn build_plain<'py>(
    py: Python<'py>,
    objects: &ptload_reader::object::Objects,
    made: &Bound<'py, PyList>,
    set_state: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    use pyo3::types::{PyByteArray, PyDict, PyFrozenSet, PySet};
    let nodes = objects.nodes();
    let mut objs: Vec<Option<Bound<'py, PyAny>>> = vec![None; nodes.len()];
    for (slot, node) in objs.iter_mut().zip(nodes) {
        *slot = Some(match node {
            Node::None => py.None().into_bound(py),
            Node::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
            Node::Int(v) => v.into_pyobject(py)?.into_any(),
            Node::Float(v) => v.into_pyobject(py)?.into_any(),
            Node::Str(v) => v.as_str().into_pyobject(py)?.into_any(),
            Node::Bytes(v) => PyBytes::new(py, v).into_any(),
            Node::ByteArray(v) => PyByteArray::new(py, v).into_any(),
            Node::BigInt(le) => {
                let signed = PyDict::new(py);
                signed.set_item("signed", true)?;
                py.get_type::<pyo3::types::PyInt>().call_method(
                    "from_bytes",
                    (PyBytes::new(py, le), "little"),
                    Some(&signed),
                )?
            }
            _ => continue,
        });
    }
    let ordered_dict = py.import("collections")?.getattr("OrderedDict")?;
    let member = |objs: &[Option<Bound<'py, PyAny>>], c: usize| objs.get(c).cloned().flatten();
    for (i, node) in nodes.iter().enumerate() {
        if objs.get(i).is_none_or(Option::is_some) {
            continue;
        }
        let made_here = match node {
            Node::Tuple(items) | Node::FrozenSet(items) => {
                let Some(members) = items
                    .iter()
                    .map(|&c| member(&objs, c))
                    .collect::<Option<Vec<_>>>()
                else {
                    return Ok(None);
                };
                if matches!(node, Node::Tuple(_)) {
                    PyTuple::new(py, members)?.into_any()
                } else {
                    PyFrozenSet::new(py, &members)?.into_any()
                }
            }
            Node::List(_) => PyList::empty(py).into_any(),
            Node::Set(_) => PySet::empty(py)?.into_any(),
            Node::Dict { ordered: true, .. } => ordered_dict.call0()?,
            Node::Dict { ordered: false, .. } => PyDict::new(py).into_any(),
            Node::Tensor {
                tensor,
                qparams: None,
                attrs: None,
            } => match made.get_item(*tensor) {
                Ok(t) if !t.is_none() => t,
                _ => return Ok(None),
            },
            _ => return Ok(None),
        };
        if let Some(slot) = objs.get_mut(i) {
            *slot = Some(made_here);
        }
    }
    let mut states = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let Some(Some(obj)) = objs.get(i) else {
            return Ok(None);
        };
        match node {
            Node::List(items) | Node::Set(items) => {
                for &c in items {
                    let Some(m) = member(&objs, c) else {
                        return Ok(None);
                    };
                    if let Ok(list) = obj.downcast::<PyList>() {
                        list.append(m)?;
                    } else {
                        obj.downcast::<PySet>()?.add(m)?;
                    }
                }
            }
            Node::Dict { items, state, .. } => {
                for &(k, v) in items {
                    let (Some(k), Some(v)) = (member(&objs, k), member(&objs, v)) else {
                        return Ok(None);
                    };
                    obj.set_item(k, v)?;
                }
                if let Some(state) = state {
                    states.push((obj.clone(), *state));
                }
            }
            _ => {}
        }
    }
    for (obj, state) in states {
        let Some(state) = member(&objs, state) else {
            return Ok(None);
        };
        set_state.call1((obj, state, true))?;
    }
    Ok(member(&objs, objects.root()))
}

/// A tensor's saved bits applied as torch applies them: conj, neg, then
/// `requires_grad`.
fn finish<'py>(mut t: Bound<'py, PyAny>, info: &TensorInfo) -> PyResult<Bound<'py, PyAny>> {
    if info.conj {
        t = t.call_method0("conj")?;
    }
    if info.neg {
        t = t.call_method0("_neg_view")?;
    }
    if info.requires_grad {
        t.call_method1("requires_grad_", (true,))?;
    }
    Ok(t)
}

/// A state dict taken from a checkpoint, a directory of shards or an index
/// file, whole or as one tensor-parallel rank's slices: what `ptload
/// convert` would write, read tensor by tensor.
#[pyclass(frozen, module = "ptload._ptload")]
struct Selection {
    set: Arc<CheckpointSet>,
    entries: Vec<Selected>,
    decisions: Vec<(&'static str, String)>,
}

impl Selection {
    fn view(&self, index: usize) -> PyResult<TensorView<'_>> {
        self.entries
            .get(index)
            .and_then(|e| e.view(self.set.files().get(e.file)?.checkpoint()))
            .ok_or_else(|| Error::new_err(format!("no tensor {index}")))
    }
}

#[pymethods]
impl Selection {
    /// What the selection decided: (kind, text) each.
    fn decisions(&self) -> Vec<(&'static str, String)> {
        self.decisions.clone()
    }

    /// The files of the set, in order.
    fn files(&self) -> Vec<String> {
        self.set
            .files()
            .iter()
            .map(|f| f.path().display().to_string())
            .collect()
    }

    /// The tensors, as tensor tuples named as in the state dict (a rank's
    /// slice has the slice's shape), each with the file it is in.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = (self.entries.iter().enumerate())
            .map(|(i, entry)| {
                let view = self.view(i)?;
                let mut info = view.info().clone();
                info.name.clone_from(&entry.name);
                tensor_record_bound(py, &info)
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// Put every tensor of the selection on `cuda:ordinal` through
    /// ptload-device's pipeline (the GIL released), file by file: whole
    /// storages, and a rank's slices gathered from the map straight into
    /// the staging buffers. `progress` is called with the bytes placed so
    /// far. A tensor that cannot go (the device lacks memory, a quantized
    /// tensor, which torch cannot make from device bytes) says why; the
    /// caller moves it itself.
    #[pyo3(signature = (ordinal, progress=None))]
    fn upload(
        &self,
        py: Python<'_>,
        ordinal: u32,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PlacedTensors> {
        let set = Arc::clone(&self.set);
        let entries = self.entries.clone();
        let placed = interruptible(py, progress, move |work| {
            let counter = work.clone();
            let opts = ptload_device::LoadOptions {
                progress: Some(Arc::new(move |n| counter.add(n))),
                cancel: Some(Arc::clone(&work.cancel)),
                // The staging pinned by the process's first load serves
                // every later one (`ptload.release_staging()` unpins it).
                ..Default::default()
            };
            place_selection(&set, &entries, ordinal, &opts)
        })?;
        let tensors = placed.map_err(|e| Error::new_err(e.render(&terms::Kwargs)))?;
        Ok(PlacedTensors { tensors })
    }

    /// Tensor `index`'s elements (only its slice's, for a rank) in
    /// row-major order, host byte order, conj/neg bits applied: a copy
    /// that reads only those bytes.
    fn tensor_bytes<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Bound<'py, PyBytes>> {
        expansion_allowed(&self.view(index)?)?;
        let bytes = py.allow_threads(|| -> Result<Vec<u8>, ptload_reader::Error> {
            match self.view(index) {
                Ok(view) => Ok(view.data()?.into_owned()),
                Err(_) => Ok(Vec::new()),
            }
        });
        Ok(PyBytes::new(py, &bytes.map_err(to_py)?))
    }
}

/// A selection's tensors after [`Selection::upload`]: each on its GPU,
/// as ptload-device placed it, or why it is not.
#[pyclass(frozen, module = "ptload._ptload")]
struct PlacedTensors {
    /// Per entry of the selection: its storage on the GPU and the view of
    /// it, or why it is not there.
    tensors: Vec<Result<(Arc<ptload_device::CudaStorage>, TensorInfo), String>>,
}

#[pymethods]
impl PlacedTensors {
    /// A DLPack capsule of tensor `index` on its GPU (its dtype, shape and
    /// strides), or None when it is not on one or DLPack has no code for
    /// its dtype (see [`raw`](Self::raw)).
    fn capsule<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(Ok((storage, info))) = self.tensors.get(index) else {
            return Ok(None);
        };
        let Some(dl) = dlpack::dl_dtype(info.dtype) else {
            return Ok(None);
        };
        let size = info.dtype.size() as u64;
        let offset = info.storage_offset.saturating_mul(size);
        let region = dlpack::Region::Cuda(Arc::clone(storage));
        dlpack::capsule(py, &region, offset, dl, size, &info.shape, &info.stride).map(Some)
    }

    /// Tensor `index` on its GPU as bytes: (a uint8 capsule of the bytes
    /// its view spans, its shape, its strides from the first of them), for
    /// a dtype DLPack has no code for (float8, complex32, unsigned 16 to
    /// 64 bits), which the caller views as its own; None when it is not
    /// on a GPU.
    #[allow(clippy::type_complexity)]
    fn raw<'py>(
        &self,
        py: Python<'py>,
        index: usize,
    ) -> PyResult<Option<(Bound<'py, PyAny>, Vec<u64>, Vec<u64>)>> {
        let Some(Ok((storage, info))) = self.tensors.get(index) else {
            return Ok(None);
        };
        let size = info.dtype.size() as u64;
        let span = dlpack::extent(&info.shape, &info.stride, size)
            .ok_or_else(|| Error::new_err(format!("{}: its extent overflows", info.name)))?;
        let offset = info.storage_offset.saturating_mul(size);
        let region = dlpack::Region::Cuda(Arc::clone(storage));
        let u8 = dlpack::dl_dtype(DType::U8)
            .ok_or_else(|| Error::new_err("DLPack has no code for uint8"))?;
        let c = dlpack::capsule(py, &region, offset, u8, 1, &[span], &[1])?;
        Ok(Some((c, info.shape.clone(), info.stride.clone())))
    }

    /// (index, why) for each tensor that is not on a GPU.
    fn fallbacks(&self) -> Vec<(usize, String)> {
        self.tensors
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((i, t.as_ref().err()?.clone())))
            .collect()
    }
}

/// Select a state dict from `path` (a checkpoint, a directory of shards, an
/// index file, or one checkpoint's URL) with `ptload convert`'s options;
/// `shard=(rank, world)` with `splits` (`GLOB=DIM` rules) and/or a split
/// `preset` gives that rank's slices, every unmatched tensor whole.
#[pyfunction]
#[pyo3(signature = (path, *, key="auto", strip="auto", include=Vec::new(), exclude=Vec::new(), shard=None, splits=Vec::new(), preset=None, rank_files=None))]
#[allow(clippy::too_many_arguments)]
fn select(
    py: Python<'_>,
    path: std::path::PathBuf,
    key: &str,
    strip: &str,
    include: Vec<String>,
    exclude: Vec<String>,
    shard: Option<(u32, u32)>,
    splits: Vec<String>,
    preset: Option<String>,
    rank_files: Option<String>,
) -> PyResult<Selection> {
    let parallel = match shard {
        None if splits.is_empty() && preset.is_none() => None,
        None => {
            return Err(Error::new_err(
                "split rules without shard=(rank, world): say which rank to read",
            ))
        }
        Some((rank, world)) => {
            let rules = Splits::with_preset(&splits, preset.as_deref()).map_err(to_py)?;
            Some((Shard::new(rank, world).map_err(to_py)?, rules))
        }
    };
    let opts = StateDictOptions {
        parallel,
        ..state_dict_options(key, strip, include, exclude)
    };
    let rank_rules = rank_files
        .as_deref()
        .map(ptload_reader::dcp::fsdp::rank_rules)
        .transpose()
        .map_err(to_py)?;
    let input = ptload_reader::set::Input::new(&path);
    let set = py
        .allow_threads(|| match &rank_rules {
            // The rank files of a sharded model, cut as the caller says.
            Some(rules) => input.open_rank_parts(rules, &OpenOptions::new()),
            // A file, a directory, or a set's index (read by ranges when a
            // URL: the storages a selection reads are fetched when it
            // reads them).
            None => input.open(&OpenOptions::new()),
        })
        .map_err(to_py)?;
    let sd = opts.select_set(&set).map_err(to_py)?;
    let entries: Vec<Selected> = sd.iter().cloned().collect();
    let decisions = sd.decisions().iter().map(terms::decision).collect();
    drop(sd);
    Ok(Selection {
        set: Arc::new(set),
        entries,
        decisions,
    })
}

/// Every entry of a selection of `set` loaded onto `cuda:ordinal`, file
/// by file: each on its GPU with its placed view, or why it is not.
#[allow(clippy::type_complexity)]
fn place_selection(
    set: &CheckpointSet,
    entries: &[Selected],
    ordinal: u32,
    opts: &ptload_device::LoadOptions,
) -> Result<
    Vec<Result<(Arc<ptload_device::CudaStorage>, TensorInfo), String>>,
    ptload_device::LoadError,
> {
    let mut out: Vec<Result<_, String>> = entries
        .iter()
        .map(|_| Err("not loaded".to_owned()))
        .collect();
    for (f, file) in set.files().iter().enumerate() {
        let positions: Vec<usize> = (entries.iter().enumerate())
            .filter(|(_, e)| e.file == f)
            .map(|(i, _)| i)
            .collect();
        if positions.is_empty() {
            continue;
        }
        let ckpt = file.checkpoint();
        // A quantized tensor stays for the caller to move: torch makes
        // none from device bytes, so an upload of it would be wasted.
        let positions: Vec<usize> = positions
            .into_iter()
            .filter(|&i| {
                let quantized = entries
                    .get(i)
                    .and_then(|e| e.view(ckpt))
                    .is_some_and(|v| v.info().quantization.is_some());
                if let (true, Some(o)) = (quantized, out.get_mut(i)) {
                    *o = Err("quantized: torch makes none from device memory".to_owned());
                }
                !quantized
            })
            .collect();
        let mine: Vec<Selected> = positions
            .iter()
            .filter_map(|&i| entries.get(i))
            .map(|e| {
                let mut e = e.clone();
                e.file = 0;
                e
            })
            .collect();
        let mut to = To(Device::Cuda(ordinal));
        let plan = DeviceMap::new(ckpt, &mut to)?;
        let loaded = ptload_device::load(Arc::clone(ckpt), &mine, &plan, gpus(), opts)?;
        for (t, &i) in loaded.tensors().iter().zip(&positions) {
            let Some(o) = out.get_mut(i) else { continue };
            *o = match loaded.storage_of(t) {
                Some(ptload_device::Placed::Cuda(c)) => Ok((Arc::new(c.clone()), t.info.clone())),
                _ => Err(t
                    .fallback
                    .as_ref()
                    .map_or_else(|| format!("stays on {}", t.device), terms::fallback)),
            };
        }
    }
    Ok(out)
}

fn state_dict_options(
    key: &str,
    strip: &str,
    include: Vec<String>,
    exclude: Vec<String>,
) -> StateDictOptions {
    let Ok(key): Result<KeySelect, _> = key.parse();
    let Ok(strip): Result<Strip, _> = strip.parse();
    StateDictOptions {
        key,
        strip,
        include,
        exclude,
        ..Default::default()
    }
}

/// The machine's GPUs as ptload-device sees them, probed once (the
/// driver is loaded on first use).
fn gpus() -> &'static ptload_device::Gpus {
    static GPUS: std::sync::OnceLock<ptload_device::Gpus> = std::sync::OnceLock::new();
    GPUS.get_or_init(ptload_device::probe)
}

/// CUDA devices the driver reports (0 without a driver), as ptload-device
/// sees them.
#[pyfunction]
fn cuda_device_count(py: Python<'_>) -> usize {
    py.allow_threads(|| gpus().devices().len())
}

/// Storages uploaded by [`Checkpoint::upload`]: each on its GPU, or why
/// it stays on the host.
#[pyclass(frozen, module = "ptload._ptload")]
struct Uploaded {
    storages: Vec<Option<Result<Arc<ptload_device::CudaStorage>, String>>>,
}

#[pymethods]
impl Uploaded {
    /// (storage index, why it stays on the host) for each target that was
    /// not uploaded.
    fn fallbacks(&self) -> Vec<(usize, String)> {
        self.storages
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i, s.as_ref()?.as_ref().err()?.clone())))
            .collect()
    }

    /// Whether storage `index` is on a GPU.
    fn on_device(&self, index: usize) -> bool {
        matches!(self.storages.get(index), Some(Some(Ok(_))))
    }

    /// A DLPack capsule of storage `index`'s bytes on its GPU (uint8, 1-D).
    fn capsule<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Bound<'py, PyAny>> {
        let Some(Some(Ok(gpu))) = self.storages.get(index) else {
            return Err(Error::new_err(format!("storage {index} is not on a GPU")));
        };
        let region = dlpack::Region::Cuda(gpu.clone());
        let n = gpu.len() as u64;
        let u8 = dlpack::dl_dtype(DType::U8)
            .ok_or_else(|| Error::new_err("DLPack has no code for uint8"))?;
        dlpack::capsule(py, &region, 0, u8, 1, &[n], &[1])
    }
}

/// What a DLPack capsule ptload made views (for tests): ((device type,
/// id), (dtype code, bits, lanes), shape, strides, the bytes its view
/// spans, read back from the GPU for device memory).
#[pyfunction]
#[allow(clippy::type_complexity)]
fn describe_capsule<'py>(
    py: Python<'py>,
    capsule: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let (device, dtype, shape, strides, bytes) = dlpack::describe(capsule)?;
    (device, dtype, shape, strides, PyBytes::new(py, &bytes)).into_pyobject(py)
}

/// Whether torch refuses globals of `module` whatever is allowed.
#[pyfunction]
fn module_blocked(module: &str) -> bool {
    ptload_reader::Policy::always_blocks(module)
}

/// Rule lists (`PATTERN=DEVICE[,PATTERN=DEVICE...]`) as the CLI's
/// `--place` parses them: `(pattern, device)` pairs, devices normalised
/// (`cuda` is `cuda:0`). A bad rule is a ValueError naming it.
#[pyfunction]
fn parse_place(lists: Vec<String>) -> PyResult<Vec<(String, String)>> {
    let rules = ptload_reader::placement::ByName::parse(&lists)
        .map_err(|e| PyValueError::new_err(e.message().to_owned()))?;
    Ok(rules
        .0
        .into_iter()
        .map(|(pattern, device)| (pattern, device.to_string()))
        .collect())
}

/// A device as the placements take it (`cpu`, `cuda`, `cuda:N`, `meta`,
/// any case), normalised; anything else is a ValueError.
#[pyfunction]
fn parse_device(text: &str) -> PyResult<String> {
    text.parse::<Device>()
        .map(|d| d.to_string())
        .map_err(|e| PyValueError::new_err(e.message().to_owned()))
}

/// A budget as the CLI's `--budget` parses it (`0.9`, `90%`, `20GiB`,
/// `512MB`, a byte count; a bare number from 2 to 999,999 is refused as a
/// likely mistake): `("share", fraction, 0)` or `("bytes", 0.0, bytes)`.
#[pyfunction]
fn parse_budget(text: &str) -> PyResult<(&'static str, f64, u64)> {
    use ptload_reader::placement::BudgetSpec;
    match text.parse::<BudgetSpec>() {
        Ok(BudgetSpec::Share(f)) => Ok(("share", f, 0)),
        Ok(BudgetSpec::Bytes(b)) => Ok(("bytes", 0.0, b)),
        Err(e) => Err(PyValueError::new_err(e.message().to_owned())),
    }
}

/// Whether `path` is a URL ptload reads by ranges rather than a local path
/// (the reader's [`Input`](ptload_reader::set::Input) decides, as for
/// every entry point).
#[pyfunction]
fn is_url(path: &str) -> bool {
    ptload_reader::set::Input::new(path).url().is_some()
}

/// Open a checkpoint: `source` is a path (str), a URL (`http(s)://`,
/// `s3://`, `gs://`, `az://`) read by ranged requests, or the file's bytes.
#[pyfunction]
#[pyo3(signature = (source, *, objects=true, in_memory=false, encoding=None, byte_order=None, refuse_at=None))]
fn open(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    objects: bool,
    in_memory: bool,
    encoding: Option<&str>,
    byte_order: Option<&str>,
    refuse_at: Option<&str>,
) -> PyResult<Checkpoint> {
    // The scanner's level at which the file is refused (`ptload scan`'s
    // names), as the CLI's --refuse-at.
    let refuse_at = refuse_at
        .map(|name| {
            ptload_reader::scan::Level::from_name(name).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "refuse_at {name:?}: 'needs-code', 'unknown-call', 'ambiguous' or 'dangerous'"
                ))
            })
        })
        .transpose()?;
    // Python 2 strings, decoded as torch.load's `encoding` says.
    let encoding = match encoding {
        None => ptload_reader::checkpoint::StringEncoding::Utf8,
        Some(name) => name
            .parse()
            .map_err(|e: ptload_reader::Error| PyValueError::new_err(e.message().to_owned()))?,
    };
    // A zip file without a byteorder record: torch's default load
    // endianness says how to read it.
    let assumed = match byte_order {
        None | Some("little") => ByteOrder::Little,
        Some("big") => ByteOrder::Big,
        Some(other) => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "byte_order {other:?}: 'little' or 'big'"
            )))
        }
    };
    // Overlapping views are handed to torch and numpy as strided views of
    // their storage, reading nothing: bounded only where one is copied out
    // (`expansion_allowed`), so one broadcast tensor does not refuse a file.
    let mut limits = ptload_reader::Limits::default();
    limits.max_expanded_view_bytes = u64::MAX;
    let opts = OpenOptions::new()
        .objects(objects)
        .refuse_at(refuse_at)
        .in_memory(in_memory)
        .encoding(encoding)
        .assume_byte_order(assumed)
        .limits(limits);
    // On a thread of its own, so Ctrl-C interrupts a long open (the
    // pickle machine stops at the flag).
    let given = if let Ok(bytes) = source.downcast::<PyBytes>() {
        Some(bytes.as_bytes().to_vec())
    } else if let Ok(bytes) = source.downcast::<PyByteArray>() {
        Some(bytes.to_vec())
    } else {
        None
    };
    let ckpt = if let Some(data) = given {
        interruptible(py, None, move |work| {
            opts.cancel(work.cancel.clone()).open_bytes(data)
        })?
    } else {
        let path: std::path::PathBuf = source.extract()?;
        match ptload_reader::set::Input::new(&path) {
            ptload_reader::set::Input::Url(url) => interruptible(py, None, move |work| {
                opts.cancel(work.cancel.clone()).open_url(&url)
            })?,
            ptload_reader::set::Input::Path(path) => interruptible(py, None, move |work| {
                opts.cancel(work.cancel.clone()).open(path)
            })?,
        }
    };
    Ok(Checkpoint {
        inner: Arc::new(ckpt.map_err(to_py)?),
    })
}

/// Whether the caller's `allow_globals` entries (names or globs) admit
/// `module.name`: the reader's one rule, as the CLI's `--allow-global`.
#[pyfunction]
fn global_allowed(allowed: Vec<String>, module: &str, name: &str) -> bool {
    ptload_reader::Policy::allowlist_admits(&allowed, module, name)
}

/// Unpin the page-locked staging that loads onto GPUs keep for the
/// next load of the process; returns the bytes freed.
#[pyfunction]
fn release_staging() -> usize {
    ptload_device::release_staging()
}

#[pymodule]
fn _ptload(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<Error>())?;
    m.add(
        "MAX_EXPANDED_VIEW_BYTES",
        ptload_reader::Limits::default().max_expanded_view_bytes,
    )?;
    m.add_class::<Checkpoint>()?;
    m.add_class::<TensorRecord>()?;
    m.add_class::<QuantRecord>()?;
    m.add_class::<StorageRecord>()?;
    m.add_class::<Selection>()?;
    m.add_class::<Uploaded>()?;
    m.add_class::<PlacedTensors>()?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(release_staging, m)?)?;
    m.add_function(wrap_pyfunction!(terms::fallback_text, m)?)?;
    m.add_function(wrap_pyfunction!(global_allowed, m)?)?;
    m.add_function(wrap_pyfunction!(describe_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(is_url, m)?)?;
    m.add_function(wrap_pyfunction!(parse_place, m)?)?;
    m.add_function(wrap_pyfunction!(parse_device, m)?)?;
    m.add_function(wrap_pyfunction!(parse_budget, m)?)?;
    m.add_function(wrap_pyfunction!(module_blocked, m)?)?;
    m.add_function(wrap_pyfunction!(select, m)?)?;
    Ok(())
}
