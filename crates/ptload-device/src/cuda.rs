//! The upload pipeline: one arena per device, filled through a small pool
//! of reused pinned buffers on several streams.
//!
//! Never copy from the file mapping or from pageable memory straight to
//! the device: the driver would stage through one internal buffer and
//! serialize. Each worker thread owns a stream and two portable pinned
//! buffers; it fills one from the map (swapping bytes if asked) while the
//! other is being copied, and an event per buffer guards its reuse.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    result, sys, CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtr, PinnedHostSlice,
};

use ptload_reader::ByteOrder;

use crate::probe::Gpu;

/// Bytes from one host slice to one offset of the arena.
pub(crate) struct Upload<'a> {
    pub(crate) bytes: &'a [u8],
    /// The bytes' order and element unit: swapped to the host's while
    /// staging.
    pub(crate) order: ByteOrder,
    pub(crate) unit: usize,
    pub(crate) arena_offset: usize,
}

/// Sizes of the staging pool.
#[derive(Debug, Clone, Copy)]
pub struct Staging {
    /// Bytes per pinned buffer (each copy moves at most this much).
    pub buffer_bytes: usize,
    /// Streams (and worker threads) per device; each has two buffers.
    pub streams_per_device: usize,
}

impl Default for Staging {
    fn default() -> Self {
        // 4 streams x 2 buffers x 32 MiB = 256 MiB of pinned memory per device.
        Staging {
            buffer_bytes: 32 << 20,
            streams_per_device: 4,
        }
    }
}

impl Staging {
    /// Pinned bytes one device's upload uses.
    pub fn pinned_bytes(&self) -> usize {
        self.buffer_bytes
            .saturating_mul(2)
            .saturating_mul(self.streams_per_device)
    }
}

/// A device allocation holding storages as sub-slices.
pub struct Arena {
    pub(crate) slice: CudaSlice<u8>,
    pub(crate) stream: Arc<CudaStream>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("bytes", &self.slice.len())
            .finish()
    }
}

impl Arena {
    /// Raw device address of the arena's first byte.
    pub fn device_ptr(&self) -> u64 {
        let (ptr, _sync) = self.slice.device_ptr(&self.stream);
        ptr
    }

    /// `len` bytes at `offset`, as a cudarc view.
    pub(crate) fn view(&self, offset: usize, len: usize) -> Option<CudaView<'_, u8>> {
        self.slice.try_slice(offset..offset.checked_add(len)?)
    }

    /// Copy `len` bytes at `offset` back to the host (for checks).
    pub fn read_back(&self, offset: usize, len: usize) -> Result<Vec<u8>, String> {
        let view = self
            .slice
            .try_slice(offset..offset.saturating_add(len))
            .ok_or_else(|| "range outside the arena".to_owned())?;
        self.stream.clone_dtoh(&view).map_err(|e| e.to_string())
    }
}

/// Why an upload failed.
#[derive(Debug)]
pub(crate) enum UploadError {
    /// The arena could not be allocated: the device lacks memory.
    OutOfMemory(String),
    /// Any other driver failure.
    Driver(String),
}

fn driver(e: impl std::fmt::Display) -> UploadError {
    UploadError::Driver(e.to_string())
}

/// Allocate `total` bytes on `gpu`.
pub(crate) fn allocate(gpu: &Gpu, total: usize) -> Result<Arena, UploadError> {
    let ctx = gpu.context();
    let stream = ctx.new_stream().map_err(driver)?;
    // SAFETY: the arena is uninitialized device memory; every byte a tensor
    // can reach is written by `upload` before the arena is handed out, and
    // padding between storages is never read as tensor data.
    let slice = unsafe { stream.alloc::<u8>(total.max(1)) }.map_err(|e| {
        if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
            UploadError::OutOfMemory(e.to_string())
        } else {
            driver(e)
        }
    })?;
    stream.synchronize().map_err(driver)?;
    Ok(Arena { slice, stream })
}

struct Chunk {
    upload: usize,
    start: usize,
    len: usize,
}

