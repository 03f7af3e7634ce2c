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
//! ```
//! # fn main() -> Result<(), ptload_reader::Error> {
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
//! # Ok(())
//! # }
//! ```

pub mod fsdp;
mod hf;
mod metadata;
mod place;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::checkpoint::{Checkpoint, OpenOptions};
use crate::container::Format;
use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::source::{read_bounded, Source};
use crate::torch::dtype::DType;
use crate::torch::names::Scalar;
use crate::tp::Shard;

use metadata::{RawChunk, RawCopy, RawItem, RawStorage};
use place::*;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcpTensor {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    chunks: Vec<Chunk>,
}

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
type RankCopy = (usize, usize, Piece);

/// The header of a safetensors blob that a file's tensor chunks share
/// (torch's `SerializationFormat.SAFETENSORS`).
#[derive(Debug)]
struct Blob {
    /// Offset of the blob's data in its file.
    data_start: u64,
    /// Each tensor: dtype name, shape, data offsets within the data.
    entries: HashMap<String, (String, Vec<u64>, u64, u64)>,
    /// `DCP_SHARDING_INFO`: each tensor's chunk offsets (none listed: each
    /// at the origin, as torch reads a blob without it).
    offsets: HashMap<String, Vec<u64>>,
}

impl Blob {
    /// The blob whose checked header is `header`, at `offset` in its file.
    fn of(
        header: crate::container::safetensors::Header,
        offset: u64,
        offsets: HashMap<String, Vec<u64>>,
    ) -> Blob {
        Blob {
            data_start: offset.saturating_add(header.data_start),
            entries: header
                .entries
                .into_iter()
                .map(|e| (e.name, (e.dtype, e.shape, e.begin, e.end)))
                .collect(),
            offsets,
        }
    }

    /// Where the blob places `name`'s chunk: its saved offsets, or the
    /// origin of a tensor of `dims` dimensions when none are listed.
    fn offsets_of(&self, name: &str, dims: usize) -> Vec<u64> {
        self.offsets
            .get(name)
            .cloned()
            .unwrap_or_else(|| vec![0; dims])
    }
}

