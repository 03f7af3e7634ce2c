//! [`StateDictOptions::select`]: the state dict of one checkpoint, step
//! by step (key, stripping, renames and prefix, include/exclude, the
//! name index, a rank's slices).

use super::{top, Decision, KeySelect, Selected, StateDict, StateDictOptions, Strip};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, ErrorKind, Result};
use crate::glob::{glob, glob_captures};
use crate::name_index::NameIndex;

/// `name` without the key's path, when it lies under it (`None` key: the
/// whole name).
pub(super) fn under_key<'n>(name: &'n str, key: Option<&str>) -> Option<&'n str> {
    match key {
        None => Some(name),
        Some(k) if name == k => Some(""),
        Some(k) => name.strip_prefix(k).and_then(|r| r.strip_prefix('.')),
    }
}

pub(super) fn strip_auto(names: &mut [String]) {
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
            ErrorKind::InvalidSpec,
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

/// The common start of the names, removed by [`strip_auto`] when it
/// removed anything.
pub(super) fn stripped_prefix(before: Option<&String>, after: Option<&String>) -> Option<String> {
    let prefix = before?.strip_suffix(after?.as_str())?;
    (!prefix.is_empty()).then(|| prefix.to_owned())
}

impl StateDictOptions {
    /// The tensors of the state dict, with their new names, in checkpoint
    /// order. Two tensors that would get the same name are an error naming
    /// both.
    pub fn select<'c>(&self, ckpt: &'c Checkpoint) -> Result<StateDict<'c>> {
        let mut decisions = Vec::new();
        let key = self.key_path(ckpt, &mut decisions);
        let (mut indices, mut names) = under(ckpt, key.as_deref())?;
        if let Some(k) = &key {
            decisions.extend(left_out(ckpt, k, &indices));
        }
        self.strip_names(&mut names, &mut decisions);
        self.rename_all(&mut names)?;
        if let Some(d) = self.filter(&mut indices, &mut names) {
            decisions.push(d);
        }
        let index = index_names(ckpt, &indices, &names)?;
        let mut entries: Vec<Selected> = indices
            .into_iter()
            .zip(names)
            .map(|(index, name)| Selected::new(index, name))
            .collect();
        self.slice_for_rank(ckpt, &mut entries)?;
        Ok(StateDict {
            ckpt,
            files: vec![ckpt],
            key,
            decisions,
            entries,
            index,
        })
    }

    /// The dotted path of the sub-tree to take (`None`: the whole file),
    /// with what [`KeySelect::Auto`] decided.
    fn key_path(&self, ckpt: &Checkpoint, decisions: &mut Vec<Decision>) -> Option<String> {
        match &self.key {
            KeySelect::All => None,
            KeySelect::Auto => {
                let auto = super::auto_key(ckpt);
                // A plain state dict: nothing was decided.
                decisions.extend(auto.decision);
                auto.key.map(str::to_owned)
            }
            KeySelect::Path(p) => Some(p.trim_end_matches('.').to_owned()),
        }
    }

    /// The stripping asked for, with what [`Strip::Auto`] removed.
    fn strip_names(&self, names: &mut [String], decisions: &mut Vec<Decision>) {
        match &self.strip {
            Strip::None => {}
            Strip::Auto => {
                let before = names.first().cloned();
                strip_auto(names);
                if let Some(prefix) = stripped_prefix(before.as_ref(), names.first()) {
                    decisions.push(Decision::PrefixStripped { prefix });
                }
            }
            Strip::Prefix(p) => {
                for n in names.iter_mut() {
                    if n.starts_with(p.as_str()) {
                        n.replace_range(..p.len(), "");
                    }
                }
            }
        }
    }

    /// The first matching rename of each name, then the added prefix.
    fn rename_all(&self, names: &mut [String]) -> Result<()> {
        for n in names.iter_mut() {
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
        Ok(())
    }

    /// Keep what the include and exclude patterns keep; how many they
    /// left out, when any.
    fn filter(&self, indices: &mut Vec<usize>, names: &mut Vec<String>) -> Option<Decision> {
        if self.include.is_empty() && self.exclude.is_empty() {
            return None;
        }
        let keep = |n: &str| {
            (self.include.is_empty() || self.include.iter().any(|g| glob(g, n)))
                && !self.exclude.iter().any(|g| glob(g, n))
        };
        let before = names.len();
        let (mut kept_indices, mut kept_names) = (Vec::new(), Vec::new());
        for (i, n) in indices.drain(..).zip(names.drain(..)) {
            if keep(&n) {
                kept_indices.push(i);
                kept_names.push(n);
            }
        }
        *indices = kept_indices;
        *names = kept_names;
        let left_out = before - names.len();
        (left_out > 0).then_some(Decision::Filtered { left_out })
    }

    /// A tensor-parallel rank's part of each tensor the rules split.
    fn slice_for_rank(&self, ckpt: &Checkpoint, entries: &mut [Selected]) -> Result<()> {
        let Some((shard, splits)) = &self.parallel else {
            return Ok(());
        };
        // A share of more than one rank with nothing to cut would give
        // every rank every whole tensor, silently.
        if shard.world > 1 && splits.rules().is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidSpec,
                format!(
                    "rank {} of {} takes a share of nothing: no rule splits a tensor",
                    shard.rank, shard.world
                ),
            )
            .with_hint(crate::advice::Hint::SplitRules));
        }
        ckpt.advise_scattered();
        for e in entries.iter_mut() {
            let Some(view) = ckpt.tensor_at(e.index) else {
                continue;
            };
            if let Some((slice, info)) = splits.slice(&e.name, view.info(), *shard)? {
                if let Some(storage) = info.storage {
                    ckpt.read_in_parts(storage);
                }
                e.slice = Some(slice);
                e.sliced = Some(Box::new(info));
            }
        }
        Ok(())
    }
}

