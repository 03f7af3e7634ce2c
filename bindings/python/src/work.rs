//! Work on a thread of its own while Python waits, interruptible by
//! Ctrl-C and reporting progress.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;

use pyo3::prelude::*;

use crate::errors::Error;

/// Work done on a thread of its own while Python waits: what it counts
/// for progress, and the flag that tells it to stop.
#[derive(Clone, Debug, Default)]
pub struct Work {
    pub(crate) done: Arc<AtomicU64>,
    pub(crate) cancel: Arc<AtomicBool>,
}

impl Work {
    /// Count `n` more bytes done.
    pub fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    /// Options for a load onto GPUs done as this work: its bytes counted
    /// for progress, stopped by its flag; the rest the defaults.
    pub(crate) fn load_options(&self) -> ptload_device::LoadOptions {
        let counter = self.clone();
        ptload_device::LoadOptions {
            progress: Some(Arc::new(move |n| counter.add(n))),
            cancel: Some(Arc::clone(&self.cancel)),
            ..Default::default()
        }
    }

    /// Whether the caller gave up (Ctrl-C).
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

/// Run `job` on a thread of its own while this one waits with the GIL
/// released, waking every 50 ms to let Python run its signal handlers (a
/// Ctrl-C raises `KeyboardInterrupt` from here) and to call `progress`
/// with the bytes `job` has counted. On an exception the job is told to
/// stop and left to end on its thread; what it made is dropped there.
pub(crate) fn interruptible<T: Send + 'static>(
    py: Python<'_>,
    progress: Option<&Bound<'_, PyAny>>,
    job: impl FnOnce(&Work) -> T + Send + 'static,
) -> PyResult<T> {
    let work = Work::default();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let theirs = work.clone();
    std::thread::Builder::new()
        .name("ptload".into())
        .spawn(move || {
            let _ = tx.send(job(&theirs));
        })
        .map_err(|e| Error::new_err(format!("cannot start a thread: {e}")))?;
    let mut reported = 0;
    let mut rx = Some(rx);
    loop {
        let waiting = rx
            .take()
            .ok_or_else(|| Error::new_err("no reading thread"))?;
        let (got, waiting) = py.allow_threads(move || {
            let got = waiting.recv_timeout(std::time::Duration::from_millis(50));
            (got, waiting)
        });
        rx = Some(waiting);
        let step = (|| {
            if let Some(progress) = progress {
                let done = work.done.load(Ordering::Relaxed);
                if done != reported {
                    reported = done;
                    progress.call1((done,))?;
                }
            }
            py.check_signals()
        })();
        match (got, step) {
            (Ok(value), Ok(())) => return Ok(value),
            (Err(RecvTimeoutError::Timeout), Ok(())) => {}
            (Err(RecvTimeoutError::Disconnected), _) => {
                return Err(Error::new_err(
                    "the reading thread stopped without an answer",
                ))
            }
            (_, Err(e)) => {
                work.cancel.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
    }
}

/// Storages of a file read by ranges fetched ahead of the caller's reads,
/// on threads of their own (`ptload_reader::checkpoint::ReadAhead`):
/// `stop()` when the reads are done (also when dropped).
#[pyclass(frozen, module = "ptload._ptload")]
pub(crate) struct ReadAhead {
    pub(crate) inner: std::sync::Mutex<Option<ptload_reader::checkpoint::ReadAhead>>,
}

impl ReadAhead {
    pub(crate) fn of(ahead: ptload_reader::checkpoint::ReadAhead) -> ReadAhead {
        ReadAhead {
            inner: std::sync::Mutex::new(Some(ahead)),
        }
    }
}

#[pymethods]
impl ReadAhead {
    /// Start no further request and wait for those in flight (the GIL
    /// released).
    fn stop(&self, py: Python<'_>) {
        let taken = self.inner.lock().ok().and_then(|mut a| a.take());
        if let Some(ahead) = taken {
            py.allow_threads(move || ahead.stop());
        }
    }
}