/// The memory a chunk's archive is read from: a range of a file's map.
struct Range {
    source: Source,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for Range {
    fn as_ref(&self) -> &[u8] {
        self.source
            .bytes()
            .get(self.start..self.end)
            // Checked against the file when the range was made.
            .unwrap_or(&[])
    }
}

fn volume(dims: &[u64]) -> u64 {
    dims.iter().fold(1u64, |n, &d| n.saturating_mul(d))
}

fn geometry(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Tensor, message)
}

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

    /// `file at offset N`, as errors name a piece.
    fn place_of(&self, piece: Piece) -> String {
        let file = self.files.get(piece.file).map_or("", |(n, _)| n.as_str());
        format!("{file} at offset {}", piece.offset)
    }

    /// The file and the byte range of a piece, checked again.
    fn range(&self, piece: Piece) -> Result<Range> {
        let (name, source) = self
            .files
            .get(piece.file)
            .ok_or_else(|| geometry("no such file"))?;
        match (
            usize::try_from(piece.offset),
            piece.offset.checked_add(piece.length).map(usize::try_from),
        ) {
            (Ok(start), Some(Ok(end))) if end <= source.bytes().len() => Ok(Range {
                source: source.clone(),
                start,
                end,
            }),
            _ => Err(geometry("the range lies outside its file").in_file(name)),
        }
    }

    /// The piece as the checkpoint its (decompressed) bytes hold.
    fn archive(&self, piece: Piece) -> Result<Checkpoint> {
        let range = self.range(piece)?;
        let opened = match piece.transform {
            Transform::None => self.opts.open_bytes(range),
            Transform::Zstd => {
                let bytes = unzstd(range.as_ref(), self.opts.limits_ref())?;
                self.opts.open_bytes(bytes)
            }
        };
        opened.map_err(|e| e.in_file(&self.place_of(piece)))
    }

    /// The safetensors blob at `piece`'s offset, if the bytes there are one
    /// (a torch archive starts with a zip header instead).
    fn blob(&self, piece: Piece) -> Result<Option<Arc<Blob>>> {
        if piece.transform != Transform::None {
            return Ok(None);
        }
        let (_, source) = self
            .files
            .get(piece.file)
            .ok_or_else(|| geometry("no such file"))?;
        let at = usize::try_from(piece.offset).map_err(|_| geometry("offset too large"))?;
        let rest = crate::bytes::after(source.bytes(), at);
        if rest.starts_with(b"PK\x03\x04") || rest.len() < 9 {
            return Ok(None);
        }
        let mut cache = self
            .blobs
            .lock()
            .map_err(|_| geometry("a reader thread failed"))?;
        if let Some(b) = cache.get(&(piece.file, piece.offset)) {
            return Ok(Some(b.clone()));
        }
        let blob = parse_blob(rest, piece.offset, self.opts.limits_ref())
            .map_err(|e| e.in_file(&self.place_of(piece)))?;
        let Some(blob) = blob else { return Ok(None) };
        let blob = Arc::new(blob);
        cache.insert((piece.file, piece.offset), blob.clone());
        Ok(Some(blob))
    }

    /// Call `f` with the row-major, host-order bytes of chunk `c` (the
    /// `index`th) of `t`, the `at`th tensor; every copy another rank wrote
    /// of it (saved without collectives) must hold the same bytes.
    fn with_chunk(
        &self,
        (at, index): (usize, usize),
        t: &DcpTensor,
        c: &Chunk,
        f: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let Some(copies) = self.copies.get(&(at, index)) else {
            return self.with_piece(t, c, f);
        };
        self.with_piece(t, c, &mut |data| {
            for &(rank, kept, piece) in copies {
                let copy = Chunk {
                    offsets: c.offsets.clone(),
                    sizes: c.sizes.clone(),
                    piece,
                };
                self.with_piece(t, &copy, &mut |other| {
                    if other == data {
                        Ok(())
                    } else {
                        Err(geometry(format!(
                            "replicated, but rank {kept} and rank {rank} wrote different values \
                             for its chunk at {:?}",
                            c.offsets
                        ))
                        .for_tensor(&t.name))
                    }
                })?;
            }
            f(data)
        })
    }

    /// Call `f` with the row-major, host-order bytes of chunk `c` of `t`,
    /// read from its piece.
    fn with_piece(
        &self,
        t: &DcpTensor,
        c: &Chunk,
        f: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let name = t.name.as_str();
        let chunk_err = |m: String| {
            geometry(m)
                .for_tensor(name)
                .in_file(&self.place_of(c.piece))
        };
        if let Some(blob) = self.blob(c.piece)? {
            let Some((dtype, shape, begin, end)) = blob.entries.get(name) else {
                return Err(chunk_err(
                    "the safetensors blob there has no such tensor".into(),
                ));
            };
            if dtype != t.dtype.name() || shape != &c.sizes {
                return Err(chunk_err(format!(
                    "the safetensors blob there holds it as {dtype} {shape:?}, where the metadata says {} {:?}",
                    t.dtype, c.sizes
                )));
            }
            let placed = blob.offsets_of(name, c.offsets.len());
            if placed != c.offsets {
                return Err(chunk_err(format!(
                    "the safetensors blob there places it at {placed:?}, where the metadata says {:?}",
                    c.offsets
                )));
            }
            if end - begin != c.piece.length || cfg!(target_endian = "big") {
                return Err(chunk_err(format!(
                    "its {} bytes in the blob disagree with the metadata's {}",
                    end - begin,
                    c.piece.length
                )));
            }
            let (_, source) = self
                .files
                .get(c.piece.file)
                .ok_or_else(|| geometry("no such file"))?;
            let bytes = blob
                .data_start
                .checked_add(*begin)
                .zip(blob.data_start.checked_add(*end))
                .and_then(|(b, e)| Some((usize::try_from(b).ok()?, usize::try_from(e).ok()?)))
                .and_then(|(b, e)| source.bytes().get(b..e))
                .ok_or_else(|| chunk_err("its bytes lie outside the file".into()))?;
            return f(bytes);
        }
        let ckpt = self.archive(c.piece).map_err(|e| e.for_tensor(name))?;
        let view = match (ckpt.len(), ckpt.tensor_at(0)) {
            (1, Some(v)) => v,
            (n, _) => {
                return Err(chunk_err(format!(
                    "the chunk at {:?} holds {n} tensors, not one",
                    c.offsets
                )))
            }
        };
        if view.dtype() != t.dtype || view.shape() != c.sizes.as_slice() {
            return Err(chunk_err(format!(
                "the chunk at {:?} holds a {} tensor of shape {:?}, where the metadata says {} {:?}",
                c.offsets,
                view.dtype(),
                view.shape(),
                t.dtype,
                c.sizes
            )));
        }
        let data = view.data().map_err(|e| e.for_tensor(name))?;
        f(&data)
    }

    /// The non-tensor item keyed `name`, opened as the checkpoint its
    /// pickle is (with the directory's options and policy): its values, and
    /// any tensors it holds.
    pub fn read_item(&self, name: &str) -> Result<Checkpoint> {
        let piece = self
            .bytes
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, p)| p)
            .ok_or_else(|| Error::new(ErrorKind::Tensor, "no such item").for_tensor(name))?;
        self.archive(piece).map_err(|e| e.for_tensor(name))
    }

    /// The whole tensor keyed `name`, row-major in host byte order, put
    /// together from all its chunks.
    pub fn read_tensor(&self, name: &str) -> Result<Vec<u8>> {
        let t = self.require(name)?;
        let zeros = vec![0; t.shape.len()];
        self.read_region(name, &zeros, &t.shape)
    }

    /// Rank `shard.rank`'s part of the tensor keyed `name` along `dim`, as
    /// `torch.tensor_split(t, shard.world, dim)` cuts it: its shape and
    /// bytes. Only the chunks it overlaps are read.
    pub fn read_slice(&self, name: &str, dim: usize, shard: Shard) -> Result<(Vec<u64>, Vec<u8>)> {
        let t = self.require(name)?;
        let size = *t.shape.get(dim).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidSpec,
                format!("no dimension {dim}: it has {}", t.shape.len()),
            )
            .for_tensor(name)
        })?;
        let (start, len) = shard.part(size);
        let mut offsets = vec![0; t.shape.len()];
        let mut sizes = t.shape.clone();
        if let (Some(o), Some(s)) = (offsets.get_mut(dim), sizes.get_mut(dim)) {
            *o = start;
            *s = len;
        }
        let bytes = self.read_region(name, &offsets, &sizes)?;
        Ok((sizes, bytes))
    }

    fn require(&self, name: &str) -> Result<&DcpTensor> {
        self.tensor(name)
            .ok_or_else(|| Error::new(ErrorKind::Tensor, "no such tensor").for_tensor(name))
    }

    /// The box `offsets..offsets + sizes` of the tensor keyed `name`,
    /// row-major in host byte order; only the chunks it overlaps are read.
    pub fn read_region(&self, name: &str, offsets: &[u64], sizes: &[u64]) -> Result<Vec<u8>> {
        let t = self.require(name)?;
        let bad = || {
            Error::new(
                ErrorKind::InvalidSpec,
                format!(
                    "the region at {offsets:?} of size {sizes:?} is not inside its shape {:?}",
                    t.shape
                ),
            )
            .for_tensor(name)
        };
        if offsets.len() != t.shape.len() || sizes.len() != t.shape.len() {
            return Err(bad());
        }
        for ((&o, &s), &d) in offsets.iter().zip(sizes).zip(&t.shape) {
            if o.checked_add(s).is_none_or(|e| e > d) {
                return Err(bad());
            }
        }
        let elem = t.dtype.size() as u64;
        let nbytes = volume(sizes)
            .checked_mul(elem)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(bad)?;
        let at = self.by_name.get(name).copied().unwrap_or(usize::MAX);
        let mut out = vec![0u8; nbytes];
        for (index, c) in t.chunks.iter().enumerate() {
            if intersection(&c.offsets, &c.sizes, offsets, sizes).is_none() {
                continue;
            }
            self.with_chunk((at, index), t, c, &mut |data| {
                copy_box(data, &c.offsets, &c.sizes, &mut out, offsets, sizes, elem)
                    .map_err(|e| e.for_tensor(name))
            })?;
        }
        Ok(out)
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
    /// ([`crate::export::write_dcp_safetensors_file`]).
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
            warnings.extend(item.warnings().iter().map(|w| format!("{name}: {w}")));
        }
        Checkpoint::assembled(parts, values, warnings, self.protocol, Format::Dcp)
    }
}

