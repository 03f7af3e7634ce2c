//! Where the checkpoint's bytes live: a read-only memory map, an owned
//! buffer, or a file read by ranges (see `ranged`), of which parsing sees
//! only what was fetched.
//!
//! This is the only module of the reader with `unsafe` code.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ranged::{Extents, Fetcher, FileView};

/// The whole of a small file (an index, a metadata pickle), refused with
/// the limit `limit` when it holds more than `max` bytes: read up to one
/// byte past `max`, never more, whatever the file's size.
pub(crate) fn read_bounded(path: &Path, max: u64, limit: &'static str) -> Result<Vec<u8>> {
    use std::io::Read;
    let file =
        File::open(path).map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
    let mut out = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    if out.len() as u64 > max {
        return Err(Error::limit(limit, max));
    }
    Ok(out)
}

/// The file's bytes. Cloning is cheap (shared).
#[derive(Clone)]
pub(crate) struct Source {
    inner: Arc<Inner>,
}

// Which file a source is (and a handle of its own on it) is read by the
// writers (`export`: an output never overwrites an input).
#[cfg_attr(not(feature = "export"), allow(dead_code))]
enum Inner {
    /// A map of the file, the open file, and which file it is (taken when
    /// it was opened: a later `fstat` that fails cannot lose it).
    Mapped(memmap2::Mmap, File, Option<FileId>),
    /// Bytes held in memory; `identity` is the file they were read from.
    Owned(Vec<u8>, Option<FileId>),
    /// Bytes the caller owns and hands over (a static slice, an `Arc`, its
    /// own map): used where they are, never copied.
    Given(Box<dyn AsRef<[u8]> + Send + Sync>),
    /// A file read by ranges: what was fetched to parse it, and the reader
    /// that fetches the rest (tensors' bytes) when asked.
    /// `identity` is the local file read by positioned reads, if it is one.
    Ranged(Arc<Fetcher>, Arc<Extents>, Option<FileId>),
}

/// Which file this is, whatever path reaches it (device and inode on
/// Unix): what "the output is the input" compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    #[cfg(unix)]
    pub(crate) fn of(meta: &std::fs::Metadata) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt;
        Some(FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    #[cfg(not(unix))]
    pub(crate) fn of(_meta: &std::fs::Metadata) -> Option<FileId> {
        None
    }
}

