//! Which globals torch's `weights_only=True` loader allows, and ptload's
//! strict policy built on that list.

use super::dtype::DType;

/// What the reader does with globals outside torch's safe allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Policy {
    /// Load the tensors of any checkpoint; globals outside torch's allowlist
    /// are kept as inert values and listed in [`Checkpoint::suspicious`](crate::Checkpoint::suspicious).
    #[default]
    Default,
    /// Match torch's `weights_only=True`: a global outside its allowlist (or
    /// the names the caller allows) is an error naming it.
    Strict,
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

/// Whether torch's `weights_only=True` unpickler allows `module.name` by default.
pub(crate) fn torch_allows(module: &str, name: &str) -> bool {
    match module {
        "collections" => matches!(name, "OrderedDict" | "Counter"),
        "torch.nn.parameter" => name == "Parameter",
        "torch.serialization" => name == "_get_layout",
        "_codecs" => name == "encode",
        "builtins" => matches!(name, "bytearray" | "set" | "complex"),
        "torch._utils" => REBUILD_FUNCTIONS.contains(&name),
        "torch._tensor" => name == "_rebuild_from_type_v2",
        "torch" => {
            matches!(name, "Size" | "Tensor" | "device")
                || DType::is_torch_dtype_name(name)
                || QSCHEMES.contains(&name)
                || name.ends_with("Tensor")
                || name.ends_with("Storage")
        }
        "torch.cuda" => name.ends_with("Storage") || name.ends_with("Tensor"),
        m if m.starts_with("torch.") => name.contains("Storage"),
        _ => false,
    }
}

/// Modules torch blocks even when a user allows one of their names.
pub(crate) fn always_blocked(module: &str) -> bool {
    let root = module.split('.').next().unwrap_or(module);
    matches!(root, "sys" | "os" | "posix" | "nt")
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
        assert!(always_blocked("os"));
        assert!(always_blocked("os.path"));
        assert!(!always_blocked("osx"));
    }
}
