//! Scanning: which pickles `torch.load` would run in a file, every global
//! they name and how each is used, and what each global is.
//!
//! [`scan_bytes`] reads a file the way torch decides to read it (zip only
//! when it starts with `PK\x03\x04`, otherwise the pickle stream from its
//! first byte), without opening it as a checkpoint: a file that is broken,
//! or not a checkpoint at all, still has its pickles scanned, and the
//! globals seen before a break are reported (fail closed).
//!
//! ```
//! use ptload_reader::{scan, Limits};
//!
//! let bytes = std::fs::read("../../tests/hostile/x_os_system.pt").unwrap();
//! let report = scan::scan_bytes(&bytes, &Limits::default());
//! assert_eq!(report.verdict(), scan::Verdict::Dangerous);
//! let g = report.pickles.iter().flat_map(|p| &p.globals).find(|g| g.is_finding()).unwrap();
//! assert_eq!(g.path(), "os.system");
//! ```
//!
//! Globals are classified by exact module and name (never resolved or
//! imported): torch's `weights_only` allowlist and known plain data by
//! exact pairs; attribute paths and dunders outside them are gadgets; the
//! dangerous modules include their submodules.

use crate::torch::policy::torch_allows;

mod finalizers;
mod libraries;
mod reach;
mod recorder;
mod report;
mod stdlib;
mod tensor_methods;
mod torch_data;
mod torchscript;

#[cfg(test)]
pub(crate) use reach::scan_bytes_general;
pub(crate) use reach::scan_fetched;
pub(crate) use reach::scan_file_bytes;
pub use reach::{scan_bytes, scan_file, scan_ranged, scan_url};
pub use report::{
    Ambiguity, Effect, GlobalUse, PickleSource, ScanReport, ScannedPickle, Usage, Verdict,
};

/// What a finding lets a file make happen when `torch.load` (with
/// `weights_only=False`) reads it, least to most: a file's level is the
/// highest of its findings'. A gate fails at a line ([`Level::UnknownCall`]
/// by default, as `ptload scan` does): everything at or above it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Level {
    /// Tensor machinery and plain data only.
    Clean,
    /// Classes that are only named, or constructed (`cls.__new__`) and
    /// filled (BUILD): loading needs their code installed (a full model's
    /// `torch.nn` and `__main__` classes), and calls nothing the file
    /// chose. Not a payload.
    NeedsCode,
    /// A call (REDUCE, OBJ, INST, a base class's `__init__`, an instance
    /// called) of a callable outside the known-safe set, from code the
    /// scanner does not take for a library every loading machine has: a
    /// model's own package or `__main__` (or, looked up by one value as an
    /// enum member is, a library's class).
    UnknownCall,
    /// Structure other readers read differently from these bytes (zip
    /// directory tricks, bad CRCs, a pickle that reads past its frame).
    Ambiguous,
    /// Code execution, processes, files, network or import by name: a
    /// dangerous global in any use, or a gadget that reaches a call; and
    /// any other call into the standard library, torch or a package every
    /// loading machine has, outside the known-safe set
    /// ([`Danger::LibraryCall`]): no checkpoint makes one.
    Dangerous,
}

impl Level {
    /// Every level, least first.
    pub const ALL: [Level; 5] = [
        Level::Clean,
        Level::NeedsCode,
        Level::UnknownCall,
        Level::Ambiguous,
        Level::Dangerous,
    ];

    /// `clean`, `needs-code`, `unknown-call`, `ambiguous`, `dangerous`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Clean => "clean",
            Level::NeedsCode => "needs-code",
            Level::UnknownCall => "unknown-call",
            Level::Ambiguous => "ambiguous",
            Level::Dangerous => "dangerous",
        }
    }

    /// The level named `name` (as [`Level::name`] spells it).
    pub fn from_name(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.name() == name)
    }
}

/// Gadget classes whose construction only stores what it is given (a
/// `functools.partial` kept as a model attribute, as timm keeps
/// `partial(nn.LayerNorm, eps=1e-6)`): dangerous only once called.
fn wrapper_class(module: &str, name: &str) -> bool {
    module == "functools" && name == "partial"
}

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
    /// Changes the interpreter's own state: an item, element or attribute
    /// set on a module's object (a registry, a cache, a list of hooks), so
    /// that later code (the rest of the load, torch, the program) calls
    /// what the file put there.
    StateChange,
    /// Calls library code no checkpoint calls: a callable of the standard
    /// library, torch or a package every loading machine has, outside the
    /// scanner's lists (what it does is not known, but it is not the
    /// file's own model code).
    LibraryCall,
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
            Danger::StateChange => "changes interpreter state",
            Danger::LibraryCall => "uncatalogued library call",
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

/// Modules (and their submodules) whose callables start or signal processes.
const PROCESS_ROOTS: &[&str] = &[
    "os",
    "posix",
    "nt",
    "subprocess",
    "pty",
    "commands",
    "multiprocessing",
    // multiprocessing's C parts: named semaphores, shared memory.
    "_multiprocessing",
    "_posixshmem",
    "_posixsubprocess",
    "signal",
    "asyncio",
    "pydoc",
    "platform",
    "venv",
    "_osx_support",
    "torch.utils.collect_env",
    // click's launch, edit and pager start programs.
    "click",
    // torch's launchers and elastic agents start worker processes.
    "torch.distributed.elastic",
    "torch.distributed.launch",
    "torch.distributed.launcher",
    "torch.distributed.run",
    // mailcap's `findmatch` runs the `test` commands of the entries it is
    // given; torch's memory visualizer fetches and runs a script; and
    // other helpers that run programs (a profiler, kernel cleaners,
    // version probes, torchrun for tests, shell completion, a build tool).
    "mailcap",
    "torch.cuda._memory_viz",
    "torch._strobelight",
    "torch.utils._get_clean_triton",
    "packaging._musllinux",
    "pydantic._internal._git",
    // Executor pools run the callables they are given, in worker
    // processes or threads.
    "concurrent.futures",
    // torch's benchmark timer's valgrind wrapper runs valgrind.
    "torch.utils.benchmark.utils.valgrind_wrapper",
    "transformers.testing_utils",
    "functorch.dim.magic_trace",
    "typer._completion_shared",
    "maturin",
];