impl Source {
    pub(crate) fn map(path: &Path) -> Result<Source> {
        let file = File::open(path)
            .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("cannot stat {}", path.display()), e))?;
        if meta.len() == 0 {
            // Mapping an empty file fails on some systems; nothing to map anyway.
            return Ok(Source::owned(Vec::new(), FileId::of(&meta)));
        }
        // SAFETY: the map is read-only and private to this process. Another
        // process truncating the file while it is mapped makes reads of the
        // lost pages raise SIGBUS, and rewriting it changes the bytes we
        // see; like every mmap-based loader (safetensors, ripgrep) we
        // document that checkpoints must not change while a `Checkpoint` is
        // alive, and offer `Source::read` (OpenOptions::in_memory) for
        // callers that cannot promise it. All parsing of the mapped bytes is
        // bounds-checked, so changed contents give errors, never reads
        // outside the map.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::io(format!("cannot map {}", path.display()), e))?;
        Ok(Source {
            inner: Arc::new(Inner::Mapped(map, file, FileId::of(&meta))),
        })
    }

    /// Read the whole file into memory: later changes to the file cannot
    /// reach the bytes we hold.
    pub(crate) fn read(path: &Path) -> Result<Source> {
        use std::io::Read;
        let mut file = File::open(path)
            .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("cannot stat {}", path.display()), e))?;
        // Sized by what the file says, but read to its real end: a file that
        // shrinks or grows meanwhile gives what was there.
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        file.read_to_end(&mut bytes)
            .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
        Ok(Source::owned(bytes, FileId::of(&meta)))
    }

    pub(crate) fn owned(bytes: Vec<u8>, identity: Option<FileId>) -> Source {
        Source {
            inner: Arc::new(Inner::Owned(bytes, identity)),
        }
    }

    /// Bytes the caller owns, used where they lie.
    pub(crate) fn given(bytes: impl AsRef<[u8]> + Send + Sync + 'static) -> Source {
        Source {
            inner: Arc::new(Inner::Given(Box::new(bytes))),
        }
    }

    /// Bytes fetched to parse a file read by ranges, and the reader.
    pub(crate) fn ranged(
        fetcher: Arc<Fetcher>,
        extents: Arc<Extents>,
        identity: Option<FileId>,
    ) -> Source {
        Source {
            inner: Arc::new(Inner::Ranged(fetcher, extents, identity)),
        }
    }

    /// The whole file. A file read by ranges has no whole bytes here (an
    /// empty slice, whose every read fails as past its end): it is read
    /// through [`view`](Self::view) and [`fetcher`](Self::fetcher).
    pub(crate) fn bytes(&self) -> &[u8] {
        match &*self.inner {
            Inner::Mapped(m, ..) => m,
            Inner::Owned(v, _) => v,
            Inner::Given(b) => (**b).as_ref(),
            Inner::Ranged(..) => &[],
        }
    }

    /// What parsing may read: the whole file, or the ranges fetched.
    pub(crate) fn view(&self) -> FileView<'_> {
        match &*self.inner {
            Inner::Ranged(_, e, _) => FileView::Fetched(e),
            _ => FileView::Whole(self.bytes()),
        }
    }

    /// What opening a file read by ranges fetched.
    #[cfg(feature = "scan")]
    pub(crate) fn extents(&self) -> Option<&Extents> {
        match &*self.inner {
            Inner::Ranged(_, e, _) => Some(e),
            _ => None,
        }
    }

    /// The reader of a file read by ranges.
    pub(crate) fn fetcher(&self) -> Option<&Fetcher> {
        match &*self.inner {
            Inner::Ranged(f, ..) => Some(f),
            _ => None,
        }
    }

    /// Hint how the map is about to be read. Parsing touches one header per
    /// record spread over the whole file: without the random hint the kernel
    /// maps 64 KiB around each, and resident memory after open would grow
    /// with the file's size rather than its number of records.
    pub(crate) fn advise(&self, random: bool) {
        if let Inner::Mapped(m, ..) = &*self.inner {
            let advice = if random {
                memmap2::Advice::Random
            } else {
                memmap2::Advice::Normal
            };
            // Only a hint: failure changes speed, never results.
            let _ = m.advise(advice);
        }
    }

    /// Let the kernel take back the map's resident pages (they stay in the
    /// page cache, and come back from the file if read again): a streaming
    /// conversion keeps only what it is copying resident, not every page
    /// it has read.
    #[cfg_attr(not(feature = "dcp"), allow(dead_code))]
    pub(crate) fn release(&self) {
        #[cfg(unix)]
        if let Inner::Mapped(m, ..) = &*self.inner {
            // SAFETY: `m` is a read-only map of a file, never written
            // through: MADV_DONTNEED drops its pages from this process, and
            // reading them again faults them back in from the file, so
            // every borrow of the map stays valid and sees the file's bytes.
            // Only a hint: failure changes memory use, never results.
            let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }

    /// Ask the kernel to start reading `len` bytes at `offset` of the map
    /// (whole pages around them), without waiting: the reads of a
    /// scattered map come in as few, large requests.
    pub(crate) fn prefetch(&self, offset: u64, len: u64) {
        if let Inner::Mapped(m, ..) = &*self.inner {
            let start = offset - offset % 4096;
            let (Ok(start), Ok(len)) = (
                usize::try_from(start),
                usize::try_from(offset - start + len),
            ) else {
                return;
            };
            if start < m.len() {
                let len = len.min(m.len() - start);
                // Only a hint: failure changes speed, never results.
                let _ = m.advise_range(memmap2::Advice::WillNeed, start, len);
            }
        }
    }

    /// The open file behind a map, for positioned reads.
    pub(crate) fn file(&self) -> Option<&File> {
        match &*self.inner {
            Inner::Mapped(_, f, _) => Some(f),
            Inner::Owned(..) | Inner::Given(_) | Inner::Ranged(..) => None,
        }
    }

    /// The file the bytes came from, if they came from one.
    #[cfg_attr(not(feature = "export"), allow(dead_code))]
    pub(crate) fn identity(&self) -> Option<FileId> {
        match &*self.inner {
            Inner::Mapped(.., id) => *id,
            Inner::Owned(_, id) => *id,
            Inner::Ranged(.., id) => *id,
            Inner::Given(_) => None,
        }
    }

    /// A handle of our own on the mapped file, with its own file position,
    /// for kernel copies: the same file we mapped (never reopened by path,
    /// which may name another file by now), or `None`.
    #[cfg_attr(not(feature = "export"), allow(dead_code))]
    pub(crate) fn private_handle(&self) -> Option<File> {
        let file = self.file()?;
        let reopened = reopen(file)?;
        let same = match (file.metadata(), reopened.metadata()) {
            (Ok(a), Ok(b)) => FileId::of(&a).is_some() && FileId::of(&a) == FileId::of(&b),
            _ => false,
        };
        same.then_some(reopened)
    }

    pub(crate) fn is_mapped(&self) -> bool {
        matches!(&*self.inner, Inner::Mapped(..))
    }
}

/// A new open file description for `file` (Linux: through `/proc/self/fd`,
/// which reaches the open file even when its path now names another).
#[cfg(target_os = "linux")]
#[cfg_attr(not(feature = "export"), allow(dead_code))]
fn reopen(file: &File) -> Option<File> {
    use std::os::fd::AsRawFd;
    File::open(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

#[cfg(not(target_os = "linux"))]
fn reopen(_file: &File) -> Option<File> {
    None
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("mapped", &self.is_mapped())
            .field("len", &self.view().len())
            .finish()
    }
}
