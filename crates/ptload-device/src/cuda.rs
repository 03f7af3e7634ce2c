//! The upload pipeline: one arena per device, filled through a small pool
//! of reused pinned buffers on several streams.
//!
//! Never copy from the file mapping or from pageable memory straight to
//! the device: the driver would stage through one internal buffer and
//! serialize. The arena's bytes are cut into runs of the staging size;
//! each worker thread owns a stream and (when it has more than one run to
//! copy) two portable pinned buffers: it fills one from every storage the
//! run covers (swapping bytes if asked) while the other is being copied,
//! and a blocking event per buffer guards its reuse. Many small storages
//! make few copies; the pool is no larger than the work.

use crate::error::{DeviceError, DeviceErrorKind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::{
    result, sys, CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtr,
};

use ptload_reader::checkpoint::ByteOrder;
use ptload_reader::tp::EvenRuns;

use crate::driver::{guarded, make_current, text, KeepCurrent};
use crate::probe::Gpu;
use crate::staging::{Buffer, Stager, Staging};

/// Bytes from one host slice to one offset of the arena.
pub(crate) struct Upload<'a> {
    pub(crate) bytes: UploadBytes<'a>,
    /// The bytes' order and element unit: swapped to the host's while
    /// staging.
    pub(crate) order: ByteOrder,
    pub(crate) unit: usize,
    pub(crate) arena_offset: usize,
    /// Whether its bytes count for progress (the checkpoint's own; a
    /// converted buffer was counted when it was converted).
    pub(crate) counted: bool,
}

/// The bytes of an upload: at hand, or read into the staging buffers.
pub(crate) enum UploadBytes<'a> {
    Ready(&'a [u8]),
    /// A storage of a checkpoint, read into the staging buffers run by
    /// run ([`Checkpoint::read_storage_at`](ptload_reader::Checkpoint::read_storage_at)):
    /// of a mapped file by positioned reads ([`Fill::Read`]); of a file
    /// read by ranges (a URL, a bucket object) from what was fetched ahead
    /// of the copies, or fetched as the run needs it, nothing kept on the
    /// host (each byte is read once). From byte `offset` of the storage:
    /// a tensor-parallel rank's contiguous slice of a file read by ranges
    /// is read this way too, its ranges alone.
    Read {
        ckpt: &'a ptload_reader::Checkpoint,
        index: usize,
        offset: u64,
        len: usize,
    },
    /// Evenly spaced runs of a storage (a tensor-parallel rank's slice),
    /// gathered into the staging buffers as they are filled: no copy of
    /// the slice on the host besides them.
    Runs {
        storage: &'a [u8],
        runs: EvenRuns,
        len: usize,
    },
    /// Evenly spaced runs of a storage of a file read by ranges (a
    /// tensor-parallel rank's column split): each part of the upload reads
    /// the span of whole runs it covers, a bounded span per request, and
    /// gathers from it; the rank's slice is never whole on the host.
    RangedRuns {
        ckpt: &'a ptload_reader::Checkpoint,
        index: usize,
        runs: EvenRuns,
        len: usize,
    },
    /// Elements of `from` at bytes `offset..` of a storage, converted to
    /// `to` as the staging buffers are filled: read a piece at a time
    /// ([`Checkpoint::read_storage_at`](ptload_reader::Checkpoint::read_storage_at))
    /// and converted into the buffer, so the converted tensor is never
    /// whole on the host. `len` is its converted size.
    Cast {
        ckpt: &'a ptload_reader::Checkpoint,
        index: usize,
        offset: u64,
        from: ptload_reader::DType,
        to: ptload_reader::DType,
        len: usize,
    },
}

/// Elements a [`UploadBytes::Cast`] reads and converts at a time: the
/// host holds at most this many of its source's bytes per worker. Of a
/// file read by ranges, a piece of a storage the read-ahead does not hold
/// is a request of its own, so pieces are larger there.
const CAST_PIECE: usize = 1 << 15;
const CAST_PIECE_RANGED: usize = 1 << 19;

impl<'a> UploadBytes<'a> {
    pub(crate) fn len(&self) -> usize {
        match self {
            UploadBytes::Ready(b) => b.len(),
            UploadBytes::Read { len, .. }
            | UploadBytes::Runs { len, .. }
            | UploadBytes::RangedRuns { len, .. }
            | UploadBytes::Cast { len, .. } => *len,
        }
    }

