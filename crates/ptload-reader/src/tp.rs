//! Tensor parallelism: which part of each tensor a rank holds, read
//! straight from the file.
//!
//! A [`Shard`] (rank and world size) and [`Splits`] (rules by name pattern:
//! `GLOB=DIM` splits matching tensors along `DIM`, anything unmatched is
//! replicated) give each tensor's [`Slice`] for that rank, in
//! `torch.tensor_split(t, world, dim)[rank]` semantics: the first
//! `size % world` ranks get one element more than the others, so sizes
//! differ by at most one, and a rank past the size gets an empty slice.
//!
//! A slice is a view of the tensor's storage (a narrower shape, a later
//! offset), so reading it touches only its own bytes: the rows of a
//! dim-0 slice, the blocks of each row for a dim-1 slice, for every dtype,
//! stride and byte order.
//!
//! ```
//! # fn main() -> Result<(), ptload_reader::Error> {
//! use ptload_reader::tp::{Shard, Splits};
//! use ptload_reader::state_dict::StateDictOptions;
//! use ptload_reader::Checkpoint;
//!
//! let ckpt = Checkpoint::open("../../fixtures/files/basic.pt")?;
//! let opts = StateDictOptions {
//!     parallel: Some((Shard::new(1, 3)?, Splits::parse(&["*.weight=0"])?)),
//!     ..Default::default()
//! };
//! let sd = opts.select(&ckpt)?;
//! let (_, w) = sd.tensors().find(|(n, _)| *n == "0.weight").unwrap();
//! assert_eq!(w.shape(), [3, 4]); // rows 3..6 of an 8 x 4 weight
//! # assert_eq!(w.data()?.len(), 3 * 4 * 4);
//! # Ok(())
//! # }
//! ```

use crate::error::{Error, ErrorKind, Result};
use crate::glob::glob;
use crate::torch::tensor::TensorInfo;

/// A slice as evenly spaced runs of its storage, for a reader that copies
/// it itself (see [`TensorInfo::even_runs`]).
pub use crate::torch::tensor::EvenRuns;

/// One rank of a world of tensor-parallel ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This rank, `0..world`.
    pub rank: u32,
    /// How many ranks share each split tensor.
    pub world: u32,
}

impl Shard {
    /// Rank `rank` of `world`; an error unless `rank < world`.
    pub fn new(rank: u32, world: u32) -> Result<Shard> {
        if world == 0 || rank >= world {
            return Err(spec(format!(
                "rank {rank} of world {world}: the rank must be below the world size"
            )));
        }
        Ok(Shard { rank, world })
    }

    /// `RANK/WORLD` (`3/8`).
    pub fn parse(text: &str) -> Result<Shard> {
        let bad = || {
            spec(format!(
                "shard {text:?}: expected RANK/WORLD, e.g. 0/8 (rank 0 of 8)"
            ))
        };
        let (rank, world) = text.split_once('/').ok_or_else(bad)?;
        let rank = rank.trim().parse().map_err(|_| bad())?;
        let world = world.trim().parse().map_err(|_| bad())?;
        Shard::new(rank, world)
    }

    /// `RANK/WORLD`, or `env` for [`from_env`](Self::from_env): what a
    /// front end's shard argument (`--shard 3/8`, `--shard env`) means.
    pub fn from_arg(text: &str) -> Result<Shard> {
        if text.trim() == "env" {
            Shard::from_env()
        } else {
            Shard::parse(text)
        }
    }

    /// From the environment torchrun, `mpirun` and Slurm set: `RANK` and
    /// `WORLD_SIZE`, else `OMPI_COMM_WORLD_RANK` and `OMPI_COMM_WORLD_SIZE`,
    /// else `SLURM_PROCID` and `SLURM_NTASKS`.
    pub fn from_env() -> Result<Shard> {
        Shard::from_vars(|k| std::env::var(k).ok())
    }

    /// [`from_env`](Self::from_env) over any source of variables.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Shard> {
        const PAIRS: [(&str, &str); 3] = [
            ("RANK", "WORLD_SIZE"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("SLURM_PROCID", "SLURM_NTASKS"),
        ];
        for (rank_var, world_var) in PAIRS {
            if let (Some(rank), Some(world)) = (var(rank_var), var(world_var)) {
                let num = |name: &str, v: &str| {
                    v.trim().parse::<u32>().map_err(|_| {
                        spec(format!("{name}={v:?} is not a non-negative whole number"))
                    })
                };
                return Shard::new(num(rank_var, &rank)?, num(world_var, &world)?);
            }
        }
        Err(spec(
            "no rank in the environment: set RANK and WORLD_SIZE (torchrun sets them), \
             or give the shard as RANK/WORLD",
        ))
    }

