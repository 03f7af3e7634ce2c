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
}
