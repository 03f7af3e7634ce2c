//! The package's words for what the libraries advise and decide: hints
//! as keyword arguments, decisions with the kind Python filters on, GPU
//! fallback reasons. The libraries' text is never rewritten here.

use ptload_device::Fallback;
use ptload_reader::advice::{Hint, Neutral, Setting, Terms};
use ptload_reader::state_dict::Decision;
use pyo3::prelude::*;

/// Hints and settings as this package's keyword arguments.
pub struct Kwargs;

impl Terms for Kwargs {
    fn hint(&self, hint: &Hint) -> String {
        match hint {
            Hint::AllowGlobals(names) => match names.as_slice() {
                [one] => format!("allow_globals=[{one:?}]"),
                _ => "allow_globals=[...]".to_owned(),
            },
            Hint::PassKey(Some(key)) => format!("pass key={key:?}"),
            Hint::PassKey(None) => "key=\"...\"".to_owned(),
            Hint::RankFiles => {
                "rank_files=\"RULES\" (\"fsdp2\": every parameter on dim 0, as FSDP2's \
                 fully_shard cuts them)"
                    .to_owned()
            }
            Hint::SplitRules => "splits=[\"GLOB=DIM\", ...] or preset=\"llama\"".to_owned(),
            Hint::MapLocation { from, to } => match (from, to) {
                (Some(from), Some(to)) => format!("map_location={{{from:?}: {to:?}}}"),
                (None, Some(to)) => format!("map_location={to:?}"),
                _ => "map_location".to_owned(),
            },
            other => Neutral.hint(other),
        }
    }

    fn setting(&self, setting: Setting) -> String {
        match setting {
            Setting::Key => "key",
            Setting::StripPrefix => "strip_prefix",
            _ => return Neutral.setting(setting),
        }
        .to_owned()
    }
}

/// A decision as `(kind, text)`: the kind says which option made it
/// ("key", "whole_file", "left_out", "filtered", "stripped", "unsure":
/// tensors under no key `auto` knows, the whole file kept), the text
/// is in this package's words.
pub fn decision(d: &Decision) -> (&'static str, String) {
    let kind = match d.inner() {
        Decision::KeyChosen { .. } => "key",
        Decision::WholeFile { .. } => "whole_file",
        Decision::GroupsLeftOut { .. } => "left_out",
        Decision::Filtered { .. } => "filtered",
        Decision::PrefixStripped { .. } => "stripped",
        Decision::Unrecognized { .. } => "unsure",
        _ => "other",
    };
    (kind, d.render(&Kwargs))
}

/// Why a storage stays on the CPU instead of its GPU, in the words torch
/// users read (torch counts the devices it sees as visible).
pub fn fallback(why: &Fallback) -> String {
    match why {
        Fallback::NoSuchDevice { count: 0, .. } => "no CUDA device is available".to_owned(),
        Fallback::NoSuchDevice { count, .. } => {
            format!("only {count} CUDA device(s) are visible")
        }
        other => other.to_string(),
    }
}

/// The reason for a storage planned on `cuda:ordinal` that stays on the
/// CPU, where torch sees `visible` devices (or the device ran out of
/// memory): the same words as ptload-device's reasons.
#[pyfunction]
#[pyo3(signature = (ordinal, visible, out_of_memory=false))]
pub fn fallback_text(ordinal: u32, visible: usize, out_of_memory: bool) -> String {
    let why = if out_of_memory {
        Fallback::OutOfMemory {
            ordinal,
            free: None,
            message: None,
        }
    } else {
        Fallback::NoSuchDevice {
            ordinal,
            count: visible,
        }
    };
    fallback(&why)
}
