//! Options shared by every command that opens a checkpoint: policy,
//! mapping, state-dict selection. Each group builds the library value it
//! stands for; malformed specs are errors that show the grammar.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, ValueEnum};
use ptload_reader::checkpoint::StringEncoding;
use ptload_reader::placement::{BudgetSpec, ByName, Choices, Device, MapLocation, Mapper};
use ptload_reader::state_dict::{KeySelect, StateDictOptions, Strip};
use ptload_reader::tp::{Shard, Splits};
use ptload_reader::{Checkpoint, DType, OpenOptions, Policy};

pub(crate) type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

// Policy and decoding options.
#[derive(Args, Debug, Clone)]
pub(crate) struct OpenArgs {
    /// Refuse globals outside torch's weights_only allowlist, as
    /// torch.load(weights_only=True) does.
    #[arg(long)]
    pub(crate) strict: bool,
    /// Allow globals under --strict, like torch.serialization.add_safe_globals: module.name,
    /// a comma-separated list, or globs (mymodels.*). Repeatable. Globals of os, sys, posix
    /// and nt stay refused.
    #[arg(long = "allow-global", value_name = "MODULE.NAME[,...]")]
    pub(crate) allow_global: Vec<String>,
    /// How Python 2 strings in old checkpoints decode (torch.load's `encoding`).
    #[arg(
        long,
        default_value = "utf8",
        value_parser = PossibleValuesParser::new(["utf8", "latin1", "bytes"])
            .try_map(|name| name.parse::<StringEncoding>()),
    )]
    pub(crate) encoding: StringEncoding,
    /// Read the file into memory instead of mapping it, for files another process may
    /// truncate or rewrite meanwhile (a mapped file that shrinks ends the process).
    #[arg(long = "no-mmap")]
    pub(crate) no_mmap: bool,
    /// Read by positioned reads (pread) instead of mapping: only what is parsed and the
    /// tensors asked for, for network file systems where mapped reads are slow or stall.
    #[arg(long, conflicts_with = "no_mmap")]
    pub(crate) pread: bool,
    /// Read the directory's rank files (each rank's torch.save of its part of a sharded model,
    /// no placement recorded) as one state dict, each tensor cut among the ranks as RULES say:
    /// GLOB=DIM or GLOB=replicate, comma-separated, the first match deciding (a tensor no rule
    /// matches is whole on every rank, its copies checked equal); fsdp2 is FSDP2's fully_shard
    /// (*.step=replicate,*=0).
    #[arg(long = "rank-files", value_name = "RULES|fsdp2")]
    pub(crate) rank_files: Option<String>,
    /// Refuse a file that `ptload scan` puts at LEVEL or above, naming what it found, and read
    /// the rest: dangerous (code, processes, files, network, gadgets), ambiguous, unknown-call,
    /// needs-code (any pickled class).
    #[arg(
        long = "refuse-at",
        value_name = "LEVEL",
        value_parser = PossibleValuesParser::new(["needs-code", "unknown-call", "ambiguous", "dangerous"])
            .try_map(|name| ptload_reader::scan::Level::from_name(&name).ok_or("unknown level")),
    )]
    pub(crate) refuse_at: Option<ptload_reader::scan::Level>,
}

/// `convert --metadata`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum MetadataArg {
    None,
    Values,
    All,
}

impl OpenArgs {
    /// The checkpoint at `path` as a set (a file, a directory of shards, an
    /// index, a URL), or with --rank-files the rank files of the
    /// directory `path` as one state dict.
    pub(crate) fn open_set(
        &self,
        path: &std::path::Path,
        opts: &OpenOptions,
    ) -> ptload_reader::Result<ptload_reader::set::CheckpointSet> {
        let input = ptload_reader::set::Input::new(path);
        let set = match &self.rank_files {
            Some(rules) => {
                input.open_rank_parts(&ptload_reader::dcp::fsdp::rank_rules(rules)?, opts)?
            }
            None => input.open(opts)?,
        };
        // Read by ranges, a storage's bytes are freed once consumed; the
        // allocator gives them back at once, so the pass holds its window
        // and not what it has already read.
        if set
            .files()
            .iter()
            .any(|f| f.checkpoint().fetched_bytes().is_some())
        {
            crate::alloc::give_back_at_once();
        }
        Ok(set)
    }

