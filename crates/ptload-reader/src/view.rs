//! Zero-copy tensor views and row-major byte access.

use std::borrow::Cow;

use crate::bytes::{negate_le, ByteOrder};
use crate::error::{Error, ErrorKind, Result};
use crate::source::Source;
use crate::torch::dtype::{DType, Element};
use crate::torch::tensor::{StorageInfo, TensorInfo};

/// One tensor of a checkpoint: its metadata and access to its bytes, which
/// borrow from the memory-mapped file when they can.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub(crate) ckpt: &'a dyn Storages,
    pub(crate) info: &'a TensorInfo,
}

/// What a view reads its tensor's bytes from: the storages of the
/// checkpoint that holds it (`Checkpoint` implements it), so views need
/// not know the checkpoint.
pub(crate) trait Storages: std::fmt::Debug + Sync {
    /// Every storage, by index.
    fn storages(&self) -> &[StorageInfo];
    /// The bytes of storage `index`, in the file's byte order.
    fn storage_bytes(&self, index: usize) -> Result<&[u8]>;
    /// The byte order of the file's storages.
    fn byte_order(&self) -> ByteOrder;
    /// Whether views should ask for their pages before reading them.
    fn is_scattered(&self) -> bool;
    /// The file's bytes.
    fn source(&self) -> &Source;
    /// The bytes of storage `index` when it is read on demand; `None` for
    /// any other storage.
    fn lazy_read(&self, index: usize) -> Option<Result<Cow<'_, [u8]>>>;
    /// The elements of `info` (row-major, as stored) fetched on their own
    /// from a file read by ranges, when that reads less than their
    /// storage; `None` to read them from the storage.
    fn fetch_span(&self, info: &TensorInfo) -> Option<Result<Vec<u8>>>;
    /// Hand the elements of `info` (row-major, as stored) to `f` in
    /// pieces fetched one after another from a file read by ranges, none
    /// kept: a large contiguous tensor read by a reader that needs no
    /// whole buffer (a hash, a writer). `None` to read them otherwise.
    fn stream_span(&self, _info: &TensorInfo, _f: &mut dyn FnMut(&[u8])) -> Option<Result<()>> {
        None
    }
}

/// Row-major chunks are handed out in pieces of at most this many bytes
/// when they must be gathered or swapped.
const CHUNK: usize = 1 << 20;

