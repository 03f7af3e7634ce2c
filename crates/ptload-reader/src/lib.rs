//! Read PyTorch checkpoints without Python, without libtorch, and without
//! executing the pickle.
//!
//! `ptload-reader` opens every layout `torch.save` and `torch.jit.save`
//! write (zip, legacy, TorchScript), decodes the pickle with a VM that never
//! imports or calls anything, and exposes tensors as zero-copy views into a
//! memory-mapped file.
//!
//! ```
//! use ptload_reader::Checkpoint;
//!
//! # fn main() -> Result<(), ptload_reader::Error> {
//! let ckpt = Checkpoint::open("../../fixtures/files/basic.pt")?;
//! for tensor in ckpt.tensors() {
//!     let bytes = tensor.data()?; // borrowed from the map when contiguous
//!     println!("{} {} {:?} {} bytes", tensor.name(), tensor.dtype(), tensor.shape(), bytes.len());
//! }
//! # assert!(!ckpt.is_empty());
//! # Ok(())
//! # }
//! ```
//!
//! Names follow one flattening convention: dict keys and sequence indices
//! joined with `.` (`optimizer.state.0.exp_avg`); a pickled `nn.Module`
//! yields its `state_dict()` names; other objects are named by attribute.
//! See `docs/formats.md` in the repository.
//!
//! Hostile input gives an [`Error`], never a panic: every length is checked
//! before use and every resource is bounded by [`Limits`].
#![deny(unsafe_code)]
#![warn(missing_docs)]
// Hostile input must give errors, never panics: no unwrap/expect/panic and
// no unchecked indexing in library code (tests may use them).
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod advice;
#[cfg(feature = "object-store")]
pub mod bucket;
mod bytes;
pub mod cast;
pub mod checkpoint;
mod container;
pub mod dcp;
pub mod engine;
mod error;
#[cfg(feature = "export")]
pub mod export;
mod fetched;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod glob;
#[cfg(feature = "http")]
pub mod http;
mod json;
mod limits;
pub mod merge;
mod name_index;
pub mod object;
mod pickle;
pub mod placement;
pub mod ranged;
pub mod read_plan;
pub mod remote;
#[cfg(feature = "scan")]
pub mod scan;
pub mod set;
#[allow(unsafe_code)]
pub(crate) mod source;
pub mod state_dict;
mod torch;
pub mod tp;
mod view;

// The root: what reading a checkpoint needs. Everything else is a public
// module: what a checkpoint holds besides tensors (`checkpoint`),
// placement, state-dict selection, export, casts, scanning, sets,
// distributed checkpoints, tensor parallelism (and `engine`, which gathers what an
// inference engine's weight store needs).
pub use checkpoint::{Checkpoint, OpenOptions};
pub use error::{Error, ErrorKind, Result};
pub use limits::Limits;
pub use torch::dtype::{DType, Element};
pub use torch::policy::Policy;
pub use torch::tensor::{StorageInfo, TensorInfo};
pub use view::TensorView;
