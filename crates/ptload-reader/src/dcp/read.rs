//! Reading a DCP checkpoint's data: a piece's bytes from its file (a
//! `torch.save` archive, a zstd frame or a chunk of a safetensors blob),
//! a chunk checked against the copies other ranks wrote, and a tensor,
//! slice or region assembled from the chunks it overlaps.

use std::collections::HashMap;
use std::sync::Arc;

use super::*;

/// The header of a safetensors blob that a file's tensor chunks share
/// (torch's `SerializationFormat.SAFETENSORS`).
#[derive(Debug)]
pub(super) struct Blob {
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
    pub(super) fn of(
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

impl Dcp {
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
