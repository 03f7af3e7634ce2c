//! The reader's optional features: what a build without them reads, and
//! what it refuses with a message naming the feature. `cargo test` runs
//! the default build; .ci/run also runs this file with
//! `--no-default-features`.

use std::path::PathBuf;

use ptload_reader::Checkpoint;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/files")
        .join(name)
}

/// A checkpoint torch wrote, stored: every build reads every tensor,
/// and converts dtypes (on rayon's pool or on this thread).
#[test]
fn a_stored_checkpoint_reads_in_every_build() {
    use ptload_reader::cast::ReadAs;
    let ckpt = Checkpoint::open(fixture("llama_wide.pt")).expect("open");
    let mut read = 0;
    for t in ckpt.tensors() {
        let data = t.data().expect("data");
        assert_eq!(data.len() as u64, t.info().nbytes, "{}", t.name());
        if t.info().dtype.is_float() && t.info().numel > 70_000 {
            // Large enough to be split over the cores when `parallel` is on.
            let wide: Vec<f64> = t.read_as().expect("read_as");
            assert_eq!(wide.len() as u64, t.info().numel);
            read += 1;
        }
    }
    assert!(read > 0, "no tensor large enough to convert in parts");
}

/// A set's files open (in parallel with `parallel`, in order without).
#[test]
fn a_set_opens_in_every_build() {
    let set = ptload_reader::set::CheckpointSet::open(fixture(
        "llama_tiny_sharded/pytorch_model.bin.index.json",
    ))
    .expect("set");
    assert!(set.files().len() > 1);
}

/// A checkpoint whose records are deflated (re-zipped by another tool).
#[cfg(feature = "deflate")]
#[test]
fn deflated_records_inflate_with_the_feature() {
    let ckpt = Checkpoint::open(fixture("deflated.pt")).expect("open");
    for t in ckpt.tensors() {
        t.data().expect("data");
    }
}

#[cfg(not(feature = "deflate"))]
#[test]
fn deflated_records_are_refused_naming_the_feature() {
    let text = match Checkpoint::open(fixture("deflated.pt")) {
        Err(e) => e.to_string(),
        Ok(ckpt) => ckpt
            .tensors()
            .find_map(|t| t.data().err())
            .expect("a deflated record was read without `deflate`")
            .to_string(),
    };
    assert!(text.contains("feature `deflate`"), "{text}");
}
