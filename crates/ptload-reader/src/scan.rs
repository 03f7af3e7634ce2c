//! Judging the globals a checkpoint references: what each one is, and
//! whether a load that trusted the file could run code through it.
//!
//! Globals are matched exactly by module and name (never resolved or
//! imported); a module's submodules share its class.

use crate::torch::policy::torch_allows;

/// What a dangerous global can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Danger {
    /// Runs code: eval/exec/compile, marshal, nested unpicklers, ctypes, pip.
    CodeExecution,
    /// Starts or controls processes: os, subprocess, pty, multiprocessing.
    Process,
    /// Reads or writes files: open, io, shutil, tempfile, archives.
    FileSystem,
    /// Opens connections: socket, urllib, http, requests, ftplib, smtplib.
    Network,
    /// Imports modules: __import__, importlib, pkgutil, sys.
    Import,
    /// Reaches other callables: getattr-style gadgets, operator, functools.
    Gadget,
}

impl Danger {
    /// A short name: `code execution`, `process`, ...
    pub fn name(self) -> &'static str {
        match self {
            Danger::CodeExecution => "code execution",
            Danger::Process => "process",
            Danger::FileSystem => "file system",
            Danger::Network => "network",
            Danger::Import => "import machinery",
            Danger::Gadget => "getattr-style gadget",
        }
    }
}

/// The class of a global.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GlobalClass {
    /// Tensor machinery torch's `weights_only` loader allows.
    Tensor,
    /// Known plain data (numpy scalars and arrays, argparse.Namespace,
    /// containers, dates, paths, object reconstruction).
    Data,
    /// A class or function ptload does not know.
    Unknown,
    /// Dangerous when a trusting loader calls it.
    Dangerous(Danger),
}

impl GlobalClass {
    /// `allowed` (torch's allowlist), `data`, `unknown`, or `dangerous: <what>`.
    pub fn label(self) -> String {
        match self {
            GlobalClass::Tensor => "allowed".into(),
            GlobalClass::Data => "data".into(),
            GlobalClass::Unknown => "unknown".into(),
            GlobalClass::Dangerous(d) => format!("dangerous: {}", d.name()),
        }
    }
}

fn under(module: &str, root: &str) -> bool {
    module == root
        || module
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('.'))
}

fn dangerous(module: &str, name: &str) -> Option<Danger> {
    use Danger::*;
    let root = |roots: &[&str]| roots.iter().any(|r| under(module, r));
    if module == "builtins" || module == "__builtin__" {
        return match name {
            "eval" | "exec" | "compile" | "breakpoint" | "input" | "execfile" => {
                Some(CodeExecution)
            }
            "open" | "file" => Some(FileSystem),
            "__import__" | "reload" => Some(Import),
            "getattr" | "setattr" | "delattr" | "globals" | "locals" | "vars" | "apply"
            | "__build_class__" => Some(Gadget),
            _ => None,
        };
    }
    if root(&[
        "os",
        "posix",
        "nt",
        "subprocess",
        "pty",
        "commands",
        "multiprocessing",
        "_posixsubprocess",
        "signal",
        "asyncio",
    ]) {
        return Some(Process);
    }
    if root(&[
        "runpy",
        "code",
        "codeop",
        "marshal",
        "pickle",
        "_pickle",
        "cPickle",
        "dill",
        "cloudpickle",
        "ctypes",
        "_ctypes",
        "pip",
        "setuptools",
        "distutils",
        "timeit",
        "pdb",
        "bdb",
        "trace",
        "cProfile",
        "profile",
        "doctest",
    ]) {
        return Some(CodeExecution);
    }
    if module == "types"
        && matches!(
            name,
            "FunctionType" | "CodeType" | "LambdaType" | "MethodType"
        )
    {
        return Some(CodeExecution);
    }
    if module.starts_with("numpy.testing")
        || (module == "torch.jit" || module.starts_with("torch.jit.") || under(module, "torch.hub"))
    {
        return Some(CodeExecution);
    }
    if root(&[
        "io",
        "_io",
        "shutil",
        "tempfile",
        "shelve",
        "glob",
        "fileinput",
        "zipfile",
        "tarfile",
        "gzip",
        "bz2",
        "lzma",
        "linecache",
        "dbm",
    ]) {
        return Some(FileSystem);
    }
    if root(&[
        "socket",
        "_socket",
        "ssl",
        "urllib",
        "urllib2",
        "urllib3",
        "http",
        "httplib",
        "requests",
        "ftplib",
        "smtplib",
        "telnetlib",
        "poplib",
        "imaplib",
        "nntplib",
        "webbrowser",
        "xmlrpc",
        "aiohttp",
        "httpx",
    ]) {
        return Some(Network);
    }
    if root(&["importlib", "imp", "pkgutil", "zipimport", "sys", "site"]) {
        return Some(Import);
    }
    if (module == "operator"
        && matches!(name, "attrgetter" | "methodcaller" | "itemgetter" | "call"))
        || (module == "functools" && matches!(name, "partial" | "reduce" | "partialmethod"))
    {
        return Some(Gadget);
    }
    None
}

