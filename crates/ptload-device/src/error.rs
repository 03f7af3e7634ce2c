//! Why a load, or reading a loaded tensor back, failed.

/// Why a load failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Strict mode: a planned device does not exist.
    #[error("{0}")]
    Strict(String),
    /// Reading the checkpoint failed.
    #[error(transparent)]
    Reader(#[from] ptload_reader::Error),
    /// The CUDA driver failed (other than running out of memory).
    #[error("cuda:{ordinal}: {message}")]
    Cuda {
        /// The device.
        ordinal: u32,
        /// The driver's message.
        message: String,
    },
    /// A tensor was asked for where it is not (its host bytes while it is
    /// on a GPU, a selection entry the checkpoint does not have).
    #[error("{0}")]
    Access(String),
    /// [`LoadOptions::cancel`](crate::LoadOptions::cancel) was set before the load finished.
    #[error("the load was cancelled")]
    Cancelled,
}
