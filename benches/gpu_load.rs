//! GPU load: the pinned host-to-device copy limit of this machine, measured
//! here, and ptload's load of one checkpoint onto cuda:0, end to end, with
//! the host memory the load takes and where its time goes.
//!
//! ```text
//! cargo bench -p ptload-device --bench gpu_load -- FILE [--runs N] [--json]
//!     [--cold] [--tp WORLD [--rank R] [--split-preset NAME]]
//!     [--streams N] [--buffer-mib N] [--fill map|read] [--pin register|alloc]
//!     [--no-keep]
//! ```
//!
//! `benches/gpu_compare.py` runs it on 2 GB and 8 GB checkpoints next to
//! `torch.load(map_location="cuda")` and safetensors' `load_file`. On the
//! simulated driver (`simcuda/`) it is a smoke check, not a speed figure:
//!
//! ```text
//! LD_LIBRARY_PATH=$PWD/simcuda/target/release \
//!     cargo test -q -p ptload-device --bench gpu_load -- $PWD/fixtures/files/multi_gpu.pt --runs 1
//! ```
//!
//! - Pinned limit: one page-locked host buffer (the storages' size, at
//!   least 1 MiB and at most 256 MiB) copied to one device buffer again and
//!   again (up to 64 times, about 2 GiB a run at 256 MiB), synchronized;
//!   bytes over seconds. Measured on one stream and split over four (as
//!   many as ptload's staging uses); the better median is the limit.
//! - ptload: `Checkpoint::open`, the state dict, a plan putting every
//!   storage on cuda:0 and `ptload_device::load`, timed together; the load
//!   returns once every copy is done. The CUDA context is created once,
//!   before any timing (as a process that already uses the GPU has it).
//!   One unmeasured load comes first.
//! - `--tp WORLD --rank R`: only rank R's part of each tensor the split
//!   preset (`--split-preset`, default `llama`) splits, the other tensors
//!   whole: the selection of the CLI's
//!   `load --shard R/WORLD --split-preset NAME`. A preset that splits
//!   nothing in the file is an error (the load would be the whole file's).
//! - `--cold`: the file is `fsync`ed once (so its cached pages are clean),
//!   then before each measured load its pages are dropped from the page
//!   cache (`posix_fadvise(POSIX_FADV_DONTNEED)` over the whole file) and
//!   the share still resident is measured with `mincore` over a fresh map
//!   of it. Above [`COLD_RESIDENT_MAX`] resident (a kernel that ignores the
//!   advice, a file on tmpfs), or when `mincore` fails, the runs are
//!   reported as not cold.
//! - Staging (for tuning on the machine at hand, without a rebuild):
//!   `--streams N` copy workers and streams and `--buffer-mib N` per pinned
//!   buffer (default: `Staging::default`'s rule, a worker per core from 4
//!   to 16 sharing 128 MiB), `--fill map` fills them from the map instead
//!   of by positioned reads, `--pin alloc` has the driver allocate them
//!   (`cuMemHostAlloc`) instead of registering ordinary memory,
//!   `--no-keep` pins and unpins them in every load instead of keeping
//!   them in the process's pool (`--keep`, the default, is accepted).
//! - The first load: the context exists, nothing is pinned yet, the file
//!   is in the page cache (the process's first load of a warm file). It
//!   checks the placement and is reported apart from the measured runs,
//!   which (keeping) reuse the staging it pinned; `--no-keep` makes every
//!   run a first load's staging.
//! - Host memory: a thread reads `/proc/self/status` about every
//!   millisecond during each measured load. ptload's host memory is the
//!   peak of RssAnon + RssShmem above their sum just before the load; the
//!   mapped file's pages (RssFile, page cache) are reported apart and not
//!   counted. The budget it is held to: the pinned staging bytes the load
//!   reports plus [`MEMORY_FILE_SHARE`] of the file.
//! - Profile: per load, the copy workers' thread-seconds (setup of the
//!   staging, filling it, waiting for copies: `DeviceReport::time`), the
//!   page faults (`getrusage(RUSAGE_SELF)`, minor and major), and the wall
//!   time.
//!
//! Medians over `--runs` (default 5). Exit status: 0 measured; 1 a run
//! failed or a tensor did not land on cuda:0 (the figure would be
//! meaningless); 2 no usable CUDA device, or bad arguments.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaContext, CudaStream, DevicePtr, DriverError};
use ptload_device::{load, probe, Fill, LoadOptions, Pin, Staging, WorkerTime};
use ptload_reader::placement::{Device, DeviceMap, To};
use ptload_reader::state_dict::StateDictOptions;
use ptload_reader::tp::{Shard, Splits};
use ptload_reader::Checkpoint;

