//! The other half of what users write around `torch.load`: pick the model
//! out of a training checkpoint, strip wrapper prefixes, rename keys.

use std::hash::BuildHasher;
use std::ops::Deref;

use hashbrown::HashTable;

use crate::advice::{Hint, Neutral, Setting, Terms};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, ErrorKind, Result};
use crate::glob::{glob, glob_captures};
use crate::parallel::{Shard, Slice, Splits};
use crate::set::{CheckpointSet, SetFile};
use crate::torch::tensor::TensorInfo;
use crate::view::TensorView;

/// Top-level keys that hold the model in training checkpoints, in the order
/// [`KeySelect::Auto`] tries them.
pub const MODEL_KEYS: &[&str] = &[
    "state_dict",
    "model_state_dict",
    "model",
    "module",
    "net",
    "network",
    "ema",
    "model_ema",
    "state_dict_ema",
];

/// Top-level entries of training checkpoints that hold tensors but are not
/// the model: optimizer and scheduler state, mixed-precision scalers,
/// random-number generator states, Lightning's loops and callbacks (a
/// `ModelCheckpoint` callback keeps `best_model_score` as a tensor).
pub const TRAINING_STATE: &[&str] = &[
    "optimizer",
    "optimizer_state_dict",
    "optimizer_states",
    "optimizers",
    "optim",
    "scheduler",
    "scheduler_state_dict",
    "lr_scheduler",
    "lr_schedulers",
    "scaler",
    "scaler_state_dict",
    "grad_scaler",
    "amp",
    "rng",
    "rng_state",
    "rng_states",
    "torch_rng_state",
    "cuda_rng_state",
    "cuda_rng_states",
    "numpy_rng_state",
    "random_state",
    "callbacks",
    "loops",
    "metrics",
    "best_model_score",
];

/// Which part of the checkpoint is the state dict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeySelect {
    /// The whole checkpoint.
    All,
    /// If the checkpoint is a training checkpoint (its top level holds one
    /// of [`MODEL_KEYS`] next to plain values or optimizer-like state), that
    /// key's sub-tree; otherwise the whole checkpoint.
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
    /// rules split (rules match final names); see [`crate::parallel`].
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
    /// Indices into `entries`, hashed by their name with `hasher`.
    index: HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
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

    /// The entries at `positions` (indices into this state dict's
    /// entries), as a state dict of their own.
    pub fn subset(&self, positions: &[usize]) -> StateDict<'c> {
        let entries: Vec<Selected> = positions
            .iter()
            .filter_map(|&p| self.entries.get(p).cloned())
            .collect();
        let hasher = self.hasher.clone();
        let mut index: HashTable<u32> = HashTable::with_capacity(entries.len());
        for (pos, e) in entries.iter().enumerate() {
            let hash = hasher.hash_one(e.name.as_str());
            // Names are unique in `self`, so in any subset of it.
            index.insert_unique(hash, pos as u32, |&i| {
                hasher.hash_one(entries.get(i as usize).map_or("", |x| x.name.as_str()))
            });
        }
        StateDict {
            ckpt: self.ckpt,
            files: self.files.clone(),
            key: self.key.clone(),
            decisions: self.decisions.clone(),
            entries,
            index,
            hasher,
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
        let hash = self.hasher.hash_one(name);
        let entries = &self.entries;
        self.index
            .find(hash, |&i| {
                entries.get(i as usize).is_some_and(|e| e.name == name)
            })
            .map(|&i| i as usize)
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

fn top(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

/// What [`KeySelect::Auto`] decided for a checkpoint, and why, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AutoKey {
    /// The key whose sub-tree is the model; `None`: the whole file.
    pub key: Option<&'static str>,
    /// The model key the file has, taken or not; `None` for a plain state
    /// dict (nothing to decide).
    pub candidate: Option<&'static str>,
    /// Why, for the user: what else the file holds, or why it could not
    /// decide (the [`decision`](Self::decision)'s reason, in the reader's
    /// words).
    pub why: String,
    /// The decision to report; `None` for a plain state dict.
    pub decision: Option<Decision>,
}

/// What a selection decided, as data: each front end words it in its own
/// terms ([`Decision::render`]); `Display` gives the reader's words.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// [`KeySelect::Auto`] took the sub-tree under `key`: a training
    /// checkpoint's model.
    KeyChosen {
        /// The key taken.
        key: String,
        /// The other top-level entries (training state, plain values).
        beside: Vec<String>,
        /// Other model keys the file has, not taken.
        other_models: Vec<String>,
    },
    /// [`KeySelect::Auto`] kept the whole file although it has a model key.
    WholeFile {
        /// The model key the file has.
        candidate: String,
        /// Top-level entries holding tensors that are not training state;
        /// empty when every tensor is under `candidate` and nothing else
        /// is saved (the key is part of the names).
        foreign: Vec<String>,
    },
    /// Taking `key` left out the tensors outside it: how many per
    /// top-level group.
    GroupsLeftOut {
        /// The key taken.
        key: String,
        /// `(group, tensors)`, in file order.
        groups: Vec<(String, usize)>,
    },
    /// Include/exclude patterns left out this many tensors.
    Filtered {
        /// How many.
        left_out: usize,
    },
    /// [`Strip::Auto`] removed `prefix` from every name.
    PrefixStripped {
        /// The prefix removed.
        prefix: String,
    },
    /// A decision about one file of a set.
    InFile {
        /// The file's name in the set.
        file: String,
        /// What was decided for it.
        decision: Box<Decision>,
    },
}

