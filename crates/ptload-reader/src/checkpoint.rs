//! The public facade: open a checkpoint, list its tensors and values.

use std::hash::BuildHasher;
use std::path::Path;

use hashbrown::HashTable;

use crate::bytes::{slice, ByteOrder};
use crate::container::layout::StorageBytes;
use crate::container::{detect, Detected, Format};
use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::pickle::{Heap, StringEncoding, Value, Vm};
use crate::source::Source;
use crate::torch::decode::{decode_legacy, decode_zip};
use crate::torch::dtype::DType;
use crate::torch::interp::GlobalRef;
use crate::torch::names::{walk_all, Scalar};
use crate::torch::policy::Policy;
use crate::torch::{QuantParams, Quantization, TensorMeta, TorchHeap, TorchInterp, TorchObj};
use crate::view::TensorView;

/// Where a storage's bytes are.
#[derive(Debug, Clone, Copy)]
enum StorageData {
    /// At this offset of the (memory-mapped) file.
    File(u64),
    /// In an owned buffer (an inflated zip entry).
    Owned(usize),
}

/// One storage: a run of bytes that tensors view.
#[derive(Debug, Clone)]
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
    data: StorageData,
    /// The quantized element type its class names, if any.
    quantized: Option<&'static str>,
}

/// Metadata of one named tensor.
#[derive(Debug, Clone, PartialEq)]
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
    /// Index into [`Checkpoint::storages`]; `None` for meta tensors.
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

/// Options for opening a checkpoint.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    limits: Limits,
    policy: Policy,
    encoding: StringEncoding,
    allowed_globals: Vec<String>,
    in_memory: bool,
}

impl OpenOptions {
    /// Default limits, the default policy, UTF-8 for Python 2 strings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bounds on the work the file may cause.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// What to do with globals outside torch's safe allowlist.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// How Python 2 strings decode (torch.load's `encoding`).
    pub fn encoding(mut self, encoding: StringEncoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// Allow `module.name` under [`Policy::Strict`] (torch's
    /// `add_safe_globals`). Globals of `sys`, `os`, `posix` and `nt` stay
    /// refused.
    pub fn allow_global(mut self, path: impl Into<String>) -> Self {
        self.allowed_globals.push(path.into());
        self
    }

    /// Read the whole file into memory at open instead of mapping it.
    ///
    /// A mapped file must not change while its `Checkpoint` is alive: if
    /// another process truncates it, reading the lost pages kills this
    /// process with SIGBUS, and if it rewrites it, tensors show the new
    /// bytes. Services that read files they do not control (uploads, shared
    /// volumes) should open in memory: it costs one read of the file and
    /// its size in memory, and nothing done to the file afterwards reaches
    /// the checkpoint.
    pub fn in_memory(mut self, yes: bool) -> Self {
        self.in_memory = yes;
        self
    }

    /// Open the file at `path`: memory-mapped, or read into memory with
    /// [`in_memory`](Self::in_memory).
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Checkpoint> {
        let source = if self.in_memory {
            Source::read(path.as_ref())?
        } else {
            Source::map(path.as_ref())?
        };
        Checkpoint::load(source, self)
    }

    /// Read a checkpoint held in memory, without copying it: `bytes` may be
    /// a `Vec<u8>`, a `&'static [u8]` (`include_bytes!`), an `Arc<[u8]>`
    /// shared with the caller, or any other owner of bytes; the checkpoint
    /// keeps it alive and its tensors borrow from it.
    pub fn open_bytes(
        &self,
        bytes: impl AsRef<[u8]> + Send + Sync + 'static,
    ) -> Result<Checkpoint> {
        Checkpoint::load(Source::given(bytes), self)
    }
}

/// A decoded checkpoint: tensor metadata and values, with tensor bytes left
/// in the (memory-mapped) file until asked for.
#[derive(Debug)]
pub struct Checkpoint {
    source: Source,
    owned: Vec<Vec<u8>>,
    format: Format,
    byte_order: ByteOrder,
    pickle_protocol: u8,
    storages: Vec<StorageInfo>,
    tensors: Vec<TensorInfo>,
    values: Vec<(String, Scalar)>,
    globals: Vec<GlobalRef>,
    warnings: Vec<String>,
    /// Indices into `tensors`, hashed by name with `hasher`.
    by_name: HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
    work: u64,
}

impl Checkpoint {
    /// Open the checkpoint at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        OpenOptions::new().open(path)
    }

