//! Distributed checkpoints: a directory `torch.distributed.checkpoint`
//! (DCP) saved, read without torch.
//!
//! `dcp.save` writes a `.metadata` file (a pickle of torch's `Metadata`:
//! for every key of the state dict its dtype, global size and chunks, or a
//! bytes item; and for every chunk and item the file, offset and length of
//! its bytes) and `__R_T.distcp` files (one per rank and writer thread) in
//! which each chunk is a complete `torch.save` archive of that chunk, and
//! each bytes item a `torch.save` of the value, laid end to end.
//!
//! [`Dcp::open`] runs `.metadata` in the pickle VM with an interpreter that
//! knows exactly the DCP metadata classes (any other global is refused) and
//! checks everything before a byte of data is read: every chunk inside its
//! tensor's size, the chunks of a tensor tiling it with no overlap and no
//! gap, every chunk and item with exactly one storage entry, each entry's
//! file a plain name in the directory and its byte range inside that file.
//! Nothing is read at open but `.metadata`; a tensor's chunks are read when
//! it is asked for, and [`Dcp::read_region`] (a rank's slice) reads only the
//! chunks it overlaps.
//!
//! Reading them takes the feature `dcp` (on by default); without it a
//! DCP directory opened as a set is an error naming the feature, and only
//! [`fsdp`] (local parts in plain files) is here.
//!
//! ```
//! # fn main() -> Result<(), ptload_reader::Error> {
//! # #[cfg(feature = "dcp")] {
//! use ptload_reader::dcp::Dcp;
//! use ptload_reader::tp::Shard;
//!
//! let dcp = Dcp::open("../../fixtures/files/dcp/world4")?;
//! let t = dcp.tensor("layers.0.weight").unwrap();
//! assert_eq!(t.shape(), &[8, 6]);
//! let whole = dcp.read_tensor("layers.0.weight")?; // row-major, host order
//! assert_eq!(whole.len(), 8 * 6 * 4);
//! let (shape, part) = dcp.read_slice("layers.0.weight", 1, Shard::new(0, 3)?)?;
//! assert_eq!((shape, part.len()), (vec![8, 2], 8 * 2 * 4));
//! # }
//! # Ok(())
//! # }
//! ```

mod boxes;
pub mod fsdp;
mod hf;
#[cfg(feature = "dcp")]
mod metadata;
#[cfg(feature = "dcp")]
mod place;
#[cfg(feature = "dcp")]
mod read;

use std::path::Path;

#[cfg(feature = "dcp")]
use {
    crate::advice::Warning,
    crate::checkpoint::{Checkpoint, OpenOptions},
    crate::container::Format,
    crate::error::{Error, ErrorKind, Result},
    crate::limits::Limits,
    crate::source::{read_bounded, Source},
    crate::torch::dtype::DType,
    crate::torch::names::Scalar,
    crate::tp::Shard,
    std::collections::HashMap,
    std::path::PathBuf,
    std::sync::{Arc, Mutex},
};

#[cfg(feature = "dcp")]
use boxes::{copy_box, geometry, intersection, volume};
#[cfg(feature = "dcp")]
use metadata::{RawChunk, RawCopy, RawItem, RawStorage};
#[cfg(feature = "dcp")]
use place::*;
#[cfg(feature = "dcp")]
use read::Blob;

/// The name of a DCP directory's metadata file.
pub const METADATA_FILE: &str = ".metadata";

/// Whether `dir` is a DCP directory: it holds a `.metadata` file, or the
/// `__0.metadata` of a save without collectives (one per rank), or it is a
/// Hugging Face-format save (safetensors files whose headers place their
/// chunks, see [`Dcp::open`]).
pub fn is_dcp_dir(dir: &Path) -> bool {
    dir.is_dir()
        && (dir.join(METADATA_FILE).is_file()
            || dir.join(rank_metadata(0)).is_file()
            || hf::is_hf_dir(dir))
}

/// The metadata file rank `rank` writes when saved without collectives.
fn rank_metadata(rank: usize) -> String {
    format!("__{rank}{METADATA_FILE}")
}

/// Where one chunk's (or bytes item's) bytes lie.
#[cfg(feature = "dcp")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Index into [`Dcp::files`].
    pub file: usize,
    /// Byte offset in that file: of the chunk's archive, or of the
    /// safetensors blob that holds it.
    pub offset: u64,
    /// Its length in bytes (in the safetensors format, of the chunk's
    /// elements within the blob).
    pub length: u64,
    /// The stream transform its bytes pass through.
    pub transform: Transform,
}

