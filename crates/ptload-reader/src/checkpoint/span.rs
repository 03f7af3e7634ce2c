//! A view of part of a storage of a file read by ranges (a rank's slice,
//! a small view of a large storage): only the runs of elements it reads
//! are fetched, or streamed to a consumer, and nothing is kept.

use super::*;

impl Checkpoint {
    /// The elements of `info`, a view of a storage of a file read by
    /// ranges, row-major and as they lie in the file (its byte order, no
    /// conj/neg bit applied), fetched on their own when that reads less
    /// than the whole storage: a rank's slice, a view of a small part of
    /// a large storage. The runs of elements the view reads are fetched
    /// in ranges, runs closer than [`COALESCE_GAP`] in one (so a column
    /// split whose rows lie close together fetches the span covering
    /// them), and nothing is kept: the storage is never fetched whole for
    /// it. When the view's ranges would cover all of it, or it was
    /// fetched ahead and waits for its reader, the storage is taken whole
    /// ([`take_storage`](Self::take_storage)) and kept nowhere. `None`
    /// when the storage is kept already (or held since opening), and for
    /// anything but a stored storage of a file read by ranges.
    pub(crate) fn fetch_span(&self, info: &TensorInfo) -> Option<Result<Vec<u8>>> {
        let fetcher = self.source.fetcher()?;
        let index = info.storage?;
        let s = self.storages.get(index)?;
        let StorageData::File(_) = s.data else {
            return None;
        };
        let base = s.file_offset?;
        // Being fetched whole (a prefetch): wait for it rather than fetch
        // its bytes twice.
        let claimed = || {
            self.fetched
                .claimed
                .lock()
                .map_or(true, |c| c.get(index).copied().unwrap_or(false))
        };
        if info.numel == 0
            || self.fetched.storages.get(index)?.get().is_some()
            || self.source.view().held(base, s.nbytes).is_some()
        {
            return None;
        }
        // The whole storage, owned by this read and kept nowhere: taken
        // from what was fetched ahead, or fetched now; the view's runs of
        // it unless it is the whole of it.
        let whole = || {
            let whole_view =
                info.storage_offset == 0 && info.is_contiguous() && info.nbytes == s.nbytes;
            match self.take_storage(index, fetcher) {
                Ok(None) => None,
                Ok(Some(bytes)) if whole_view => Some(Ok(bytes)),
                Ok(Some(bytes)) => Some(info.gather(&bytes)),
                Err(e) => Some(Err(e)),
            }
        };
        // Being fetched whole (a read-ahead), or fetched already: wait for
        // it rather than fetch its bytes twice.
        if claimed() || self.fetched.is_loose(index) {
            return whole();
        }
        // The ranges the runs fall in, in storage offsets. Runs that do
        // not come in increasing order (a transposed view) are covered by
        // one range from the first byte read to the last.
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut ascending = true;
        let (mut low, mut high) = (u64::MAX, 0u64);
        let walked = info.run_bounds(s.nbytes, |start, len| {
            let end = start.saturating_add(len);
            low = low.min(start);
            high = high.max(end);
            match ranges.last_mut() {
                Some(last) if start < last.1 => ascending = false,
                Some(last) if start <= last.1.saturating_add(COALESCE_GAP) => last.1 = end,
                _ if ascending => ranges.push((start, end)),
                _ => {}
            }
            Ok(())
        });
        if let Err(e) = walked {
            return Some(Err(e));
        }
        if !ascending {
            ranges = vec![(low, high)];
        }
        let total: u64 = ranges.iter().map(|(a, b)| b - a).sum();
        if total >= s.nbytes {
            return whole();
        }
        Some(self.gather_ranges(fetcher, base, &ranges, info))
    }