/// Modules whose callables run code: evaluators, unpicklers, installers,
/// debuggers, and torch's and numpy's own wrappers around them.
const CODE_ROOTS: &[&str] = &[
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
    "ensurepip",
    "setuptools",
    "distutils",
    "timeit",
    "pdb",
    "bdb",
    "trace",
    "cProfile",
    "profile",
    "doctest",
    "idlelib",
    // CPython's test helpers (they start interpreters on scripts they
    // write; a model's own `test` module is not these) and pytest's
    // internals.
    "test.support",
    "test.libregrtest",
    "_pytest",
    "pytest",
    // transformers' loader of code from a model's repository.
    "transformers.dynamic_module_utils",
    // torch's own eval/exec wrappers: FX graph modules exec source from
    // the file, symbolic-shape guards are evaluated, config modules
    // unpickle bytes, datapipes' decoders unpickle what they read and
    // their dataframe captures replay recorded operations, packages and
    // extensions load code. (Datapipes' serialization wrappers are by
    // name; the other datapipes are plain classes whose finalizers are
    // catalogued.)
    "torch.fx",
    "torch._dynamo",
    "torch._inductor",
    "torch.utils._config_module",
    "torch.utils.data.datapipes.utils.decoder",
    "torch.utils.data.datapipes.dataframe",
    "torch.utils.cpp_extension",
    "torch.package",
    "torch.testing",
    // A remote module's class is generated from a template filled with
    // the file's text and executed.
    "torch.distributed.nn.jit",
    // unittest's program imports the modules it is named and runs their
    // tests (then exits); its loader imports by name.
    "unittest",
    // mpmath's `identify` evaluates the constants it is given as
    // expressions.
    "mpmath.identification",
    // Deserializers and loaders in torch and beside it (a survey of the
    // installed packages' callables that unpickle, evaluate or load code
    // from their arguments): exported artifacts, compiler repros, model
    // dumps, schemas inferred from string annotations, pydantic's old
    // parsers (pickle allowed), torchgen, a vendored kernel compiler's
    // workers, torch's packaged programs and precompiled artifacts
    // (torch.load inside), Lightning's checkpoint upgraders and DeepSpeed
    // converters, the command-line programs of transformers, the Hub,
    // typer and lightning_utilities, the CUDA library finder.
    "torch._export.serde",
    "torch._functorch.compilers",
    "torch.utils.model_dump",
    "torch._library.infer_schema",
    // Guards pasted into a generated function's source and executed; a
    // triton kernel's mutation wrapper, einops patterns and turtle's
    // method forwarding are code made from text too; pydantic's typing
    // helpers evaluate annotations given as strings.
    "torch.export._unlift",
    "torch._higher_order_ops.triton_kernel_wrap",
    "functorch.einops",
    "turtle",
    // torch's benchmark timer compiles and runs its statement text; the
    // `py` library (pytest's shim of it: `py.path.local`) imports,
    // executes and writes what its paths name.
    "torch.utils.benchmark.utils.timer",
    "py",
    "pydantic.v1.typing",
    "pydantic.typing",
    "pydantic._internal._typing_extra",
    "torch.export.pt2_archive",
    "torch._precompile",
    "pydantic.deprecated.parse",
    "pydantic.v1.parse",
    "torchgen",
    "quack",
    "pytorch_lightning.utilities.upgrade_checkpoint",
    "pytorch_lightning.utilities.deepspeed",
    "lightning.pytorch.utilities.upgrade_checkpoint",
    "lightning.pytorch.utilities.deepspeed",
    "transformers.cli",
    "huggingface_hub.cli",
    "typer.cli",
    "lightning_utilities.cli",
    "cuda.pathfinder",
    // triton compiles kernels and loads what it built; its cache
    // managers make folders and files named by their arguments.
    "triton",
    // Configuration that constructs any callable it names ('()' in
    // dictConfig) or evaluates what a socket sends (listen).
    "logging.config",
    // sympy turns string arguments into expressions by evaluating them
    // (`sympify`), in most of its functions (`expand`, `simplify`...);
    // numexpr and jinja2 evaluate strings; Hydra's `instantiate` and
    // `call` construct or call any target a config names.
    "sympy",
    "numexpr",
    "jinja2",
    "hydra",
    // Callables registered to run later: at exit.
    "atexit",
    // numpy's readers: `load` unpickles with allow_pickle=True.
    "numpy.lib.npyio",
    "numpy.lib._npyio_impl",
    "numpy.lib.format",
    "numpy.lib._format_impl",
    "numpy.ctypeslib",
    "numpy.f2py",
    "numpy.distutils",
];

/// Modules whose callables open, write or move files.
const FILE_ROOTS: &[&str] = &[
    "io",
    "_io",
    // The pure-Python io: its classes write what their state holds to
    // the descriptor it names when collected (`__del__` flushes).
    "_pyio",
    "fsspec",
    "mmap",
    "uu",
    // Grammar tables are pickled files it loads and writes.
    "lib2to3",
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
    // Opened by path and created when missing.
    "sqlite3",
    "_sqlite3",
    "logging.handlers",
    "mailbox",
    "wave",
    "aifc",
    "sunau",
    // Write bytecode next to, or wherever, a path says.
    "py_compile",
    "compileall",
    // Datapipes that open or list the paths their state names when
    // iterated (`FileOpenerIterDataPipe` opens them in the mode it holds),
    // and their helpers.
    "torch.utils.data.datapipes.iter.fileopener",
    "torch.utils.data.datapipes.iter.filelister",
    "torch.utils.data.datapipes.utils.common",
    // `site`'s helpers: `license`'s printer reads the files its state
    // names when printed, `exit` closes standard input.
    "_sitebuiltins",
    // Finalizers that act on what their state names: the profiler's trace
    // observer gzips and removes files, a GDS file closes the descriptor
    // it holds.
    "torch.profiler",
    "torch.cuda.gds",
    // numpy's data sources open (and create, truncating) the paths they
    // are given.
    "numpy.lib._datasource",
    // pygments' formatters write the style sheets they are given
    // (`HtmlFormatter(cssfile=...)`, when `highlight` or `format` runs
    // them); readline writes and truncates history files; torch's file
    // baton creates and removes the lock file it names.
    "pygments",
    "readline",
    "torch.utils.file_baton",
    // cgitb's hook writes its report into the folder it is given; and
    // writers of source trees, debug traces, archives and the Hub's
    // shared blobs and cache.
    "cgitb",
    "zipapp",
    "torch.utils.hipify",
    "torch.utils.data.datapipes.gen_pyi",
    "torch._functorch.benchmark_utils",
    "transformers.model_debugging_utils",
    "transformers.convert_slow_tokenizers_checkpoints_to_fast",
    "huggingface_hub.utils._shared_blobs",
    "huggingface_hub.utils._cache_manager",
    "huggingface_hub.utils._auth",
    "huggingface_hub._local_folder",
    "huggingface_hub._buckets",
    "lightning_utilities.docs",
    "transformers.integrations.tiktoken",
    // Dialogs that open or create the files chosen.
    "tkinter.filedialog",
];

/// Modules whose callables reach the network.
const NETWORK_ROOTS: &[&str] = &[
    "socket",
    "_socket",
    "ssl",
    "_ssl",
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
    "httpx2",
    "httpcore",
    "pycurl",
    "websocket",
    "websockets",
    "paramiko",
    // The socket frameworks of Python before 3.12; `asyncore`'s file
    // wrapper closes the descriptor its state names when collected.
    "asyncore",
    "asynchat",
    "socketserver",
    // torch's rendezvous (a `file://` store creates its file, `tcp://`
    // listens) and its RPC and remote modules.
    "torch.distributed.rendezvous",
    "torch.distributed.rpc",
    "torch.distributed.nn.api.remote_module",
    // The Hub's downloads and uploads, transformers' resolution of files
    // on the Hub and its process-group set-up, metrics' downloads, and
    // SAX's input sources (opened as URLs).
    "huggingface_hub.file_download",
    "huggingface_hub._snapshot_download",
    "huggingface_hub.fastai_utils",
    "huggingface_hub._commit_api",
    "huggingface_hub._oidc",
    "huggingface_hub.inference",
    "huggingface_hub.utils._telemetry",
    "huggingface_hub._bucket_live_follow",
    "transformers.utils.hub",
    "transformers.models.auto",
    "transformers.distributed",
    "transformers.integrations.hub_kernels",
    "transformers.integrations.mistral",
    "transformers.safetensors_conversion",
    "transformers.utils.peft_utils",
    "torchmetrics.functional.audio.dnsmos",
    "xml.sax",
];

/// Modules whose callables import by name or change what imports find,
/// and modules whose import alone does something (naming any of their
/// globals imports them): `this` prints, `antigravity` opens a browser,
/// `__hello__` and `__phello__` print.
const IMPORT_ROOTS: &[&str] = &[
    // Caches and lazy modules that import what a string names when
    // tested, printed or looked into (`RequirementCache`, `LazyModule`).
    "lightning_utilities.core.imports",
    "transformers.utils.import_utils",
    // torch's checks of optional modules import the name they are given;
    // lazy loaders import it when the result is used.
    "torch.utils._import_utils",
    "networkx.lazy_imports",
    "lazy_loader",
    // importlib's own machinery under the names its objects report, and
    // the C part of `imp` (extension modules by path).
    "_frozen_importlib",
    "_frozen_importlib_external",
    "_imp",
    "anyio._lazyimport",
    "huggingface_hub._attach",
    "transformers.exporters",
    "torch._functorch._aot_autograd.source_emit",
    // Optional native kernels found by module spec (parents imported).
    "torch._native",
    // pygments' plugin and lexer or formatter loaders import the modules
    // they are given.
    "pygments.plugin",
    "importlib",
    "imp",
    "pkgutil",
    "zipimport",
    "sys",
    "site",
    "this",
    "antigravity",
    "__hello__",
    "__phello__",
];

