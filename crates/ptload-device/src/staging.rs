//! The page-locked staging the copy workers fill: how large, how many,
//! how it is pinned, and the process's pool of it.
//!
//! Pinning memory is what a first load pays for: `cuMemHostAlloc` locks
//! about 2.5 GiB/s, so a load at the link cannot afford it on its critical
//! path. So staging is ordinary memory (an anonymous map) registered with
//! the driver (`cuMemHostRegister`, an order of magnitude cheaper), one
//! region per round of buffers carved into the workers' buffers (a load
//! makes at most two driver calls: the workers' first buffers, then their
//! second ones while the first copies run), and kept in one pool per
//! process after the load ends, for the next load onto the same device
//! ([`release_staging`] returns it).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys, CudaContext};

use crate::driver::{guarded, make_current, text, KeepCurrent};

/// Sizes of the staging, and how it is pinned and kept.
#[derive(Debug, Clone, Copy)]
pub struct Staging {
    /// Bytes per pinned buffer at most (each copy moves at most this
    /// much); a smaller load uses smaller buffers.
    pub buffer_bytes: usize,
    /// Streams (and worker threads) per device at most; each has two
    /// buffers (one when it has a single run to copy).
    pub streams_per_device: usize,
    /// How the buffers are filled from a mapped file.
    pub fill: Fill,
    /// How the buffers are page-locked.
    pub pin: Pin,
    /// Keep the page-locked buffers when the load ends, in the process's
    /// pool, for the next load onto the same device, instead of freeing
    /// them: only the first load of a process pins memory.
    /// [`release_staging`] frees what is kept.
    pub keep: bool,
}

/// The staging budget of one device's upload: [`Staging::default`] splits
/// it between its workers (two buffers each).
const STAGING_BYTES: usize = 128 << 20;

/// Workers per device at least and at most.
const FEWEST_WORKERS: usize = 4;
const MOST_WORKERS: usize = 16;

impl Staging {
    /// The default for a machine of `cores` cores (the rule
    /// [`Staging::default`] applies): a worker per core, from 4 to 16, and
    /// 128 MiB of staging split between them (16 workers x 2 x 4 MiB on 16
    /// cores, 4 x 2 x 16 MiB on 4 or fewer), filled by positioned reads,
    /// registered and kept.
    pub fn for_cores(cores: usize) -> Staging {
        let workers = cores.clamp(FEWEST_WORKERS, MOST_WORKERS);
        Staging {
            buffer_bytes: STAGING_BYTES / 2 / workers,
            streams_per_device: workers,
            fill: Fill::Read,
            pin: Pin::Register,
            keep: true,
        }
    }

    /// Pinned bytes one device's upload uses at most.
    pub fn pinned_bytes(&self) -> usize {
        self.buffer_bytes
            .saturating_mul(2)
            .saturating_mul(self.streams_per_device)
    }
}

impl Default for Staging {
    /// [`Staging::for_cores`] of the cores this process may use.
    fn default() -> Self {
        static CORES: OnceLock<usize> = OnceLock::new();
        let cores = *CORES.get_or_init(|| {
            std::thread::available_parallelism().map_or(FEWEST_WORKERS, |n| n.get())
        });
        Staging::for_cores(cores)
    }
}

/// How the copy workers fill the staging buffers with the storages of a
/// memory-mapped checkpoint. Both give the same bytes; which is faster
/// depends on the machine (page faults cost more under some kernels and
/// sandboxes). Other storages (converted, a rank's slices, a file read
/// by ranges) are copied as they are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fill {
    /// Copy from the map: its page faults bring the file in.
    Map,
    /// Positioned reads of the file into the buffers
    /// ([`Checkpoint::read_storage_at`](ptload_reader::Checkpoint::read_storage_at)):
    /// the kernel copies from its page cache, the map is not touched.
    #[default]
    Read,
}

