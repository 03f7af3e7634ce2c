//! The torch layer: gives meaning to the globals torch pickles (rebuild
//! functions, storages, dtypes, devices, containers) and keeps everything
//! else as inert values. Nothing is ever imported or called.

pub(crate) mod decode;
pub(crate) mod dtensor;
pub(crate) mod dtype;
pub(crate) mod interp;
pub(crate) mod names;
pub(crate) mod plain;
pub(crate) mod policy;
pub(crate) mod tensor;

pub(crate) use interp::{PendingStorage, TorchInterp};

use std::any::Any;

use crate::error::Result;
use crate::pickle::{Extension, Heap, Obj, Value};
use dtype::DType;

/// A global reference, with what the reader knows it to be.
#[derive(Debug)]
pub(crate) struct Global {
    pub(crate) module: Box<str>,
    pub(crate) name: Box<str>,
    pub(crate) known: Known,
    /// Index of its entry in the list of globals seen.
    pub(crate) seen: usize,
}

/// Globals whose meaning the reader reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    RebuildTensor,
    RebuildTensorV2,
    RebuildTensorV3,
    RebuildParameter,
    RebuildParameterWithState,
    RebuildFromTypeV2,
    RebuildQTensor,
    RebuildSparse,
    RebuildMetaNoStorage,
    /// A rebuild function whose tensors are not read (nested, wrapper
    /// subclasses, device tensors): reported, never silently dropped.
    RebuildUnsupported,
    GetLayout,
    OrderedDict,
    Set,
    FrozenSet,
    Bytearray,
    CodecsEncode,
    Size,
    Device,
    TensorClass,
    StorageClass(DType),
    Dtype(DType),
    QScheme,
    NumpyScalar,
    NumpyReconstruct,
    NumpyDtype,
    Reconstructor,
    NewObj,
    /// `torch.jit._pickle.build_{tensor,int,double,bool}list(list)` and
    /// `restore_type_tag(value, type)`: TorchScript's wrappers, whose value
    /// is their first argument.
    TorchScriptWrapper,
    Other,
}

