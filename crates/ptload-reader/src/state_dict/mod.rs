//! The other half of what users write around `torch.load`: pick the model
//! out of a training checkpoint, strip wrapper prefixes, rename keys.
//!
//! [`StateDictOptions::select`] takes the state dict out of one checkpoint
//! (`select.rs`), [`StateDictOptions::select_set`] out of the files of a
//! set (`sets.rs`); [`KeySelect::Auto`] finds the model of a training
//! checkpoint (`auto.rs`). What they decide comes back as [`Decision`]s.

use std::ops::Deref;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, ErrorKind, Result};
use crate::name_index::NameIndex;
use crate::placement::DeviceMap;
use crate::torch::tensor::TensorInfo;
use crate::tp::{Shard, Slice, Splits};
use crate::view::TensorView;

mod auto;
mod select;
mod sets;
mod weights;

pub use auto::{auto_key, AutoKey, Decision, AVERAGED_MODEL_KEYS, MODEL_KEYS, TRAINING_STATE};
pub use weights::Weights;

/// Which part of the checkpoint is the state dict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeySelect {
    /// The whole checkpoint.
    All,
    /// If the checkpoint is a training checkpoint (its top level holds one
    /// of [`MODEL_KEYS`] next to plain values or optimizer-like state), that
    /// key's sub-tree; otherwise the whole checkpoint. Unsure (two models,
    /// or none under a known key beside training state), it says so in
    /// its [`Decision`].
    #[default]
    Auto,
    /// The sub-tree under this dotted path.
    Path(String),
}

/// Which prefix to remove from every name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Strip {
    /// None.
    None,
    /// `module.` (DataParallel, DDP) and `_orig_mod.` (torch.compile), in
    /// any nesting, when every name carries it.
    #[default]
    Auto,
    /// This prefix, from every name that has it.
    Prefix(String),
}

impl std::str::FromStr for KeySelect {
    type Err = std::convert::Infallible;

    /// `auto`, `all` (or empty: the whole file), or a dotted path.
    fn from_str(text: &str) -> std::result::Result<KeySelect, Self::Err> {
        Ok(match text {
            "auto" => KeySelect::Auto,
            "all" | "" => KeySelect::All,
            path => KeySelect::Path(path.to_owned()),
        })
    }
}

impl std::str::FromStr for Strip {
    type Err = std::convert::Infallible;

    /// `auto`, `none` (or empty), or a literal prefix.
    fn from_str(text: &str) -> std::result::Result<Strip, Self::Err> {
        Ok(match text {
            "auto" => Strip::Auto,
            "none" | "" => Strip::None,
            prefix => Strip::Prefix(prefix.to_owned()),
        })
    }
}

/// How to turn a checkpoint's flattened names into a state dict.
#[derive(Debug, Clone, Default)]
pub struct StateDictOptions {
    /// The sub-tree to take.
    pub key: KeySelect,
    /// The prefix to strip.
    pub strip: Strip,
    /// A prefix to add after stripping.
    pub add_prefix: Option<String>,
    /// Renames `(from, to)`: the first whose glob matches a name rewrites it,
    /// each `*` of `to` taking what the `*`s of `from` matched.
    pub renames: Vec<(String, String)>,
    /// Keep only the tensors whose final name matches one of these globs
    /// (all when empty).
    pub include: Vec<String>,
    /// Then leave out those whose final name matches one of these globs.
    pub exclude: Vec<String>,
    /// Tensor parallelism: take only this rank's part of each tensor the
    /// rules split (rules match final names); see [`crate::tp`].
    /// Selecting so also marks the file's map as read in pieces: each view
    /// asks the kernel for exactly its pages before reading them, so a
    /// rank's reads from storage stay near its share.
    pub parallel: Option<(Shard, Splits)>,
}

/// One tensor of the selected state dict.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Selected {
    /// Index into its checkpoint's tensors.
    pub index: usize,
    /// Its name in the state dict.
    pub name: String,
    /// Which file of the set holds it (0 for a single checkpoint).
    pub file: usize,
    /// The part a tensor-parallel rank holds, when it is split.
    pub slice: Option<Slice>,
    /// The view of that part.
    sliced: Option<Box<TensorInfo>>,
}

impl Selected {
    /// Tensor `index` of a checkpoint, whole, under `name`.
    pub fn new(index: usize, name: impl Into<String>) -> Selected {
        Selected {
            index,
            name: name.into(),
            file: 0,
            slice: None,
            sliced: None,
        }
    }

