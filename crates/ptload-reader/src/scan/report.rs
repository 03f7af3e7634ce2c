//! What a scan reports: each pickle torch would (or would not) read, the
//! globals it names and how it uses them, at their levels, with the
//! ambiguities and effects of the container's reading; and the verdict
//! a gate reads from them.

use super::{wrapper_class, Danger, GlobalClass, Level};

/// How a global is used by the pickle that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Usage {
    /// Named only (imported by `find_class`, never called).
    Referenced,
    /// Constructed without a call the file chose: NEWOBJ(_EX) (the class's
    /// `__new__`), `copyreg._reconstructor`'s class over `object`,
    /// `copyreg.__newobj__`, the type of `_rebuild_from_type_v2`; then
    /// filled by BUILD (its `__setstate__` or `__dict__`). A
    /// `functools.partial` made and kept, never called, counts here too.
    Instantiated,
    /// A class of a package (or `__main__`) called with one constant, and
    /// in no other way: how an `Enum` member pickles (`Format('NCHW')`,
    /// looked up by its value). The package is not the standard library,
    /// torch, numpy or another library every loading machine has, which
    /// any file can name and whose enums are listed by name (a class of
    /// theirs may act: a re-exported `Popen`); the name is a class's
    /// (capitalized, no attribute path). Its code runs as an instantiated class's does, and the file
    /// chose only the constant: loading needs the code
    /// ([`Level::NeedsCode`]), as for the class instantiated.
    LookedUp,
    /// Called: REDUCE, OBJ and INST (`cls(*args)`: `__init__` runs, or the
    /// function), `copyreg._reconstructor`'s base (its `__init__`), the
    /// function of `_rebuild_from_type_v2`, calling an instance (its
    /// class's `__call__`) or a partial (its function), `instance.__new__`.
    Called,
}

impl Usage {
    /// `referenced`, `instantiated` or `called`.
    pub fn name(self) -> &'static str {
        match self {
            Usage::Referenced => "referenced",
            Usage::Instantiated => "instantiated",
            Usage::LookedUp => "looked-up",
            Usage::Called => "called",
        }
    }
}

/// One global a pickle names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GlobalUse {
    /// Module, as the pickle names it (Python 2 names mapped as Python 3
    /// maps them).
    pub module: String,
    /// Name: protocol 4 may name an attribute path (`a.b.c`).
    pub name: String,
    /// Offset of its first GLOBAL / STACK_GLOBAL / INST opcode in the pickle.
    pub offset: u64,
    /// The strongest use seen.
    pub usage: Usage,
    /// What it is.
    pub class: GlobalClass,
}

impl GlobalUse {
    /// `module.name`.
    pub fn path(&self) -> String {
        format!("{}.{}", self.module, self.name)
    }

    /// What this use lets the file make happen: a dangerous global is
    /// dangerous in any use (a wrapper such as `functools.partial` only once
    /// called); an unknown one is an unknown call when called, and needs its
    /// code otherwise. TorchScript's own types (`__torch__.*`) are built by
    /// the TorchScript loader from the archive, not imported.
    pub fn level(&self) -> Level {
        match self.class {
            GlobalClass::Dangerous(_)
                if self.usage < Usage::Called && wrapper_class(&self.module, &self.name) =>
            {
                Level::NeedsCode
            }
            GlobalClass::Dangerous(_) => Level::Dangerous,
            GlobalClass::Unknown if self.module.starts_with("__torch__") => Level::Clean,
            GlobalClass::Unknown if self.usage == Usage::Called => Level::UnknownCall,
            GlobalClass::Unknown => Level::NeedsCode,
            _ => Level::Clean,
        }
    }

    /// Whether this use fails a gate at the default line
    /// ([`Level::UnknownCall`]).
    pub fn is_finding(&self) -> bool {
        self.level() >= Level::UnknownCall
    }
}

/// Where a pickle lies in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PickleSource {
    /// A zip entry.
    Entry(String),
    /// The `index`th pickle of a stream (the legacy layout, or a bare
    /// pickle), starting at `offset`.
    Stream {
        /// 0 for the first pickle.
        index: usize,
        /// Byte offset in the file.
        offset: u64,
    },
    /// A member of a pre-1.0 tar checkpoint.
    TarMember(String),
    /// The data of a numpy object array (a `.npy` file, or an entry of a
    /// `.npz` zip), which `numpy.load(allow_pickle=True)` unpickles: the
    /// file, or the entry's name.
    NumpyArray(String),
    /// Bytes inside another pickle, at the offset of the bytes value.
    Nested {
        /// The pickle holding it.
        parent: String,
        /// Which bytes value of the parent, in order of creation.
        index: usize,
    },
}

impl std::fmt::Display for PickleSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PickleSource::Entry(name) => write!(f, "{name}"),
            PickleSource::Stream { index, offset } => {
                write!(f, "stream pickle {index} at offset {offset:#x}")
            }
            PickleSource::TarMember(name) => write!(f, "tar member {name}"),
            PickleSource::NumpyArray(name) => write!(f, "numpy object array {name}"),
            PickleSource::Nested { parent, index } => {
                write!(f, "bytes value {index} inside {parent}")
            }
        }
    }
}

