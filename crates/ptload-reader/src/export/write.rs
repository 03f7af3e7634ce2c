//! Writing planned tensors' bytes to a stream: from the map, by the
//! kernel from the checkpoint's own file, from a distributed checkpoint's
//! chunks a slab at a time, or from model-parallel rank files merged.

use std::io::{Read, Seek, SeekFrom, Write};

use super::plan::{entry, plan, selected, MergedLayout, Planned};
use super::{SafetensorsOptions, Written};
use crate::dcp::Dcp;
use crate::error::{Error, ErrorKind, Result};
use crate::state_dict::StateDict;

const PAGE: u64 = 4096;

/// Bytes per kernel copy between checks for cancellation.
const COPY_CHUNK: u64 = 64 << 20;

/// Bytes of a distributed checkpoint's tensor read and written at a time
/// (whole rows along its first dimension; one row at least).
pub(super) const DCP_STAGE: u64 = 64 << 20;

/// Maps an I/O failure to the error that names the output.
pub(super) type IoError<'a> = &'a dyn Fn(std::io::Error) -> Error;

/// The 8-byte length and the header.
fn write_header<W: Write>(header: &str, out: &mut W, io: IoError<'_>) -> Result<()> {
    out.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(header.as_bytes()).map_err(io)
}

/// A tensor written: counted, and reported to the progress callback.
fn count(written: &mut Written, opts: &SafetensorsOptions, nbytes: u64) {
    written.tensors += 1;
    written.bytes += nbytes;
    if let Some(progress) = &opts.progress {
        progress(nbytes);
    }
}

/// The safetensors bytes of `sd`, to `out`. With `sources` (each
/// checkpoint's own file, by file), tensors that lie unchanged in it are copied by
/// the kernel when `out` is a file; the others stream from the map.
pub(super) fn write_with<W: Write>(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    out: &mut W,
    sources: &mut [Option<std::fs::File>],
    io: IoError<'_>,
) -> Result<Written> {
    let layout = plan(sd, opts, false)?;
    let mut written = layout.written;
    write_header(&layout.header, out, io)?;
    let mut position = 8 + layout.header.len() as u64;
    for p in &layout.planned {
        opts.check_cancel()?;
        let view = entry(sd, p)?;
        let range = view.file_range().filter(|_| !p.cast);
        let file = selected(sd, p).map_or(0, |s| s.file);
        match (sources.get_mut(file).and_then(Option::as_mut), range) {
            (Some(src), Some((offset, len))) => {
                copy_from_file(&view, src, (offset, len), position, opts, out, io)?;
            }
            _ => write_tensor_bytes(&view, p, out)?,
        }
        position += p.nbytes;
        count(&mut written, opts, p.nbytes);
    }
    Ok(written)
}

/// A tensor that lies unchanged at `offset..offset + len` of the
/// checkpoint's own file `src`, copied by the kernel; `position` is where
/// it starts in the output.
fn copy_from_file<W: Write>(
    view: &crate::view::TensorView<'_>,
    src: &mut std::fs::File,
    (offset, len): (u64, u64),
    position: u64,
    opts: &SafetensorsOptions,
    out: &mut W,
    io: IoError<'_>,
) -> Result<()> {
    // The kernel copies fastest into whole pages of the output, so the
    // head up to the next page boundary comes from the map.
    let head = ((PAGE - position % PAGE) % PAGE).min(len);
    let data = view.data()?;
    let head_bytes = usize::try_from(head)
        .ok()
        .and_then(|h| data.get(..h))
        .ok_or_else(|| {
            Error::new(ErrorKind::Tensor, "tensor shorter than its file range")
                .for_tensor(view.name())
        })?;
    out.write_all(head_bytes).map_err(io)?;
    src.seek(SeekFrom::Start(offset + head)).map_err(io)?;
    // In chunks, so a cancellation is seen within one.
    let mut left = len - head;
    while left > 0 {
        opts.check_cancel()?;
        let chunk = left.min(COPY_CHUNK);
        let copied = std::io::copy(&mut Read::take(&mut *src, chunk), out).map_err(io)?;
        if copied != chunk {
            return Err(Error::new(
                ErrorKind::Tensor,
                format!("file ended {} bytes early", left - copied),
            )
            .for_tensor(view.name()));
        }
        left -= chunk;
    }
    Ok(())
}

/// The safetensors bytes of `sd` (selected from `dcp`'s skeleton), each
/// tensor read from `dcp`'s chunks `stage` bytes (whole rows) at a time.
pub(super) fn write_dcp_with<W: Write>(
    dcp: &Dcp,
    sd: &StateDict,
    opts: &SafetensorsOptions,
    out: &mut W,
    io: IoError<'_>,
    stage: u64,
) -> Result<Written> {
    let layout = plan(sd, opts, true)?;
    let mut written = layout.written;
    write_header(&layout.header, out, io)?;
    for p in &layout.planned {
        opts.check_cancel()?;
        let view = entry(sd, p)?;
        if view.info().storage.is_some() {
            // A tensor inside a bytes item, held in memory.
            write_tensor_bytes(&view, p, out)?;
        } else {
            write_dcp_tensor(dcp, sd, p, opts, out, io, stage)?;
        }
        count(&mut written, opts, p.nbytes);
    }
    Ok(written)
}

