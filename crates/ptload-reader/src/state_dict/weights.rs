//! A selected state dict that owns its checkpoints: what an engine keeps
//! for the model's lifetime.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Decision, Selected, StateDictOptions};
use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::set::CheckpointSet;
use crate::view::TensorView;

/// The tensors a [`StateDictOptions`] selects, owning the checkpoints
/// they are read from: views borrow the `Weights` alone (not the caller's
/// checkpoint or a selection), so an engine's model struct can hold it and
/// read its tensors for as long as it lives, rank slices included. It is
/// `Send + Sync` and cheap to share behind an `Arc`.
///
/// ```
/// # fn main() -> Result<(), ptload_reader::Error> {
/// use std::sync::Arc;
/// use ptload_reader::state_dict::{StateDictOptions, Weights};
/// use ptload_reader::Checkpoint;
///
/// struct Linear {
///     weights: Weights,
/// }
///
/// impl Linear {
///     fn weight(&self) -> Result<&[f32], ptload_reader::Error> {
///         self.weights.get("0.weight").expect("saved").as_slice()
///     }
/// }
///
/// fn load(path: &str) -> Result<Linear, ptload_reader::Error> {
///     let ckpt = Arc::new(Checkpoint::open(path)?);
///     let weights = Weights::select(&StateDictOptions::default(), ckpt)?;
///     Ok(Linear { weights }) // the checkpoint lives on in `weights`
/// }
///
/// let model = load("../../fixtures/files/basic.pt")?;
/// assert_eq!(model.weight()?.len(), 8 * 4);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Weights {
    files: Vec<Arc<Checkpoint>>,
    entries: Vec<Selected>,
    by_name: HashMap<String, usize>,
    decisions: Vec<Decision>,
}

impl Weights {
    /// The tensors `opts` selects from `ckpt`.
    pub fn select(opts: &StateDictOptions, ckpt: Arc<Checkpoint>) -> Result<Weights> {
        let (entries, decisions) = {
            let sd = opts.select(&ckpt)?;
            (sd.iter().cloned().collect(), sd.decisions().to_vec())
        };
        Ok(Weights::of(vec![ckpt], entries, decisions))
    }

    /// The tensors `opts` selects from the files of `set`, each file's
    /// checkpoint shared with the set.
    pub fn select_set(opts: &StateDictOptions, set: &CheckpointSet) -> Result<Weights> {
        let sd = opts.select_set(set)?;
        let entries = sd.iter().cloned().collect();
        let decisions = sd.decisions().to_vec();
        let files = set.files().iter().map(|f| f.checkpoint().clone()).collect();
        Ok(Weights::of(files, entries, decisions))
    }

    fn of(
        files: Vec<Arc<Checkpoint>>,
        entries: Vec<Selected>,
        decisions: Vec<Decision>,
    ) -> Weights {
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), i))
            .collect();
        Weights {
            files,
            entries,
            by_name,
            decisions,
        }
    }

    /// The tensor selected as `name` (a rank's part when it is sliced).
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let entry = self.entries.get(*self.by_name.get(name)?)?;
        self.view(entry)
    }

    fn view<'s>(&'s self, entry: &'s Selected) -> Option<TensorView<'s>> {
        entry.view(self.files.get(entry.file)?)
    }

    /// Each tensor with its name, in checkpoint order (file by file).
    pub fn iter(&self) -> impl Iterator<Item = (&str, TensorView<'_>)> + '_ {
        self.entries
            .iter()
            .filter_map(|e| Some((e.name.as_str(), self.view(e)?)))
    }

    /// The selected entries (names, indices, rank slices), in order.
    pub fn entries(&self) -> &[Selected] {
        &self.entries
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was selected.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What the selection decided (the key taken, the prefix stripped...).
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// The checkpoints read from, in file order.
    pub fn checkpoints(&self) -> &[Arc<Checkpoint>] {
        &self.files
    }
}
