//! [`KeySelect::Auto`](super::KeySelect::Auto): the model of a training checkpoint, or the whole
//! file, and the [`Decision`]s a selection reports.

use super::top;
use crate::advice::{Hint, Neutral, Setting, Terms};
use crate::checkpoint::Checkpoint;

/// Top-level keys under which training code saves the model, in the order
/// [`KeySelect::Auto`](super::KeySelect::Auto) prefers them: the model
/// itself first, then its averaged copies ([`AVERAGED_MODEL_KEYS`]).
/// Each comes from code that writes it:
pub const MODEL_KEYS: &[&str] = &[
    // PyTorch Lightning (`.ckpt`), timm's train.py (`CheckpointSaver`),
    // MMEngine and the OpenMMLab projects, NVIDIA's Tacotron 2, MoCo.
    "state_dict",
    // PyTorch's tutorial "Saving and loading a general checkpoint",
    // OpenAI's Whisper, and the many scripts that follow the tutorial.
    "model_state_dict",
    // torchvision's reference scripts, detectron2 and fvcore's
    // `Checkpointer`, fairseq, DeiT, MAE, Swin, ConvNeXt, Megatron-LM,
    // nanoGPT, VITS, Coqui TTS, fastai's `save_model`, Ultralytics YOLO (a
    // pickled module).
    "model",
    // resemblyzer's voice encoder and Real-Time-Voice-Cloning (encoder,
    // synthesizer, vocoder).
    "model_state",
    // DeepSpeed (`mp_rank_00_model_states.pt`).
    "module",
    // Research code: `{"net": model.state_dict(), ...}`, "network".
    "net",
    "network",
    // BasicSR and what builds on it (Real-ESRGAN, GFPGAN, CodeFormer).
    "params",
    // Averaged copies, after the model (see AVERAGED_MODEL_KEYS).
    "model_ema",
    "state_dict_ema",
    "ema",
    "params_ema",
    "ema_state_dict",
    "ema_model",
];

/// Those of [`MODEL_KEYS`] that hold an averaged copy of the model (an
/// exponential moving average): torchvision's reference scripts and DeiT
/// (`model_ema`, an `AveragedModel`), timm's train.py (`state_dict_ema`),
/// Ultralytics YOLO (`ema`), BasicSR (`params_ema`), and scripts that
/// save an EMA beside the model (`ema_state_dict`, `ema_model`). A file
/// that holds both the model and its average has two models: `auto` takes
/// the first and says it is unsure.
pub const AVERAGED_MODEL_KEYS: &[&str] = &[
    "model_ema",
    "state_dict_ema",
    "ema",
    "params_ema",
    "ema_state_dict",
    "ema_model",
];

/// Top-level entries of training checkpoints that hold tensors but are not
/// the model: optimizer and scheduler state, mixed-precision scalers,
/// random-number generator states, Lightning's loops and callbacks (a
/// `ModelCheckpoint` callback keeps `best_model_score` as a tensor). Each
/// comes from code that writes it:
pub const TRAINING_STATE: &[&str] = &[
    // The PyTorch tutorial ("optimizer_state_dict"), torchvision's
    // references and detectron2 ("optimizer", "lr_scheduler",
    // "scheduler"), timm ("optimizer", "amp_scaler"), Lightning
    // ("optimizer_states", "lr_schedulers", "loops", "callbacks").
    "optimizer",
    "optimizer_state_dict",
    "optimizer_states",
    "optimizers",
    "optim",
    "scheduler",
    "scheduler_state_dict",
    "lr_scheduler",
    "lr_schedulers",
    // resemblyzer and Real-Time-Voice-Cloning.
    "optimizer_state",
    "optim_state",
    // fastai ("opt"), fairseq ("last_optimizer_state", "extra_state"),
    // Megatron-LM ("opt_param_scheduler").
    "opt",
    "last_optimizer_state",
    "extra_state",
    "opt_param_scheduler",
    // GANs: HiFi-GAN ("optim_g", "optim_d"), rosinality's StyleGAN2
    // ("g_optim", "d_optim").
    "optim_g",
    "optim_d",
    "g_optim",
    "d_optim",
    // Mixed precision: torch.amp's GradScaler as scripts save it, timm's
    // "amp_scaler", Apex's "amp".
    "scaler",
    "scaler_state_dict",
    "grad_scaler",
    "amp_scaler",
    "amp",
    // Random-number generators: Megatron-LM ("rng_state"), scripts that
    // save each generator.
    "rng",
    "rng_state",
    "rng_states",
    "torch_rng_state",
    "cuda_rng_state",
    "cuda_rng_states",
    "numpy_rng_state",
    "random_state",
    // Lightning's loops and callbacks, metrics.
    "callbacks",
    "loops",
    "metrics",
    "best_model_score",
    // DINO's loss (its running center).
    "dino_loss",
];

