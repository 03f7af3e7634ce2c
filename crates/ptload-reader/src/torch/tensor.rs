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
    #[cfg_attr(not(feature = "dcp"), allow(dead_code))]
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

    /// The elements as evenly spaced runs of its storage, when they lie so
    /// (a contiguous tensor, or a slice of one along any dimension, as a
    /// tensor-parallel rank holds it); `None` when they do not, when the
    /// view is empty, or when a run would end past `storage_len` bytes.
    /// Computed from the shape and strides alone, without visiting the runs.
    ///
    /// ```
    /// # fn main() -> Result<(), ptload_reader::Error> {
    /// let ckpt = ptload_reader::Checkpoint::open("../../fixtures/files/views.pt")?;
    /// for view in ckpt.tensors().filter(|t| t.info().numel > 0) {
    ///     let storage = view.storage_bytes()?;
    ///     if let Some(runs) = view.info().even_runs(storage.len() as u64) {
    ///         let mut out = vec![0; runs.bytes() as usize];
    ///         runs.copy(storage, 0, &mut out).unwrap();
    ///         assert_eq!(out, view.info().gather(storage)?);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn even_runs(&self, storage_len: u64) -> Option<EvenRuns> {
        if self.numel == 0 || self.shape.len() != self.stride.len() {
            return None;
        }
        let elem = self.dtype.size() as u64;
        // The innermost dimensions that are contiguous form one run, as in
        // `run_bounds`.
        let mut run: u64 = 1;
        let mut outer = self.shape.len();
        for (&size, &stride) in self.shape.iter().zip(&self.stride).rev() {
            if size != 1 && stride != run {
                break;
            }
            run = run.checked_mul(size)?;
            outer -= 1;
        }
        // The other dimensions (size 1 aside) must step as one: each one's
        // stride spans the whole of the one inside it.
        let mut step: Option<u64> = None;
        let mut count: u64 = 1;
        let mut span: u64 = 0;
        let (dims, strides) = (self.shape.get(..outer)?, self.stride.get(..outer)?);
        for (&size, &stride) in dims.iter().zip(strides).rev() {
            if size == 1 {
                continue;
            }
            match step {
                None => step = Some(stride),
                Some(_) if stride != span => return None,
                Some(_) => {}
            }
            count = count.checked_mul(size)?;
            span = stride.checked_mul(size)?;
        }
        let len = run.checked_mul(elem)?;
        let step = step.unwrap_or(run).checked_mul(elem)?;
        let first = self.storage_offset.checked_mul(elem)?;
        // A dimension of size 0 with elements claimed: not a view at all.
        let end = count
            .checked_sub(1)?
            .checked_mul(step)?
            .checked_add(first)?
            .checked_add(len)?;
        (end <= storage_len).then_some(EvenRuns {
            first,
            len,
            step,
            count,
        })
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

/// A view's elements as `count` runs of `len` bytes of its storage, the
/// first at byte `first`, each `step` bytes after the one before (see
/// [`TensorInfo::even_runs`]). In row-major order they are the view's
/// elements, as the storage holds them (no byte order change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvenRuns {
    /// Byte offset of the first run in the storage.
    pub first: u64,
    /// Bytes per run (at least one element).
    pub len: u64,
    /// Bytes from the start of one run to the start of the next.
    pub step: u64,
    /// Runs (at least one).
    pub count: u64,
}

impl EvenRuns {
    /// Bytes of the elements, row-major: `count * len`.
    pub fn bytes(&self) -> u64 {
        self.count.saturating_mul(self.len)
    }