    /// The elements of `info`, a contiguous view of a storage of a file
    /// read by ranges that is larger than one request
    /// ([`Limits::max_fetch_request_bytes`]) and not at hand (not kept,
    /// not waiting for its reader, not being fetched), handed to `f` in
    /// pieces of at most that size, fetched one after another and dropped
    /// once handed on: its reader never holds the whole of it. `None`
    /// otherwise (the elements are read whole).
    pub(crate) fn stream_span(
        &self,
        info: &TensorInfo,
        f: &mut dyn FnMut(&[u8]),
    ) -> Option<Result<()>> {
        let fetcher = self.source.fetcher()?;
        let index = info.storage?;
        let s = self.storages.get(index)?;
        let StorageData::File(_) = s.data else {
            return None;
        };
        let piece = self.limits.max_fetch_request_bytes.max(1 << 20);
        if info.nbytes <= piece || !info.is_contiguous() {
            return None;
        }
        let base = s.file_offset?;
        let start = info
            .storage_offset
            .checked_mul(info.dtype.size() as u64)
            .filter(|&o| o.checked_add(info.nbytes).is_some_and(|e| e <= s.nbytes))?;
        {
            let claimed = self.fetched.claimed.lock().ok()?;
            if claimed.get(index).copied().unwrap_or(true)
                || self.fetched.done(index)
                || self.source.view().held(base, s.nbytes).is_some()
            {
                return None;
            }
            // Read in pieces from now on: marked while the claims are
            // held, so that no read-ahead fetches it whole as well.
            self.fetched.mark_handed(index);
        }
        // Whole elements in every piece, so that each can be put in host
        // order on its own.
        let elem = (info.dtype.size() as u64).max(1);
        let piece = piece - piece % elem;
        let from = base.checked_add(start)?;
        let end = from.checked_add(info.nbytes)?;
        let mut at = from;
        while at < end {
            let to = at.saturating_add(piece).min(end);
            match read_unheld(self.source.view(), fetcher, at, to) {
                Ok(bytes) => f(&bytes),
                Err(e) => return Some(Err(e)),
            }
            at = to;
        }
        Some(Ok(()))
    }

    /// Fetch `ranges` of the storage at file offset `base` and gather the
    /// runs of `info` from them.
    fn gather_ranges(
        &self,
        fetcher: &Fetcher,
        base: u64,
        ranges: &[(u64, u64)],
        info: &TensorInfo,
    ) -> Result<Vec<u8>> {
        let extent = || {
            Error::new(ErrorKind::Tensor, "tensor extent outside its storage")
                .for_tensor(&info.name)
        };
        let mut fetched = Vec::with_capacity(ranges.len());
        for &(a, b) in ranges {
            let at = base.checked_add(a).ok_or_else(extent)?;
            let to = base.checked_add(b).ok_or_else(extent)?;
            fetched.push((a, read_unheld(self.source.view(), fetcher, at, to)?));
        }
        let size = usize::try_from(info.nbytes).map_err(|_| extent())?;
        let mut out = Vec::new();
        out.try_reserve_exact(size).map_err(|_| {
            Error::new(
                ErrorKind::Tensor,
                format!("cannot hold {size} bytes in memory"),
            )
            .for_tensor(&info.name)
        })?;
        let storage_len = ranges.last().map_or(0, |r| r.1);
        info.run_bounds(storage_len, |start, len| {
            let i = fetched.partition_point(|(a, _)| *a <= start);
            let (a, bytes) = fetched
                .get(i.checked_sub(1).ok_or_else(extent)?)
                .ok_or_else(extent)?;
            let from = usize::try_from(start - a).map_err(|_| extent())?;
            let to = usize::try_from(len)
                .ok()
                .and_then(|n| from.checked_add(n))
                .ok_or_else(extent)?;
            let run = bytes.get(from..to).ok_or_else(extent)?;
            if out.len() + run.len() > size {
                return Err(extent());
            }
            out.extend_from_slice(run);
            Ok(())
        })?;
        if out.len() != size {
            return Err(extent());
        }
        Ok(out)
    }
}
