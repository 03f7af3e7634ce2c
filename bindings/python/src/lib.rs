//! `ptload._ptload`: the Rust half of the Python package. It opens a
//! checkpoint with ptload-reader (the GIL released) and hands Python flat
//! descriptions: the unpickled object's nodes, its tensors and storages.
//! The package's Python half (`python/ptload`) builds torch or numpy
//! objects from them; nothing here imports torch or runs the file.
#![deny(unsafe_code)]

use std::sync::Arc;

use ptload_reader::object::Node;
use ptload_reader::state_dict::{KeySelect, StateDictOptions, Strip};
use ptload_reader::{ByteOrder, OpenOptions, Quantization, TensorInfo};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use pyo3::BoundObject;

create_exception!(
    _ptload,
    Error,
    PyException,
    "Base of every error ptload raises: the reader's message, with `kind`, `offset`, `record` and `tensor` attributes."
);

fn to_py(err: ptload_reader::Error) -> PyErr {
    let e = Error::new_err(err.to_string());
    Python::with_gil(|py| {
        let v = e.value(py);
        let kind = format!("{:?}", err.kind());
        let _ = v.setattr("kind", kind);
        let _ = v.setattr("offset", err.offset());
        let _ = v.setattr("record", err.record());
        let _ = v.setattr("tensor", err.tensor());
    });
    e
}

/// A selected state dict: (name, index into the flattened tensors) pairs,
/// and what the automatic options decided.
type Selection = (Vec<(String, usize)>, Vec<String>);

/// An open checkpoint.
#[pyclass(frozen, module = "ptload._ptload")]
struct Checkpoint {
    inner: Arc<ptload_reader::Checkpoint>,
}

fn tensor_tuple<'py>(py: Python<'py>, t: &TensorInfo) -> PyResult<Bound<'py, PyTuple>> {
    let quant: PyObject = match &t.quantization {
        None => py.None(),
        Some(Quantization::PerTensor {
            kind,
            scheme,
            scale,
            zero_point,
            values_shape,
        }) => (
            "tensor",
            *kind,
            scheme.as_str(),
            *scale,
            *zero_point,
            values_shape.clone(),
        )
            .into_pyobject(py)?
            .into_any()
            .unbind(),
        Some(Quantization::PerChannel {
            kind,
            scheme,
            axis,
            values_shape,
        }) => (
            "channel",
            *kind,
            scheme.as_str(),
            *axis,
            values_shape.clone(),
        )
            .into_pyobject(py)?
            .into_any()
            .unbind(),
        Some(_) => py.None(),
    };
    PyTuple::new(
        py,
        [
            t.name.as_str().into_pyobject(py)?.into_any(),
            t.dtype.name().into_pyobject(py)?.into_any(),
            PyTuple::new(py, &t.shape)?.into_any(),
            PyTuple::new(py, &t.stride)?.into_any(),
            t.storage_offset.into_pyobject(py)?.into_any(),
            t.storage.into_pyobject(py)?.into_any(),
            t.requires_grad.into_pyobject(py)?.to_owned().into_any(),
            t.conj.into_pyobject(py)?.to_owned().into_any(),
            t.neg.into_pyobject(py)?.to_owned().into_any(),
            quant.into_bound(py),
        ],
    )
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
        Node::Tensor { tensor, qparams } => t(py, ("tensor", *tensor, *qparams)),
        Node::Storage(i) => t(py, ("storage", *i)),
        Node::Parameter {
            data,
            requires_grad,
        } => t(py, ("parameter", *data, *requires_grad)),
        Node::Sparse { layout, data } => t(py, ("sparse", *layout, *data)),
        Node::Device(d) => t(py, ("device", d.as_str())),
        Node::Dtype { name, .. } => t(py, ("dtype", name.as_str())),
        Node::Layout(l) => t(py, ("layout", *l)),
        Node::Global { module, name } => t(py, ("global", module.as_str(), name.as_str())),
        Node::NumpyDtype { descr, big_endian } => t(py, ("npdtype", descr.as_str(), *big_endian)),
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
    /// The layout: `zip`, `legacy`, `torchscript`.
    fn format(&self) -> String {
        format!("{:?}", self.inner.format()).to_lowercase()
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

    /// Storages: (key, location, dtype, numel, nbytes, file_offset or None).
    fn storages<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .inner
            .storages()
            .iter()
            .map(|s| {
                (
                    s.key.as_str(),
                    s.location.as_str(),
                    s.dtype.name(),
                    s.numel,
                    s.nbytes,
                    s.file_offset,
                )
                    .into_pyobject(py)
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// A copy of storage `index`'s bytes, each `swap_unit`-byte element
    /// reversed when the file is big-endian.
    fn storage_bytes<'py>(
        &self,
        py: Python<'py>,
        index: usize,
        swap_unit: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let inner = self.inner.clone();
        let bytes = py.allow_threads(move || -> Result<Vec<u8>, ptload_reader::Error> {
            let mut bytes = inner.storage_bytes(index)?.to_vec();
            if inner.byte_order() == ByteOrder::Big && swap_unit > 1 {
                bytes.chunks_exact_mut(swap_unit).for_each(<[u8]>::reverse);
            }
            Ok(bytes)
        });
        Ok(PyBytes::new(py, &bytes.map_err(to_py)?))
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
            .map(|t| tensor_tuple(py, t))
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

    /// The flattened tensors (the CLI's names), as tensor tuples.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .inner
            .tensors()
            .map(|t| tensor_tuple(py, t.info()))
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
    ) -> PyResult<Selection> {
        let opts = StateDictOptions {
            key: match key {
                "auto" => KeySelect::Auto,
                "all" | "" => KeySelect::All,
                path => KeySelect::Path(path.to_owned()),
            },
            strip: match strip {
                "auto" => Strip::Auto,
                "none" | "" => Strip::None,
                prefix => Strip::Prefix(prefix.to_owned()),
            },
            include,
            exclude,
            ..Default::default()
        };
        let sd = opts.select(&self.inner).map_err(to_py)?;
        let names = sd
            .tensors()
            .map(|(name, view)| {
                let index = self.inner.position(view.name()).unwrap_or(usize::MAX);
                (name.to_owned(), index)
            })
            .collect();
        Ok((names, sd.decisions().to_vec()))
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
        if view.is_none() {
            return Err(Error::new_err(format!("no tensor {index}")));
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

/// Open a checkpoint: `source` is a path (str) or the file's bytes.
#[pyfunction]
#[pyo3(signature = (source, *, objects=true, in_memory=false))]
fn open(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    objects: bool,
    in_memory: bool,
) -> PyResult<Checkpoint> {
    let opts = OpenOptions::new().objects(objects).in_memory(in_memory);
    let ckpt = if let Ok(bytes) = source.downcast::<PyBytes>() {
        let data = bytes.as_bytes().to_vec();
        py.allow_threads(move || opts.open_bytes(data))
    } else {
        let path: std::path::PathBuf = source.extract()?;
        py.allow_threads(move || opts.open(path))
    };
    Ok(Checkpoint {
        inner: Arc::new(ckpt.map_err(to_py)?),
    })
}

#[pymodule]
fn _ptload(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<Error>())?;
    m.add_class::<Checkpoint>()?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    Ok(())
}