impl Decision {
    /// The decision itself, without the file of a set it concerns.
    pub fn inner(&self) -> &Decision {
        let mut d = self;
        while let Decision::InFile { decision, .. } = d {
            d = decision;
        }
        d
    }

    /// Whether an automatic option ([`KeySelect::Auto`], [`Strip::Auto`])
    /// made this decision, rather than an explicit key or pattern.
    pub fn is_automatic(&self) -> bool {
        matches!(
            self.inner(),
            Decision::KeyChosen { .. }
                | Decision::WholeFile { .. }
                | Decision::PrefixStripped { .. }
        )
    }

    /// The hint the decision carries (the key to pass to take only the
    /// model the file has).
    pub fn hint(&self) -> Option<Hint> {
        match self.inner() {
            Decision::KeyChosen { other_models, .. } if !other_models.is_empty() => {
                Some(Hint::PassKey(None))
            }
            Decision::WholeFile { candidate, foreign } if !foreign.is_empty() => {
                Some(Hint::PassKey(Some(candidate.clone())))
            }
            _ => None,
        }
    }

    /// The reason [`KeySelect::Auto`] gave, without naming the setting.
    fn why(&self, terms: &dyn Terms) -> String {
        let hint = self.hint().map(|h| h.clause(terms)).unwrap_or_default();
        match self.inner() {
            Decision::KeyChosen {
                key,
                beside,
                other_models,
            } => {
                let mut why = format!(
                    "{key:?}: a training checkpoint's model (beside it: {})",
                    some_of(beside)
                );
                if !other_models.is_empty() {
                    why.push_str(&format!(
                        "; {} also hold{} a model{hint}",
                        other_models.join(", "),
                        if other_models.len() == 1 { "s" } else { "" }
                    ));
                }
                why
            }
            Decision::WholeFile { candidate, foreign } if foreign.is_empty() => format!(
                "the whole file: every tensor is under {candidate:?} and nothing else is saved, \
                 so {candidate:?} is part of the names"
            ),
            Decision::WholeFile { candidate, foreign } => format!(
                "the whole file: {candidate:?} holds tensors, but so does {}, which is not \
                 training state{hint}",
                some_of(foreign)
            ),
            other => other.render(terms),
        }
    }

