//! Advice and decisions as data: what the caller could do about an error
//! ([`Hint`]), and what the state-dict selection decided on its own
//! ([`Decision`](crate::state_dict::Decision)).
//!
//! The reader words them neutrally (their `Display`); a front end that has
//! words of its own for the same actions (a command's flags, a Python
//! function's keyword arguments) passes its [`Terms`] to `render` and gets
//! the same sentence with its own words in the hint's place. No front end
//! rewrites the reader's text.

/// Something the caller can do about an error or an automatic choice.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Hint {
    /// Allow these globals (`module.name`), each only if it is trusted:
    /// [`OpenOptions::allow_global`](crate::OpenOptions::allow_global).
    /// One name: that global; several: the file's whole list.
    AllowGlobals(Vec<String>),
    /// Select the sub-tree under this key
    /// ([`KeySelect::Path`](crate::state_dict::KeySelect::Path)); `None`:
    /// the option that does, without a value.
    PassKey(Option<String>),
    /// Raise [`Limits`](crate::Limits) field `limit`: `value` was exceeded.
    RaiseLimit {
        /// The field's name (`max_tensors`).
        limit: &'static str,
        /// Its value when it was exceeded.
        value: u64,
        /// A value that would do, when the reader knows it (the size of
        /// the record, the number of tensors); `None` when it stopped
        /// before it could know.
        needed: Option<u64>,
    },
    /// Place storages with a map location (torch's `map_location`, see
    /// [`placement::MapLocation`](crate::placement::MapLocation)): those
    /// tagged `from` (every storage when `None`) to `to` (`None`: the
    /// option, without a value).
    MapLocation {
        /// The storage location to map (`xla:0`), or every one.
        from: Option<String>,
        /// Where to (`cpu`).
        to: Option<String>,
    },
    /// Leave out the tensors the output format cannot hold
    /// ([`SafetensorsOptions::skip_unsupported`](crate::export::SafetensorsOptions)).
    SkipUnsupported,
    /// Read rank files of a sharded model as one state dict by saying how
    /// each tensor was cut among the ranks
    /// ([`CheckpointSet::open_rank_parts`](crate::set::CheckpointSet::open_rank_parts)).
    RankFiles,
    /// Say which tensors a rank's share cuts, along which dimension
    /// ([`Splits`](crate::tp::Splits): rules, or a preset).
    SplitRules,
}

/// An option of the state-dict selection that a decision names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Setting {
    /// The key (sub-tree) to take.
    Key,
    /// The prefix to strip.
    StripPrefix,
}

/// A front end's words for hints and settings. The phrase of each
/// [`Hint`] fills a fixed place in the reader's sentence:
///
/// - `AllowGlobals` of one name: "Allow it with ___ only if you trust this
///   class/function"; of several: "(allow those you trust with ___)";
/// - `PassKey(Some(k))`: "to take only "k", ___" (the phrase has its verb);
///   `PassKey(None)`: "select it with ___";
/// - `MapLocation` of a tag: "map it with ___"; of every storage: "map your
///   storages to the CPU with ___." (the sentence before it says where);
/// - `SkipUnsupported`: "(___ to leave them out)";
/// - `RankFiles`: "read them as one state dict with ___ saying how each was
///   cut";
/// - `SplitRules`: "say which tensors to cut along which dimension with
///   ___";
/// - `RaiseLimit`: after the limit's message, "; ___" (an empty phrase
///   adds nothing).
pub trait Terms {
    /// The phrase for `hint`.
    fn hint(&self, hint: &Hint) -> String;
    /// The name of `setting` (`--key` on a command line).
    fn setting(&self, setting: Setting) -> String;
}

/// The reader's own words: what `Display` of errors and decisions uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct Neutral;

impl Terms for Neutral {
    fn hint(&self, hint: &Hint) -> String {
        match hint {
            Hint::AllowGlobals(names) => match names.as_slice() {
                [one] => format!("the allowlist entry {one}"),
                _ => "the allowlist".to_owned(),
            },
            Hint::PassKey(Some(key)) => format!("select key {key:?}"),
            Hint::PassKey(None) => "its key".to_owned(),
            Hint::RaiseLimit { .. } => String::new(),
            Hint::MapLocation { from, to } => match (from, to) {
                (Some(from), Some(to)) => format!("a map location \"{from}={to}\""),
                (None, Some(to)) => format!("a map location \"{to}\""),
                _ => "a map location".to_owned(),
            },
            Hint::SkipUnsupported => "skip unsupported tensors".to_owned(),
            Hint::RankFiles => {
                "rank-file rules (fsdp2: every parameter on dim 0, as FSDP2's fully_shard cuts \
                 them)"
                    .to_owned()
            }
            Hint::SplitRules => "split rules (GLOB=DIM, or a preset such as llama)".to_owned(),
        }
    }

