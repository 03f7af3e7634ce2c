//! Which CUDA devices this machine has, without ever panicking, and
//! without opening a context on any of them: a device's context is opened
//! the first time a load places something there.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext};

use crate::driver::{guarded, text, KeepCurrent};
use crate::error::{DeviceError, DeviceErrorKind, NoGpu};

/// A CUDA device that can receive storages.
#[derive(Debug, Clone)]
pub struct Gpu {
    /// Ordinal (`cuda:N`).
    pub ordinal: u32,
    /// Device name from the driver.
    pub name: String,
    /// Total memory, bytes.
    pub total: u64,
    ctx: Arc<OnceLock<Result<Context, String>>>,
}

/// A context ptload holds. Releasing the last reference to a primary
/// context makes cudarc bind it to the releasing thread first; this does
/// it without changing the thread's current context.
#[derive(Debug)]
struct Context(Option<Arc<CudaContext>>);

impl Drop for Context {
    fn drop(&mut self) {
        let _keep = KeepCurrent::new();
        let ctx = self.0.take();
        let _ = guarded(move || {
            drop(ctx);
            Ok(())
        });
    }
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
    /// The device's primary context, retained the first time it is asked
    /// for (by this call or by a load that places something here). The
    /// calling thread's current context is left as it was. An error says
    /// why the device cannot be opened (busy, in exclusive use, failed).
    pub fn context(&self) -> Result<&Arc<CudaContext>, DeviceError> {
        let opened = self.ctx.get_or_init(|| {
            let _keep = KeepCurrent::new();
            let ordinal = usize::try_from(self.ordinal).map_err(|_| "device ordinal".to_owned())?;
            guarded(|| {
                CudaContext::new(ordinal)
                    .map(|c| Context(Some(c)))
                    .map_err(text)
            })
        });
        let unopened = |why: &str| {
            DeviceError::new(
                DeviceErrorKind::Unopened,
                Some(self.ordinal),
                why.to_owned(),
            )
        };
        match opened {
            Ok(Context(Some(ctx))) => Ok(ctx),
            Ok(Context(None)) => Err(unopened("the context was released")),
            Err(why) => Err(unopened(why)),
        }
    }

    /// Free memory now, bytes (opens the device's context).
    pub fn free_memory(&self) -> Result<u64, DeviceError> {
        let ctx = self.context()?;
        let _keep = KeepCurrent::new();
        guarded(|| {
            ctx.mem_get_info()
                .map(|(free, _)| free as u64)
                .map_err(text)
        })
        .map_err(|e| DeviceError::new(DeviceErrorKind::Driver, Some(self.ordinal), e))
    }

