//! Which globals torch's `weights_only=True` loader allows, and ptload's
//! strict policy built on that list.

use super::dtype::DType;

/// What the reader does with globals outside torch's safe allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Policy {
    /// Load the tensors of any checkpoint; globals outside torch's allowlist
    /// are kept as inert values and listed in [`Checkpoint::outside_allowlist`](crate::Checkpoint::outside_allowlist).
    #[default]
    Default,
    /// Match torch's `weights_only=True`: a global outside its allowlist (or
    /// the names the caller allows) is an error naming it.
    Strict,
}

impl Policy {
    /// Whether `module` is one torch refuses even when the caller allows
    /// one of its names (`sys`, `os`, `posix`, `nt` and their submodules):
    /// [`OpenOptions::allow_global`](crate::OpenOptions::allow_global) never
    /// admits them, and neither may a caller that resolves globals itself.
    pub fn always_blocks(module: &str) -> bool {
        always_blocked(module)
    }

    /// Whether a caller's allowlist admits `module.name`: each entry is an
    /// exact `module.name` or a glob over the whole of it (`*` any run of
    /// characters, `?` one: `mymodels.*`); a module torch always blocks is
    /// never admitted. The one rule of
    /// [`OpenOptions::allow_global`](crate::OpenOptions::allow_global),
    /// the CLI's `--allow-global` and Python's `allow_globals`.
    pub fn allowlist_admits<S: AsRef<str>>(allowed: &[S], module: &str, name: &str) -> bool {
        user_allows(allowed, module, name)
    }
}

const REBUILD_FUNCTIONS: &[&str] = &[
    "_rebuild_tensor",
    "_rebuild_tensor_v2",
    "_rebuild_tensor_v3",
    "_rebuild_parameter",
    "_rebuild_parameter_with_state",
    "_rebuild_qtensor",
    "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage",
    "_rebuild_nested_tensor",
    "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_cpu_tensor",
    "_rebuild_device_tensor_from_numpy",
];

const QSCHEMES: &[&str] = &[
    "per_tensor_affine",
    "per_tensor_symmetric",
    "per_channel_affine",
    "per_channel_symmetric",
    "per_channel_affine_float_qparams",
];

/// torch's typed storage classes (`torch._storage_classes`), in `torch` and
/// (all but `UntypedStorage`) in `torch.cuda`.
const STORAGE_CLASSES: &[&str] = &[
    "DoubleStorage",
    "FloatStorage",
    "HalfStorage",
    "BFloat16Storage",
    "ComplexDoubleStorage",
    "ComplexFloatStorage",
    "LongStorage",
    "IntStorage",
    "ShortStorage",
    "CharStorage",
    "ByteStorage",
    "BoolStorage",
    "QUInt8Storage",
    "QInt8Storage",
    "QInt32Storage",
    "QUInt4x2Storage",
    "QUInt2x4Storage",
];

/// torch's legacy tensor types (`torch._tensor_classes`), in `torch`,
/// `torch.cuda`, `torch.sparse` and `torch.cuda.sparse`.
const TENSOR_CLASSES: &[&str] = &[
    "DoubleTensor",
    "FloatTensor",
    "HalfTensor",
    "BFloat16Tensor",
    "LongTensor",
    "IntTensor",
    "ShortTensor",
    "CharTensor",
    "ByteTensor",
    "BoolTensor",
];

/// Whether torch's `weights_only=True` unpickler allows `module.name` by
/// default. Exact names only: nothing is matched by pattern, so an
/// attribute path (`TypedStorage.__init__.__builtins__.get`) is never
/// allowed because its start is.
pub(crate) fn torch_allows(module: &str, name: &str) -> bool {
    match module {
        "collections" => matches!(name, "OrderedDict" | "Counter"),
        "torch.nn.parameter" => name == "Parameter",
        "torch.serialization" => name == "_get_layout",
        "_codecs" => name == "encode",
        "builtins" => matches!(name, "bytearray" | "set" | "complex"),
        "torch._utils" => REBUILD_FUNCTIONS.contains(&name),
        "torch._tensor" => name == "_rebuild_from_type_v2",
        // torch allows its storage classes by `__module__.__name__`, and
        // UntypedStorage's module is `torch.storage`.
        "torch.storage" => name == "UntypedStorage",
        "torch" => {
            matches!(name, "Size" | "Tensor" | "device" | "UntypedStorage")
                || DType::is_torch_dtype_name(name)
                || QSCHEMES.contains(&name)
                || TENSOR_CLASSES.contains(&name)
                || STORAGE_CLASSES.contains(&name)
        }
        "torch.cuda" => TENSOR_CLASSES.contains(&name) || STORAGE_CLASSES.contains(&name),
        "torch.sparse" | "torch.cuda.sparse" => TENSOR_CLASSES.contains(&name),
        _ => false,
    }
}

/// Modules torch blocks even when a user allows one of their names.
pub(crate) fn always_blocked(module: &str) -> bool {
    let root = module.split('.').next().unwrap_or(module);
    matches!(root, "sys" | "os" | "posix" | "nt")
}

/// Whether the user's allowlist (exact `module.name` paths, or globs with
/// `*` and `?`: `mymodels.*`) admits `module.name`. Globals of modules that
/// are always blocked stay refused whatever the list says.
pub(crate) fn user_allows<S: AsRef<str>>(allowed: &[S], module: &str, name: &str) -> bool {
    if always_blocked(module) {
        return false;
    }
    let path = format!("{module}.{name}");
    allowed
        .iter()
        .map(AsRef::as_ref)
        .any(|p| p == path || (p.contains(['*', '?']) && crate::glob::glob(p, &path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlist() {
        assert!(torch_allows("torch._utils", "_rebuild_tensor_v2"));
        assert!(torch_allows("torch", "float8_e4m3fn"));
        assert!(torch_allows("torch", "BFloat16Storage"));
        assert!(torch_allows("collections", "OrderedDict"));
        assert!(!torch_allows("builtins", "eval"));
        assert!(!torch_allows("__main__", "Net"));
        assert!(!torch_allows("numpy.core.multiarray", "scalar"));
        assert!(torch_allows("torch.cuda", "HalfStorage"));
        assert!(!torch_allows(
            "torch.storage",
            "TypedStorage.__init__.__builtins__.get"
        ));
        assert!(!torch_allows("torch", "FloatStorage.__init__"));
        assert!(!torch_allows("torch.evil", "FooStorage"));
        assert!(always_blocked("os"));
        assert!(always_blocked("os.path"));
        assert!(!always_blocked("osx"));
        let list = [
            "mymodels.*".to_owned(),
            "argparse.Namespace".to_owned(),
            "*".to_owned(),
        ];
        assert!(user_allows(&list, "mymodels.layers", "Block"));
        assert!(user_allows(&list, "argparse", "Namespace"));
        // Globs never reach the modules that are always blocked.
        assert!(!user_allows(&list, "os", "system"));
        assert!(!user_allows(&["os.system".to_owned()], "os", "system"));
    }
}
