//! The command's words for what the libraries advise and decide: their
//! hints and decisions come as data, and this is where they become flags.

use ptload_reader::advice::{Hint, Neutral, Setting, Terms};

/// Hints and settings as the command's flags.
pub(crate) struct Flags;

impl Terms for Flags {
    fn hint(&self, hint: &Hint) -> String {
        match hint {
            Hint::AllowGlobals(names) => match names.as_slice() {
                [one] => format!("--allow-global {one}"),
                _ => "--allow-global, which takes a comma-separated list and globs".to_owned(),
            },
            Hint::PassKey(Some(key)) => format!("pass --key {key}"),
            Hint::PassKey(None) => "--key".to_owned(),
            Hint::MapLocation { from, to } => match (from, to) {
                (Some(from), Some(to)) => format!("--map-location {from}={to}"),
                (None, Some(to)) => format!("--map-location {to}"),
                _ => "--map-location".to_owned(),
            },
            Hint::SkipUnsupported => "use --skip-unsupported".to_owned(),
            Hint::RankFiles => {
                "--rank-files RULES (fsdp2: every parameter on dim 0, as FSDP2's fully_shard \
                 cuts them)"
                    .to_owned()
            }
            Hint::SplitRules => "--split GLOB=DIM or --split-preset NAME".to_owned(),
            // No flag raises a limit: the message names it.
            other => Neutral.hint(other),
        }
    }

    fn setting(&self, setting: Setting) -> String {
        match setting {
            Setting::Key => "--key",
            Setting::StripPrefix => "--strip-prefix",
            _ => return Neutral.setting(setting),
        }
        .to_owned()
    }
}

/// An error for the command's user: a library's error with its hint in
/// flags, then its sources after colons.
pub(crate) fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    if let Some(e) = e.downcast_ref::<ptload_reader::Error>() {
        return e.render(&Flags);
    }
    if let Some(e) = e.downcast_ref::<ptload_device::LoadError>() {
        return e.render(&Flags);
    }
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(source) = next {
        out.push_str(": ");
        out.push_str(&source.to_string());
        next = source.source();
    }
    out
}

/// What the selection decided, in the command's terms, one line each.
pub(crate) fn decisions(decisions: &[ptload_reader::state_dict::Decision]) -> Vec<String> {
    decisions.iter().map(|d| d.render(&Flags)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_is_in_flags() {
        let one = Flags.hint(&Hint::AllowGlobals(vec!["a.B".to_owned()]));
        assert_eq!(one, "--allow-global a.B");
        let tag = Hint::MapLocation {
            from: Some("xla:0".to_owned()),
            to: Some("cpu".to_owned()),
        };
        assert_eq!(Flags.hint(&tag), "--map-location xla:0=cpu");
        assert_eq!(Flags.setting(Setting::Key), "--key");
    }
}
