//! The host half of a GPU upload: filling 32 MiB staging buffers from the
//! checkpoint file, by copying from the memory map, by `pread` into the
//! buffer (what ptload-device does by default), by `pread` with the runs
//! ahead of the workers announced to the kernel (`posix_fadvise
//! WILLNEED`, or `madvise WILLNEED` through the map: a read-ahead as deep
//! as the workers), or by direct I/O
//! (`O_DIRECT`, no page cache: the disk's own sequential limit with as
//! many requests in flight as workers), with a warm and a cold page cache
//! (the file's pages evicted with `posix_fadvise(DONTNEED)` before each
//! cold run). No GPU needed.
//!
//! ```text
//! cargo bench -p ptload-device --bench staging_fill -- FILE [RUNS] [WORKERS] [cold]
//! ```
//!
//! With `cold`, only the cold page cache and the ways an upload can read
//! (`pread`, `pread+madvise`, `direct`): what the GPU kit runs to learn
//! the disk's limit beside the cold loads it judges.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The default staging buffer size.
const RUN: usize = 32 << 20;

fn evict(f: &File) {
    // SAFETY: a valid open descriptor; the call only drops cached pages.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// A buffer aligned for direct I/O (an anonymous map: page-aligned).
struct Aligned(memmap2::MmapMut);

impl Aligned {
    fn new(len: usize) -> Aligned {
        Aligned(memmap2::MmapMut::map_anon(len).expect("anonymous map"))
    }
}

/// Seconds for `workers` threads to fill buffers with the whole file,
/// taking 32 MiB runs in order, as the upload workers do.
fn fill(mode: &str, path: &str, workers: usize) -> f64 {
    let f = File::open(path).expect("open");
    let len = f.metadata().expect("metadata").len() as usize;
    // SAFETY: the file is not modified while the benchmark runs.
    let map = unsafe { memmap2::Mmap::map(&f) }.expect("map");
    if mode == "map+sequential" {
        map.advise(memmap2::Advice::Sequential).expect("madvise");
    }
    let direct = (mode == "direct").then(|| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .expect("open with O_DIRECT")
    });
    // Runs announced ahead of the one being read: one per worker.
    let depth = workers;
    let willneed = |run: usize| {
        let start = run * RUN;
        if start < len {
            // SAFETY: a valid open descriptor; the call only starts reads.
            unsafe {
                libc::posix_fadvise(
                    f.as_raw_fd(),
                    start as libc::off_t,
                    RUN.min(len - start) as libc::off_t,
                    libc::POSIX_FADV_WILLNEED,
                )
            };
        }
    };
    // The same announced through the map (`madvise`), which the reader
    // can do without `unsafe`.
    let willneed_map = |run: usize| {
        let start = run * RUN;
        if start < len {
            let _ = map.advise_range(memmap2::Advice::WillNeed, start, RUN.min(len - start));
        }
    };
    match mode {
        "pread+willneed" => (0..depth).for_each(willneed),
        "pread+madvise" => (0..depth).for_each(willneed_map),
        _ => {}
    }
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut buf = Aligned::new(RUN);
                loop {
                    let run = next.fetch_add(1, Ordering::Relaxed);
                    let start = run * RUN;
                    if start >= len {
                        break;
                    }
                    let n = RUN.min(len - start);
                    match mode {
                        "pread" => f
                            .read_exact_at(&mut buf.0[..n], start as u64)
                            .expect("pread"),
                        "pread+willneed" => {
                            willneed(run + depth);
                            f.read_exact_at(&mut buf.0[..n], start as u64)
                                .expect("pread");
                        }
                        "pread+madvise" => {
                            willneed_map(run + depth);
                            f.read_exact_at(&mut buf.0[..n], start as u64)
                                .expect("pread");
                        }
                        "direct" => {
                            // Whole blocks: the last run reads up to the
                            // end of the file, short.
                            let file = direct.as_ref().expect("direct");
                            let mut at = 0;
                            while at < n {
                                let got = file
                                    .read_at(&mut buf.0[at..], (start + at) as u64)
                                    .expect("direct read");
                                if got == 0 {
                                    break;
                                }
                                at += got;
                            }
                        }
                        _ => buf.0[..n].copy_from_slice(&map[start..start + n]),
                    }
                    std::hint::black_box(&buf.0);
                }
            });
        }
    });
    started.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let Some(path) = args.first() else {
        eprintln!("usage: staging_fill FILE [RUNS] [WORKERS] [cold]");
        std::process::exit(2);
    };
    let runs: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(5);
    let workers: usize = args.get(2).and_then(|w| w.parse().ok()).unwrap_or(4);
    let len = std::fs::metadata(path).expect("file").len() as f64;
    let cold_only = args.get(3).is_some_and(|a| a == "cold");
    let caches: &[&str] = if cold_only {
        &["cold"]
    } else {
        &["warm", "cold"]
    };
    let modes: &[&str] = if cold_only {
        &["pread", "pread+madvise", "direct"]
    } else {
        &[
            "map",
            "map+sequential",
            "pread",
            "pread+willneed",
            "pread+madvise",
            "direct",
        ]
    };
    for &cache in caches {
        for &mode in modes {
            let mut seconds = Vec::new();
            for _ in 0..runs {
                let f = File::open(path).expect("open");
                if cache == "cold" {
                    evict(&f);
                } else {
                    std::hint::black_box(std::fs::read(path).expect("read"));
                }
                seconds.push(fill(mode, path, workers));
            }
            seconds.sort_by(f64::total_cmp);
            let median = seconds[seconds.len() / 2];
            println!(
                "{cache} {mode:<15} {workers} workers: median {:.1} ms, {:.2} GB/s ({runs} runs)",
                median * 1e3,
                len / median / 1e9
            );
        }
    }
}