    /// The decision in `terms`: a front end's words for its settings and
    /// hints in the reader's sentence.
    pub fn render(&self, terms: &dyn Terms) -> String {
        match self {
            Decision::KeyChosen { .. } | Decision::WholeFile { .. } => {
                format!("{} auto: {}", terms.setting(Setting::Key), self.why(terms))
            }
            Decision::GroupsLeftOut { key, groups } => {
                let left: usize = groups.iter().map(|(_, n)| n).sum();
                let groups: Vec<String> = groups.iter().map(|(g, n)| format!("{g}: {n}")).collect();
                format!(
                    "left out {left} tensor{} outside {key:?} ({})",
                    if left == 1 { "" } else { "s" },
                    some_of(&groups)
                )
            }
            Decision::Filtered { left_out } => format!(
                "left out {left_out} tensor{} by name (include/exclude)",
                if *left_out == 1 { "" } else { "s" }
            ),
            Decision::PrefixStripped { prefix } => format!(
                "{} auto: removed {prefix:?} from every name",
                terms.setting(Setting::StripPrefix)
            ),
            Decision::InFile { file, decision } => format!("{file}: {}", decision.render(terms)),
        }
    }
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render(&Neutral))
    }
}

/// Up to three items, then how many more.
fn some_of<S: AsRef<str>>(items: &[S]) -> String {
    let shown: Vec<&str> = items.iter().take(3).map(AsRef::as_ref).collect();
    match items.len().saturating_sub(3) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

/// What [`KeySelect::Auto`] picks for `ckpt`: the model of a training
/// checkpoint (the first of [`MODEL_KEYS`] holding tensors, when every
/// other top-level entry holding tensors is training state, see
/// [`TRAINING_STATE`]), or the whole file, with the reason either way.
pub fn auto_key(ckpt: &Checkpoint) -> AutoKey {
    auto_key_of(&[ckpt])
}

/// [`auto_key`] over the files of a set together.
fn auto_key_of(files: &[&Checkpoint]) -> AutoKey {
    let names = || files.iter().flat_map(|c| c.tensors().map(|t| t.name()));
    // Top-level entries holding tensors, in file order, each once.
    let mut tops: Vec<&str> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for name in names() {
        let top = top(name);
        if seen.insert(top) {
            tops.push(top);
        }
    }
    let is_model_tree =
        |key: &str| names().any(|n| n.strip_prefix(key).is_some_and(|r| r.starts_with('.')));
    let models: Vec<&'static str> = MODEL_KEYS
        .iter()
        .copied()
        .filter(|k| seen.contains(k) && is_model_tree(k))
        .collect();
    let Some(&pick) = models.first() else {
        return AutoKey {
            key: None,
            candidate: None,
            why: format!(
                "the whole file: no training-checkpoint key ({}) holds the tensors",
                some_of(MODEL_KEYS)
            ),
            decision: None,
        };
    };
    let owned = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let others: Vec<&str> = tops.iter().copied().filter(|t| *t != pick).collect();
    let foreign: Vec<&str> = others
        .iter()
        .copied()
        .filter(|t| !TRAINING_STATE.contains(t) && !MODEL_KEYS.contains(t))
        .collect();
    if !foreign.is_empty() {
        return AutoKey::decided(
            None,
            pick,
            Decision::WholeFile {
                candidate: pick.to_owned(),
                foreign: owned(&foreign),
            },
        );
    }
    // Top-level entries holding only plain values (epoch, args, ...).
    let mut plain: Vec<&str> = Vec::new();
    let mut plain_seen = std::collections::HashSet::new();
    for (name, _) in files.iter().flat_map(|c| c.values()) {
        let top = top(name);
        if !seen.contains(top) && plain_seen.insert(top) {
            plain.push(top);
        }
    }
    if others.is_empty() && plain.is_empty() {
        return AutoKey::decided(
            None,
            pick,
            Decision::WholeFile {
                candidate: pick.to_owned(),
                foreign: Vec::new(),
            },
        );
    }
    let beside: Vec<&str> = others.iter().chain(&plain).copied().collect();
    AutoKey::decided(
        Some(pick),
        pick,
        Decision::KeyChosen {
            key: pick.to_owned(),
            beside: owned(&beside),
            other_models: owned(models.get(1..).unwrap_or_default()),
        },
    )
}

impl AutoKey {
    fn decided(key: Option<&'static str>, candidate: &'static str, decision: Decision) -> AutoKey {
        AutoKey {
            key,
            candidate: Some(candidate),
            why: decision.why(&Neutral),
            decision: Some(decision),
        }
    }
}

/// `name` without the key's path, when it lies under it (`None` key: the
/// whole name).
fn under_key<'n>(name: &'n str, key: Option<&str>) -> Option<&'n str> {
    match key {
        None => Some(name),
        Some(k) if name == k => Some(""),
        Some(k) => name.strip_prefix(k).and_then(|r| r.strip_prefix('.')),
    }
}

