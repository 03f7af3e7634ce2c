//! Boxes of elements in row-major tensors: what a distributed
//! checkpoint's chunks and FSDP's local parts are, and the copy of the
//! elements two boxes share.

use crate::error::{Error, ErrorKind, Result};

/// The number of elements in a box of sizes `dims` (saturating).
pub(super) fn volume(dims: &[u64]) -> u64 {
    dims.iter().fold(1u64, |n, &d| n.saturating_mul(d))
}

/// An error in the geometry of chunks or parts.
pub(super) fn geometry(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Tensor, message)
}

/// The box two boxes share, as `(start, end)` per dimension; `None` when
/// they share no element.
pub(super) fn intersection(
    ao: &[u64],
    asz: &[u64],
    bo: &[u64],
    bsz: &[u64],
) -> Option<Vec<(u64, u64)>> {
    let mut out = Vec::with_capacity(ao.len());
    for (((&a, &an), &b), &bn) in ao.iter().zip(asz).zip(bo).zip(bsz) {
        let lo = a.max(b);
        let hi = a.saturating_add(an).min(b.saturating_add(bn));
        if hi <= lo {
            return None;
        }
        out.push((lo, hi));
    }
    Some(out)
}
/// Copy the elements `src` (the row-major box at `so` of sizes `ss`) shares
/// with `dst` (the row-major box at `d_o` of sizes `ds`) into `dst`.
pub(super) fn copy_box(
    src: &[u8],
    so: &[u64],
    ss: &[u64],
    dst: &mut [u8],
    d_o: &[u64],
    ds: &[u64],
    elem: u64,
) -> Result<()> {
    let fail = || geometry("a chunk's bytes do not match its size");
    if volume(ss).checked_mul(elem) != Some(src.len() as u64) {
        return Err(fail());
    }
    let Some(common) = intersection(so, ss, d_o, ds) else {
        return Ok(());
    };
    let n = common.len();
    // Row-major strides (in elements) of both boxes.
    let strides = |sizes: &[u64]| {
        let mut out = vec![1u64; sizes.len()];
        let mut acc = 1u64;
        for (s, &d) in out.iter_mut().zip(sizes).rev() {
            *s = acc;
            acc = acc.saturating_mul(d);
        }
        out
    };
    let (sst, dst_st) = (strides(ss), strides(ds));
    let (row_lo, row_hi) = common.last().copied().unwrap_or((0, 1));
    let row_bytes = usize::try_from((row_hi - row_lo).saturating_mul(elem)).map_err(|_| fail())?;
    // The index over all dimensions but the last, as an odometer.
    let lead = n.saturating_sub(1);
    let mut idx: Vec<u64> = common.iter().take(lead).map(|&(lo, _)| lo).collect();
    loop {
        let mut s_at = 0u64;
        let mut d_at = 0u64;
        for d in 0..n {
            let i = if d < lead {
                idx.get(d).copied().unwrap_or(0)
            } else {
                row_lo
            };
            let (a, b) = (so.get(d), d_o.get(d));
            let (sa, sb) = (sst.get(d), dst_st.get(d));
            match (a, b, sa, sb) {
                (Some(&a), Some(&b), Some(&sa), Some(&sb)) => {
                    s_at = s_at.saturating_add((i - a).saturating_mul(sa));
                    d_at = d_at.saturating_add((i - b).saturating_mul(sb));
                }
                _ => return Err(fail()),
            }
        }
        let s_at = usize::try_from(s_at.saturating_mul(elem)).map_err(|_| fail())?;
        let d_at = usize::try_from(d_at.saturating_mul(elem)).map_err(|_| fail())?;
        let from = src
            .get(s_at..s_at.saturating_add(row_bytes))
            .ok_or_else(fail)?;
        dst.get_mut(d_at..d_at.saturating_add(row_bytes))
            .ok_or_else(fail)?
            .copy_from_slice(from);
        // Next row.
        let mut d = lead;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            let (Some(v), Some(&(lo, hi))) = (idx.get_mut(d), common.get(d)) else {
                return Err(fail());
            };
            *v += 1;
            if *v < hi {
                break;
            }
            *v = lo;
        }
    }
}
