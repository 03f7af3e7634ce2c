//! One export: what it is written from (a state dict, a distributed
//! checkpoint's chunks, model-parallel rank files put back together) and
//! where to (a writer, a file written safely, a directory of shards), each
//! pair through the same planning, streaming and output rules.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::output::{check, create_beside, finish, put_set_in_place, target, write_to_file};
use super::plan::{plan, shards};
use super::write::{write_dcp_with, write_merged_with, write_with, DCP_STAGE};
use super::{Metadata, SafetensorsOptions, Written, WrittenSet};
use crate::dcp::Dcp;
use crate::error::{Error, ErrorKind, Result};
use crate::merge::Merged;
use crate::set::CheckpointSet;
use crate::source::FileId;
use crate::state_dict::StateDict;
use crate::tp::Shard;

/// What an export reads.
#[derive(Clone, Copy)]
enum From<'a> {
    State(&'a StateDict<'a>),
    Dcp(&'a Dcp, &'a StateDict<'a>),
    Merged {
        set: &'a CheckpointSet,
        merged: &'a [Merged],
        shard: Option<Shard>,
    },
}

/// A safetensors export: made from what it reads ([`state_dict`],
/// [`dcp`], [`merged`]) and its options, then written
/// ([`to_writer`], [`to_file`], [`to_shards`]). Every output is
/// contiguous, little-endian, one entry per tensor (a storage shared by
/// several tensors written once per tensor), with `{"format": "pt"}` and
/// the plain values the options ask for in `__metadata__`.
///
/// ```
/// # fn main() -> Result<(), ptload_reader::Error> {
/// use ptload_reader::export::{Export, SafetensorsOptions};
/// use ptload_reader::state_dict::StateDict;
///
/// let ckpt = ptload_reader::Checkpoint::open("../../fixtures/files/basic.pt")?;
/// let sd = StateDict::of(&ckpt)?;
/// let opts = SafetensorsOptions::default();
/// let mut out = Vec::new();
/// let written = Export::state_dict(&sd, &opts).to_writer(&mut out)?;
/// assert_eq!(written.tensors, sd.len());
/// # Ok(())
/// # }
/// ```
///
/// [`state_dict`]: Export::state_dict
/// [`dcp`]: Export::dcp
/// [`merged`]: Export::merged
/// [`to_writer`]: Export::to_writer
/// [`to_file`]: Export::to_file
/// [`to_shards`]: Export::to_shards
#[derive(Clone, Copy)]
pub struct Export<'a> {
    from: From<'a>,
    opts: &'a SafetensorsOptions,
}

impl std::fmt::Debug for Export<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let from = match self.from {
            From::State(_) => "state dict",
            From::Dcp(..) => "distributed checkpoint",
            From::Merged { .. } => "merged rank files",
        };
        f.debug_struct("Export")
            .field("from", &from)
            .field("opts", self.opts)
            .finish()
    }
}

impl<'a> Export<'a> {
    /// The state dict `sd` (every file of a set; each rank's part of
    /// sliced tensors), read from its checkpoints.
    pub fn state_dict(sd: &'a StateDict<'a>, opts: &'a SafetensorsOptions) -> Export<'a> {
        Export {
            from: From::State(sd),
            opts,
        }
    }

    /// `sd`, selected from [`Dcp::skeleton`] of `dcp` (as a set of one),
    /// each tensor (each rank's part of a sliced one) read from `dcp`'s
    /// chunks a slab of rows at a time: memory stays within a few stages
    /// whatever the size of the checkpoint.
    pub fn dcp(dcp: &'a Dcp, sd: &'a StateDict<'a>, opts: &'a SafetensorsOptions) -> Export<'a> {
        Export {
            from: From::Dcp(dcp, sd),
            opts,
        }
    }