impl Known {
    /// The callable's name, for error messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Known::RebuildTensor => "torch._utils._rebuild_tensor",
            Known::RebuildTensorV2 => "torch._utils._rebuild_tensor_v2",
            Known::RebuildTensorV3 => "torch._utils._rebuild_tensor_v3",
            Known::RebuildParameter => "torch._utils._rebuild_parameter",
            Known::RebuildParameterWithState => "torch._utils._rebuild_parameter_with_state",
            Known::RebuildFromTypeV2 => "torch._tensor._rebuild_from_type_v2",
            Known::RebuildQTensor => "torch._utils._rebuild_qtensor",
            Known::RebuildSparse => "torch._utils._rebuild_sparse_tensor",
            Known::RebuildMetaNoStorage => "torch._utils._rebuild_meta_tensor_no_storage",
            Known::RebuildUnsupported => "an unsupported torch._utils rebuild function",
            Known::GetLayout => "torch.serialization._get_layout",
            Known::OrderedDict => "collections.OrderedDict",
            Known::Set => "builtins.set",
            Known::FrozenSet => "builtins.frozenset",
            Known::Bytearray => "builtins.bytearray",
            Known::CodecsEncode => "_codecs.encode",
            Known::Size => "torch.Size",
            Known::Device => "torch.device",
            Known::TensorClass => "a torch tensor class",
            Known::StorageClass(_) => "a torch storage class",
            Known::Dtype(_) => "a torch dtype",
            Known::QScheme => "a torch qscheme",
            Known::NumpyScalar => "numpy.core.multiarray.scalar",
            Known::NumpyReconstruct => "numpy.core.multiarray._reconstruct",
            Known::NumpyDtype => "numpy.dtype",
            Known::Reconstructor => "copyreg._reconstructor",
            Known::NewObj => "copyreg.__newobj__",
            Known::TorchScriptWrapper => "a torch.jit._pickle helper",
            Known::Other => "a callable",
        }
    }

    pub(crate) fn of(module: &str, name: &str) -> Known {
        match (module, name) {
            ("torch._utils", "_rebuild_tensor") => Known::RebuildTensor,
            ("torch._utils", "_rebuild_tensor_v2") => Known::RebuildTensorV2,
            ("torch._utils", "_rebuild_tensor_v3") => Known::RebuildTensorV3,
            ("torch._utils", "_rebuild_parameter") => Known::RebuildParameter,
            ("torch._utils", "_rebuild_parameter_with_state") => Known::RebuildParameterWithState,
            ("torch._tensor", "_rebuild_from_type_v2") => Known::RebuildFromTypeV2,
            ("torch._utils", "_rebuild_qtensor") => Known::RebuildQTensor,
            ("torch._utils", "_rebuild_sparse_tensor") => Known::RebuildSparse,
            ("torch._utils", "_rebuild_meta_tensor_no_storage") => Known::RebuildMetaNoStorage,
            ("torch._utils", n) if n.starts_with("_rebuild_") => Known::RebuildUnsupported,
            ("torch.serialization", "_get_layout") => Known::GetLayout,
            (
                "torch.jit._pickle",
                "build_tensorlist" | "build_intlist" | "build_doublelist" | "build_boollist"
                | "restore_type_tag",
            ) => Known::TorchScriptWrapper,
            ("collections", "OrderedDict" | "Counter" | "defaultdict") => Known::OrderedDict,
            ("builtins", "dict") => Known::OrderedDict,
            ("builtins", "set") => Known::Set,
            ("builtins", "frozenset") => Known::FrozenSet,
            ("builtins", "bytearray" | "bytes") => Known::Bytearray,
            ("_codecs", "encode") => Known::CodecsEncode,
            ("torch", "Size") => Known::Size,
            ("torch", "device") => Known::Device,
            ("torch", "Tensor") | ("torch.nn.parameter", "Parameter") => Known::TensorClass,
            // torch maps any name containing "Storage" to a storage type.
            (m, n) if (m == "torch" || m.starts_with("torch.")) && n.ends_with("Storage") => {
                match DType::from_storage_name(n) {
                    Some(d) => Known::StorageClass(d),
                    None => Known::Other,
                }
            }
            ("torch", n) if n.starts_with("per_") => Known::QScheme,
            ("torch", n) => match DType::from_torch_name(n) {
                Some(d) => Known::Dtype(d),
                None if n.ends_with("Tensor") => Known::TensorClass,
                None => Known::Other,
            },
            ("numpy.core.multiarray" | "numpy._core.multiarray", "scalar") => Known::NumpyScalar,
            ("numpy.core.multiarray" | "numpy._core.multiarray", "_reconstruct") => {
                Known::NumpyReconstruct
            }
            ("numpy", "dtype") => Known::NumpyDtype,
            ("copyreg", "_reconstructor") => Known::Reconstructor,
            ("copyreg", "__newobj__" | "__newobj_ex__") => Known::NewObj,
            _ => Known::Other,
        }
    }
}

/// Quantization of a tensor's integer data.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Quantization {
    /// One scale and zero point for the whole tensor.
    PerTensor {
        /// The quantized element type: `qint8`, `quint8`, `qint32`,
        /// `quint4x2` or `quint2x4` (the integer data's dtype is I8, U8 or
        /// I32; 4- and 2-bit kinds pack several values per byte).
        kind: &'static str,
        /// `per_tensor_affine` or `per_tensor_symmetric`.
        scheme: String,
        /// Scale.
        scale: f64,
        /// Zero point.
        zero_point: i64,
        /// For the packed kinds (`quint4x2`: two 4-bit values a byte, low
        /// nibble first; `quint2x4`: four 2-bit values, low bits first): the
        /// shape of the values. The tensor itself is then their packed
        /// bytes, U8 and 1-D, as torch's `int_repr()` gives them.
        values_shape: Option<Vec<u64>>,
    },
    /// A scale and zero point per slice along `axis`; they are the tensors
    /// named `<name>.scales` and `<name>.zero_points`.
    PerChannel {
        /// The quantized element type, as for `PerTensor`.
        kind: &'static str,
        /// `per_channel_affine`, `per_channel_symmetric` or
        /// `per_channel_affine_float_qparams`.
        scheme: String,
        /// The channel axis.
        axis: i64,
        /// The shape of the values for packed kinds, as for `PerTensor`.
        values_shape: Option<Vec<u64>>,
    },
}

