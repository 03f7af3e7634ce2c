//! Inputs given as URLs (`http://`, `https://`, `s3://`, `gs://`,
//! `az://`): read by ranged requests, fetching only what each command
//! reads.

use std::path::Path;
use std::sync::Arc;

use ptload_reader::set::CheckpointSet;
use ptload_reader::OpenOptions;
use serde::Serialize;

/// The URL `path` holds, if it is one (see [`ptload_reader::ranged::is_url`]).
pub(crate) fn url_of(path: &Path) -> Option<&str> {
    path.to_str().filter(|s| ptload_reader::ranged::is_url(s))
}

/// The checkpoint at `path`: a local file, directory or index, or a URL.
pub(crate) fn open_set(path: &Path, opts: &OpenOptions) -> ptload_reader::Result<CheckpointSet> {
    match url_of(path) {
        Some(url) => CheckpointSet::of(path, Arc::new(opts.open_url(url)?)),
        None => CheckpointSet::open_with(path, opts),
    }
}

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
