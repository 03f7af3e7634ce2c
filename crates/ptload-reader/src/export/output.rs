//! Output files, written safely: never the input, never over an existing
//! file unless asked, never seen half-written. Each file is written beside
//! its target and put in place when complete.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::plan::{plan, shards};
use super::write::{write_dcp_with, write_merged_with, write_with, IoError, DCP_STAGE};
use super::{Metadata, SafetensorsOptions, Written, WrittenSet};
use crate::dcp::Dcp;
use crate::error::{Error, ErrorKind, Result};
use crate::source::FileId;
use crate::state_dict::StateDict;

/// Write a safetensors file at `path`, safely:
///
/// - a symbolic link at `path` is followed, and its target is written;
/// - the checkpoint's own file is never written, by any path or link;
/// - anything but a regular file (a directory, a device, a pipe) is
///   refused: stream to it with [`write_safetensors`](super::write_safetensors) instead;
/// - an existing file is replaced only with
///   [`SafetensorsOptions::overwrite`];
/// - the data goes to a new hidden file beside the target, which is renamed
///   into place when complete and removed on any error or cancellation, so
///   the target is never seen half-written.
///
/// Tensors that lie unchanged in a mapped file are copied by the kernel
/// (`copy_file_range` on Linux, through `std::io::copy`) from the file the
/// checkpoint holds open, never from whatever its path names now; the
/// others stream from the map. Same format as
/// [`write_safetensors`](super::write_safetensors).
pub fn write_safetensors_file(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    path: &Path,
) -> Result<Written> {
    let target = target(path)?;
    for source in sd.checkpoints().iter().flat_map(|c| c.inputs()) {
        check(&target, source.identity(), opts.overwrite)?;
    }
    let (tmp, file) = create_beside(&target)?;
    let written = write_to_file(sd, opts, file, &target);
    let done = written.and_then(|w| finish(&tmp, &target, opts.overwrite).map(|()| w));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Write `sd` as a sharded safetensors set in the directory `dir`, the way
/// Hugging Face's `save_pretrained` shards one: tensors in order, a new
/// shard when the next tensor would take the current one past
/// `max_shard_bytes` (a larger tensor gets a shard of its own), files
/// `model-00001-of-0000N.safetensors` and `model.safetensors.index.json`
/// (`{"metadata": {"total_size"}, "weight_map"}`); one shard is
/// `model.safetensors` alone. The plain values go to the first shard's
/// `__metadata__`. Every file is written beside its target first and put
/// in place only when all are complete: an error or a cancellation
/// leaves none of them, and existing files are replaced only with
/// [`SafetensorsOptions::overwrite`].
pub fn write_safetensors_set(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    dir: &Path,
    max_shard_bytes: u64,
) -> Result<WrittenSet> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    // Shards by output bytes, as planned (dtype conversion included).
    let layout = plan(sd, opts, false)?;
    let shards = shards(&layout.planned, max_shard_bytes);
    let n = shards.len();
    let names: Vec<String> = if n == 1 {
        vec!["model.safetensors".to_owned()]
    } else {
        (1..=n)
            .map(|i| format!("model-{i:05}-of-{n:05}.safetensors"))
            .collect()
    };
    let mut targets = Vec::with_capacity(n + 1);
    for name in &names {
        targets.push(target(&dir.join(name))?);
    }
    let index_target = (n > 1)
        .then(|| target(&dir.join("model.safetensors.index.json")))
        .transpose()?;
    for t in targets.iter().chain(&index_target) {
        for source in sd.checkpoints().iter().flat_map(|c| c.inputs()) {
            check(t, source.identity(), opts.overwrite)?;
        }
    }
    // Each file beside its target: (temporary, target, what it holds).
    let mut done: Vec<(PathBuf, PathBuf, Written)> = Vec::new();
    let result = (|| -> Result<()> {
        let mut weight_map: Vec<(String, String)> = Vec::new();
        let mut total = 0u64;
        for (k, positions) in shards.iter().enumerate() {
            let part = sd.subset(positions);
            let mut shard_opts = opts.clone();
            if k > 0 {
                shard_opts.metadata = Metadata::None;
            }
            let (Some(target), Some(name)) = (targets.get(k), names.get(k)) else {
                return Err(Error::new(ErrorKind::Tensor, "shard index"));
            };
            let (tmp, file) = create_beside(target)?;
            done.push((tmp.clone(), target.clone(), Written::default()));
            let written = write_to_file(&part, &shard_opts, file, target)?;
            for e in part.iter() {
                weight_map.push((e.name.clone(), name.clone()));
            }
            total += written.bytes;
            if let Some(last) = done.last_mut() {
                last.2 = written;
            }
        }
        if let Some(index) = &index_target {
            weight_map.sort();
            let text = super::header::index(total, &weight_map)?;
            let (tmp, mut file) = create_beside(index)?;
            done.push((tmp, index.clone(), Written::default()));
            file.write_all(text.as_bytes())
                .and_then(|()| file.flush())
                .map_err(|e| Error::io(format!("cannot write {}", index.display()), e))?;
        }
        opts.check_cancel()?;
        Ok(())
    })();
    put_set_in_place(result, &done, opts.overwrite)?;
    let mut out = WrittenSet {
        skipped: layout.written.skipped,
        ..WrittenSet::default()
    };
    for (_, target, written) in done {
        if Some(&target) == index_target.as_ref() {
            out.index = Some(target);
        } else {
            out.files.push((target, written));
        }
    }
    Ok(out)
}