impl Quantization {
    /// What this quantization says of the tensor named `name`, as a record
    /// for JSON (a safetensors file's `<name>.quantization` metadata,
    /// `ptload inspect --json`): `{"kind", "scheme", "scale",
    /// "zero_point"}`, or for per-channel schemes `{"kind", "scheme",
    /// "axis", "scales", "zero_points"}` naming the tensors that hold them;
    /// packed kinds add `"values_shape"`. A scale that is not finite is
    /// `null`. (With the `serde` feature.)
    #[cfg(feature = "serde")]
    pub fn record(&self, name: &str) -> impl serde::Serialize {
        match self {
            Quantization::PerTensor {
                kind,
                scheme,
                scale,
                zero_point,
                values_shape,
            } => QuantRecord::PerTensor {
                kind,
                scheme: scheme.clone(),
                scale: *scale,
                zero_point: *zero_point,
                values_shape: values_shape.clone(),
            },
            Quantization::PerChannel {
                kind,
                scheme,
                axis,
                values_shape,
            } => QuantRecord::PerChannel {
                kind,
                scheme: scheme.clone(),
                axis: *axis,
                scales: format!("{name}.scales"),
                zero_points: format!("{name}.zero_points"),
                values_shape: values_shape.clone(),
            },
        }
    }
}

/// [`Quantization::record`]'s fields, in their order.
#[cfg(feature = "serde")]
#[derive(serde::Serialize)]
#[serde(untagged)]
enum QuantRecord {
    PerTensor {
        kind: &'static str,
        scheme: String,
        scale: f64,
        zero_point: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        values_shape: Option<Vec<u64>>,
    },
    PerChannel {
        kind: &'static str,
        scheme: String,
        axis: i64,
        scales: String,
        zero_points: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        values_shape: Option<Vec<u64>>,
    },
}

#[derive(Debug, Clone)]
pub(crate) enum QuantParams {
    PerTensor {
        scheme: String,
        scale: f64,
        zero_point: i64,
    },
    PerChannel {
        scheme: String,
        scales: Value,
        zero_points: Value,
        axis: i64,
    },
}

/// A tensor as its rebuild call described it, before validation.
#[derive(Debug, Clone)]
pub(crate) struct TensorMeta {
    /// None for meta tensors (shape only).
    pub(crate) storage: Option<usize>,
    pub(crate) dtype: DType,
    pub(crate) offset: i64,
    /// The size and stride tuples as pickled (checked to hold only ints).
    pub(crate) shape: Value,
    pub(crate) stride: Value,
    pub(crate) requires_grad: bool,
    pub(crate) conj: bool,
    pub(crate) neg: bool,
    pub(crate) quant: Option<QuantParams>,
    /// Python attributes saved with the tensor (`t.foo = ...`): the state
    /// `_rebuild_from_type_v2` sets, a dict or a `(dict, slots)` tuple.
    pub(crate) attrs: Option<Value>,
    /// A DTensor's spec, when this is the local tensor of one.
    pub(crate) dtensor: Option<Box<dtensor::DTensorSpec>>,
}

/// Layout of a sparse tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    Strided,
    Coo,
    Csr,
    Csc,
    Bsr,
    Bsc,
}

impl Layout {
    fn from_name(name: &str) -> Option<Layout> {
        Some(match name.strip_prefix("torch.").unwrap_or(name) {
            "strided" => Layout::Strided,
            "sparse_coo" => Layout::Coo,
            "sparse_csr" => Layout::Csr,
            "sparse_csc" => Layout::Csc,
            "sparse_bsr" => Layout::Bsr,
            "sparse_bsc" => Layout::Bsc,
            _ => return None,
        })
    }

    /// torch's name for it (`sparse_coo`...).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Layout::Strided => "strided",
            Layout::Coo => "sparse_coo",
            Layout::Csr => "sparse_csr",
            Layout::Csc => "sparse_csc",
            Layout::Bsr => "sparse_bsr",
            Layout::Bsc => "sparse_bsc",
        }
    }

    /// Names of the component tensors, in the order torch pickles them.
    pub(crate) fn components(self) -> &'static [&'static str] {
        match self {
            Layout::Coo => &["indices", "values"],
            Layout::Csr | Layout::Bsr => &["crow_indices", "col_indices", "values"],
            Layout::Csc | Layout::Bsc => &["ccol_indices", "row_indices", "values"],
            Layout::Strided => &[],
        }
    }
}