    /// Bytes read from the checkpoint for `n` bytes of the upload (what
    /// progress counts): a conversion reads its source's size.
    fn read_for(&self, n: usize) -> usize {
        match self {
            UploadBytes::Cast { from, to, .. } => n / to.size() * from.size(),
            _ => n,
        }
    }

    /// Copy bytes `from..from + out.len()` of the upload into `out`.
    fn copy(&self, from: usize, out: &mut [u8]) -> Result<(), CopyError> {
        let whole = match self {
            UploadBytes::Ready(b) => *b,
            UploadBytes::Runs { storage, runs, .. } => {
                return runs
                    .copy(storage, from as u64, out)
                    .ok_or(CopyError::Outside);
            }
            UploadBytes::Read {
                ckpt,
                index,
                offset,
                ..
            } => {
                let at = offset.checked_add(from as u64).ok_or(CopyError::Outside)?;
                return ckpt
                    .read_storage_at(*index, at, out)
                    .map_err(CopyError::Read);
            }
            UploadBytes::Cast {
                ckpt,
                index,
                offset,
                from: source,
                to,
                ..
            } => return cast_into(ckpt, *index, *offset, (*source, *to), from, out),
            UploadBytes::RangedRuns {
                ckpt, index, runs, ..
            } => return gather_ranged(ckpt, *index, runs, from as u64, out),
        };
        let src = whole
            .get(from..from.saturating_add(out.len()))
            .ok_or(CopyError::Outside)?;
        out.copy_from_slice(src);
        Ok(())
    }
}

/// Bytes `from..from + out.len()` of a conversion (`dtypes`) of the
/// elements at byte `offset` of storage `index`: the source elements they
/// come from read a piece at a time and converted into `out`. Upload
/// offsets and run starts are multiples of 16, so `from` and `out`'s
/// length are whole elements of the converted type.
fn cast_into(
    ckpt: &ptload_reader::Checkpoint,
    index: usize,
    offset: u64,
    (source, to): (ptload_reader::DType, ptload_reader::DType),
    from: usize,
    out: &mut [u8],
) -> Result<(), CopyError> {
    let elements = if ckpt.fetched_bytes().is_some() {
        CAST_PIECE_RANGED
    } else {
        CAST_PIECE
    };
    cast_by_pieces(ckpt, index, offset, (source, to), from, out, elements)
}

/// [`cast_into`] a piece of `elements` at a time.
fn cast_by_pieces(
    ckpt: &ptload_reader::Checkpoint,
    index: usize,
    offset: u64,
    (source, to): (ptload_reader::DType, ptload_reader::DType),
    from: usize,
    out: &mut [u8],
    elements: usize,
) -> Result<(), CopyError> {
    let (in_size, out_size) = (source.size(), to.size());
    if from % out_size != 0 || out.len() % out_size != 0 || elements == 0 {
        return Err(CopyError::Outside);
    }
    let first = from / out_size;
    let mut piece = vec![0u8; elements.min(out.len() / out_size) * in_size];
    for (i, dst) in out.chunks_mut(elements * out_size).enumerate() {
        let n = dst.len() / out_size;
        let element = first + i * elements;
        let at = (element as u64)
            .checked_mul(in_size as u64)
            .and_then(|b| b.checked_add(offset))
            .ok_or(CopyError::Outside)?;
        let src = piece.get_mut(..n * in_size).ok_or(CopyError::Outside)?;
        ckpt.read_storage_at(index, at, src)
            .map_err(CopyError::Read)?;
        let converted =
            ptload_reader::cast::convert_into(src, source, to, dst).map_err(CopyError::Read)?;
        if converted != n {
            return Err(CopyError::Outside);
        }
    }
    Ok(())
}

/// Bytes of a storage read at a time by [`gather_ranged`]: whole runs
/// and the gaps between them (a column split's rows, of which the rank
/// keeps its columns), so a request is never larger than this and a run.
const GATHER_SPAN: u64 = 4 << 20;

/// Bytes `from..from + out.len()` of `runs` (in row-major order) of
/// storage `index` of `ckpt`, a file read by ranges: the span of whole
/// runs each part covers read by one
/// [`read_storage_at`](ptload_reader::Checkpoint::read_storage_at), at
/// most [`GATHER_SPAN`] and a run, and gathered into `out`.
pub(crate) fn gather_ranged(
    ckpt: &ptload_reader::Checkpoint,
    index: usize,
    runs: &EvenRuns,
    from: u64,
    out: &mut [u8],
) -> Result<(), CopyError> {
    gather_by_spans(ckpt, index, runs, from, out, GATHER_SPAN)
}

