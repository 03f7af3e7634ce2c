//! Output files, written safely: never the input, never over an existing
//! file unless asked, never seen half-written. Each file is written beside
//! its target and put in place when complete.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::write::{write_with, IoError};
use super::{SafetensorsOptions, Written};
use crate::error::{Error, ErrorKind, Result};
use crate::source::FileId;
use crate::state_dict::StateDict;

/// Every file of a set in place, in order (the index last), when all were
/// written. A placement that fails takes back the files this call put in
/// place (those it created: a replaced file is not restored), so no reader
/// finds half a set; temporary files go on any failure.
pub(super) fn put_set_in_place(
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

/// `sd` to `file` (new, beside `path`), tensors that lie unchanged in a
/// checkpoint's file copied from it by the kernel.
pub(super) fn write_to_file(
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
pub(super) fn target(path: &Path) -> Result<PathBuf> {
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
pub(super) fn check(target: &Path, input: Option<FileId>, overwrite: bool) -> Result<()> {
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
pub(super) fn create_beside(target: &Path) -> Result<(PathBuf, File)> {
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
pub(super) fn finish(tmp: &Path, target: &Path, overwrite: bool) -> Result<()> {
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