/// How staging memory is page-locked. Where the chosen way fails, the
/// other is tried, then pageable buffers (slower copies, same bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pin {
    /// Ordinary memory registered with the driver (`cuMemHostRegister`).
    #[default]
    Register,
    /// Memory the driver allocates (`cuMemHostAlloc`).
    Allocate,
}

/// Memory the driver has page-locked, carved into staging buffers; unpinned
/// and freed when the last of them is dropped.
pub(crate) struct Region {
    /// The context that pinned it (portable: every context may copy from
    /// it); taken when the region is dropped.
    ctx: Option<Arc<CudaContext>>,
    ptr: *mut u8,
    memory: Memory,
}

enum Memory {
    /// An anonymous map registered with the driver.
    Registered(memmap2::MmapMut),
    /// Allocated by the driver.
    Allocated,
}

// SAFETY: the region's bytes are reached only through `Buffer`s, which
// cover disjoint ranges and give them out through `&mut self`; the
// pointer is the region's own and freed only on drop.
unsafe impl Send for Region {}
// SAFETY: as above; a shared `Region` gives nothing out.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // The caller's current context stays current, even when the
        // context is dropped here with the region (its drop binds it).
        let _keep = KeepCurrent::new();
        let ctx = self.ctx.take();
        let unpinned = guarded(|| {
            make_current(ctx.as_ref().ok_or("no context")?)?;
            match self.memory {
                // SAFETY: `ptr` was registered by `register` and every copy
                // from it has completed (the workers wait for their copies
                // before dropping their buffers).
                Memory::Registered(_) => {
                    unsafe { sys::cuMemHostUnregister(self.ptr.cast()) }.result()
                }
                // SAFETY: `ptr` came from `cuMemHostAlloc`, as above.
                Memory::Allocated => unsafe { result::free_host(self.ptr.cast()) },
            }
            .map_err(text)
        });
        if unpinned.is_err() {
            // Still pinned for the driver: leak the map rather than hand
            // its pages back while the driver may hold them.
            if let Memory::Registered(map) = std::mem::replace(&mut self.memory, Memory::Allocated)
            {
                std::mem::forget(map);
            }
        }
        drop(ctx);
    }
}

/// A staging buffer: part of a page-locked region, or, where pinning
/// failed, pageable (the driver then stages each copy itself before the
/// call returns, so the buffer is free again at once).
pub(crate) enum Buffer {
    Pinned {
        region: Arc<Region>,
        offset: usize,
        len: usize,
    },
    Pageable(Vec<u8>),
}

impl Buffer {
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Buffer::Pinned {
                region,
                offset,
                len,
            } => {
                // SAFETY: `[offset, offset + len)` lies inside the region
                // (carved by `Stager::make`), which `region` keeps alive;
                // its bytes are initialized (zeroed when made); no other
                // buffer covers them, and this one is borrowed mutably.
                unsafe { std::slice::from_raw_parts_mut(region.ptr.add(*offset), *len) }
            }
            Buffer::Pageable(v) => v,
        }
    }

    fn len(&self) -> usize {
        match self {
            Buffer::Pinned { len, .. } => *len,
            Buffer::Pageable(v) => v.len(),
        }
    }
}

/// Page-locked buffers kept between loads, by the ordinal of the device
/// whose context pinned them.
static KEPT: Mutex<Vec<(u32, Buffer)>> = Mutex::new(Vec::new());

/// Kept buffers at most: past it, the smallest are freed.
const MOST_KEPT: usize = 64;

/// Set once registering host memory has failed: the driver or the system
/// does not allow it, so later loads go straight to allocating.
static REGISTER_REFUSED: AtomicBool = AtomicBool::new(false);

/// Free the staging buffers loads kept ([`Staging::keep`]) and unpin their
/// memory; returns the bytes freed. Loads under way keep theirs until they
/// end. The memory is the process's until then (the system takes it back
/// at exit).
pub fn release_staging() -> usize {
    let kept = match KEPT.lock() {
        Ok(mut kept) => std::mem::take(&mut *kept),
        Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
    };
    let bytes = kept.iter().map(|(_, b)| b.len()).sum();
    // Unpinned on each region's context, outside the lock.
    drop(kept);
    bytes
}