/// [`gather_ranged`] with spans of at most `span` bytes and a run.
fn gather_by_spans(
    ckpt: &ptload_reader::Checkpoint,
    index: usize,
    runs: &EvenRuns,
    from: u64,
    out: &mut [u8],
    span: u64,
) -> Result<(), CopyError> {
    if runs.len == 0 || runs.step < runs.len {
        return if out.is_empty() {
            Ok(())
        } else {
            Err(CopyError::Outside)
        };
    }
    let per_span = (span / runs.step).max(1);
    let mut span = Vec::new();
    let mut done = 0usize;
    while done < out.len() {
        let at = from.checked_add(done as u64).ok_or(CopyError::Outside)?;
        let (k, within) = (at / runs.len, at % runs.len);
        let wanted_last = (at + (out.len() - done) as u64 - 1) / runs.len;
        if wanted_last >= runs.count {
            return Err(CopyError::Outside);
        }
        let last = wanted_last.min(k + per_span - 1);
        let start = k
            .checked_mul(runs.step)
            .and_then(|b| b.checked_add(runs.first))
            .ok_or(CopyError::Outside)?;
        let span_len =
            usize::try_from((last - k) * runs.step + runs.len).map_err(|_| CopyError::Outside)?;
        span.resize(span_len, 0);
        ckpt.read_storage_at(index, start, &mut span)
            .map_err(CopyError::Read)?;
        let local = EvenRuns {
            first: 0,
            len: runs.len,
            step: runs.step,
            count: last - k + 1,
        };
        let n = usize::try_from(local.bytes() - within)
            .unwrap_or(usize::MAX)
            .min(out.len() - done);
        let dst = out.get_mut(done..done + n).ok_or(CopyError::Outside)?;
        local.copy(&span, within, dst).ok_or(CopyError::Outside)?;
        done += n;
    }
    Ok(())
}

/// Why an upload's bytes could not be copied into a run.
pub(crate) enum CopyError {
    /// Reading them failed (a request of a file read by ranges).
    Read(ptload_reader::Error),
    /// They lie outside what the upload holds.
    Outside,
}

/// A device allocation holding storages as sub-slices. It is freed (on
/// the stream it was allocated on, after all work queued in its context
/// has finished) when the last storage in it is dropped;
/// its bytes are written and every copy has completed when the load that
/// made it returns, so any stream of its context may read it.
pub struct Arena {
    inner: Option<ArenaInner>,
    /// Device address of the first byte, read once at allocation.
    ptr: u64,
    len: usize,
    ordinal: u32,
}

struct ArenaInner {
    slice: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("ordinal", &self.ordinal)
            .field("bytes", &self.len)
            .finish()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // Freeing binds the arena's context to the dropping thread: give
        // the thread its own back afterwards.
        let _keep = KeepCurrent::new();
        let inner = self.inner.take();
        let _ = guarded(move || {
            if let Some(inner) = &inner {
                // cudarc binds the context only while it has no error
                // recorded; after a fault the free must still run in it.
                make_current(inner.stream.context())?;
                // Others may still be reading it on streams of their own
                // (a consumer such as torch does not tell us when its
                // kernels are done): free it after all of the context's
                // work. An error here (a sticky fault) must not keep the
                // memory allocated.
                let _ = result::ctx::synchronize();
            }
            drop(inner);
            Ok(())
        });
    }
}

impl Arena {
    /// Raw device address of the arena's first byte (no driver call).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `len` bytes at `offset`, as a cudarc view.
    pub(crate) fn view(&self, offset: usize, len: usize) -> Option<CudaView<'_, u8>> {
        self.inner
            .as_ref()?
            .slice
            .try_slice(offset..offset.checked_add(len)?)
    }

    /// Copy `len` bytes at `offset` back to the host (for checks). The
    /// calling thread's current context is left as it was.
    pub fn read_back(&self, offset: usize, len: usize) -> Result<Vec<u8>, DeviceError> {
        let range = |m: &str| DeviceError::new(DeviceErrorKind::OutOfRange, None, m.to_owned());
        let inner = self
            .inner
            .as_ref()
            .ok_or_else(|| range("the arena was freed"))?;
        let view = inner
            .slice
            .try_slice(offset..offset.saturating_add(len))
            .ok_or_else(|| range("range outside the arena"))?;
        let _keep = KeepCurrent::new();
        guarded(|| inner.stream.clone_dtoh(&view).map_err(text))
            .map_err(|e| DeviceError::new(DeviceErrorKind::Driver, None, e))
    }
}

