//! Tensors and storages as the reader hands them out, and the validation
//! that makes them: every rebuilt tensor is checked against its storage as
//! torch's `setStrided` checks it.

use super::dtype::DType;
use super::{QuantParams, Quantization, TensorMeta, TorchHeap, TorchObj};
use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::pickle::{Heap, Value};

/// Where a storage's bytes are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StorageData {
    /// At this offset of the (memory-mapped) file.
    File(u64),
    /// In an owned buffer (a tensor put together from a distributed
    /// checkpoint's chunks).
    Owned(usize),
    /// In a deflated zip record, inflated when first read.
    Deflated(usize),
    /// Read on demand from elsewhere (a distributed checkpoint's chunks,
    /// put together when asked for): the index among the checkpoint's
    /// lazy storages.
    Lazy(usize),
}

/// One storage: a run of bytes that tensors view.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StorageInfo {
    /// The key from the persistent id (`"0"`, `"1"`, ...).
    pub key: String,
    /// The location tag saved with it (`cpu`, `cuda:0`, `mps`, ...).
    pub location: String,
    /// Element type of the saved storage type (`U8` for untyped storages).
    pub dtype: DType,
    /// Elements of `dtype`.
    pub numel: u64,
    /// Size in bytes.
    pub nbytes: u64,
    /// The zip record holding it (`archive/data/0`); `None` in legacy files.
    pub record: Option<String>,
    /// Offset of its bytes in the file, when they are stored there uncompressed.
    pub file_offset: Option<u64>,
    pub(crate) data: StorageData,
    /// The quantized element type its class names, if any.
    pub(crate) quantized: Option<&'static str>,
}

/// Metadata of one named tensor.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TensorInfo {
    /// The flattened name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Sizes.
    pub shape: Vec<u64>,
    /// Strides, in elements.
    pub stride: Vec<u64>,
    /// Offset into the storage, in elements.
    pub storage_offset: u64,
    /// Index into [`Checkpoint::storages`](crate::Checkpoint::storages); `None` for meta tensors.
    pub storage: Option<usize>,
    /// Elements.
    pub numel: u64,
    /// Bytes of the elements in row-major order (`numel * dtype.size()`).
    pub nbytes: u64,
    /// `requires_grad` as saved.
    pub requires_grad: bool,
    /// The conjugate bit (the stored values are not conjugated).
    pub conj: bool,
    /// The negative bit (the stored values are not negated).
    pub neg: bool,
    /// Quantization parameters of a quantized tensor (its data is the
    /// integer representation).
    pub quantization: Option<Quantization>,
}

impl TensorInfo {
    /// Whether the elements are laid out row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1u64;
        for (&size, &stride) in self.shape.iter().zip(&self.stride).rev() {
            if size != 1 && stride != expected {
                return false;
            }
            expected = expected.saturating_mul(size);
        }
        true
    }
}

impl TensorInfo {
    /// This tensor's elements in row-major order, gathered from `storage`
    /// (its storage's bytes, as they lie: no byte order change, no
    /// conj/neg bit applied). For bytes read back from a device, or any
    /// copy of a storage.
    ///
    /// ```
    /// # fn main() -> Result<(), ptload_reader::Error> {
    /// let ckpt = ptload_reader::Checkpoint::open("../../fixtures/files/views.pt")?;
    /// let view = ckpt.tensors().find(|t| !t.is_contiguous()).unwrap();
    /// let storage = view.storage_bytes()?.to_vec();
    /// assert_eq!(view.info().gather(&storage)?, view.data()?.into_owned());
    /// # Ok(())
    /// # }
    /// ```
    pub fn gather(&self, storage: &[u8]) -> Result<Vec<u8>> {
        let mut out =
            Vec::with_capacity(usize::try_from(self.nbytes).unwrap_or(0).min(storage.len()));
        self.runs(storage, |run| out.extend_from_slice(run))?;
        Ok(out)
    }

    /// Hand `f` the tensor's elements over `storage` in row-major order,
    /// one run of contiguous elements at a time.
    pub(crate) fn runs(&self, storage: &[u8], mut f: impl FnMut(&[u8])) -> Result<()> {
        let extent = || tensor_err(&self.name, "tensor extent outside its storage");
        self.run_bounds(storage.len() as u64, |start, len| {
            let bytes = usize::try_from(start)
                .ok()
                .zip(usize::try_from(len).ok())
                .and_then(|(s, l)| storage.get(s..s.checked_add(l)?))
                .ok_or_else(extent)?;
            f(bytes);
            Ok(())
        })
    }