const USAGE: &str = "usage: gpu_load FILE [--runs N] [--json] [--cold] [--tp WORLD [--rank R] [--split-preset NAME]] [--streams N] [--buffer-mib N] [--fill map|read] [--pin register|alloc] [--no-keep]";

const CUDA0: Device = Device::Cuda(0);

/// Above this share of the file still in the page cache after eviction,
/// a `--cold` run is not cold.
const COLD_RESIDENT_MAX: f64 = 0.05;

/// The host memory budget of a load: its pinned staging plus this share
/// of the file.
const MEMORY_FILE_SHARE: f64 = 0.10;

/// A tensor-parallel rank's load.
struct Tp {
    world: u32,
    rank: u32,
    preset: String,
}

struct Args {
    file: PathBuf,
    runs: usize,
    json: bool,
    cold: bool,
    tp: Option<Tp>,
    staging: Staging,
}

fn parse_args() -> Result<Args, String> {
    let mut file = None;
    let mut runs = 5;
    let mut json = false;
    let mut cold = false;
    let mut world = None;
    let mut rank = None;
    let mut preset = None;
    let mut staging = Staging::default();
    let mut args = std::env::args_os().skip(1);
    let number = |args: &mut dyn Iterator<Item = std::ffi::OsString>, what: &str| {
        args.next()
            .and_then(|v| v.to_str()?.parse::<usize>().ok())
            .ok_or_else(|| format!("{what} needs a number\n{USAGE}"))
    };
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--json") => json = true,
            Some("--cold") => cold = true,
            // `cargo bench` passes it to every bench target.
            Some("--bench") => {}
            Some("--runs") => {
                runs = Some(number(&mut args, "--runs")?)
                    .filter(|&n| n > 0)
                    .ok_or("--runs needs a positive number")?;
            }
            Some("--tp") => world = Some(number(&mut args, "--tp")?),
            Some("--streams") => {
                staging.streams_per_device = Some(number(&mut args, "--streams")?)
                    .filter(|n| (1..=64).contains(n))
                    .ok_or("--streams needs a number from 1 to 64")?;
            }
            Some("--buffer-mib") => {
                staging.buffer_bytes = Some(number(&mut args, "--buffer-mib")?)
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or("--buffer-mib needs a number from 1 to 1024")?
                    << 20;
            }
            Some("--fill") => {
                staging.fill = match args.next().as_ref().and_then(|v| v.to_str()) {
                    Some("map") => Fill::Map,
                    Some("read") => Fill::Read,
                    _ => return Err(format!("--fill takes map or read\n{USAGE}")),
                };
            }
            Some("--pin") => {
                staging.pin = match args.next().as_ref().and_then(|v| v.to_str()) {
                    Some("register") => Pin::Register,
                    Some("alloc") => Pin::Allocate,
                    _ => return Err(format!("--pin takes register or alloc\n{USAGE}")),
                };
            }
            Some("--keep") => staging.keep = true,
            Some("--no-keep") => staging.keep = false,
            Some("--rank") => rank = Some(number(&mut args, "--rank")?),
            Some("--split-preset") => {
                preset = Some(
                    args.next()
                        .and_then(|v| v.into_string().ok())
                        .ok_or("--split-preset needs a name")?,
                );
            }
            Some("-h" | "--help") => return Err(USAGE.into()),
            Some(a) if a.starts_with("--") => return Err(format!("unknown option {a}\n{USAGE}")),
            _ if file.is_none() => file = Some(PathBuf::from(arg)),
            _ => return Err(format!("one file only\n{USAGE}")),
        }
    }
    let file = file.ok_or(USAGE)?;
    let tp = match world {
        None if rank.is_some() || preset.is_some() => {
            return Err(format!(
                "--rank and --split-preset need --tp WORLD\n{USAGE}"
            ))
        }
        None => None,
        Some(world) => {
            let world = u32::try_from(world).map_err(|_| "--tp: too large")?;
            let rank = u32::try_from(rank.unwrap_or(0)).map_err(|_| "--rank: too large")?;
            // The same checks as the CLI's --shard and --split-preset.
            Shard::new(rank, world).map_err(|e| e.to_string())?;
            let preset = preset.unwrap_or_else(|| "llama".to_owned());
            Splits::preset(&preset).map_err(|e| e.to_string())?;
            Some(Tp {
                world,
                rank,
                preset,
            })
        }
    };
    Ok(Args {
        file,
        runs,
        json,
        cold,
        tp,
        staging,
    })
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The pinned host-to-device limit, with one stream and with
/// [`LIMIT_STREAMS`] streams: GB/s of each run.
struct Pinned {
    buffer_bytes: usize,
    copies: usize,
    one_stream: Vec<f64>,
    streams: Vec<f64>,
}

