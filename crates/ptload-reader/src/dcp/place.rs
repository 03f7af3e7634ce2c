//! `.metadata`'s entries placed and checked before any data is read:
//! each chunk and item with exactly one storage entry, each entry's file a
//! plain name in the directory and its byte range inside that file, the
//! chunks of a tensor tiling it with no overlap and no gap.

use super::*;

/// Storage entries by (key, chunk offsets).
pub(super) type Entries<'r> = HashMap<(&'r str, Option<&'r [u64]>), &'r RawStorage>;

/// The storage entries by (key, chunk offsets), no two for one chunk.
pub(super) fn storage_entries(storages: &[RawStorage]) -> Result<Entries<'_>> {
    let mut entries: Entries<'_> = HashMap::new();
    for s in storages {
        if entries
            .insert((s.fqn.as_str(), s.offset.as_deref()), s)
            .is_some()
        {
            return Err(geometry(format!(
                "two storage entries for the chunk at {:?}",
                // No offsets: the chunk starts at the origin.
                s.offset.as_deref().unwrap_or(&[])
            ))
            .for_tensor(&s.fqn));
        }
    }
    Ok(entries)
}

/// Places storage entries in the files they name, opening each file the
/// first time an entry names it, and counts the entries placed.
pub(super) struct Placer<'a> {
    pub(super) limits: &'a Limits,
    pub(super) open: &'a mut dyn FnMut(&str) -> Result<Source>,
    pub(super) files: Vec<(String, Source)>,
    pub(super) file_at: HashMap<String, usize>,
    pub(super) used: usize,
}

impl Placer<'_> {
    /// Where the bytes of the storage entry `s` of the item `key` lie.
    pub(super) fn place(&mut self, key: &str, s: &RawStorage) -> Result<Piece> {
        self.used += 1;
        let transform = transform_of(key, s)?;
        let file = self.file_index(key, &s.relative_path)?;
        let len = self.files.get(file).map_or(0, |(_, src)| src.bytes().len()) as u64;
        match s.start.checked_add(s.length) {
            // A chunk of no elements has no bytes.
            Some(end) if end <= len => {}
            _ => {
                return Err(geometry(format!(
                    "its bytes {}..{} lie outside {} ({len} bytes)",
                    s.start,
                    s.start.saturating_add(s.length),
                    s.relative_path
                ))
                .for_tensor(key)
                .at(s.start))
            }
        }
        Ok(Piece {
            file,
            offset: s.start,
            length: s.length,
            transform,
        })
    }

    /// The index of the file `path` in `files`, opened if it is not yet.
    pub(super) fn file_index(&mut self, key: &str, path: &str) -> Result<usize> {
        if let Some(&i) = self.file_at.get(path) {
            return Ok(i);
        }
        plain_file(path).map_err(|e| e.for_tensor(key))?;
        if self.files.len() >= self.limits.max_set_files {
            return Err(Error::limit(
                "max_set_files",
                self.limits.max_set_files as u64,
            ));
        }
        let source = (self.open)(path).map_err(|e| e.for_tensor(key))?;
        self.files.push((path.to_owned(), source));
        self.file_at.insert(path.to_owned(), self.files.len() - 1);
        Ok(self.files.len() - 1)
    }
}

/// The stream transform the storage entry `s` of `key` names: none, or
/// `stream.zstd/1`.
pub(super) fn transform_of(key: &str, s: &RawStorage) -> Result<Transform> {
    match s.transforms.as_slice() {
        [] => Ok(Transform::None),
        [one]
            if one
                .split_once('/')
                .is_some_and(|(n, v)| n == "stream.zstd" && v.split('.').next() == Some("1")) =>
        {
            Ok(Transform::Zstd)
        }
        more => Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "its bytes in {} pass through the stream transforms {more:?}; \
                 only stream.zstd/1 is read",
                s.relative_path
            ),
        )
        .for_tensor(key)),
    }
}

/// The state dict's items placed: tensors with their chunks, bytes items,
/// and each name's index in `tensors` (`usize::MAX` for a bytes item).
pub(super) struct Items {
    pub(super) tensors: Vec<DcpTensor>,
    pub(super) bytes: Vec<(String, Piece)>,
    pub(super) by_name: HashMap<String, usize>,
}

/// Each item of the metadata checked and placed, in order; no name twice.
pub(super) fn place_items(
    raw_items: Vec<(String, RawItem)>,
    entries: &Entries<'_>,
    placer: &mut Placer<'_>,
    limits: &Limits,
) -> Result<Items> {
    let mut items = Items {
        tensors: Vec::new(),
        bytes: Vec::new(),
        by_name: HashMap::new(),
    };
    let mut work: u64 = 0;
    for (name, item) in raw_items {
        if items.by_name.contains_key(&name) {
            return Err(Error::new(ErrorKind::DuplicateName, "listed twice").for_tensor(&name));
        }
        match item {
            RawItem::Bytes => {
                let s = entries.get(&(name.as_str(), None)).ok_or_else(|| {
                    geometry("a bytes item with no storage entry").for_tensor(&name)
                })?;
                let piece = placer.place(&name, s)?;
                items.by_name.insert(name.clone(), usize::MAX);
                items.bytes.push((name, piece));
            }
            RawItem::Tensor {
                dtype,
                size,
                chunks: raw_chunks,
            } => {
                check_tiling(&name, &size, &raw_chunks, dtype, limits, &mut work)?;
                let chunks = place_chunks(&name, dtype, raw_chunks, entries, placer, limits)?;
                items.by_name.insert(name.clone(), items.tensors.len());
                items.tensors.push(DcpTensor {
                    name,
                    dtype,
                    shape: size,
                    chunks,
                });
            }
        }
    }
    Ok(items)
}

