//! Convert every checkpoint in a directory to safetensors: the model of a
//! training checkpoint, wrapper prefixes stripped, tensors safetensors cannot
//! hold left out. Files that are not checkpoints are skipped with the reason.
//!
//! ```text
//! cargo run -p ptload-reader --example convert_dir [-- IN_DIR [OUT_DIR]]
//! ```
//!
//! `IN_DIR` defaults to `fixtures/files`; `OUT_DIR` to a new directory under
//! the system temp directory. Each `NAME.EXT` becomes `OUT_DIR/NAME.safetensors`.

use std::path::{Path, PathBuf};

use ptload_reader::export::{Export, SafetensorsOptions};
use ptload_reader::state_dict::StateDictOptions;
use ptload_reader::Checkpoint;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let input = match args.next() {
        Some(arg) => PathBuf::from(arg),
        // The repository root is two levels above this crate.
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .canonicalize()?
            .join("fixtures/files"),
    };
    let output = args.next().map_or_else(
        || std::env::temp_dir().join(format!("ptload-convert-{}", std::process::id())),
        PathBuf::from,
    );
    std::fs::create_dir_all(&output)?;

    let mut files: Vec<PathBuf> = std::fs::read_dir(&input)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.is_file());
    files.sort();

    // Auto key (the model of a training checkpoint) and auto strip
    // (`module.`, `_orig_mod.`), as `ptload convert` does by default.
    let state = StateDictOptions::default();
    let opts = SafetensorsOptions {
        skip_unsupported: true,
        ..Default::default()
    };
    let (mut converted, mut skipped_files, mut total_bytes) = (0usize, 0usize, 0u64);
    for path in &files {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        // The error's Display is one line: `layer: what (where)`.
        let ckpt = match Checkpoint::open(path) {
            Ok(c) => c,
            Err(e) => {
                println!("{name:<24} skipped: {e}");
                skipped_files += 1;
                continue;
            }
        };
        let selection = match state.select(&ckpt) {
            Ok(s) => s,
            Err(e) => {
                println!("{name:<24} skipped: {e}");
                skipped_files += 1;
                continue;
            }
        };
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        let target = output.join(format!("{stem}.safetensors"));
        let written = Export::state_dict(&selection, &opts).to_file(&target)?;
        println!(
            "{name:<24} {:>5} tensors {:>9} bytes {:>2} metadata {:>2} skipped -> {}",
            written.tensors,
            written.bytes,
            written.metadata,
            written.skipped.len(),
            target.display()
        );
        for why in &written.skipped {
            println!("{:<24}   left out {why}", "");
        }
        converted += 1;
        total_bytes += written.bytes;
    }
    println!(
        "\n{converted} converted ({total_bytes} bytes of tensor data), {skipped_files} skipped, into {}",
        output.display()
    );
    Ok(())
}
