//! Code a file can count on finding where checkpoints are loaded, beyond
//! Python's standard library: torch and the packages a machine that loads
//! checkpoints with torch, transformers or Lightning installs with them
//! (their dependencies, torch's own family, the Hub's libraries, the
//! installers). No checkpoint `torch.save` writes calls into them outside
//! what the scanner lists as data, so such a call is a payload's, not a
//! model's: a model's own code is its package or `__main__`.
//!
//! CPython's own test suite (`test`, and its extension modules) counts:
//! a Python built from source or installed from python.org or conda has
//! it, with servers, interpreters started on scripts and helpers that
//! re-export `subprocess.Popen` under its modules' names.
//!
//! Left out on purpose: the data stack (pandas, scipy, scikit-learn,
//! matplotlib, pyarrow), whose objects pickle as calls of their own
//! functions (`pandas._libs.internals._unpickle_block`), so that a call
//! into them is what their data looks like.

/// Top-level module names, sorted for a binary search.
const TOP_LEVEL: &[&str] = &[
    "_ctypes_test",
    "_distutils_hack",
    "_pytest",
    "_testbuffer",
    "_testcapi",
    "_testclinic",
    "_testimportmultiple",
    "_testinternalcapi",
    "_testmultiphase",
    "_testsinglephase",
    "_xxinterpchannels",
    "_xxsubinterpreters",
    "_xxtestfuzz",
    "_yaml",
    "accelerate",
    "aiohappyeyeballs",
    "aiohttp",
    "aiosignal",
    "annotated_doc",
    "annotated_types",
    "anyio",
    "attr",
    "attrs",
    "certifi",
    "charset_normalizer",
    "click",
    "cuda",
    "diffusers",
    "filelock",
    "frozenlist",
    "fsspec",
    "functorch",
    "h11",
    "hf_xet",
    "httpcore",
    "httpcore2",
    "httpx",
    "httpx2",
    "huggingface_hub",
    "idna",
    "iniconfig",
    "isympy",
    "jinja2",
    "lightning",
    "lightning_fabric",
    "lightning_utilities",
    "markdown_it",
    "markupsafe",
    "mdurl",
    "mpmath",
    "multidict",
    "networkx",
    "numpy",
    "nvidia",
    "packaging",
    "peft",
    "pip",
    "pkg_resources",
    "pluggy",
    "propcache",
    "psutil",
    "py",
    "pydantic",
    "pydantic_core",
    "pygments",
    "pytest",
    "pytorch_lightning",
    "regex",
    "requests",
    "rich",
    "safetensors",
    "setuptools",
    "shellingham",
    "six",
    "sympy",
    "test",
    "timm",
    "tokenizers",
    "torch",
    "torchaudio",
    "torchdata",
    "torchgen",
    "torchmetrics",
    "torchtext",
    "torchvision",
    "tqdm",
    "transformers",
    "triton",
    "truststore",
    "typer",
    "typing_extensions",
    "typing_inspection",
    "urllib3",
    "wheel",
    "xxlimited",
    "xxlimited_35",
    "xxsubtype",
    "yaml",
    "yarl",
];

/// Whether `module` is code every loading machine has: the standard
/// library or a package of [`TOP_LEVEL`].
pub(crate) fn shipped(module: &str) -> bool {
    let top = module.split('.').next().unwrap_or(module);
    super::stdlib::is_stdlib(top) || top == "__builtin__" || TOP_LEVEL.binary_search(&top).is_ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sorted_for_the_search() {
        assert!(super::TOP_LEVEL.windows(2).all(|w| w[0] < w[1]));
        assert!(super::shipped("torch.utils.file_baton"));
        assert!(super::shipped("os.path") && super::shipped("__builtin__"));
        assert!(super::shipped("pygments") && super::shipped("test.test_gzip"));
        assert!(!super::shipped("__main__") && !super::shipped("models.yolo"));
        assert!(!super::shipped("torchx") && !super::shipped("pandas.core.frame"));
    }
}
