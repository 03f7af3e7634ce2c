//! The machine's GPUs as ptload-device sees them, and storages uploaded
//! onto them, handed to Python as DLPack capsules.

use std::sync::Arc;

use ptload_reader::DType;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::dlpack;
use crate::errors::Error;

/// The machine's GPUs as ptload-device sees them, probed once (the
/// driver is loaded on first use).
pub(crate) fn gpus() -> &'static ptload_device::Gpus {
    static GPUS: std::sync::OnceLock<ptload_device::Gpus> = std::sync::OnceLock::new();
    GPUS.get_or_init(ptload_device::probe)
}

/// CUDA devices the driver reports (0 without a driver), as ptload-device
/// sees them.
#[pyfunction]
pub(crate) fn cuda_device_count(py: Python<'_>) -> usize {
    py.allow_threads(|| gpus().devices().len())
}

/// Storages uploaded by [`Checkpoint::upload`]: each on its GPU, or why
/// it stays on the host.
#[pyclass(frozen, module = "ptload._ptload")]
pub(crate) struct Uploaded {
    pub(crate) storages: Vec<Option<Result<Arc<ptload_device::CudaStorage>, String>>>,
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
pub(crate) fn describe_capsule<'py>(
    py: Python<'py>,
    capsule: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let (device, dtype, shape, strides, bytes) = dlpack::describe(capsule)?;
    (device, dtype, shape, strides, PyBytes::new(py, &bytes)).into_pyobject(py)
}