/// Keep `buffers`, pinned on device `ordinal`'s context, for later loads;
/// past [`MOST_KEPT`] the smallest are freed (outside the lock: unpinning
/// can take a while).
fn keep(ordinal: u32, buffers: impl IntoIterator<Item = Buffer>) {
    let mut freed = Vec::new();
    if let Ok(mut kept) = KEPT.lock() {
        kept.extend(
            buffers
                .into_iter()
                .filter(|b| matches!(b, Buffer::Pinned { .. }))
                .map(|b| (ordinal, b)),
        );
        if kept.len() > MOST_KEPT {
            kept.sort_by_key(|(_, b)| std::cmp::Reverse(b.len()));
            freed = kept.split_off(MOST_KEPT);
        }
    }
    drop(freed);
}

/// The smallest kept buffer pinned on device `ordinal`'s context holding
/// at least `bytes`, if any.
fn take_kept(ordinal: u32, bytes: usize) -> Option<Buffer> {
    let mut kept = KEPT.lock().ok()?;
    let at = kept
        .iter()
        .enumerate()
        .filter(|(_, (o, b))| *o == ordinal && b.len() >= bytes)
        .min_by_key(|(_, (_, b))| b.len())
        .map(|(at, _)| at)?;
    Some(kept.swap_remove(at).1)
}

/// The staging of one device's upload: buffers from the process's pool,
/// or made in rounds (one driver call per round), handed to the workers
/// as they ask, and returned to the pool when the upload ends.
pub(crate) struct Stager<'s> {
    ctx: &'s Arc<CudaContext>,
    ordinal: u32,
    /// Bytes per buffer.
    size: usize,
    /// Buffers made at once: one per worker.
    round: usize,
    pin: Pin,
    keep: bool,
    /// Buffers the upload has yet to get, and those made in a round and
    /// not yet handed out.
    state: Mutex<(usize, Vec<Buffer>)>,
    /// Bytes this upload pinned, and the driver calls that pinned them.
    pub(crate) pinned: AtomicUsize,
    pub(crate) pinnings: AtomicUsize,
}

impl<'s> Stager<'s> {
    /// Staging for `workers` workers needing `buffers` buffers of `size`
    /// bytes in all.
    pub(crate) fn new(
        ctx: &'s Arc<CudaContext>,
        ordinal: u32,
        staging: &Staging,
        size: usize,
        workers: usize,
        buffers: usize,
    ) -> Self {
        Stager {
            ctx,
            ordinal,
            size,
            round: workers.max(1),
            pin: staging.pin,
            keep: staging.keep,
            state: Mutex::new((buffers, Vec::new())),
            pinned: AtomicUsize::new(0),
            pinnings: AtomicUsize::new(0),
        }
    }

    /// A buffer for a worker, whose thread has the device's context
    /// current: a kept one, one made in this round, or a new round's.
    pub(crate) fn buffer(&self) -> Result<Buffer, String> {
        // Held while a round is made: the workers asking meanwhile wait
        // for it rather than each pinning their own.
        let mut state = self.state.lock().map_err(|_| "staging lock poisoned")?;
        if let Some(b) = state.1.pop() {
            return Ok(b);
        }
        state.0 = state.0.saturating_sub(1);
        if self.keep {
            if let Some(b) = take_kept(self.ordinal, self.size) {
                return Ok(b);
            }
        }
        let mut made = self.make(state.0.saturating_add(1).min(self.round))?;
        let first = made.pop().ok_or("no staging buffer made")?;
        state.0 = state.0.saturating_sub(made.len());
        state.1.append(&mut made);
        Ok(first)
    }