    pub(crate) fn options(&self) -> OpenOptions {
        let mut opts = OpenOptions::new()
            .policy(if self.strict {
                Policy::Strict
            } else {
                Policy::Default
            })
            .encoding(self.encoding)
            .in_memory(self.no_mmap)
            .positioned(self.pread)
            .refuse_at(self.refuse_at);
        for g in self.allow_global.iter().flat_map(|list| list.split(',')) {
            if !g.trim().is_empty() {
                opts = opts.allow_global(g.trim());
            }
        }
        opts
    }
}

// Where storages go.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct MapArgs {
    /// cpu | cuda (= cuda:0) | cuda:N | meta | auto (cuda:0 if a GPU is usable, else cpu) |
    /// FROM=TO[,FROM=TO...] (saved location -> device, others stay: cuda:1=cuda:0,cuda:3=cpu)
    #[arg(long = "map-location", value_name = "SPEC", conflicts_with_all = ["budget", "balance"])]
    pub(crate) map_location: Option<String>,
    /// Place storages by tensor name first: PATTERN=DEVICE[,...] (globs: encoder.*=cuda:0,*embed*=cpu).
    #[arg(long, value_name = "PATTERN=DEVICE[,...]")]
    pub(crate) place: Vec<String>,
    /// Fill each GPU up to this much, in order, then the host: a share of each
    /// GPU's memory (0.9, 90%) or bytes per GPU (20GiB, 512MB, 1000000).
    #[arg(long, value_name = "FRACTION_OR_BYTES", conflicts_with = "balance")]
    pub(crate) budget: Option<String>,
    /// Spread storages over cuda:0..cuda:N-1 by bytes, keeping consecutive layers together.
    #[arg(long, value_name = "N")]
    pub(crate) balance: Option<u32>,
}

/// `--map-location SPEC` as a mapper; `auto` asks how many GPUs there are.
pub(crate) fn map_location(spec: &str, gpus: impl FnOnce() -> usize) -> CliResult<Box<dyn Mapper>> {
    spec.parse::<MapLocation>()
        .map(|m| m.mapper(gpus))
        .map_err(|e| format!("invalid --map-location {}", e.message()).into())
}

/// What the mapping needs to know about the machine's GPUs.
pub(crate) trait GpuInfo {
    /// Number of usable CUDA devices.
    fn count(&self) -> usize;
    /// `(ordinal, total bytes)` of each.
    fn totals(&self) -> Vec<(u32, u64)>;
    /// Why there is none, when there is none.
    fn why_none(&self) -> String;
}

impl MapArgs {
    pub(crate) fn is_set(&self) -> bool {
        self.map_location.is_some()
            || !self.place.is_empty()
            || self.budget.is_some()
            || self.balance.is_some()
    }

    /// The mapper these options describe: `--place` rules first, then the
    /// map location, budget or balance; the saved location otherwise.
    pub(crate) fn mapper(
        &self,
        ckpt: &Checkpoint,
        gpus: &dyn GpuInfo,
    ) -> CliResult<Box<dyn Mapper>> {
        let by_name =
            ByName::parse(&self.place).map_err(|e| format!("invalid --place {}", e.message()))?;
        let map_location = match &self.map_location {
            Some(spec) => Some(map_location(spec, || gpus.count())?),
            None => None,
        };
        let budget = match &self.budget {
            Some(b) => {
                let spec: BudgetSpec = b.parse().map_err(|e: ptload_reader::Error| {
                    format!("invalid --budget {}", e.message())
                })?;
                let totals = gpus.totals();
                if totals.is_empty() {
                    crate::ui::note(&format!(
                        "--budget {b}: every storage it places stays on the host: {}",
                        gpus.why_none()
                    ));
                }
                Some(spec.budget(&totals))
            }
            None => None,
        };
        let balance = match self.balance {
            Some(0) => {
                return Err("invalid --balance 0: expected a number of GPUs, at least 1".into())
            }
            Some(n) => Some((0..n).map(Device::Cuda).collect()),
            None => None,
        };
        Ok(Choices {
            by_name,
            map_location,
            budget,
            balance,
        }
        .mapper(ckpt))
    }
}

