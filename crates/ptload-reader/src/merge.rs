//! Model-parallel rank files put back together, and cut again for another
//! world size.
//!
//! Meta's `consolidated.NN.pth` files hold one model-parallel rank each:
//! every tensor a rule splits is cut along its dimension, one part per
//! file, and every other tensor is in each file whole. With the rules the
//! files were cut by ([`Splits`]), [`merge`] names each tensor's parts;
//! [`Merged::visit_bytes`] streams the whole tensor, and with a [`Shard`]
//! of another world size, that rank's part of it, reading only the bytes
//! of the parts it overlaps.
//!
//! ```
//! # fn main() -> Result<(), ptload_reader::Error> {
//! use ptload_reader::merge::merge;
//! use ptload_reader::tp::{Shard, Splits};
//! use ptload_reader::set::CheckpointSet;
//! use ptload_reader::OpenOptions;
//!
//! let ranks = CheckpointSet::open_ranks(
//!     "../../fixtures/files/llama_tiny_consolidated",
//!     &OpenOptions::new(),
//! )?;
//! // The rules the files were cut by: Meta cuts the embedding along dim 1.
//! let rules = Splits::parse(&["model.embed_tokens.weight=1"])?.then(Splits::preset("llama")?);
//! let merged = merge(&ranks, &rules)?;
//! let q = merged.iter().find(|m| m.name.ends_with("0.self_attn.q_proj.weight")).unwrap();
//! assert_eq!(q.shape, [40, 40]); // two parts of [20, 40]
//! let mut rank_2_of_3 = Vec::new();
//! q.visit_bytes(&ranks, Some(Shard::new(2, 3)?), |b| rank_2_of_3.extend_from_slice(b))?;
//! assert_eq!(rank_2_of_3.len(), 13 * 40 * 2); // rows 27..40, bf16
//! # Ok(())
//! # }
//! ```

use crate::error::{Error, ErrorKind, Result};
use crate::set::CheckpointSet;
use crate::torch::dtype::DType;
use crate::torch::tensor::TensorInfo;
use crate::tp::{Shard, Split, Splits};
use crate::view::TensorView;

/// One tensor of the model, from its parts in the rank files.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Merged {
    /// Its name.
    pub name: String,
    /// Element type (every part's).
    pub dtype: DType,
    /// The whole tensor's shape.
    pub shape: Vec<u64>,
    /// The dimension its parts are cut along; `None`: replicated, each file
    /// holds it whole.
    pub dim: Option<usize>,
    /// Its index among the tensors of each file, by rank.
    parts: Vec<usize>,
}

/// The tensors of the rank files `set` (see
/// [`CheckpointSet::open_ranks`]) cut by `splits`, in rank 0's order. A
/// part whose dtype, or shape outside the split dimension, differs from
/// rank 0's is an error; so is a split rule naming a dimension a tensor
/// lacks.
pub fn merge(set: &CheckpointSet, splits: &Splits) -> Result<Vec<Merged>> {
    let Some(first) = set.files().first() else {
        return Err(Error::new(ErrorKind::InvalidSpec, "no rank files"));
    };
    let mut out = Vec::with_capacity(first.checkpoint().len());
    for t in first.checkpoint().tensors() {
        let name = t.name();
        let ndim = t.shape().len();
        let dim = match splits.split_of(name) {
            Split::Replicate => None,
            Split::Dim(d) => Some(crate::tp::resolve_dim(d, ndim).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidSpec,
                    format!(
                        "a split rule says dim {d}, but the tensor has {ndim} dimension{}",
                        if ndim == 1 { "" } else { "s" }
                    ),
                )
                .for_tensor(name)
            })?),
        };
        let mut shape = t.shape().to_vec();
        let mut parts = Vec::with_capacity(set.files().len());
        for (rank, file) in set.files().iter().enumerate() {
            let ckpt = file.checkpoint();
            let index = ckpt.position(name).ok_or_else(|| {
                Error::new(ErrorKind::Tensor, "missing from a rank file")
                    .for_tensor(name)
                    .in_file(&file.name())
            })?;
            let part = ckpt
                .tensor_at(index)
                .ok_or_else(|| Error::new(ErrorKind::Tensor, "tensor index").for_tensor(name))?;
            let same_outside = part.shape().len() == ndim
                && part
                    .shape()
                    .iter()
                    .zip(t.shape())
                    .enumerate()
                    .all(|(i, (a, b))| Some(i) == dim || a == b);
            if part.dtype() != t.dtype() || !same_outside || part.info().quantization.is_some() {
                return Err(Error::new(
                    ErrorKind::Tensor,
                    format!(
                        "rank {rank}'s part is {} {:?}, rank 0's {} {:?}: they do not fit together{}",
                        part.dtype(),
                        part.shape(),
                        t.dtype(),
                        t.shape(),
                        match dim {
                            Some(d) => format!(" along dim {d}"),
                            None => " (replicated: the shapes must be equal)".to_owned(),
                        }
                    ),
                )
                .for_tensor(name)
                .in_file(&file.name()));
            }
            if let (Some(d), true) = (dim, rank > 0) {
                if let (Some(total), Some(&more)) = (shape.get_mut(d), part.shape().get(d)) {
                    *total = total.checked_add(more).ok_or_else(|| {
                        Error::new(ErrorKind::Tensor, "size overflows").for_tensor(name)
                    })?;
                }
            }
            parts.push(index);
        }
        out.push(Merged {
            name: name.to_owned(),
            dtype: t.dtype(),
            shape,
            dim,
            parts,
        });
    }
    Ok(out)
}