    /// Read a checkpoint held in memory, with default options (see
    /// [`OpenOptions::open_bytes`]).
    pub fn from_bytes(bytes: impl AsRef<[u8]> + Send + Sync + 'static) -> Result<Checkpoint> {
        OpenOptions::new().open_bytes(bytes)
    }

    fn load(source: Source, opts: &OpenOptions) -> Result<Checkpoint> {
        source.advise(true);
        let checkpoint = Checkpoint::decode(source.clone(), opts);
        source.advise(false);
        checkpoint
    }

    fn decode(source: Source, opts: &OpenOptions) -> Result<Checkpoint> {
        let data = source.bytes();
        let mut heap = Heap::new(&opts.limits);
        let mut interp = TorchInterp::new(opts.policy, &opts.allowed_globals);
        let mut vm = Vm::new(&opts.limits, opts.encoding);
        let mut leading = Vec::new();
        let decoded = match detect(data)? {
            Detected::Zip => {
                if !data.starts_with(b"PK\x03\x04") {
                    leading = leading_globals(data, opts)?;
                }
                decode_zip(
                    data,
                    source.file(),
                    &opts.limits,
                    &mut heap,
                    &mut interp,
                    &mut vm,
                )?
            }
            Detected::Legacy => decode_legacy(data, &mut heap, &mut interp, &mut vm)?,
        };
        let walked = walk_all(&heap, &decoded.roots, &opts.limits)?;
        if walked.tensors.len() > opts.limits.max_tensors {
            return Err(Error::limit("max_tensors", opts.limits.max_tensors as u64));
        }
        let mut owned = Vec::new();
        let storages: Vec<StorageInfo> = decoded
            .storages
            .into_iter()
            .map(|(p, bytes)| {
                let nbytes = p.numel.saturating_mul(p.dtype.size() as u64);
                let data = match bytes {
                    StorageBytes::File(offset) => StorageData::File(offset),
                    StorageBytes::Inflated(bytes) => {
                        owned.push(bytes);
                        StorageData::Owned(owned.len() - 1)
                    }
                };
                StorageInfo {
                    file_offset: match data {
                        StorageData::File(o) => Some(o),
                        StorageData::Owned(_) => None,
                    },
                    key: p.key,
                    location: p.location,
                    dtype: p.dtype,
                    numel: p.numel,
                    nbytes,
                    record: p.record,
                    data,
                    quantized: p.quantized,
                }
            })
            .collect();
        let mut tensors = Vec::with_capacity(walked.tensors.len());
        for (name, value) in walked.tensors {
            // Indices must stay those of `by_name`: nothing is skipped.
            let info = match heap.torch(value) {
                Some(TorchObj::Tensor(meta)) => {
                    tensor_info(&heap, name, meta, &storages, &opts.limits)?
                }
                Some(TorchObj::Storage(id)) => bare_storage(name, *id, &storages)?,
                _ => {
                    return Err(Error::new(
                        ErrorKind::Tensor,
                        format!(
                            "'{name}' is a tensor component but holds a {}",
                            crate::torch::interp::describe(&heap, value)
                        ),
                    ))
                }
            };
            tensors.push(info);
        }
        let format = decoded.format;
        Ok(Checkpoint {
            source,
            owned,
            format,
            byte_order: decoded.byte_order,
            pickle_protocol: decoded.protocol,
            storages,
            tensors,
            values: walked.values,
            globals: leading.into_iter().chain(interp.globals).collect(),
            warnings: walked.warnings,
            by_name: walked.by_name,
            hasher: walked.hasher,
            work: heap.work().saturating_add(walked.steps),
        })
    }

    /// The layout of the file.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Byte order of the stored tensor data.
    pub fn byte_order(&self) -> ByteOrder {
        self.byte_order
    }

    /// Protocol of the main pickle (its PROTO opcode; 0 or 1 when absent).
    pub fn pickle_protocol(&self) -> u8 {
        self.pickle_protocol
    }

    pub(crate) fn source(&self) -> &Source {
        &self.source
    }

    /// Whether the tensor bytes come from a memory map of the file.
    pub fn is_mapped(&self) -> bool {
        self.source.is_mapped()
    }

