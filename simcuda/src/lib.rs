//! A simulated CUDA driver: the driver API calls ptload-device makes through
//! cudarc, backed by host memory.
//!
//! - Devices: `SIMCUDA_DEVICES` (default 1) of `SIMCUDA_MEMORY` bytes each
//!   (default 1 GiB); `SIMCUDA_POOLS=1` reports memory-pool support (so
//!   cudarc allocates with `cuMemAllocAsync`).
//! - Streams run their queued work later, on a thread of their own, in
//!   order; events and stream waits order them as on a GPU.
//! - Faults: `SIMCUDA_NO_DEVICE=1` (cuInit answers NO_DEVICE),
//!   `SIMCUDA_OOM_AT=k` (the k-th device allocation fails, 1-based),
//!   `SIMCUDA_PINNED_FAIL=1` (every pinned allocation fails),
//!   `SIMCUDA_REGISTER_FAIL=1` (every host registration fails, as where
//!   the driver cannot lock ordinary memory),
//!   `SIMCUDA_COPY_FAIL_AT=k` (the k-th copy is refused when queued),
//!   `SIMCUDA_COPY_FAULT_AT=k` (the k-th copy faults when it runs: the
//!   context's error is sticky, as on a GPU), `SIMCUDA_SLOW_US=n` (each copy
//!   takes n microseconds more), `SIMCUDA_OPEN_FAIL=k` (device k's primary
//!   context cannot be retained: the device is unavailable),
//!   `SIMCUDA_TOTAL_MEM_FAIL=k` (device k's total memory cannot be read).
//! - Built with `--features without-htod`, the library lacks
//!   `cuMemcpyHtoDAsync_v2` (cudarc panics when it first calls a missing
//!   symbol).
//! - Misuse that is undefined behaviour on a GPU is a *violation*: printed
//!   to stderr and appended to the file `SIMCUDA_VIOLATIONS` names: a
//!   pinned host buffer changed between a copy being queued and it running,
//!   pinned memory freed with copies pending, host memory registered twice
//!   or unregistered with copies pending, device addresses outside an
//!   allocation or freed, work with no current context.
//!
//! Pageable host memory is staged when a copy is queued, as the real driver
//! does; pinned memory is read when the copy runs (that is where the
//! checks apply).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

type CUresult = c_uint;
const SUCCESS: CUresult = 0;
const INVALID_VALUE: CUresult = 1;
const OUT_OF_MEMORY: CUresult = 2;
const NOT_INITIALIZED: CUresult = 3;
const NO_DEVICE: CUresult = 100;
const INVALID_DEVICE: CUresult = 101;
const DEVICE_UNAVAILABLE: CUresult = 46;
const INVALID_CONTEXT: CUresult = 201;
const INVALID_HANDLE: CUresult = 400;
const NOT_READY: CUresult = 600;
const ILLEGAL_ADDRESS: CUresult = 700;

const ATTR_MEMORY_POOLS_SUPPORTED: c_uint = 115;

struct Config {
    devices: usize,
    memory: u64,
    pools: bool,
    no_device: bool,
    oom_at: Option<u64>,
    pinned_fail: bool,
    register_fail: bool,
    copy_fail_at: Option<u64>,
    copy_fault_at: Option<u64>,
    slow_us: u64,
    open_fail: Option<u64>,
    total_mem_fail: Option<u64>,
    violations: Option<String>,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| Config {
        devices: env_u64("SIMCUDA_DEVICES").unwrap_or(1) as usize,
        memory: env_u64("SIMCUDA_MEMORY").unwrap_or(1 << 30),
        pools: env_u64("SIMCUDA_POOLS") == Some(1),
        no_device: env_u64("SIMCUDA_NO_DEVICE") == Some(1),
        oom_at: env_u64("SIMCUDA_OOM_AT"),
        pinned_fail: env_u64("SIMCUDA_PINNED_FAIL") == Some(1),
        register_fail: env_u64("SIMCUDA_REGISTER_FAIL") == Some(1),
        copy_fail_at: env_u64("SIMCUDA_COPY_FAIL_AT"),
        copy_fault_at: env_u64("SIMCUDA_COPY_FAULT_AT"),
        slow_us: env_u64("SIMCUDA_SLOW_US").unwrap_or(0),
        open_fail: env_u64("SIMCUDA_OPEN_FAIL"),
        total_mem_fail: env_u64("SIMCUDA_TOTAL_MEM_FAIL"),
        violations: std::env::var("SIMCUDA_VIOLATIONS").ok(),
    })
}