impl Pinned {
    /// The limit: the better of the two medians.
    fn gbps(&self) -> f64 {
        median(&self.one_stream).max(median(&self.streams))
    }
}

/// As many streams as ptload's default staging uses.
const LIMIT_STREAMS: usize = 4;

/// A driver error, saying what failed.
fn err(what: &'static str) -> impl Fn(DriverError) -> String {
    move |e| format!("{what}: {e}")
}

fn pinned_limit(ctx: &Arc<CudaContext>, bytes: u64, runs: usize) -> Result<Pinned, String> {
    let len = usize::try_from(bytes)
        .unwrap_or(usize::MAX)
        .clamp(1 << 20, 256 << 20)
        / 4096
        * 4096;
    // About 2 GiB per run for the largest buffer, never fewer than 4 copies.
    let copies = (2usize << 30).div_ceil(len).clamp(4, 64);
    let streams = (0..LIMIT_STREAMS)
        .map(|_| ctx.new_stream().map_err(err("stream")))
        .collect::<Result<Vec<_>, _>>()?;
    // SAFETY: every byte is written just below, before any copy reads it.
    // PORTABLE, as ptload's own staging buffers.
    let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(len, sys::CU_MEMHOSTALLOC_PORTABLE) }
        .map_err(err("pinned host buffer"))?;
    for (i, b) in host
        .as_mut_slice()
        .map_err(err("pinned host buffer"))?
        .iter_mut()
        .enumerate()
    {
        *b = i as u8;
    }
    // SAFETY: device memory that is only written (by the copies), never read.
    let dev = unsafe { streams[0].alloc::<u8>(len) }.map_err(err("device buffer"))?;
    streams[0].synchronize().map_err(err("synchronize"))?;
    let base = dev.device_ptr(&streams[0]).0;
    let src = host.as_slice().map_err(err("pinned host buffer"))?;
    let sync_all = |streams: &[Arc<CudaStream>]| {
        streams
            .iter()
            .try_for_each(|s| s.synchronize().map_err(err("synchronize")))
    };
    // `copies` times the whole buffer, split evenly over `streams`.
    let pass = |streams: &[Arc<CudaStream>]| -> Result<f64, String> {
        let part = len / streams.len();
        let start = Instant::now();
        for _ in 0..copies {
            for (k, stream) in streams.iter().enumerate() {
                let at = k * part;
                let end = if k + 1 == streams.len() {
                    len
                } else {
                    at + part
                };
                // SAFETY: [base + at, base + end) lies inside `dev`, which
                // outlives the copy (every stream is synchronized below and
                // before `dev` is dropped); `src` is pinned and never
                // written while copies are queued.
                unsafe {
                    result::memcpy_htod_async(base + at as u64, &src[at..end], stream.cu_stream())
                }
                .map_err(err("copy"))?;
            }
        }
        sync_all(streams)?;
        Ok((len * copies) as f64 / start.elapsed().as_secs_f64() / 1e9)
    };
    let measure = |streams: &[Arc<CudaStream>]| -> Result<Vec<f64>, String> {
        // Warm up: the first copies pay for mappings set up lazily.
        pass(streams)?;
        (0..runs).map(|_| pass(streams)).collect()
    };
    let outcome = measure(&streams[..1]).and_then(|one| Ok((one, measure(&streams)?)));
    // Whatever happened, nothing may still read `host` or write `dev`.
    let synced = sync_all(&streams);
    let (one_stream, many) = outcome?;
    synced?;
    drop(dev);
    drop(host);
    Ok(Pinned {
        buffer_bytes: len,
        copies,
        one_stream,
        streams: many,
    })
}

/// This process's resident memory by kind, from `/proc/self/status`.
#[derive(Debug, Clone, Copy)]
struct Rss {
    anon: u64,
    shmem: u64,
    file: u64,
}

impl Rss {
    /// Read into `buf` (reused, so sampling allocates nothing once it has
    /// grown); `None` when the file or a field is missing.
    fn read(buf: &mut String) -> Option<Rss> {
        use std::io::Read;
        buf.clear();
        File::open("/proc/self/status")
            .ok()?
            .read_to_string(buf)
            .ok()?;
        let field = |name: &str| -> Option<u64> {
            let kb = buf.lines().find_map(|l| l.strip_prefix(name))?;
            let kb: u64 = kb.trim().strip_suffix("kB")?.trim().parse().ok()?;
            kb.checked_mul(1024)
        };
        Some(Rss {
            anon: field("RssAnon:")?,
            shmem: field("RssShmem:")?,
            file: field("RssFile:")?,
        })
    }