    /// This rank's part of `size` elements: `(start, len)`, as
    /// `torch.tensor_split(t, world, dim)[rank]` cuts it.
    pub fn part(&self, size: u64) -> (u64, u64) {
        let world = u64::from(self.world.max(1));
        let rank = u64::from(self.rank);
        let (base, extra) = (size / world, size % world);
        let start = rank * base + rank.min(extra);
        (start, base + u64::from(rank < extra))
    }
}

/// The part of a tensor one rank holds: elements `start..start + len`
/// along `dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slice {
    /// The split dimension.
    pub dim: usize,
    /// First index along `dim`.
    pub start: u64,
    /// How many indices along `dim`.
    pub len: u64,
}

/// What a rule does with the tensors it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Split along this dimension (negative counts from the last, as in
    /// torch).
    Dim(i64),
    /// Every rank holds the whole tensor.
    Replicate,
}

/// Split rules by name pattern, tried in order; the first whose glob
/// matches a tensor's (final) name decides, and a tensor no rule matches
/// is replicated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Splits {
    rules: Vec<(String, Split)>,
}

/// A ready rule set: see [`PRESETS`].
#[derive(Debug, Clone, Copy)]
pub struct Preset {
    /// What `--split-preset` and [`Splits::preset`] call it.
    pub name: &'static str,
    /// The layouts it fits, and what it leaves replicated.
    pub about: &'static str,
    /// `(glob, split)`, tried in order.
    pub rules: &'static [(&'static str, Split)],
}

/// Ready rule sets for common layouts, by the names their checkpoints use
/// (Hugging Face transformers', or Meta's for `meta-llama`). Column-parallel weights (`[out, in]`) split on dim
/// 0, row-parallel ones on dim 1, embeddings over the vocabulary (dim 0);
/// norms, routers and everything unnamed are replicated.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "llama",
        about: "Llama, Mistral, Qwen2 and their kind (LlamaForCausalLM names)",
        rules: &[
            ("*.self_attn.q_proj.*", Split::Dim(0)),
            ("*.self_attn.k_proj.*", Split::Dim(0)),
            ("*.self_attn.v_proj.*", Split::Dim(0)),
            ("*.self_attn.o_proj.weight", Split::Dim(1)),
            ("*.mlp.gate_proj.weight", Split::Dim(0)),
            ("*.mlp.up_proj.weight", Split::Dim(0)),
            ("*.mlp.down_proj.weight", Split::Dim(1)),
            ("*embed_tokens.weight", Split::Dim(0)),
            ("lm_head.weight", Split::Dim(0)),
        ],
    },
    Preset {
        name: "meta-llama",
        about: "Meta's own Llama checkpoints (consolidated.NN.pth names): wq/wk/wv and w1/w3 on dim 0, wo and w2 on dim 1, tok_embeddings on dim 1 and output on dim 0 as Meta's model-parallel layers cut them",
        rules: &[
            ("*.attention.wq.weight", Split::Dim(0)),
            ("*.attention.wk.weight", Split::Dim(0)),
            ("*.attention.wv.weight", Split::Dim(0)),
            ("*.attention.wo.weight", Split::Dim(1)),
            ("*.feed_forward.w1.weight", Split::Dim(0)),
            ("*.feed_forward.w3.weight", Split::Dim(0)),
            ("*.feed_forward.w2.weight", Split::Dim(1)),
            ("tok_embeddings.weight", Split::Dim(1)),
            ("output.weight", Split::Dim(0)),
        ],
    },
    Preset {
        name: "mixtral",
        about: "Mixtral: Llama's attention, each expert's w1/w3 column- and w2 row-parallel, the router replicated",
        rules: &[
            ("*.self_attn.q_proj.weight", Split::Dim(0)),
            ("*.self_attn.k_proj.weight", Split::Dim(0)),
            ("*.self_attn.v_proj.weight", Split::Dim(0)),
            ("*.self_attn.o_proj.weight", Split::Dim(1)),
            ("*.block_sparse_moe.experts.*.w1.weight", Split::Dim(0)),
            ("*.block_sparse_moe.experts.*.w3.weight", Split::Dim(0)),
            ("*.block_sparse_moe.experts.*.w2.weight", Split::Dim(1)),
            ("*embed_tokens.weight", Split::Dim(0)),
            ("lm_head.weight", Split::Dim(0)),
        ],
    },
    Preset {
        name: "gpt-neox",
        about: "GPT-NeoX, Pythia: the fused query_key_value is stored head by head, so a split on dim 0 gives each rank whole heads when the head count divides by the world",
        rules: &[
            ("*.attention.query_key_value.*", Split::Dim(0)),
            ("*.attention.dense.weight", Split::Dim(1)),
            ("*.mlp.dense_h_to_4h.*", Split::Dim(0)),
            ("*.mlp.dense_4h_to_h.weight", Split::Dim(1)),
            ("*embed_in.weight", Split::Dim(0)),
            ("embed_out.weight", Split::Dim(0)),
        ],
    },
    Preset {
        name: "gpt2",
        about: "GPT-2 (Conv1D weights are [in, out]): the MLP and the embedding split, attention replicated, because c_attn stores q, k and v one after the other and no single slice gives a rank its heads",
        rules: &[
            ("*.mlp.c_fc.weight", Split::Dim(1)),
            ("*.mlp.c_fc.bias", Split::Dim(0)),
            ("*.mlp.c_proj.weight", Split::Dim(0)),
            ("*wte.weight", Split::Dim(0)),
        ],
    },
];