/// A numpy dtype as pickled (`numpy.dtype('f8')` + BUILD).
#[derive(Debug)]
pub(crate) struct NumpyDtype {
    pub(crate) descr: String,
    pub(crate) big_endian: bool,
    /// Its state names fields or a subarray: `descr` (`V12`) alone does
    /// not describe it.
    pub(crate) structured: bool,
}

/// A numpy array (not a tensor): kept as a value with its shape.
#[derive(Debug)]
pub(crate) struct NdArray {
    pub(crate) dtype: String,
    pub(crate) shape: Vec<u64>,
    /// The dtype as BUILD gave it (descr, big-endian), when it was one.
    pub(crate) descr: Option<(String, bool)>,
    /// Elements stored in column-major order.
    pub(crate) fortran: bool,
    /// The raw elements (bytes), or a list for object arrays.
    pub(crate) data: Value,
}

/// Values with torch meaning, stored in the pickle heap.
#[derive(Debug)]
pub(crate) enum TorchObj {
    Global(Global),
    /// A storage reference: the storage's index, and the dtype this
    /// reference types it as (torch types each reference on its own: one
    /// untyped storage can be saved as two dtypes when it is empty).
    Storage {
        index: usize,
        dtype: DType,
    },
    Tensor(TensorMeta),
    Sparse {
        layout: Layout,
        components: Vec<Value>,
        /// The pickled data tuple (components, then size and flags).
        data: Value,
    },
    /// `nn.Parameter(data, requires_grad)`; `data` is a tensor.
    Parameter {
        data: Value,
        requires_grad: bool,
        /// Python attributes saved with it (`_rebuild_parameter_with_state`).
        attrs: Option<Value>,
    },
    /// A numpy scalar: its dtype, raw bytes, and the Python value they
    /// hold (None when the dtype is not one the reader decodes).
    NumpyScalar {
        descr: String,
        big_endian: bool,
        raw: Vec<u8>,
        value: Value,
    },
    Device(Box<str>),
    Layout(Layout),
    NumpyDtype(NumpyDtype),
    NdArray(NdArray),
}

impl Extension for TorchObj {
    fn kind_name(&self) -> &'static str {
        match self {
            TorchObj::Global(_) => "global",
            TorchObj::Storage { .. } => "storage",
            TorchObj::Tensor(_) => "tensor",
            TorchObj::Sparse { .. } => "sparse tensor",
            TorchObj::Parameter { .. } => "parameter",
            TorchObj::NumpyScalar { .. } => "numpy scalar",
            TorchObj::Device(_) => "torch.device",
            TorchObj::Layout(_) => "torch.layout",
            TorchObj::NumpyDtype(_) => "numpy.dtype",
            TorchObj::NdArray(_) => "numpy.ndarray",
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The torch layer's access to its values in the pickle heap.
pub(crate) trait TorchHeap {
    /// The torch value `v` refers to, if it is one.
    fn torch(&self, v: Value) -> Option<&TorchObj>;
    /// Store a torch value in the heap.
    fn alloc_torch(&mut self, obj: TorchObj) -> Result<Value>;
}

impl TorchHeap for Heap {
    fn torch(&self, v: Value) -> Option<&TorchObj> {
        self.ext(v)
    }

    fn alloc_torch(&mut self, obj: TorchObj) -> Result<Value> {
        self.alloc(Obj::Ext(Box::new(obj)))
    }
}

/// What a pickled value is, in messages: its kind (`int`, `str`,
/// `tensor`...), or the global it names.
pub(crate) fn describe(heap: &Heap, v: Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(_) => "bool".into(),
        Value::Int(_) => "int".into(),
        Value::Float(_) => "float".into(),
        Value::Obj(_) => match (heap.torch(v), heap.get(v)) {
            (Some(TorchObj::Global(g)), _) => format!("global {}.{}", g.module, g.name),
            (_, Some(o)) => crate::pickle::kind_name_of(o).into(),
            (_, None) => "?".into(),
        },
    }
}