fn violation(message: &str) {
    eprintln!("simcuda violation: {message}");
    if let Some(path) = &config().violations {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{message}");
        }
    }
}

/// A device allocation.
struct Alloc {
    device: usize,
    data: Vec<u8>,
}

/// A pinned host allocation, and the copies queued from or to it.
struct Pinned {
    len: usize,
    pending: usize,
    /// Allocated by `cuMemHostAlloc` with this layout; `None`: the
    /// caller's memory, registered by `cuMemHostRegister`.
    layout: Option<std::alloc::Layout>,
}

#[derive(Default)]
struct Sim {
    initialized: bool,
    /// Device allocations by base address.
    allocs: BTreeMap<u64, Alloc>,
    used: Vec<u64>,
    next_addr: Vec<u64>,
    retained: Vec<usize>,
    pinned: HashMap<usize, Pinned>,
    allocations: u64,
    copies: u64,
    /// A fault's error, returned by every later call that waits (sticky).
    sticky: Option<CUresult>,
}

fn sim() -> MutexGuard<'static, Sim> {
    static SIM: OnceLock<Mutex<Sim>> = OnceLock::new();
    SIM.get_or_init(|| {
        let n = config().devices;
        Mutex::new(Sim {
            used: vec![0; n],
            next_addr: (0..n as u64).map(|d| (d + 1) << 40).collect(),
            retained: vec![0; n],
            ..Default::default()
        })
    })
    .lock()
    .unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// The current context: device index + 1, or 0.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

fn current_device() -> Option<usize> {
    CURRENT.with(|c| c.get().checked_sub(1))
}

impl Sim {
    /// The allocation holding `[addr, addr + len)`, and the offset in it.
    fn find(&mut self, addr: u64, len: usize) -> Option<(&mut Alloc, usize)> {
        let (&base, alloc) = self.allocs.range_mut(..=addr).next_back()?;
        let offset = usize::try_from(addr - base).ok()?;
        (offset.checked_add(len)? <= alloc.data.len()).then_some((alloc, offset))
    }

    /// The pinned allocation holding `[p, p + len)`, by its base.
    fn pinned_base(&self, p: usize, len: usize) -> Option<usize> {
        self.pinned
            .iter()
            .find(|(&base, a)| p >= base && p + len <= base + a.len)
            .map(|(&b, _)| b)
    }
}

// ---------------------------------------------------------------------------
// Streams and events
// ---------------------------------------------------------------------------

struct Event {
    state: Mutex<(u64, u64)>, // (recorded generation, completed generation)
    cv: Condvar,
}

enum Op {
    HtoD {
        dst: u64,
        src: Source,
        len: usize,
        fault: bool,
    },
    DtoH {
        dst: usize,
        src: u64,
        len: usize,
        pinned: Option<usize>,
        fault: bool,
    },
    Record(Arc<Event>, u64),
    Wait(Arc<Event>, u64),
    Free(u64),
}

enum Source {
    /// Pageable memory, staged when queued.
    Staged(Vec<u8>),
    /// Pinned memory (base of its allocation), read when the copy runs.
    Pinned { ptr: usize, base: usize, hash: u64 },
}

#[derive(Default)]
struct Queue {
    ops: VecDeque<Op>,
    submitted: u64,
    completed: u64,
    stop: bool,
}

struct Stream {
    device: usize,
    queue: Mutex<Queue>,
    cv: Condvar,
    worker: Mutex<Option<JoinHandle<()>>>,
}

fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn run(op: Op) {
    match op {
        Op::HtoD {
            dst,
            src,
            len,
            fault,
        } => {
            std::thread::sleep(Duration::from_micros(config().slow_us));
            let bytes = match src {
                Source::Staged(b) => b,
                Source::Pinned { ptr, base, hash: h } => {
                    let mut s = sim();
                    if !s.pinned.contains_key(&base) {
                        violation("a copy ran from pinned memory that was freed");
                        return;
                    }
                    // SAFETY: `ptr..ptr + len` lies in a live pinned
                    // allocation of this driver (checked above, under the
                    // lock that cuMemFreeHost takes).
                    let bytes =
                        unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec();
                    if hash(&bytes) != h {
                        violation(
                            "a pinned host buffer changed between its copy being queued and the copy running",
                        );
                    }
                    if let Some(p) = s.pinned.get_mut(&base) {
                        p.pending -= 1;
                    }
                    drop(s);
                    bytes
                }
            };
            let mut s = sim();
            if fault {
                s.sticky = Some(ILLEGAL_ADDRESS);
                return;
            }
            match s.find(dst, len) {
                Some((alloc, offset)) => alloc.data[offset..offset + len].copy_from_slice(&bytes),
                None => violation(&format!(
                    "a copy ran to device address {dst:#x} ({len} bytes), which is freed or outside every allocation"
                )),
            }
        }
        Op::DtoH {
            dst,
            src,
            len,
            pinned,
            fault,
        } => {
            std::thread::sleep(Duration::from_micros(config().slow_us));
            let mut s = sim();
            if fault {
                s.sticky = Some(ILLEGAL_ADDRESS);
                return;
            }
            if let Some(base) = pinned {
                if !s.pinned.contains_key(&base) {
                    violation("a copy ran into pinned memory that was freed");
                    return;
                }
            }
            match s.find(src, len) {
                Some((alloc, offset)) => {
                    let from = &alloc.data[offset..offset + len];
                    // SAFETY: the caller handed `dst..dst + len` to the copy
                    // and must keep it (pinned: checked live above; pageable:
                    // the call waits for the copy before returning).
                    unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), dst as *mut u8, len) };
                }
                None => violation(&format!(
                    "a copy ran from device address {src:#x} ({len} bytes), which is freed or outside every allocation"
                )),
            }
            if let Some(p) = pinned.and_then(|b| s.pinned.get_mut(&b)) {
                p.pending -= 1;
            }
        }
        Op::Record(event, generation) => {
            let mut st = event.state.lock().unwrap_or_else(|p| p.into_inner());
            st.1 = st.1.max(generation);
            event.cv.notify_all();
        }
        Op::Wait(event, generation) => {
            let mut st = event.state.lock().unwrap_or_else(|p| p.into_inner());
            while st.1 < generation {
                st = event.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
        Op::Free(addr) => {
            let mut s = sim();
            match s.allocs.remove(&addr) {
                Some(a) => {
                    let n = a.data.len() as u64;
                    s.used[a.device] -= n;
                }
                None => violation(&format!(
                    "free of device address {addr:#x}, which is not an allocation"
                )),
            }
        }
    }
}

impl Stream {
    fn new(device: usize) -> Arc<Stream> {
        let stream = Arc::new(Stream {
            device,
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            worker: Mutex::new(None),
        });
        let s = Arc::clone(&stream);
        let handle = std::thread::spawn(move || loop {
            let op = {
                let mut q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if let Some(op) = q.ops.pop_front() {
                        break Some(op);
                    }
                    if q.stop {
                        break None;
                    }
                    q = s.cv.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let Some(op) = op else { return };
            run(op);
            let mut q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.completed += 1;
            s.cv.notify_all();
        });
        *stream.worker.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        stream
    }

    fn push(&self, op: Op) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.ops.push_back(op);
        q.submitted += 1;
        self.cv.notify_all();
    }

    fn drain(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        while q.completed < q.submitted {
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }
}

fn streams() -> MutexGuard<'static, Vec<Arc<Stream>>> {
    static STREAMS: OnceLock<Mutex<Vec<Arc<Stream>>>> = OnceLock::new();
    STREAMS
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The stream behind a handle (0: the legacy default stream, run inline).
fn stream_of(h: *mut c_void) -> Result<Option<Arc<Stream>>, CUresult> {
    if h.is_null() {
        return Ok(None);
    }
    streams()
        .iter()
        .find(|s| Arc::as_ptr(s) as *mut c_void == h)
        .cloned()
        .map(Some)
        .ok_or(INVALID_HANDLE)
}

fn submit(stream: Option<Arc<Stream>>, op: Op) {
    match stream {
        Some(s) => s.push(op),
        None => run(op),
    }
}

fn need_context() -> Result<usize, CUresult> {
    current_device().ok_or_else(|| {
        violation("driver work with no current context");
        INVALID_CONTEXT
    })
}

fn sticky() -> CUresult {
    sim().sticky.unwrap_or(SUCCESS)
}

macro_rules! try_cu {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

// ---------------------------------------------------------------------------
// The driver API
// ---------------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    if config().no_device {
        return NO_DEVICE;
    }
    sim().initialized = true;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    if version.is_null() {
        return INVALID_VALUE;
    }
    *version = 12020;
    SUCCESS
}