/// Why an upload failed.
#[derive(Debug)]
pub(crate) enum UploadError {
    /// The arena could not be allocated: the device lacks memory.
    OutOfMemory(String),
    /// Any other driver failure.
    Driver(String),
    /// The caller's cancel flag was set.
    Cancelled,
    /// Reading an upload's bytes failed (a request of a file read by
    /// ranges).
    Read(ptload_reader::Error),
}

/// Allocate `total` bytes on `gpu` (the caller keeps its current context).
pub(crate) fn allocate(gpu: &Gpu, total: usize) -> Result<Arena, UploadError> {
    let ctx = gpu
        .context()
        .map_err(|e| UploadError::Driver(e.to_string()))?;
    let _keep = KeepCurrent::new();
    let (inner, ptr) = guarded(|| {
        let stream = ctx.new_stream().map_err(text)?;
        // SAFETY: the arena is uninitialized device memory; every byte a
        // tensor can reach is written by `upload` before the arena is handed
        // out, and padding between storages is never read as tensor data.
        match unsafe { stream.alloc::<u8>(total.max(1)) } {
            Ok(slice) => {
                stream.synchronize().map_err(text)?;
                let ptr = {
                    let (ptr, _record) = slice.device_ptr(&stream);
                    ptr
                };
                Ok(Ok((ArenaInner { slice, stream }, ptr)))
            }
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                Ok(Err(UploadError::OutOfMemory(text(e))))
            }
            Err(e) => Err(text(e)),
        }
    })
    .map_err(UploadError::Driver)??;
    Ok(Arena {
        ptr,
        len: inner.slice.len(),
        ordinal: gpu.ordinal,
        inner: Some(inner),
    })
}

/// The pinned staging one device's upload uses: no more than the work
/// needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pool {
    /// Bytes per buffer: a multiple of 16, so each buffer holds whole
    /// elements of every dtype and is swapped on its own correctly.
    pub(crate) buffer: usize,
    /// Worker threads, each with its own stream.
    pub(crate) workers: usize,
    /// Buffers per worker: two (one filling while the other copies) when
    /// a worker has more than one run to copy.
    pub(crate) buffers: usize,
    /// Runs of at most `buffer` bytes: one copy each.
    pub(crate) runs: usize,
}

impl Pool {
    pub(crate) fn for_work(staging: &Staging, bytes: usize) -> Pool {
        let most = staging.buffer_bytes.max(4096) / 16 * 16;
        let buffer = most.min(bytes.div_ceil(4096).max(1) * 4096);
        let runs = bytes.div_ceil(buffer);
        let workers = staging.streams_per_device.clamp(1, runs.max(1));
        let buffers = if runs > workers { 2 } else { 1 };
        Pool {
            buffer,
            workers,
            buffers,
            runs,
        }
    }

    /// Pinned bytes this pool holds.
    #[cfg(test)]
    pub(crate) fn pinned_bytes(&self) -> usize {
        self.buffer
            .saturating_mul(self.buffers)
            .saturating_mul(self.workers)
    }
}

/// What one device's upload did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Copied {
    /// Host-to-device copies queued.
    pub(crate) copies: usize,
    /// Staging bytes this upload page-locked (kept buffers and pageable
    /// ones are not counted), and the driver calls that did it.
    pub(crate) pinned: usize,
    pub(crate) pinnings: usize,
    /// Where the workers' time went, summed over them.
    pub(crate) time: WorkerTime,
}

/// Where an upload's worker threads spent their time, summed over them
/// (thread-seconds, so with several workers the sum exceeds the wall
/// time): what limits a load on a real GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkerTime {
    /// Making the stream, the events and the page-locked staging buffers.
    pub setup_seconds: f64,
    /// Filling staging buffers: reading the file (the map's page faults,
    /// or the requests of a file read by ranges) and swapping the bytes
    /// to host order.
    pub fill_seconds: f64,
    /// Waiting for copies to finish: before a buffer is filled again,
    /// and for the last copies at the end.
    pub wait_seconds: f64,
}

/// [`WorkerTime`] as the workers add to it.
#[derive(Default)]
struct Clock {
    setup: AtomicU64,
    fill: AtomicU64,
    wait: AtomicU64,
}

impl Clock {
    fn add(counter: &AtomicU64, since: Instant) {
        let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counter.fetch_add(nanos, Ordering::Relaxed);
    }