/// What [`KeySelect::Auto`](super::KeySelect::Auto) decided for a checkpoint, and why, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AutoKey {
    /// The key whose sub-tree is the model; `None`: the whole file.
    pub key: Option<&'static str>,
    /// The model key the file has, taken or not; `None` for a plain state
    /// dict (nothing to decide).
    pub candidate: Option<&'static str>,
    /// Why, for the user: what else the file holds, or why it could not
    /// decide (the [`decision`](Self::decision)'s reason, in the reader's
    /// words).
    pub why: String,
    /// The decision to report; `None` for a plain state dict.
    pub decision: Option<Decision>,
}

/// What a selection decided, as data: each front end words it in its own
/// terms ([`Decision::render`]); `Display` gives the reader's words.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// [`KeySelect::Auto`](super::KeySelect::Auto) took the sub-tree under `key`: a training
    /// checkpoint's model.
    KeyChosen {
        /// The key taken.
        key: String,
        /// The other top-level entries (training state, plain values).
        beside: Vec<String>,
        /// Other model keys the file has, not taken: when there are any,
        /// `auto` is unsure which model is wanted ([`is_unsure`](Self::is_unsure)).
        other_models: Vec<String>,
    },
    /// [`KeySelect::Auto`](super::KeySelect::Auto) kept the whole file
    /// without knowing where the model is: no key known to hold one
    /// ([`MODEL_KEYS`]) holds tensors, yet the file is laid out as a
    /// training checkpoint (training state or plain values beside the
    /// tensors). Always [unsure](Self::is_unsure).
    Unrecognized {
        /// Top-level entries holding tensors that are not training state:
        /// where the model may be, in file order.
        candidates: Vec<String>,
        /// The training state and plain values beside them.
        beside: Vec<String>,
    },
    /// [`KeySelect::Auto`](super::KeySelect::Auto) kept the whole file although it has a model key.
    WholeFile {
        /// The model key the file has.
        candidate: String,
        /// Top-level entries holding tensors that are not training state;
        /// empty when every tensor is under `candidate` and nothing else
        /// is saved (the key is part of the names).
        foreign: Vec<String>,
    },
    /// Taking `key` left out the tensors outside it: how many per
    /// top-level group.
    GroupsLeftOut {
        /// The key taken.
        key: String,
        /// `(group, tensors)`, in file order.
        groups: Vec<(String, usize)>,
    },
    /// Include/exclude patterns left out this many tensors.
    Filtered {
        /// How many.
        left_out: usize,
    },
    /// [`Strip::Auto`](super::Strip::Auto) removed `prefix` from every name.
    PrefixStripped {
        /// The prefix removed.
        prefix: String,
    },
    /// A decision about one file of a set.
    InFile {
        /// The file's name in the set.
        file: String,
        /// What was decided for it.
        decision: Box<Decision>,
    },
}

impl Decision {
    /// The decision itself, without the file of a set it concerns.
    pub fn inner(&self) -> &Decision {
        let mut d = self;
        while let Decision::InFile { decision, .. } = d {
            d = decision;
        }
        d
    }

    /// Whether an automatic option ([`KeySelect::Auto`](super::KeySelect::Auto), [`Strip::Auto`](super::Strip::Auto))
    /// made this decision, rather than an explicit key or pattern.
    pub fn is_automatic(&self) -> bool {
        matches!(
            self.inner(),
            Decision::KeyChosen { .. }
                | Decision::WholeFile { .. }
                | Decision::Unrecognized { .. }
                | Decision::PrefixStripped { .. }
        )
    }

    /// Whether [`KeySelect::Auto`](super::KeySelect::Auto) is unsure of
    /// its choice: the file holds several models (a model and its
    /// average), or none under a key it knows. The decision's
    /// [`hint`](Self::hint) names the key option.
    pub fn is_unsure(&self) -> bool {
        match self.inner() {
            Decision::KeyChosen { other_models, .. } => !other_models.is_empty(),
            Decision::Unrecognized { .. } => true,
            _ => false,
        }
    }