impl Splits {
    /// No rules: every tensor replicated.
    pub fn new() -> Splits {
        Splits::default()
    }

    /// Rules as `GLOB=DIM` (`*.q_proj.weight=0`, `*.o_proj.weight=-1`) or
    /// `GLOB=replicate`.
    pub fn parse<S: AsRef<str>>(rules: &[S]) -> Result<Splits> {
        let mut out = Splits::new();
        for rule in rules {
            let rule = rule.as_ref();
            let bad = || {
                spec(format!(
                    "split rule {rule:?}: expected GLOB=DIM (e.g. '*.q_proj.weight=0') or \
                     GLOB=replicate"
                ))
            };
            let (pattern, what) = rule.rsplit_once('=').ok_or_else(bad)?;
            if pattern.is_empty() {
                return Err(bad());
            }
            let split = match what.trim() {
                "replicate" => Split::Replicate,
                dim => Split::Dim(dim.parse().map_err(|_| bad())?),
            };
            out.rules.push((pattern.to_owned(), split));
        }
        Ok(out)
    }

    /// The rules of a preset in [`PRESETS`] (`llama`, `meta-llama`,
    /// `mixtral`, `gpt-neox`, `gpt2`).
    pub fn preset(name: &str) -> Result<Splits> {
        let preset = PRESETS
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
                spec(format!(
                    "no split preset {name:?}: the presets are {}",
                    names.join(", ")
                ))
            })?;
        Ok(Splits {
            rules: preset
                .rules
                .iter()
                .map(|(p, s)| ((*p).to_owned(), *s))
                .collect(),
        })
    }

    /// The given rules ([`Splits::parse`]), then those of `preset` when
    /// one is named ([`Splits::preset`]): what a front end's rules and
    /// preset options make.
    pub fn with_preset<S: AsRef<str>>(rules: &[S], preset: Option<&str>) -> Result<Splits> {
        let given = Splits::parse(rules)?;
        Ok(match preset {
            Some(name) => given.then(Splits::preset(name)?),
            None => given,
        })
    }

    /// These rules, then `other`'s (given rules first, a preset after:
    /// the first match decides).
    pub fn then(mut self, other: Splits) -> Splits {
        self.rules.extend(other.rules);
        self
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[(String, Split)] {
        &self.rules
    }

    /// What the first matching rule says for `name`.
    pub fn split_of(&self, name: &str) -> Split {
        self.rules
            .iter()
            .find(|(p, _)| glob(p, name))
            .map_or(Split::Replicate, |(_, s)| *s)
    }

    /// The part of `info` that `shard` holds under these rules: `None` when
    /// it is replicated, else its slice and the view of it (a narrower
    /// shape over the same storage). A rule naming a dimension the tensor
    /// lacks, and a quantized tensor (its parameters would need slicing
    /// too), are errors.
    pub fn slice(
        &self,
        name: &str,
        info: &TensorInfo,
        shard: Shard,
    ) -> Result<Option<(Slice, TensorInfo)>> {
        let Split::Dim(dim) = self.split_of(name) else {
            return Ok(None);
        };
        let ndim = info.shape.len();
        let Some(at) = resolve_dim(dim, ndim) else {
            return Err(Error::new(
                ErrorKind::InvalidSpec,
                format!(
                    "a split rule says dim {dim}, but the tensor has {ndim} dimension{} \
                     (shape {:?}); narrow the rule's pattern, or add GLOB=replicate before it",
                    if ndim == 1 { "" } else { "s" },
                    info.shape
                ),
            )
            .for_tensor(name));
        };
        if info.quantization.is_some() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "a split rule matches a quantized tensor: its scales and zero points would \
                 need the same slice; exclude it with GLOB=replicate",
            )
            .for_tensor(name));
        }
        let size = info.shape.get(at).copied().unwrap_or(0);
        let (start, len) = shard.part(size);
        Ok(Some((
            Slice {
                dim: at,
                start,
                len,
            },
            info.narrow(at, start, len)?,
        )))
    }
}