/// Callables that import or look up what a string names, in whatever
/// package defines them (`jinja2.utils.import_string`,
/// `warnings._getcategory`, `pydoc.locate`, Hydra's `get_class`...).
const IMPORTERS_BY_NAME: &[&str] = &[
    "import_string",
    "_import_dotted_name",
    // The extension registry: a later EXT opcode resolves to the global it
    // registers, which the bytes do not name.
    "add_extension",
    "import_module",
    "import_object",
    "locate",
    "_locate",
    "get_class",
    "get_method",
    "get_obj_from_str",
    "instantiate_from_config",
    "resolve_name",
    "_getcategory",
    // Lazy modules import the module they name on first attribute lookup
    // (BUILD's `__setstate__` lookup is one), requirement caches when
    // tested or printed: torch's, ONNX's, transformers', Lightning's.
    "lazy_import",
    "_lazy_import",
    // numpy's ufunc unpickler imports the module it is given and returns
    // the attribute it names (any callable); Lightning's and jsonargparse's
    // `instantiate_class` import and call a class path.
    "_ufunc_reconstruct",
    "instantiate_class",
    "add_newdoc",
    "_makenamedict",
    "getDOMImplementation",
    "LazyModule",
    "_LazyModule",
    "LazyImporter",
    "_LazyImporter",
    "LazyLoader",
    "RequirementCache",
    "ModuleAvailableCache",
];

fn dangerous(module: &str, name: &str) -> Option<Danger> {
    if module == "builtins" || module == "__builtin__" {
        return dangerous_builtin(name);
    }
    // Enums of packages that are otherwise network code.
    if known_enum(module, name) {
        return None;
    }
    let root = |roots: &[&str]| roots.iter().any(|r| under(module, r));
    // Any module of a subprocess helper (`asyncio.subprocess`,
    // `huggingface_hub.utils._subprocess`...).
    if root(PROCESS_ROOTS) || module.split('.').any(|m| m.contains("subprocess")) {
        return Some(Danger::Process);
    }
    // A package's `__main__` module runs the package's program when
    // imported (the script's own `__main__`, first, is the model's code).
    if module.split('.').skip(1).any(|m| m == "__main__") {
        return Some(Danger::Import);
    }
    // A library's tests run when imported (a test module's `unittest.main()`,
    // a benchmark, an exit hook); no checkpoint names one.
    if test_module(module) && libraries::shipped(module) {
        return Some(Danger::Import);
    }
    if IMPORTERS_BY_NAME.contains(&name) {
        return Some(Danger::Import);
    }
    if root(CODE_ROOTS) {
        return Some(Danger::CodeExecution);
    }
    if let Some(by_name) = dangerous_by_name(module, name) {
        return by_name;
    }
    [
        (FILE_ROOTS, Danger::FileSystem),
        (NETWORK_ROOTS, Danger::Network),
        (IMPORT_ROOTS, Danger::Import),
    ]
    .into_iter()
    .find_map(|(roots, danger)| root(roots).then_some(danger))
    .or_else(|| dangerous_gadget(module, name))
}

/// The package a vendored copy copies: what follows a `_vendor`,
/// `vendor` or `_vendored` segment (`pip._vendor.requests.api` is
/// `requests.api`), and a package kept under its own name with a leading
/// underscore inside another (typer's `typer._click.utils` is
/// `click.utils`).
/// A copy inside a copy is the innermost one.
fn vendored(module: &str) -> Option<&str> {
    let mut found = None;
    let mut at = 0;
    for segment in module.split('.') {
        if matches!(segment, "_vendor" | "vendor" | "_vendored") {
            found = module
                .get(at + segment.len() + 1..)
                .filter(|r| !r.is_empty());
        } else if at > 0 && segment == "_click" {
            found = module.get(at + 1..);
        }
        at += segment.len() + 1;
    }
    found
}

/// The public module `module.name` is also reached through: C
/// accelerators (`_operator`, `_functools`, `_io`, `_pickle`, `_codecs`),
/// `typing_extensions` for `typing`, and numpy's implementation modules
/// (`numpy.lib._function_base_impl.vectorize` is `numpy.vectorize`) for
/// the numpy callables the scanner names.
fn public_module(module: &str, name: &str) -> Option<&'static str> {
    match module {
        "_operator" => Some("operator"),
        "_functools" => Some("functools"),
        "_io" => Some("io"),
        "_pickle" => Some("pickle"),
        "_codecs" => Some("codecs"),
        "typing_extensions" => Some("typing"),
        _ if module.starts_with("numpy.")
            && matches!(
                name,
                "vectorize"
                    | "frompyfunc"
                    | "memmap"
                    | "apply_along_axis"
                    | "apply_over_axes"
                    | "piecewise"
                    | "load"
                    | "loads"
                    | "fromfile"
                    | "save"
                    | "savez"
                    | "savez_compressed"
                    | "savetxt"
                    | "loadtxt"
                    | "genfromtxt"
            ) =>
        {
            Some("numpy")
        }
        _ => None,
    }
}

/// What calling `name`, a callable the scanner does not know, does, as
/// its words say (split at underscores and case changes): writes or
/// removes files (`write_adjlist`, `save_state_dict`, `makedirs`,
/// `create_archive`), runs a program (`main`, `run`, `exec`), starts a
/// process (`spawn`, `popen`), or opens a connection (`UnixStreamServer`,
/// `urlopen`). Only for callables the file calls: a class or function it
/// merely names is judged by what it is, not by its name.
pub(crate) fn dangerous_when_called(name: &str) -> Option<Danger> {
    const PROCESS: &[&str] = &[
        "system",
        "popen",
        "spawn",
        "fork",
        "shell",
        "subprocess",
        "launch",
        "kill",
    ];
    const CODE: &[&str] = &[
        "eval",
        "evaluate",
        "deserialize",
        "deserialise",
        "unpickle",
        "unmarshal",
        "dlopen",
        "exec",
        "execute",
        "compile",
        "main",
        "run",
        "runpy",
        "interpret",
        "cli",
        "atexit",
    ];
    const NETWORK: &[&str] = &[
        "server",
        "client",
        "socket",
        "connect",
        "connection",
        "urlopen",
        "download",
        "upload",
        "request",
        "requests",
        "sendmail",
        "smtp",
        "ftp",
        "telnet",
        "webhook",
        "url",
        "tcp",
        "udp",
        "port",
        "listener",
        "pretrained",
        "hub",
        "ffmpeg",
    ];
    const FILES: &[&str] = &[
        "write",
        "writer",
        "save",
        "dump",
        "mkdir",
        "mkdirs",
        "makedirs",
        "remove",
        "unlink",
        "rmtree",
        "rmdir",
        "rename",
        "copy",
        "copyfile",
        "copytree",
        "archive",
        "truncate",
        "chmod",
        "chown",
        "symlink",
        "touch",
        "dir",
        "directory",
        "folder",
        "export",
        "tofile",
        // Caches live in files (`cached_assets_path` makes its folder,
        // `_cache_commit_hash_for_specific_revision` writes a ref).
        "cache",
        "cached",
        "persist",
        "rotate",
        "offload",
    ];
    let words = words(name);
    let has = |list: &[&str]| words.iter().any(|w| list.contains(&w.as_str()));
    // `to_json_file`, `to_file`, `to_disk`: a conversion to a file.
    if words.first().is_some_and(|w| w == "to")
        && words.iter().any(|w| matches!(w.as_str(), "file" | "disk"))
    {
        return Some(Danger::FileSystem);
    }
    // Importers by their words (`_import_string_logic`,
    // `_fa4_import_module`, `get_importable`).
    if has(&["import", "imports", "importer", "importable"]) {
        return Some(Danger::Import);
    }
    // Functions made from code text (`_convert_guards_code_to_fn`,
    // `source_to_function`), and annotations resolved from strings
    // (`resolve_annotations`, `get_type_hints`): evaluated.
    if (has(&["code", "source", "src"]) && has(&["fn", "func", "function", "callable"]))
        || (has(&["annotation", "annotations", "hints", "forward"])
            && has(&["resolve", "get", "eval", "evaluate", "update"]))
    {
        return Some(Danger::CodeExecution);
    }
    // `open`, and readers of files by their words (`load_from_file`,
    // `read_file`, `open_files`): they open the path they are given.
    if name == "open" || (has(&["file", "files"]) && has(&["load", "read", "open"])) {
        return Some(Danger::FileSystem);
    }
    // A bare `load` or `loads`, and loaders of state, checkpoints, bytes,
    // modules or libraries (`load_state_dict`, `_load_state`,
    // `load_str_bytes`, `load_by_path`, `_preload_lib`): deserializers,
    // which unpickle or run what they are given.
    let loads = has(&["load", "loads", "preload"]);
    if loads
        && (words.len() == 1
            || has(&[
                "state",
                "checkpoint",
                "bytes",
                "str",
                "path",
                "module",
                "source",
                "compiled",
                "dynamic",
                "package",
                "lib",
                "library",
                "pickle",
                "artifact",
                "baseline",
                "weights",
                "model",
                "hparams",
            ]))
    {
        return Some(Danger::CodeExecution);
    }
    [
        (PROCESS, Danger::Process),
        (CODE, Danger::CodeExecution),
        (NETWORK, Danger::Network),
        (FILES, Danger::FileSystem),
    ]
    .into_iter()
    .find_map(|(list, danger)| has(list).then_some(danger))
}