    /// The tensors, in the order of the flattening walk.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = TensorView<'_>> + '_ {
        self.tensors
            .iter()
            .map(move |info| TensorView { ckpt: self, info })
    }

    /// The tensor named `name` (names are unique; a file where two
    /// tensors flatten to one name does not open).
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let hash = self.hasher.hash_one(name);
        self.by_name
            .find(hash, |&i| {
                self.tensors.get(i as usize).is_some_and(|t| t.name == name)
            })
            .and_then(|&i| self.tensor_at(i as usize))
    }

    /// The work opening took, in the units of
    /// [`Limits::max_work_per_byte`] (opcodes plus bytes and items hashed
    /// or copied) plus the steps of the naming walk. Deterministic for a
    /// file and its options: services can log it, tests can bound it.
    pub fn work(&self) -> u64 {
        self.work
    }

    /// The tensor at `index` in [`tensors`](Self::tensors) order.
    pub fn tensor_at(&self, index: usize) -> Option<TensorView<'_>> {
        self.tensors
            .get(index)
            .map(|info| TensorView { ckpt: self, info })
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Every storage, each once, however many tensors view it.
    pub fn storages(&self) -> &[StorageInfo] {
        &self.storages
    }

    /// The bytes of storage `index` (see [`storages`](Self::storages)), in
    /// the file's byte order.
    pub fn storage_bytes(&self, index: usize) -> Result<&[u8]> {
        let s = self.storages.get(index).ok_or_else(|| {
            Error::new(
                ErrorKind::Tensor,
                format!(
                    "no storage {index}: the checkpoint has {}",
                    self.storages.len()
                ),
            )
        })?;
        let bytes = match s.data {
            StorageData::File(offset) => slice(self.source.bytes(), offset, s.nbytes),
            StorageData::Owned(i) => self.owned.get(i).map(Vec::as_slice),
        };
        bytes.ok_or_else(|| {
            Error::new(
                ErrorKind::Tensor,
                format!("storage {:?}: its bytes are not in the file", s.key),
            )
        })
    }

    /// The plain non-tensor values (epoch, args.lr, ...), named by the
    /// flattening convention.
    pub fn values(&self) -> &[(String, Scalar)] {
        &self.values
    }

    /// Every global the pickles reference, once per record, in order of
    /// first appearance.
    pub fn globals(&self) -> &[GlobalRef] {
        &self.globals
    }

    /// The globals outside torch's `weights_only=True` allowlist.
    pub fn suspicious(&self) -> impl Iterator<Item = &GlobalRef> {
        self.globals.iter().filter(|g| !g.torch_allowed)
    }

    /// Things the reader saw but does not expose (e.g. tensors of a kind it
    /// does not read), one line each.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

fn tensor_err(name: &str, message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Tensor, message).for_tensor(name)
}

fn non_negative(name: &str, v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| tensor_err(name, format!("negative {what} {v}")))
}