    /// The tensor in `ckpt` (the checkpoint of its [`file`](Self::file)):
    /// the part of it a rank holds when it is sliced, with the
    /// checkpoint's name.
    pub fn view<'a>(&'a self, ckpt: &'a Checkpoint) -> Option<TensorView<'a>> {
        match &self.sliced {
            Some(info) => Some(TensorView { ckpt, info }),
            None => ckpt.tensor_at(self.index),
        }
    }
}

/// For each of `files` (the checkpoints `entries` name by
/// [`Selected::file`]), the whole storages the entries read from it, in
/// their order, when it is read by ranges: what a read-ahead fetches
/// ([`StateDict::while_reading_ahead`],
/// [`ReadAhead::start`](crate::checkpoint::ReadAhead::start)). Empty for a
/// mapped file, and without a rank's slices (they read part of a
/// storage).
pub fn storages_ahead(entries: &[Selected], files: &[&Checkpoint]) -> Vec<Vec<usize>> {
    files
        .iter()
        .enumerate()
        .map(|(k, &c)| {
            if c.fetched_bytes().is_none() {
                return Vec::new();
            }
            entries
                .iter()
                .filter(|e| e.file == k && e.slice.is_none())
                .filter_map(|e| e.view(c)?.info().storage)
                .collect()
        })
        .collect()
}

/// A selected state dict: the chosen tensors of one checkpoint under their
/// final names (after the key, stripping, renames and prefix), looked up by
/// those names in constant time. Derefs to the [`Selected`] entries, in
/// checkpoint order.
///
/// ```
/// # fn main() -> Result<(), ptload_reader::Error> {
/// use ptload_reader::Checkpoint;
/// use ptload_reader::state_dict::StateDict;
///
/// let ckpt = Checkpoint::open("../../fixtures/files/dataparallel.pt")?;
/// # assert!(ckpt.tensors().all(|t| t.name().starts_with("module.")));
/// let sd = StateDict::of(&ckpt)?; // `module.` stripped
/// for (name, tensor) in sd.tensors() {
///     assert_eq!(format!("module.{name}"), tensor.name());
///     assert!(sd.get(name).is_some());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct StateDict<'c> {
    /// The first file's checkpoint.
    ckpt: &'c Checkpoint,
    /// The checkpoint of each file (one for a single checkpoint).
    files: Vec<&'c Checkpoint>,
    /// The sub-tree taken, if not the whole file.
    key: Option<String>,
    /// What the selection decided, in order.
    decisions: Vec<Decision>,
    entries: Vec<Selected>,
    /// Indices into `entries`, by their final name.
    index: NameIndex,
}

impl<'c> StateDict<'c> {
    /// The state dict [`StateDictOptions::default`] selects: the model's
    /// sub-tree of a training checkpoint, wrapper prefixes stripped.
    pub fn of(ckpt: &'c Checkpoint) -> Result<StateDict<'c>> {
        StateDictOptions::default().select(ckpt)
    }

    /// The tensor named `name` in the state dict (its final name); the
    /// rank's part of it when it is sliced.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let at = self.position(name)?;
        self.view(self.entries.get(at)?)
    }

    /// The view of `entry` (one of this state dict's entries).
    pub fn view<'s>(&'s self, entry: &'s Selected) -> Option<TensorView<'s>> {
        entry.view(self.files.get(entry.file)?)
    }