/// One tensor (or a rank's slice of it) of a distributed checkpoint,
/// read and written a slab of rows at a time.
fn write_dcp_tensor<W: Write>(
    dcp: &Dcp,
    sd: &StateDict,
    p: &Planned,
    opts: &SafetensorsOptions,
    out: &mut W,
    io: IoError<'_>,
    stage: u64,
) -> Result<()> {
    let selected = selected(sd, p)?;
    let source = sd
        .checkpoints()
        .get(selected.file)
        .and_then(|c| c.tensor_at(selected.index))
        .map(|v| v.name())
        .ok_or_else(|| Error::new(ErrorKind::Tensor, "tensor index").for_tensor(&p.name))?;
    let t = dcp.tensor(source).ok_or_else(|| {
        Error::new(ErrorKind::Tensor, "not in the distributed checkpoint").for_tensor(source)
    })?;
    let mut offsets = vec![0u64; t.shape().len()];
    let mut sizes = t.shape().to_vec();
    if let Some(slice) = selected.slice {
        if let (Some(o), Some(z)) = (offsets.get_mut(slice.dim), sizes.get_mut(slice.dim)) {
            *o = slice.start;
            *z = slice.len;
        }
    }
    let elem = t.dtype().size() as u64;
    let row = sizes
        .iter()
        .skip(1)
        .fold(elem, |n, &d| n.saturating_mul(d))
        .max(1);
    let rows = sizes.first().copied().unwrap_or(1);
    let step = (stage / row).max(1);
    let mut done = 0u64;
    loop {
        opts.check_cancel()?;
        let take = step.min(rows - done);
        if let (Some(o), Some(z)) = (offsets.first_mut(), sizes.first_mut()) {
            let start = selected.slice.filter(|s| s.dim == 0).map_or(0, |s| s.start);
            *o = start.saturating_add(done);
            *z = take;
        }
        let bytes = dcp.read_region(source, &offsets, &sizes)?;
        if p.cast {
            out.write_all(&crate::cast::convert(&bytes, t.dtype(), p.dtype)?)
                .map_err(io)?;
        } else {
            out.write_all(&bytes).map_err(io)?;
        }
        // The slab is copied out: its pages of the mapped files need not
        // stay in this process's resident memory.
        for source in dcp.sources() {
            source.release();
        }
        done += take;
        if done >= rows {
            break;
        }
    }
    Ok(())
}

/// Merged rank files' tensors, planned with their header, to `out`.
pub(super) fn write_merged_with<W: Write>(
    set: &crate::set::CheckpointSet,
    layout: &MergedLayout<'_>,
    shard: Option<crate::tp::Shard>,
    opts: &SafetensorsOptions,
    out: &mut W,
    written: &mut Written,
    io: IoError<'_>,
) -> Result<()> {
    write_header(&layout.header, out, io)?;
    for p in &layout.plans {
        opts.check_cancel()?;
        let m = p.merged;
        // Streamed in the chunks the parts are read in (whole elements
        // each), cast chunk by chunk.
        let mut bytes = 0u64;
        let mut failure: Option<Error> = None;
        m.visit_bytes(set, shard, |chunk| {
            if failure.is_some() {
                return;
            }
            let done = match p.cast {
                Some(to) => crate::cast::convert(chunk, m.dtype, to)
                    .and_then(|c| out.write_all(&c).map_err(io).map(|()| c.len())),
                None => out.write_all(chunk).map_err(io).map(|()| chunk.len()),
            };
            match done {
                Ok(n) => bytes += n as u64,
                Err(e) => failure = Some(e),
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        if bytes != p.nbytes {
            return Err(Error::new(
                ErrorKind::Tensor,
                format!("its parts gave {bytes} bytes, not {}", p.nbytes),
            )
            .for_tensor(&m.name));
        }
        count(written, opts, p.nbytes);
    }
    Ok(())
}

/// Stream one tensor's output bytes (cast if planned so) to `out`.
fn write_tensor_bytes(
    view: &crate::view::TensorView<'_>,
    p: &Planned,
    out: &mut impl Write,
) -> Result<()> {
    let io = |e: std::io::Error| Error::io("cannot write the safetensors file", e);
    if p.cast {
        let data = view.data()?;
        let bytes = crate::cast::convert(&data, view.dtype(), p.dtype)?;
        return out.write_all(&bytes).map_err(io);
    }
    let mut failure = None;
    view.visit_bytes(|chunk| {
        if failure.is_none() {
            if let Err(e) = out.write_all(chunk) {
                failure = Some(e);
            }
        }
    })?;
    failure.map_or(Ok(()), |e| Err(io(e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_dict::{KeySelect, StateDictOptions, Strip};
    use crate::tp::{Shard, Splits};

    /// A distributed checkpoint written a row at a time gives the same
    /// file as in one slab per tensor, whole and as a rank's slices.
    #[test]
    fn dcp_slabs_of_any_size_write_the_same_bytes() {
        let dcp = Dcp::open("../../fixtures/files/dcp/world4").unwrap();
        let skeleton = dcp.skeleton().unwrap();
        let io = |e: std::io::Error| Error::io("write", e);
        for parallel in [
            None,
            Some((
                Shard::new(1, 3).unwrap(),
                Splits::parse(&["norm.scale=replicate", "*.weight=1", "*=0"]).unwrap(),
            )),
        ] {
            let sd = StateDictOptions {
                key: KeySelect::All,
                strip: Strip::None,
                parallel,
                ..Default::default()
            }
            .select(&skeleton)
            .unwrap();
            let opts = SafetensorsOptions::default();
            let mut big = Vec::new();
            let mut small = Vec::new();
            let a = write_dcp_with(&dcp, &sd, &opts, &mut big, &io, DCP_STAGE).unwrap();
            let b = write_dcp_with(&dcp, &sd, &opts, &mut small, &io, 1).unwrap();
            assert_eq!(big, small);
            assert_eq!((a.tensors, a.bytes), (b.tensors, b.bytes));
            assert_eq!(a.tensors, 7);
        }
    }
}