impl TensorInfo {
    /// The view of elements `start..start + len` along `dim`: the same
    /// storage, a later offset, a narrower shape (torch's `narrow`).
    pub fn narrow(&self, dim: usize, start: u64, len: u64) -> Result<TensorInfo> {
        let bad = || {
            Error::new(
                ErrorKind::InvalidSpec,
                format!(
                    "narrow({dim}, {start}, {len}) outside shape {:?}",
                    self.shape
                ),
            )
            .for_tensor(&self.name)
        };
        let size = *self.shape.get(dim).ok_or_else(bad)?;
        let stride = *self.stride.get(dim).ok_or_else(bad)?;
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(bad());
        }
        let mut out = self.clone();
        if let Some(s) = out.shape.get_mut(dim) {
            *s = len;
        }
        // An empty slice keeps the offset where torch would put it (it
        // reads nothing either way).
        out.storage_offset = self
            .storage_offset
            .checked_add(start.checked_mul(stride).ok_or_else(bad)?)
            .ok_or_else(bad)?;
        out.numel = out
            .shape
            .iter()
            .try_fold(1u64, |a, &s| a.checked_mul(s))
            .ok_or_else(bad)?;
        out.nbytes = out
            .numel
            .checked_mul(self.dtype.size() as u64)
            .ok_or_else(bad)?;
        Ok(out)
    }
}

/// A rule's dimension as an index into a shape of `ndim` dimensions
/// (negative counts from the last, as in torch); `None` when it has no
/// such dimension.
pub(crate) fn resolve_dim(dim: i64, ndim: usize) -> Option<usize> {
    let at = if dim < 0 {
        i64::try_from(ndim).ok()?.checked_add(dim)?
    } else {
        dim
    };
    usize::try_from(at).ok().filter(|&d| d < ndim)
}

fn spec(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidSpec, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_follow_tensor_split() {
        // torch.tensor_split(torch.arange(10), 4): sizes 3, 3, 2, 2.
        let parts: Vec<(u64, u64)> = (0..4)
            .map(|r| Shard { rank: r, world: 4 }.part(10))
            .collect();
        assert_eq!(parts, [(0, 3), (3, 3), (6, 2), (8, 2)]);
        // More ranks than elements: the last ones get nothing.
        let parts: Vec<(u64, u64)> = (0..3)
            .map(|r| Shard { rank: r, world: 3 }.part(2))
            .collect();
        assert_eq!(parts, [(0, 1), (1, 1), (2, 0)]);
        for size in 0..40u64 {
            for world in 1..10u32 {
                let mut next = 0;
                for rank in 0..world {
                    let (start, len) = Shard { rank, world }.part(size);
                    assert_eq!(start, next);
                    next = start + len;
                    assert!(len == size / u64::from(world) || len == size / u64::from(world) + 1);
                }
                assert_eq!(next, size);
            }
        }
    }

    #[test]
    fn parses_shards_and_rules() {
        assert_eq!(Shard::parse("3/8").ok(), Some(Shard { rank: 3, world: 8 }));
        assert!(Shard::parse("8/8").is_err());
        assert!(Shard::parse("1/0").is_err());
        assert!(Shard::parse("x").is_err());
        assert_eq!(
            Shard::from_arg(" 3/8").ok(),
            Some(Shard { rank: 3, world: 8 })
        );
        assert!(Shard::from_arg("envy").is_err());
        let env = |k: &str| match k {
            "RANK" => Some("2".to_owned()),
            "WORLD_SIZE" => Some("4".to_owned()),
            _ => None,
        };
        assert_eq!(
            Shard::from_vars(env).ok(),
            Some(Shard { rank: 2, world: 4 })
        );
        assert!(Shard::from_vars(|_| None).is_err());
        let rules = Splits::parse(&["*.b=replicate", "*.w=-1", "*=0"]).unwrap();
        assert_eq!(rules.split_of("x.b"), Split::Replicate);
        assert_eq!(rules.split_of("x.w"), Split::Dim(-1));
        assert_eq!(rules.split_of("y"), Split::Dim(0));
        assert!(Splits::parse(&["nodim"]).is_err());
        assert!(Splits::parse(&["=0"]).is_err());
        assert!(Splits::preset("LLAMA").is_ok());
        assert!(Splits::preset("bert").is_err());
    }
}