    /// Copy the row-major bytes from byte `from` of the elements into
    /// `out` (as many as it holds), straight from `storage`: a part of a
    /// view gathered where it is needed, with no copy of the whole.
    /// `None` when the bytes asked for, or the runs, lie outside.
    pub fn copy(&self, storage: &[u8], from: u64, out: &mut [u8]) -> Option<()> {
        if self.len == 0 {
            return out.is_empty().then_some(());
        }
        let mut k = from / self.len;
        let mut within = from % self.len;
        let mut at = 0usize;
        while at < out.len() {
            if k >= self.count {
                return None;
            }
            let start = self
                .first
                .checked_add(k.checked_mul(self.step)?)?
                .checked_add(within)?;
            let start = usize::try_from(start).ok()?;
            let n = usize::try_from(self.len - within).ok()?.min(out.len() - at);
            out.get_mut(at..at + n)?
                .copy_from_slice(storage.get(start..start.checked_add(n)?)?);
            at += n;
            k += 1;
            within = 0;
        }
        Some(())
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
    let geometry = (&shape[..], &stride[..], storage_offset);
    let nbytes = checked_bytes(&name, meta.storage, geometry, numel, elem, storages, limits)?;
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

/// The bytes of `numel` elements of `elem` bytes, checked against the
/// storage the tensor views (its index `storage`), as torch's setStrided
/// does.
fn checked_bytes(
    name: &str,
    storage: Option<usize>,
    geometry: (&[u64], &[u64], u64),
    numel: u64,
    elem: u64,
    storages: &[StorageInfo],
    limits: &Limits,
) -> Result<u64> {
    let nbytes = numel
        .checked_mul(elem)
        .ok_or_else(|| tensor_err(name, "size arithmetic overflows"))?;
    if let Some(sid) = storage {
        let storage = storages
            .get(sid)
            .ok_or_else(|| tensor_err(name, "storage index"))?;
        if numel > 0 {
            check_extent(name, storage, geometry, elem)?;
        }
        if nbytes > storage.nbytes && nbytes > limits.max_expanded_view_bytes {
            return Err(
                Error::limit("max_expanded_view_bytes", limits.max_expanded_view_bytes)
                    .for_tensor(name),
            );
        }
    }
    Ok(nbytes)
}

/// A tensor of a plain state dict (see [`crate::torch::plain`]), checked
/// against its storage as [`tensor_info`] checks a rebuilt one.
pub(crate) fn plain_tensor_info(
    t: crate::torch::plain::PlainTensor,
    storages: &[StorageInfo],
    limits: &Limits,
) -> Result<TensorInfo> {
    let numel = t
        .shape
        .iter()
        .try_fold(1u64, |acc, &s| acc.checked_mul(s))
        .ok_or_else(|| tensor_err(&t.name, "size arithmetic overflows"))?;
    let elem = t.dtype.size() as u64;
    let geometry = (&t.shape[..], &t.stride[..], t.offset);
    let nbytes = checked_bytes(
        &t.name,
        Some(t.storage),
        geometry,
        numel,
        elem,
        storages,
        limits,
    )?;
    Ok(TensorInfo {
        name: t.name,
        dtype: t.dtype,
        shape: t.shape,
        stride: t.stride,
        storage_offset: t.offset,
        storage: Some(t.storage),
        numel,
        nbytes,
        requires_grad: t.requires_grad,
        conj: false,
        neg: false,
        quantization: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn view(dtype: DType, shape: &[u64], stride: &[u64], offset: u64) -> TensorInfo {
        let numel = shape.iter().product::<u64>();
        TensorInfo {
            name: "t".into(),
            dtype,
            shape: shape.to_vec(),
            stride: stride.to_vec(),
            storage_offset: offset,
            storage: Some(0),
            numel,
            nbytes: numel * dtype.size() as u64,
            requires_grad: false,
            conj: false,
            neg: false,
            quantization: None,
        }
    }

    /// Every window of the runs' bytes, at every start, is that window of
    /// the gathered view.
    fn copies_match_gather(info: &TensorInfo, storage: &[u8]) {
        let runs = info.even_runs(storage.len() as u64).expect("even runs");
        let whole = info.gather(storage).expect("gather");
        assert_eq!(runs.bytes(), whole.len() as u64, "{info:?}");
        for from in 0..whole.len() {
            for n in [0, 1, 3, 7, whole.len() - from] {
                let n = n.min(whole.len() - from);
                let mut out = vec![0xEE; n];
                runs.copy(storage, from as u64, &mut out).expect("copy");
                assert_eq!(out, whole[from..from + n], "{info:?} from {from} n {n}");
            }
        }
        // Past the end: refused, not zero-filled.
        let mut out = vec![0; 1];
        assert_eq!(runs.copy(storage, runs.bytes(), &mut out), None);
    }

    #[test]
    fn slices_of_a_contiguous_tensor_are_even_runs() {
        let storage: Vec<u8> = (0..=255)
            .cycle()
            .take(4 * 6 * 5 * 2)
            .map(|b: u32| b as u8)
            .collect();
        // A [4, 6, 5] bf16 tensor, contiguous (strides 30, 5, 1).
        let whole = view(DType::BF16, &[4, 6, 5], &[30, 5, 1], 0);
        assert_eq!(
            whole.even_runs(storage.len() as u64),
            Some(EvenRuns {
                first: 0,
                len: 240,
                step: 240,
                count: 1
            })
        );
        copies_match_gather(&whole, &storage);
        // Rank 1 of 2 along each dimension.
        let dim0 = view(DType::BF16, &[2, 6, 5], &[30, 5, 1], 60);
        assert_eq!(
            dim0.even_runs(storage.len() as u64),
            Some(EvenRuns {
                first: 120,
                len: 120,
                step: 120,
                count: 1
            })
        );
        let dim1 = view(DType::BF16, &[4, 3, 5], &[30, 5, 1], 15);
        assert_eq!(
            dim1.even_runs(storage.len() as u64),
            Some(EvenRuns {
                first: 30,
                len: 30,
                step: 60,
                count: 4
            })
        );
        let dim2 = view(DType::BF16, &[4, 6, 2], &[30, 5, 1], 3);
        assert_eq!(
            dim2.even_runs(storage.len() as u64),
            Some(EvenRuns {
                first: 6,
                len: 4,
                step: 10,
                count: 24
            })
        );
        for info in [&dim0, &dim1, &dim2] {
            copies_match_gather(info, &storage);
        }
        // Size-1 dimensions change nothing; an expanded (stride 0) one repeats.
        copies_match_gather(
            &view(DType::BF16, &[4, 1, 3, 5], &[30, 7, 5, 1], 15),
            &storage,
        );
        copies_match_gather(&view(DType::BF16, &[3, 5], &[0, 1], 10), &storage);
    }

    #[test]
    fn uneven_empty_or_out_of_storage_views_have_no_even_runs() {
        let len = 4 * 6 * 5 * 2;
        // A transpose: runs of one element, rows not one step apart.
        assert_eq!(view(DType::BF16, &[5, 6], &[1, 5], 0).even_runs(len), None);
        // Two dimensions sliced: gaps between rows, and larger ones
        // between planes.
        assert_eq!(
            view(DType::BF16, &[2, 3, 2], &[30, 5, 1], 0).even_runs(len),
            None
        );
        assert_eq!(view(DType::BF16, &[0, 5], &[5, 1], 0).even_runs(len), None);
        // One element past the storage.
        assert_eq!(
            view(DType::BF16, &[4, 3, 5], &[30, 5, 1], 16).even_runs(len),
            None
        );
        assert!(view(DType::BF16, &[4, 3, 5], &[30, 5, 1], 15)
            .even_runs(len)
            .is_some());
        // Elements claimed past a dimension of size 0 (the fields are
        // public): refused, not underflowed.
        let mut hollow = view(DType::BF16, &[0, 5], &[7, 1], 0);
        hollow.numel = 5;
        assert_eq!(hollow.even_runs(len), None);
        // Arithmetic that overflows is refused, not wrapped.
        assert_eq!(
            view(DType::F64, &[2, 2], &[u64::MAX / 4, 1], 0).even_runs(u64::MAX),
            None
        );
        assert_eq!(
            view(DType::F64, &[2], &[1], u64::MAX / 2).even_runs(u64::MAX),
            None
        );
    }
}