    fn anon_shmem(&self) -> u64 {
        self.anon.saturating_add(self.shmem)
    }
}

/// The peaks a [`Sampler`] saw, above the baseline it read first.
#[derive(Debug, Clone, Copy)]
struct Peak {
    /// RssAnon + RssShmem: ptload's host memory.
    anon_shmem: u64,
    /// RssFile: pages of mapped files (the checkpoint's page cache).
    file: u64,
    samples: usize,
}

/// A thread reading `/proc/self/status` about every millisecond until
/// it is finished.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Option<Peak>>,
}

impl Sampler {
    /// Started, with its baseline read, when this returns.
    fn start() -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let (ready, started) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut buf = String::with_capacity(8192);
            // Read twice: the first grows the buffer, so the baseline
            // counts it.
            let _ = Rss::read(&mut buf);
            let baseline = Rss::read(&mut buf);
            let _ = ready.send(());
            let baseline = baseline?;
            let (mut anon_shmem, mut file, mut samples) = (baseline.anon_shmem(), baseline.file, 0);
            loop {
                // One more sample after the stop is seen: the end of the load.
                let last = flag.load(Ordering::Acquire);
                if let Some(now) = Rss::read(&mut buf) {
                    anon_shmem = anon_shmem.max(now.anon_shmem());
                    file = file.max(now.file);
                    samples += 1;
                }
                if last {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Some(Peak {
                anon_shmem: anon_shmem - baseline.anon_shmem(),
                file: file - baseline.file,
                samples,
            })
        });
        let _ = started.recv();
        Sampler { stop, thread }
    }

    /// The peaks; `None` where `/proc/self/status` has no such fields.
    fn finish(self) -> Option<Peak> {
        self.stop.store(true, Ordering::Release);
        self.thread.join().ok().flatten()
    }
}

/// Minor and major page faults of this process so far.
fn faults() -> Option<(u64, u64)> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given, which is valid for
    // writes of its size.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: zeroed, then filled by a successful getrusage.
    let usage = unsafe { usage.assume_init() };
    Some((
        u64::try_from(usage.ru_minflt).ok()?,
        u64::try_from(usage.ru_majflt).ok()?,
    ))
}

fn io_err(what: &str, file: &Path) -> impl Fn(std::io::Error) -> String {
    let what = format!("{what} {}", file.display());
    move |e| format!("{what}: {e}")
}

/// Write any dirty page of `file` back, so eviction can drop them all.
fn fsync(file: &Path) -> Result<(), String> {
    File::open(file)
        .and_then(|f| f.sync_all())
        .map_err(io_err("fsync", file))
}

/// Ask the kernel to drop `file`'s pages from the page cache.
fn evict(file: &Path) -> Result<(), String> {
    let f = File::open(file).map_err(io_err("open", file))?;
    // SAFETY: a descriptor open for the duration of the call; the call
    // only advises the kernel about the file's cached pages.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(format!(
            "posix_fadvise(DONTNEED) {}: {}",
            file.display(),
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    Ok(())
}

/// The share of `file`'s pages in the page cache, from `mincore` over a
/// fresh map of it (which reads nothing).
fn resident(file: &Path) -> Result<f64, String> {
    let f = File::open(file).map_err(io_err("open", file))?;
    let len = f.metadata().map_err(io_err("stat", file))?.len();
    if len == 0 {
        return Ok(0.0);
    }
    // SAFETY: nothing reads through the map; mincore only asks which of
    // its pages are cached, so a change to the file cannot be observed.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(io_err("map", file))?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = usize::try_from(page)
        .ok()
        .filter(|&p| p > 0)
        .ok_or("the page size is unknown")?;
    let mut pages = vec![0u8; map.len().div_ceil(page)];
    // SAFETY: the range is the whole map, whose start is page-aligned, and
    // `pages` has one byte for each of its pages.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr() as *mut libc::c_void,
            map.len(),
            pages.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "mincore {}: {}",
            file.display(),
            std::io::Error::last_os_error()
        ));
    }
    let cached = pages.iter().filter(|&&p| p & 1 != 0).count();
    Ok(cached as f64 / pages.len() as f64)
}