/// The tensors under `key` (all without one): their indices and their
/// names below it. Nothing under a key is an error naming the top-level
/// keys that hold tensors.
fn under(ckpt: &Checkpoint, key: Option<&str>) -> Result<(Vec<usize>, Vec<String>)> {
    let mut indices = Vec::new();
    let mut names = Vec::new();
    for (i, t) in ckpt.tensors().enumerate() {
        if let Some(name) = under_key(t.name(), key) {
            indices.push(i);
            names.push(name.to_owned());
        }
    }
    if let (Some(k), true) = (key, indices.is_empty()) {
        let mut tops: Vec<&str> = ckpt.tensors().map(|t| top(t.name())).collect();
        tops.dedup();
        let mut text = format!(
            "no tensors under key {k:?}; top-level keys with tensors: {}",
            tops.join(", ")
        );
        // The key holds plain values only (Lightning's hyper_parameters),
        // or is not in the file: which keys hold plain values only.
        if ckpt
            .values()
            .iter()
            .any(|(n, _)| under_key(n, Some(k)).is_some())
        {
            text.push_str(&format!("; {k:?} holds plain values only"));
        } else {
            let mut seen: std::collections::HashSet<&str> = tops.iter().copied().collect();
            let mut plain: Vec<&str> = Vec::new();
            for (n, _) in ckpt.values() {
                let t = top(n);
                if seen.insert(t) {
                    plain.push(t);
                }
            }
            if !plain.is_empty() {
                text.push_str(&format!("; with plain values only: {}", plain.join(", ")));
            }
        }
        return Err(Error::new(ErrorKind::Unsupported, text));
    }
    Ok((indices, names))
}

/// The tensors outside `key` (those not in `kept`, sorted), counted by
/// top-level group, when there are any.
fn left_out(ckpt: &Checkpoint, key: &str, kept: &[usize]) -> Option<Decision> {
    if ckpt.len() <= kept.len() {
        return None;
    }
    let mut groups: Vec<(String, usize)> = Vec::new();
    for (i, t) in ckpt.tensors().enumerate() {
        if kept.binary_search(&i).is_err() {
            let top = top(t.name());
            match groups.iter_mut().find(|(g, _)| g == top) {
                Some((_, n)) => *n += 1,
                None => groups.push((top.to_owned(), 1)),
            }
        }
    }
    Some(Decision::GroupsLeftOut {
        key: key.to_owned(),
        groups,
    })
}

/// The index of the final names; two tensors of one name are an error
/// naming both.
fn index_names(ckpt: &Checkpoint, indices: &[usize], names: &[String]) -> Result<NameIndex> {
    let mut index = NameIndex::with_capacity(names.len());
    for (pos, n) in names.iter().enumerate() {
        let at =
            u32::try_from(pos).map_err(|_| Error::limit("max_tensors", u64::from(u32::MAX)))?;
        if let Err(first) = index.insert(n, at, |i| names.get(i as usize).map(String::as_str)) {
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
    }
    Ok(index)
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