    /// The hint the decision carries (the key to pass to take only the
    /// model the file has).
    pub fn hint(&self) -> Option<Hint> {
        match self.inner() {
            Decision::KeyChosen { other_models, .. } => match other_models.as_slice() {
                [] => None,
                [one] => Some(Hint::PassKey(Some(one.clone()))),
                _ => Some(Hint::PassKey(None)),
            },
            Decision::Unrecognized { candidates, .. } => match candidates.as_slice() {
                [] => None,
                [one] => Some(Hint::PassKey(Some(one.clone()))),
                _ => Some(Hint::PassKey(None)),
            },
            Decision::WholeFile { candidate, foreign } if !foreign.is_empty() => {
                Some(Hint::PassKey(Some(candidate.clone())))
            }
            _ => None,
        }
    }

    /// The reason [`KeySelect::Auto`](super::KeySelect::Auto) gave, without naming the setting.
    fn why(&self, terms: &dyn Terms) -> String {
        let hint = self.hint().map(|h| h.clause(terms)).unwrap_or_default();
        match self.inner() {
            Decision::KeyChosen {
                key,
                beside,
                other_models,
            } => {
                if other_models.is_empty() {
                    return format!(
                        "{key:?}: a training checkpoint's model (beside it: {})",
                        some_of(beside)
                    );
                }
                format!(
                    "unsure which model you want: took {key:?}, the first of {} models (beside \
                     them: {}); {} also hold{} a model{hint}",
                    other_models.len() + 1,
                    some_of(beside),
                    other_models
                        .iter()
                        .map(|m| match AVERAGED_MODEL_KEYS.contains(&m.as_str()) {
                            true => format!("{m} (an averaged copy)"),
                            false => m.clone(),
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
                    if other_models.len() == 1 { "s" } else { "" }
                )
            }
            Decision::Unrecognized { candidates, beside } => {
                let mut why = format!(
                    "the whole file, unsure where the model is: no key known to hold one ({}) \
                     holds tensors, but the file holds training state or plain values ({})",
                    some_of(MODEL_KEYS),
                    some_of(beside)
                );
                match candidates.as_slice() {
                    [] => why.push_str("; no other entry holds tensors"),
                    [one] => why.push_str(&format!("; the model may be {one:?}{hint}")),
                    more => why.push_str(&format!(
                        "; the model may be one of {}{hint}",
                        more.join(", ")
                    )),
                }
                why
            }
            Decision::WholeFile { candidate, foreign } if foreign.is_empty() => format!(
                "the whole file: every tensor is under {candidate:?} and nothing else is saved, \
                 so {candidate:?} is part of the names"
            ),
            Decision::WholeFile { candidate, foreign } => format!(
                "the whole file: {candidate:?} holds tensors, but so does {}, which is not \
                 training state{hint}",
                some_of(foreign)
            ),
            other => other.render(terms),
        }
    }

    /// The decision in `terms`: a front end's words for its settings and
    /// hints in the reader's sentence.
    pub fn render(&self, terms: &dyn Terms) -> String {
        match self {
            Decision::KeyChosen { .. }
            | Decision::WholeFile { .. }
            | Decision::Unrecognized { .. } => {
                format!("{} auto: {}", terms.setting(Setting::Key), self.why(terms))
            }
            Decision::GroupsLeftOut { key, groups } => {
                let left: usize = groups.iter().map(|(_, n)| n).sum();
                let groups: Vec<String> = groups.iter().map(|(g, n)| format!("{g}: {n}")).collect();
                format!(
                    "left out {left} tensor{} outside {key:?} ({})",
                    if left == 1 { "" } else { "s" },
                    some_of(&groups)
                )
            }
            Decision::Filtered { left_out } => format!(
                "left out {left_out} tensor{} by name (include/exclude)",
                if *left_out == 1 { "" } else { "s" }
            ),
            Decision::PrefixStripped { prefix } => format!(
                "{} auto: removed {prefix:?} from every name",
                terms.setting(Setting::StripPrefix)
            ),
            Decision::InFile { file, decision } => format!("{file}: {}", decision.render(terms)),
        }
    }
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render(&Neutral))
    }
}