    /// Return buffers whose copies have all completed: to the pool when
    /// kept, else freed (the region with its last buffer).
    pub(crate) fn give_back(&self, buffers: impl IntoIterator<Item = Buffer>) {
        if self.keep {
            keep(self.ordinal, buffers);
        }
    }

    /// `n` buffers carved from one new page-locked region, or pageable
    /// ones where nothing can be pinned.
    fn make(&self, n: usize) -> Result<Vec<Buffer>, String> {
        let n = n.max(1);
        let bytes = self
            .size
            .checked_mul(n)
            .ok_or("staging larger than the address space")?;
        let mut region = None;
        if self.pin == Pin::Register && !REGISTER_REFUSED.load(Ordering::Relaxed) {
            match register(self.ctx, bytes) {
                Ok(r) => region = Some(r),
                Err(_) => REGISTER_REFUSED.store(true, Ordering::Relaxed),
            }
        }
        if region.is_none() {
            region = allocate(self.ctx, bytes).ok();
        }
        let Some(region) = region.map(Arc::new) else {
            return Ok((0..n)
                .map(|_| Buffer::Pageable(vec![0; self.size]))
                .collect());
        };
        self.pinned.fetch_add(bytes, Ordering::Relaxed);
        self.pinnings.fetch_add(1, Ordering::Relaxed);
        Ok((0..n)
            .map(|i| Buffer::Pinned {
                region: Arc::clone(&region),
                offset: i * self.size,
                len: self.size,
            })
            .collect())
    }
}

impl Drop for Stager<'_> {
    /// Buffers made and never handed out go where the others go.
    fn drop(&mut self) {
        let spare = match self.state.get_mut() {
            Ok(state) => std::mem::take(&mut state.1),
            Err(poisoned) => std::mem::take(&mut poisoned.into_inner().1),
        };
        self.give_back(spare);
    }
}

/// `bytes` of zeroed, page-aligned ordinary memory registered with the
/// driver, on the current context.
fn register(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Region, String> {
    let mut map = memmap2::MmapMut::map_anon(bytes).map_err(|e| e.to_string())?;
    let ptr = map.as_mut_ptr();
    guarded(|| {
        // SAFETY: `ptr` is the start of a live, page-aligned mapping of
        // `bytes` bytes, owned by the region made from it, which
        // unregisters it before the mapping is dropped.
        unsafe { sys::cuMemHostRegister_v2(ptr.cast(), bytes, sys::CU_MEMHOSTREGISTER_PORTABLE) }
            .result()
            .map_err(text)
    })?;
    Ok(Region {
        ctx: Some(Arc::clone(ctx)),
        ptr,
        memory: Memory::Registered(map),
    })
}

/// `bytes` of zeroed page-locked memory the driver allocates, on the
/// current context.
fn allocate(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Region, String> {
    let ptr = guarded(|| {
        // SAFETY: page-locked host memory of `bytes` bytes, zeroed below
        // before any use. PORTABLE makes it usable from every context; not
        // write-combined, so staging reads stay fast.
        unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }.map_err(text)
    })?
    .cast::<u8>();
    // SAFETY: `ptr` holds `bytes` writable bytes (just allocated).
    unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
    Ok(Region {
        ctx: Some(Arc::clone(ctx)),
        ptr,
        memory: Memory::Allocated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_a_worker_a_core_sharing_128_mib() {
        let at = |cores| {
            let s = Staging::for_cores(cores);
            (
                s.streams_per_device,
                s.buffer_bytes >> 20,
                s.pinned_bytes() >> 20,
            )
        };
        assert_eq!(at(1), (4, 16, 128));
        assert_eq!(at(2), (4, 16, 128));
        assert_eq!(at(8), (8, 8, 128));
        assert_eq!(at(16), (16, 4, 128));
        assert_eq!(at(96), (16, 4, 128));
        let s = Staging::default();
        assert!(s.keep && s.fill == Fill::Read && s.pin == Pin::Register);
    }
}