    fn time(&self) -> WorkerTime {
        let seconds = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64 / 1e9;
        WorkerTime {
            setup_seconds: seconds(&self.setup),
            fill_seconds: seconds(&self.fill),
            wait_seconds: seconds(&self.wait),
        }
    }
}

/// Copy every upload into `arena` on `gpu`: the arena's bytes are cut into
/// runs of the staging size, each filled from every upload it covers and
/// copied at once, on parallel streams. `uploads` are in arena order and
/// do not overlap.
pub(crate) fn upload(
    gpu: &Gpu,
    arena: &Arena,
    uploads: &[Upload<'_>],
    staging: &Staging,
    progress: Option<&(dyn Fn(u64) + Send + Sync)>,
    cancel: Option<&AtomicBool>,
) -> Result<Copied, UploadError> {
    let end = uploads
        .iter()
        .map(|u| u.arena_offset.saturating_add(u.bytes.len()))
        .max()
        .unwrap_or(0);
    if end == 0 {
        return Ok(Copied::default());
    }
    if end > arena.len() {
        return Err(UploadError::Driver(format!(
            "uploads reach byte {end} of a {}-byte arena",
            arena.len()
        )));
    }
    let pool = Pool::for_work(staging, end);
    let ctx = gpu
        .context()
        .map_err(|e| UploadError::Driver(e.to_string()))?;
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let copies = AtomicUsize::new(0);
    // Buffers needed: no more than the runs.
    let stager = Stager::new(
        ctx,
        gpu.ordinal,
        staging,
        pool.buffer,
        pool.workers,
        pool.runs.min(pool.workers.saturating_mul(pool.buffers)),
    );
    let clock = Clock::default();
    let error: Mutex<Option<String>> = Mutex::new(None);
    let read_error: Mutex<Option<ptload_reader::Error>> = Mutex::new(None);
    let shared = Shared {
        ctx,
        base: arena.device_ptr(),
        end,
        uploads,
        pool,
        next: &next,
        failed: &failed,
        copies: &copies,
        stager: &stager,
        clock: &clock,
        progress,
        cancel,
        read_error: &read_error,
    };
    std::thread::scope(|scope| {
        for _ in 0..pool.workers {
            scope.spawn(|| {
                if let Err(e) = worker(&shared) {
                    failed.store(true, Ordering::Relaxed);
                    if let Ok(mut slot) = error.lock() {
                        slot.get_or_insert(e);
                    }
                }
            });
        }
    });
    if let Some(e) = read_error.lock().ok().and_then(|mut e| e.take()) {
        return Err(UploadError::Read(e));
    }
    if let Some(e) = error.into_inner().ok().flatten() {
        return Err(UploadError::Driver(e));
    }
    // Cancelled with runs left: the workers stopped taking runs and waited
    // for the copies they had queued, so the caller may free the arena. (A
    // worker that finds no run left has taken a number past the end.)
    let runs_left = next
        .load(Ordering::Relaxed)
        .saturating_mul(shared.pool.buffer)
        < end;
    if runs_left && cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
        return Err(UploadError::Cancelled);
    }
    Ok(Copied {
        copies: copies.into_inner(),
        pinned: stager.pinned.load(Ordering::Relaxed),
        pinnings: stager.pinnings.load(Ordering::Relaxed),
        time: clock.time(),
    })
}

/// What every worker of one device's upload shares.
struct Shared<'s, 'a> {
    ctx: &'s Arc<CudaContext>,
    /// Device address of the arena.
    base: u64,
    /// Bytes of the arena the uploads reach.
    end: usize,
    uploads: &'s [Upload<'a>],
    pool: Pool,
    /// Next run to take.
    next: &'s AtomicUsize,
    /// Set by a failing worker so the others stop.
    failed: &'s AtomicBool,
    copies: &'s AtomicUsize,
    /// Where the staging buffers come from and go back to.
    stager: &'s Stager<'s>,
    clock: &'s Clock,
    progress: Option<&'s (dyn Fn(u64) + Send + Sync)>,
    /// Set by the caller to stop taking runs.
    cancel: Option<&'s AtomicBool>,
    /// The first failure to read an upload's bytes.
    read_error: &'s Mutex<Option<ptload_reader::Error>>,
}

/// One staging buffer, the event guarding its reuse, and the bytes of the
/// copy out of it not yet known to be done.
struct Slot {
    buffer: Buffer,
    event: CudaEvent,
    /// A copy out of the buffer was queued and not yet waited for.
    queued: bool,
    /// Bytes of that copy that count for progress.
    pending: u64,
}