impl Merged {
    /// Row-major size in bytes of the whole tensor, or with `shard`, of
    /// that rank's part.
    pub fn nbytes(&self, shard: Option<Shard>) -> u64 {
        self.shape_for(shard)
            .iter()
            .try_fold(self.dtype.size() as u64, |a, &s| a.checked_mul(s))
            .unwrap_or(u64::MAX)
    }

    /// The shape of the whole tensor, or with `shard`, of that rank's
    /// part (`tensor_split` along the same dimension; a replicated tensor
    /// is whole on every rank).
    pub fn shape_for(&self, shard: Option<Shard>) -> Vec<u64> {
        let mut shape = self.shape.clone();
        if let (Some(s), Some(d)) = (shard, self.dim) {
            if let Some(size) = shape.get_mut(d) {
                *size = s.part(*size).1;
            }
        }
        shape
    }

    /// Hand `f` the tensor's elements, row-major and in host byte order:
    /// the whole tensor, or with `shard` (any world size) that rank's part.
    /// Only the parts the range overlaps are read, and of each only the
    /// overlapping indices.
    pub fn visit_bytes(
        &self,
        set: &CheckpointSet,
        shard: Option<Shard>,
        mut f: impl FnMut(&[u8]),
    ) -> Result<()> {
        let view = |rank: usize| -> Result<TensorView<'_>> {
            self.parts
                .get(rank)
                .and_then(|&i| set.files().get(rank)?.checkpoint().tensor_at(i))
                .ok_or_else(|| Error::new(ErrorKind::Tensor, "no such part").for_tensor(&self.name))
        };
        let Some(d) = self.dim else {
            return view(0)?.visit_bytes(f);
        };
        let size = self.shape.get(d).copied().unwrap_or(0);
        let (from, len) = shard.map_or((0, size), |s| s.part(size));
        let to = from + len;
        // The overlapping piece of each part: a view, nothing read yet.
        let mut pieces: Vec<(TensorView<'_>, TensorInfo)> = Vec::new();
        let mut at = 0u64;
        for rank in 0..self.parts.len() {
            let part = view(rank)?;
            let plen = part.shape().get(d).copied().unwrap_or(0);
            let (lo, hi) = (at.max(from), at.saturating_add(plen).min(to));
            let start = at;
            at = at.saturating_add(plen);
            if lo < hi {
                pieces.push((part, part.info().narrow(d, lo - start, hi - lo)?));
            }
        }
        if pieces.iter().all(|(_, info)| info.numel == 0) {
            return Ok(());
        }
        // Row-major: for each index of the dimensions before `d`, each
        // piece's block in turn, streamed from the files (as many indices
        // as elements, at most: no piece is empty).
        let outer = self.shape.get(..d).ok_or_else(|| {
            Error::new(ErrorKind::Tensor, "split dimension past the shape").for_tensor(&self.name)
        })?;
        let mut index = vec![0u64; outer.len()];
        loop {
            for (part, info) in &pieces {
                let mut block = info.clone();
                for (dim, &i) in index.iter().enumerate() {
                    block = block.narrow(dim, i, 1)?;
                }
                TensorView {
                    ckpt: part.ckpt,
                    info: &block,
                }
                .visit_bytes(&mut f)?;
            }
            // Advance the odometer over the outer dimensions.
            let mut k = index.len();
            loop {
                if k == 0 {
                    return Ok(());
                }
                k -= 1;
                let (Some(i), Some(&size)) = (index.get_mut(k), outer.get(k)) else {
                    return Ok(());
                };
                *i += 1;
                if *i < size {
                    break;
                }
                *i = 0;
            }
        }
    }
}