fn initialized() -> Result<(), CUresult> {
    if sim().initialized {
        Ok(())
    } else {
        Err(NOT_INITIALIZED)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    try_cu!(initialized());
    *count = config().devices as c_int;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CUresult {
    try_cu!(initialized());
    if ordinal < 0 || ordinal as usize >= config().devices {
        return INVALID_DEVICE;
    }
    *device = ordinal;
    SUCCESS
}

fn device(dev: c_int) -> Result<usize, CUresult> {
    initialized()?;
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < config().devices)
        .ok_or(INVALID_DEVICE)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_uint,
    dev: c_int,
) -> CUresult {
    try_cu!(device(dev));
    *pi = match attrib {
        ATTR_MEMORY_POOLS_SUPPORTED => c_int::from(config().pools),
        75 => 9, // compute capability major
        76 => 0, // compute capability minor
        _ => 0,
    };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> CUresult {
    let d = try_cu!(device(dev));
    let text = format!("simcuda device {d}\0");
    let n = text.len().min(len.max(0) as usize);
    std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), name, n);
    if n > 0 {
        *name.add(n - 1) = 0;
    }
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CUresult {
    let d = try_cu!(device(dev));
    if config().total_mem_fail == Some(d as u64) {
        return DEVICE_UNAVAILABLE;
    }
    *bytes = config().memory as usize;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut *mut c_void, dev: c_int) -> CUresult {
    let d = try_cu!(device(dev));
    if config().open_fail == Some(d as u64) {
        return DEVICE_UNAVAILABLE;
    }
    sim().retained[d] += 1;
    *pctx = (d + 1) as *mut c_void;
    SUCCESS
}

/// Whether the device's primary context is retained (`active`).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: c_int,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    let d = try_cu!(device(dev));
    if flags.is_null() || active.is_null() {
        return INVALID_VALUE;
    }
    *flags = 0;
    *active = c_int::from(sim().retained[d] > 0);
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CUresult {
    let d = try_cu!(device(dev));
    let mut s = sim();
    if s.retained[d] == 0 {
        violation("primary context released more often than retained");
        return INVALID_CONTEXT;
    }
    s.retained[d] -= 1;
    SUCCESS
}

fn context(ctx: *mut c_void) -> Result<usize, CUresult> {
    let d = (ctx as usize).checked_sub(1).ok_or(INVALID_CONTEXT)?;
    if d >= config().devices || sim().retained[d] == 0 {
        return Err(INVALID_CONTEXT);
    }
    Ok(d)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut *mut c_void) -> CUresult {
    *pctx = CURRENT.with(Cell::get) as *mut c_void;
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CUresult {
    if ctx.is_null() {
        CURRENT.with(|c| c.set(0));
        return SUCCESS;
    }
    let d = try_cu!(context(ctx));
    CURRENT.with(|c| c.set(d + 1));
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: *mut c_void) -> CUresult {
    cuCtxSetCurrent(ctx)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut *mut c_void) -> CUresult {
    if !pctx.is_null() {
        *pctx = CURRENT.with(Cell::get) as *mut c_void;
    }
    CURRENT.with(|c| c.set(0));
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut c_int) -> CUresult {
    let d = try_cu!(need_context());
    *device = d as c_int;
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    let d = try_cu!(need_context());
    let all: Vec<Arc<Stream>> = streams()
        .iter()
        .filter(|s| s.device == d)
        .cloned()
        .collect();
    for s in all {
        s.drain();
    }
    sticky()
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let d = try_cu!(need_context());
    let used = sim().used[d];
    *free = config().memory.saturating_sub(used) as usize;
    *total = config().memory as usize;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut *mut c_void, _flags: c_uint) -> CUresult {
    let d = try_cu!(need_context());
    let s = Stream::new(d);
    *ph = Arc::as_ptr(&s) as *mut c_void;
    streams().push(s);
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(h: *mut c_void) -> CUresult {
    let Some(s) = try_cu!(stream_of(h)) else {
        return INVALID_HANDLE;
    };
    // Queued work still completes, as on a GPU; then the thread ends.
    s.drain();
    {
        let mut q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.stop = true;
        s.cv.notify_all();
    }
    if let Some(w) = s.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = w.join();
    }
    streams().retain(|x| !Arc::ptr_eq(x, &s));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(h: *mut c_void) -> CUresult {
    if let Some(s) = try_cu!(stream_of(h)) {
        s.drain();
    }
    sticky()
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(h: *mut c_void) -> CUresult {
    if let Some(s) = try_cu!(stream_of(h)) {
        let q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.completed < q.submitted {
            return NOT_READY;
        }
    }
    sticky()
}

fn events() -> MutexGuard<'static, Vec<Arc<Event>>> {
    static EVENTS: OnceLock<Mutex<Vec<Arc<Event>>>> = OnceLock::new();
    EVENTS
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn event_of(h: *mut c_void) -> Result<Arc<Event>, CUresult> {
    events()
        .iter()
        .find(|e| Arc::as_ptr(e) as *mut c_void == h)
        .cloned()
        .ok_or(INVALID_HANDLE)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph: *mut *mut c_void, _flags: c_uint) -> CUresult {
    try_cu!(need_context());
    let e = Arc::new(Event {
        state: Mutex::new((0, 0)),
        cv: Condvar::new(),
    });
    *ph = Arc::as_ptr(&e) as *mut c_void;
    events().push(e);
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(h: *mut c_void) -> CUresult {
    let e = try_cu!(event_of(h));
    events().retain(|x| !Arc::ptr_eq(x, &e));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventRecord(h: *mut c_void, stream: *mut c_void) -> CUresult {
    let e = try_cu!(event_of(h));
    let s = try_cu!(stream_of(stream));
    let generation = {
        let mut st = e.state.lock().unwrap_or_else(|p| p.into_inner());
        st.0 += 1;
        st.0
    };
    submit(s, Op::Record(e, generation));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(h: *mut c_void) -> CUresult {
    let e = try_cu!(event_of(h));
    let mut st = e.state.lock().unwrap_or_else(|p| p.into_inner());
    while st.1 < st.0 {
        st = e.cv.wait(st).unwrap_or_else(|p| p.into_inner());
    }
    drop(st);
    sticky()
}

#[no_mangle]
pub extern "C" fn cuEventQuery(h: *mut c_void) -> CUresult {
    let e = try_cu!(event_of(h));
    let st = e.state.lock().unwrap_or_else(|p| p.into_inner());
    if st.1 < st.0 {
        NOT_READY
    } else {
        sticky()
    }
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(
    stream: *mut c_void,
    h: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    let s = try_cu!(stream_of(stream));
    let e = try_cu!(event_of(h));
    let generation = e.state.lock().unwrap_or_else(|p| p.into_inner()).0;
    submit(s, Op::Wait(e, generation));
    SUCCESS
}

fn allocate(bytes: usize) -> Result<u64, CUresult> {
    let d = need_context()?;
    let mut s = sim();
    s.allocations += 1;
    if config().oom_at == Some(s.allocations) || s.used[d] + bytes as u64 > config().memory {
        return Err(OUT_OF_MEMORY);
    }
    let addr = s.next_addr[d];
    s.next_addr[d] += (bytes as u64).div_ceil(256).max(1) * 256;
    s.used[d] += bytes as u64;
    // Device memory is not zeroed: a pattern shows reads of unwritten bytes.
    s.allocs.insert(
        addr,
        Alloc {
            device: d,
            data: vec![0xcd; bytes],
        },
    );
    Ok(addr)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) -> CUresult {
    *dptr = try_cu!(allocate(bytes));
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut u64,
    bytes: usize,
    stream: *mut c_void,
) -> CUresult {
    try_cu!(stream_of(stream));
    if !config().pools {
        violation("cuMemAllocAsync on a device without memory pools");
        return INVALID_VALUE;
    }
    *dptr = try_cu!(allocate(bytes));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: u64) -> CUresult {
    try_cu!(need_context());
    // Synchronous: every stream's work finishes first.
    let all = streams().clone();
    for s in all {
        s.drain();
    }
    run(Op::Free(dptr));
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(dptr: u64, stream: *mut c_void) -> CUresult {
    let s = try_cu!(stream_of(stream));
    submit(s, Op::Free(dptr));
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytes: usize,
    _flags: c_uint,
) -> CUresult {
    try_cu!(need_context());
    if config().pinned_fail {
        return OUT_OF_MEMORY;
    }
    let Ok(layout) = std::alloc::Layout::from_size_align(bytes.max(1), 4096) else {
        return INVALID_VALUE;
    };
    let p = std::alloc::alloc(layout);
    if p.is_null() {
        return OUT_OF_MEMORY;
    }
    std::ptr::write_bytes(p, 0xab, layout.size());
    sim().pinned.insert(
        p as usize,
        Pinned {
            len: bytes,
            pending: 0,
            layout: Some(layout),
        },
    );
    *pp = p.cast();
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    let mut s = sim();
    match s.pinned.get(&(p as usize)).map(|a| a.layout) {
        Some(Some(layout)) => {
            if let Some(a) = s.pinned.remove(&(p as usize)) {
                if a.pending > 0 {
                    violation(&format!(
                        "pinned memory freed with {} copies pending",
                        a.pending
                    ));
                }
            }
            std::alloc::dealloc(p.cast(), layout);
            SUCCESS
        }
        Some(None) => {
            violation("cuMemFreeHost of registered memory (cuMemHostUnregister unpins it)");
            INVALID_VALUE
        }
        None => {
            violation("cuMemFreeHost of memory that is not pinned");
            INVALID_VALUE
        }
    }
}

const HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
const HOST_MEMORY_NOT_REGISTERED: CUresult = 713;

/// Registered ranges and bytes so far, for tests that count driver calls:
/// `(calls, bytes)` of every successful `cuMemHostRegister`.
static REGISTERED: Mutex<(u64, u64)> = Mutex::new((0, 0));

#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    bytes: usize,
    _flags: c_uint,
) -> CUresult {
    try_cu!(need_context());
    if config().register_fail {
        return OUT_OF_MEMORY;
    }
    let base = p as usize;
    if p.is_null() || bytes == 0 || !base.is_multiple_of(4096) {
        return INVALID_VALUE;
    }
    let mut s = sim();
    let overlaps = s
        .pinned
        .iter()
        .any(|(&b, a)| base < b + a.len && b < base + bytes);
    if overlaps {
        violation(&format!(
            "host memory at {base:#x} ({bytes} bytes) registered while pinned already"
        ));
        return HOST_MEMORY_ALREADY_REGISTERED;
    }
    // The driver faults every page in to lock it.
    let pages = std::slice::from_raw_parts(p.cast::<u8>(), bytes);
    for page in pages.chunks(4096) {
        std::ptr::read_volatile(page.as_ptr());
    }
    s.pinned.insert(
        base,
        Pinned {
            len: bytes,
            pending: 0,
            layout: None,
        },
    );
    drop(s);
    let mut r = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    r.0 += 1;
    r.1 += bytes as u64;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    try_cu!(need_context());
    let mut s = sim();
    match s.pinned.get(&(p as usize)).map(|a| a.layout) {
        Some(None) => {
            if let Some(a) = s.pinned.remove(&(p as usize)) {
                if a.pending > 0 {
                    violation(&format!(
                        "registered memory unregistered with {} copies pending",
                        a.pending
                    ));
                }
            }
            SUCCESS
        }
        Some(Some(_)) => {
            violation("cuMemHostUnregister of memory cuMemHostAlloc made");
            INVALID_VALUE
        }
        None => {
            violation("cuMemHostUnregister of memory that is not registered");
            HOST_MEMORY_NOT_REGISTERED
        }
    }
}

/// Not a driver call: `(calls, bytes)` of every successful
/// `cuMemHostRegister` so far, and the host bytes pinned now (allocated
/// or registered), for tests.
#[no_mangle]
pub unsafe extern "C" fn simcuda_host_pinning(calls: *mut u64, bytes: *mut u64, live: *mut u64) {
    let r = *REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    let now: usize = sim().pinned.values().map(|a| a.len).sum();
    if !calls.is_null() {
        *calls = r.0;
    }
    if !bytes.is_null() {
        *bytes = r.1;
    }
    if !live.is_null() {
        *live = now as u64;
    }
}

fn next_copy() -> (bool, bool) {
    let mut s = sim();
    s.copies += 1;
    let n = s.copies;
    (
        config().copy_fail_at == Some(n),
        config().copy_fault_at == Some(n),
    )
}

// Built with `--features without-htod`, the library lacks this symbol:
// a driver older or newer than the binding expects.
#[cfg_attr(not(feature = "without-htod"), no_mangle)]
#[cfg_attr(feature = "without-htod", allow(dead_code))]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    len: usize,
    stream: *mut c_void,
) -> CUresult {
    try_cu!(need_context());
    let s = try_cu!(stream_of(stream));
    let (fail, fault) = next_copy();
    if fail {
        return INVALID_VALUE;
    }
    {
        let mut sm = sim();
        if sm.find(dst, len).is_none() {
            violation(&format!(
                "a copy queued to device address {dst:#x} ({len} bytes), which is freed or outside every allocation"
            ));
            return INVALID_VALUE;
        }
        let src_usize = src as usize;
        if let Some(base) = sm.pinned_base(src_usize, len) {
            // SAFETY: inside a live pinned allocation of this driver.
            let h = hash(std::slice::from_raw_parts(src.cast::<u8>(), len));
            if let Some(p) = sm.pinned.get_mut(&base) {
                p.pending += 1;
            }
            drop(sm);
            submit(
                s,
                Op::HtoD {
                    dst,
                    src: Source::Pinned {
                        ptr: src_usize,
                        base,
                        hash: h,
                    },
                    len,
                    fault,
                },
            );
            return SUCCESS;
        }
    }
    // SAFETY: pageable memory the caller passed for `len` bytes; staged now.
    let staged = std::slice::from_raw_parts(src.cast::<u8>(), len).to_vec();
    submit(
        s,
        Op::HtoD {
            dst,
            src: Source::Staged(staged),
            len,
            fault,
        },
    );
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    len: usize,
    stream: *mut c_void,
) -> CUresult {
    try_cu!(need_context());
    let s = try_cu!(stream_of(stream));
    let (fail, fault) = next_copy();
    if fail {
        return INVALID_VALUE;
    }
    let pinned = {
        let mut sm = sim();
        if sm.find(src, len).is_none() {
            violation(&format!(
                "a copy queued from device address {src:#x} ({len} bytes), which is freed or outside every allocation"
            ));
            return INVALID_VALUE;
        }
        let base = sm.pinned_base(dst as usize, len);
        if let Some(p) = base.and_then(|b| sm.pinned.get_mut(&b)) {
            p.pending += 1;
        }
        base
    };
    let op = Op::DtoH {
        dst: dst as usize,
        src,
        len,
        pinned,
        fault,
    };
    match (pinned, s) {
        (Some(_), s) => submit(s, op),
        // Pageable: the call returns once the bytes are there.
        (None, Some(s)) => {
            s.push(op);
            s.drain();
        }
        (None, None) => run(op),
    }
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    let text: &'static [u8] = match error {
        SUCCESS => b"no error\0",
        INVALID_VALUE => b"invalid argument\0",
        OUT_OF_MEMORY => b"out of memory\0",
        NOT_INITIALIZED => b"initialization error\0",
        NO_DEVICE => b"no CUDA-capable device is detected\0",
        INVALID_DEVICE => b"invalid device ordinal\0",
        DEVICE_UNAVAILABLE => b"CUDA-capable device(s) is/are busy or unavailable\0",
        INVALID_CONTEXT => b"invalid device context\0",
        INVALID_HANDLE => b"invalid resource handle\0",
        NOT_READY => b"device not ready\0",
        ILLEGAL_ADDRESS => b"an illegal memory access was encountered\0",
        _ => b"unknown error\0",
    };
    *pstr = text.as_ptr().cast();
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    let text: &'static [u8] = match error {
        SUCCESS => b"CUDA_SUCCESS\0",
        INVALID_VALUE => b"CUDA_ERROR_INVALID_VALUE\0",
        OUT_OF_MEMORY => b"CUDA_ERROR_OUT_OF_MEMORY\0",
        NOT_INITIALIZED => b"CUDA_ERROR_NOT_INITIALIZED\0",
        NO_DEVICE => b"CUDA_ERROR_NO_DEVICE\0",
        DEVICE_UNAVAILABLE => b"CUDA_ERROR_DEVICE_UNAVAILABLE\0",
        INVALID_DEVICE => b"CUDA_ERROR_INVALID_DEVICE\0",
        INVALID_CONTEXT => b"CUDA_ERROR_INVALID_CONTEXT\0",
        INVALID_HANDLE => b"CUDA_ERROR_INVALID_HANDLE\0",
        NOT_READY => b"CUDA_ERROR_NOT_READY\0",
        ILLEGAL_ADDRESS => b"CUDA_ERROR_ILLEGAL_ADDRESS\0",
        _ => b"CUDA_ERROR_UNKNOWN\0",
    };
    *pstr = text.as_ptr().cast();
    SUCCESS
}