/// A stream transform torch's `FileSystemWriter` extensions apply to each
/// item.
#[cfg(feature = "dcp")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transform {
    /// Stored as written.
    None,
    /// `stream.zstd/1`: one zstd frame per item.
    Zstd,
}

/// One chunk of a tensor: the box `offsets..offsets + sizes` of the global
/// tensor, and where its archive lies.
#[cfg(feature = "dcp")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Where the chunk starts, per dimension.
    pub offsets: Vec<u64>,
    /// Its sizes.
    pub sizes: Vec<u64>,
    /// Its bytes.
    pub piece: Piece,
}

/// A tensor of the checkpoint: its global dtype and shape, and its chunks.
#[cfg(feature = "dcp")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcpTensor {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    chunks: Vec<Chunk>,
}

#[cfg(feature = "dcp")]
impl DcpTensor {
    /// Its key in the state dict.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Global shape.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }
    /// The chunks, as the metadata lists them.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }
    /// Bytes of the whole tensor.
    pub fn nbytes(&self) -> u64 {
        volume(&self.shape).saturating_mul(self.dtype.size() as u64)
    }
}

/// A `torch.distributed.checkpoint` directory, checked and ready to read.
#[cfg(feature = "dcp")]
#[derive(Debug)]
pub struct Dcp {
    dir: PathBuf,
    files: Vec<(String, Source)>,
    tensors: Vec<DcpTensor>,
    /// Non-tensor items: key and where its pickle lies.
    bytes: Vec<(String, Piece)>,
    by_name: HashMap<String, usize>,
    opts: OpenOptions,
    protocol: u8,
    /// Safetensors blobs' headers, parsed once each, by (file, offset).
    blobs: Mutex<HashMap<(usize, u64), Arc<Blob>>>,
    /// Saved without collectives: the copies higher ranks wrote of a
    /// chunk (replicated tensors), by (tensor, chunk), each with the rank
    /// that wrote it and the rank whose copy the chunk is; compared with
    /// the chunk whenever it is read.
    copies: HashMap<(usize, usize), Vec<RankCopy>>,
}

/// A copy of a chunk another rank wrote: `(rank, rank whose copy is
/// read, its piece)`.
#[cfg(feature = "dcp")]
type RankCopy = (usize, usize, Piece);

