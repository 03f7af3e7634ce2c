//! Where the checkpoint's bytes live: a read-only memory map or an owned buffer.
//!
//! This is the only module of the reader with `unsafe` code.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};

/// The whole file's bytes. Cloning is cheap (shared).
#[derive(Clone)]
pub(crate) struct Source {
    inner: Arc<Inner>,
}

enum Inner {
    Mapped(memmap2::Mmap, File, std::path::PathBuf),
    Owned(Vec<u8>),
}

impl Source {
    pub(crate) fn map(path: &Path) -> Result<Source> {
        let file = File::open(path)
            .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(format!("cannot stat {}", path.display()), e))?
            .len();
        if len == 0 {
            // Mapping an empty file fails on some systems; nothing to map anyway.
            return Ok(Source::owned(Vec::new()));
        }
        // SAFETY: the map is read-only and private to this process. Another
        // process truncating or rewriting the file while it is mapped can make
        // reads fault or observe changing bytes; like every mmap-based loader
        // (safetensors, ripgrep) we accept that and document it: checkpoints
        // must not be modified while a `Checkpoint` is alive. All parsing of
        // the mapped bytes is bounds-checked, so changed contents give errors,
        // not undefined reads outside the map.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::io(format!("cannot map {}", path.display()), e))?;
        Ok(Source {
            inner: Arc::new(Inner::Mapped(map, file, path.to_path_buf())),
        })
    }

    pub(crate) fn owned(bytes: Vec<u8>) -> Source {
        Source {
            inner: Arc::new(Inner::Owned(bytes)),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match &*self.inner {
            Inner::Mapped(m, ..) => m,
            Inner::Owned(v) => v,
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

    /// The open file behind a map, for positioned reads.
    pub(crate) fn file(&self) -> Option<&File> {
        match &*self.inner {
            Inner::Mapped(_, f, _) => Some(f),
            Inner::Owned(_) => None,
        }
    }

    /// The path the map was opened from.
    pub(crate) fn path(&self) -> Option<&Path> {
        match &*self.inner {
            Inner::Mapped(_, _, p) => Some(p),
            Inner::Owned(_) => None,
        }
    }

    pub(crate) fn is_mapped(&self) -> bool {
        matches!(&*self.inner, Inner::Mapped(..))
    }
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("mapped", &self.is_mapped())
            .field("len", &self.bytes().len())
            .finish()
    }
}