/// What calling method `name` of an object does: the file-system methods
/// of paths, arrays, tensors and files (`touch`, `write_text`, `mkdir`,
/// `symlink_to`, `open`, `tofile`, `dump`...), else what the words of its
/// name say ([`dangerous_when_called`]); `None` for anything else (still
/// an unknown call: the file chose the method and its arguments).
pub(crate) fn dangerous_method(name: &str) -> Option<Danger> {
    const FILES: &[&str] = &[
        "touch",
        "write_text",
        "write_bytes",
        "mkdir",
        "symlink_to",
        "hardlink_to",
        "link_to",
        "open",
        "unlink",
        "rename",
        "replace",
        "rmdir",
        "chmod",
        "lchmod",
        "tofile",
        "dump",
        "to_csv",
        "to_pickle",
        "to_json",
        "to_parquet",
    ];
    if FILES.contains(&name) {
        return Some(Danger::FileSystem);
    }
    // Methods that import or execute a module or file: importlib's
    // loaders (`load_module`, `exec_module`), optparse's values
    // (`read_module`, `read_file` execute what they read).
    if matches!(name, "load_module" | "exec_module" | "read_module") {
        return Some(Danger::Import);
    }
    dangerous_when_called(name)
}

/// The words of an identifier, lower-cased: split at `_`, `.` and digits,
/// and where case changes (`UnixStreamServer`: unix, stream, server;
/// `HTTPServer`: http, server).
pub(crate) fn words(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in name.split(|c: char| c == '_' || c == '.' || c.is_ascii_digit()) {
        let chars: Vec<char> = part.chars().collect();
        let mut word = String::new();
        for (i, &c) in chars.iter().enumerate() {
            let prev = i.checked_sub(1).and_then(|j| chars.get(j)).copied();
            let next = chars.get(i + 1).copied();
            let boundary = c.is_uppercase()
                && (prev.is_some_and(char::is_lowercase)
                    || (prev.is_some_and(char::is_uppercase)
                        && next.is_some_and(char::is_lowercase)));
            if boundary && !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            word.extend(c.to_lowercase());
        }
        if !word.is_empty() {
            out.push(word);
        }
    }
    out
}

/// A module of a library's tests: a submodule of CPython's `test`
/// package, or a module under a package's `tests` (`test`, `conftest`,
/// `test_*`, `_test*`, `*_test`, `*_tests`) below its top level. A
/// model's own `test.py` (the top-level `test`) is not one.
fn test_module(module: &str) -> bool {
    if module.starts_with("test.") {
        return true;
    }
    module.split('.').skip(1).any(|m| {
        matches!(m, "test" | "tests" | "conftest")
            || m.starts_with("test_")
            || m.starts_with("_test")
            || m.ends_with("_test")
            || m.ends_with("_tests")
    })
}

/// A builtin that runs code, opens files, imports, or reaches any object.
fn dangerous_builtin(name: &str) -> Option<Danger> {
    use Danger::*;
    match name {
        "eval" | "exec" | "compile" | "breakpoint" | "input" | "execfile" => Some(CodeExecution),
        "open" | "file" => Some(FileSystem),
        "__import__" | "reload" => Some(Import),
        // `site`'s interactive helpers: `help` runs pydoc (which imports
        // what it is asked about), the others read the licence files when
        // printed or called; `exit` and `quit` end the process.
        "help" => Some(Import),
        "license" | "credits" | "copyright" => Some(FileSystem),
        "exit" | "quit" => Some(Process),
        "getattr" | "setattr" | "delattr" | "globals" | "locals" | "vars" | "apply"
        | "__build_class__" => Some(Gadget),
        _ => None,
    }
}

