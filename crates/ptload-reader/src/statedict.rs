//! The other half of what users write around `torch.load`: pick the model
//! out of a training checkpoint, strip wrapper prefixes, rename keys.

use std::collections::HashMap;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, ErrorKind, Result};
use crate::mapping::glob_captures;

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

/// Top-level groups of training state that are not the model.
const TRAINING_STATE: &[&str] = &[
    "optimizer",
    "optimizer_state_dict",
    "optimizer_states",
    "optim",
    "scheduler",
    "lr_scheduler",
    "lr_schedulers",
    "scaler",
    "grad_scaler",
    "amp",
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
}

/// One tensor of the selected state dict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// Index into the checkpoint's tensors.
    pub index: usize,
    /// Its name in the state dict.
    pub name: String,
}

fn top(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

/// The key [`KeySelect::Auto`] picks for `ckpt`, if any.
pub fn auto_key(ckpt: &Checkpoint) -> Option<&'static str> {
    let tensor_tops: Vec<&str> = ckpt
        .tensors()
        .filter(|t| t.name().contains('.'))
        .map(|t| top(t.name()))
        .collect();
    if ckpt.tensors().any(|t| !t.name().contains('.')) {
        return None;
    }
    let has_plain_values = !ckpt.values().is_empty();
    MODEL_KEYS.iter().copied().find(|key| {
        tensor_tops.contains(key)
            && tensor_tops
                .iter()
                .all(|t| t == key || TRAINING_STATE.contains(t) || MODEL_KEYS.contains(t))
            && (has_plain_values || tensor_tops.iter().any(|t| t != key))
    })
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
    let mut caps = captures.iter();
    for (i, piece) in to.split('*').enumerate() {
        if i > 0 {
            out.push_str(caps.next().copied().unwrap_or_default());
        }
        out.push_str(piece);
    }
    Ok(Some(out))
}

impl StateDictOptions {
    /// The tensors of the state dict, with their new names, in checkpoint
    /// order. Two tensors that would get the same name are an error naming
    /// both.
    pub fn select(&self, ckpt: &Checkpoint) -> Result<Vec<Selected>> {
        let key = match &self.key {
            KeySelect::All => None,
            KeySelect::Auto => auto_key(ckpt).map(str::to_owned),
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
        match &self.strip {
            Strip::None => {}
            Strip::Auto => strip_auto(&mut names),
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
        let mut seen: HashMap<&str, usize> = HashMap::with_capacity(names.len());
        for (pos, n) in names.iter().enumerate() {
            if let Some(&first) = seen.get(n.as_str()) {
                let original = |p: usize| {
                    indices
                        .get(p)
                        .and_then(|&i| ckpt.tensors().nth(i))
                        .map(|t| t.name().to_owned())
                        .unwrap_or_default()
                };
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "keys {:?} and {:?} would both become {n:?}",
                        original(first),
                        original(pos)
                    ),
                ));
            }
            seen.insert(n, pos);
        }
        Ok(indices
            .into_iter()
            .zip(names)
            .map(|(index, name)| Selected { index, name })
            .collect())
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
