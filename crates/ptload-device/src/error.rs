//! The device crate's errors and the reasons a storage stays on the host,
//! as values: each front end words them (`Display` gives this crate's).

use std::fmt;

use ptload_reader::advice::{Hint, Neutral, Terms};

/// The class of a device failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceErrorKind {
    /// The CUDA driver reported an error.
    Driver,
    /// The device could not be opened (busy, in exclusive use, failed).
    Unopened,
    /// A read asked for bytes outside a storage.
    OutOfRange,
}

/// A failure of the CUDA device layer: what, and on which device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceError {
    kind: DeviceErrorKind,
    ordinal: Option<u32>,
    message: String,
}

impl DeviceError {
    pub(crate) fn new(kind: DeviceErrorKind, ordinal: Option<u32>, message: String) -> Self {
        DeviceError {
            kind,
            ordinal,
            message,
        }
    }

    /// The class of failure.
    pub fn kind(&self) -> DeviceErrorKind {
        self.kind
    }

    /// The device concerned (`cuda:N`), when one is.
    pub fn ordinal(&self) -> Option<u32> {
        self.ordinal
    }

    /// What went wrong (the driver's message), without the device.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.ordinal) {
            (DeviceErrorKind::Unopened, Some(o)) => {
                write!(f, "cuda:{o} could not be opened: {}", self.message)
            }
            (_, Some(o)) => write!(f, "cuda:{o}: {}", self.message),
            (_, None) => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for DeviceError {}

/// Why the machine offers no CUDA device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NoGpu {
    /// No CUDA driver library could be loaded.
    NoDriver,
    /// The driver is there but unusable: its message.
    Unusable(String),
    /// The driver reports no device.
    NoneReported,
}

impl fmt::Display for NoGpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoGpu::NoDriver => f.write_str("no CUDA driver on this machine"),
            NoGpu::Unusable(why) => write!(f, "the CUDA driver is unusable: {why}"),
            NoGpu::NoneReported => f.write_str("no CUDA device (the driver reports none)"),
        }
    }
}

/// Why a storage planned on a GPU stays on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fallback {
    /// The machine has GPUs, but not `cuda:ordinal`.
    NoSuchDevice {
        /// The device planned.
        ordinal: u32,
        /// How many devices there are.
        count: usize,
    },
    /// The machine offers no GPU.
    NoDevice(NoGpu),
    /// The device could not be opened.
    Unopened(DeviceError),
    /// The device lacks the memory.
    OutOfMemory {
        /// The device.
        ordinal: u32,
        /// Its free memory when that was known, bytes.
        free: Option<u64>,
        /// The driver's message, when the allocation itself failed.
        message: Option<String>,
    },
    /// The storage was not uploaded for another reason (its device failed
    /// first).
    NotUploaded,
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fallback::NoSuchDevice { ordinal, count } => {
                write!(f, "cuda:{ordinal} does not exist ({count} CUDA device(s))")
            }
            Fallback::NoDevice(why) => why.fmt(f),
            Fallback::Unopened(e) => e.fmt(f),
            Fallback::OutOfMemory {
                ordinal,
                free,
                message,
            } => {
                write!(f, "out of memory on cuda:{ordinal}")?;
                match (free, message) {
                    (_, Some(m)) => write!(f, ": {m}"),
                    (Some(free), None) => write!(f, " ({free} bytes free)"),
                    (None, None) => Ok(()),
                }
            }
            Fallback::NotUploaded => f.write_str("it was not uploaded"),
        }
    }
}

/// Why a load failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Strict mode: a planned device does not exist, with what to do.
    #[error("{}", render_strict(message, hint.as_ref(), &Neutral))]
    Strict {
        /// What is missing.
        message: String,
        /// What the caller could do about it.
        hint: Option<Hint>,
    },
    /// Strict mode: a planned device could not be opened.
    #[error(transparent)]
    Device(#[from] DeviceError),
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
    /// [`LoadOptions::cancel`](crate::LoadOptions::cancel) was set before
    /// the load finished.
    #[error("the load was cancelled")]
    Cancelled,
}

fn render_strict(message: &str, hint: Option<&Hint>, terms: &dyn Terms) -> String {
    match hint {
        Some(h) => format!("{message}{}", h.clause(terms)),
        // No hint: the message alone.
        None => message.to_owned(),
    }
}

impl LoadError {
    /// The error for a user, with hints in `terms` (a front end's words)
    /// and each source after a colon.
    pub fn render(&self, terms: &dyn Terms) -> String {
        match self {
            LoadError::Strict { message, hint } => render_strict(message, hint.as_ref(), terms),
            LoadError::Reader(e) => e.render(terms),
            other => other.to_string(),
        }
    }
}