/// One zstd frame: this build reads none (the `zstd` feature is off).
#[cfg(not(feature = "zstd"))]
fn unzstd(_data: &[u8], _limits: &Limits) -> Result<Vec<u8>> {
    Err(Error::new(
        ErrorKind::Unsupported,
        "zstd: this build of ptload-reader reads no stream.zstd/1 items \
         (built without its `zstd` feature)",
    ))
}

/// One zstd frame, decompressed within the limit on decompressed bytes.
#[cfg(feature = "zstd")]
fn unzstd(data: &[u8], limits: &Limits) -> Result<Vec<u8>> {
    use std::io::Read;
    let zstd = |m: String| Error::new(ErrorKind::Unsupported, format!("zstd: {m}"));
    let max = limits.max_decompressed_bytes;
    let mut decoder =
        ruzstd::decoding::StreamingDecoder::new(data).map_err(|e| zstd(e.to_string()))?;
    let mut out = Vec::new();
    (&mut decoder)
        .take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| zstd(e.to_string()))?;
    if out.len() as u64 > max {
        return Err(Error::limit("max_decompressed_bytes", max));
    }
    let rest = decoder.into_inner();
    if !rest.is_empty() {
        return Err(zstd(format!("{} bytes after the frame", rest.len())));
    }
    Ok(out)
}

