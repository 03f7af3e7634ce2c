//! The parts of a file read by ranges (a checkpoint's storages, by
//! index) as they are fetched, each once: claimed while a request is in
//! flight (a second reader waits for it rather than fetching it again),
//! kept for borrowing readers, or loose until an owning reader takes them
//! (bounded: a read-ahead waits for room). The checkpoint decides what to
//! fetch and when (`checkpoint/fetch.rs`); this is the bookkeeping it
//! shares between threads.

use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;

/// The storages' bytes of a file read by ranges, each fetched once.
#[derive(Debug, Default)]
pub(crate) struct Fetched {
    /// By storage index.
    pub(crate) storages: Vec<std::sync::OnceLock<Vec<u8>>>,
    /// Indices of the storages stored in the file, by offset.
    pub(crate) order: Vec<usize>,
    /// By storage index: read in parts (a rank's slices), so never fetched
    /// whole as the neighbour of another storage.
    pub(crate) in_parts: Vec<std::sync::atomic::AtomicBool>,
    /// By storage index: handed over to a reader already, so not fetched
    /// again as the neighbour of another storage (a reader of it again
    /// fetches it itself).
    pub(crate) handed: Vec<std::sync::atomic::AtomicBool>,
    /// By storage index: a request in flight is fetching it. A reader of
    /// a claimed storage waits for it (`landed`) instead of fetching it
    /// again: each byte is read once, whichever thread asks first.
    pub(crate) claimed: std::sync::Mutex<Vec<bool>>,
    /// Signalled whenever claims are released (the bytes landed, or the
    /// request failed and a waiter fetches them itself).
    pub(crate) landed: std::sync::Condvar,
    /// Storages fetched before their reader asked (by a read-ahead, or as
    /// the neighbours of a storage fetched with them), handed to the first
    /// reader that takes them and so released (see `take_storage`); a
    /// borrowing reader keeps them in `storages` instead.
    pub(crate) loose: std::sync::Mutex<Loose>,
    /// Signalled whenever loose bytes are taken or dropped.
    pub(crate) room: std::sync::Condvar,
    /// Most bytes `loose` holds (see `Checkpoint::read_ahead_bytes`).
    pub(crate) loose_cap: u64,
}

/// See [`Fetched::loose`].
#[derive(Debug, Default)]
pub(crate) struct Loose {
    pub(crate) bytes: std::collections::HashMap<usize, Vec<u8>>,
    /// Oldest first, for dropping when over the cap.
    pub(crate) order: std::collections::VecDeque<usize>,
    pub(crate) total: u64,
    /// Bytes of read-ahead requests in flight, counted against the cap.
    pub(crate) reserved: u64,
    /// Of a loose storage read in parts (see [`Fetched::copy_loose_part`]):
    /// the bytes copied out so far.
    pub(crate) parts: std::collections::HashMap<usize, u64>,
}

impl Loose {
    /// Storage `i` gone from the loose ones (taken or dropped): its bytes.
    pub(crate) fn remove(&mut self, i: usize) -> Option<Vec<u8>> {
        self.order.retain(|&j| j != i);
        self.parts.remove(&i);
        let bytes = self.bytes.remove(&i)?;
        self.total = self.total.saturating_sub(bytes.len() as u64);
        Some(bytes)
    }
}

/// Where a fetched run's storages go.
#[derive(Clone, Copy)]
pub(crate) enum Hand {
    /// Kept with the checkpoint, for borrowing readers.
    Keep,
    /// Handed over: `target`'s bytes returned, the other storages loose;
    /// `make_room` drops the oldest loose storages past the cap (a
    /// reader's neighbours), else the caller waited for room (a
    /// read-ahead).
    Over {
        target: Option<usize>,
        make_room: bool,
    },
}

/// Storages fetched in one request: the bytes `offset..end`, cut into
/// `members` (storage index, offset, length).
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) offset: u64,
    pub(crate) end: u64,
    pub(crate) members: Vec<(usize, u64, u64)>,
}