/// Single callables of otherwise harmless modules (torch's and numpy's
/// loaders, numpy's file functions, function and code constructors), and
/// `torch.jit`, whose TorchScript helpers alone are harmless: `Some`
/// with the verdict when the name decides it, `None` to go on by module.
fn dangerous_by_name(module: &str, name: &str) -> Option<Option<Danger>> {
    use Danger::*;
    if (matches!(module, "torch" | "torch.serialization")
        && matches!(name, "load" | "_load" | "_legacy_load"))
        || (module == "torch.storage" && name == "_load_from_bytes")
        // A datapipe's serialization wrapper unpickles (or undills) the
        // bytes its state holds.
        || (module == "torch.utils.data.datapipes.datapipe"
            && name.ends_with("DataPipeSerializationWrapper"))
        || (module == "numpy" && matches!(name, "load" | "loads"))
    {
        return Some(Some(CodeExecution));
    }
    if module == "numpy"
        && matches!(
            name,
            "fromfile"
                | "memmap"
                | "save"
                | "savez"
                | "savez_compressed"
                | "savetxt"
                | "loadtxt"
                | "genfromtxt"
        )
    {
        return Some(Some(FileSystem));
    }
    // Writers of files by effect: torch's and safetensors' savers,
    // Lightning's atomic save (each writes or replaces the path it is
    // given).
    if (matches!(module, "torch" | "torch.serialization")
        && matches!(name, "save" | "_save" | "_legacy_save"))
        || (under(module, "safetensors") && matches!(name, "save_file" | "save_model"))
        || ((under(module, "lightning")
            || under(module, "lightning_fabric")
            || under(module, "pytorch_lightning"))
            && ((module.ends_with("cloud_io") && matches!(name, "_atomic_save" | "atomic_save"))
                || name.starts_with("save")
                // Loggers and their writers create their directories.
                || module.split('.').any(|m| m == "loggers")))
    {
        return Some(Some(FileSystem));
    }
    // Strings evaluated as code: YAML's loaders that build any object,
    // sympy's parsers (they eval).
    if (under(module, "yaml")
        && matches!(
            name,
            "load" | "load_all" | "unsafe_load" | "unsafe_load_all" | "full_load" | "full_load_all"
        ))
        || (under(module, "sympy") && matches!(name, "sympify" | "parse_expr" | "S"))
        // pydantic evaluates a type given as a string (a forward
        // reference) when it builds a validator for it.
        || (under(module, "pydantic")
            && matches!(name, "TypeAdapter" | "parse_obj_as" | "create_model"))
    {
        return Some(Some(CodeExecution));
    }
    // Annotations given as strings are evaluated.
    if (module == "typing" && matches!(name, "get_type_hints" | "_eval_type"))
        || (module == "inspect" && name == "get_annotations")
    {
        return Some(Some(CodeExecution));
    }
    // Callables run later: by a thread, or when an object is collected.
    if (module == "threading" && matches!(name, "Thread" | "Timer" | "_start_new_thread"))
        || (module == "_thread"
            && matches!(
                name,
                "start_new_thread" | "start_new" | "start_joinable_thread"
            ))
        || (module == "weakref" && name == "finalize")
    {
        return Some(Some(CodeExecution));
    }
    if (module == "codecs" && name == "open")
        || (module == "logging"
            && matches!(name, "FileHandler" | "WatchedFileHandler" | "basicConfig"))
        || (module == "torch" && name == "from_file")
        || (module == "torch._C" && matches!(name, "PyTorchFileWriter" | "PyTorchFileReader"))
        || (module == "torch.serialization" && name.starts_with("_open"))
    {
        return Some(Some(FileSystem));
    }
    if module == "inspect" && matches!(name, "getattr_static" | "getmembers" | "getmembers_static")
    {
        return Some(Some(Gadget));
    }
    // dataclasses builds methods from source text (`_create_fn` execs it).
    if module == "dataclasses" && matches!(name, "_create_fn" | "_exec" | "_FuncBuilder") {
        return Some(Some(CodeExecution));
    }
    // Calls an attribute of its state when collected (`_free_weak_ref`).
    if module == "torch.multiprocessing.reductions" && name == "StorageWeakRef" {
        return Some(Some(Gadget));
    }
    // torch's process starters, and its rebuilds of storages shared
    // between processes (they open the descriptors and shared memory the
    // arguments name).
    if under(module, "torch.multiprocessing") {
        return Some(Some(Process));
    }
    if let Some(danger) = distributed(module, name) {
        return Some(danger);
    }
    // Single callables a survey of the installed packages found: native
    // libraries loaded by path (pluggable allocators, torch's preload of
    // CUDA libraries), a snapshot's stack traces unpickled, modules
    // imported by name (torch's `_type`, pytree's enum hook and
    // defaultdict decoder, warnings' option parser, numpy's `info` and
    // `lookfor`), files written or opened (argparse's `FileType`,
    // nvprof traces read through sqlite, which creates the file).
    if name.ends_with("PluggableAllocator")
        || (module == "torch" && matches!(name, "_preload_cuda_lib" | "_preload_cuda_deps"))
        || (module == "torch._higher_order_ops.invoke_leaf_function"
            && name == "_resolve_mutated_flat_indices")
        || (module == "transformers.modeling_utils" && name == "_get_dtype")
        || (module == "torch._utils" && name == "_augment_memory_snapshot_stack_traces")
    {
        return Some(Some(CodeExecution));
    }
    if (module == "torch._utils" && name == "_type")
        || (module == "torch.utils._pytree"
            && matches!(name, "enum_object_hook" | "_defaultdict_deserialize"))
        || (module == "warnings" && name == "_setoption")
        || (module == "numpy" && matches!(name, "info" | "lookfor"))
    {
        return Some(Some(Import));
    }
    if (module == "argparse" && name == "FileType")
        || (module == "torch.autograd.profiler"
            && matches!(
                name,
                "load_nvprof" | "parse_nvprof_trace" | "_parse_nvprof_trace"
            ))
        || (under(module, "lightning_fabric") && name == "is_shared_filesystem")
        || name == "WeakFileLock"
    {
        return Some(Some(FileSystem));
    }
    // Code made from text or parts: dataclasses' method builders,
    // inspect's signatures parsed from strings (evaluated), closures and
    // functions rebuilt from their parts.
    if (module == "dataclasses"
        && matches!(
            name,
            "_init_fn" | "_repr_fn" | "_cmp_fn" | "_hash_fn" | "_frozen_get_del_attr"
        ))
        || (module == "inspect" && name.starts_with("_signature_from"))
        || (module == "torch.nn.attention.flex_attention" && name == "_reconstruct_closure_fn")
        || (under(module, "networkx") && name == "copyfunc")
        || (under(module, "torch.library") && name == "infer_schema")
    {
        return Some(Some(CodeExecution));
    }
    // Imports by name: torch's log settings (module names found by spec,
    // which imports their parents), custom ops' autograd functions,
    // flash-attention registrations, the backends of a pipeline.
    if (module == "torch._logging._internal"
        && matches!(
            name,
            "set_logs" | "_parse_log_settings" | "_is_valid_module" | "_get_module_and_submodules"
        ))
        || (module == "torch.export.custom_ops"
            && name == "_call_custom_autograd_function_in_pre_dispatch")
        || (under(module, "torch.nn.attention") && name.starts_with("register_flash_attention"))
        || (under(module, "transformers.pipelines") && matches!(name, "pipeline" | "_resolve_impl"))
        // transformers' lazy tables (`_LazyAutoMapping`, `_LazyConfigMapping`,
        // `_LazyAutoProcessorMapping`): a lookup imports the module the
        // table names, a table a file can set.
        || (under(module, "transformers") && name.starts_with("_Lazy") && name.ends_with("Mapping"))
        || (under(module, "lightning_fabric.accelerators") && name == "call_register_accelerators")
        || (module == "huggingface_hub" && name == "_attach")
    {
        return Some(Some(Import));
    }
    // A pipeline's data formats read the file they name when iterated
    // and write theirs when saved.
    if under(module, "transformers.pipelines") && name.ends_with("PipelineDataFormat") {
        return Some(Some(FileSystem));
    }
    // transformers' resolution of a model's files on the Hub.
    if (module == "transformers.modeling_utils" && name == "_get_resolved_checkpoint_files")
        || (module == "transformers.tokenization_utils_base" && name == "load_vocab_and_merges")
        || (under(module, "transformers.models") && name == "load_metadata")
    {
        return Some(Some(Network));
    }
    // Programs: GPU statistics by nvidia-smi, a metric's timeout in a
    // process.
    if ((under(module, "pytorch_lightning") || under(module, "lightning"))
        && name == "get_nvidia_gpu_stats")
        || (under(module, "torchmetrics") && name == "_try_proceed_with_timeout")
    {
        return Some(Some(Process));
    }
    // PyYAML's loaders that build any Python object (`!!python/object/apply`
    // runs a callable), by class and by their methods (`Loader.get_data`,
    // called on an instance the file made).
    if under(module, "yaml")
        && matches!(
            name.split('.').next().unwrap_or(name),
            "Loader"
                | "UnsafeLoader"
                | "FullLoader"
                | "CLoader"
                | "CUnsafeLoader"
                | "CFullLoader"
                | "Constructor"
                | "UnsafeConstructor"
                | "FullConstructor"
        )
    {
        return Some(Some(CodeExecution));
    }
    // attrs builds its classes' methods from source text.
    if module == "attr._make" && (name.starts_with("_add_") || name.starts_with("_make_")) {
        return Some(Some(CodeExecution));
    }
    if (under(module, "pygments") && name.starts_with("_load_"))
        || (module == "encodings" && name == "search_function")
        || (module == "transformers.utils.generic" && name == "maybe_replace_from_package")
    {
        return Some(Some(Import));
    }
    // pygments' loaders of a lexer or formatter from a file execute it;
    // mpmath's `identify` (re-exported) evaluates its constants.
    if (under(module, "pygments") && name.starts_with("load_") && name.ends_with("_from_file"))
        || (under(module, "mpmath") && name == "identify")
    {
        return Some(Some(CodeExecution));
    }
    // Writers of files by effect, from torch and the libraries beside it:
    // the profiler's trace handler (writes a trace into the folder it is
    // given), hipify (rewrites a source tree), torch's logging set-up
    // (adds file handlers), PIL's PDF writer, file locks (create the
    // lock file).
    if (matches!(module, "torch.profiler" | "torch.profiler.profiler")
        && name == "tensorboard_trace_handler")
        || (under(module, "torch.utils.hipify") && name == "hipify")
        || (module == "torch._logging._internal" && name == "_init_logs")
        || (under(module, "PIL.PdfParser") && name == "PdfParser")
        || under(module, "filelock")
    {
        return Some(Some(FileSystem));
    }
    // triton's compiler driver runs the C compiler.
    if under(module, "triton.runtime.build") && matches!(name, "_build" | "build") {
        return Some(Some(Process));
    }
    // Registers a callable Python calls later (an encoding error handler).
    if matches!(module, "codecs" | "_codecs") && matches!(name, "register_error" | "register") {
        return Some(Some(Gadget));
    }
    // Remove a directory their state names when collected: numpy's
    // `DataSource` (and its `Repository`) when `_istmpdest` is set, with
    // `_destpath`; transformers' `NeptuneCallback`, its
    // `_volatile_checkpoints_dir`. Nothing else in the file need be
    // callable: the class's own `__del__` does it.
    if (matches!(
        module,
        "numpy.lib._datasource" | "numpy.lib.npyio" | "numpy.lib._npyio_impl" | "numpy"
    ) && matches!(name, "DataSource" | "Repository"))
        || (under(module, "transformers.integrations") && name == "NeptuneCallback")
    {
        return Some(Some(FileSystem));
    }
    // A data loader with workers starts processes that run its collate and
    // worker functions.
    if (under(module, "torch.utils.data") && name == "DataLoader")
        || under(module, "torch.utils.data.dataloader")
    {
        return Some(Some(Process));
    }
    if module == "uuid" && name.starts_with('_') {
        return Some(Some(Process));
    }
    if module == "types"
        && matches!(
            name,
            "FunctionType" | "CodeType" | "LambdaType" | "MethodType"
        )
    {
        return Some(Some(CodeExecution));
    }
    if module == "torch.jit._pickle" && TORCHSCRIPT_HELPERS.contains(&name) {
        return Some(None);
    }
    if module.starts_with("numpy.testing")
        || (module == "torch.jit" || module.starts_with("torch.jit.") || under(module, "torch.hub"))
    {
        return Some(Some(CodeExecution));
    }
    None
}