/// Copy every upload into `arena` on `gpu`, in parallel streams.
pub(crate) fn upload(
    gpu: &Gpu,
    arena: &Arena,
    uploads: &[Upload<'_>],
    staging: &Staging,
    progress: Option<&(dyn Fn(u64) + Send + Sync)>,
) -> Result<(), UploadError> {
    // Chunks hold whole elements of every dtype (16 bytes is the largest
    // swap unit's multiple), so each is swapped on its own correctly.
    let buffer = staging.buffer_bytes.max(4096) / 16 * 16;
    let chunks: Vec<Chunk> = uploads
        .iter()
        .enumerate()
        .flat_map(|(i, u)| {
            (0..u.bytes.len()).step_by(buffer).map(move |start| Chunk {
                upload: i,
                start,
                len: buffer.min(u.bytes.len() - start),
            })
        })
        .collect();
    if chunks.is_empty() {
        return Ok(());
    }
    let base = arena.device_ptr();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let error: Mutex<Option<String>> = Mutex::new(None);
    let workers = staging.streams_per_device.clamp(1, chunks.len());
    let shared = Shared {
        gpu,
        base,
        uploads,
        chunks: &chunks,
        next: &next,
        failed: &failed,
        buffer,
        progress,
    };
    std::thread::scope(|scope| {
        for _ in 0..workers {
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
    match error.into_inner().ok().flatten() {
        Some(e) => Err(UploadError::Driver(e)),
        None => Ok(()),
    }
}

/// What every worker of one device's upload shares.
struct Shared<'s, 'a> {
    gpu: &'s Gpu,
    /// Device address of the arena.
    base: u64,
    uploads: &'s [Upload<'a>],
    chunks: &'s [Chunk],
    /// Next chunk to take.
    next: &'s AtomicUsize,
    /// Set by a failing worker so the others stop.
    failed: &'s AtomicBool,
    /// Bytes per pinned buffer.
    buffer: usize,
    progress: Option<&'s (dyn Fn(u64) + Send + Sync)>,
}

/// A staging buffer: page-locked when the driver gives one, else pageable
/// (the driver then stages each copy itself before the call returns, so
/// the buffer is free again at once).
enum Buffer {
    Pinned(PinnedHostSlice<u8>),
    Pageable(Vec<u8>),
}

impl Buffer {
    fn as_mut_slice(&mut self) -> Result<&mut [u8], String> {
        match self {
            Buffer::Pinned(p) => p.as_mut_slice().map_err(|e| e.to_string()),
            Buffer::Pageable(v) => Ok(v),
        }
    }
}

fn worker(shared: &Shared<'_, '_>) -> Result<(), String> {
    let ctx = shared.gpu.context();
    ctx.bind_to_thread().map_err(|e| e.to_string())?;
    let stream = ctx.new_stream().map_err(|e| e.to_string())?;
    let mut buffers = Vec::with_capacity(2);
    let mut events: Vec<CudaEvent> = Vec::with_capacity(2);
    for _ in 0..2 {
        // SAFETY: page-locked host memory, uninitialized; only the bytes a
        // chunk writes are ever passed to a copy. PORTABLE makes it usable
        // from every context, not write-combined so staging reads stay fast.
        let pinned = unsafe {
            ctx.alloc_pinned_with_flags::<u8>(shared.buffer, sys::CU_MEMHOSTALLOC_PORTABLE)
        };
        buffers.push(match pinned {
            Ok(p) => Buffer::Pinned(p),
            // Fewer pinned bytes than asked for: pageable copies instead.
            Err(_) => Buffer::Pageable(vec![0; shared.buffer]),
        });
        events.push(ctx.new_event(None).map_err(|e| e.to_string())?);
    }
    let result = copy_chunks(shared, &stream, &mut buffers, &events);
    // Whatever happened, the copies already queued finish before their
    // buffers (and, for the caller, the arena) can be freed.
    let waited = stream.synchronize().map_err(|e| e.to_string());
    result.and(waited)
}

/// Take chunks until none is left (or another worker failed): fill a
/// staging buffer from the source, swap it to host order, queue its copy.
fn copy_chunks(
    shared: &Shared<'_, '_>,
    stream: &Arc<CudaStream>,
    buffers: &mut [Buffer],
    events: &[CudaEvent],
) -> Result<(), String> {
    let mut turn = 0usize;
    let mut recorded = [false, false];
    while !shared.failed.load(Ordering::Relaxed) {
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        let Some(chunk) = shared.chunks.get(i) else {
            break;
        };
        let up = shared
            .uploads
            .get(chunk.upload)
            .ok_or_else(|| format!("chunk {i} of no upload"))?;
        let slot = turn % 2;
        turn += 1;
        let (Some(buf), Some(event)) = (buffers.get_mut(slot), events.get(slot)) else {
            return Err("staging slot".into());
        };
        if recorded.get(slot).copied().unwrap_or(false) {
            // The previous copy out of this buffer must be done before refilling it.
            event.synchronize().map_err(|e| e.to_string())?;
        }
        let host = buf.as_mut_slice()?;
        let (Some(dst), Some(src)) = (
            host.get_mut(..chunk.len),
            up.bytes.get(chunk.start..chunk.start + chunk.len),
        ) else {
            return Err("chunk outside its buffer".into());
        };
        dst.copy_from_slice(src);
        up.order.to_host(dst, up.unit);
        let offset =
            u64::try_from(up.arena_offset + chunk.start).map_err(|_| "offset".to_owned())?;
        // SAFETY: the destination range [base + offset, + len) lies inside the
        // arena (laid out by the caller to hold every upload) and no two
        // chunks overlap; the arena outlives the copy because the worker
        // synchronizes its stream before returning, on every path; the
        // staging source is not written again until `event` (recorded right
        // after) completes.
        unsafe { result::memcpy_htod_async(shared.base + offset, &*dst, stream.cu_stream()) }
            .map_err(|e| e.to_string())?;
        event.record(stream).map_err(|e| e.to_string())?;
        if let Some(r) = recorded.get_mut(slot) {
            *r = true;
        }
        if let Some(p) = shared.progress {
            p(chunk.len as u64);
        }
    }
    Ok(())
}
