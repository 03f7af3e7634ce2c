//! The host half of a GPU upload: filling 32 MiB staging buffers from the
//! checkpoint file, by copying from the memory map (what ptload-device
//! does) or by `pread` into the buffer, with a warm and a cold page cache
//! (the file's pages evicted with `posix_fadvise(DONTNEED)` before each
//! cold run). No GPU needed.
//!
//! ```text
//! cargo bench -p ptload-device --bench staging_fill -- FILE [RUNS] [WORKERS]
//! ```

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The default staging buffer size.
const RUN: usize = 32 << 20;

fn evict(f: &File) {
    // SAFETY: a valid open descriptor; the call only drops cached pages.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
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
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut buf = vec![0u8; RUN];
                loop {
                    let start = next.fetch_add(1, Ordering::Relaxed) * RUN;
                    if start >= len {
                        break;
                    }
                    let n = RUN.min(len - start);
                    if mode == "pread" {
                        f.read_exact_at(&mut buf[..n], start as u64).expect("pread");
                    } else {
                        buf[..n].copy_from_slice(&map[start..start + n]);
                    }
                    std::hint::black_box(&buf);
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
        eprintln!("usage: staging_fill FILE [RUNS] [WORKERS]");
        std::process::exit(2);
    };
    let runs: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(5);
    let workers: usize = args.get(2).and_then(|w| w.parse().ok()).unwrap_or(4);
    let len = std::fs::metadata(path).expect("file").len() as f64;
    for cache in ["warm", "cold"] {
        for mode in ["map", "map+sequential", "pread"] {
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
