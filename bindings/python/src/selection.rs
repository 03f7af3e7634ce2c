//! A state dict selected from a checkpoint, a set of shards or a rank's
//! slices, read tensor by tensor or placed onto a GPU.

use std::sync::Arc;

use ptload_reader::placement::{Device, DeviceMap, To};
use ptload_reader::set::CheckpointSet;
use ptload_reader::state_dict::{KeySelect, Selected, StateDictOptions, Strip};
use ptload_reader::tp::{Shard, Splits};
use ptload_reader::{DType, OpenOptions, TensorInfo, TensorView};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::checkpoint::expansion_allowed;
use crate::dlpack;
use crate::errors::{to_py, Error};
use crate::records::tensor_record_bound;
use crate::terms;
use crate::upload::gpus;
use crate::work::{interruptible, ReadAhead};

/// A state dict taken from a checkpoint, a directory of shards or an index
/// file, whole or as one tensor-parallel rank's slices: what `ptload
/// convert` would write, read tensor by tensor.
#[pyclass(frozen, module = "ptload._ptload")]
pub(crate) struct Selection {
    pub(crate) set: Arc<CheckpointSet>,
    pub(crate) entries: Vec<Selected>,
    pub(crate) decisions: Vec<(&'static str, String)>,
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
            // The staging pinned by the process's first load serves every
            // later one (`ptload.release_staging()` unpins it).
            let opts = work.load_options();
            place_selection(&set, &entries, ordinal, &opts)
        })?;
        let tensors = placed.map_err(|e| Error::new_err(e.render(&terms::Kwargs)))?;
        Ok(PlacedTensors { tensors })
    }

    /// For files read by ranges (URLs, bucket objects): fetch the whole
    /// storages of the selection's tensors, in order, ahead of reads of
    /// them one at a time, several requests in flight (a rank's slices
    /// are read on their own); nothing for mapped files.
    fn read_ahead(&self) -> ReadAhead {
        let files: Vec<&ptload_reader::Checkpoint> = self
            .set
            .files()
            .iter()
            .map(|f| f.checkpoint().as_ref())
            .collect();
        let lists = ptload_reader::state_dict::storages_ahead(&self.entries, &files);
        let ahead = self
            .set
            .files()
            .iter()
            .zip(lists)
            .map(|(f, storages)| (Arc::clone(f.checkpoint()), storages))
            .collect();
        ReadAhead::of(ptload_reader::checkpoint::ReadAhead::start(ahead))
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
pub(crate) struct PlacedTensors {
    /// Per entry of the selection: its storage on the GPU and the view of
    /// it, or why it is not there.
    pub(crate) tensors: Vec<Result<(Arc<ptload_device::CudaStorage>, TensorInfo), String>>,
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
pub(crate) fn select(
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
pub(crate) fn place_selection(
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

pub(crate) fn state_dict_options(
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
