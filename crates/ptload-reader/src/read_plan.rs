//! Read plans: which bytes of which files each rank of a job reads.
//!
//! Two plans for a world of `world` ranks on `nodes` nodes (ranks
//! `0..world/nodes` on the first node, and so on):
//!
//! - [`ReadPlan::sliced`]: each rank reads its own tensor-parallel slices
//!   (see [`crate::tp`]) and the replicated tensors, nothing else.
//! - [`ReadPlan::read_once`]: the set's bytes leave storage once per node,
//!   split evenly among the node's ranks, for an engine that then
//!   exchanges them with its own collectives. ptload plans and reads; the
//!   exchange stays with the engine.
//!
//! A range is `count` blocks of `len` bytes, `step` bytes apart, from
//! `offset` in file `file`: a row-parallel slice of a matrix is one range.

use crate::error::{Error, ErrorKind, Result};
use crate::limits::Limits;
use crate::set::CheckpointSet;
use crate::state_dict::StateDictOptions;
use crate::tp::{Shard, Splits};

/// `count` blocks of `len` bytes at `offset`, `offset + step`, ... of
/// file `file` (an index into [`ReadPlan::files`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Range {
    /// Which file of the set.
    pub file: usize,
    /// Byte offset of the first block in the file.
    pub offset: u64,
    /// Bytes per block.
    pub len: u64,
    /// Blocks.
    pub count: u64,
    /// Bytes from one block's start to the next (0 when `count` is 1).
    pub step: u64,
}

impl Range {
    /// Bytes the range covers.
    pub fn bytes(&self) -> u64 {
        self.len.saturating_mul(self.count)
    }
}

/// What one rank reads.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RankReads {
    /// The rank, `0..world`.
    pub rank: u32,
    /// Its node, `0..nodes`.
    pub node: u32,
    /// Its rank within the node.
    pub local_rank: u32,
    /// Total bytes of its ranges.
    pub bytes: u64,
    /// The ranges, in file order.
    pub ranges: Vec<Range>,
}

/// How a plan shares the bytes among ranks (`"sliced"` or `"read_once"`
/// in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum PlanKind {
    /// Each rank reads its slices of the tensors the rules split, and the
    /// tensors they do not whole.
    Sliced,
    /// Every byte read once per node, split evenly among its ranks.
    ReadOnce,
}

/// Which bytes each rank of a job reads.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ReadPlan {
    /// How the bytes are shared.
    pub kind: PlanKind,
    /// The set's files, by path, in [`Range::file`] order.
    pub files: Vec<String>,
    /// Ranks.
    pub world: u32,
    /// Nodes (the ranks are spread evenly, in order).
    pub nodes: u32,
    /// Bytes of tensor data in the selection, whole (what one reader of
    /// everything reads).
    pub total_bytes: u64,
    /// Each rank's reads.
    pub ranks: Vec<RankReads>,
}

/// Appends ranges, merging a block into the last range when it continues
/// it (adjacent, or one more block at the same step).
struct Ranges<'l> {
    out: Vec<Range>,
    limits: &'l Limits,
    /// Whether equal blocks at a fixed step become one range.
    strided: bool,
}

impl Ranges<'_> {
    fn push(&mut self, file: usize, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if let Some(last) = self.out.last_mut() {
            if last.file == file {
                let end = last.offset.saturating_add(last.bytes());
                if last.count == 1 && end == offset {
                    last.len = last.len.saturating_add(len);
                    return Ok(());
                }
                let next = last
                    .offset
                    .saturating_add(last.step.saturating_mul(last.count));
                if self.strided && last.len == len && last.count > 1 && next == offset {
                    last.count += 1;
                    return Ok(());
                }
                if self.strided && last.len == len && last.count == 1 && offset > last.offset {
                    last.step = offset - last.offset;
                    last.count = 2;
                    return Ok(());
                }
            }
        }
        if self.out.len() as u64 >= self.limits.max_walk_steps {
            return Err(Error::limit("max_walk_steps", self.limits.max_walk_steps));
        }
        self.out.push(Range {
            file,
            offset,
            len,
            count: 1,
            step: 0,
        });
        Ok(())
    }
}

/// Where a storage's bytes lie in its file: a plan addresses only bytes
/// stored as they are.
fn stored_at(storage: &crate::torch::tensor::StorageInfo, name: &str) -> Result<u64> {
    storage.file_offset.ok_or_else(|| {
        Error::new(
            ErrorKind::Unsupported,
            "its storage is compressed in the file: a plan addresses stored bytes only",
        )
        .for_tensor(name)
    })
}

/// Ranks a plan covers at most: each costs a selection of the whole set.
pub const MAX_WORLD: u32 = 1 << 16;

/// The selection `opts` makes, every tensor whole.
fn select_whole<'c>(
    set: &'c CheckpointSet,
    opts: &StateDictOptions,
) -> Result<crate::state_dict::StateDict<'c>> {
    StateDictOptions {
        parallel: None,
        ..opts.clone()
    }
    .select_set(set)
}