#[cfg(feature = "dcp")]
impl Dcp {
    /// Open the DCP directory `dir` with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Dcp> {
        Dcp::open_with(dir, &OpenOptions::new())
    }

    /// Open `dir`; `opts` (limits, policy) apply to `.metadata` and to
    /// every chunk and item read later.
    pub fn open_with(dir: impl AsRef<Path>, opts: &OpenOptions) -> Result<Dcp> {
        let dir = dir.as_ref();
        let limits = opts.limits_ref();
        let meta_path = dir.join(METADATA_FILE);
        // No metadata file: a Hugging Face-format save, if the directory
        // holds safetensors files (whose headers then must place chunks).
        if !meta_path.is_file()
            && !dir.join(rank_metadata(0)).is_file()
            && hf::holds_safetensors(dir)
        {
            return Dcp::open_hf(dir, opts);
        }
        let (raw, meta_name) = if meta_path.is_file() || !dir.join(rank_metadata(0)).is_file() {
            let data = read_bounded(&meta_path, limits.max_pickle_bytes, "max_pickle_bytes")
                .map_err(|e| e.in_file(METADATA_FILE))?;
            let raw = metadata::decode(&data, limits).map_err(|e| e.in_file(METADATA_FILE))?;
            (raw, METADATA_FILE.to_owned())
        } else {
            // Saved without collectives: each rank described what it
            // wrote, in __R.metadata, R = 0, 1, ...
            let mut ranks = Vec::new();
            while dir.join(rank_metadata(ranks.len())).is_file() {
                if ranks.len() >= limits.max_set_files {
                    return Err(Error::limit("max_set_files", limits.max_set_files as u64));
                }
                let name = rank_metadata(ranks.len());
                let data = read_bounded(
                    &dir.join(&name),
                    limits.max_pickle_bytes,
                    "max_pickle_bytes",
                )
                .map_err(|e| e.in_file(&name))?;
                ranks.push(metadata::decode(&data, limits).map_err(|e| e.in_file(&name))?);
            }
            let Some(last) = ranks.len().checked_sub(1) else {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("{} is missing from {}", rank_metadata(0), dir.display()),
                ));
            };
            let files = format!("{} to {}", rank_metadata(0), rank_metadata(last));
            (
                metadata::merge(ranks).map_err(|e| e.in_file(&files))?,
                files,
            )
        };
        let mut open = |name: &str| -> Result<Source> {
            let path = dir.join(name);
            if !path.is_file() {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("{name} is missing from {}", dir.display()),
                ));
            }
            if opts.in_memory_ref() {
                Source::read(&path)
            } else {
                Source::map(&path)
            }
        };
        Dcp::build(dir, raw, opts, &mut open).map_err(|e| e.in_file(&meta_name))
    }

    /// A Hugging Face-format save: its metadata inferred from the files'
    /// headers, then checked as a `.metadata` is.
    fn open_hf(dir: &Path, opts: &OpenOptions) -> Result<Dcp> {
        Dcp::of_hf(dir, hf::read_dir(dir, opts)?, opts)
    }

    /// The Dcp of a Hugging Face-format save read.
    fn of_hf(dir: &Path, save: hf::HfSave, opts: &OpenOptions) -> Result<Dcp> {
        let hf::HfSave {
            raw,
            mut files,
            headers,
        } = save;
        let mut open = |name: &str| -> Result<Source> {
            files.remove(name).ok_or_else(|| {
                Error::new(
                    ErrorKind::Io,
                    format!("{name} is missing from {}", dir.display()),
                )
            })
        };
        let dcp = Dcp::build(dir, raw, opts, &mut open)?;
        // Each file's header is parsed already: the blobs chunks are read
        // from start with it.
        if let Ok(mut cache) = dcp.blobs.lock() {
            for (name, header, offsets) in headers {
                if let Some(file) = dcp.files.iter().position(|(n, _)| *n == name) {
                    cache.insert((file, 0), Arc::new(Blob::of(header, 0, offsets)));
                }
            }
        }
        Ok(dcp)
    }

    /// A DCP checkpoint held in memory: the bytes of its `.metadata` (or,
    /// saved without collectives, of each rank's `__R.metadata`, in rank
    /// order) and of each file they name, by name. With no metadata, a
    /// Hugging Face-format save: its `.safetensors` files, by name.
    pub fn from_memory(
        metadata: &[&[u8]],
        files: Vec<(String, Vec<u8>)>,
        opts: &OpenOptions,
    ) -> Result<Dcp> {
        if metadata.is_empty() {
            let mut files: Vec<(String, Source)> = files
                .into_iter()
                .map(|(n, b)| (n, Source::given(b)))
                .collect();
            files.sort_by(|a, b| a.0.cmp(&b.0));
            let save = hf::read_files(files, opts.limits_ref())?;
            return Dcp::of_hf(Path::new(""), save, opts);
        }
        let raw = match metadata {
            [one] => {
                metadata::decode(one, opts.limits_ref()).map_err(|e| e.in_file(METADATA_FILE))?
            }
            ranks => {
                let mut decoded = Vec::with_capacity(ranks.len());
                for (rank, data) in ranks.iter().enumerate() {
                    decoded.push(
                        metadata::decode(data, opts.limits_ref())
                            .map_err(|e| e.in_file(&rank_metadata(rank)))?,
                    );
                }
                metadata::merge(decoded)?
            }
        };
        let mut files: HashMap<String, Vec<u8>> = files.into_iter().collect();
        let mut open = |name: &str| -> Result<Source> {
            files
                .remove(name)
                .map(Source::given)
                .ok_or_else(|| Error::new(ErrorKind::Io, format!("{name} is missing")))
        };
        Dcp::build(Path::new(""), raw, opts, &mut open).map_err(|e| e.in_file(METADATA_FILE))
    }

    fn build(
        dir: &Path,
        raw: metadata::RawMetadata,
        opts: &OpenOptions,
        open: &mut dyn FnMut(&str) -> Result<Source>,
    ) -> Result<Dcp> {
        let limits = opts.limits_ref();
        let entries = storage_entries(&raw.storages)?;
        let mut placer = Placer {
            limits,
            open,
            files: Vec::new(),
            file_at: HashMap::new(),
            used: 0,
        };
        let items = place_items(raw.items, &entries, &mut placer, limits)?;
        let copies = place_copies(&raw.copies, &items, &mut placer)?;
        check_disjoint(&placer.files, &items.tensors, &items.bytes)?;
        if placer.used != raw.storages.len() + raw.copies.len() {
            return Err(geometry(format!(
                "{} storage entries name no chunk or item of the state dict",
                (raw.storages.len() + raw.copies.len()).saturating_sub(placer.used)
            )));
        }
        Ok(Dcp {
            dir: dir.to_path_buf(),
            files: placer.files,
            tensors: items.tensors,
            bytes: items.bytes,
            by_name: items.by_name,
            opts: opts.clone(),
            protocol: raw.protocol,
            blobs: Mutex::new(HashMap::new()),
            copies,
        })
    }

    /// The source of each file, for writers that must not overwrite them.
    pub(crate) fn sources(&self) -> impl Iterator<Item = &Source> + '_ {
        self.files.iter().map(|(_, s)| s)
    }

    /// The protocol of the `.metadata` pickle: 0 for a Hugging Face-format
    /// save, which holds no pickle (torch writes `.metadata` with protocol
    /// 2 or higher).
    pub fn pickle_protocol(&self) -> u8 {
        self.protocol
    }

    /// The directory it was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `.distcp` files the metadata names, by name, in the order
    /// [`Piece::file`] counts them.
    pub fn files(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.files.iter().map(|(n, _)| n.as_str())
    }

    /// The tensors, in the metadata's order.
    pub fn tensors(&self) -> &[DcpTensor] {
        &self.tensors
    }

    /// The tensor keyed `name`.
    pub fn tensor(&self, name: &str) -> Option<&DcpTensor> {
        self.tensors.get(*self.by_name.get(name)?)
    }

    /// The non-tensor items' keys, in the metadata's order.
    pub fn items(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.bytes.iter().map(|(n, _)| n.as_str())
    }

    /// Every tensor put together and every item's values, as one
    /// checkpoint held in memory. Its size is the whole model's.
    pub fn to_checkpoint(&self) -> Result<Checkpoint> {
        self.checkpoint(true)
    }

    /// Every tensor and every item's values, as one checkpoint whose
    /// tensors are put together from their chunks when their data is
    /// asked for (what [`crate::set::CheckpointSet`] opens for a DCP
    /// directory): a view's `data()` and `visit_bytes` read the tensor
    /// afresh each time and keep nothing, so a pass over every tensor
    /// holds one at a time; readers that borrow the storage's bytes
    /// (`storage_bytes`, `as_slice`) keep what they read.
    pub fn into_checkpoint(self: Arc<Self>) -> Result<Checkpoint> {
        let skeleton = self.checkpoint(false)?;
        // The metadata's tensors come first, in order; the items' tensors
        // after them hold their bytes already.
        let lazy: Vec<usize> = (0..self.tensors.len()).collect();
        let inputs = self.sources().cloned().collect();
        Ok(skeleton.with_lazy(self, &lazy)?.read_from(inputs))
    }

    /// Every tensor's name, dtype and shape without its data (tensors with
    /// no storage, as meta tensors are), and every item's values: what
    /// state-dict selection needs, for writers that then read each tensor
    /// (or each rank's region) from the chunks with
    /// [`read_region`](Self::read_region), in bounded memory
    /// ([`Export::dcp`](crate::export::Export::dcp)).
    pub fn skeleton(&self) -> Result<Checkpoint> {
        self.checkpoint(false)
    }

    fn checkpoint(&self, with_data: bool) -> Result<Checkpoint> {
        let mut parts = Vec::with_capacity(self.tensors.len());
        let mut values: Vec<(String, Scalar)> = Vec::new();
        let mut warnings = Vec::new();
        for t in &self.tensors {
            let bytes = if with_data {
                Some(self.read_tensor(&t.name)?)
            } else {
                None
            };
            parts.push((t.name.clone(), t.dtype, t.shape.clone(), bytes));
        }
        for (name, _) in &self.bytes {
            let item = self.read_item(name)?;
            let join = |inner: &str| {
                if inner.is_empty() {
                    name.clone()
                } else {
                    format!("{name}.{inner}")
                }
            };
            for (inner, v) in item.values() {
                values.push((join(inner), v.clone()));
            }
            for v in item.tensors() {
                let bytes = v.data().map_err(|e| e.for_tensor(name))?.into_owned();
                parts.push((join(v.name()), v.dtype(), v.shape().to_vec(), Some(bytes)));
            }
            warnings.extend(item.warnings().iter().map(|w| Warning::InPart {
                item: name.clone(),
                warning: Box::new(w.clone()),
            }));
        }
        Checkpoint::assembled(parts, values, warnings, self.protocol, Format::Dcp)
    }
}