/// The safetensors blob at the start of `rest` (at `offset` in its file),
/// its header checked as any safetensors file's is (its data reaching the
/// end of the file): `None` when the bytes are not one.
fn parse_blob(rest: &[u8], offset: u64, limits: &Limits) -> Result<Option<Blob>> {
    if rest.get(8) != Some(&b'{') {
        return Ok(None);
    }
    let header = crate::container::safetensors::parse(rest.into(), limits, |name| {
        DType::from_safetensors_name(name).map(|d| d.size() as u64)
    })?;
    let offsets = hf::saved_offsets(&header)?;
    Ok(Some(Blob::of(header, offset, offsets)))
}

/// The box two boxes share, as `(start, end)` per dimension; `None` when
/// they share no element.
fn intersection(ao: &[u64], asz: &[u64], bo: &[u64], bsz: &[u64]) -> Option<Vec<(u64, u64)>> {
    let mut out = Vec::with_capacity(ao.len());
    for (((&a, &an), &b), &bn) in ao.iter().zip(asz).zip(bo).zip(bsz) {
        let lo = a.max(b);
        let hi = a.saturating_add(an).min(b.saturating_add(bn));
        if hi <= lo {
            return None;
        }
        out.push((lo, hi));
    }
    Some(out)
}

/// Check that `chunks` lie inside `size` and tile it exactly: no overlap,
/// and volumes adding up to the whole. Overlaps are looked for by a sweep
/// along the first dimension, charged to `work` (bounded by the limits).
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

/// Copy the elements `src` (the row-major box at `so` of sizes `ss`) shares
/// with `dst` (the row-major box at `d_o` of sizes `ds`) into `dst`.
fn copy_box(
    src: &[u8],
    so: &[u64],
    ss: &[u64],
    dst: &mut [u8],
    d_o: &[u64],
    ds: &[u64],
    elem: u64,
) -> Result<()> {
    let fail = || geometry("a chunk's bytes do not match its size");
    if volume(ss).checked_mul(elem) != Some(src.len() as u64) {
        return Err(fail());
    }
    let Some(common) = intersection(so, ss, d_o, ds) else {
        return Ok(());
    };
    let n = common.len();
    // Row-major strides (in elements) of both boxes.
    let strides = |sizes: &[u64]| {
        let mut out = vec![1u64; sizes.len()];
        let mut acc = 1u64;
        for (s, &d) in out.iter_mut().zip(sizes).rev() {
            *s = acc;
            acc = acc.saturating_mul(d);
        }
        out
    };
    let (sst, dst_st) = (strides(ss), strides(ds));
    let (row_lo, row_hi) = common.last().copied().unwrap_or((0, 1));
    let row_bytes = usize::try_from((row_hi - row_lo).saturating_mul(elem)).map_err(|_| fail())?;
    // The index over all dimensions but the last, as an odometer.
    let lead = n.saturating_sub(1);
    let mut idx: Vec<u64> = common.iter().take(lead).map(|&(lo, _)| lo).collect();
    loop {
        let mut s_at = 0u64;
        let mut d_at = 0u64;
        for d in 0..n {
            let i = if d < lead {
                idx.get(d).copied().unwrap_or(0)
            } else {
                row_lo
            };
            let (a, b) = (so.get(d), d_o.get(d));
            let (sa, sb) = (sst.get(d), dst_st.get(d));
            match (a, b, sa, sb) {
                (Some(&a), Some(&b), Some(&sa), Some(&sb)) => {
                    s_at = s_at.saturating_add((i - a).saturating_mul(sa));
                    d_at = d_at.saturating_add((i - b).saturating_mul(sb));
                }
                _ => return Err(fail()),
            }
        }
        let s_at = usize::try_from(s_at.saturating_mul(elem)).map_err(|_| fail())?;
        let d_at = usize::try_from(d_at.saturating_mul(elem)).map_err(|_| fail())?;
        let from = src
            .get(s_at..s_at.saturating_add(row_bytes))
            .ok_or_else(fail)?;
        dst.get_mut(d_at..d_at.saturating_add(row_bytes))
            .ok_or_else(fail)?
            .copy_from_slice(from);
        // Next row.
        let mut d = lead;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            let (Some(v), Some(&(lo, hi))) = (idx.get_mut(d), common.get(d)) else {
                return Err(fail());
            };
            *v += 1;
            if *v < hi {
                break;
            }
            *v = lo;
        }
    }
}

/// The tensors of a DCP checkpoint, read on demand: storage `k` is the
/// `k`th tensor of the metadata.
impl crate::checkpoint::LazyStorages for Dcp {
    fn read(&self, index: usize) -> Result<Vec<u8>> {
        let name = self
            .tensors
            .get(index)
            .map(|t| t.name.clone())
            .ok_or_else(|| geometry(format!("no tensor {index}")))?;
        let bytes = self.read_tensor(&name);
        // The tensor is copied out: the pages of the mapped files it was
        // read from need not stay in this process's resident memory.
        for source in self.sources() {
            source.release();
        }
        bytes
    }
}