    /// Whether ptload holds this device's context (a load placed something
    /// here, or [`Gpu::context`] was called).
    pub fn is_open(&self) -> bool {
        matches!(self.ctx.get(), Some(Ok(_)))
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

    /// Why there is no device; `None` when there are devices.
    pub fn none(&self) -> Option<NoGpu> {
        match self {
            Gpus::NoDriver => Some(NoGpu::NoDriver),
            Gpus::Unusable(why) => Some(NoGpu::Unusable(why.clone())),
            Gpus::Devices(d) if d.is_empty() => Some(NoGpu::NoneReported),
            Gpus::Devices(_) => None,
        }
    }

    /// Why there is no device, in words (or how many there are).
    pub fn why_none(&self) -> String {
        match self.none() {
            Some(why) => why.to_string(),
            None => format!("{} CUDA device(s)", self.devices().len()),
        }
    }

    /// The device with this ordinal.
    pub fn get(&self, ordinal: u32) -> Option<&Gpu> {
        self.devices().iter().find(|g| g.ordinal == ordinal)
    }

    /// A [`Budget`](ptload_reader::placement::Budget) of these devices, in
    /// ordinal order: a share of each device's total memory (`"90%"`,
    /// `0.9`) turned into bytes, or the same bytes on each. With no device,
    /// a budget of none (everything it places stays on the host).
    pub fn budget(
        &self,
        spec: ptload_reader::placement::BudgetSpec,
    ) -> ptload_reader::placement::Budget {
        let totals: Vec<(u32, u64)> = self
            .devices()
            .iter()
            .map(|g| (g.ordinal, g.total))
            .collect();
        spec.budget(&totals)
    }

    /// The devices of contexts the caller already holds (an engine that
    /// runs its own CUDA work): a load places storages in these contexts,
    /// and each device keeps the ordinal its context reports.
    pub fn from_contexts(contexts: impl IntoIterator<Item = Arc<CudaContext>>) -> Gpus {
        let mut gpus = Vec::new();
        for ctx in contexts {
            let Ok(ordinal) = u32::try_from(ctx.ordinal()) else {
                continue;
            };
            let _keep = KeepCurrent::new();
            let name =
                guarded(|| ctx.name().map_err(text)).unwrap_or_else(|_| "CUDA device".into());
            // A device whose memory cannot be read is not counted as one of
            // 0 bytes: budgets and plans need it.
            let total = match guarded(|| ctx.total_mem().map_err(text)) {
                Ok(total) => total,
                Err(why) => return Gpus::Unusable(memory_unread(ordinal, &why)),
            };
            let cell = OnceLock::new();
            let _ = cell.set(Ok(Context(Some(ctx))));
            gpus.push(Gpu {
                ordinal,
                name,
                total: total as u64,
                ctx: Arc::new(cell),
            });
        }
        Gpus::Devices(gpus)
    }
}

/// Why the machine's devices are unusable when one's memory cannot be
/// read.
fn memory_unread(ordinal: impl std::fmt::Display, why: &str) -> String {
    format!("cuda:{ordinal}: its total memory cannot be read ({why})")
}

/// Number of CUDA devices, without creating contexts; 0 when there is no
/// usable driver. Never panics.
pub fn device_count() -> usize {
    match probe() {
        Gpus::Devices(d) => d.len(),
        _ => 0,
    }
}

#[allow(unsafe_code)]
pub(crate) fn driver_present() -> bool {
    // SAFETY: is_culib_present only tries to open the driver library by its
    // usual names (dlopen) and drops it; it calls no driver function.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The machine's devices: their names and memory, read without opening a
/// context on any of them (a load opens the contexts of the devices it
/// places storages on, and only those). A device whose total memory the
/// driver cannot report makes the driver [`Gpus::Unusable`], with that
/// reason: it is never taken for a device of 0 bytes. Never panics.
pub fn probe() -> Gpus {
    if !driver_present() {
        return Gpus::NoDriver;
    }
    let result = guarded(|| {
        match result::init() {
            Ok(()) => {}
            // A driver with no device says so from cuInit: that is "no
            // device", not an unusable driver.
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NO_DEVICE => return Ok(Vec::new()),
            Err(e) => return Err(text(e)),
        }
        let n = result::device::get_count().map_err(text)?;
        let mut gpus = Vec::new();
        for i in 0..n.max(0) {
            let dev = result::device::get(i).map_err(|e| format!("cuda:{i}: {}", text(e)))?;
            let name = result::device::get_name(dev).unwrap_or_else(|_| "CUDA device".into());
            // SAFETY: `dev` was returned by cuDeviceGet just above.
            #[allow(unsafe_code)]
            let total = unsafe { result::device::total_mem(dev) }
                .map_err(|e| memory_unread(i, &text(e)))?;
            gpus.push(Gpu {
                ordinal: u32::try_from(i).map_err(|_| "device ordinal".to_owned())?,
                name,
                total: total as u64,
                ctx: Arc::new(OnceLock::new()),
            });
        }
        Ok(gpus)
    });
    match result {
        Ok(gpus) => Gpus::Devices(gpus),
        Err(why) => Gpus::Unusable(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ptload_reader::placement::BudgetSpec;

    /// A share of memory becomes bytes of each device's own total; no
    /// device, no budget.
    #[test]
    fn a_budget_share_is_turned_into_each_devices_bytes() {
        let gpu = |ordinal, total| Gpu {
            ordinal,
            name: "test".into(),
            total,
            ctx: Arc::new(OnceLock::new()),
        };
        let gpus = Gpus::Devices(vec![gpu(0, 1000), gpu(1, 4000)]);
        let text = format!("{:?}", gpus.budget(BudgetSpec::Share(0.5)));
        assert!(
            text.contains("(Cuda(0), 500)") && text.contains("(Cuda(1), 2000)"),
            "{text}"
        );
        let text = format!("{:?}", gpus.budget(BudgetSpec::Bytes(300)));
        assert!(
            text.contains("(Cuda(0), 300)") && text.contains("(Cuda(1), 300)"),
            "{text}"
        );
        let none = format!("{:?}", Gpus::NoDriver.budget(BudgetSpec::Share(0.9)));
        assert!(none.contains("devices: []"), "{none}");
    }
}
