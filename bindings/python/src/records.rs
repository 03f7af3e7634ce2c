//! What Python builds objects from: the reader's tensors, quantization
//! and storages as frozen records, the object graph's nodes as tuples.

use ptload_reader::checkpoint::Quantization;
use ptload_reader::object::Node;
use ptload_reader::TensorInfo;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pyo3::BoundObject;

/// A tensor as the reader describes it: what Python builds it from.
#[pyclass(frozen, get_all, module = "ptload._ptload")]
pub(crate) struct TensorRecord {
    /// Its flattened name (`<node N>` for a tensor the walk did not name).
    pub(crate) name: String,
    /// ptload's dtype name (`F32`, `BF16`, `F8_E4M3`...).
    pub(crate) dtype: &'static str,
    pub(crate) shape: Vec<u64>,
    /// In elements.
    pub(crate) stride: Vec<u64>,
    /// Into its storage, in elements.
    pub(crate) offset: u64,
    /// Index into the storages; None for a meta tensor.
    pub(crate) storage: Option<usize>,
    pub(crate) requires_grad: bool,
    pub(crate) conj: bool,
    pub(crate) neg: bool,
    /// For a quantized tensor, how its integers map to values.
    pub(crate) quantization: Option<Py<QuantRecord>>,
}

/// A quantized tensor's parameters.
#[pyclass(frozen, get_all, module = "ptload._ptload")]
pub(crate) struct QuantRecord {
    /// `tensor` (one scale and zero point) or `channel` (one per channel
    /// along `axis`, tensors of the object graph).
    pub(crate) per: &'static str,
    /// `qint8`, `quint8`, `qint32`, `quint4x2`, `quint2x4`.
    pub(crate) kind: &'static str,
    /// torch's qscheme name.
    pub(crate) scheme: String,
    pub(crate) scale: Option<f64>,
    pub(crate) zero_point: Option<i64>,
    pub(crate) axis: Option<i64>,
    /// For packed kinds, the shape of the values (the record's shape is
    /// the packed bytes').
    pub(crate) values_shape: Option<Vec<u64>>,
}

/// A storage: its bytes and where they are.
#[pyclass(frozen, get_all, module = "ptload._ptload")]
pub(crate) struct StorageRecord {
    pub(crate) key: String,
    /// Where it was saved (`cpu`, `cuda:1`...).
    pub(crate) location: String,
    pub(crate) dtype: &'static str,
    pub(crate) numel: u64,
    pub(crate) nbytes: u64,
    /// Where its bytes start in the file; None where they are not there as
    /// they are (an inflated record).
    pub(crate) file_offset: Option<u64>,
}

/// Something the reader noticed and did not treat as an error: its kind
/// (`not_read`, `local_parts`, `values_differ`, `not_in_index`,
/// `no_local_header`, `in_part`) and the reader's words for it.
#[pyclass(frozen, get_all, module = "ptload._ptload")]
pub(crate) struct WarningRecord {
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

impl WarningRecord {
    pub(crate) fn of(w: &ptload_reader::advice::Warning) -> WarningRecord {
        WarningRecord {
            kind: w.name(),
            message: w.to_string(),
        }
    }
}

#[pymethods]
impl WarningRecord {
    fn __str__(&self) -> String {
        self.message.clone()
    }

    fn __repr__(&self) -> String {
        format!("WarningRecord({:?}, {:?})", self.kind, self.message)
    }
}

/// A global a pickle names, as the reader saw it.
#[pyclass(frozen, get_all, module = "ptload._ptload")]
pub(crate) struct GlobalRecord {
    /// The module part (`torch._utils`).
    pub(crate) module: String,
    /// The name part (`_rebuild_tensor_v2`).
    pub(crate) name: String,
    /// Whether torch's `weights_only=True` allowlist admits it.
    pub(crate) torch_allowed: bool,
    /// Whether the pickle calls it (a function).
    pub(crate) called: bool,
    /// Whether the pickle instantiates it (a class).
    pub(crate) instantiated: bool,
    /// The record (or legacy section) where it first appears.
    pub(crate) record: String,
    /// Byte offset of its first appearance in that record.
    pub(crate) offset: u64,
}

impl GlobalRecord {
    pub(crate) fn of(g: &ptload_reader::checkpoint::GlobalRef) -> GlobalRecord {
        GlobalRecord {
            module: g.module.clone(),
            name: g.name.clone(),
            torch_allowed: g.torch_allowed,
            called: g.called,
            instantiated: g.instantiated,
            record: g.record.clone(),
            offset: g.offset,
        }
    }
}

pub(crate) fn tensor_record(py: Python<'_>, t: &TensorInfo) -> PyResult<TensorRecord> {
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

pub(crate) fn tensor_record_bound<'py>(
    py: Python<'py>,
    t: &TensorInfo,
) -> PyResult<Bound<'py, TensorRecord>> {
    Bound::new(py, tensor_record(py, t)?)
}

pub(crate) fn node_tuple<'py>(py: Python<'py>, node: &Node) -> PyResult<Bound<'py, PyAny>> {
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