    fn setting(&self, setting: Setting) -> String {
        match setting {
            Setting::Key => "key",
            Setting::StripPrefix => "strip-prefix",
        }
        .to_owned()
    }
}

impl Hint {
    /// The words `hint` adds after the sentence it advises on, in `terms`
    /// (see [`Terms`] for each hint's place).
    pub fn clause(&self, terms: &dyn Terms) -> String {
        let phrase = terms.hint(self);
        match self {
            Hint::AllowGlobals(names) if names.len() == 1 => {
                format!(". Allow it with {phrase} only if you trust this class/function")
            }
            Hint::AllowGlobals(_) => format!(" (allow those you trust with {phrase})"),
            Hint::PassKey(Some(key)) => format!("; to take only {key:?}, {phrase}"),
            Hint::PassKey(None) => format!(": select it with {phrase}"),
            Hint::RaiseLimit { .. } if phrase.is_empty() => String::new(),
            Hint::RaiseLimit { .. } => format!("; {phrase}"),
            Hint::MapLocation { from: Some(_), .. } => format!(": map it with {phrase}"),
            Hint::MapLocation { from: None, .. } => format!(" with {phrase}."),
            Hint::SkipUnsupported => format!(" ({phrase} to leave them out)"),
            Hint::RankFiles => format!(
                "; each rank's file holds a part of every tensor: read them as one state dict \
                 with {phrase}, saying how each tensor was cut"
            ),
            Hint::SplitRules => {
                format!(": say which tensors to cut along which dimension with {phrase}")
            }
        }
    }
}

/// A sentence of the reader's and the hint that ends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Advised {
    pub(crate) text: String,
    pub(crate) hint: Option<Hint>,
}

impl Advised {
    pub(crate) fn plain(text: String) -> Advised {
        Advised { text, hint: None }
    }

    pub(crate) fn render(&self, terms: &dyn Terms) -> String {
        match &self.hint {
            Some(hint) => format!("{}{}", self.text, hint.clause(terms)),
            None => self.text.clone(),
        }
    }
}

/// Something the reader noticed that did not stop it, kept with what it
/// opened ([`Checkpoint::warnings`](crate::Checkpoint::warnings),
/// [`CheckpointSet::warnings`](crate::set::CheckpointSet::warnings)) for
/// the caller to branch on; its `Display` words it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Warning {
    /// The value at `name` is rebuilt by `rebuild`, a torch rebuild
    /// function the reader does not read: its tensors are not listed.
    NotRead {
        /// The name the value would have.
        name: String,
        /// The rebuild function, `module.name`.
        rebuild: String,
    },
    /// `count` tensors are DTensors; each is listed as this file's local
    /// part. The first one's saving rank (as its mesh recorded it), its
    /// coordinate on the mesh and the mesh's size.
    LocalParts {
        /// How many tensors are DTensors.
        count: usize,
        /// The saving rank, when the mesh recorded it.
        rank: Option<u64>,
        /// Its coordinate on the mesh.
        coordinate: Vec<u64>,
        /// The mesh's size along each dimension.
        mesh: Vec<u64>,
    },
    /// The non-tensor values of rank file `file` differ from those of
    /// `kept`, whose values are kept: first at key `key` (`None`: in how
    /// many there are).
    ValuesDiffer {
        /// The rank file whose values are dropped.
        file: String,
        /// The rank file whose values are kept.
        kept: String,
        /// The first key whose value differs.
        key: Option<String>,
    },
    /// `count` tensors in a set's shards are not in its index.
    NotInIndex {
        /// How many.
        count: usize,
    },
    /// A zip entry with no local header at `at` (the central directory's
    /// offset), which nothing reads.
    NoLocalHeader {
        /// The entry's name.
        entry: String,
        /// Where its local header should be.
        at: u64,
    },
    /// Opening `item`, a part of what was opened (a distributed
    /// checkpoint's bytes item), warned `warning`.
    InPart {
        /// The part's name.
        item: String,
        /// Its warning.
        warning: Box<Warning>,
    },
}