/// torch.distributed's own namespace and its process groups' modules:
/// stores (a `FileStore` creates its file, a `TCPStore` listens), process
/// groups and rendezvous reach the network; the object collectives
/// (`broadcast_object_list`, `_tensor_to_object`...) unpickle the bytes a
/// tensor holds; `breakpoint` starts a debugger. Their errors, option
/// structs and names of backends and operations are data (`Some(None)`,
/// listed so by `known_data`). `None` for other modules: the tensor,
/// mesh and checkpoint-metadata types under `torch.distributed` are
/// classes a checkpoint holds.
fn distributed(module: &str, name: &str) -> Option<Option<Danger>> {
    if !matches!(
        module,
        "torch.distributed" | "torch.distributed.distributed_c10d" | "torch._C._distributed_c10d"
    ) {
        return None;
    }
    let words = words(name);
    if words.iter().any(|w| w == "object") {
        return Some(Some(Danger::CodeExecution));
    }
    if name == "breakpoint" || name == "_make_distributed_pdb" {
        return Some(Some(Danger::CodeExecution));
    }
    let data = name.ends_with("Error")
        || name.ends_with("Options")
        || matches!(
            name,
            "Backend"
                | "BackendConfig"
                | "ReduceOp"
                | "_reduce_op"
                | "DebugLevel"
                | "GroupMember"
                | "group"
                | "BuiltinCommHookType"
                | "is_available"
        );
    Some((!data).then_some(Danger::Network))
}

/// The call-anything gadgets of `operator` and `functools`.
fn dangerous_gadget(module: &str, name: &str) -> Option<Danger> {
    // Wrappers that call what they wrap when called (a cache, a
    // vectorized function) or apply it along an array.
    let gadget = (module == "operator"
        && matches!(name, "attrgetter" | "methodcaller" | "itemgetter" | "call"))
        || (module == "functools"
            && matches!(
                name,
                "partial"
                    | "reduce"
                    | "partialmethod"
                    | "lru_cache"
                    | "cache"
                    | "cached_property"
                    | "singledispatch"
                    | "update_wrapper"
                    | "wraps"
            ))
        || (module == "numpy"
            && matches!(
                name,
                "vectorize" | "frompyfunc" | "apply_along_axis" | "apply_over_axes" | "piecewise"
            ))
        // They call a function they are given (a predicate, a key).
        || (module == "itertools"
            && matches!(
                name,
                "takewhile" | "dropwhile" | "filterfalse" | "groupby" | "starmap" | "accumulate"
            ))
        || (module == "heapq" && matches!(name, "nsmallest" | "nlargest" | "merge"));
    gadget.then_some(Danger::Gadget)
}

/// numpy's dtype classes (`numpy.dtypes`, numpy >= 1.25).
const NUMPY_DTYPE_CLASSES: &[&str] = &[
    "BoolDType",
    "Int8DType",
    "UInt8DType",
    "Int16DType",
    "UInt16DType",
    "Int32DType",
    "UInt32DType",
    "Int64DType",
    "UInt64DType",
    "ByteDType",
    "UByteDType",
    "ShortDType",
    "UShortDType",
    "IntDType",
    "UIntDType",
    "LongDType",
    "ULongDType",
    "LongLongDType",
    "ULongLongDType",
    "Float16DType",
    "Float32DType",
    "Float64DType",
    "LongDoubleDType",
    "Complex64DType",
    "Complex128DType",
    "CLongDoubleDType",
    "BytesDType",
    "StrDType",
    "VoidDType",
    "ObjectDType",
    "DateTime64DType",
    "TimeDelta64DType",
    "StringDType",
];

/// The helpers torch writes into every TorchScript archive's pickles:
/// they rebuild lists and restore type tags, nothing else.
const TORCHSCRIPT_HELPERS: &[&str] = &[
    "build_tensorlist",
    "build_intlist",
    "build_doublelist",
    "build_boollist",
    "build_tensor_from_id",
    "restore_type_tag",
];

/// Builtins that only compute on the values given to them (a callable
/// passed to one is a global of its own, judged by itself).
const PURE_BUILTINS: &[&str] = &[
    "dict",
    "list",
    "tuple",
    "set",
    "frozenset",
    "bytearray",
    "bytes",
    "str",
    "int",
    "float",
    "complex",
    "bool",
    "slice",
    "range",
    "object",
    "len",
    "abs",
    "min",
    "max",
    "sum",
    "round",
    "divmod",
    "pow",
    "sorted",
    "reversed",
    "enumerate",
    "zip",
    "map",
    "filter",
    "iter",
    "next",
    "any",
    "all",
    "repr",
    "format",
    "ord",
    "chr",
    "hash",
    "isinstance",
    "issubclass",
    "type",
    "NotImplemented",
    "Ellipsis",
];

/// Enum classes that training libraries pickle into ordinary checkpoints
/// (`training_args.bin`, Lightning's trainer state, torchvision transforms
/// kept with a model): an enum member pickles as a call of its class with
/// its value, which only looks the member up. Exact names only: from the
/// bytes alone a call of an enum class cannot be told from a call of any
/// other callable. Clean only when called with one constant (see
/// [`known_enum`]); any other call of one is an unknown call.
const KNOWN_ENUMS: &[(&str, &[&str])] = &[
    ("torchvision.transforms.functional", &["InterpolationMode"]),
    ("torchvision.transforms", &["InterpolationMode"]),
    (
        "torch.distributed.fsdp.api",
        &["ShardingStrategy", "BackwardPrefetch", "StateDictType"],
    ),
    ("peft.utils.peft_types", &["PeftType", "TaskType"]),
    (
        "torch.distributed.checkpoint.metadata",
        &["_MEM_FORMAT_ENCODING"],
    ),
    (
        "transformers.generation.configuration_utils",
        &["GenerationMode"],
    ),
    ("re", &["RegexFlag"]),
    ("http", &["HTTPStatus", "HTTPMethod"]),
    (
        "transformers.trainer_utils",
        &[
            "FSDPOption",
            "HPSearchBackend",
            "HubStrategy",
            "IntervalStrategy",
            "SaveStrategy",
            "SchedulerType",
            "EvaluationStrategy",
        ],
    ),
    (
        "transformers.training_args",
        &["OptimizerNames", "ParallelMode"],
    ),
    ("transformers.debug_utils", &["DebugOption"]),
    (
        "transformers.utils.generic",
        &["PaddingStrategy", "TensorType"],
    ),
    (
        "accelerate.utils.dataclasses",
        &[
            "ComputeEnvironment",
            "CustomDtype",
            "DDPCommunicationHookType",
            "DistributedType",
            "DynamoBackend",
            "FP8BackendType",
            "LoggerType",
            "PrecisionType",
            "RNGType",
            "SageMakerDistributedType",
        ],
    ),
    (
        "lightning.pytorch.trainer.states",
        &["TrainerStatus", "TrainerFn", "RunningStage"],
    ),
    (
        "pytorch_lightning.trainer.states",
        &["TrainerStatus", "TrainerFn", "RunningStage"],
    ),
    // timm's layers keep their tensor layout as a member (whole models).
    ("timm.layers.format", &["Format"]),
];

/// A transformers model output's class name: a class's (capitalized),
/// with `Output` a word of it (`BaseModelOutput`, `CausalLMOutputWithPast`,
/// `BaseModelOutputWithPoolingAndCrossAttentions`). transformers' functions
/// with the word (`install_all_output_capturing_hooks`,
/// `_register_model_output_pytree_node`) are not.
pub(crate) fn model_output(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_uppercase()) && words(name).iter().any(|w| w == "output")
}

/// Whether `module.name` is one of [`KNOWN_ENUMS`].
pub(crate) fn known_enum(module: &str, name: &str) -> bool {
    KNOWN_ENUMS
        .iter()
        .any(|(m, names)| *m == module && names.contains(&name))
}

/// Callables that are plain data only for some arguments: an enum class
/// of [`KNOWN_ENUMS`] given one constant, `operator.getitem` given a
/// container the pickle built and a constant key. The scanner decides
/// each call; a call outside those arguments is an unknown call.
pub(crate) fn conditional_data(module: &str, name: &str) -> bool {
    known_enum(module, name) || matches!((module, name), ("operator" | "_operator", "getitem"))
}

