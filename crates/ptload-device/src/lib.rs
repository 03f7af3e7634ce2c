//! Copy checkpoint storages to CUDA devices, with host fallback.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod probe;

pub use probe::{device_count, probe, Gpu, Gpus};