/// One ptload load of the file onto cuda:0.
struct Run {
    /// Open, state dict, plan and load.
    seconds: f64,
    /// The load alone, as the result reports it.
    load_seconds: f64,
    tensors: usize,
    /// Tensors of which only the rank's part was loaded (`--tp`).
    split: usize,
    /// Storage bytes placed on cuda:0.
    bytes: u64,
    /// Tensors that are not on cuda:0, with where they are and why.
    fallbacks: Vec<String>,
    /// Page-locked staging bytes the load allocated for cuda:0, and the
    /// driver calls that did it.
    pinned_bytes: usize,
    pinnings: usize,
    /// Host-to-device copies made.
    copies: usize,
    /// Where the copy workers spent their time.
    time: WorkerTime,
    /// Minor and major page faults during the load.
    faults: Option<(u64, u64)>,
    memory: Option<Peak>,
}

fn ptload_run(
    file: &Path,
    gpus: &ptload_device::Gpus,
    options: &StateDictOptions,
    staging: Staging,
) -> Result<Run, String> {
    let sampler = Sampler::start();
    let faults_before = faults();
    let start = Instant::now();
    let outcome = (|| {
        let ckpt = Arc::new(Checkpoint::open(file).map_err(|e| format!("open: {e}"))?);
        let selection = options
            .select(&ckpt)
            .map_err(|e| format!("state dict: {e}"))?;
        let split = selection.iter().filter(|e| e.slice.is_some()).count();
        let plan = DeviceMap::new(&ckpt, &mut To(CUDA0)).map_err(|e| format!("plan: {e}"))?;
        let opts = LoadOptions {
            staging,
            ..Default::default()
        };
        let loaded = load(Arc::clone(&ckpt), &selection, &plan, gpus, &opts)
            .map_err(|e| format!("load: {e}"))?;
        Ok::<_, String>((loaded, split))
    })();
    let seconds = start.elapsed().as_secs_f64();
    let faults_after = faults();
    // Still holding the result: its host memory is counted.
    let memory = sampler.finish();
    let (loaded, split) = outcome?;
    let faults = faults_before
        .zip(faults_after)
        .map(|((min0, maj0), (min1, maj1))| (min1.saturating_sub(min0), maj1.saturating_sub(maj0)));
    let fallbacks = loaded
        .tensors()
        .iter()
        .filter(|t| t.device != CUDA0 || t.fallback.is_some())
        .map(|t| {
            format!(
                "{} on {}: {}",
                t.name(),
                t.device,
                t.fallback
                    .as_ref()
                    .map_or_else(|| "no reason given".to_owned(), ToString::to_string)
            )
        })
        .collect();
    let cuda0 = loaded.devices().iter().find(|d| d.device == CUDA0);
    Ok(Run {
        seconds,
        load_seconds: loaded.seconds(),
        tensors: loaded.tensors().len(),
        split,
        bytes: cuda0.map_or(0, |d| d.bytes),
        fallbacks,
        pinned_bytes: cuda0.map_or(0, |d| d.pinned_bytes),
        pinnings: cuda0.map_or(0, |d| d.pinnings),
        copies: cuda0.map_or(0, |d| d.copies),
        time: cuda0.map_or_else(WorkerTime::default, |d| d.time),
        faults,
        memory,
    })
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if !args.file.is_file() {
        eprintln!("gpu_load: {}: not a file", args.file.display());
        return ExitCode::from(2);
    }
    // The context is created here, once, outside every timing.
    let gpus = probe();
    if gpus.devices().is_empty() {
        eprintln!(
            "gpu_load: no CUDA device to measure: {} (nothing was measured)",
            gpus.why_none()
        );
        return ExitCode::from(2);
    }
    match measure(&args, &gpus) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpu_load: {}: {e}", args.file.display());
            ExitCode::from(1)
        }
    }
}

/// Drop the file from the page cache, then say how much of it is still
/// there (`None`: unknown, said on stderr).
fn make_cold(file: &Path) -> Option<f64> {
    if let Err(e) = evict(file) {
        eprintln!("gpu_load: {e}");
    }
    resident(file).map_err(|e| eprintln!("gpu_load: {e}")).ok()
}

