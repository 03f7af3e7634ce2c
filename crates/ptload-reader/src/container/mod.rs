//! The container layer: what kind of file this is, and where its records are.

mod detect;
pub(crate) mod layout;
pub(crate) mod legacy;
pub(crate) mod safetensors;
pub(crate) mod zip;

pub(crate) use detect::{detect, Detected, LEGACY_MAGIC_VALUE};
#[cfg(feature = "scan")]
pub(crate) use detect::{is_tar_header, python_int, tar_number};

/// The layout a checkpoint was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// The zip layout of `torch.save` (torch >= 1.6).
    Zip,
    /// The legacy stream of pickles (torch < 1.6, or
    /// `_use_new_zipfile_serialization=False`).
    Legacy,
    /// A TorchScript archive (`torch.jit.save`): data only, code never run.
    TorchScript,
    /// A `torch.distributed.checkpoint` directory, its chunks put together.
    Dcp,
    /// Per-rank `torch.save` files of a sharded model (FSDP2's DTensors,
    /// or their local shards), put together.
    Ranks,
    /// A safetensors file: a JSON header and the tensors' bytes, no pickle.
    Safetensors,
}

impl Format {
    /// `zip`, `legacy`, `torchscript`, `dcp`, `ranks` or `safetensors`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Zip => "zip",
            Format::Legacy => "legacy",
            Format::TorchScript => "torchscript",
            Format::Dcp => "dcp",
            Format::Ranks => "ranks",
            Format::Safetensors => "safetensors",
        }
    }
}