impl Warning {
    /// The variant's name in snake case (`not_read`, `local_parts`...),
    /// for front ends that hand warnings on as records.
    pub fn name(&self) -> &'static str {
        match self {
            Warning::NotRead { .. } => "not_read",
            Warning::LocalParts { .. } => "local_parts",
            Warning::ValuesDiffer { .. } => "values_differ",
            Warning::NotInIndex { .. } => "not_in_index",
            Warning::NoLocalHeader { .. } => "no_local_header",
            Warning::InPart { .. } => "in_part",
        }
    }
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Warning::NotRead { name, rebuild } => write!(
                f,
                "'{name}': tensors rebuilt by {rebuild} are not read; they are not listed"
            ),
            Warning::LocalParts {
                count,
                rank,
                coordinate,
                mesh,
            } => write!(
                f,
                "{count} tensors are DTensors: each is listed as this file's local part (rank {} \
                 at {coordinate:?} on a mesh of {mesh:?}); open every rank's file as one set for \
                 whole tensors",
                rank.map_or_else(|| "?".to_owned(), |r| r.to_string()),
            ),
            Warning::ValuesDiffer { file, kept, key } => {
                let differs = key
                    .as_ref()
                    .map_or_else(|| "how many there are".to_owned(), |k| format!("'{k}'"));
                write!(
                    f,
                    "{file}'s values differ from {kept}'s ({differs}): {kept}'s are kept"
                )
            }
            Warning::NotInIndex { count } => write!(
                f,
                "{count} tensor{} in the shards {} not in the index",
                if *count == 1 { "" } else { "s" },
                if *count == 1 { "is" } else { "are" }
            ),
            Warning::NoLocalHeader { entry, at } => write!(
                f,
                "zip entry {entry:?} has no local header (at {at:#x}); not needed, not read"
            ),
            Warning::InPart { item, warning } => write!(f, "{item}: {warning}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Flags;
    impl Terms for Flags {
        fn hint(&self, hint: &Hint) -> String {
            match hint {
                Hint::PassKey(Some(k)) => format!("pass --key {k}"),
                _ => "--flag".to_owned(),
            }
        }
        fn setting(&self, _: Setting) -> String {
            "--key".to_owned()
        }
    }

    #[test]
    fn each_front_end_fills_the_hint_with_its_words() {
        let a = Advised {
            text: "the whole file".to_owned(),
            hint: Some(Hint::PassKey(Some("model".to_owned()))),
        };
        assert_eq!(
            a.render(&Neutral),
            "the whole file; to take only \"model\", select key \"model\""
        );
        assert_eq!(
            a.render(&Flags),
            "the whole file; to take only \"model\", pass --key model"
        );
    }

    /// Each warning's words and name, as the front ends show them.
    #[test]
    fn warnings_are_worded_and_named() {
        let cases = [
            (
                Warning::NotRead {
                    name: "m.w".into(),
                    rebuild: "torch._utils._rebuild_xla_tensor".into(),
                },
                "not_read",
                "'m.w': tensors rebuilt by torch._utils._rebuild_xla_tensor are not read; they \
                 are not listed",
            ),
            (
                Warning::LocalParts {
                    count: 3,
                    rank: None,
                    coordinate: vec![1, 0],
                    mesh: vec![2, 2],
                },
                "local_parts",
                "3 tensors are DTensors: each is listed as this file's local part (rank ? at \
                 [1, 0] on a mesh of [2, 2]); open every rank's file as one set for whole tensors",
            ),
            (
                Warning::ValuesDiffer {
                    file: "__1_0.distcp".into(),
                    kept: "__0_0.distcp".into(),
                    key: Some("step".into()),
                },
                "values_differ",
                "__1_0.distcp's values differ from __0_0.distcp's ('step'): __0_0.distcp's are \
                 kept",
            ),
            (
                Warning::ValuesDiffer {
                    file: "b".into(),
                    kept: "a".into(),
                    key: None,
                },
                "values_differ",
                "b's values differ from a's (how many there are): a's are kept",
            ),
            (
                Warning::NotInIndex { count: 1 },
                "not_in_index",
                "1 tensor in the shards is not in the index",
            ),
            (
                Warning::NoLocalHeader {
                    entry: "archive/x".into(),
                    at: 4096,
                },
                "no_local_header",
                "zip entry \"archive/x\" has no local header (at 0x1000); not needed, not read",
            ),
            (
                Warning::InPart {
                    item: "optim".into(),
                    warning: Box::new(Warning::NotInIndex { count: 2 }),
                },
                "in_part",
                "optim: 2 tensors in the shards are not in the index",
            ),
        ];
        for (warning, name, words) in cases {
            assert_eq!(warning.name(), name);
            assert_eq!(warning.to_string(), words);
        }
    }
}