impl<'a> TensorView<'a> {
    /// The flattened name (`encoder.layers.0.weight`).
    pub fn name(&self) -> &'a str {
        &self.info.name
    }

    /// All metadata of the tensor.
    pub fn info(&self) -> &'a TensorInfo {
        self.info
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.info.dtype
    }

    /// Sizes of each dimension (empty for a 0-dim tensor).
    pub fn shape(&self) -> &'a [u64] {
        &self.info.shape
    }

    /// Strides in elements.
    pub fn stride(&self) -> &'a [u64] {
        &self.info.stride
    }

    /// Offset of the first element in its storage, in elements.
    pub fn storage_offset(&self) -> u64 {
        self.info.storage_offset
    }

    /// The storage this tensor views; `None` for meta tensors.
    pub fn storage(&self) -> Option<&'a StorageInfo> {
        self.info.storage.and_then(|i| self.ckpt.storages().get(i))
    }

    /// The location tag saved with the storage (`cpu`, `cuda:1`, ...);
    /// `meta` for tensors saved without storage.
    pub fn location(&self) -> &'a str {
        self.storage().map_or("meta", |s| s.location.as_str())
    }

    /// Whether the elements are laid out row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        self.info.is_contiguous()
    }

    /// The bytes of the whole storage, in the file's byte order; an error
    /// for meta tensors, which have none.
    pub fn storage_bytes(&self) -> Result<&'a [u8]> {
        self.require_storage()
    }

    /// Where the row-major bytes lie unchanged in the file, if they do: a
    /// contiguous tensor in host order with no conj/neg bit, stored
    /// uncompressed. `(file offset, length)`. (For the writers' kernel
    /// copies.)
    #[cfg_attr(not(feature = "export"), allow(dead_code))]
    pub(crate) fn file_range(&self) -> Option<(u64, u64)> {
        if !self.is_contiguous() || self.needs_swap() || self.needs_transform() {
            return None;
        }
        let start = self.storage()?.file_offset?;
        let at = self
            .info
            .storage_offset
            .checked_mul(self.info.dtype.size() as u64)?;
        Some((start.checked_add(at)?, self.info.nbytes))
    }

    fn needs_swap(&self) -> bool {
        self.ckpt.byte_order() != ByteOrder::HOST && self.info.dtype.swap_unit() > 1
    }

    /// The conjugate and negative bits change the values torch gives, not
    /// the stored bytes; they are applied on access.
    fn needs_transform(&self) -> bool {
        (self.info.conj && self.info.dtype.is_complex()) || self.info.neg
    }

    /// Apply the conj / neg bits to host-order elements in place.
    fn transform(&self, bytes: &mut [u8]) {
        let dtype = self.info.dtype;
        let elem = dtype.size();
        let unit = dtype.swap_unit();
        // Byte holding the sign bit of a component, in host order.
        let sign = |component: usize| {
            if cfg!(target_endian = "big") {
                component
            } else {
                component + unit - 1
            }
        };
        for e in bytes.chunks_exact_mut(elem) {
            if dtype.is_float() {
                let mut flip = |component: usize| {
                    if let Some(b) = e.get_mut(sign(component)) {
                        *b ^= 0x80;
                    }
                };
                if self.info.neg {
                    flip(0);
                    if dtype.is_complex() {
                        flip(unit);
                    }
                }
                if self.info.conj && dtype.is_complex() {
                    flip(unit);
                }
            } else if self.info.neg {
                negate_int(e);
            }
        }
    }

    /// The tensor's elements in row-major order and host byte order: borrowed
    /// from the file when contiguous and already in host order, gathered and
    /// swapped into an owned buffer otherwise.
    pub fn data(&self) -> Result<Cow<'a, [u8]>> {
        if let Some(read) = self.lazy() {
            return read;
        }
        if let Some(span) = self.span() {
            return span.map(Cow::Owned);
        }
        if let Ok(bytes) = self.borrowed() {
            return Ok(Cow::Borrowed(bytes));
        }
        let mut out = Vec::with_capacity(usize::try_from(self.info.nbytes).unwrap_or(0));
        self.visit_bytes(|chunk| out.extend_from_slice(chunk))?;
        Ok(Cow::Owned(out))
    }

    /// The elements as a slice of `T`, borrowed from the file without a
    /// copy. Errors with [`ErrorKind::DTypeMismatch`] when `T` is not the
    /// tensor's element type, and [`ErrorKind::NotBorrowable`] when the
    /// bytes cannot be used as they lie (strided, the other byte order, a
    /// pending conj/neg bit, misaligned for `T`): [`TensorView::to_cow`]
    /// then copies.
    ///
    /// ```
    /// # fn main() -> Result<(), ptload_reader::Error> {
    /// let ckpt = ptload_reader::Checkpoint::open("../../fixtures/files/basic.pt")?;
    /// let weight: &[f32] = ckpt.tensor("0.weight").unwrap().as_slice()?;
    /// # assert_eq!(weight.len(), 8 * 4);
    /// # assert!(!weight.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T]> {
        self.expect_dtype::<T>()?;
        let bytes = self.borrowed()?;
        bytemuck::try_cast_slice(bytes).map_err(|_| {
            let align = std::mem::align_of::<T>();
            Error::new(
                ErrorKind::NotBorrowable,
                format!(
                    "the elements lie {} bytes past a {align}-byte boundary in memory, not \
                     aligned for {}: read them with to_cow or to_vec",
                    bytes.as_ptr() as usize % align,
                    std::any::type_name::<T>()
                ),
            )
            .for_tensor(&self.info.name)
        })
    }

    /// The elements as `T`, row-major and in host byte order: borrowed as
    /// [`TensorView::as_slice`] when it can, copied otherwise. Errors only
    /// when `T` is not the element type (or the data is unreadable).
    pub fn to_cow<T: Element>(&self) -> Result<Cow<'a, [T]>> {
        self.expect_dtype::<T>()?;
        match self.as_slice::<T>() {
            Ok(slice) => Ok(Cow::Borrowed(slice)),
            Err(e) if e.kind() == ErrorKind::NotBorrowable => self.to_vec().map(Cow::Owned),
            Err(e) => Err(e),
        }
    }

    /// The elements as an owned vector of `T`, row-major and in host byte
    /// order.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.expect_dtype::<T>()?;
        let numel = usize::try_from(self.info.numel).map_err(|_| self.extent_error())?;
        let mut out = vec![T::zeroed(); numel];
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
        let mut filled = 0usize;
        let mut overflow = false;
        self.visit_bytes(|chunk| match dst.get_mut(filled..filled + chunk.len()) {
            Some(d) => {
                d.copy_from_slice(chunk);
                filled += chunk.len();
            }
            None => overflow = true,
        })?;
        if overflow || filled != dst.len() {
            return Err(self.extent_error());
        }
        Ok(out)
    }

    fn expect_dtype<T: Element>(&self) -> Result<()> {
        if T::DTYPE == self.info.dtype {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::DTypeMismatch,
            format!(
                "the tensor holds {} elements, not {} ({})",
                self.info.dtype,
                T::DTYPE,
                std::any::type_name::<T>()
            ),
        )
        .for_tensor(&self.info.name))
    }

    /// The row-major host-order bytes, when they lie in the file (or in an
    /// inflated record) as they are; otherwise why not.
    fn borrowed(&self) -> Result<&'a [u8]> {
        let storage = self.require_storage()?;
        if self.info.nbytes == 0 {
            // An empty view's offset may lie past its storage, as in torch.
            return Ok(&[]);
        }
        let why = if !self.is_contiguous() {
            Some("strided")
        } else if self.needs_swap() {
            Some("stored in the other byte order")
        } else if self.needs_transform() {
            Some("its conj/neg bit is applied on read")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::new(
                ErrorKind::NotBorrowable,
                format!("the elements cannot be borrowed from the file ({why}): read them with to_cow or to_vec"),
            )
            .for_tensor(&self.info.name));
        }
        let start = self
            .info
            .storage_offset
            .checked_mul(self.info.dtype.size() as u64)
            .ok_or_else(|| self.extent_error())?;
        crate::bytes::slice(storage, start, self.info.nbytes).ok_or_else(|| self.extent_error())
    }

    /// Hand the elements, row-major and in host byte order, to `f` in
    /// chunks, without materializing the whole tensor.
    pub fn visit_bytes(&self, mut f: impl FnMut(&[u8])) -> Result<()> {
        if let Some(read) = self.lazy() {
            f(&read?);
            return Ok(());
        }
        // A large tensor of a file read by ranges, in pieces fetched one
        // after another and dropped once handed on.
        let swap = self.needs_swap().then(|| self.info.dtype.swap_unit());
        let transform = self.needs_transform();
        let mut piece = Vec::new();
        let streamed = self.ckpt.stream_span(self.info, &mut |chunk| {
            if swap.is_none() && !transform {
                return f(chunk);
            }
            piece.clear();
            piece.extend_from_slice(chunk);
            if let Some(unit) = swap {
                self.ckpt.byte_order().to_host(&mut piece, unit);
            }
            if transform {
                self.transform(&mut piece);
            }
            f(&piece);
        });
        if let Some(done) = streamed {
            return done.map_err(|e| e.for_tensor(&self.info.name));
        }
        if let Some(span) = self.span() {
            f(&span?);
            return Ok(());
        }
        let storage = self.require_storage()?;
        let info = self.info;
        self.prefetch(storage.len() as u64);
        let swap = self.needs_swap().then(|| info.dtype.swap_unit());
        let transform = self.needs_transform();
        let mut buf: Vec<u8> = Vec::new();
        info.runs(storage, |bytes| {
            if swap.is_none() && !transform && bytes.len() >= CHUNK {
                // Long runs that need no change go straight from the map.
                if !buf.is_empty() {
                    f(&buf);
                    buf.clear();
                }
                f(bytes);
            } else {
                self.stage(bytes, &mut buf, swap, transform, &mut f);
            }
        })?;
        if !buf.is_empty() {
            f(&buf);
        }
        Ok(())
    }

    /// Ask the kernel ahead for the pages this view reads, when its
    /// checkpoint is a map read in scattered pieces (a rank's slices); a
    /// hint that changes speed, never results, and does nothing otherwise.
    /// For a reader that copies the view's runs itself
    /// ([`TensorInfo::even_runs`](crate::TensorInfo::even_runs)) instead
    /// of through [`visit_bytes`](Self::visit_bytes), which asks on its own.
    pub fn will_read(&self) {
        if let Some(storage) = self.storage() {
            self.prefetch(storage.nbytes);
        }
    }

    /// In a map read in scattered pieces (a rank's slices), ask for exactly
    /// the pages this view reads, in as few requests as their runs allow,
    /// before faulting them in one by one.
    fn prefetch(&self, storage_len: u64) {
        if !self.ckpt.is_scattered() {
            return;
        }

        let Some(base) = self.storage().and_then(|s| s.file_offset) else {
            return;
        };
        let source = self.ckpt.source();
        let mut pending: Option<(u64, u64)> = None;
        let _ = self.info.run_bounds(storage_len, |start, len| {
            let (a, b) = (base.saturating_add(start), base.saturating_add(start + len));
            pending = match pending {
                // Runs within a page of each other share a request.
                Some((pa, pb)) if a <= pb.saturating_add(4096) => Some((pa, pb.max(b))),
                Some((pa, pb)) => {
                    source.prefetch(pa, pb - pa);
                    Some((a, b))
                }
                None => Some((a, b)),
            };
            Ok(())
        });
        if let Some((a, b)) = pending {
            source.prefetch(a, b - a);
        }
    }

    /// Append `bytes` to `buf` (swapped and transformed as asked), handing
    /// `buf` to `f` whenever it would grow past [`CHUNK`].
    fn stage(
        &self,
        bytes: &[u8],
        buf: &mut Vec<u8>,
        swap: Option<usize>,
        transform: bool,
        f: &mut impl FnMut(&[u8]),
    ) {
        for piece in bytes.chunks(CHUNK) {
            if buf.len() + piece.len() > CHUNK && !buf.is_empty() {
                f(buf);
                buf.clear();
            }
            let at = buf.len();
            buf.extend_from_slice(piece);
            let (_, fresh) = buf.split_at_mut(at);
            if let Some(unit) = swap {
                self.ckpt.byte_order().to_host(fresh, unit);
            }
            if transform {
                self.transform(fresh);
            }
        }
    }

    /// A tensor read on demand (its storage row-major, in host order): its
    /// bytes read afresh, not kept; a part of it (a rank's slice) gathered
    /// from them.
    fn lazy(&self) -> Option<Result<Cow<'a, [u8]>>> {
        let read = self.ckpt.lazy_read(self.info.storage?)?;
        let whole = self.info.storage_offset == 0
            && self.is_contiguous()
            && self.storage().is_some_and(|s| s.nbytes == self.info.nbytes);
        Some(
            read.and_then(|bytes| {
                if whole {
                    Ok(bytes)
                } else {
                    self.info.gather(&bytes).map(Cow::Owned)
                }
            })
            .map_err(|e| e.for_tensor(&self.info.name)),
        )
    }

    /// The elements of a view of a file read by ranges, fetched on
    /// their own (see `Checkpoint::fetch_span`), in host order with the
    /// conj/neg bits applied; `None` when they are read from the storage.
    fn span(&self) -> Option<Result<Vec<u8>>> {
        let fetched = self.ckpt.fetch_span(self.info)?;
        Some(
            fetched
                .map(|mut bytes| {
                    if self.needs_swap() {
                        self.ckpt
                            .byte_order()
                            .to_host(&mut bytes, self.info.dtype.swap_unit());
                    }
                    if self.needs_transform() {
                        self.transform(&mut bytes);
                    }
                    bytes
                })
                .map_err(|e| e.for_tensor(&self.info.name)),
        )
    }

    fn require_storage(&self) -> Result<&'a [u8]> {
        match self.info.storage {
            None => Err(
                Error::new(ErrorKind::Tensor, "meta tensor: it has a shape but no data")
                    .for_tensor(&self.info.name),
            ),
            Some(i) => self
                .ckpt
                .storage_bytes(i)
                .map_err(|e| e.for_tensor(&self.info.name)),
        }
    }

    fn extent_error(&self) -> Error {
        Error::new(ErrorKind::Tensor, "tensor extent outside its storage")
            .for_tensor(&self.info.name)
    }
}

/// Two's complement negation of one host-order integer element.
fn negate_int(e: &mut [u8]) {
    let le = cfg!(target_endian = "little");
    if !le {
        e.reverse();
    }
    negate_le(e);
    if !le {
        e.reverse();
    }
}
