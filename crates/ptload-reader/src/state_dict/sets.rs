//! [`StateDictOptions::select_set`]: the state dict of the files of a set
//! together, the automatic options deciding once for the whole set.

use super::select::{strip_auto, stripped_prefix, under_key};
use super::{Decision, KeySelect, Selected, StateDict, StateDictOptions, Strip};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, ErrorKind, Result};
use crate::name_index::NameIndex;
use crate::set::{CheckpointSet, SetFile};

impl StateDictOptions {
    /// The state dict of a whole set: each file selected with these
    /// options, the entries of all files together. A final name in two
    /// files is an error naming both.
    pub fn select_set<'c>(&self, set: &'c CheckpointSet) -> Result<StateDict<'c>> {
        let files: Vec<&'c Checkpoint> = set.files().iter().map(|f| &**f.checkpoint()).collect();
        let Some(&first) = files.first() else {
            return Err(Error::new(ErrorKind::InvalidSpec, "a set of no files"));
        };
        let several = files.len() > 1;
        let mut decisions: Vec<Decision> = Vec::new();
        // The automatic options decide once, for the set as a whole.
        let per_file = if several {
            self.for_each_file(&files, &mut decisions)
        } else {
            self.clone()
        };
        let key_path = match &per_file.key {
            KeySelect::Path(p) => Some(p.trim_end_matches('.').to_owned()),
            _ => None,
        };
        let file_name = |f: usize| set.files().get(f).map_or_else(String::new, SetFile::name);
        let mut entries: Vec<Selected> = Vec::with_capacity(set.len());
        let mut key = None;
        for (f, ckpt) in files.iter().enumerate() {
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
            let sd = per_file
                .select(ckpt)
                .map_err(|e| e.in_file(&file_name(f)))?;
            decisions.extend(sd.decisions.into_iter().map(|d| match several {
                true => Decision::InFile {
                    file: file_name(f),
                    decision: Box::new(d),
                },
                false => d,
            }));
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
        let index = index_entries(set, &entries)?;
        Ok(StateDict {
            ckpt: first,
            files,
            key,
            decisions,
            entries,
            index,
        })
    }

    /// The options each file of a set is selected with: the key and the
    /// prefix [`KeySelect::Auto`] and [`Strip::Auto`] chose for all the
    /// files together, with their decisions.
    fn for_each_file(&self, files: &[&Checkpoint], decisions: &mut Vec<Decision>) -> Self {
        let mut per_file = self.clone();
        if self.key == KeySelect::Auto {
            let auto = super::auto::auto_key_of(files);
            decisions.extend(auto.decision);
            per_file.key = auto
                .key
                .map_or(KeySelect::All, |k| KeySelect::Path(k.to_owned()));
        }
        if self.strip == Strip::Auto {
            let key_path = match &per_file.key {
                KeySelect::Path(p) => Some(p.trim_end_matches('.')),
                _ => None,
            };
            let mut names: Vec<String> = files
                .iter()
                .flat_map(|c| c.tensors())
                .filter_map(|t| under_key(t.name(), key_path).map(str::to_owned))
                .collect();
            let before = names.first().cloned();
            strip_auto(&mut names);
            per_file.strip = match stripped_prefix(before.as_ref(), names.first()) {
                Some(prefix) => {
                    decisions.push(Decision::PrefixStripped {
                        prefix: prefix.clone(),
                    });
                    Strip::Prefix(prefix)
                }
                None => Strip::None,
            };
        }
        per_file
    }
}

/// The index of the set's final names; one name in two files is an error
/// naming both files.
fn index_entries(set: &CheckpointSet, entries: &[Selected]) -> Result<NameIndex> {
    let mut index = NameIndex::with_capacity(entries.len());
    for (pos, e) in entries.iter().enumerate() {
        let at =
            u32::try_from(pos).map_err(|_| Error::limit("max_tensors", u64::from(u32::MAX)))?;
        let name_of = |i: u32| entries.get(i as usize).map(|x| x.name.as_str());
        if let Err(first) = index.insert(&e.name, at, name_of) {
            let file = |p: usize| {
                entries
                    .get(p)
                    .and_then(|x| set.files().get(x.file))
                    .map_or_else(String::new, SetFile::name)
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
    }
    Ok(index)
}