/// The chunks of the tensor `name`, each placed by its storage entry and
/// holding no more elements than its bytes can.
pub(super) fn place_chunks(
    name: &str,
    dtype: DType,
    raw_chunks: Vec<RawChunk>,
    entries: &Entries<'_>,
    placer: &mut Placer<'_>,
    limits: &Limits,
) -> Result<Vec<Chunk>> {
    let mut chunks = Vec::with_capacity(raw_chunks.len());
    for c in raw_chunks {
        let s = entries
            .get(&(name, Some(c.offsets.as_slice())))
            .ok_or_else(|| {
                geometry(format!("the chunk at {:?} has no storage entry", c.offsets))
                    .for_tensor(name)
            })?;
        let piece = placer.place(name, s)?;
        // Memory is only ever allocated for bytes present: a chunk's
        // elements lie in its range (or, through zstd, within the limit on
        // decompressed bytes).
        let room = match piece.transform {
            Transform::None => piece.length,
            Transform::Zstd => limits.max_decompressed_bytes,
        };
        let need = volume(&c.sizes).saturating_mul(dtype.size() as u64);
        if need > room {
            return Err(geometry(format!(
                "the chunk at {:?} has {need} bytes of elements, more than its \
                 {room} bytes in {}",
                c.offsets, s.relative_path
            ))
            .for_tensor(name));
        }
        chunks.push(Chunk {
            offsets: c.offsets,
            sizes: c.sizes,
            piece,
        });
    }
    Ok(chunks)
}

/// Saved without collectives: the copies higher ranks wrote of a chunk,
/// each placed, by (tensor, chunk); a copy of a chunk no metadata lists is
/// an error.
pub(super) fn place_copies(
    raw_copies: &[RawCopy],
    items: &Items,
    placer: &mut Placer<'_>,
) -> Result<HashMap<(usize, usize), Vec<RankCopy>>> {
    let mut copies: HashMap<(usize, usize), Vec<RankCopy>> = HashMap::new();
    for copy in raw_copies {
        let s = &copy.storage;
        // No offsets: the chunk starts at the origin.
        let offsets = s.offset.as_deref().unwrap_or(&[]);
        let found = items.by_name.get(&s.fqn).and_then(|&i| {
            let t: &DcpTensor = items.tensors.get(i)?;
            let c = t.chunks.iter().position(|c| c.offsets == offsets)?;
            Some((i, c))
        });
        let Some(at) = found else {
            return Err(geometry(format!(
                "rank {} wrote a chunk at {offsets:?} that no rank's metadata lists",
                copy.rank
            ))
            .for_tensor(&s.fqn));
        };
        let piece = placer.place(&s.fqn, s)?;
        copies
            .entry(at)
            .or_default()
            .push((copy.rank, copy.kept, piece));
    }
    Ok(copies)
}

/// Check that no two chunks or items read the same bytes: each torch
/// archive (or zstd frame) has a range of its own. Tensor chunks in the
/// safetensors format share their file's blob, so there the key tells them
/// apart: one chunk per tensor and blob.
pub(super) fn check_disjoint(
    files: &[(String, Source)],
    tensors: &[DcpTensor],
    bytes: &[(String, Piece)],
) -> Result<()> {
    let pieces = tensors
        .iter()
        .flat_map(|t| {
            t.chunks
                .iter()
                .map(move |c| (t.name.as_str(), c.piece, true))
        })
        .chain(bytes.iter().map(|(n, p)| (n.as_str(), *p, false)));
    // (file, start, end, key, in a blob)
    let mut ranges: Vec<(usize, u64, u64, &str, bool)> = Vec::new();
    for (name, piece, tensor) in pieces {
        let data = files.get(piece.file).map_or(&[][..], |(_, s)| s.bytes());
        let at = usize::try_from(piece.offset).unwrap_or(usize::MAX);
        let archive = data.get(at..).is_some_and(|b| b.starts_with(b"PK\x03\x04"));
        if tensor && piece.transform == Transform::None && !archive {
            ranges.push((
                piece.file,
                piece.offset,
                piece.offset.saturating_add(1),
                name,
                true,
            ));
        } else {
            let end = piece.offset.saturating_add(piece.length);
            ranges.push((piece.file, piece.offset, end, name, false));
        }
    }
    ranges.sort_unstable_by(|a, b| (a.0, a.1, a.3).cmp(&(b.0, b.1, b.3)));
    let mut last: Option<(usize, u64, u64, &str, bool)> = None;
    for r in ranges {
        if let Some(p) = last {
            let same_file = p.0 == r.0;
            let clash = if p.4 && r.4 {
                // Two chunks of one tensor in one blob.
                same_file && p.1 == r.1 && p.3 == r.3
            } else {
                same_file && r.1 < p.2
            };
            if clash {
                let file = files.get(r.0).map_or("", |(n, _)| n.as_str());
                return Err(geometry(format!(
                    "its bytes at {} in {file} are also those of {} at {}",
                    r.1, p.3, p.1
                ))
                .for_tensor(r.3));
            }
            // Keep the range that reaches furthest.
            if !(same_file && p.2 >= r.2 && !(p.4 && r.4)) {
                last = Some(r);
            }
        } else {
            last = Some(r);
        }
    }
    Ok(())
}

/// Check that `name` is a plain file name: never a path that could leave
/// the checkpoint's directory.
pub(super) fn plain_file(name: &str) -> Result<()> {
    let mut parts = Path::new(name).components();
    let plain = matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    ) && !name.contains(['/', '\\', '\0']);
    if plain {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::InvalidSpec,
            format!("relative_path {name:?} is not a file in the checkpoint's directory"),
        ))
    }
}