/// Every file of a set in place, in order (the index last), when all were
/// written. A placement that fails takes back the files this call put in
/// place (those it created: a replaced file is not restored), so no reader
/// finds half a set; temporary files go on any failure.
fn put_set_in_place(
    written: Result<()>,
    done: &[(PathBuf, PathBuf, Written)],
    overwrite: bool,
) -> Result<()> {
    let mut placed: Vec<&Path> = Vec::new();
    let placing = written.and_then(|()| {
        for (tmp, target, _) in done {
            finish(tmp, target, overwrite)?;
            placed.push(target);
        }
        Ok(())
    });
    if let Err(e) = placing {
        for (tmp, _, _) in done {
            let _ = std::fs::remove_file(tmp);
        }
        if !overwrite {
            for target in placed {
                let _ = std::fs::remove_file(target);
            }
        }
        return Err(e);
    }
    Ok(())
}

/// Write the tensors of model-parallel rank files, put back together
/// ([`crate::merge`]), as one safetensors file at `path`: whole, or with
/// `shard`, that rank's part of each split tensor for another world size.
/// `{"format": "pt"}` is the only metadata. The same output rules as
/// [`write_safetensors_file`].
pub fn write_merged_file(
    set: &crate::set::CheckpointSet,
    merged: &[crate::merge::Merged],
    shard: Option<crate::tp::Shard>,
    opts: &SafetensorsOptions,
    path: &Path,
) -> Result<Written> {
    let target = target(path)?;
    for source in set.files().iter().flat_map(|f| f.checkpoint().inputs()) {
        check(&target, source.identity(), opts.overwrite)?;
    }
    let mut written = Written::default();
    let layout = super::plan::merged(merged, shard, opts, &mut written)?;
    let (tmp, file) = create_beside(&target)?;
    let io = |e: std::io::Error| Error::io(format!("cannot write {}", target.display()), e);
    let result = (|| -> Result<()> {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        write_merged_with(set, &layout, shard, opts, &mut out, &mut written, &io)?;
        out.flush().map_err(io)?;
        Ok(())
    })();
    let done = result.and_then(|()| finish(&tmp, &target, opts.overwrite));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done.map(|()| written)
}

/// Write `sd` (selected from [`Dcp::skeleton`](crate::dcp::Dcp::skeleton)
/// of `dcp`, as a set of one) to `path` as a safetensors file, safely as
/// [`write_safetensors_file`] does, reading each tensor (each rank's part
/// of a sliced one) from `dcp`'s chunks a slab of rows at a time: memory
/// stays within a few stages whatever the size of the checkpoint.
pub fn write_dcp_safetensors_file(
    dcp: &Dcp,
    sd: &StateDict,
    opts: &SafetensorsOptions,
    path: &Path,
) -> Result<Written> {
    let target = target(path)?;
    for source in dcp.sources() {
        check(&target, source.identity(), opts.overwrite)?;
    }
    let (tmp, file) = create_beside(&target)?;
    let io = |e: std::io::Error| Error::io(format!("cannot write {}", target.display()), e);
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let written = write_dcp_with(dcp, sd, opts, &mut out, &io, DCP_STAGE)
        .and_then(|w| out.flush().map_err(io).map(|()| w));
    drop(out);
    let done = written.and_then(|w| finish(&tmp, &target, opts.overwrite).map(|()| w));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// `sd` to `file` (new, beside `path`), tensors that lie unchanged in a
/// checkpoint's file copied from it by the kernel.
fn write_to_file(
    sd: &StateDict,
    opts: &SafetensorsOptions,
    file: File,
    path: &Path,
) -> Result<Written> {
    let io = |e: std::io::Error| Error::io(format!("cannot write {}", path.display()), e);
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    // A handle of our own on each file we mapped: its position is ours.
    let mut sources: Vec<Option<File>> = sd
        .checkpoints()
        .iter()
        .map(|c| c.source().private_handle())
        .collect();
    let io: IoError<'_> = &io;
    let written = write_with(sd, opts, &mut out, &mut sources, io)?;
    out.flush().map_err(io)?;
    Ok(written)
}

/// Symbolic links followed before giving up (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// `path` with every symbolic link at its end followed.
fn target(path: &Path) -> Result<PathBuf> {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let link = std::fs::read_link(&path)
                    .map_err(|e| Error::io(format!("cannot read link {}", path.display()), e))?;
                path = match path.parent() {
                    Some(dir) if link.is_relative() => dir.join(link),
                    _ => link,
                };
            }
            _ => return Ok(path),
        }
    }
    Err(Error::new(
        ErrorKind::OutputRefused,
        format!("{}: more than {MAX_LINKS} symbolic links", path.display()),
    ))
}

