//! Inputs given as URLs (`http://`, `https://`, `s3://`, `gs://`,
//! `az://`): read by ranged requests, fetching only what each command
//! reads.

use std::sync::Arc;

use ptload_reader::set::CheckpointSet;
use ptload_reader::Checkpoint;
use serde::Serialize;

/// Bytes and requests fetched from URLs, in JSON output.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub(crate) struct Fetched {
    /// Bytes received.
    pub(crate) bytes: u64,
    /// Ranged requests made (besides the one that learnt the length).
    pub(crate) requests: u64,
}

impl Fetched {
    /// What the files of `set` read by ranges fetched so far; `None` when
    /// none is.
    pub(crate) fn of(set: &CheckpointSet) -> Option<Fetched> {
        let mut any = None;
        for f in set.files() {
            if let Some((bytes, requests)) = f.checkpoint().fetched_bytes() {
                let sum: &mut Fetched = any.get_or_insert_with(Fetched::default);
                sum.bytes += bytes;
                sum.requests += requests;
            }
        }
        any
    }
}

/// Progress of work over files read by ranges, in bytes fetched (what a
/// user waits for), rather than in bytes placed or written.
pub(crate) struct FetchCount {
    files: Vec<Arc<Checkpoint>>,
    at_start: u64,
}

impl FetchCount {
    /// Counting from now what the files of `files` read by ranges fetch;
    /// `None` when none is.
    pub(crate) fn of(files: impl IntoIterator<Item = Arc<Checkpoint>>) -> Option<FetchCount> {
        let files: Vec<Arc<Checkpoint>> = files
            .into_iter()
            .filter(|c| c.fetched_bytes().is_some())
            .collect();
        if files.is_empty() {
            return None;
        }
        let mut count = FetchCount { files, at_start: 0 };
        count.at_start = count.total();
        Some(count)
    }

    fn total(&self) -> u64 {
        self.files
            .iter()
            .filter_map(|c| c.fetched_bytes())
            .map(|(bytes, _)| bytes)
            .sum()
    }

    /// Bytes fetched since [`of`](Self::of).
    pub(crate) fn fetched(&self) -> u64 {
        self.total().saturating_sub(self.at_start)
    }
}

/// A progress callback for a bar over `count`'s files (or, without one,
/// over the bytes each step reports).
pub(crate) fn progress(
    bar: indicatif::ProgressBar,
    count: Option<FetchCount>,
) -> ptload_reader::export::Progress {
    match count {
        Some(count) => Arc::new(move |_| bar.set_position(count.fetched())),
        None => Arc::new(move |n| bar.inc(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ptload_reader::ranged::RangeRead;
    use ptload_reader::OpenOptions;
    use std::path::Path;

    #[derive(Debug)]
    struct Memory(Vec<u8>);

    impl RangeRead for Memory {
        fn len(&self) -> u64 {
            self.0.len() as u64
        }
        fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
            let (a, b) = (offset as usize, (offset + len) as usize);
            Ok(self.0[a..b].to_vec())
        }
        fn name(&self) -> &str {
            "memory://wide_storages.pt"
        }
    }

    fn fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/files/wide_storages.pt")
    }

    #[test]
    fn progress_of_a_url_counts_the_bytes_fetched_since_it_started() {
        let bytes = std::fs::read(fixture()).unwrap();
        let len = bytes.len() as u64;
        let ckpt = Arc::new(
            OpenOptions::new()
                .open_ranged(Arc::new(Memory(bytes)))
                .unwrap(),
        );
        let (at_open, _) = ckpt.fetched_bytes().unwrap();
        let count = FetchCount::of([ckpt.clone()]).unwrap();
        assert_eq!(count.fetched(), 0);
        let bar = indicatif::ProgressBar::hidden();
        bar.set_length(len);
        let step = progress(bar.clone(), Some(count));
        ckpt.storage_bytes(4).unwrap();
        step(1);
        let one = bar.position();
        assert!(one >= ckpt.storages()[4].nbytes, "{one}");
        let all: Vec<usize> = (0..ckpt.storages().len()).collect();
        ckpt.prefetch(&all, None).unwrap();
        step(1);
        // Everything opening did not fetch, each byte once.
        assert_eq!(bar.position(), len - at_open);
        assert!(bar.position() > one);
    }

    #[test]
    fn progress_of_a_local_file_counts_what_each_step_reports() {
        let ckpt = Arc::new(Checkpoint::open(fixture()).unwrap());
        assert!(FetchCount::of([ckpt]).is_none());
        let bar = indicatif::ProgressBar::hidden();
        let step = progress(bar.clone(), None);
        step(10);
        step(5);
        assert_eq!(bar.position(), 15);
    }
}
