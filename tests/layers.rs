//! The reader's layers only look down: each module may name only modules of
//! its own layer or of the layers below it (docs/architecture.md draws
//! them). A `crate::` path in code that points up, or at an item through the
//! crate root instead of its module, fails here with the file and line.

use std::path::{Path, PathBuf};

/// Bottom to top. Modules in one layer may use each other.
const LAYERS: &[&[&str]] = &[
    &["error", "advice"],
    &["limits"],
    &["bytes", "source", "glob", "name_index"],
    &["container"],
    &["pickle"],
    &["torch"],
    &["object"],
    &["parallel"],
    &["scan"],
    &["checkpoint", "view"],
    &["dcp"],
    &["set"],
    &["convert"],
    &["placement"],
    &["state_dict"],
    &["reads", "merge"],
    &["export"],
    &["fuzzing"],
    &["lib"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`torch/names.rs` ->
/// `torch`, `lib.rs` -> `lib`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

/// Each `crate::<module>` named on a line outside comments, and brace
/// groups `crate::{a, b}`.
fn referenced_modules(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

fn violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    assert!(files.len() > 20, "too few sources under {}", src.display());
    let mut found = Vec::new();
    for file in &files {
        let module = module_of(src, file);
        let own = layer_of(&module).unwrap_or_else(|| {
            panic!(
                "{}: module {module} is in no layer of tests/layers.rs",
                file.display()
            )
        });
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for target in referenced_modules(line) {
                let where_ = format!("{}:{}", file.display(), n + 1);
                match layer_of(&target) {
                    None => found.push(format!(
                        "{where_}: crate::{target} is not a module: name items by their module"
                    )),
                    Some(l) if l > own => found.push(format!(
                        "{where_}: {module} (layer {own}) uses {target} (layer {l}), above it"
                    )),
                    Some(_) => {}
                }
            }
        }
    }
    found
}

#[test]
fn reader_layers_only_look_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn an_upward_import_is_caught() {
    assert_eq!(referenced_modules("use crate::torch::TorchObj;"), ["torch"]);
    assert_eq!(
        referenced_modules("use crate::{bytes::slice, error::Error};"),
        ["bytes", "error"]
    );
    assert!(referenced_modules("/// See [`Limits`](crate::Limits).").is_empty());
    assert!(layer_of("torch") > layer_of("pickle"));
    // A copy of the reader with the pickle layer naming the torch layer.
    let dir = std::env::temp_dir().join(format!("ptload-layers-{}", std::process::id()));
    let src = dir.join("src");
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&real, &mut files);
    for file in &files {
        let to = src.join(file.strip_prefix(&real).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(file, &to).unwrap();
    }
    let value = src.join("pickle/value.rs");
    let text = std::fs::read_to_string(&value).unwrap();
    std::fs::write(&value, format!("use crate::torch::TorchObj;\n{text}")).unwrap();
    let found = violations(&src);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("pickle (layer 4) uses torch (layer 5)"),
        "{}",
        found[0]
    );
}