/// Up to three items, then how many more.
fn some_of<S: AsRef<str>>(items: &[S]) -> String {
    let shown: Vec<&str> = items.iter().take(3).map(AsRef::as_ref).collect();
    match items.len().saturating_sub(3) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

/// What [`KeySelect::Auto`](super::KeySelect::Auto) picks for `ckpt`: the model of a training
/// checkpoint (the first of [`MODEL_KEYS`] holding tensors, when every
/// other top-level entry holding tensors is training state, see
/// [`TRAINING_STATE`], or another model), or the whole file, with the
/// reason either way. When it is unsure (several models, or training
/// state and plain values beside tensors under no key it knows), its
/// decision says so ([`Decision::is_unsure`]) and names the key option.
pub fn auto_key(ckpt: &Checkpoint) -> AutoKey {
    auto_key_of(&[ckpt])
}

/// [`auto_key`] over the files of a set together.
pub(super) fn auto_key_of(files: &[&Checkpoint]) -> AutoKey {
    let names = || files.iter().flat_map(|c| c.tensors().map(|t| t.name()));
    // Top-level entries holding tensors, in file order, each once.
    let mut tops: Vec<&str> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for name in names() {
        let top = top(name);
        if seen.insert(top) {
            tops.push(top);
        }
    }
    let is_model_tree =
        |key: &str| names().any(|n| n.strip_prefix(key).is_some_and(|r| r.starts_with('.')));
    let models: Vec<&'static str> = MODEL_KEYS
        .iter()
        .copied()
        .filter(|k| seen.contains(k) && is_model_tree(k))
        .collect();
    let owned = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    // Top-level entries holding only plain values (epoch, args, ...).
    let mut plain: Vec<&str> = Vec::new();
    let mut plain_seen = std::collections::HashSet::new();
    // A safetensors file's values are its header's metadata, not entries
    // beside its tensors.
    let tree_values = files
        .iter()
        .filter(|c| c.format() != crate::checkpoint::Format::Safetensors)
        .flat_map(|c| c.values());
    for (name, _) in tree_values {
        let top = top(name);
        if !seen.contains(top) && plain_seen.insert(top) {
            plain.push(top);
        }
    }
    let Some(&pick) = models.first() else {
        // No model key: a plain state dict, unless training state or plain
        // values lie beside the tensors (a training checkpoint whose
        // model is under a key not known here).
        let training: Vec<&str> = tops
            .iter()
            .copied()
            .filter(|t| TRAINING_STATE.contains(t))
            .collect();
        if tops.is_empty() || (training.is_empty() && plain.is_empty()) {
            return AutoKey {
                key: None,
                candidate: None,
                why: format!(
                    "the whole file: no training-checkpoint key ({}) holds the tensors",
                    some_of(MODEL_KEYS)
                ),
                decision: None,
            };
        }
        let candidates: Vec<&str> = tops
            .iter()
            .copied()
            .filter(|t| !TRAINING_STATE.contains(t))
            .collect();
        let beside: Vec<&str> = training.iter().chain(&plain).copied().collect();
        let decision = Decision::Unrecognized {
            candidates: owned(&candidates),
            beside: owned(&beside),
        };
        return AutoKey {
            key: None,
            candidate: None,
            why: decision.why(&Neutral),
            decision: Some(decision),
        };
    };
    let others: Vec<&str> = tops.iter().copied().filter(|t| *t != pick).collect();
    let foreign: Vec<&str> = others
        .iter()
        .copied()
        .filter(|t| !TRAINING_STATE.contains(t) && !MODEL_KEYS.contains(t))
        .collect();
    if !foreign.is_empty() {
        return AutoKey::decided(
            None,
            pick,
            Decision::WholeFile {
                candidate: pick.to_owned(),
                foreign: owned(&foreign),
            },
        );
    }
    if others.is_empty() && plain.is_empty() {
        return AutoKey::decided(
            None,
            pick,
            Decision::WholeFile {
                candidate: pick.to_owned(),
                foreign: Vec::new(),
            },
        );
    }
    // Beside the model: what is not another model.
    let beside: Vec<&str> = others
        .iter()
        .filter(|t| !models.contains(t))
        .chain(&plain)
        .copied()
        .collect();
    AutoKey::decided(
        Some(pick),
        pick,
        Decision::KeyChosen {
            key: pick.to_owned(),
            beside: owned(&beside),
            other_models: owned(models.get(1..).unwrap_or_default()),
        },
    )
}

impl AutoKey {
    fn decided(key: Option<&'static str>, candidate: &'static str, decision: Decision) -> AutoKey {
        AutoKey {
            key,
            candidate: Some(candidate),
            why: decision.why(&Neutral),
            decision: Some(decision),
        }
    }
}
