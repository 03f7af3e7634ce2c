//! An open checkpoint: its layout, object graph, tensors and storages,
//! their bytes, and uploads of its storages onto GPUs.

use std::sync::Arc;

use ptload_reader::checkpoint::ByteOrder;
use ptload_reader::object::Node;
use ptload_reader::placement::{Device, DeviceMap};
use ptload_reader::{DType, TensorInfo, TensorView};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyTuple};

use crate::dlpack;
use crate::errors::{to_py, Error};
use crate::records::{node_tuple, tensor_record_bound, GlobalRecord, StorageRecord, WarningRecord};
use crate::selection::state_dict_options;
use crate::terms;
use crate::upload::{gpus, Uploaded};
use crate::work::{interruptible, ReadAhead};

/// A selected state dict: (name, index into the flattened tensors) pairs,
/// and what the automatic options decided.
pub(crate) type Chosen = (Vec<(String, usize)>, Vec<(&'static str, String)>);

/// An open checkpoint.
#[pyclass(frozen, module = "ptload._ptload")]
pub(crate) struct Checkpoint {
    pub(crate) inner: Arc<ptload_reader::Checkpoint>,
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

    /// Every global the pickles name, once each, where it first appears.
    fn globals(&self) -> Vec<GlobalRecord> {
        self.inner.globals().iter().map(GlobalRecord::of).collect()
    }

    /// For a file read by ranges (a URL, a bucket object): fetch the whole
    /// storages listed, in that order, ahead of reads of them one at a
    /// time, several requests in flight; nothing for a mapped file.
    fn read_ahead(&self, storages: Vec<usize>) -> ReadAhead {
        ReadAhead::of(ptload_reader::checkpoint::ReadAhead::start(vec![(
            Arc::clone(&self.inner),
            storages,
        )]))
    }

    /// What the reader noticed and did not treat as an error.
    fn warnings(&self) -> Vec<WarningRecord> {
        self.inner
            .warnings()
            .iter()
            .map(WarningRecord::of)
            .collect()
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
            // Ctrl-C: no new copy is queued and the arenas are freed.
            let opts = work.load_options();
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
pub(crate) fn expansion_allowed(view: &TensorView<'_>) -> PyResult<()> {
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
pub(crate) fn build_plain<'py>(
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
pub(crate) fn finish<'py>(
    mut t: Bound<'py, PyAny>,
    info: &TensorInfo,
) -> PyResult<Bound<'py, PyAny>> {
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
