//! Storages of a file read by ranges (a URL, a bucket object, `--pread`):
//! fetched when first read, neighbours in the file together, several
//! requests in flight for a read-ahead; kept for borrowing readers,
//! handed over to owning ones (docs/architecture.md, "Storages handed
//! over, not kept").

use super::*;
use crate::fetched::{not_in_file, read_ahead_bytes, Claims, Hand, Run, MAX_COALESCED};

/// Run `work` while the listed storages of each checkpoint are fetched
/// ahead of it, beside it (see [`Checkpoint::read_ahead`]): `work` takes
/// what landed (and drops it when done: memory stays bounded), waits for
/// what is in flight, and fetches itself what is not asked for yet. When `work` ends (returns, fails or panics), no
/// further request starts. A failed request of the read-ahead is not the
/// answer: `work` fetches what it needs again and reports its own error.
/// Checkpoints not read by ranges, and empty lists, fetch nothing.
pub fn while_prefetching<T>(ahead: &[(&Checkpoint, &[usize])], work: impl FnOnce() -> T) -> T {
    use std::sync::atomic::{AtomicBool, Ordering};
    /// Sets the flag when dropped, also while a panic of `work` unwinds
    /// (the scope would otherwise wait for every prefetch to finish first).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let ahead: Vec<_> = ahead
        .iter()
        .filter(|(c, s)| !s.is_empty() && c.source.fetcher().is_some())
        .collect();
    if ahead.is_empty() {
        return work();
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for &&(ckpt, storages) in &ahead {
            let done = &done;
            // A thread the system refuses to start leaves `work` to fetch
            // what it reads itself.
            let _ = std::thread::Builder::new()
                .name("ptload-read-ahead".into())
                .spawn_scoped(scope, move || {
                    let _ = ckpt.read_ahead(storages, Some(done));
                });
        }
        let _stop = StopOnDrop(&done);
        work()
    })
}

/// A read-ahead running on threads of its own (see
/// [`ReadAhead::start`]): stopped when [`stop`](ReadAhead::stop)ped or
/// dropped.
#[derive(Debug)]
pub struct ReadAhead {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ReadAhead {
    /// Fetch the listed storages of each checkpoint ahead of a reader that
    /// reads them in about that order, as [`while_prefetching`] does, on a
    /// thread per checkpoint that outlives this call: for a caller that
    /// cannot hand its reads over as one closure (a Python loop reading a
    /// tensor per call). Checkpoints not read by ranges, and empty lists,
    /// start nothing; a thread the system refuses leaves the reader to
    /// fetch what it reads itself.
    pub fn start(ahead: Vec<(std::sync::Arc<Checkpoint>, Vec<usize>)>) -> ReadAhead {
        use std::sync::atomic::AtomicBool;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (ckpt, storages) in ahead {
            if storages.is_empty() || ckpt.source.fetcher().is_none() {
                continue;
            }
            let stop = std::sync::Arc::clone(&stop);
            let started = std::thread::Builder::new()
                .name("ptload-read-ahead".into())
                .spawn(move || {
                    let _ = ckpt.read_ahead(&storages, Some(&stop));
                });
            if let Ok(handle) = started {
                threads.push(handle);
            }
        }
        ReadAhead { stop, threads }
    }