/// Storage `i` lies in no part of the file (its record or range is gone).
pub(crate) fn not_in_file(i: usize) -> Error {
    Error::new(ErrorKind::Tensor, format!("storage {i}: not in the file"))
}

/// Most bytes one coalesced read of storages fetches.
pub(crate) const MAX_COALESCED: u64 = 64 << 20;

/// Most bytes of storages fetched before their reader takes them (a
/// read-ahead, a reader's neighbours): as many as the requests in flight
/// fetch at once.
pub(crate) fn read_ahead_bytes(limits: &Limits) -> u64 {
    (limits.max_fetches_in_flight.max(1) as u64).saturating_mul(limits.max_fetch_request_bytes)
}

impl Fetched {
    /// Nothing fetched yet of the parts at `offsets` (a storage each, by
    /// index; `None` for one not in the file), ordered by offset.
    pub(crate) fn for_parts(offsets: &[Option<u64>], limits: &Limits) -> Fetched {
        let mut order: Vec<usize> = (0..offsets.len())
            .filter(|&i| offsets.get(i).is_some_and(Option::is_some))
            .collect();
        order.sort_by_key(|&i| offsets.get(i).copied().flatten());
        let storages = offsets;
        Fetched {
            storages: storages.iter().map(|_| Default::default()).collect(),
            order,
            in_parts: storages.iter().map(|_| Default::default()).collect(),
            handed: storages.iter().map(|_| Default::default()).collect(),
            claimed: std::sync::Mutex::new(vec![false; storages.len()]),
            landed: Default::default(),
            loose: Default::default(),
            room: Default::default(),
            loose_cap: read_ahead_bytes(limits),
        }
    }

    /// Storage `i`'s bytes, when kept for borrowing readers.
    pub(crate) fn kept(&self, i: usize) -> Option<&[u8]> {
        self.storages
            .get(i)
            .and_then(|c| c.get())
            .map(Vec::as_slice)
    }

    /// Fetched already: kept, or loose.
    pub(crate) fn done(&self, i: usize) -> bool {
        self.kept(i).is_some() || self.is_loose(i)
    }

