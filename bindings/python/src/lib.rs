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

mod checkpoint;
mod dlpack;
mod errors;
mod records;
mod selection;
mod terms;
mod upload;
mod work;

// The reader makes and frees many small values per tensor; mimalloc halves
// the time glibc's allocator takes over them (benches/python_load.py).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;

use ptload_reader::checkpoint::ByteOrder;
use ptload_reader::placement::Device;
use ptload_reader::OpenOptions;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use checkpoint::Checkpoint;
use errors::{to_py, Error};
use records::{GlobalRecord, QuantRecord, StorageRecord, TensorRecord, WarningRecord};
use selection::{select, PlacedTensors, Selection};
use upload::{cuda_device_count, describe_capsule, Uploaded};
use work::interruptible;
pub use work::Work;

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
    // Every kind of reader error, by name: the package maps each to an
    // exception class, and its tests check that none is missing.
    m.add(
        "ERROR_KINDS",
        ptload_reader::ErrorKind::ALL.map(ptload_reader::ErrorKind::name),
    )?;
    m.add_class::<Checkpoint>()?;
    m.add_class::<TensorRecord>()?;
    m.add_class::<QuantRecord>()?;
    m.add_class::<StorageRecord>()?;
    m.add_class::<GlobalRecord>()?;
    m.add_class::<WarningRecord>()?;
    m.add_class::<work::ReadAhead>()?;
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