    /// Start no further request and wait for those in flight to end.
    pub fn stop(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // No request starts after this; those in flight end on their own.
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Checkpoint {
    /// The bytes of storage `index` of a file read by ranges: fetched the
    /// first time, with the storages that follow it in the file and are
    /// not fetched yet, while they lie within [`COALESCE_GAP`] of each
    /// other (up to [`MAX_COALESCED`] bytes): reading tensors in file
    /// order costs few requests. A storage another thread is fetching
    /// (a [`prefetch`](Self::prefetch)) is waited for, not fetched again.
    pub(super) fn fetch_storage(&self, index: usize, fetcher: &Fetcher) -> Result<&[u8]> {
        let missing = || not_in_file(index);
        let landed = || self.fetched.kept(index);
        // Fetched ahead and handed over: kept from now on.
        let keep_loose = || {
            let bytes = self.fetched.take_loose(index)?;
            let cell = self.fetched.storages.get(index)?;
            let _ = cell.set(bytes);
            cell.get().map(Vec::as_slice)
        };
        if let Some(done) = landed() {
            return Ok(done);
        }
        let (offset, nbytes) = self.file_range(index).ok_or_else(missing)?;
        // Fetched already while opening (a small file's head and tail).
        if let Some(held) = self.source.view().held(offset, nbytes) {
            return Ok(held);
        }
        if let Some(done) = keep_loose() {
            return Ok(done);
        }
        let run = match self.claim_run(index, MAX_COALESCED, || landed().or_else(keep_loose))? {
            Ok(done) => return Ok(done),
            Err(run) => run,
        };
        {
            let _claims = Claims {
                fetched: &self.fetched,
                runs: std::slice::from_ref(&run),
                from: None,
            };
            self.fetch_run(&run, fetcher, Hand::Keep)?;
        }
        landed().ok_or_else(missing)
    }

    /// Wait while storage `index` is being fetched; then `at_hand`'s
    /// answer when it has one, or the run that fetches it (with its
    /// neighbours, up to `cap` bytes: see [`plan_run`](Self::plan_run)),
    /// claimed for the caller, who fetches it and releases the claims.
    fn claim_run<T>(
        &self,
        index: usize,
        cap: u64,
        at_hand: impl Fn() -> Option<T>,
    ) -> Result<std::result::Result<T, Run>> {
        let mut claimed = self.fetched.claims()?;
        loop {
            if let Some(done) = at_hand() {
                return Ok(Ok(done));
            }
            if !claimed.get(index).copied().unwrap_or(false) {
                break;
            }
            claimed = self
                .fetched
                .landed
                .wait(claimed)
                .map_err(|_| Error::new(ErrorKind::Io, "a thread fetching storages failed"))?;
        }
        let run = self.plan_run(index, &claimed, cap, |_| true);
        for &(i, _, _) in &run.members {
            if let Some(c) = claimed.get_mut(i) {
                *c = true;
            }
        }
        Ok(Err(run))
    }

    /// Where storage `i` lies in the file: its offset and length.
    fn file_range(&self, i: usize) -> Option<(u64, u64)> {
        let s = self.storages.get(i)?;
        Some((s.file_offset?, s.nbytes))
    }

    /// The request that fetches storage `first` (not fetched, not
    /// claimed), with the storages after it in the file that `take`
    /// accepts, are neither fetched nor claimed, and lie within
    /// [`COALESCE_GAP`] of each other, up to `cap` bytes.
    fn plan_run(
        &self,
        first: usize,
        claimed: &[bool],
        cap: u64,
        take: impl Fn(usize) -> bool,
    ) -> Run {
        let (offset, nbytes) = self.file_range(first).unwrap_or_default();
        let mut end = offset.saturating_add(nbytes);
        let mut members = vec![(first, offset, nbytes)];
        let view = self.source.view();
        // Fetched, being fetched, or at hand since opening.
        let busy = |i: usize| {
            self.fetched.done(i)
                || claimed.get(i).copied().unwrap_or(true)
                || self
                    .file_range(i)
                    .is_some_and(|(o, n)| view.held(o, n).is_some())
        };
        let at = self
            .fetched
            .order
            .partition_point(|&i| self.file_range(i).is_some_and(|(o, _)| o < offset));
        for &next in self.fetched.order.iter().skip(at) {
            let Some((o, n)) = self.file_range(next) else {
                break;
            };
            let new_end = o.saturating_add(n);
            if next == first {
                continue;
            }
            // A storage inside the range (a view of a legacy storage).
            if o >= offset && new_end <= end {
                if !busy(next) {
                    members.push((next, o, n));
                }
                continue;
            }
            let in_parts = self
                .fetched
                .in_parts
                .get(next)
                .is_some_and(|p| p.load(std::sync::atomic::Ordering::Relaxed))
                || self.fetched.was_handed(next);
            if busy(next)
                || !take(next)
                || in_parts
                || o < end
                || o > end.saturating_add(COALESCE_GAP)
                || new_end - offset > cap
            {
                break;
            }
            members.push((next, o, n));
            end = new_end;
        }
        Run {
            offset,
            end,
            members,
        }
    }

    /// Fetch `run` (claimed by the caller) and put its storages where
    /// `hand` says; the bytes requested, and the target's bytes when they
    /// are handed over.
    fn fetch_run(
        &self,
        run: &Run,
        fetcher: &Fetcher,
        hand: Hand,
    ) -> Result<(u64, Option<Vec<u8>>)> {
        let missing = not_in_file;
        // Only the parts not fetched while opening (around the zip's
        // headers) are requested: each byte is read once.
        let view = self.source.view();
        let holes = view.holes(run.offset, run.end);
        let len: u64 = holes.iter().map(|(a, b)| b - a).sum();
        let bytes = read_unheld(view, fetcher, run.offset, run.end)?;
        let mut target = None;
        let mut place = |i: usize, part: Vec<u8>| match hand {
            Hand::Keep => {
                if let Some(c) = self.fetched.storages.get(i) {
                    let _ = c.set(part);
                }
            }
            Hand::Over {
                target: Some(t), ..
            } if t == i => target = Some(part),
            Hand::Over { make_room, .. } => self.fetched.put_loose(i, part, make_room),
        };
        // One storage keeps the buffer as read: no second copy of it.
        if let [(i, _, n)] = run.members[..] {
            if bytes.len() as u64 == n {
                place(i, bytes);
                return Ok((len, target));
            }
        }
        for &(i, o, n) in &run.members {
            let from = usize::try_from(o - run.offset).map_err(|_| missing(i))?;
            let to = usize::try_from(n).ok().and_then(|n| from.checked_add(n));
            let part = to
                .and_then(|to| bytes.get(from..to))
                .ok_or_else(|| missing(i))?;
            place(i, part.to_vec());
        }
        Ok((len, target))
    }

    /// The bytes of storage `index`, in the file's byte order, for a reader
    /// that copies them out (into tensors of its own) and is done: borrowed
    /// where the checkpoint holds them (a map, memory, a storage a
    /// borrowing reader kept), or for a file read by ranges fetched for
    /// this reader and kept nowhere, as [`TensorView::data`] does
    /// (see docs/architecture.md, "Storages handed over, not kept").
    /// [`storage_bytes`](Self::storage_bytes) keeps them instead.
    pub fn read_storage(&self, index: usize) -> Result<std::borrow::Cow<'_, [u8]>> {
        if let (Some(fetcher), Some(s)) = (self.source.fetcher(), self.storages.get(index)) {
            if let StorageData::File(_) = s.data {
                if let Some(owned) = self.take_storage(index, fetcher)? {
                    return Ok(std::borrow::Cow::Owned(owned));
                }
            }
        }
        self.storage_bytes(index).map(std::borrow::Cow::Borrowed)
    }

    /// Bytes `offset..offset + out.len()` (inside the storage: the caller
    /// checked) of storage `index` of a file read by ranges, copied into
    /// `out` for a reader that fills buffers of its own part by part, each
    /// byte once (a GPU's staging), keeping nothing: copied from those
    /// fetched ahead, which are released once every byte was copied out;
    /// or fetched now, the part alone (the storage is then left out of any
    /// read-ahead). A storage being fetched is waited for. `None` when the
    /// checkpoint keeps or holds the storage (borrow it), and for anything
    /// but a stored storage of a file read by ranges.
    pub(super) fn read_part(
        &self,
        index: usize,
        offset: u64,
        out: &mut [u8],
    ) -> Option<Result<()>> {
        let fetcher = self.source.fetcher()?;
        let StorageData::File(_) = self.storages.get(index)?.data else {
            return None;
        };
        let (base, nbytes) = self.file_range(index)?;
        let kept = || self.fetched.kept(index).is_some();
        if kept() || self.source.view().held(base, nbytes).is_some() {
            return None;
        }
        if out.is_empty() {
            return Some(Ok(()));
        }
        Some((|| {
            let mut claimed = self.fetched.claims()?;
            // In flight (a read-ahead's request): wait for it to land.
            while claimed.get(index).copied().unwrap_or(false) {
                claimed =
                    self.fetched.landed.wait(claimed).map_err(|_| {
                        Error::new(ErrorKind::Io, "a thread fetching storages failed")
                    })?;
            }
            if self.fetched.copy_loose_part(index, offset, out) {
                return Ok(());
            }
            // Neither in flight nor loose: read in parts from now on
            // (marked while the claims are held, so no read-ahead starts
            // on it after this).
            self.fetched.mark_handed(index);
            drop(claimed);
            let start = base
                .checked_add(offset)
                .ok_or_else(|| Error::new(ErrorKind::Tensor, format!("storage {index}: offset")))?;
            // Straight into the reader's buffer: not held on the way.
            read_unheld_into(self.source.view(), fetcher, start, out)
        })())
    }

    /// The bytes of storage `index` of a file read by ranges, for a reader
    /// that owns them and drops them when done (a hash, a writer, a copy):
    /// taken from those fetched ahead of it, or fetched now (with the
    /// storages that follow it, as [`fetch_storage`](Self::fetch_storage)
    /// does, which wait loose for their own readers), and kept nowhere.
    /// `None` when the checkpoint keeps the storage already (a borrowing
    /// reader asked for it, or it was fetched while opening): borrow it.
    pub(super) fn take_storage(&self, index: usize, fetcher: &Fetcher) -> Result<Option<Vec<u8>>> {
        let missing = || not_in_file(index);
        let kept = || self.fetched.kept(index).is_some();
        let (offset, nbytes) = self.file_range(index).ok_or_else(missing)?;
        if self.source.view().held(offset, nbytes).is_some() {
            return Ok(None);
        }
        // Kept (borrow it), or handed over from those fetched ahead.
        let at_hand = || {
            if kept() {
                Some(None)
            } else {
                self.fetched.take_loose(index).map(Some)
            }
        };
        // Its neighbours wait loose for their readers: no more of them
        // than may wait.
        let cap = MAX_COALESCED.min(self.fetched.loose_cap);
        let run = match self.claim_run(index, cap, at_hand)? {
            Ok(done) => return Ok(done),
            Err(run) => run,
        };
        let _claims = Claims {
            fetched: &self.fetched,
            runs: std::slice::from_ref(&run),
            from: None,
        };
        let hand = Hand::Over {
            target: Some(index),
            make_room: true,
        };
        let (_, bytes) = self.fetch_run(&run, fetcher, hand)?;
        self.fetched.mark_handed(index);
        bytes.map(Some).ok_or_else(missing)
    }

    /// For a file read by ranges: fetch the `storages` listed that are not
    /// fetched yet, with up to [`Limits::max_fetches_in_flight`] requests
    /// in flight, so that reading them later costs no request. Storages
    /// close in the file are fetched together (each request at most
    /// [`Limits::max_fetch_request_bytes`] unless one storage is larger),
    /// each byte once, also when other
    /// threads read tensors meanwhile: a storage being fetched is waited
    /// for, never fetched twice. Returns the bytes fetched; a mapped or
    /// in-memory file fetches nothing (a file opened with
    /// [`OpenOptions::positioned`] is read by ranges, and is prefetched).
    ///
    /// What is fetched stays with the checkpoint, as every storage read
    /// does: the caller bounds the memory by the list it passes (say the
    /// next few hundred megabytes ahead of its reads). `stop`, once set
    /// (from any thread), starts no further request. The first failed
    /// request is the error (naming the file); the others still in flight
    /// end first, and what did not land is fetched again when read.
    pub fn prefetch(
        &self,
        storages: &[usize],
        stop: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<u64> {
        use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
        let Some(fetcher) = self.source.fetcher() else {
            return Ok(0);
        };
        let wanted = self.listed(storages);
        let take = |i: usize| wanted.get(i).copied().unwrap_or(false);
        let view = self.source.view();
        let runs: Vec<Run> = {
            let mut claimed = self.fetched.claims()?;
            let mut runs = Vec::new();
            for &i in &self.fetched.order {
                let held = self
                    .file_range(i)
                    .is_some_and(|(o, n)| view.held(o, n).is_some());
                if !take(i) || held || self.fetched.done(i) || claimed.get(i) != Some(&false) {
                    continue;
                }
                let run = self.plan_run(i, &claimed, self.limits.max_fetch_request_bytes, take);
                for &(m, _, _) in &run.members {
                    if let Some(c) = claimed.get_mut(m) {
                        *c = true;
                    }
                }
                runs.push(run);
            }
            runs
        };
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let fetched = AtomicU64::new(0);
        let first_error: std::sync::Mutex<Option<Error>> = std::sync::Mutex::new(None);
        // Every run is taken by exactly one worker and released by it,
        // fetched or not: no reader waits for a claim nobody holds.
        let work = || {
            while let Some(run) = runs.get(next.fetch_add(1, Ordering::Relaxed)) {
                let _claims = Claims {
                    fetched: &self.fetched,
                    runs: std::slice::from_ref(run),
                    from: None,
                };
                let stopped = stop.is_some_and(|s| s.load(Ordering::Relaxed));
                if !stopped && !failed.load(Ordering::Relaxed) {
                    match self.fetch_run(run, fetcher, Hand::Keep).map(|(n, _)| n) {
                        Ok(n) => {
                            fetched.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            if let Ok(mut slot) = first_error.lock() {
                                slot.get_or_insert(e);
                            }
                        }
                    }
                }
            }
        };
        // Runs no worker took (every worker panicked) are released too.
        let _untaken = Claims {
            fetched: &self.fetched,
            runs: &runs,
            from: Some(&next),
        };
        self.on_workers("ptload-fetch", runs.len(), work);
        match first_error.into_inner().ok().flatten() {
            Some(e) => Err(e),
            None => Ok(fetched.into_inner()),
        }
    }

    /// By storage index: whether `storages` lists it.
    fn listed(&self, storages: &[usize]) -> Vec<bool> {
        let mut listed = vec![false; self.storages.len()];
        for &i in storages {
            if let Some(w) = listed.get_mut(i) {
                *w = true;
            }
        }
        listed
    }

    /// Run `work` on as many threads as requests may be in flight (at
    /// most `jobs`): this thread is one of them, and a helper the system
    /// refuses to start leaves fewer in flight, never work undone.
    fn on_workers(&self, name: &str, jobs: usize, work: impl Fn() + Sync) {
        let threads = self.limits.max_fetches_in_flight.clamp(1, 64).min(jobs);
        std::thread::scope(|scope| {
            for _ in 1..threads {
                let _ = std::thread::Builder::new()
                    .name(name.into())
                    .spawn_scoped(scope, &work);
            }
            work();
        });
    }

    /// For a file read by ranges: fetch the `storages` listed, in the
    /// order given, ahead of a reader that reads them in about that order
    /// beside it (several requests in flight, neighbours in the file
    /// fetched together, each request at most
    /// [`Limits::max_fetch_request_bytes`] unless one storage is larger),
    /// handing each to the first reader that takes it (a hash, a writer,
    /// a copy, a tensor made of it), which drops it when done: at most
    /// [`read_ahead_bytes`](Self::read_ahead_bytes) wait to be taken, and
    /// the read-ahead pauses while they do. A storage larger than that is
    /// left to its reader. A borrowing reader keeps what it takes, as for
    /// any storage it reads. Returns the bytes fetched; a mapped or
    /// in-memory file fetches nothing. `stop`, once set, starts no further
    /// request (and ends a pause); the first failed request ends the
    /// read-ahead (its reader fetches what it needs itself).
    pub fn read_ahead(
        &self,
        storages: &[usize],
        stop: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<u64> {
        use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
        let Some(fetcher) = self.source.fetcher() else {
            return Ok(0);
        };
        let cap = self.fetched.loose_cap;
        let wanted = self.listed(storages);
        let take = |i: usize| wanted.get(i).copied().unwrap_or(false);
        let view = self.source.view();
        // The runs, planned now in the reader's order; each is claimed
        // only when its request starts, so a reader never waits for a
        // run that is paused.
        let runs: Vec<Run> = {
            let claimed = self.fetched.claims()?;
            let mut planned = vec![false; self.storages.len()];
            let mut runs = Vec::new();
            for &i in storages {
                let small = self
                    .file_range(i)
                    .is_some_and(|(o, n)| n > 0 && n <= cap && view.held(o, n).is_none());
                if !small || planned.get(i) != Some(&false) || self.fetched.done(i) {
                    continue;
                }
                let run = self.plan_run(
                    i,
                    &claimed,
                    self.limits.max_fetch_request_bytes.min(cap),
                    |j| take(j) && !planned.get(j).copied().unwrap_or(true),
                );
                for &(m, _, _) in &run.members {
                    if let Some(p) = planned.get_mut(m) {
                        *p = true;
                    }
                }
                runs.push(run);
            }
            runs
        };
        let next = AtomicUsize::new(0);
        let fetched = AtomicU64::new(0);
        let first_error: std::sync::Mutex<Option<Error>> = std::sync::Mutex::new(None);
        let stopped = || {
            stop.is_some_and(|s| s.load(Ordering::Relaxed))
                || first_error.lock().map_or(true, |e| e.is_some())
        };
        let work = || {
            while let Some(run) = runs.get(next.fetch_add(1, Ordering::Relaxed)) {
                let need = run.end - run.offset;
                if stopped() || !self.fetched.wait_for_room(need, stop) {
                    return;
                }
                struct Reserved<'f>(&'f Fetched, u64);
                impl Drop for Reserved<'_> {
                    fn drop(&mut self) {
                        self.0.unreserve(self.1);
                    }
                }
                let _reserved = Reserved(&self.fetched, need);
                // Claimed now, unless its reader got there first.
                {
                    let Ok(mut claimed) = self.fetched.claims() else {
                        return;
                    };
                    // Taken by its reader already (fetched, being fetched,
                    // or read in parts).
                    let taken = run.members.iter().any(|&(m, _, _)| {
                        self.fetched.done(m)
                            || self.fetched.was_handed(m)
                            || claimed.get(m).copied().unwrap_or(true)
                    });
                    if taken {
                        continue;
                    }
                    for &(m, _, _) in &run.members {
                        if let Some(c) = claimed.get_mut(m) {
                            *c = true;
                        }
                    }
                }
                let _claims = Claims {
                    fetched: &self.fetched,
                    runs: std::slice::from_ref(run),
                    from: None,
                };
                let hand = Hand::Over {
                    target: None,
                    make_room: false,
                };
                match self.fetch_run(run, fetcher, hand) {
                    Ok((n, _)) => {
                        fetched.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) => {
                        if let Ok(mut slot) = first_error.lock() {
                            slot.get_or_insert(e);
                        }
                    }
                }
            }
        };
        self.on_workers("ptload-read-ahead", runs.len(), work);
        match first_error.into_inner().ok().flatten() {
            Some(e) => Err(e),
            None => Ok(fetched.into_inner()),
        }
    }

    /// Most bytes of storages fetched ahead of their readers and not yet
    /// taken ([`read_ahead`](Self::read_ahead), and the neighbours a read
    /// fetches with its storage): [`Limits::max_fetches_in_flight`] times
    /// [`Limits::max_fetch_request_bytes`] (32 MiB by default).
    pub fn read_ahead_bytes(&self) -> u64 {
        read_ahead_bytes(&self.limits)
    }

    /// Bytes of storages fetched ahead and waiting for their readers, or
    /// in flight for a read-ahead, now (at most
    /// [`read_ahead_bytes`](Self::read_ahead_bytes), or one storage when
    /// none other is).
    pub fn waiting_bytes(&self) -> u64 {
        self.fetched.loose_bytes()
    }

    /// For a file read by ranges (a URL): the bytes fetched so far and
    /// the number of reads that fetched them; `None` for a mapped or
    /// in-memory file (a file opened with [`OpenOptions::positioned`]
    /// counts its reads).
    pub fn fetched_bytes(&self) -> Option<(u64, u64)> {
        self.source
            .fetcher()
            .map(|f| (f.bytes_read(), f.requests()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A file in memory read by ranges; every read is logged.
    #[derive(Debug)]
    struct Logged(Vec<u8>, Mutex<Vec<(u64, u64)>>);

    impl RangeRead for Logged {
        fn len(&self) -> u64 {
            self.0.len() as u64
        }
        fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
            self.1.lock().unwrap().push((offset, len));
            Ok(self.0[offset as usize..(offset + len) as usize].to_vec())
        }
        fn name(&self) -> &str {
            "memory://llama_wide.pt"
        }
    }

    /// Views of a part of a large storage, read by ranges, fetch the runs
    /// they read (far apart: one range each; close together or out of
    /// order: the span covering them), give the local file's elements,
    /// and leave the storage unfetched.

    #[test]
    fn a_view_of_part_of_a_storage_fetches_its_spans_only() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/files/llama_wide.pt"
        );
        let bytes = std::fs::read(path).unwrap();
        let local = Checkpoint::open(path).unwrap();
        let reader = Arc::new(Logged(bytes, Mutex::new(Vec::new())));
        let ranged = OpenOptions::new().open_ranged(reader.clone()).unwrap();
        let embed = ranged
            .tensor("model.embed_tokens.weight")
            .unwrap()
            .info()
            .clone();
        let storage = embed.storage.unwrap();
        assert_eq!(
            (embed.shape.clone(), embed.dtype),
            (vec![32000, 64], DType::BF16)
        );
        let row = 64 * 2;
        let view = |shape: Vec<u64>, stride: Vec<u64>, offset: u64| TensorInfo {
            numel: shape.iter().product(),
            nbytes: shape.iter().product::<u64>() * 2,
            shape,
            stride,
            storage_offset: offset,
            ..embed.clone()
        };
        // The first 128 KiB of the file were fetched while opening.
        let base = ranged.storages()[storage].file_offset.unwrap();
        let head = 128 << 10;
        assert!(base < head);
        let far = 2000 * 64; // row 2000: past the head
                             // (view, reads, bytes fetched)
        let cases = [
            // Four rows 8000 rows apart: four reads of one row.
            (view(vec![4, 64], vec![8000 * 64, 1], far), 4, 4 * row),
            // The first half of each of 1000 rows: the span covering them.
            (
                view(vec![1000, 32], vec![64, 1], far),
                1,
                999 * row + row / 2,
            ),
            // Transposed: the runs go back and forth, one covering span.
            (view(vec![64, 4], vec![1, 64], far), 1, 4 * row),
            // Starting in the head: only what the head lacks is fetched.
            (
                view(vec![2000, 32], vec![64, 1], 0),
                1,
                base + 1999 * row + row / 2 - head,
            ),
        ];
        for (info, reads, fetched) in cases {
            let before = reader.1.lock().unwrap().len();
            let (bytes_before, _) = ranged.fetched_bytes().unwrap();
            let there = TensorView {
                ckpt: &ranged,
                info: &info,
            };
            let here = TensorView {
                ckpt: &local,
                info: &info,
            };
            assert_eq!(there.data().unwrap(), here.data().unwrap(), "{info:?}");
            let mut visited = Vec::new();
            there.visit_bytes(|b| visited.extend_from_slice(b)).unwrap();
            assert_eq!(visited, here.data().unwrap().into_owned());
            let (bytes_after, _) = ranged.fetched_bytes().unwrap();
            // Each of the two reads fetched alike.
            assert_eq!(
                reader.1.lock().unwrap().len() - before,
                2 * reads,
                "{info:?}"
            );
            assert_eq!(bytes_after - bytes_before, 2 * fetched, "{info:?}");
            assert!(ranged.fetched.storages[storage].get().is_none());
        }
        // A view past its storage's end is an error, not a read.
        let past = view(vec![2, 64], vec![32000 * 64, 1], 0);
        let err = TensorView {
            ckpt: &ranged,
            info: &past,
        }
        .data()
        .unwrap_err();
        assert!(err.to_string().contains("outside its storage"), "{err}");
        // The whole tensor read by an owner: its storage fetched whole,
        // handed over and kept nowhere (a second read fetches it again).
        let whole = ranged.tensor("model.embed_tokens.weight").unwrap();
        let here = local.tensor("model.embed_tokens.weight").unwrap();
        let nbytes = ranged.storages()[storage].nbytes;
        for _ in 0..2 {
            let (before, _) = ranged.fetched_bytes().unwrap();
            assert_eq!(whole.data().unwrap(), here.data().unwrap());
            let (after, _) = ranged.fetched_bytes().unwrap();
            assert!(after - before > nbytes / 2, "{} fetched", after - before);
            assert!(ranged.fetched.storages[storage].get().is_none());
            assert!(!ranged.fetched.is_loose(storage));
        }
        // A borrowing reader keeps it: read once, then at hand.
        assert_eq!(whole.storage_bytes().unwrap().len() as u64, nbytes);
        assert!(ranged.fetched.storages[storage].get().is_some());
        let (before, _) = ranged.fetched_bytes().unwrap();
        assert_eq!(whole.data().unwrap(), here.data().unwrap());
        assert_eq!(ranged.fetched_bytes().unwrap().0, before);
    }

    /// `read_storage` borrows what a checkpoint holds and hands a ranged
    /// file's storage over, keeping nothing.
    #[test]
    fn read_storage_hands_a_ranged_storage_over() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/files/llama_wide.pt"
        );
        let bytes = std::fs::read(path).unwrap();
        let local = Checkpoint::open(path).unwrap();
        let ranged = OpenOptions::new()
            .open_ranged(Arc::new(Logged(bytes, Mutex::new(Vec::new()))))
            .unwrap();
        for i in 0..local.storages().len() {
            let here = local.read_storage(i).unwrap();
            assert!(matches!(here, std::borrow::Cow::Borrowed(_)));
            let there = ranged.read_storage(i).unwrap();
            assert_eq!(here, there, "storage {i}");
            assert!(
                ranged.fetched.storages[i].get().is_none(),
                "storage {i} kept"
            );
        }
    }