// Which tensors, under which names.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct StateDictArgs {
    /// The sub-tree that is the state dict: a dotted path (state_dict, model.ema), `auto`
    /// (the model of a training checkpoint: state_dict, model_state_dict, model, model_state,
    /// module, ema...; it says when it is unsure) or `all`.
    #[arg(long, value_name = "PATH|auto|all")]
    pub(crate) key: Option<String>,
    /// Remove a prefix from every name: `auto` (module. and _orig_mod., when every name has
    /// them), `none`, or a literal prefix.
    #[arg(long = "strip-prefix", value_name = "auto|none|PREFIX")]
    pub(crate) strip_prefix: Option<String>,
    /// Add a prefix to every name (after stripping).
    #[arg(long = "add-prefix", value_name = "PREFIX")]
    pub(crate) add_prefix: Option<String>,
    /// Rename by glob: FROM=TO, each `*` of TO taking what a `*` of FROM matched
    /// (encoder.*=enc.*). Repeatable; the first match wins.
    #[arg(long, value_name = "FROM=TO")]
    pub(crate) rename: Vec<String>,
    /// Keep only tensors whose final name matches one of these globs (comma-separated or
    /// repeated: 'encoder.*,*.bias').
    #[arg(long, value_name = "GLOB[,...]")]
    pub(crate) include: Vec<String>,
    /// Leave out tensors whose final name matches one of these globs (after --include).
    #[arg(long, value_name = "GLOB[,...]")]
    pub(crate) exclude: Vec<String>,
    /// Tensor parallelism: take only this rank's part of each tensor a --split rule splits,
    /// as torch.tensor_split(t, WORLD, dim)[RANK] (sizes differ by at most one); only those
    /// bytes are read. `env` reads RANK and WORLD_SIZE (as torchrun sets them).
    #[arg(long, value_name = "RANK/WORLD|env")]
    pub(crate) shard: Option<String>,
    /// With --shard: split tensors whose final name matches GLOB along DIM (0 column-parallel,
    /// 1 row-parallel, -1 the last), or GLOB=replicate. Repeatable; the first match wins;
    /// unmatched tensors are replicated.
    #[arg(long, value_name = "GLOB=DIM")]
    pub(crate) split: Vec<String>,
    /// With --shard: a ready rule set after any --split rules: llama, meta-llama, mixtral, gpt-neox, gpt2.
    #[arg(long = "split-preset", value_name = "NAME")]
    pub(crate) split_preset: Option<String>,
}

/// `--key`'s help, with the default of the command it is on: commands
/// that use or compare the weights take the model (`auto`); `inspect`
/// shows the file as saved (`all`).
pub(crate) fn key_help(default: &str) -> String {
    format!(
        "The sub-tree that is the state dict: a dotted path (state_dict, model.ema), `auto` \
         (the model of a training checkpoint: state_dict, model_state_dict, model, model_state, \
         module, ema...; it says when it is unsure) or `all` [default here: {default}]"
    )
}

/// `--strip-prefix`'s help, with the command's default (see [`key_help`]).
pub(crate) fn strip_help(default: &str) -> String {
    format!(
        "Remove a prefix from every name: `auto` (module. and _orig_mod., when every name has \
         them), `none`, or a literal prefix [default here: {default}]"
    )
}