fn strip_auto(names: &mut [String]) {
    loop {
        let stripped = ["module.", "_orig_mod."]
            .into_iter()
            .find(|p| names.iter().all(|n| n.starts_with(p)));
        let Some(prefix) = stripped else { return };
        if names.is_empty() {
            return;
        }
        for n in names.iter_mut() {
            n.replace_range(..prefix.len(), "");
        }
    }
}

fn rename(name: &str, from: &str, to: &str) -> Result<Option<String>> {
    let Some(captures) = glob_captures(from, name) else {
        return Ok(None);
    };
    let stars = to.matches('*').count();
    if stars > captures.len() {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "rename {from}={to}: the target has {stars} '*' but the pattern only {}",
                captures.len()
            ),
        ));
    }
    let mut out = String::with_capacity(to.len() + name.len());
    let mut pieces = to.split('*');
    out.push_str(pieces.next().unwrap_or(""));
    // As many captures as stars (checked above).
    for (piece, capture) in pieces.zip(&captures) {
        out.push_str(capture);
        out.push_str(piece);
    }
    Ok(Some(out))
}

impl StateDictOptions {
    /// The tensors of the state dict, with their new names, in checkpoint
    /// order. Two tensors that would get the same name are an error naming
    /// both.
    pub fn select<'c>(&self, ckpt: &'c Checkpoint) -> Result<StateDict<'c>> {
        let mut decisions = Vec::new();
        let key = match &self.key {
            KeySelect::All => None,
            KeySelect::Auto => {
                let auto = auto_key(ckpt);
                // A plain state dict: nothing was decided.
                decisions.extend(auto.decision);
                auto.key.map(str::to_owned)
            }
            KeySelect::Path(p) => Some(p.trim_end_matches('.').to_owned()),
        };
        let mut indices = Vec::new();
        let mut names = Vec::new();
        for (i, t) in ckpt.tensors().enumerate() {
            let name = match &key {
                None => Some(t.name()),
                Some(k) if t.name() == k => Some(""),
                Some(k) => t
                    .name()
                    .strip_prefix(k.as_str())
                    .and_then(|r| r.strip_prefix('.')),
            };
            if let Some(name) = name {
                indices.push(i);
                names.push(name.to_owned());
            }
        }
        if let (Some(k), true) = (&key, indices.is_empty()) {
            let mut tops: Vec<&str> = ckpt.tensors().map(|t| top(t.name())).collect();
            tops.dedup();
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "no tensors under key {k:?}; top-level keys with tensors: {}",
                    tops.join(", ")
                ),
            ));
        }
        if let Some(k) = &key {
            let left = ckpt.len().saturating_sub(indices.len());
            if left > 0 {
                let mut groups: Vec<(&str, usize)> = Vec::new();
                for (i, t) in ckpt.tensors().enumerate() {
                    if indices.binary_search(&i).is_err() {
                        let top = top(t.name());
                        match groups.iter_mut().find(|(g, _)| *g == top) {
                            Some((_, n)) => *n += 1,
                            None => groups.push((top, 1)),
                        }
                    }
                }
                decisions.push(Decision::GroupsLeftOut {
                    key: k.clone(),
                    groups: groups.into_iter().map(|(g, n)| (g.to_owned(), n)).collect(),
                });
            }
        }
        match &self.strip {
            Strip::None => {}
            Strip::Auto => {
                let before = names.first().cloned();
                strip_auto(&mut names);
                if let (Some(before), Some(after)) = (before, names.first()) {
                    if let Some(prefix) = before.strip_suffix(after.as_str()) {
                        if !prefix.is_empty() {
                            decisions.push(Decision::PrefixStripped {
                                prefix: prefix.to_owned(),
                            });
                        }
                    }
                }
            }
            Strip::Prefix(p) => {
                for n in &mut names {
                    if n.starts_with(p.as_str()) {
                        n.replace_range(..p.len(), "");
                    }
                }
            }
        }
        for n in &mut names {
            for (from, to) in &self.renames {
                if let Some(new) = rename(n, from, to)? {
                    *n = new;
                    break;
                }
            }
            if let Some(prefix) = &self.add_prefix {
                n.insert_str(0, prefix);
            }
        }
        if !self.include.is_empty() || !self.exclude.is_empty() {
            let keep = |n: &str| {
                (self.include.is_empty() || self.include.iter().any(|g| glob(g, n)))
                    && !self.exclude.iter().any(|g| glob(g, n))
            };
            let before = names.len();
            let (mut kept_indices, mut kept_names) = (Vec::new(), Vec::new());
            for (i, n) in indices.into_iter().zip(names) {
                if keep(&n) {
                    kept_indices.push(i);
                    kept_names.push(n);
                }
            }
            indices = kept_indices;
            names = kept_names;
            let dropped = before - names.len();
            if dropped > 0 {
                decisions.push(Decision::Filtered { left_out: dropped });
            }
        }
        let hasher = hashbrown::DefaultHashBuilder::default();
        let mut index: HashTable<u32> = HashTable::with_capacity(names.len());
        for (pos, n) in names.iter().enumerate() {
            let hash = hasher.hash_one(n.as_str());
            let same = |&i: &u32| names.get(i as usize) == Some(n);
            if let Some(&first) = index.find(hash, same) {
                let original = |p: usize| {
                    indices
                        .get(p)
                        .and_then(|&i| ckpt.tensor_at(i))
                        .map_or("?", |t| t.name())
                };
                return Err(Error::new(
                    ErrorKind::DuplicateName,
                    format!(
                        "keys {:?} and {:?} would both become {n:?}",
                        original(first as usize),
                        original(pos)
                    ),
                ));
            }
            let pos =
                u32::try_from(pos).map_err(|_| Error::limit("max_tensors", u64::from(u32::MAX)))?;
            index.insert_unique(hash, pos, |&i| {
                hasher.hash_one(names.get(i as usize).map_or("", String::as_str))
            });
        }
        let mut entries: Vec<Selected> = indices
            .into_iter()
            .zip(names)
            .map(|(index, name)| Selected::new(index, name))
            .collect();
        if let Some((shard, splits)) = &self.parallel {
            ckpt.advise_scattered();
            for e in &mut entries {
                let Some(view) = ckpt.tensor_at(e.index) else {
                    continue;
                };
                if let Some((slice, info)) = splits.slice(&e.name, view.info(), *shard)? {
                    e.slice = Some(slice);
                    e.sliced = Some(Box::new(info));
                }
            }
        }
        Ok(StateDict {
            ckpt,
            files: vec![ckpt],
            key,
            decisions,
            entries,
            index,
            hasher,
        })
    }

    /// The state dict of a whole set: each file selected with these
    /// options, the entries of all files together. A final name in two
    /// files is an error naming both.
    pub fn select_set<'c>(&self, set: &'c CheckpointSet) -> Result<StateDict<'c>> {
        let files: Vec<&'c Checkpoint> = set.files().iter().map(|f| &**f.checkpoint()).collect();
        let Some(&first) = files.first() else {
            return Err(Error::new(ErrorKind::InvalidSpec, "a set of no files"));
        };
        let mut entries: Vec<Selected> = Vec::with_capacity(set.len());
        let mut decisions: Vec<Decision> = Vec::new();
        let mut key = None;
        // The automatic options decide once, for the set as a whole.
        let mut per_file = self.clone();
        let several = files.len() > 1;
        if several && self.key == KeySelect::Auto {
            let auto = auto_key_of(&files);
            decisions.extend(auto.decision);
            per_file.key = auto
                .key
                .map_or(KeySelect::All, |k| KeySelect::Path(k.to_owned()));
        }
        let key_path = match &per_file.key {
            KeySelect::Path(p) => Some(p.trim_end_matches('.').to_owned()),
            _ => None,
        };
        if several && self.strip == Strip::Auto {
            let mut names: Vec<String> = files
                .iter()
                .flat_map(|c| c.tensors())
                .filter_map(|t| under_key(t.name(), key_path.as_deref()).map(str::to_owned))
                .collect();
            let before = names.first().cloned();
            strip_auto(&mut names);
            let prefix = match (before, names.first()) {
                (Some(b), Some(a)) => b.strip_suffix(a.as_str()).map(str::to_owned),
                _ => None,
            }
            .unwrap_or_default();
            if prefix.is_empty() {
                per_file.strip = Strip::None;
            } else {
                decisions.push(Decision::PrefixStripped {
                    prefix: prefix.clone(),
                });
                per_file.strip = Strip::Prefix(prefix);
            }
        }
        for (f, ckpt) in files.iter().enumerate() {
            let name = || set.files().get(f).map(SetFile::name).unwrap_or_default();
            // A file of a set with nothing under the key adds nothing (the
            // set as a whole must have something there).
            let lacks_key = key_path.as_deref().is_some_and(|k| {
                !ckpt
                    .tensors()
                    .any(|t| under_key(t.name(), Some(k)).is_some())
            });
            if several && lacks_key {
                continue;
            }
            let sd = per_file.select(ckpt).map_err(|e| e.in_file(&name()))?;
            for d in sd.decisions {
                let d = if several {
                    Decision::InFile {
                        file: name().to_owned(),
                        decision: Box::new(d),
                    }
                } else {
                    d
                };
                decisions.push(d);
            }
            key = key.or(sd.key);
            entries.extend(sd.entries.into_iter().map(|mut e| {
                e.file = f;
                e
            }));
        }
        if let (Some(k), true, true) = (&key_path, several, entries.is_empty()) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("no tensors under key {k:?} in any file of the set"),
            ));
        }
        let hasher = hashbrown::DefaultHashBuilder::default();
        let mut index: HashTable<u32> = HashTable::with_capacity(entries.len());
        for (pos, e) in entries.iter().enumerate() {
            let hash = hasher.hash_one(e.name.as_str());
            let same = |&i: &u32| entries.get(i as usize).is_some_and(|o| o.name == e.name);
            if let Some(&first) = index.find(hash, same) {
                let file = |p: usize| {
                    entries
                        .get(p)
                        .and_then(|x| set.files().get(x.file))
                        .map(SetFile::name)
                        .unwrap_or_default()
                };
                return Err(Error::new(
                    ErrorKind::DuplicateName,
                    format!(
                        "the state dict holds it twice: from {} and from {}",
                        file(first as usize),
                        file(pos)
                    ),
                )
                .for_tensor(&e.name));
            }
            let pos =
                u32::try_from(pos).map_err(|_| Error::limit("max_tensors", u64::from(u32::MAX)))?;
            index.insert_unique(hash, pos, |&i| {
                hasher.hash_one(entries.get(i as usize).map_or("", |x| x.name.as_str()))
            });
        }
        Ok(StateDict {
            ckpt: first,
            files,
            key,
            decisions,
            entries,
            index,
            hasher,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames() {
        assert_eq!(
            rename("encoder.layers.0.w", "encoder.*", "enc.*")
                .ok()
                .flatten()
                .as_deref(),
            Some("enc.layers.0.w")
        );
        assert_eq!(
            rename("decoder.w", "encoder.*", "enc.*").ok().flatten(),
            None
        );
        assert_eq!(
            rename("a.b.c", "*.*", "*/*").ok().flatten().as_deref(),
            Some("a/b.c")
        );
        assert!(rename("a.b", "a.*", "*.*").is_err());
    }

    #[test]
    fn strips_nested_wrappers() {
        let mut names = vec![
            "_orig_mod.module.a".to_owned(),
            "_orig_mod.module.b".to_owned(),
        ];
        strip_auto(&mut names);
        assert_eq!(names, ["a", "b"]);
        let mut mixed = vec!["module.a".to_owned(), "b".to_owned()];
        strip_auto(&mut mixed);
        assert_eq!(mixed, ["module.a", "b"]);
    }
}