fn worker(shared: &Shared<'_, '_>) -> Result<(), String> {
    let ctx = shared.ctx;
    let setup = Instant::now();
    guarded(|| ctx.bind_to_thread().map_err(text))?;
    let stream = guarded(|| ctx.new_stream().map_err(text))?;
    // One buffer now; the second when the worker takes its second run,
    // so that allocating it overlaps the first copy.
    let mut slots = Vec::with_capacity(shared.pool.buffers);
    slots.push(new_slot(shared)?);
    Clock::add(&shared.clock.setup, setup);
    let result = guarded(|| copy_runs(shared, &stream, &mut slots));
    let wait = Instant::now();
    // Whatever happened, the copies already queued finish before their
    // buffers (and, for the caller, the arena) can be freed. The driver
    // is asked directly: after a fault cudarc answers with the recorded
    // error without waiting.
    let waited = guarded(|| {
        make_current(ctx)?;
        // Every wait runs, whatever the ones before it answered.
        let mut first = Ok(());
        for slot in &slots {
            // SAFETY: the event is alive (owned by `slots`).
            let r = unsafe { result::event::synchronize(slot.event.cu_event()) }.map_err(text);
            first = first.and(r);
        }
        // SAFETY: the stream is alive (owned by this worker).
        let r = unsafe { result::stream::synchronize(stream.cu_stream()) }.map_err(text);
        first.and(r)
    });
    Clock::add(&shared.clock.wait, wait);
    if result.is_ok() && waited.is_ok() {
        if let Some(p) = shared.progress {
            for slot in &slots {
                if slot.pending > 0 {
                    p(slot.pending);
                }
            }
        }
        // Every copy out of the buffers is done: they may serve another
        // load.
        shared
            .stager
            .give_back(slots.drain(..).map(|slot| slot.buffer));
    }
    result.and(waited)
}

/// A staging buffer and the event guarding its reuse, on the current
/// context.
fn new_slot(shared: &Shared<'_, '_>) -> Result<Slot, String> {
    let ctx = shared.ctx;
    // Blocking: a thread waiting for a copy sleeps instead of spinning
    // on a core the other workers need for staging. Made first, so that
    // a failure here leaves a kept buffer kept.
    let event = guarded(|| {
        ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(text)
    })?;
    let buffer = shared.stager.buffer()?;
    Ok(Slot {
        buffer,
        event,
        queued: false,
        pending: 0,
    })
}

/// Take runs until none is left (or another worker failed): fill a
/// staging buffer from every upload the run covers, swapped to host
/// order, and queue one copy for it.
fn copy_runs(
    shared: &Shared<'_, '_>,
    stream: &Arc<CudaStream>,
    slots: &mut Vec<Slot>,
) -> Result<(), String> {
    let buffer = shared.pool.buffer;
    let mut turn = 0usize;
    while !shared.failed.load(Ordering::Relaxed)
        && !shared.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
    {
        let run = shared.next.fetch_add(1, Ordering::Relaxed);
        let start = run.saturating_mul(buffer);
        if start >= shared.end {
            break;
        }
        let len = buffer.min(shared.end - start);
        let index = turn % shared.pool.buffers.max(1);
        if index == slots.len() {
            let setup = Instant::now();
            slots.push(new_slot(shared)?);
            Clock::add(&shared.clock.setup, setup);
        }
        let Some(slot) = slots.get_mut(index) else {
            return Err("no staging buffer".into());
        };
        turn += 1;
        if slot.queued {
            // The previous copy out of this buffer must be done before
            // refilling it; its bytes are now on the device.
            let wait = Instant::now();
            slot.event.synchronize().map_err(text)?;
            Clock::add(&shared.clock.wait, wait);
            if let (Some(p), true) = (shared.progress, slot.pending > 0) {
                p(slot.pending);
            }
            slot.queued = false;
            slot.pending = 0;
        }
        let host = slot
            .buffer
            .as_mut_slice()
            .get_mut(..len)
            .ok_or("run longer than its buffer")?;
        let filling = Instant::now();
        let counted = fill(shared.uploads, start, host, shared.read_error)?;
        Clock::add(&shared.clock.fill, filling);
        let offset = u64::try_from(start).map_err(|_| "offset".to_owned())?;
        // SAFETY: [base + start, + len) lies inside the arena (the caller
        // checked that the uploads end within it) and runs do not overlap;
        // the arena outlives the copy because the worker waits for its
        // stream before returning, on every path; the staging source is not
        // written again until `event` (recorded right after) completes.
        unsafe { result::memcpy_htod_async(shared.base + offset, &*host, stream.cu_stream()) }
            .map_err(text)?;
        shared.copies.fetch_add(1, Ordering::Relaxed);
        slot.event.record(stream).map_err(text)?;
        slot.queued = true;
        slot.pending = counted as u64;
    }
    Ok(())
}