impl StateDictArgs {
    /// The rank and rules of --shard, --split and --split-preset.
    pub(crate) fn parallel(&self) -> CliResult<Option<(Shard, Splits)>> {
        let Some(shard) = self.shard.as_deref() else {
            if !self.split.is_empty() || self.split_preset.is_some() {
                return Err(
                    "--split and --split-preset need --shard RANK/WORLD (or --shard env)".into(),
                );
            }
            return Ok(None);
        };
        let shard = Shard::from_arg(shard)?;
        // A share with no rules is refused by the selection (in the
        // reader, for every front end).
        let splits = Splits::with_preset(&self.split, self.split_preset.as_deref())?;
        Ok(Some((shard, splits)))
    }
}

/// Globs given as repeated and comma-separated values.
fn globs(lists: &[String]) -> Vec<String> {
    lists
        .iter()
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_owned)
        .collect()
}

impl StateDictArgs {
    /// The options, with `inspect`'s defaults (everything, as saved) or
    /// `load`/`convert`'s (the model, wrappers stripped).
    pub(crate) fn options(&self, whole_by_default: bool) -> CliResult<StateDictOptions> {
        let key = match self.key.as_deref() {
            None if whole_by_default => KeySelect::All,
            None => KeySelect::Auto,
            Some(text) => text.parse()?,
        };
        let strip = match self.strip_prefix.as_deref() {
            None if whole_by_default => Strip::None,
            None => Strip::Auto,
            Some(text) => text.parse()?,
        };
        let renames = self
            .rename
            .iter()
            .map(|r| {
                r.split_once('=')
                    .filter(|(f, _)| !f.is_empty())
                    .map(|(f, t)| (f.to_owned(), t.to_owned()))
                    .ok_or_else(|| {
                        format!("invalid --rename {r:?}: expected FROM=TO (encoder.*=enc.*)")
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(StateDictOptions {
            key,
            strip,
            add_prefix: self.add_prefix.clone(),
            renames,
            include: globs(&self.include),
            exclude: globs(&self.exclude),
            parallel: self.parallel()?,
        })
    }
}

/// Say on stderr, one line each, what the automatic options decided
/// (unless `--quiet`).
pub(crate) fn tell_decisions(decisions: &[ptload_reader::state_dict::Decision]) {
    for d in crate::terms::decisions(decisions) {
        crate::ui::note(&d);
    }
}

/// `--dtype` names, as in ptload's output.
pub(crate) fn parse_dtype(text: &str) -> CliResult<DType> {
    match text.parse::<DType>() {
        Ok(d) if ptload_reader::cast::can_convert(DType::F32, d) => Ok(d),
        _ => {
            let targets: Vec<&str> = DType::ALL
                .into_iter()
                .filter(|&d| ptload_reader::cast::can_convert(DType::F32, d))
                .map(DType::name)
                .collect();
            Err(format!(
                "invalid --dtype {text:?}: expected one of {}",
                targets.join(", ")
            )
            .into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoGpu;
    impl GpuInfo for NoGpu {
        fn count(&self) -> usize {
            0
        }
        fn totals(&self) -> Vec<(u32, u64)> {
            Vec::new()
        }
        fn why_none(&self) -> String {
            "none here".into()
        }
    }

    #[test]
    fn map_location_grammar() {
        for ok in [
            "cpu",
            "cuda",
            "cuda:3",
            "meta",
            "auto",
            "cuda:1=cuda:0",
            "cuda:1=cuda:0,cuda:3=cpu",
            "npu:0=cpu",
        ] {
            assert!(map_location(ok, || 0).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "gpu",
            "cuda:x",
            "cuda:1=",
            "=cpu",
            "cuda:1=mps",
            "cuda:1=cuda:0,,",
            "a=b=c",
        ] {
            let e = map_location(bad, || 0)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                e.contains("expected cpu, cuda, cuda:N, meta, auto, or FROM=TO"),
                "{bad}: {e}"
            );
        }
        let _ = NoGpu.count();
    }
}