/// Validate a rebuilt tensor against its storage, as torch's setStrided does.
fn tensor_info(
    heap: &Heap,
    name: String,
    meta: &TensorMeta,
    storages: &[StorageInfo],
    limits: &Limits,
) -> Result<TensorInfo> {
    let ints = |v: Value, what: &str| -> Result<Vec<u64>> {
        heap.sequence(v)
            .ok_or_else(|| tensor_err(&name, format!("{what} is not a tuple")))?
            .iter()
            .map(|&i| match i {
                Value::Int(x) => non_negative(&name, x, what),
                _ => Err(tensor_err(&name, format!("{what} is not an int"))),
            })
            .collect()
    };
    let mut shape = ints(meta.shape, "size")?;
    let mut stride = ints(meta.stride, "stride")?;
    if shape.len() != stride.len() {
        return Err(tensor_err(
            &name,
            format!(
                "size has {} dimensions but stride has {}",
                shape.len(),
                stride.len()
            ),
        ));
    }
    let storage_offset = non_negative(&name, meta.offset, "storage offset")?;
    let overflow = || tensor_err(&name, "size arithmetic overflows");
    let mut numel = shape
        .iter()
        .try_fold(1u64, |acc, &s| acc.checked_mul(s))
        .ok_or_else(overflow)?;
    // The storage class names the quantized type; its integer dtype is the
    // fallback (a file that names a plain storage class).
    let kind = meta
        .storage
        .and_then(|s| storages.get(s))
        .and_then(|s| s.quantized)
        .unwrap_or(match meta.dtype {
            DType::I8 => "qint8",
            DType::I32 => "qint32",
            _ => "quint8",
        });
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
        let mut expected = 1u64;
        for (&size, &st) in shape.iter().zip(&stride).rev() {
            if size > 1 && st != expected {
                return Err(tensor_err(
                    &name,
                    format!("a {kind} tensor whose values are not contiguous (torch packs them)"),
                ));
            }
            expected = expected.saturating_mul(size);
        }
        if storage_offset != 0 {
            // torch counts the offset in values but applies it to bytes,
            // reading past its data: there is no right answer to give.
            return Err(tensor_err(
                &name,
                format!(
                    "a view into a {kind} tensor (offset {storage_offset}): torch itself misreads these"
                ),
            ));
        }
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
            let mut last = storage_offset;
            for (&size, &st) in shape.iter().zip(&stride) {
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
                    &name,
                    format!(
                        "extent ({needed} bytes from offset {storage_offset}) exceeds storage {} of {} bytes",
                        storage.key, storage.nbytes
                    ),
                ));
            }
        }
        if nbytes > storage.nbytes && nbytes > limits.max_expanded_view_bytes {
            return Err(
                Error::limit("max_expanded_view_bytes", limits.max_expanded_view_bytes)
                    .for_tensor(&name),
            );
        }
    }
    let quantization = meta.quant.as_ref().map(|q| match q {
        QuantParams::PerTensor {
            scheme,
            scale,
            zero_point,
        } => Quantization::PerTensor {
            kind,
            scheme: scheme.clone(),
            scale: *scale,
            zero_point: *zero_point,
            values_shape: values_shape.clone(),
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
                values_shape: values_shape.clone(),
            }
        }
    });
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

/// A storage pickled on its own (`torch.save(storage)`): a 1-D tensor over it.
fn bare_storage(name: String, id: usize, storages: &[StorageInfo]) -> Result<TensorInfo> {
    let s = storages
        .get(id)
        .ok_or_else(|| tensor_err(&name, "storage index"))?;
    Ok(TensorInfo {
        name,
        dtype: s.dtype,
        shape: vec![s.numel],
        stride: vec![1],
        storage_offset: 0,
        storage: Some(id),
        numel: s.numel,
        nbytes: s.nbytes,
        requires_grad: false,
        conj: false,
        neg: false,
        quantization: None,
    })
}

/// A zip behind other bytes: torch.load reads such a file as a pickle
/// stream from its first byte. The globals of the pickles it would run
/// there are listed first (under the record `(bytes before the zip)`), and
/// under the strict policy they must be allowed too: a code-running pickle
/// followed by a real checkpoint is refused, as torch refuses it.
fn leading_globals(data: &[u8], opts: &OpenOptions) -> Result<Vec<GlobalRef>> {
    let report = crate::scan::scan_bytes(data, &opts.limits);
    let stream = report
        .pickles
        .iter()
        .filter(|p| p.reachable && matches!(p.source, crate::scan::PickleSource::Stream { .. }));
    let globals: Vec<GlobalRef> = stream
        .flat_map(|p| &p.globals)
        .map(|g| GlobalRef {
            module: g.module.clone(),
            name: g.name.clone(),
            record: "(bytes before the zip)".into(),
            offset: g.offset,
            torch_allowed: crate::torch::policy::torch_allows(&g.module, &g.name),
            called: g.usage == crate::scan::Usage::Called,
            instantiated: g.usage == crate::scan::Usage::Instantiated,
        })
        .collect();
    if opts.policy != Policy::Strict {
        return Ok(globals);
    }
    let refused: Vec<String> = globals
        .iter()
        .filter(|g| {
            !g.torch_allowed
                && (crate::torch::policy::always_blocked(&g.module)
                    || !opts.allowed_globals.contains(&g.path()))
        })
        .map(GlobalRef::path)
        .collect();
    match refused.first() {
        None => Ok(globals),
        Some(first) => Err(Error::new(
            ErrorKind::UnsupportedGlobal,
            format!(
                "Unsupported global: GLOBAL {first} was not an allowed global by default; the \
                 file does not start with a zip header, so torch.load unpickles the bytes before \
                 the archive, which name {}",
                refused.join(", ")
            ),
        )),
    }
}