    /// Hand `f` each run of contiguous elements as `(byte offset in the
    /// storage, length in bytes)`, in row-major order; every run lies
    /// within `storage_len` bytes.
    pub(crate) fn run_bounds(
        &self,
        storage_len: u64,
        mut f: impl FnMut(u64, u64) -> Result<()>,
    ) -> Result<()> {
        let extent = || tensor_err(&self.name, "tensor extent outside its storage");
        let elem = self.dtype.size() as u64;
        if self.numel == 0 {
            return Ok(());
        }
        // The innermost dimensions that are contiguous form one run.
        let mut run: u64 = 1;
        let mut outer = self.shape.len();
        for (&size, &stride) in self.shape.iter().zip(&self.stride).rev() {
            if size != 1 && stride != run {
                break;
            }
            run = run.saturating_mul(size);
            outer -= 1;
        }
        // Checked throughout: the fields are public, so any values arrive.
        let run_bytes = run.checked_mul(elem).ok_or_else(extent)?;
        let (Some(dims), Some(strides)) = (self.shape.get(..outer), self.stride.get(..outer))
        else {
            return Err(extent());
        };
        let mut index = vec![0u64; outer];
        loop {
            let base = index
                .iter()
                .zip(strides)
                .fold(self.storage_offset, |acc, (i, s)| {
                    acc.saturating_add(i.saturating_mul(*s))
                });
            let start = base.checked_mul(elem).ok_or_else(extent)?;
            if start
                .checked_add(run_bytes)
                .is_none_or(|end| end > storage_len)
            {
                return Err(extent());
            }
            f(start, run_bytes)?;
            // Advance the odometer over the outer dimensions.
            let mut d = outer;
            loop {
                if d == 0 {
                    return Ok(());
                }
                d -= 1;
                let (Some(i), Some(&size)) = (index.get_mut(d), dims.get(d)) else {
                    return Err(extent());
                };
                *i += 1;
                if *i < size {
                    break;
                }
                *i = 0;
            }
        }
    }
}

fn tensor_err(name: &str, message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Tensor, message).for_tensor(name)
}

fn non_negative(name: &str, v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| tensor_err(name, format!("negative {what} {v}")))
}

/// Validate a rebuilt tensor against its storage, as torch's setStrided does.
pub(crate) fn tensor_info(
    heap: &Heap,
    name: String,
    meta: &TensorMeta,
    storages: &[StorageInfo],
    limits: &Limits,
) -> Result<TensorInfo> {
    let (mut shape, mut stride, storage_offset) = geometry(heap, &name, meta)?;
    let overflow = || tensor_err(&name, "size arithmetic overflows");
    let mut numel = shape
        .iter()
        .try_fold(1u64, |acc, &s| acc.checked_mul(s))
        .ok_or_else(overflow)?;
    let kind = quantized_kind(meta, storages);
    // Packed kinds count values in the size and stride, and bytes in the
    // storage: the tensor becomes its packed bytes (torch's int_repr()),
    // which needs the values contiguous and at the storage's start.
    let per_byte = match kind {
        "quint4x2" if meta.quant.is_some() => 2,
        "quint2x4" if meta.quant.is_some() => 4,
        _ => 1,
    };
    let values_shape = (per_byte > 1).then(|| shape.clone());
    if per_byte > 1 {
        check_packed(&name, kind, &shape, &stride, storage_offset)?;
        numel = numel.div_ceil(per_byte);
        shape = vec![numel];
        stride = vec![1];
    }
    let elem = meta.dtype.size() as u64;
    let nbytes = numel.checked_mul(elem).ok_or_else(overflow)?;
    if let Some(sid) = meta.storage {
        let storage = storages
            .get(sid)
            .ok_or_else(|| tensor_err(&name, "storage index"))?;
        if numel > 0 {
            check_extent(&name, storage, (&shape, &stride, storage_offset), elem)?;
        }
        if nbytes > storage.nbytes && nbytes > limits.max_expanded_view_bytes {
            return Err(
                Error::limit("max_expanded_view_bytes", limits.max_expanded_view_bytes)
                    .for_tensor(&name),
            );
        }
    }
    let quantization = meta
        .quant
        .as_ref()
        .map(|q| quantization(heap, q, kind, values_shape));
    Ok(TensorInfo {
        name,
        dtype: meta.dtype,
        shape,
        stride,
        storage_offset,
        storage: meta.storage,
        numel,
        nbytes,
        requires_grad: meta.requires_grad,
        conj: meta.conj,
        neg: meta.neg,
        quantization,
    })
}

/// The size, stride and storage offset the rebuild call gave: tuples of
/// non-negative ints of one length, and a non-negative offset.
fn geometry(heap: &Heap, name: &str, meta: &TensorMeta) -> Result<(Vec<u64>, Vec<u64>, u64)> {
    let ints = |v: Value, what: &str| -> Result<Vec<u64>> {
        heap.sequence(v)
            .ok_or_else(|| tensor_err(name, format!("{what} is not a tuple")))?
            .iter()
            .map(|&i| match i {
                Value::Int(x) => non_negative(name, x, what),
                _ => Err(tensor_err(name, format!("{what} is not an int"))),
            })
            .collect()
    };
    let shape = ints(meta.shape, "size")?;
    let stride = ints(meta.stride, "stride")?;
    if shape.len() != stride.len() {
        return Err(tensor_err(
            name,
            format!(
                "size has {} dimensions but stride has {}",
                shape.len(),
                stride.len()
            ),
        ));
    }
    let storage_offset = non_negative(name, meta.offset, "storage offset")?;
    Ok((shape, stride, storage_offset))
}

