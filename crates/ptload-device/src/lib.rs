//! Load the storages of a PyTorch checkpoint onto CUDA devices, in
//! parallel, through cudarc, falling back to host memory (and saying why,
//! per tensor) when a device is missing or full.
//!
//! The CUDA driver is loaded dynamically: the same binary builds without a
//! CUDA toolkit and runs on machines with and without a driver. With no
//! driver, no device, or an ordinal past the device count, storages go to
//! the host (or, in strict mode, the load fails before copying anything).
//!
//! ```
//! use ptload_device::{load, probe, LoadOptions};
//! use ptload_reader::Checkpoint;
//! use ptload_reader::placement::{Device, DeviceMap, StorageRequest};
//! use ptload_reader::state_dict::StateDictOptions;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Shared: the result keeps it, host tensors stay slices of its map.
//! let ckpt = std::sync::Arc::new(Checkpoint::open("../../fixtures/files/multi_gpu.pt")?);
//! let selection = StateDictOptions::default().select(&ckpt)?;
//! // Saved on cuda:0..cuda:3. Embeddings stay on the host; everything
//! // else goes to cuda:0 (or falls back to the host, saying why).
//! let mut mapper = |s: &StorageRequest<'_>| {
//!     Some(if s.tensors.iter().any(|n| n.contains("embed")) { Device::Host } else { Device::Cuda(0) })
//! };
//! let plan = DeviceMap::new(&ckpt, &mut mapper)?;
//! let loaded = load(ckpt.clone(), &selection, &plan, &probe(), &LoadOptions::default())?;
//! for t in loaded.tensors() {
//!     match &t.fallback {
//!         Some(why) => println!("{} -> {} ({why})", t.info.name, t.device),
//!         None => println!("{} -> {}", t.info.name, t.device),
//!     }
//! }
//! // By name; on the host, row-major with offset and strides applied.
//! let embed = loaded.get("embed.weight").expect("tensor");
//! let values: Vec<f32> = loaded.host_vec(embed)?;
//! # assert_eq!(values.len() as u64, embed.info.shape.iter().product::<u64>());
//! # Ok(())
//! # }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]
// No unwrap/expect/panic and no unchecked indexing in library code.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

#[allow(unsafe_code)]
mod cuda;
#[allow(unsafe_code)]
mod driver;
mod error;
mod load;
mod loaded;
mod probe;
#[allow(unsafe_code)]
mod staging;

pub use cuda::{Arena, WorkerTime};
pub use error::{DeviceError, DeviceErrorKind, Fallback, LoadError, NoGpu};
pub use load::{load, upload_storages, LoadOptions};
pub use loaded::{CudaStorage, DeviceReport, HostStorage, Loaded, LoadedTensor, Placed};
pub use probe::{device_count, probe, Gpu, Gpus};
pub use staging::{release_staging, Fill, Pin, Staging};

/// The CUDA binding ptload uses, for engines that launch work on the
/// buffers it fills (same version, so its types match).
pub use cudarc;