    /// The device plan of what this selects from its file `file` (0 for
    /// a single checkpoint): `mapper` is asked once per storage a selected
    /// tensor reads, in selection order, with the tensors' *selected*
    /// names (after the key, stripping and renames) and the bytes the load
    /// will copy from it (a rank's slices at their size, not their
    /// storage's), so name rules and budgets see the model, not the
    /// training state around it. Storages nothing selected reads are not
    /// asked about: they stay where they were saved, with 0 bytes, and are
    /// not counted by [`DeviceMap::per_device`].
    pub fn device_map(
        &self,
        file: usize,
        mapper: &mut dyn crate::placement::Mapper,
    ) -> Result<DeviceMap> {
        let ckpt = self.files.get(file).copied().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidSpec,
                format!("the selection has no file {file}"),
            )
        })?;
        let storages = ckpt.storages();
        let mut names: Vec<Vec<&str>> = vec![Vec::new(); storages.len()];
        let mut nbytes: Vec<u64> = vec![0; storages.len()];
        let mut order: Vec<usize> = Vec::new();
        for entry in self.entries.iter().filter(|e| e.file == file) {
            let Some(view) = entry.view(ckpt) else {
                continue;
            };
            let Some(i) = view.info().storage else {
                continue;
            };
            if let (Some(list), Some(n)) = (names.get_mut(i), nbytes.get_mut(i)) {
                if list.is_empty() {
                    order.push(i);
                }
                list.push(entry.name.as_str());
                // Tied views read one storage once: at most all of it.
                let whole = storages.get(i).map_or(0, |s| s.nbytes);
                *n = n.saturating_add(view.info().nbytes).min(whole);
            }
        }
        DeviceMap::decide(ckpt, &order, &names, &nbytes, mapper)
    }

    /// The entry named `name`: its final name and checkpoint index.
    pub fn selected(&self, name: &str) -> Option<&Selected> {
        self.entries.get(self.position(name)?)
    }

    /// Whether the state dict has a tensor named `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.position(name).is_some()
    }

    /// Each tensor with its final name, in checkpoint order (file by file
    /// in a set); a sliced tensor is the rank's part.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, TensorView<'_>)> + '_ {
        // Every index was taken from its file's tensors.
        self.entries
            .iter()
            .filter_map(move |e| Some((e.name.as_str(), self.view(e)?)))
    }

    /// The checkpoint the tensors are in: the first file's, in a set.
    pub fn checkpoint(&self) -> &'c Checkpoint {
        self.ckpt
    }

    /// The checkpoint of each file, in the order of [`Selected::file`].
    pub fn checkpoints(&self) -> &[&'c Checkpoint] {
        &self.files
    }

    /// Run `work` while the whole storages this selection reads from files
    /// read by ranges (URLs, bucket objects) are fetched ahead of it,
    /// several requests in flight
    /// ([`while_prefetching`](crate::checkpoint::while_prefetching)); once
    /// `work` ends no further request starts. A rank's slices are read by
    /// `work` alone (they need part of a storage). Mapped files fetch
    /// nothing: `work` just runs.
    pub fn while_reading_ahead<T>(&self, work: impl FnOnce() -> T) -> T {
        let lists = storages_ahead(&self.entries, &self.files);
        let ahead: Vec<(&Checkpoint, &[usize])> = self
            .files
            .iter()
            .zip(&lists)
            .map(|(c, s)| (*c, s.as_slice()))
            .collect();
        crate::checkpoint::while_prefetching(&ahead, work)
    }

    /// The entries at `positions` (indices into this state dict's
    /// entries), as a state dict of their own.
    pub fn subset(&self, positions: &[usize]) -> StateDict<'c> {
        let entries: Vec<Selected> = positions
            .iter()
            .filter_map(|&p| self.entries.get(p).cloned())
            .collect();
        let mut index = NameIndex::with_capacity(entries.len());
        for (pos, e) in entries.iter().enumerate() {
            // Names are unique in `self`, so in any subset of it.
            let hash = index.hash(&e.name);
            index.insert_hashed(hash, pos as u32, |i| {
                entries.get(i as usize).map(|x| x.name.as_str())
            });
        }
        StateDict {
            ckpt: self.ckpt,
            files: self.files.clone(),
            key: self.key.clone(),
            decisions: self.decisions.clone(),
            entries,
            index,
        }
    }

    /// The entries of file `file`, in checkpoint order, as a selection of
    /// that file's checkpoint alone (their [`Selected::file`] is 0): what
    /// a loader of one checkpoint (`ptload_device::load`) takes, with
    /// `checkpoints()[file]`.
    pub fn of_file(&self, file: usize) -> Vec<Selected> {
        self.entries
            .iter()
            .filter(|e| e.file == file)
            .map(|e| Selected {
                file: 0,
                ..e.clone()
            })
            .collect()
    }

    /// The dotted path of the sub-tree taken (`model_state_dict`), or
    /// `None` when the whole file is the state dict.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// What the selection decided, for the user: the key `auto` took and
    /// why (or why it kept the whole file), the tensors left out, the
    /// prefix `auto` stripped.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    fn position(&self, name: &str) -> Option<usize> {
        let entries = &self.entries;
        self.index
            .find(name, |i| entries.get(i as usize).map(|e| e.name.as_str()))
            .map(|i| i as usize)
    }
}

impl IntoIterator for StateDict<'_> {
    type Item = Selected;
    type IntoIter = std::vec::IntoIter<Selected>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'s> IntoIterator for &'s StateDict<'_> {
    type Item = &'s Selected;
    type IntoIter = std::slice::Iter<'s, Selected>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

impl Deref for StateDict<'_> {
    type Target = [Selected];

    fn deref(&self) -> &[Selected] {
        &self.entries
    }
}

/// The top-level entry a flattened name lies under.
fn top(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}
