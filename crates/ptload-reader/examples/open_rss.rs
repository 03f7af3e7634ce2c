//! Open a checkpoint and print the process's resident memory after open,
//! split into anonymous memory (what the reader allocated) and file pages
//! (the parts of the mapped file the kernel brought in).
//!
//! `cargo run --release -p ptload-reader --example open_rss -- FILE...`
//! (Linux: reads /proc/self/status.)

use ptload_reader::Checkpoint;

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for path in std::env::args().skip(1) {
        let before = status_kib("RssAnon:").unwrap_or(0);
        let ckpt = Checkpoint::open(&path)?;
        let anon = status_kib("RssAnon:").unwrap_or(0);
        let file = status_kib("RssFile:").unwrap_or(0);
        let bytes = std::fs::metadata(&path)?.len();
        println!(
            "{path}: {} tensors, {bytes} bytes; after open: anonymous +{} KiB, file pages {} KiB (whole process)",
            ckpt.len(),
            anon.saturating_sub(before),
            file
        );
    }
    Ok(())
}