    /// A read-ahead beside a reader: every storage read equals the local
    /// file's, each fetched once, and no more than the read-ahead's bytes
    /// ever wait to be taken; nothing is kept once read.
    /// llama_wide.pt mapped, and read by ranges with a small read-ahead
    /// (four requests of 64 KiB, so the storages wait for their reader and
    /// the read-ahead pauses), with the order its tensors read their
    /// storages in.
    fn llama_wide_by_ranges() -> (Checkpoint, Checkpoint, Vec<usize>) {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/files/llama_wide.pt"
        );
        let bytes = std::fs::read(path).unwrap();
        let local = Checkpoint::open(path).unwrap();
        let limits = Limits {
            max_fetch_request_bytes: 64 << 10,
            ..Limits::default()
        };
        let reader = Arc::new(Logged(bytes, Mutex::new(Vec::new())));
        let ranged = OpenOptions::new()
            .limits(limits)
            .open_ranged(reader)
            .unwrap();
        let order: Vec<usize> = (0..ranged.len())
            .filter_map(|i| ranged.tensor_at(i)?.info().storage)
            .collect();
        (local, ranged, order)
    }

    #[test]
    fn a_read_ahead_hands_storages_over_and_holds_a_bounded_amount() {
        let (local, ranged, order) = llama_wide_by_ranges();
        let cap = ranged.read_ahead_bytes();
        assert_eq!(cap, 256 << 10);
        let (opened, _) = ranged.fetched_bytes().unwrap();
        let mut most = 0;
        while_prefetching(&[(&ranged, order.as_slice())], || {
            for i in 0..ranged.len() {
                let there = ranged.tensor_at(i).unwrap();
                let here = local.tensor_at(i).unwrap();
                let mut got = Vec::new();
                there.visit_bytes(|b| got.extend_from_slice(b)).unwrap();
                assert_eq!(got, here.data().unwrap().into_owned(), "{}", there.name());
                most = most.max(ranged.waiting_bytes());
            }
        });
        assert!(most <= cap, "{most} waiting");
        let kept: Vec<usize> = (0..ranged.storages().len())
            .filter(|&i| ranged.fetched.storages[i].get().is_some())
            .collect();
        assert!(
            kept.is_empty(),
            "kept: {kept:?} of {}",
            ranged.storages().len()
        );
        // Each stored byte fetched once (the storages tile the file's
        // data), plus what opening fetched.
        let stored: u64 = ranged.storages().iter().map(|s| s.nbytes).sum();
        let (all, _) = ranged.fetched_bytes().unwrap();
        assert!(
            all - opened <= stored,
            "{} fetched for {stored}",
            all - opened
        );
    }

    /// A read-ahead on threads of its own (`ReadAhead::start`, for readers
    /// that read a tensor per call): what it fetched is handed to the
    /// reads, every value as the local file's, each stored byte fetched
    /// once; stopped, it starts nothing more.
    #[test]
    fn a_read_ahead_of_its_own_serves_reads_made_one_at_a_time() {
        let (local, ranged, order) = llama_wide_by_ranges();
        let ranged = Arc::new(ranged);
        let (opened, _) = ranged.fetched_bytes().unwrap();
        let ahead = ReadAhead::start(vec![(Arc::clone(&ranged), order)]);
        assert_eq!(ahead.threads.len(), 1);
        for i in 0..ranged.len() {
            let there = ranged.tensor_at(i).unwrap();
            let here = local.tensor_at(i).unwrap();
            assert_eq!(
                there.data().unwrap().into_owned(),
                here.data().unwrap().into_owned(),
                "{}",
                there.name()
            );
        }
        ahead.stop();
        let stored: u64 = ranged.storages().iter().map(|s| s.nbytes).sum();
        let (all, _) = ranged.fetched_bytes().unwrap();
        assert!(
            all - opened <= stored,
            "{} fetched for {stored}",
            all - opened
        );
        // Nothing starts for a mapped file.
        let mapped = Arc::new(local);
        assert!(ReadAhead::start(vec![(mapped, vec![0, 1])])
            .threads
            .is_empty());
    }
}
