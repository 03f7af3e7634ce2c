//! What the command says besides its output: progress bars and notes on
//! stderr, silenced by `--quiet` and `--no-progress`.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use indicatif::{ProgressBar, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);
static NO_PROGRESS: AtomicBool = AtomicBool::new(false);

/// Progress bars only for work worth watching (about a second or more).
const PROGRESS_FROM_BYTES: u64 = 256 << 20;

/// Set once from the command line.
pub(crate) fn configure(quiet: bool, no_progress: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
    NO_PROGRESS.store(no_progress || quiet, Ordering::Relaxed);
}

/// Whether notes (automatic decisions) are silenced.
pub(crate) fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// A note on stderr, unless `--quiet`.
pub(crate) fn note(text: &str) {
    if !quiet() {
        eprintln!("ptload: {text}");
    }
}

/// A labelled byte progress bar on stderr for work of `total` bytes: only
/// on a terminal, only for work long enough to watch, never with
/// `--quiet` or `--no-progress`.
pub(crate) fn progress_bar(label: &str, total: u64) -> Option<ProgressBar> {
    // PTLOAD_PROGRESS_FROM (bytes) lowers the size for tests that watch a
    // bar on small files.
    let from = std::env::var("PTLOAD_PROGRESS_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PROGRESS_FROM_BYTES);
    let wanted =
        !NO_PROGRESS.load(Ordering::Relaxed) && std::io::stderr().is_terminal() && total >= from;
    wanted.then(|| {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} {bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(label.to_owned());
        bar
    })
}