/// Fill `run` (the arena's bytes from `start`) from the uploads it covers,
/// each swapped to host order; the padding between them is zeroed.
/// Returns the bytes that count for progress. A failure to read an
/// upload's bytes is kept in `read_error`.
fn fill(
    uploads: &[Upload<'_>],
    start: usize,
    run: &mut [u8],
    read_error: &Mutex<Option<ptload_reader::Error>>,
) -> Result<usize, String> {
    let mut counted = 0;
    let end = start + run.len();
    // The first upload ending after `start`.
    let first = uploads.partition_point(|u| u.arena_offset + u.bytes.len() <= start);
    let mut at = start;
    for up in uploads.get(first..).unwrap_or(&[]) {
        if up.arena_offset >= end {
            break;
        }
        let from = up.arena_offset.max(start);
        let to = (up.arena_offset + up.bytes.len()).min(end);
        if let Some(gap) = run.get_mut(at - start..from - start) {
            gap.fill(0);
        }
        let Some(dst) = run.get_mut(from - start..to - start) else {
            return Err("upload outside its run".into());
        };
        match up.bytes.copy(from - up.arena_offset, dst) {
            Ok(()) => {}
            Err(CopyError::Read(e)) => {
                let message = e.to_string();
                if let Ok(mut slot) = read_error.lock() {
                    slot.get_or_insert(e);
                }
                return Err(message);
            }
            Err(CopyError::Outside) => return Err("upload outside its run".into()),
        }
        // Upload offsets and run starts are multiples of 16, so `dst`
        // starts on an element boundary of the upload.
        up.order.to_host(dst, up.unit);
        if up.counted {
            counted += up.bytes.read_for(to - from);
        }
        at = to;
    }
    if let Some(tail) = run.get_mut(at - start..) {
        tail.fill(0);
    }
    Ok(counted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama_wide() -> ptload_reader::Checkpoint {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/files/llama_wide.pt");
        ptload_reader::Checkpoint::open(path).expect("open")
    }

    /// The largest storage of the fixture, and its index.
    fn largest(ckpt: &ptload_reader::Checkpoint) -> (usize, u64) {
        ckpt.storages()
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.nbytes))
            .max_by_key(|&(_, n)| n)
            .expect("a storage")
    }

    /// Gathered by spans through `read_storage_at`, any part of evenly
    /// spaced runs (one run, parts of runs, more than a span) is what the
    /// gather from the whole storage gives; runs past the storage are an
    /// error, not bytes; runs longer than their step are refused.
    #[test]
    fn a_gather_by_spans_is_the_gather_from_the_whole() {
        let ckpt = llama_wide();
        let (index, nbytes) = largest(&ckpt);
        let whole = ckpt.storage_bytes(index).expect("bytes");
        let runs = EvenRuns {
            first: 64,
            len: 64,
            step: 128,
            count: nbytes / 128,
        };
        let total = runs.bytes() as usize;
        let parts = [
            (0, 64),
            (10, 100),
            (63, total - 63),
            (0, total),
            (4096, 12345),
        ];
        // Spans of one run, of several, and the one span of it all.
        for span in [100, 1000, 64 << 10, GATHER_SPAN] {
            for (from, len) in parts {
                let mut want = vec![0u8; len];
                runs.copy(whole, from as u64, &mut want).expect("copy");
                let mut got = vec![0xAAu8; len];
                assert!(
                    gather_by_spans(&ckpt, index, &runs, from as u64, &mut got, span).is_ok(),
                    "{span}: {from} +{len}"
                );
                assert_eq!(got, want, "{span}: {from} +{len}");
            }
        }
        let past = EvenRuns {
            count: runs.count + 2,
            ..runs
        };
        let mut out = vec![0u8; past.bytes() as usize];
        assert!(matches!(
            gather_ranged(&ckpt, index, &past, 0, &mut out),
            Err(CopyError::Read(_) | CopyError::Outside)
        ));
        let overlapping = EvenRuns { step: 32, ..runs };
        assert!(matches!(
            gather_ranged(&ckpt, index, &overlapping, 0, &mut [0u8; 64]),
            Err(CopyError::Outside)
        ));
        let beyond = EvenRuns {
            first: u64::MAX - 10,
            ..runs
        };
        assert!(gather_ranged(&ckpt, index, &beyond, 0, &mut [0u8; 64]).is_err());
    }

    /// Converted a piece at a time, any part of a conversion (whole
    /// elements) is what converting the whole gives; a part that does not
    /// start on an element is refused.
    #[test]
    fn a_conversion_by_pieces_is_the_conversion_of_the_whole() {
        use ptload_reader::DType;
        let ckpt = llama_wide();
        let (index, nbytes) = largest(&ckpt);
        let whole = ckpt.storage_bytes(index).expect("bytes");
        let all = ptload_reader::cast::convert(whole, DType::BF16, DType::F32).expect("convert");
        assert!(nbytes as usize / 2 > CAST_PIECE, "more than one piece");
        let parts = [
            (0, 4),
            (16, 400),
            (0, all.len()),
            (4 * 1000, 4 * CAST_PIECE + 8),
        ];
        for elements in [3, 1000, CAST_PIECE] {
            for (from, len) in parts {
                let mut got = vec![0u8; len];
                let pair = (DType::BF16, DType::F32);
                assert!(
                    cast_by_pieces(&ckpt, index, 0, pair, from, &mut got, elements).is_ok(),
                    "{elements}: {from} +{len}"
                );
                assert_eq!(got, all[from..from + len], "{elements}: {from} +{len}");
            }
        }
        let mut odd = [0u8; 8];
        assert!(matches!(
            cast_into(&ckpt, index, 0, (DType::BF16, DType::F32), 2, &mut odd),
            Err(CopyError::Outside)
        ));
        let mut past = vec![0u8; 64];
        assert!(cast_into(
            &ckpt,
            index,
            nbytes - 8,
            (DType::BF16, DType::F32),
            0,
            &mut past
        )
        .is_err());
    }

    #[test]
    fn the_pool_is_no_larger_than_the_work() {
        let staging = Staging {
            buffer_bytes: 32 << 20,
            streams_per_device: 4,
            ..Staging::default()
        };
        let tiny = Pool::for_work(&staging, 232);
        assert_eq!(
            (tiny.buffer, tiny.workers, tiny.buffers, tiny.runs),
            (4096, 1, 1, 1)
        );
        assert_eq!(tiny.pinned_bytes(), 4096);
        let mid = Pool::for_work(&staging, 40 << 20);
        assert_eq!(
            (mid.buffer, mid.workers, mid.buffers, mid.runs),
            (32 << 20, 2, 1, 2)
        );
        let big = Pool::for_work(&staging, 2 << 30);
        assert_eq!((big.workers, big.buffers, big.runs), (4, 2, 64));
        assert_eq!(big.pinned_bytes(), staging.pinned_bytes());
        // A configured size that is not a multiple of 16 is rounded down.
        let odd = Staging {
            buffer_bytes: 4102 * 3,
            streams_per_device: 3,
            ..Staging::default()
        };
        assert_eq!(Pool::for_work(&odd, 1 << 20).buffer % 16, 0);
    }

    #[test]
    fn a_run_gathers_every_storage_it_covers_swapped_with_zeroed_padding() {
        let a: Vec<u8> = (1..=6).collect();
        let b: Vec<u8> = vec![0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88];
        let uploads = [
            Upload {
                bytes: UploadBytes::Ready(&a),
                order: ByteOrder::HOST,
                unit: 1,
                arena_offset: 0,
                counted: true,
            },
            Upload {
                bytes: UploadBytes::Ready(&b),
                order: if cfg!(target_endian = "little") {
                    ByteOrder::Big
                } else {
                    ByteOrder::Little
                },
                unit: 4,
                arena_offset: 16,
                counted: false,
            },
        ];
        let mut run = vec![0xEE; 32];
        // Only the first upload's bytes count for progress.
        assert_eq!(
            fill(&uploads, 0, &mut run, &Mutex::new(None)).expect("fill"),
            6
        );
        let mut want = vec![0u8; 32];
        want[..6].copy_from_slice(&a);
        want[16..24].copy_from_slice(&[0x44, 0x33, 0x22, 0x11, 0x88, 0x77, 0x66, 0x55]);
        assert_eq!(run, want);
        // A run that starts inside the second upload takes its tail only.
        let mut tail = vec![0xEE; 16];
        fill(&uploads, 16, &mut tail, &Mutex::new(None)).expect("fill");
        assert_eq!(&tail[..8], &want[16..24]);
        assert!(tail[8..].iter().all(|&x| x == 0));
    }
}