fn measure(args: &Args, gpus: &ptload_device::Gpus) -> Result<ExitCode, String> {
    let ctx = CudaContext::new(0).map_err(|e| format!("cuda:0: {e}"))?;
    let device_name = ctx.name().unwrap_or_else(|_| "unknown".into());
    let device_total = ctx.total_mem().unwrap_or(0);
    let file_bytes = std::fs::metadata(&args.file)
        .map_err(|e| e.to_string())?
        .len();
    let options = StateDictOptions {
        parallel: match &args.tp {
            None => None,
            Some(tp) => Some((
                Shard::new(tp.rank, tp.world).map_err(|e| e.to_string())?,
                Splits::preset(&tp.preset).map_err(|e| e.to_string())?,
            )),
        },
        ..Default::default()
    };
    if args.cold {
        fsync(&args.file)?;
    }

    // Nothing kept from before: the first load pins its staging.
    ptload_device::release_staging();
    // Checks the placement before anything else is timed; reported apart.
    let first = ptload_run(&args.file, gpus, &options, args.staging)?;
    if !first.fallbacks.is_empty() {
        eprintln!(
            "gpu_load: {} of {} tensors did not land on cuda:0, so no figure would mean anything:",
            first.fallbacks.len(),
            first.tensors
        );
        for f in first.fallbacks.iter().take(10) {
            eprintln!("  {f}");
        }
        return Ok(ExitCode::from(1));
    }
    if let Some(tp) = &args.tp {
        if first.split == 0 {
            eprintln!(
                "gpu_load: the split preset {:?} splits no tensor of this file: a rank's load would be the whole file's",
                tp.preset
            );
            return Ok(ExitCode::from(1));
        }
    }

    let pinned = pinned_limit(&ctx, first.bytes, args.runs)?;

    let mut runs = Vec::with_capacity(args.runs);
    let mut resident_before = Vec::with_capacity(args.runs);
    for _ in 0..args.runs {
        if args.cold {
            resident_before.push(make_cold(&args.file));
        }
        let run = ptload_run(&args.file, gpus, &options, args.staging)?;
        if !run.fallbacks.is_empty() || run.bytes != first.bytes {
            eprintln!(
                "gpu_load: a measured run placed {} bytes on cuda:0 (first: {}), {} tensors elsewhere:",
                run.bytes,
                first.bytes,
                run.fallbacks.len()
            );
            for f in run.fallbacks.iter().take(10) {
                eprintln!("  {f}");
            }
            return Ok(ExitCode::from(1));
        }
        runs.push(run);
    }

    if args.staging.keep {
        ptload_device::release_staging();
    }
    let report = Report::new(args, &first, &pinned, &runs, &resident_before, file_bytes);
    let machine = format!(
        "{} ({} threads), {} {}",
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    if args.json {
        let mut doc = report.json();
        doc["machine"] = machine.into();
        doc["device"] =
            serde_json::json!({"ordinal": 0, "name": device_name, "total_bytes": device_total});
        println!("{doc}");
    } else {
        println!("machine: {machine}");
        println!(
            "device:  cuda:0 {device_name} ({:.1} GiB)",
            device_total as f64 / f64::from(1u32 << 30)
        );
        report.print();
        if device_name.starts_with("simcuda") {
            println!("(the simulated driver: its device memory is host memory, counted above; not a speed figure)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The figures of one invocation.
struct Report<'a> {
    args: &'a Args,
    file_bytes: u64,
    tensors: usize,
    split: usize,
    bytes: u64,
    /// Pinned bytes the first load allocated (kept: the pool the measured
    /// loads reuse), and the driver calls that pinned them.
    first_pinned: usize,
    first_pinnings: usize,
    /// The first load: open, state dict, plan and load, seconds.
    first_seconds: f64,
    first_time: WorkerTime,
    pinned: &'a Pinned,
    runs: &'a [Run],
    /// `--cold`: the share of the file cached before each measured run.
    resident_before: &'a [Option<f64>],
}

impl<'a> Report<'a> {
    fn new(
        args: &'a Args,
        first: &Run,
        pinned: &'a Pinned,
        runs: &'a [Run],
        resident_before: &'a [Option<f64>],
        file_bytes: u64,
    ) -> Self {
        Report {
            args,
            file_bytes,
            tensors: first.tensors,
            split: first.split,
            bytes: first.bytes,
            first_pinned: first.pinned_bytes,
            first_pinnings: first.pinnings,
            first_seconds: first.seconds,
            first_time: first.time,
            pinned,
            runs,
            resident_before,
        }
    }

    fn seconds(&self) -> f64 {
        median(&self.runs.iter().map(|r| r.seconds).collect::<Vec<_>>())
    }

    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds() / 1e9
    }

    /// The most of the file found cached before a measured run; `None`
    /// when not `--cold`, or when any measurement failed.
    fn resident_max(&self) -> Option<f64> {
        if !self.args.cold {
            return None;
        }
        self.resident_before
            .iter()
            .try_fold(0.0f64, |max, r| Some(max.max((*r)?)))
    }

    /// `--cold` and every run started with the file out of the cache.
    fn cold(&self) -> bool {
        self.resident_max().is_some_and(|r| r <= COLD_RESIDENT_MAX)
    }

    /// The staging pool of the load: the most any run allocated, or with
    /// `--keep` the pool the first load pinned and the others reuse.
    fn pinned_bytes(&self) -> usize {
        let most = self.runs.iter().map(|r| r.pinned_bytes).max().unwrap_or(0);
        if self.args.staging.keep {
            most.max(self.first_pinned)
        } else {
            most
        }
    }

    fn memory_budget(&self) -> u64 {
        self.pinned_bytes() as u64 + (self.file_bytes as f64 * MEMORY_FILE_SHARE) as u64
    }

    /// The highest host memory peak over the runs; `None` when any run
    /// could not be sampled.
    fn memory_peak(&self) -> Option<Peak> {
        self.runs.iter().try_fold(
            Peak {
                anon_shmem: 0,
                file: 0,
                samples: usize::MAX,
            },
            |max, r| {
                let p = r.memory?;
                Some(Peak {
                    anon_shmem: max.anon_shmem.max(p.anon_shmem),
                    file: max.file.max(p.file),
                    samples: max.samples.min(p.samples),
                })
            },
        )
    }

    fn each(&self, f: impl Fn(&Run) -> f64) -> Vec<f64> {
        self.runs.iter().map(f).collect()
    }

    fn json(&self) -> serde_json::Value {
        let seconds = self.each(|r| r.seconds);
        let memory = self.memory_peak().map(|peak| {
            serde_json::json!({
                "peak_bytes": peak.anon_shmem,
                "peak_bytes_each": self.runs.iter().map(|r| r.memory.map(|m| m.anon_shmem)).collect::<Vec<_>>(),
                "file_peak_bytes": peak.file,
                "fewest_samples": peak.samples,
                "pinned_bytes": self.pinned_bytes(),
                "budget_bytes": self.memory_budget(),
                "budget_file_share": MEMORY_FILE_SHARE,
                "within_budget": peak.anon_shmem <= self.memory_budget(),
            })
        });
        let faults = |pick: fn((u64, u64)) -> u64| {
            self.runs
                .iter()
                .map(|r| r.faults.map(pick))
                .collect::<Vec<_>>()
        };
        serde_json::json!({
            "file": self.args.file.display().to_string(),
            "file_bytes": self.file_bytes,
            "tensors": self.tensors,
            "storage_bytes": self.bytes,
            "runs": self.args.runs,
            "staging": {
                "streams": self.args.staging.streams_per_device,
                "buffer_bytes": self.args.staging.buffer_bytes,
                "fill": match self.args.staging.fill { Fill::Map => "map", Fill::Read => "read" },
                "keep": self.args.staging.keep,
                "pin": match self.args.staging.pin { Pin::Register => "register", Pin::Allocate => "alloc" },
            },
            "first": {
                "seconds": self.first_seconds,
                "gbps": self.bytes as f64 / self.first_seconds / 1e9,
                "fraction_of_pinned": self.bytes as f64 / self.first_seconds / 1e9 / self.pinned.gbps(),
                "pinned_bytes": self.first_pinned,
                "pinnings": self.first_pinnings,
                "setup_seconds": self.first_time.setup_seconds,
                "fill_seconds": self.first_time.fill_seconds,
                "wait_seconds": self.first_time.wait_seconds,
            },
            "tp": self.args.tp.as_ref().map(|tp| serde_json::json!({
                "world": tp.world, "rank": tp.rank, "split_preset": tp.preset,
                "split_tensors": self.split,
            })),
            "cold": self.args.cold.then(|| serde_json::json!({
                "resident_before": self.resident_before,
                "resident_max": self.resident_max(),
                "resident_threshold": COLD_RESIDENT_MAX,
                "effective": self.cold(),
            })),
            "pinned": {
                "buffer_bytes": self.pinned.buffer_bytes,
                "copies_per_run": self.pinned.copies,
                "streams": LIMIT_STREAMS,
                "gbps_median": self.pinned.gbps(),
                "one_stream_gbps_median": median(&self.pinned.one_stream),
                "streams_gbps_median": median(&self.pinned.streams),
                "one_stream_gbps": self.pinned.one_stream,
                "streams_gbps": self.pinned.streams,
            },
            "ptload": {
                "seconds_median": self.seconds(),
                "seconds": seconds,
                "load_seconds_median": median(&self.each(|r| r.load_seconds)),
                "gbps": self.gbps(),
                "fraction_of_pinned": self.gbps() / self.pinned.gbps(),
            },
            "memory": memory,
            "profile": {
                "copies": self.runs.first().map_or(0, |r| r.copies),
                "setup_seconds": self.each(|r| r.time.setup_seconds),
                "fill_seconds": self.each(|r| r.time.fill_seconds),
                "wait_seconds": self.each(|r| r.time.wait_seconds),
                "setup_seconds_median": median(&self.each(|r| r.time.setup_seconds)),
                "fill_seconds_median": median(&self.each(|r| r.time.fill_seconds)),
                "wait_seconds_median": median(&self.each(|r| r.time.wait_seconds)),
                "minor_faults": faults(|f| f.0),
                "major_faults": faults(|f| f.1),
            },
            "fallbacks": 0,
        })
    }

    fn print(&self) {
        let a = self.args;
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        println!(
            "file:    {} ({} tensors, {:.1} MB of storages, file {:.1} MB); medians, runs: {}",
            a.file.display(),
            self.tensors,
            self.bytes as f64 / 1e6,
            self.file_bytes as f64 / 1e6,
            a.runs
        );
        let st = &a.staging;
        println!(
            "staging: {} streams x 2 buffers of {} MiB, filled from {}{}",
            st.streams_per_device,
            st.buffer_bytes >> 20,
            match st.fill {
                Fill::Map => "the map",
                Fill::Read => "positioned reads",
            },
            if st.keep { ", kept between loads" } else { "" }
        );
        if let Some(tp) = &a.tp {
            println!(
                "tp:      rank {} of {} ({} preset): {} tensors split, the rest whole",
                tp.rank, tp.world, tp.preset, self.split
            );
        }
        if a.cold {
            match self.resident_max() {
                Some(r) if self.cold() => println!(
                    "cache:   cold (at most {:.1}% of the file cached before a run)",
                    r * 100.0
                ),
                Some(r) => println!(
                    "cache:   NOT COLD: eviction left up to {:.1}% of the file cached (over {:.0}%), so these are not cold figures",
                    r * 100.0,
                    COLD_RESIDENT_MAX * 100.0
                ),
                None => println!(
                    "cache:   NOT KNOWN TO BE COLD: mincore failed (above), so these are not cold figures"
                ),
            }
        }
        let pinned = self.pinned;
        println!(
            "pinned host->device limit     {:>9.2} GB/s  (1 stream {:.2}, {LIMIT_STREAMS} streams {:.2}; {} MiB pinned buffer, {} times a run)",
            pinned.gbps(),
            median(&pinned.one_stream),
            median(&pinned.streams),
            pinned.buffer_bytes >> 20,
            pinned.copies
        );
        println!(
            "ptload open + load to cuda:0  {:>9.4} s     {:>7.2} GB/s  {:.0}% of the pinned limit",
            self.seconds(),
            self.gbps(),
            self.gbps() / pinned.gbps() * 100.0
        );
        println!(
            "  of which load()             {:>9.4} s",
            median(&self.each(|r| r.load_seconds))
        );
        let first_gbps = self.bytes as f64 / self.first_seconds / 1e9;
        println!(
            "first load of the process     {:>9.4} s     {:>7.2} GB/s  {:.0}% of the pinned limit; pinned {:.0} MiB in {} driver calls, setup {:.4} thread-s",
            self.first_seconds,
            first_gbps,
            first_gbps / pinned.gbps() * 100.0,
            mib(self.first_pinned as u64),
            self.first_pinnings,
            self.first_time.setup_seconds
        );
        println!(
            "  copy workers (thread-s)     setup {:.4}, fill {:.4}, wait {:.4}; {} copies",
            median(&self.each(|r| r.time.setup_seconds)),
            median(&self.each(|r| r.time.fill_seconds)),
            median(&self.each(|r| r.time.wait_seconds)),
            self.runs.first().map_or(0, |r| r.copies)
        );
        let faults: Vec<(u64, u64)> = self.runs.iter().filter_map(|r| r.faults).collect();
        if faults.len() == self.runs.len() {
            println!(
                "  page faults                 minor {:.0}, major {:.0}",
                median(&faults.iter().map(|f| f.0 as f64).collect::<Vec<_>>()),
                median(&faults.iter().map(|f| f.1 as f64).collect::<Vec<_>>())
            );
        }
        match self.memory_peak() {
            Some(peak) => println!(
                "host memory (peak, all runs)  {:.1} MiB RssAnon+RssShmem above the start ({}): budget {:.1} MiB = {:.1} MiB pinned staging + {:.0}% of the file; RssFile {:.1} MiB (page cache, not counted)",
                mib(peak.anon_shmem),
                if peak.anon_shmem <= self.memory_budget() { "within" } else { "OVER" },
                mib(self.memory_budget()),
                mib(self.pinned_bytes() as u64),
                MEMORY_FILE_SHARE * 100.0,
                mib(peak.file)
            ),
            None => println!("host memory: not measured (/proc/self/status has no RssAnon, RssShmem, RssFile)"),
        }
        println!("every tensor on cuda:0 in every run (0 fallbacks)");
    }
}
