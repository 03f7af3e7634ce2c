//! GPU load: the pinned host-to-device copy limit of this machine, measured
//! here, and ptload's load of one checkpoint onto cuda:0, end to end.
//!
//! ```text
//! cargo bench -p ptload-device --bench gpu_load -- FILE [--runs N] [--json]
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
//!
//! Medians over `--runs` (default 5). Exit status: 0 measured; 1 a run
//! failed or a tensor did not land on cuda:0 (the figure would be
//! meaningless); 2 no usable CUDA device, or bad arguments.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{result, sys, CudaContext, CudaStream, DevicePtr, DriverError};
use ptload_device::{load, probe, LoadOptions};
use ptload_reader::placement::{Device, DeviceMap, To};
use ptload_reader::state_dict::StateDictOptions;
use ptload_reader::Checkpoint;

const USAGE: &str = "usage: gpu_load FILE [--runs N] [--json]";

const CUDA0: Device = Device::Cuda(0);

struct Args {
    file: PathBuf,
    runs: usize,
    json: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut file = None;
    let mut runs = 5;
    let mut json = false;
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--json") => json = true,
            // `cargo bench` passes it to every bench target.
            Some("--bench") => {}
            Some("--runs") => {
                runs = args
                    .next()
                    .and_then(|v| v.to_str()?.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--runs needs a positive number")?;
            }
            Some("-h" | "--help") => return Err(USAGE.into()),
            Some(a) if a.starts_with("--") => return Err(format!("unknown option {a}\n{USAGE}")),
            _ if file.is_none() => file = Some(PathBuf::from(arg)),
            _ => return Err(format!("one file only\n{USAGE}")),
        }
    }
    let file = file.ok_or(USAGE)?;
    Ok(Args { file, runs, json })
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

/// One ptload load of the file onto cuda:0.
struct Run {
    /// Open, state dict, plan and load.
    seconds: f64,
    /// The load alone, as the result reports it.
    load_seconds: f64,
    tensors: usize,
    /// Storage bytes placed on cuda:0.
    bytes: u64,
    /// Tensors that are not on cuda:0, with where they are and why.
    fallbacks: Vec<String>,
}

fn ptload_run(file: &Path, gpus: &ptload_device::Gpus) -> Result<Run, String> {
    let start = Instant::now();
    let ckpt = Arc::new(Checkpoint::open(file).map_err(|e| format!("open: {e}"))?);
    let selection = StateDictOptions::default()
        .select(&ckpt)
        .map_err(|e| format!("state dict: {e}"))?;
    let plan = DeviceMap::new(&ckpt, &mut To(CUDA0)).map_err(|e| format!("plan: {e}"))?;
    let loaded = load(
        Arc::clone(&ckpt),
        &selection,
        &plan,
        gpus,
        &LoadOptions::default(),
    )
    .map_err(|e| format!("load: {e}"))?;
    let seconds = start.elapsed().as_secs_f64();
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
    let bytes = loaded
        .devices()
        .iter()
        .filter(|d| d.device == CUDA0)
        .map(|d| d.bytes)
        .sum();
    Ok(Run {
        seconds,
        load_seconds: loaded.seconds(),
        tensors: loaded.tensors().len(),
        bytes,
        fallbacks,
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

fn measure(args: &Args, gpus: &ptload_device::Gpus) -> Result<ExitCode, String> {
    let ctx = CudaContext::new(0).map_err(|e| format!("cuda:0: {e}"))?;
    let device_name = ctx.name().unwrap_or_else(|_| "unknown".into());
    let device_total = ctx.total_mem().unwrap_or(0);
    let file_bytes = std::fs::metadata(&args.file)
        .map_err(|e| e.to_string())?
        .len();

    // Unmeasured: checks the placement before anything is timed.
    let first = ptload_run(&args.file, gpus)?;
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

    let pinned = pinned_limit(&ctx, first.bytes, args.runs)?;

    let mut runs = Vec::with_capacity(args.runs);
    for _ in 0..args.runs {
        let run = ptload_run(&args.file, gpus)?;
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

    let pinned_gbps = pinned.gbps();
    let seconds: Vec<f64> = runs.iter().map(|r| r.seconds).collect();
    let load_seconds: Vec<f64> = runs.iter().map(|r| r.load_seconds).collect();
    let ptload_s = median(&seconds);
    let ptload_gbps = first.bytes as f64 / ptload_s / 1e9;
    let fraction = ptload_gbps / pinned_gbps;
    let machine = format!(
        "{} ({} threads), {} {}",
        cpu_model(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::env::consts::OS,
        std::env::consts::ARCH
    );

    if args.json {
        let doc = serde_json::json!({
            "machine": machine,
            "device": {"ordinal": 0, "name": device_name, "total_bytes": device_total},
            "file": args.file.display().to_string(),
            "file_bytes": file_bytes,
            "tensors": first.tensors,
            "storage_bytes": first.bytes,
            "runs": args.runs,
            "pinned": {
                "buffer_bytes": pinned.buffer_bytes,
                "copies_per_run": pinned.copies,
                "streams": LIMIT_STREAMS,
                "gbps_median": pinned_gbps,
                "one_stream_gbps_median": median(&pinned.one_stream),
                "streams_gbps_median": median(&pinned.streams),
                "one_stream_gbps": pinned.one_stream,
                "streams_gbps": pinned.streams,
            },
            "ptload": {
                "seconds_median": ptload_s,
                "seconds": seconds,
                "load_seconds_median": median(&load_seconds),
                "gbps": ptload_gbps,
                "fraction_of_pinned": fraction,
            },
            "fallbacks": 0,
        });
        println!("{doc}");
    } else {
        println!("machine: {machine}");
        println!(
            "device:  cuda:0 {device_name} ({:.1} GiB)",
            device_total as f64 / f64::from(1u32 << 30)
        );
        println!(
            "file:    {} ({} tensors, {:.1} MB of storages, file {:.1} MB); medians, runs: {}",
            args.file.display(),
            first.tensors,
            first.bytes as f64 / 1e6,
            file_bytes as f64 / 1e6,
            args.runs
        );
        println!(
            "pinned host->device limit     {:>9.2} GB/s  (1 stream {:.2}, {LIMIT_STREAMS} streams {:.2}; {} MiB pinned buffer, {} times a run)",
            pinned_gbps,
            median(&pinned.one_stream),
            median(&pinned.streams),
            pinned.buffer_bytes >> 20,
            pinned.copies
        );
        println!(
            "ptload open + load to cuda:0  {:>9.4} s     {:>7.2} GB/s  {:.0}% of the pinned limit",
            ptload_s,
            ptload_gbps,
            fraction * 100.0
        );
        println!(
            "  of which load()             {:>9.4} s",
            median(&load_seconds)
        );
        println!("every tensor on cuda:0 in every run (0 fallbacks)");
    }
    Ok(ExitCode::SUCCESS)
}
