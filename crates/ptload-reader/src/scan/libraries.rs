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

/// The packages whose objects make up models and their training state,
/// and hold callables as part of it (activations, norm layers, hooks,
/// collate functions, metric reductions): torch's family, the Hugging
/// Face libraries, Lightning and timm.
pub(crate) fn model_library(top: &str) -> bool {
    matches!(
        top,
        "torch"
            | "functorch"
            | "torchaudio"
            | "torchdata"
            | "torchgen"
            | "torchmetrics"
            | "torchtext"
            | "torchvision"
            | "accelerate"
            | "diffusers"
            | "huggingface_hub"
            | "peft"
            | "safetensors"
            | "tokenizers"
            | "transformers"
            | "lightning"
            | "lightning_fabric"
            | "lightning_utilities"
            | "pytorch_lightning"
            | "timm"
    )
}

/// Whether `module` is `root` or under it.
fn under(module: &str, root: &str) -> bool {
    module
        .strip_prefix(root)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// Classes of torch whose objects call the callables they hold, of
/// another package, when printed, measured, iterated or hashed: torch's
/// data pipes (and torchdata's), whose iteration, indexing and printing
/// call the functions and hooks they hold, and every class of torch
/// outside the parts models are made of (modules, optimizers, tensors,
/// distributions, datasets): its tools (a profiler's results, a lazy log
/// string that calls `func(*args)` when printed, a device mesh whose
/// hash calls its own `_hash_key`, a weak-key dictionary), whose
/// objects hold no other package's functions.
pub(crate) fn calls_what_it_holds(module: &str) -> bool {
    const MODEL_PARTS: &[&str] = &[
        "torch.nn",
        "torch.optim",
        "torch.ao",
        "torch.distributions",
        "torch.utils.data",
        "torch._tensor",
        "torch.storage",
        "torch.masked",
        "torch.nested",
        "torch.sparse",
        "torch._subclasses",
        "torch.fx",
        "torch.jit",
    ];
    under(module, "torch.utils.data.datapipes")
        || under(module, "torchdata.datapipes")
        || (under(module, "torch")
            && module != "torch"
            && !MODEL_PARTS.iter().any(|root| under(module, root)))
}

/// transformers' objects whose attributes are the user's values, among
/// them dtypes and classes: configurations (`BertConfig`,
/// `GenerationConfig`), feature extractors, image processors and
/// processors. Their own code calls methods of the instance when it is
/// printed or saved (`__repr__` calls `to_json_string`, which calls
/// `to_diff_dict` or `to_dict`): a callable under one of those names in
/// the instance's dict is what runs. The methods of `PreTrainedConfig`
/// and `GenerationConfig` in transformers 5.24 (`dir()`, class and static
/// methods and dunders aside; the feature extractors' and processors'
/// saving methods are among them), sorted; for any class of transformers.
pub(crate) fn config_methods(module: &str) -> Option<&'static [&'static str]> {
    module
        .starts_with("transformers.")
        .then_some(CONFIG_METHODS)
}

const CONFIG_METHODS: &[&str] = &[
    "_get_files_timestamps",
    "_get_generation_parameters",
    "_getattr_without_heterogeneous_validation",
    "_hasattr_without_heterogeneous_validation",
    "_iter_config_keys_with_heterogeneous_adjustment",
    "_remove_keys_not_serialized",
    "_update_heterogeneous_to_dict_output",
    "_upload_modified_files",
    "_validate_axial_rope_parameters",
    "_validate_default_rope_parameters",
    "_validate_dynamic_rope_parameters",
    "_validate_linear_rope_parameters",
    "_validate_llama3_rope_parameters",
    "_validate_longrope_rope_parameters",
    "_validate_proportional_rope_parameters",
    "_validate_yarn_rope_parameters",
    "convert_rope_params_to_dict",
    "dict_dtype_to_str",
    "get_generation_mode",
    "get_mtp_config",
    "get_text_config",
    "nested_rope_parameter_keys",
    "push_to_hub",
    "save_pretrained",
    "standardize_rope_params",
    "to_dict",
    "to_diff_dict",
    "to_json_file",
    "to_json_string",
    "update",
    "update_from_string",
    "validate",
    "validate_architecture",
    "validate_layer_type",
    "validate_output_attentions",
    "validate_rope",
    "validate_token_ids",
];

#[cfg(test)]
mod tests {
    #[test]
    fn sorted_for_the_search() {
        assert!(super::TOP_LEVEL.windows(2).all(|w| w[0] < w[1]));
        assert!(super::CONFIG_METHODS.windows(2).all(|w| w[0] < w[1]));
        assert!(super::shipped("torch.utils.file_baton"));
        assert!(super::shipped("os.path") && super::shipped("__builtin__"));
        assert!(super::shipped("pygments") && super::shipped("test.test_gzip"));
        assert!(!super::shipped("__main__") && !super::shipped("models.yolo"));
        assert!(!super::shipped("torchx") && !super::shipped("pandas.core.frame"));
    }
}