fn known_data(module: &str, name: &str) -> bool {
    if conditional_data(module, name) {
        return true;
    }
    match module {
        "builtins" | "__builtin__" => PURE_BUILTINS.contains(&name),
        // A `time.struct_time` pickles as the type called with its fields.
        "time" => name == "struct_time",
        "numpy" => matches!(name, "dtype" | "ndarray"),
        "numpy.core.multiarray" | "numpy._core.multiarray" => {
            matches!(name, "scalar" | "_reconstruct")
        }
        // Arrays pickled at protocol 5 (out-of-band-capable buffers), and
        // masked arrays (their class and base class are instantiated: see
        // the scanner).
        "numpy.core.numeric" | "numpy._core.numeric" => name == "_frombuffer",
        "numpy.ma.core" => name == "_mareconstruct",
        "numpy.dtypes" => NUMPY_DTYPE_CLASSES.contains(&name),
        // torch.distributed's errors, option structs and the names of its
        // backends and operations (see `distributed`).
        "torch.distributed"
        | "torch.distributed.distributed_c10d"
        | "torch._C._distributed_c10d" => distributed(module, name) == Some(None),
        "argparse" => name == "Namespace",
        // Functions of numbers.
        "math" | "cmath" => !name.starts_with('_') && !attribute_path(name),
        "collections" => matches!(
            name,
            "OrderedDict"
                | "Counter"
                | "defaultdict"
                | "deque"
                | "namedtuple"
                // Pickled as made without `__init__`, their state a dict
                // of the mappings, items or text they hold.
                | "ChainMap"
                | "UserDict"
                | "UserList"
                | "UserString"
        ),
        // `list[int]` pickles as `types.GenericAlias(list, (int,))`.
        "types" => matches!(name, "SimpleNamespace" | "GenericAlias"),
        // An array pickles as `array._array_reconstructor(array, typecode,
        // machine format, bytes)` (protocol 3 and above) or
        // `array.array(typecode, list)`.
        "array" => matches!(name, "array" | "_array_reconstructor"),
        // Addresses pickle as their class called with their text.
        "ipaddress" => matches!(
            name,
            "IPv4Address"
                | "IPv6Address"
                | "IPv4Network"
                | "IPv6Network"
                | "IPv4Interface"
                | "IPv6Interface"
        ),
        // A signature pickles as its classes called with names, kinds and
        // defaults.
        "inspect" => matches!(
            name,
            "Signature" | "Parameter" | "_ParameterKind" | "_empty"
        ),
        // Python's own generator: `Random()`, then BUILD with its state
        // (a tuple of numbers).
        "random" => name == "Random",
        // An aware datetime's zone pickles as
        // `getattr(ZoneInfo, "_unpickle")(key, 1)`: the zone looked up by
        // its name, read from the tz database (see the scanner).
        "zoneinfo" | "zoneinfo._zoneinfo" => matches!(name, "ZoneInfo" | "ZoneInfo._unpickle"),
        // A compiled pattern pickles as `re._compile(pattern, flags)`.
        "re" => name == "_compile",
        // numpy's random generators: the constructors call the bit
        // generator class or constructor they are given (see the scanner),
        // and numpy's own bit generators.
        "numpy.random._pickle" => matches!(
            name,
            "__randomstate_ctor" | "__generator_ctor" | "__bit_generator_ctor"
        ),
        "numpy.random.bit_generator" => {
            matches!(name, "SeedSequence" | "__pyx_unpickle_SeedSequence")
        }
        "numpy.random._mt19937" => name == "MT19937",
        "numpy.random._pcg64" => matches!(name, "PCG64" | "PCG64DXSM"),
        "numpy.random._philox" => name == "Philox",
        "numpy.random._sfc64" => name == "SFC64",
        "copyreg" | "copy_reg" => matches!(name, "_reconstructor" | "__newobj__" | "__newobj_ex__"),
        "datetime" => matches!(
            name,
            "datetime" | "date" | "time" | "timedelta" | "timezone"
        ),
        "decimal" => name == "Decimal",
        "fractions" => name == "Fraction",
        "uuid" => name == "UUID",
        "pathlib" => matches!(
            name,
            "Path" | "PurePath" | "PosixPath" | "WindowsPath" | "PurePosixPath" | "PureWindowsPath"
        ),
        "torch.jit._pickle" => TORCHSCRIPT_HELPERS.contains(&name),
        // torch's functional ops and initializers, and the result types of
        // torch's functions: the names torch defines as such, not the
        // modules' helpers (see `torch_data`).
        "torch.nn.functional" | "torch.nn.init" | "torch.return_types" => {
            torch_data::torch_data(module, name)
        }
        // A random generator, pickled as its device and its state.
        "torch._C" | "torch" => name == "Generator",
        // diffusers' configs: an OrderedDict that refuses changes.
        "diffusers.configuration_utils" => name == "FrozenDict",
        // A lazy module's parameters and buffers, and a jagged nested
        // tensor's rebuild: torch's own tensor machinery.
        "torch.nn.parameter" => matches!(name, "UninitializedParameter" | "UninitializedBuffer"),
        "torch.nested._internal.nested_tensor" => name == "_rebuild_njt",
        // numpy 2's variable-width strings: the dtype's arguments.
        "numpy._core._internal" | "numpy.core._internal" => {
            name == "_convert_to_stringdtype_kwargs"
        }
        // transformers' model outputs: dataclasses of tensors, made from
        // their fields.
        _ if module.starts_with("transformers.") && model_output(name) => !attribute_path(name),
        _ => false,
    }
}

/// For a class of data whose instances hold the user's values as
/// attributes (a namespace's parsed arguments, a parser's `func`; a
/// signature's annotations and defaults), the names of its own methods
/// that an attribute can shadow: a callable under any other name is the
/// user's value. `None` for other classes, whose instances keep no
/// callables.
pub(crate) fn user_valued(module: &str, name: &str) -> Option<&'static [&'static str]> {
    match (module, name) {
        // `_AttributeHolder.__repr__` calls these two; and a namespace
        // where torch takes it for a tensor (a distribution's parameter,
        // which its repr measures) has these three called.
        ("argparse", "Namespace") => Some(&["_get_args", "_get_kwargs", "numel", "size", "dim"]),
        ("types", "SimpleNamespace") => Some(&["numel", "size", "dim"]),
        // Slotted: a state sets only its slots, whatever they hold.
        ("inspect", "Signature" | "Parameter") => Some(&[]),
        _ => None,
    }
}

/// A name that reaches through attributes (`a.b.c`, which protocol 4's
/// STACK_GLOBAL resolves one attribute at a time) or a dunder
/// (`__builtins__`, `__globals__`): from any start, these reach anything.
fn attribute_path(name: &str) -> bool {
    name.contains('.') || (name.starts_with("__") && name.ends_with("__"))
}