/// The quantized type of a tensor's integers: the storage class names it;
/// its integer dtype is the fallback (a file that names a plain storage
/// class).
fn quantized_kind(meta: &TensorMeta, storages: &[StorageInfo]) -> &'static str {
    meta.storage
        .and_then(|s| storages.get(s))
        .and_then(|s| s.quantized)
        .unwrap_or(match meta.dtype {
            DType::I8 => "qint8",
            DType::I32 => "qint32",
            _ => "quint8",
        })
}

/// A packed kind's values must be contiguous and start the storage.
fn check_packed(
    name: &str,
    kind: &str,
    shape: &[u64],
    stride: &[u64],
    storage_offset: u64,
) -> Result<()> {
    let mut expected = 1u64;
    for (&size, &st) in shape.iter().zip(stride).rev() {
        if size > 1 && st != expected {
            return Err(tensor_err(
                name,
                format!("a {kind} tensor whose values are not contiguous (torch packs them)"),
            ));
        }
        expected = expected.saturating_mul(size);
    }
    if storage_offset != 0 {
        // torch counts the offset in values but applies it to bytes,
        // reading past its data: there is no right answer to give.
        return Err(tensor_err(
            name,
            format!(
                "a view into a {kind} tensor (offset {storage_offset}): torch itself misreads these"
            ),
        ));
    }
    Ok(())
}

/// The last element a non-empty tensor reaches must lie in its storage.
fn check_extent(
    name: &str,
    storage: &StorageInfo,
    (shape, stride, storage_offset): (&[u64], &[u64], u64),
    elem: u64,
) -> Result<()> {
    let overflow = || tensor_err(name, "size arithmetic overflows");
    let mut last = storage_offset;
    for (&size, &st) in shape.iter().zip(stride) {
        last = (size - 1)
            .checked_mul(st)
            .and_then(|x| x.checked_add(last))
            .ok_or_else(overflow)?;
    }
    let needed = last
        .checked_add(1)
        .and_then(|n| n.checked_mul(elem))
        .ok_or_else(overflow)?;
    if needed > storage.nbytes {
        return Err(tensor_err(
            name,
            format!(
                "extent ({needed} bytes from offset {storage_offset}) exceeds storage {} of {} bytes",
                storage.key, storage.nbytes
            ),
        ));
    }
    Ok(())
}

/// A quantized tensor's parameters, as the public [`Quantization`].
fn quantization(
    heap: &Heap,
    q: &QuantParams,
    kind: &'static str,
    values_shape: Option<Vec<u64>>,
) -> Quantization {
    match q {
        QuantParams::PerTensor {
            scheme,
            scale,
            zero_point,
        } => Quantization::PerTensor {
            kind,
            scheme: scheme.clone(),
            scale: *scale,
            zero_point: *zero_point,
            values_shape,
        },
        QuantParams::PerChannel {
            scheme,
            axis,
            zero_points,
            ..
        } => {
            // torch pickles per_channel_affine_float_qparams as
            // per_channel_affine; floating zero points tell them apart.
            let float_zero_points = matches!(
                heap.torch(*zero_points),
                Some(TorchObj::Tensor(z)) if z.dtype.is_float()
            );
            Quantization::PerChannel {
                kind,
                scheme: if float_zero_points && scheme == "per_channel_affine" {
                    "per_channel_affine_float_qparams".into()
                } else {
                    scheme.clone()
                },
                axis: *axis,
                values_shape,
            }
        }
    }
}

/// A storage pickled on its own (`torch.save(storage)`): a 1-D tensor over it.
pub(crate) fn bare_storage(
    name: String,
    id: usize,
    dtype: DType,
    storages: &[StorageInfo],
) -> Result<TensorInfo> {
    let s = storages
        .get(id)
        .ok_or_else(|| tensor_err(&name, "storage index"))?;
    // Typed as the reference says: its elements of that size.
    let numel = if dtype == s.dtype {
        s.numel
    } else {
        s.nbytes / (dtype.size() as u64).max(1)
    };
    Ok(TensorInfo {
        name,
        dtype,
        shape: vec![numel],
        stride: vec![1],
        storage_offset: 0,
        storage: Some(id),
        numel,
        nbytes: numel.saturating_mul(dtype.size() as u64),
        requires_grad: false,
        conj: false,
        neg: false,
        quantization: None,
    })
}