/// Check that `chunks` lie inside `size` and tile it exactly: no overlap,
/// and volumes adding up to the whole. Overlaps are looked for by a sweep
/// along the first dimension, charged to `work` (bounded by the limits).
#[cfg(feature = "dcp")]
fn check_tiling(
    name: &str,
    size: &[u64],
    chunks: &[metadata::RawChunk],
    dtype: DType,
    limits: &Limits,
    work: &mut u64,
) -> Result<()> {
    let at = |m: String| geometry(m).for_tensor(name);
    let numel = size
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .ok_or_else(|| at(format!("its size {size:?} overflows")))?;
    numel
        .checked_mul(dtype.size() as u64)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| at(format!("its size {size:?} is too large")))?;
    let mut total: u64 = 0;
    for c in chunks {
        if c.offsets.len() != size.len() || c.sizes.len() != size.len() {
            return Err(at(format!(
                "a chunk at {:?} of size {:?} has another rank than the tensor's {size:?}",
                c.offsets, c.sizes
            )));
        }
        for ((&o, &s), &d) in c.offsets.iter().zip(&c.sizes).zip(size) {
            if o.checked_add(s).is_none_or(|e| e > d) {
                return Err(at(format!(
                    "the chunk at {:?} of size {:?} reaches past the tensor's size {size:?}",
                    c.offsets, c.sizes
                )));
            }
        }
        total = total.saturating_add(volume(&c.sizes));
    }
    // Sweep: chunks in order of their start along one dimension, each
    // compared with the earlier ones still open there. Along the dimension
    // with the most distinct starts (the sharded one), few are open at a
    // time: a tensor split among many ranks costs about one comparison a
    // chunk, not one per pair.
    let mut sweep = 0;
    if size.len() > 1 && chunks.len() > 1 {
        *work = work.saturating_add((size.len() as u64).saturating_mul(chunks.len() as u64));
        if *work > limits.max_walk_steps {
            return Err(Error::limit("max_walk_steps", limits.max_walk_steps).for_tensor(name));
        }
        let mut best = 0;
        for d in 0..size.len() {
            let mut starts: Vec<u64> = chunks
                .iter()
                .filter_map(|c| c.offsets.get(d).copied())
                .collect();
            starts.sort_unstable();
            starts.dedup();
            if starts.len() > best {
                best = starts.len();
                sweep = d;
            }
        }
    }
    let mut order: Vec<usize> = (0..chunks.len()).collect();
    let first = |i: usize| {
        chunks
            .get(i)
            .and_then(|c| c.offsets.get(sweep).zip(c.sizes.get(sweep)))
            .map_or((0, 0), |(&o, &s)| (o, o.saturating_add(s)))
    };
    order.sort_by_key(|&i| first(i).0);
    let mut open: Vec<usize> = Vec::new();
    for &i in &order {
        let Some(c) = chunks.get(i) else { continue };
        if volume(&c.sizes) == 0 {
            continue;
        }
        let start = first(i).0;
        open.retain(|&j| first(j).1 > start);
        *work = work.saturating_add(open.len() as u64 + 1);
        if *work > limits.max_walk_steps {
            return Err(Error::limit("max_walk_steps", limits.max_walk_steps).for_tensor(name));
        }
        for &j in &open {
            if let Some(d) = chunks.get(j) {
                if intersection(&c.offsets, &c.sizes, &d.offsets, &d.sizes).is_some() {
                    return Err(at(format!(
                        "the chunks at {:?} and {:?} overlap",
                        d.offsets, c.offsets
                    )));
                }
            }
        }
        open.push(i);
    }
    if total != numel {
        return Err(at(format!(
            "its chunks cover {total} of its {numel} elements",
        )));
    }
    Ok(())
}
