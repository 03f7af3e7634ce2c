//! Helpers around the CUDA driver calls that the probe and the uploads
//! share: keeping the caller's current context, making one current,
//! driver errors in words, and cudarc's panics turned into errors.

use cudarc::driver::{result, sys, CudaContext};

/// Keeps the calling thread's current CUDA context: cudarc binds a
/// context to the thread in most calls; the caller's (or none) is put
/// back when this is dropped.
pub(crate) struct KeepCurrent(Option<sys::CUcontext>);

impl KeepCurrent {
    pub(crate) fn new() -> Self {
        // Before cuInit there is no current context, and the call fails.
        KeepCurrent(guarded(|| result::ctx::get_current().map_err(text)).unwrap_or(None))
    }
}

impl Drop for KeepCurrent {
    fn drop(&mut self) {
        let ctx = self.0.unwrap_or(std::ptr::null_mut());
        let _ = guarded(|| {
            let now = result::ctx::get_current().map_err(text)?;
            if now.unwrap_or(std::ptr::null_mut()) != ctx {
                // SAFETY: `ctx` is null (no current context) or the context
                // that was current on this thread when the guard was made;
                // the caller keeps it alive across our call.
                unsafe { result::ctx::set_current(ctx) }.map_err(text)?;
            }
            Ok(())
        });
    }
}

/// Make `ctx` the calling thread's current context, whatever errors
/// cudarc has recorded on it.
pub(crate) fn make_current(ctx: &CudaContext) -> Result<(), String> {
    // SAFETY: `ctx` is alive (borrowed) and its context handle is valid
    // until it is dropped.
    unsafe { result::ctx::set_current(ctx.cu_ctx()) }.map_err(text)
}

/// A driver error in words: the driver's description and its name
/// ("out of memory (CUDA_ERROR_OUT_OF_MEMORY)").
pub(crate) fn text(e: result::DriverError) -> String {
    match (e.error_string(), e.error_name()) {
        (Ok(what), Ok(name)) => format!("{} ({})", what.to_string_lossy(), name.to_string_lossy()),
        _ => format!("{:?}", e.0),
    }
}

/// Run driver calls, turning a panic in cudarc (a driver symbol missing
/// from the library, an unexpected state) into an error.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "the CUDA driver binding panicked".into());
        Err(text)
    })
}
