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

/// float16 and bfloat16 tensors read as f32 in every build: with the
/// feature `half` as `half`'s types too, without it through the reader's
/// own conversions (checked here against the `half` crate's).
#[test]
fn half_precision_reads_as_f32_in_every_build() {
    use ptload_reader::cast::ReadAs;
    use ptload_reader::DType;
    let ckpt = Checkpoint::open(fixture("dtypes.pt")).expect("open");
    let mut seen = 0;
    for t in ckpt.tensors() {
        let widen: fn([u8; 2]) -> f32 = match t.dtype() {
            DType::F16 => |b| half::f16::from_le_bytes(b).to_f32(),
            DType::BF16 => |b| half::bf16::from_le_bytes(b).to_f32(),
            _ => continue,
        };
        let want: Vec<u32> = t
            .data()
            .expect("data")
            .chunks_exact(2)
            .map(|b| widen([b[0], b[1]]).to_bits())
            .collect();
        let got: Vec<u32> = t
            .read_as::<f32>()
            .expect("read_as")
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(got, want, "{}", t.name());
        seen += 1;
    }
    assert!(seen >= 2, "dtypes.pt lost its float16 and bfloat16 tensors");
}

/// A zip archive behind other bytes: torch.load unpickles those bytes.
/// With `scan` what they call is listed (here: nothing) and the archive
/// read; without it the file is refused, naming the feature.
#[test]
fn a_zip_behind_other_bytes_needs_the_scanner() {
    let opened = Checkpoint::open(fixture("prefixed.pt"));
    #[cfg(feature = "scan")]
    assert_eq!(opened.expect("open").tensors().count(), 2);
    #[cfg(not(feature = "scan"))]
    {
        let e = opened.expect_err("read past unlisted bytes without `scan`");
        assert_eq!(e.kind(), ptload_reader::ErrorKind::Unsupported);
        assert!(e.to_string().contains("feature `scan`"), "{e}");
    }
}

/// A distributed checkpoint's directory: a set with `dcp`, an error naming
/// the feature without it.
#[test]
fn a_distributed_checkpoint_needs_its_feature() {
    let opened = ptload_reader::set::CheckpointSet::open(fixture("dcp/world2"));
    #[cfg(feature = "dcp")]
    assert!(!opened.expect("open").is_empty());
    #[cfg(not(feature = "dcp"))]
    {
        let e = opened.expect_err("read a DCP directory without `dcp`");
        assert_eq!(e.kind(), ptload_reader::ErrorKind::Unsupported);
        assert!(e.to_string().contains("feature `dcp`"), "{e}");
    }
}