/// Refuse the input, anything but a regular file, and an existing file
/// unless `overwrite`.
fn check(target: &Path, input: Option<FileId>, overwrite: bool) -> Result<()> {
    let meta = match std::fs::metadata(target) {
        Ok(meta) => meta,
        // Nothing there: nothing to protect.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        // Something that cannot be looked at (no permission, a path
        // through a file): it may be the input or a file to keep, so
        // nothing is written.
        Err(e) => {
            return Err(Error::new(
                ErrorKind::OutputRefused,
                format!(
                    "{}: cannot tell whether it is the input or a file to keep ({e})",
                    target.display()
                ),
            )
            .caused_by(e))
        }
    };
    let shown = target.display();
    if input.is_some() && FileId::of(&meta) == input {
        return Err(Error::new(
            ErrorKind::OutputRefused,
            format!("{shown} is the checkpoint being read; write somewhere else"),
        ));
    }
    if !meta.is_file() {
        return Err(Error::new(
            ErrorKind::OutputRefused,
            format!("{shown} is not a regular file (a directory, device or pipe)"),
        ));
    }
    if !overwrite {
        return Err(Error::new(
            ErrorKind::OutputExists,
            format!("{shown} exists; it is replaced only when overwriting is asked for"),
        ));
    }
    Ok(())
}

/// A new file beside `target`, created exclusively (never through a
/// link someone placed under the temporary name).
fn create_beside(target: &Path) -> Result<(PathBuf, File)> {
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    let mut last = None;
    for attempt in 0..100u32 {
        let tmp = dir.join(format!(
            ".{name}.{}-{attempt}.ptload-partial",
            std::process::id()
        ));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(Error::io(format!("cannot create {}", tmp.display()), e)),
        }
    }
    let e = last.unwrap_or_else(|| std::io::Error::other("no free name"));
    Err(Error::io(
        format!("cannot create a temporary file in {}", dir.display()),
        e,
    ))
}

/// Put the complete file in place: a rename when replacing is allowed;
/// otherwise a hard link, which fails rather than replace a file that
/// appeared meanwhile.
fn finish(tmp: &Path, target: &Path, overwrite: bool) -> Result<()> {
    let failed = |e| Error::io(format!("cannot write {}", target.display()), e);
    if overwrite {
        return std::fs::rename(tmp, target).map_err(failed);
    }
    match std::fs::hard_link(tmp, target) {
        Ok(()) => std::fs::remove_file(tmp).map_err(failed),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(Error::new(
            ErrorKind::OutputExists,
            format!(
                "{} appeared while writing; it was left as it is",
                target.display()
            ),
        )),
        // File systems without hard links: the check at the start stands.
        Err(_) => std::fs::rename(tmp, target).map_err(failed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_that_cannot_be_looked_at_is_refused() {
        let dir = std::env::temp_dir().join(format!("ptload-output-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("plain");
        std::fs::write(&file, b"x").expect("file");
        // A path through a regular file: looking at it fails (ENOTDIR),
        // which is not "nothing there".
        let e = check(&file.join("out.safetensors"), None, true).expect_err("refused");
        assert_eq!(e.kind(), ErrorKind::OutputRefused, "{e}");
        assert!(e.to_string().contains("cannot tell whether"), "{e}");
        assert!(
            std::error::Error::source(&e).is_some(),
            "the OS error is kept"
        );
        // Nothing there: written.
        assert!(check(&dir.join("absent.safetensors"), None, false).is_ok());
        // The input itself, found by the identity the source took at open.
        let source = crate::source::Source::map(&file).expect("map");
        let e = check(&file, source.identity(), true).expect_err("the input");
        assert!(
            e.to_string().contains("is the checkpoint being read"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
