//! For inference engines: the handful of types a Rust engine needs to
//! build its weight store on a torch checkpoint, in one place.
//!
//! `use ptload_reader::engine::*;` brings in what the usual job takes:
//! open a file ([`OpenOptions`], refusing what the scanner calls
//! dangerous), select the model's weights ([`StateDictOptions`], which
//! finds the model under a training checkpoint's keys and strips
//! `module.`/`_orig_mod.`), keep them for the model's lifetime
//! ([`Weights`]: owns its checkpoints, `Send + Sync`, views borrow only
//! it), read each tensor zero-copy ([`TensorView::as_slice`]) or converted
//! to the engine's float type ([`ReadAs::read_as`]), take one rank's slices
//! ([`Shard`], [`Splits`]), and branch on errors ([`ErrorKind`],
//! [`Error::is_truncated`]: a download cut short, worth a retry, against a
//! file that is not a checkpoint). Everything else (placement on GPUs,
//! export, scanning, distributed checkpoints, sets) stays in its module.
//!
//! An engine that reads torch's own files builds the crate with
//! `default-features = false` and adds back what it uses: no rayon, no
//! flate2 (a record stored deflated, which only other zip tools write, is
//! then an error naming the feature `deflate`), no serde; `scan` for
//! [`OpenOptions::refuse_at`] and [`Level`] (the scanner's decision, as
//! below), `half` for reads as `half::f16`/`half::bf16`, `dcp` for
//! distributed checkpoints. Without `scan` the default policy still runs
//! nothing a file names, and [`Policy::Strict`](crate::Policy::Strict)
//! (torch's `weights_only` allowlist) is the gate that refuses.
//!
//! ```
//! use std::sync::Arc;
//! use ptload_reader::engine::*;
//!
//! /// A layer of the engine's model: it keeps the weights, not a borrow.
//! struct Linear {
//!     weights: Weights,
//!     name: String,
//! }
//!
//! impl Linear {
//!     /// The weight as f32, whatever float type the file stores.
//!     fn weight_f32(&self) -> Result<Option<Vec<f32>>> {
//!         self.weights.get(&self.name).map(|v| v.read_as::<f32>()).transpose()
//!     }
//! }
//!
//! fn load(path: &str, rank: u32, world: u32) -> Result<Linear> {
//!     let opts = OpenOptions::new();
//!     // Refuse what the scanner calls dangerous (feature `scan`).
//!     #[cfg(feature = "scan")]
//!     let opts = opts.refuse_at(Some(Level::Dangerous));
//!     let ckpt = opts.open(path)?;
//!     let opts = StateDictOptions {
//!         parallel: Some((Shard::new(rank, world)?, Splits::parse(&["*.weight=0"])?)),
//!         ..Default::default()
//!     };
//!     let weights = Weights::select(&opts, Arc::new(ckpt))?;
//!     Ok(Linear { weights, name: "0.weight".into() })
//! }
//!
//! # fn main() -> Result<()> {
//! let whole = load("../../fixtures/files/basic.pt", 0, 1)?;
//! let half = load("../../fixtures/files/basic.pt", 1, 2)?;
//! let (whole, half) = (whole.weight_f32()?.unwrap(), half.weight_f32()?.unwrap());
//! assert_eq!(whole.len(), 8 * 4);
//! assert_eq!(half[..], whole[16..]);
//! match load("../../fixtures/files/missing.pt", 0, 1) {
//!     Err(e) if e.is_truncated() => unreachable!("not a download cut short"),
//!     Err(e) => assert_eq!(e.kind(), ErrorKind::Io),
//!     Ok(_) => unreachable!("no such file"),
//! }
//! # Ok(())
//! # }
//! ```

pub use crate::cast::ReadAs;
pub use crate::checkpoint::{Checkpoint, OpenOptions};
pub use crate::error::{Error, ErrorKind, Result};
pub use crate::limits::Limits;
#[cfg(feature = "scan")]
pub use crate::scan::Level;
pub use crate::state_dict::{KeySelect, StateDictOptions, Strip, Weights};
pub use crate::torch::dtype::{DType, Element};
pub use crate::tp::{Shard, Splits};
pub use crate::view::TensorView;