    pub(crate) fn loose(&self) -> std::sync::MutexGuard<'_, Loose> {
        // Only whole insertions and removals happen under the lock: what
        // a panic leaves is consistent.
        self.loose
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn mark_handed(&self, i: usize) {
        if let Some(h) = self.handed.get(i) {
            h.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub(crate) fn was_handed(&self, i: usize) -> bool {
        self.handed
            .get(i)
            .is_some_and(|h| h.load(std::sync::atomic::Ordering::Relaxed))
    }

    pub(crate) fn is_loose(&self, i: usize) -> bool {
        self.loose().bytes.contains_key(&i)
    }

    /// Take storage `i`'s bytes out of the loose ones: the taker owns them.
    pub(crate) fn take_loose(&self, i: usize) -> Option<Vec<u8>> {
        let mut loose = self.loose();
        let bytes = loose.remove(i)?;
        self.mark_handed(i);
        drop(loose);
        self.room.notify_all();
        Some(bytes)
    }

    /// Copy bytes `offset..offset + out.len()` of storage `i` out of the
    /// loose ones, for a reader that reads it in parts (each byte once):
    /// released when every one of its bytes was copied out. Whether it
    /// was loose (and held those bytes).
    pub(crate) fn copy_loose_part(&self, i: usize, offset: u64, out: &mut [u8]) -> bool {
        let mut loose = self.loose();
        let Some(bytes) = loose.bytes.get(&i) else {
            return false;
        };
        let len = bytes.len() as u64;
        let part = usize::try_from(offset)
            .ok()
            .and_then(|from| bytes.get(from..from.checked_add(out.len())?));
        let Some(part) = part else {
            return false;
        };
        out.copy_from_slice(part);
        let read = loose.parts.entry(i).or_default();
        *read = read.saturating_add(out.len() as u64);
        if *read < len {
            return true;
        }
        loose.remove(i);
        self.mark_handed(i);
        drop(loose);
        self.room.notify_all();
        true
    }

    /// Hand storage `i`'s bytes over to its first reader; with
    /// `make_room`, the oldest others are dropped while over the cap (they
    /// are fetched again if read).
    pub(crate) fn put_loose(&self, i: usize, bytes: Vec<u8>, make_room: bool) {
        let mut loose = self.loose();
        loose.total = loose.total.saturating_add(bytes.len() as u64);
        if let Some(old) = loose.bytes.insert(i, bytes) {
            loose.total = loose.total.saturating_sub(old.len() as u64);
        } else {
            loose.order.push_back(i);
        }
        let mut dropped = false;
        while make_room && loose.total > self.loose_cap {
            let Some(oldest) = loose.order.iter().position(|&j| j != i) else {
                break;
            };
            if let Some(&j) = loose.order.get(oldest) {
                dropped |= loose.remove(j).is_some();
            }
        }
        drop(loose);
        if dropped {
            self.room.notify_all();
        }
    }

    /// Wait until `need` more bytes fit under the cap with those loose and
    /// in flight (or there are none), then count them in flight until
    /// [`unreserve`](Self::unreserve); or until `stop` is set: whether
    /// there is room.
    pub(crate) fn wait_for_room(
        &self,
        need: u64,
        stop: Option<&std::sync::atomic::AtomicBool>,
    ) -> bool {
        let mut loose = self.loose();
        loop {
            let used = loose.total.saturating_add(loose.reserved);
            if used == 0 || used.saturating_add(need) <= self.loose_cap {
                loose.reserved = loose.reserved.saturating_add(need);
                return true;
            }
            if stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed)) {
                return false;
            }
            loose = match self
                .room
                .wait_timeout(loose, std::time::Duration::from_millis(20))
            {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// A request of `need` bytes counted by `wait_for_room` landed (its
    /// storages are loose now) or failed.
    pub(crate) fn unreserve(&self, need: u64) {
        let mut loose = self.loose();
        loose.reserved = loose.reserved.saturating_sub(need);
        drop(loose);
        self.room.notify_all();
    }

    /// Bytes loose now, and in flight for a read-ahead.
    pub(crate) fn loose_bytes(&self) -> u64 {
        let loose = self.loose();
        loose.total.saturating_add(loose.reserved)
    }

    pub(crate) fn claims(&self) -> Result<std::sync::MutexGuard<'_, Vec<bool>>> {
        self.claimed.lock().map_err(|_| {
            Error::new(
                ErrorKind::Io,
                "a thread fetching storages failed while holding their claims",
            )
        })
    }

    /// Release the claims of `run` and wake the readers waiting for them.
    pub(crate) fn release(&self, run: &Run) {
        // Released even after a panic elsewhere poisoned the lock: a claim
        // left set would keep its readers waiting for ever.
        let mut claimed = self
            .claimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for &(i, _, _) in &run.members {
            if let Some(c) = claimed.get_mut(i) {
                *c = false;
            }
        }
        drop(claimed);
        self.landed.notify_all();
    }
}

/// The claims of runs, released when dropped: after their fetch, after
/// its error, and while a panic unwinds (a reader waiting for a claim
/// nobody will release would wait for ever). `runs[*from..]` are
/// released: all of them, or those no worker took (`from` is the next
/// run a worker would take).
pub(crate) struct Claims<'a> {
    pub(crate) fetched: &'a Fetched,
    pub(crate) runs: &'a [Run],
    pub(crate) from: Option<&'a std::sync::atomic::AtomicUsize>,
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        let from = self
            .from
            .map_or(0, |n| n.load(std::sync::atomic::Ordering::Relaxed));
        for run in self.runs.get(from..).unwrap_or_default() {
            self.fetched.release(run);
        }
    }
}