/// One pickle of the file and what it names.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ScannedPickle {
    /// Where it is.
    pub source: PickleSource,
    /// Whether `torch.load(weights_only=False)` would unpickle it.
    pub reachable: bool,
    /// Where its bytes start in the file, when they lie there as they are
    /// (not inflated, not nested): a global's offset plus this is its
    /// offset in the file.
    pub base: Option<u64>,
    /// Every global it names, once each, in order of first appearance.
    pub globals: Vec<GlobalUse>,
    /// Whether it ran to its STOP.
    pub complete: bool,
    /// Why it did not, when it did not (the globals before the error are
    /// still listed).
    pub error: Option<String>,
}

/// Structure that other readers read differently from these bytes: where
/// it is and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ambiguity {
    /// The record (zip entry, pickle) it concerns, or the file's layout
    /// for the container as a whole.
    pub record: String,
    /// Byte offset: in the file for container structure, in the pickle
    /// for a pickle's opcodes.
    pub offset: u64,
    /// What other readers would see differently.
    pub what: String,
}

/// What torch's own reading of the container does beyond unpickling (a
/// pre-1.0 tar checkpoint's members are extracted to disk): where and
/// what, at a danger's level.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Effect {
    /// The record it concerns.
    pub record: String,
    /// Byte offset in the file (the member's header).
    pub offset: u64,
    /// What kind of harm it can do.
    pub danger: Danger,
    /// What happens.
    pub what: String,
}

/// The scanner's judgement of a file: its [`Level`], or unreadable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// A dangerous global, anywhere in the file, or a gadget that reaches
    /// a call.
    Dangerous,
    /// Structure other readers read differently.
    Ambiguous,
    /// An unknown global that is called.
    UnknownCall,
    /// Classes that are only named or constructed: loading needs their
    /// code, not a payload.
    NeedsCode,
    /// Nothing but tensors and plain data.
    Clean,
    /// No pickle torch.load would unpickle could be read (not a
    /// checkpoint, or too broken for torch to unpickle anything either),
    /// and nothing at or above [`Level::UnknownCall`] was found.
    Unreadable,
}

impl Verdict {
    /// The level's name, or `unreadable`.
    pub fn name(self) -> &'static str {
        match self.level() {
            Some(level) => level.name(),
            None => "unreadable",
        }
    }

    /// The level, `None` when unreadable.
    pub fn level(self) -> Option<Level> {
        match self {
            Verdict::Dangerous => Some(Level::Dangerous),
            Verdict::Ambiguous => Some(Level::Ambiguous),
            Verdict::UnknownCall => Some(Level::UnknownCall),
            Verdict::NeedsCode => Some(Level::NeedsCode),
            Verdict::Clean => Some(Level::Clean),
            Verdict::Unreadable => None,
        }
    }

    fn of(level: Level) -> Verdict {
        match level {
            Level::Dangerous => Verdict::Dangerous,
            Level::Ambiguous => Verdict::Ambiguous,
            Level::UnknownCall => Verdict::UnknownCall,
            Level::NeedsCode => Verdict::NeedsCode,
            Level::Clean => Verdict::Clean,
        }
    }
}

/// What a scan found in one file.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ScanReport {
    /// How torch would read the file: `zip`, `legacy`, `tar`.
    pub layout: &'static str,
    /// Every pickle found, reachable ones first.
    pub pickles: Vec<ScannedPickle>,
    /// Structure other readers read differently (each makes the file
    /// [`Level::Ambiguous`] at least).
    pub ambiguities: Vec<Ambiguity>,
    /// What torch's reading of the container itself does (each makes the
    /// file [`Level::Dangerous`]).
    pub effects: Vec<Effect>,
    /// Problems with the container itself (a zip directory torch could not
    /// read either, ...).
    pub notes: Vec<String>,
    /// A file that holds no pickle and whose header was read and checked
    /// (a safetensors file): nothing in it can run.
    pub holds_no_pickle: bool,
}

impl ScanReport {
    /// The highest level of the file's findings, wherever they are (a
    /// pickle torch.load would not reach, or a broken file, included).
    pub fn level(&self) -> Level {
        let globals = self.pickles.iter().flat_map(|p| &p.globals);
        let level = globals.map(GlobalUse::level).max().unwrap_or(Level::Clean);
        if !self.effects.is_empty() {
            Level::Dangerous
        } else if self.ambiguities.is_empty() {
            level
        } else {
            level.max(Level::Ambiguous)
        }
    }

    /// Whether a pickle torch.load would unpickle was read to its end.
    pub fn readable(&self) -> bool {
        self.pickles.iter().any(|p| p.complete && p.reachable)
    }

    /// The verdict: a level at or above [`Level::UnknownCall`] wherever it
    /// was found (a broken file included); else unreadable when no pickle
    /// torch.load would reach could be read (and the file is no checked
    /// safetensors file); else the level.
    pub fn verdict(&self) -> Verdict {
        let level = self.level();
        if level < Level::UnknownCall && !self.readable() && !self.holds_no_pickle {
            Verdict::Unreadable
        } else {
            Verdict::of(level)
        }
    }
}