fn layout(world: u32, nodes: u32) -> Result<u32> {
    if world > MAX_WORLD {
        return Err(Error::new(
            ErrorKind::InvalidSpec,
            format!("a world of {world} ranks: plans cover at most {MAX_WORLD}"),
        ));
    }
    if world == 0 || nodes == 0 || world % nodes != 0 {
        return Err(Error::new(
            ErrorKind::InvalidSpec,
            format!("{world} ranks on {nodes} nodes: the world must be a positive multiple of the node count"),
        ));
    }
    Ok(world / nodes)
}

fn file_names(set: &CheckpointSet) -> Vec<String> {
    set.files()
        .iter()
        .map(|f| f.path().display().to_string())
        .collect()
}

impl ReadPlan {
    /// Each rank's tensor-parallel slices under `splits` (and every
    /// replicated tensor), for the state dict `opts` selects (its own
    /// `parallel` is replaced).
    pub fn sliced(
        set: &CheckpointSet,
        opts: &StateDictOptions,
        splits: &Splits,
        world: u32,
        nodes: u32,
        limits: &Limits,
    ) -> Result<ReadPlan> {
        let per_node = layout(world, nodes)?;
        let whole = select_whole(set, opts)?;
        let total_bytes = whole.tensors().map(|(_, t)| t.info().nbytes).sum();
        let mut ranks = Vec::with_capacity(world as usize);
        for rank in 0..world {
            let sd = StateDictOptions {
                parallel: Some((Shard::new(rank, world)?, splits.clone())),
                ..opts.clone()
            }
            .select_set(set)?;
            let mut ranges = Ranges {
                out: Vec::new(),
                limits,
                strided: true,
            };
            for entry in sd.iter() {
                let Some(view) = sd.view(entry) else { continue };
                let Some(storage) = view.storage() else {
                    continue;
                };
                let base = stored_at(storage, &entry.name)?;
                view.info().run_bounds(storage.nbytes, |start, len| {
                    ranges.push(entry.file, base.saturating_add(start), len)
                })?;
            }
            let bytes = ranges.out.iter().map(Range::bytes).sum();
            ranks.push(RankReads {
                rank,
                node: rank / per_node,
                local_rank: rank % per_node,
                bytes,
                ranges: ranges.out,
            });
        }
        Ok(ReadPlan {
            kind: PlanKind::Sliced,
            files: file_names(set),
            world,
            nodes,
            total_bytes,
            ranks,
        })
    }

    /// The storages of the state dict `opts` selects, each byte read once
    /// per node: the node's ranks take equal shares of the set's bytes, in
    /// file order.
    pub fn read_once(
        set: &CheckpointSet,
        opts: &StateDictOptions,
        world: u32,
        nodes: u32,
        limits: &Limits,
    ) -> Result<ReadPlan> {
        let per_node = layout(world, nodes)?;
        let sd = select_whole(set, opts)?;
        // The storages the selection views, each once, in file order.
        let mut extents: Vec<(usize, u64, u64)> = Vec::new();
        for entry in sd.iter() {
            let Some(view) = sd.view(entry) else { continue };
            let Some(storage) = view.storage() else {
                continue;
            };
            let offset = stored_at(storage, &entry.name)?;
            extents.push((entry.file, offset, storage.nbytes));
        }
        extents.sort_unstable();
        extents.dedup();
        let mut merged = Ranges {
            out: Vec::new(),
            limits,
            strided: false,
        };
        for &(file, offset, len) in &extents {
            // Overlapping storages do not occur in torch files; a crafted
            // one is read from where the last extent ended.
            let start = match merged.out.last() {
                Some(l) if l.file == file => offset.max(l.offset.saturating_add(l.bytes())),
                _ => offset,
            };
            let end = offset.saturating_add(len);
            if end > start {
                merged.push(file, start, end - start)?;
            }
        }
        let total_bytes: u64 = merged.out.iter().map(Range::bytes).sum();
        let mut ranks = Vec::with_capacity(world as usize);
        for rank in 0..world {
            let local = rank % per_node;
            // Share `local` of the node's bytes: [from, to).
            let cut = |k: u32| -> u64 {
                (u128::from(total_bytes) * u128::from(k) / u128::from(per_node)) as u64
            };
            let (from, to) = (cut(local), cut(local + 1));
            let mut ranges = Ranges {
                out: Vec::new(),
                limits,
                strided: false,
            };
            let mut at = 0u64;
            for r in &merged.out {
                let (lo, hi) = (at, at.saturating_add(r.len));
                at = hi;
                let (a, b) = (lo.max(from), hi.min(to));
                if a < b {
                    ranges.push(r.file, r.offset + (a - lo), b - a)?;
                }
            }
            ranks.push(RankReads {
                rank,
                node: rank / per_node,
                local_rank: local,
                bytes: to - from,
                ranges: ranges.out,
            });
        }
        Ok(ReadPlan {
            kind: PlanKind::ReadOnce,
            files: file_names(set),
            world,
            nodes,
            total_bytes,
            ranks,
        })
    }
}
