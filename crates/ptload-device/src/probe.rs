//! Which CUDA devices this machine has, without ever panicking.

use std::sync::Arc;

use cudarc::driver::CudaContext;

/// A CUDA device that can receive storages.
#[derive(Debug, Clone)]
pub struct Gpu {
    /// Ordinal (`cuda:N`).
    pub ordinal: u32,
    /// Device name from the driver.
    pub name: String,
    /// Total memory, bytes.
    pub total: u64,
    /// Free memory when probed, bytes.
    pub free: u64,
    pub(crate) ctx: Arc<CudaContext>,
}

/// What the machine offers for CUDA placement.
#[derive(Debug, Clone)]
pub enum Gpus {
    /// No CUDA driver library could be loaded.
    NoDriver,
    /// The driver is there but unusable (the message says why).
    Unusable(String),
    /// The usable devices (possibly none).
    Devices(Vec<Gpu>),
}

impl Gpu {
    /// The device's CUDA context (the primary context), for embedders that
    /// run their own work on the buffers ptload fills.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Gpus {
    /// The devices, or none.
    pub fn devices(&self) -> &[Gpu] {
        match self {
            Gpus::Devices(d) => d,
            _ => &[],
        }
    }

    /// Why there is no device, in words (for fallback reasons).
    pub fn why_none(&self) -> String {
        match self {
            Gpus::NoDriver => "no CUDA driver on this machine".into(),
            Gpus::Unusable(why) => format!("the CUDA driver is unusable: {why}"),
            Gpus::Devices(d) if d.is_empty() => "the CUDA driver reports no device".into(),
            Gpus::Devices(d) => format!("{} CUDA device(s)", d.len()),
        }
    }

    /// The device with this ordinal.
    pub fn get(&self, ordinal: u32) -> Option<&Gpu> {
        self.devices().iter().find(|g| g.ordinal == ordinal)
    }
}

/// Run a driver call, turning the panic cudarc raises when a driver symbol
/// cannot be loaded into an error.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "the driver library panicked".into());
        Err(text)
    })
}

/// Number of CUDA devices, without creating contexts; 0 when there is no
/// usable driver. Never panics.
pub fn device_count() -> usize {
    if !driver_present() {
        return 0;
    }
    guarded(|| CudaContext::device_count().map_err(|e| e.to_string()))
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0)
}

#[allow(unsafe_code)]
fn driver_present() -> bool {
    // SAFETY: is_culib_present only tries to open the driver library by its
    // usual names (dlopen) and drops it; it calls no driver function.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Probe every device: create its context and read its memory. Never panics.
pub fn probe() -> Gpus {
    if !driver_present() {
        return Gpus::NoDriver;
    }
    let result = guarded(|| {
        let n = match CudaContext::device_count() {
            Ok(n) => n,
            // A driver with no device says so from cuInit: that is "no
            // device", not an unusable driver.
            Err(e) if e.0 == cudarc::driver::sys::cudaError_enum::CUDA_ERROR_NO_DEVICE => 0,
            Err(e) => return Err(e.to_string()),
        };
        let mut gpus = Vec::new();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            let ctx = CudaContext::new(i).map_err(|e| format!("cuda:{i}: {e}"))?;
            let (free, total) = ctx.mem_get_info().map_err(|e| format!("cuda:{i}: {e}"))?;
            gpus.push(Gpu {
                ordinal: u32::try_from(i).map_err(|_| "device ordinal".to_owned())?,
                name: ctx.name().unwrap_or_else(|_| "CUDA device".into()),
                total: total as u64,
                free: free as u64,
                ctx,
            });
        }
        Ok(gpus)
    });
    match result {
        Ok(gpus) => Gpus::Devices(gpus),
        Err(why) => Gpus::Unusable(why),
    }
}
