//! Writing a state dict as a safetensors file, streamed from the memory
//! map: memory use does not grow with the file.
//!
//! Each write is planned first (`plan` decides every tensor's
//! dtype, size and place, and the header, before a byte is written), then
//! streamed (`write`: from the map, by the kernel from the checkpoint's
//! file, from a distributed checkpoint's chunks, from merged rank files);
//! `output` makes files safely (never the input, never clobbering, never
//! half-written) and `header` serializes the JSON.

mod builder;
mod header;
mod output;
mod plan;
mod write;

pub use builder::Export;

use crate::error::{Error, ErrorKind, Result};
use crate::torch::dtype::DType;

/// Told how many bytes each step of long work wrote or placed (for
/// progress bars).
pub type Progress = std::sync::Arc<dyn Fn(u64) + Send + Sync>;

/// Options for an [`Export`].
#[derive(Clone, Default)]
pub struct SafetensorsOptions {
    /// Convert floating tensors to this dtype.
    pub dtype: Option<DType>,
    /// Skip tensors safetensors cannot hold (complex32/128, packed float4,
    /// meta tensors) instead of failing; each is reported.
    pub skip_unsupported: bool,
    /// Told the bytes of each tensor written (for progress bars).
    pub progress: Option<Progress>,
    /// [`Export::to_file`] and [`Export::to_shards`] replace an existing
    /// regular file only when this is set (never a file being read).
    pub overwrite: bool,
    /// Set from another thread (a Ctrl-C handler) to stop the write: it
    /// ends with [`ErrorKind::Cancelled`] and leaves no partial file.
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// What goes to `__metadata__` besides `{"format": "pt"}` (which
    /// loaders such as Hugging Face's look for) and each quantized tensor's
    /// parameters (which its integers need).
    pub metadata: Metadata,
}

/// The plain values (epoch, args, config, ...) written to `__metadata__`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Metadata {
    /// None: only the format marker and quantization parameters.
    None,
    /// Those of the selected sub-tree: the values under `key` (named
    /// without it; [`StateDict::key`](crate::state_dict::StateDict::key)),
    /// or every value when `key` is `None` (the whole file was selected).
    Selected {
        /// The selection's key.
        key: Option<String>,
    },
    /// Every plain value in the file, under its full name.
    #[default]
    All,
}

impl SafetensorsOptions {
    fn check_cancel(&self) -> Result<()> {
        match &self.cancel {
            Some(flag) if flag.load(std::sync::atomic::Ordering::Relaxed) => {
                Err(Error::new(ErrorKind::Cancelled, "the write was cancelled"))
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Debug for SafetensorsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsOptions")
            .field("dtype", &self.dtype)
            .field("skip_unsupported", &self.skip_unsupported)
            .field("progress", &self.progress.is_some())
            .field("overwrite", &self.overwrite)
            .field("cancel", &self.cancel)
            .field("metadata", &self.metadata)
            .finish()
    }
}

/// What an [`Export`] wrote.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Written {
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub bytes: u64,
    /// Plain values written to `__metadata__`.
    pub metadata: usize,
    /// The tensors left out ([`SafetensorsOptions::skip_unsupported`]).
    pub skipped: Vec<Skipped>,
    /// Values left out of `__metadata__` because they are arguments of a
    /// call the file asks for (`os.system("...")`), not plain data: each
    /// `(name, callable)` ([`Checkpoint::value_call`](crate::Checkpoint::value_call)).
    pub metadata_left_out: Vec<(String, String)>,
}

/// Whether safetensors has a dtype for `d` (0.8 names match ptload's).
pub fn safetensors_dtype(d: DType) -> Option<&'static str> {
    match d {
        DType::C32 | DType::C128 | DType::F4E2M1X2 => None,
        other => Some(other.name()),
    }
}

/// What [`Export::to_shards`] wrote: each file with what it holds.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct WrittenSet {
    /// The shard files, in order, each with what it holds.
    pub files: Vec<(std::path::PathBuf, Written)>,
    /// The index (`model.safetensors.index.json`), when there is more
    /// than one shard.
    pub index: Option<std::path::PathBuf>,
    /// The tensors left out ([`SafetensorsOptions::skip_unsupported`]).
    pub skipped: Vec<Skipped>,
}

/// A tensor an export left out, and why; its `Display` is `name: why`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Skipped {
    /// Its name in the output.
    pub name: String,
    /// Why safetensors cannot hold it.
    pub why: Unwritable,
}

/// Why safetensors cannot hold a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unwritable {
    /// A meta tensor: it has no data.
    NoData,
    /// safetensors has no dtype for it (complex32/128, packed float4).
    NoDtype(DType),
}

impl std::fmt::Display for Unwritable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unwritable::NoData => f.write_str("a meta tensor has no data"),
            Unwritable::NoDtype(d) => write!(f, "safetensors has no {d} dtype"),
        }
    }
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.name, self.why)
    }
}