/// `___torch_mangle_<n>`: TorchScript's name for the n-th redefinition of
/// a class in one archive (every traced module has them).
fn torch_mangle(segment: &str) -> bool {
    segment
        .strip_prefix("___torch_mangle_")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Classify `module.name`. The allowed and data classes are exact
/// `module.name` pairs; any attribute path or dunder name outside them is
/// a gadget, whatever module it starts from.
pub fn classify(module: &str, name: &str) -> GlobalClass {
    let class = classify_as_found(module, name);
    if class != GlobalClass::Unknown {
        return class;
    }
    // A package's attribute that may be a module of its own: `torch`
    // `_dynamo` is `torch._dynamo`, imported by torch's lazy
    // `__getattr__` (numpy's imports `numpy.testing` and `numpy.f2py`
    // so). A module the roots judge dangerous by its path is as
    // dangerous reached this way; a name known as it is stays what it is,
    // and a capitalized one is a class, not a module.
    let plain = name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && !name.starts_with("__")
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if plain {
        let as_module = classify_as_found(&format!("{module}.{name}"), "");
        if matches!(as_module, GlobalClass::Dangerous(_)) {
            return as_module;
        }
    }
    class
}

/// Classify `module.name`, a module's implementation under another name
/// (`_operator` for `operator`, numpy's private `_impl` modules, a
/// package's vendored copy of another) as the public one when that one is
/// known.
fn classify_as_found(module: &str, name: &str) -> GlobalClass {
    for public in [public_module(module, name), vendored(module)]
        .into_iter()
        .flatten()
    {
        let known = classify_as_named(public, name);
        if known != GlobalClass::Unknown {
            return known;
        }
    }
    classify_as_named(module, name)
}

/// Classify `module.name` by the names as they are.
fn classify_as_named(module: &str, name: &str) -> GlobalClass {
    if let Some(d) = dangerous(module, name) {
        GlobalClass::Dangerous(d)
    } else if torch_allows(module, name) {
        GlobalClass::Tensor
    } else if known_data(module, name) {
        GlobalClass::Data
    } else if attribute_path(name)
        || module.split('.').any(|m| {
            m.starts_with("__")
                && m != "__main__"
                && m != "__builtin__"
                && m != "__future__"
                && m != "__torch__"
                && !(module.starts_with("__torch__.") && torch_mangle(m))
        })
    {
        GlobalClass::Dangerous(Danger::Gadget)
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
        assert_eq!(classify("time", "struct_time"), GlobalClass::Data);
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
        // By effect: writers of files, evaluators of strings, factories.
        for (m, n, d) in [
            ("torch", "save", Danger::FileSystem),
            ("torch.serialization", "_save", Danger::FileSystem),
            ("safetensors.torch", "save_file", Danger::FileSystem),
            (
                "lightning.fabric.utilities.cloud_io",
                "_atomic_save",
                Danger::FileSystem,
            ),
            (
                "pytorch_lightning.utilities.cloud_io",
                "atomic_save",
                Danger::FileSystem,
            ),
            ("dbm", "open", Danger::FileSystem),
            ("yaml", "unsafe_load", Danger::CodeExecution),
            ("yaml", "load", Danger::CodeExecution),
            ("sympy", "sympify", Danger::CodeExecution),
            (
                "sympy.parsing.sympy_parser",
                "parse_expr",
                Danger::CodeExecution,
            ),
            ("logging.config", "dictConfig", Danger::CodeExecution),
        ] {
            assert_eq!(classify(m, n), GlobalClass::Dangerous(d), "{m}.{n}");
        }
        // Vendored copies are their originals; classes that act on what
        // their state names when iterated, printed or collected.
        for (m, n, d) in [
            ("typer._click.utils", "LazyFile", Danger::Process),
            ("pip._vendor.requests.api", "get", Danger::Network),
            ("somepkg._vendor.requests.api", "get", Danger::Network),
            ("a._vendor.b.vendor.shutil", "rmtree", Danger::FileSystem),
            (
                "torch.utils.data.datapipes.iter.fileopener",
                "FileOpenerIterDataPipe",
                Danger::FileSystem,
            ),
            (
                "lightning_utilities.core.imports",
                "RequirementCache",
                Danger::Import,
            ),
            (
                "lightning_utilities.core.imports",
                "LazyModule",
                Danger::Import,
            ),
            (
                "torch.profiler.profiler",
                "ExecutionTraceObserver",
                Danger::FileSystem,
            ),
            ("torch.cuda.gds", "GdsFile", Danger::FileSystem),
            (
                "triton.runtime.cache",
                "FileCacheManager",
                Danger::CodeExecution,
            ),
            ("_sitebuiltins", "_Printer", Danger::FileSystem),
            ("asyncore", "file_wrapper", Danger::Network),
        ] {
            assert_eq!(classify(m, n), GlobalClass::Dangerous(d), "{m}.{n}");
        }
        assert_eq!(classify("mypkg.vendor", "Thing"), GlobalClass::Unknown);
        assert_eq!(classify("_click", "Thing"), GlobalClass::Unknown);
        // Their harmless neighbours stay as they were.
        assert_eq!(classify("yaml", "safe_load"), GlobalClass::Unknown);
        assert_eq!(
            classify("safetensors.torch", "load_file"),
            GlobalClass::Unknown
        );
        assert_ne!(
            classify("torch", "Size"),
            GlobalClass::Dangerous(Danger::FileSystem)
        );
        // Exact names: attribute paths from allowed starts are gadgets.
        for (m, n) in [
            ("torch.storage", "TypedStorage.__init__.__builtins__.get"),
            ("numpy.dtypes", "_add_dtype_helper.__builtins__.get"),
            ("torch", "FloatStorage.__init__"),
            ("collections", "OrderedDict.__init__.__globals__"),
            ("builtins", "__loader__"),
        ] {
            assert_eq!(
                classify(m, n),
                GlobalClass::Dangerous(Danger::Gadget),
                "{m}.{n}"
            );
        }
        // TorchScript's mangled class names are its own, not dunder paths;
        // the same segment outside `__torch__` is still a gadget.
        assert_eq!(
            classify(
                "__torch__.torch.ao.nn.quantized.modules.linear.___torch_mangle_12",
                "LinearPackedParams"
            ),
            GlobalClass::Unknown
        );
        for m in [
            "collections.___torch_mangle_1",
            "__torch__.___torch_mangle_",
            "__torch__.___torch_mangle_1x",
        ] {
            assert_eq!(
                classify(m, "X"),
                GlobalClass::Dangerous(Danger::Gadget),
                "{m}"
            );
        }
        // `__future__` is a plain module (its names are feature records);
        // an attribute path from it is still a gadget.
        assert_eq!(classify("__future__", "annotations"), GlobalClass::Unknown);
        assert_eq!(
            classify("__future__", "_ssl.RAND_bytes"),
            GlobalClass::Dangerous(Danger::Gadget)
        );
        assert_eq!(classify("pathlib", "EvilPath"), GlobalClass::Unknown);
        assert_eq!(classify("numpy.dtypes", "Float64DType"), GlobalClass::Data);
        assert_eq!(classify("numpy.dtypes.evil", "X"), GlobalClass::Unknown);
        assert_eq!(classify("builtins", "len"), GlobalClass::Data);
        assert_eq!(
            classify("torch.jit._pickle", "build_tensorlist"),
            GlobalClass::Data
        );
        assert_eq!(
            classify("torch.jit", "load"),
            GlobalClass::Dangerous(Danger::CodeExecution)
        );
        // 2025-2026 write-ups: installers, torch's own exec/eval wrappers,
        // numpy's pickle reader, private stdlib modules.
        for (m, n, d) in [
            ("ensurepip", "_run_pip", Danger::CodeExecution),
            ("torch.utils.collect_env", "run", Danger::Process),
            (
                "torch.fx.graph_module",
                "reduce_graph_module",
                Danger::CodeExecution,
            ),
            (
                "torch.fx.experimental.symbolic_shapes",
                "ShapeEnv",
                Danger::CodeExecution,
            ),
            (
                "torch.utils._config_module",
                "ConfigModule",
                Danger::CodeExecution,
            ),
            ("torch.serialization", "load", Danger::CodeExecution),
            ("numpy", "load", Danger::CodeExecution),
            ("numpy.lib.format", "read_array", Danger::CodeExecution),
            ("numpy", "fromfile", Danger::FileSystem),
            ("_ssl", "RAND_status", Danger::Network),
            ("uuid", "_get_command_stdout", Danger::Process),
        ] {
            assert_eq!(classify(m, n), GlobalClass::Dangerous(d), "{m}.{n}");
        }
        // What torch itself allows stays allowed.
        assert_eq!(
            classify("torch.serialization", "_get_layout"),
            GlobalClass::Tensor
        );
        assert_eq!(classify("types", "SimpleNamespace"), GlobalClass::Data);
        assert_eq!(
            classify("numpy.random._pickle", "__generator_ctor"),
            GlobalClass::Data
        );
        assert_eq!(
            classify("numpy.random._pickle", "__builtins__"),
            GlobalClass::Dangerous(Danger::Gadget)
        );
        assert_eq!(
            classify("transformers.trainer_utils", "IntervalStrategy"),
            GlobalClass::Data
        );
        assert_eq!(
            classify("transformers.trainer_utils", "IntervalStrategy.__call__"),
            GlobalClass::Dangerous(Danger::Gadget)
        );
        assert_eq!(
            classify("transformers.trainer_utils", "get_last_checkpoint"),
            GlobalClass::Unknown
        );
        assert_eq!(classify("uuid", "UUID"), GlobalClass::Data);
    }

    #[test]
    fn levels_are_ordered_and_named() {
        assert!(Level::Clean < Level::NeedsCode);
        assert!(Level::NeedsCode < Level::UnknownCall);
        assert!(Level::UnknownCall < Level::Ambiguous);
        assert!(Level::Ambiguous < Level::Dangerous);
        for l in Level::ALL {
            assert_eq!(Level::from_name(l.name()), Some(l));
        }
        assert_eq!(Level::from_name("unknown callable"), None);
        assert!(wrapper_class("functools", "partial"));
        assert!(!wrapper_class("functools", "reduce"));
    }
}