fn known_data(module: &str, name: &str) -> bool {
    match module {
        "builtins" | "__builtin__" => matches!(
            name,
            "dict"
                | "list"
                | "tuple"
                | "set"
                | "frozenset"
                | "bytearray"
                | "bytes"
                | "str"
                | "int"
                | "float"
                | "complex"
                | "bool"
                | "slice"
                | "range"
                | "object"
        ),
        "numpy" => matches!(name, "dtype" | "ndarray"),
        "numpy.core.multiarray" | "numpy._core.multiarray" => {
            matches!(name, "scalar" | "_reconstruct")
        }
        "argparse" => name == "Namespace",
        "collections" => matches!(
            name,
            "OrderedDict" | "Counter" | "defaultdict" | "deque" | "namedtuple"
        ),
        "copyreg" | "copy_reg" => matches!(name, "_reconstructor" | "__newobj__" | "__newobj_ex__"),
        "datetime" => matches!(
            name,
            "datetime" | "date" | "time" | "timedelta" | "timezone"
        ),
        "decimal" => name == "Decimal",
        "fractions" => name == "Fraction",
        "uuid" => name == "UUID",
        "pathlib" => name.ends_with("Path"),
        _ => module.starts_with("numpy.dtypes"),
    }
}

/// Classify `module.name`.
pub fn classify(module: &str, name: &str) -> GlobalClass {
    if let Some(d) = dangerous(module, name) {
        GlobalClass::Dangerous(d)
    } else if torch_allows(module, name) {
        GlobalClass::Tensor
    } else if known_data(module, name) {
        GlobalClass::Data
    } else {
        GlobalClass::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(
            classify("torch._utils", "_rebuild_tensor_v2"),
            GlobalClass::Tensor
        );
        assert_eq!(classify("collections", "OrderedDict"), GlobalClass::Tensor);
        assert_eq!(classify("argparse", "Namespace"), GlobalClass::Data);
        assert_eq!(
            classify("numpy._core.multiarray", "scalar"),
            GlobalClass::Data
        );
        assert_eq!(classify("__main__", "Net"), GlobalClass::Unknown);
        assert_eq!(
            classify("os", "system"),
            GlobalClass::Dangerous(Danger::Process)
        );
        assert_eq!(
            classify("posix", "system"),
            GlobalClass::Dangerous(Danger::Process)
        );
        assert_eq!(
            classify("os.path", "join"),
            GlobalClass::Dangerous(Danger::Process)
        );
        assert_eq!(classify("osx", "thing"), GlobalClass::Unknown);
        assert_eq!(
            classify("builtins", "eval"),
            GlobalClass::Dangerous(Danger::CodeExecution)
        );
        assert_eq!(
            classify("builtins", "getattr"),
            GlobalClass::Dangerous(Danger::Gadget)
        );
        assert_eq!(
            classify("pip", "main"),
            GlobalClass::Dangerous(Danger::CodeExecution)
        );
        assert_eq!(
            classify("asyncio.subprocess", "create_subprocess_shell"),
            GlobalClass::Dangerous(Danger::Process)
        );
        assert_eq!(
            classify("urllib.request", "urlopen"),
            GlobalClass::Dangerous(Danger::Network)
        );
        assert_eq!(
            classify("importlib", "import_module"),
            GlobalClass::Dangerous(Danger::Import)
        );
        assert_eq!(
            classify("operator", "attrgetter"),
            GlobalClass::Dangerous(Danger::Gadget)
        );
        assert_eq!(
            classify("shutil", "rmtree"),
            GlobalClass::Dangerous(Danger::FileSystem)
        );
        assert_eq!(
            classify("torch.hub", "load"),
            GlobalClass::Dangerous(Danger::CodeExecution)
        );
    }
}