    /// The tensors of model-parallel rank files, put back together
    /// ([`crate::merge`]): whole, or with `shard`, that rank's part of each
    /// split tensor for another world size. `{"format": "pt"}` is the only
    /// metadata.
    pub fn merged(
        set: &'a CheckpointSet,
        merged: &'a [Merged],
        shard: Option<Shard>,
        opts: &'a SafetensorsOptions,
    ) -> Export<'a> {
        Export {
            from: From::Merged { set, merged, shard },
            opts,
        }
    }

    /// Write to `out` (standard output, a socket, memory).
    pub fn to_writer(&self, out: &mut impl Write) -> Result<Written> {
        let io = |e: std::io::Error| Error::io("cannot write the safetensors file", e);
        self.write(out, &mut Vec::new(), &io)
    }

    /// Write a safetensors file at `path`, safely:
    ///
    /// - a symbolic link at `path` is followed, and its target is written;
    /// - the input's own files are never written, by any path or link;
    /// - anything but a regular file (a directory, a device, a pipe) is
    ///   refused: stream to it with [`to_writer`](Self::to_writer) instead;
    /// - an existing file is replaced only with
    ///   [`SafetensorsOptions::overwrite`];
    /// - the data goes to a new hidden file beside the target, which is
    ///   renamed into place when complete and removed on any error or
    ///   cancellation, so the target is never seen half-written.
    ///
    /// Tensors of a state dict that lie unchanged in a mapped file are
    /// copied by the kernel (`copy_file_range` on Linux, through
    /// `std::io::copy`) from the file the checkpoint holds open, never from
    /// whatever its path names now; the others stream from the map.
    pub fn to_file(&self, path: &Path) -> Result<Written> {
        let target = target(path)?;
        for input in self.inputs() {
            check(&target, input, self.opts.overwrite)?;
        }
        let (tmp, file) = create_beside(&target)?;
        let written = match self.from {
            From::State(sd) => write_to_file(sd, self.opts, file, &target),
            _ => {
                let io =
                    |e: std::io::Error| Error::io(format!("cannot write {}", target.display()), e);
                let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
                self.write(&mut out, &mut Vec::new(), &io)
                    .and_then(|w| out.flush().map_err(io).map(|()| w))
            }
        };
        let done = written.and_then(|w| finish(&tmp, &target, self.opts.overwrite).map(|()| w));
        if done.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        done
    }

    /// Write a sharded safetensors set in the directory `dir`, the way
    /// Hugging Face's `save_pretrained` shards one: tensors in order, a new
    /// shard when the next tensor would take the current one past
    /// `max_shard_bytes` (a larger tensor gets a shard of its own), files
    /// `model-00001-of-0000N.safetensors` and `model.safetensors.index.json`
    /// (`{"metadata": {"total_size"}, "weight_map"}`); one shard is
    /// `model.safetensors` alone. The plain values go to the first shard's
    /// `__metadata__`. Every file is written beside its target first (the
    /// rules of [`to_file`](Self::to_file)) and put in place only when all
    /// are complete: an error or a cancellation leaves none of them.
    /// A state dict only: a distributed checkpoint and merged rank files
    /// are written as one file.
    pub fn to_shards(&self, dir: &Path, max_shard_bytes: u64) -> Result<WrittenSet> {
        let From::State(sd) = self.from else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "shards are written from a state dict; a distributed checkpoint or merged rank \
                 files are written as one file",
            ));
        };
        let opts = self.opts;
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

    /// The files the export reads: never written.
    fn inputs(&self) -> Vec<Option<FileId>> {
        match self.from {
            From::State(sd) => sd
                .checkpoints()
                .iter()
                .flat_map(|c| c.inputs())
                .map(|s| s.identity())
                .collect(),
            From::Dcp(dcp, _) => dcp.sources().map(|s| s.identity()).collect(),
            From::Merged { set, .. } => set
                .files()
                .iter()
                .flat_map(|f| f.checkpoint().inputs())
                .map(|s| s.identity())
                .collect(),
        }
    }

    /// The export to `out`; a state dict's unchanged tensors copied by the
    /// kernel from `sources` where one is given.
    fn write<W: Write>(
        &self,
        out: &mut W,
        sources: &mut [Option<std::fs::File>],
        io: super::write::IoError<'_>,
    ) -> Result<Written> {
        match self.from {
            From::State(sd) => write_with(sd, self.opts, out, sources, io),
            From::Dcp(dcp, sd) => write_dcp_with(dcp, sd, self.opts, out, io, DCP_STAGE),
            From::Merged { set, merged, shard } => {
                let mut written = Written::default();
                let layout = super::plan::merged(merged, shard, self.opts, &mut written)?;
                write_merged_with(set, &layout, shard, self.opts, out, &mut written, io)?;
                Ok(written)
            }
        }
    }
}
