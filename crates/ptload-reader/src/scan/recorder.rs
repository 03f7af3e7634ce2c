//! The recording interpreter a scan's pickle pass runs: it builds every
//! value inert, records each global the pickle names and how it is used
//! (referenced, instantiated, called), and follows what torch and Python
//! would do with the values on load (the unpickler's implicit calls,
//! `__setstate__`, finalizers, the library code the loader consults), so
//! that a callable the file reaches is reported as called where it would
//! be. `reach.rs` runs it over each pickle torch would read.

use std::borrow::Cow;

use hashbrown::{HashMap, HashSet};

use super::report::{GlobalUse, Usage};
use super::{classify, conditional_data, known_enum, wrapper_class, Danger, GlobalClass};
use crate::error::Result;
use crate::pickle::{Heap, Interpreter, Obj, ObjId, Object, Value};

/// What a value of the scanned pickle came from.
#[derive(Debug, Clone, Copy)]
enum Origin {
    /// The global at this index.
    Global(usize),
    /// An instance of (or a value returned by) the global at this index.
    Made(usize),
}

/// The recording interpreter: every value it creates is inert.
#[derive(Default)]
pub(super) struct Recorder {
    pub(super) globals: Vec<GlobalUse>,
    by_path: HashMap<(String, String), usize>,
    origins: HashMap<ObjId, Origin>,
    /// What calling a wrapper (a `functools.partial`) calls: the function
    /// it was made with, and any its BUILD state put in.
    wrapped: HashMap<ObjId, Vec<Value>>,
    /// The instance attributes BUILD set that the unpickler itself calls
    /// later (`append`, `extend`: see [`IMPLICIT_METHODS`]), by object.
    methods: HashMap<ObjId, Vec<(String, Value)>>,
    /// By global: whether every call of it so far had one constant for
    /// its arguments (a candidate for [`Usage::LookedUp`]).
    lookups: HashMap<usize, bool>,
    /// What an object was given besides its items: the arguments of its
    /// constructor (NEWOBJ, or the call of a class ptload does not know)
    /// and each BUILD's state. Walked (see [`Recorder::walk`]) when the
    /// unpickler calls a method of the object.
    held: HashMap<ObjId, Vec<Value>>,
    /// Objects a BUILD has filled (a second BUILD runs the class's code
    /// with what the first set).
    built: HashSet<ObjId>,
    /// `builtins.getattr` globals used only to take a named attribute of
    /// an instance the pickle made (a bound method: how torch pickles a
    /// module's hook).
    instance_getattr: HashSet<usize>,
    /// A walk of what an object holds stopped at its limit
    /// ([`WALK_VISITS`]) before it had seen everything: what the rest
    /// calls is not known, and the pickle is reported ambiguous (a file
    /// padded to hide a callable behind thousands of values fails closed).
    pub(super) overflowed: std::cell::Cell<bool>,
    /// What each call's result was made from (its arguments), in call
    /// order: a result keeps what it was given alive (a parameter the
    /// state it set), for [`Recorder::unreturned`].
    given: Vec<(ObjId, Value)>,
    /// Bound methods: `getattr(instance, "name")` of an instance the
    /// pickle made, by value: the instance's class and the name. Calling
    /// one calls that method (see [`Recorder::calls`]).
    bound: HashMap<ObjId, (usize, String)>,
}

/// Arguments `(name, bases, namespace)`: what `type` and every metaclass
/// (`abc.ABCMeta`, typing's) make a class of. The namespace, when so.
fn class_args(heap: &Heap, items: &[Value]) -> Option<Value> {
    match items {
        [name, bases, namespace]
            if heap.str(*name).is_some()
                && heap.tuple(*bases).is_some()
                && heap.dict(*namespace).is_some() =>
        {
            Some(*namespace)
        }
        _ => None,
    }
}

/// How many levels below what is used [`Recorder::used`] follows: a
/// model's modules nest a dozen levels deep at most (a module and its
/// `_modules` dict are two).
const USED_DEPTH: usize = 32;

/// The methods of torch's base classes (`nn.Module`, `optim.Optimizer`,
/// torchmetrics' `Metric`) that their own code calls on an instance while
/// it is loaded or used, sorted: an instance attribute of one of these
/// names is what runs (torch 2.15's `dir()` of each, dunders aside).
const TORCH_BASE_METHODS: &[&str] = &[
    "OptimizerPostHook",
    "OptimizerPreHook",
    "_accelerator_graph_capture_health_check",
    "_apply",
    "_call_impl",
    "_copy_state_dict",
    "_cuda_graph_capture_health_check",
    "_filter_kwargs",
    "_forward_full_state_update",
    "_forward_reduce_state_update",
    "_get_backward_hooks",
    "_get_backward_pre_hooks",
    "_get_name",
    "_group_tensors_by_device_and_dtype",
    "_load_from_state_dict",
    "_maybe_warn_non_full_backward_hook",
    "_move_list_states_to_cpu",
    "_named_members",
    "_optimizer_step_code",
    "_patch_step_function",
    "_plot",
    "_process_value_according_to_param_policy",
    "_reduce_states",
    "_register_load_state_dict_pre_hook",
    "_register_state_dict_hook",
    "_replicate_for_data_parallel",
    "_save_to_state_dict",
    "_slow_forward",
    "_sync_dist",
    "_wrap_compute",
    "_wrap_update",
    "_wrapped_call_impl",
    "add_module",
    "add_param_group",
    "add_state",
    "apply",
    "bfloat16",
    "buffers",
    "children",
    "clone",
    "compile",
    "compute",
    "cpu",
    "cuda",
    "double",
    "eval",
    "extra_repr",
    "float",
    "forward",
    "get_buffer",
    "get_extra_state",
    "get_parameter",
    "get_submodule",
    "half",
    "ipu",
    "load_state_dict",
    "merge_state",
    "modules",
    "mtia",
    "named_buffers",
    "named_children",
    "named_modules",
    "named_parameters",
    "parameters",
    "persistent",
    "plot",
    "profile_hook_step",
    "register_backward_hook",
    "register_buffer",
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_full_backward_pre_hook",
    "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook",
    "register_module",
    "register_parameter",
    "register_state_dict_post_hook",
    "register_state_dict_pre_hook",
    "register_step_post_hook",
    "register_step_pre_hook",
    "requires_grad_",
    "reset",
    "set_dtype",
    "set_extra_state",
    "set_submodule",
    "share_memory",
    "state_dict",
    "step",
    "sync",
    "sync_context",
    "to",
    "to_empty",
    "train",
    "type",
    "unsync",
    "update",
    "xpu",
    "zero_grad",
];

/// Words of the names finalizers call on their instance (`close`,
/// `teardown`, `_tearDownAsyncioRunner`, `detach`, `cleanup`...).
const FINALIZER_WORDS: &[&str] = &[
    "close",
    "closed",
    "teardown",
    "tear",
    "cleanup",
    "clean",
    "detach",
    "release",
    "shutdown",
    "shut",
    "stop",
    "flush",
    "terminate",
    "kill",
    "join",
    "dispose",
    "finalize",
    "finalizer",
    "free",
    "exit",
    "destroy",
    "unregister",
    "disconnect",
    "del",
    "delete",
    "unlink",
    "remove",
    "dealloc",
    "finish",
    "end",
    "reset",
    "abort",
    "cancel",
    "quit",
];

/// How values given to code are used ([`Recorder::used_as`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    /// Anyhow: any method may run, with arguments the file chose.
    Any,
    /// Hashed, compared or converted: the methods that run are given
    /// nothing the file chose.
    Unargued,
    /// Iterated, measured or tested for truth (a rebuild's metadata, the
    /// `args` of `func(*args)`, a sparse tensor's parts, an object's
    /// state): as [`Use::Unargued`], but an object of a class the scanner
    /// does not know runs its own `__iter__`, `__len__`, `__bool__` or
    /// `items`, which may call a function it keeps as an attribute with
    /// what it holds (a filtering view's predicate, called on each key).
    Iterated,
}

/// How many levels below an object [`Recorder::walk`] looks: an item of
/// an attribute of an attribute (a policy object's attribute, a module's
/// `_modules` entry, a `UserDict`'s `data`).
const WALK_DEPTH: usize = 4;

/// Most values one walk visits (each charged as work).
pub(super) const WALK_VISITS: usize = 4096;

/// Classes the scanner does not know whose `__setitem__`, `append` and
/// `extend` store what they are given and call nothing the object holds:
/// mappings of Lightning and transformers that checkpoints hold. (torch's
/// module containers are not: their methods call others, `add_module`,
/// `_key_to_attr`, that an instance attribute can replace.)
fn plain_container(module: &str, name: &str) -> bool {
    matches!(
        (module, name),
        ("collections", "UserDict" | "UserList")
            | (
                "pytorch_lightning.utilities.parsing"
                    | "lightning.pytorch.utilities.parsing"
                    | "lightning.fabric.utilities.data"
                    | "lightning_fabric.utilities.data",
                "AttributeDict"
            )
            // Lightning's registries of strategies and accelerators.
            | (
                "pytorch_lightning.strategies.registry"
                    | "lightning.pytorch.strategies.registry"
                    | "lightning.fabric.strategies.registry"
                    | "lightning_fabric.strategies.registry",
                "_StrategyRegistry"
            )
            | (
                "pytorch_lightning.accelerators.registry"
                    | "lightning.pytorch.accelerators.registry"
                    | "lightning.fabric.accelerators.registry"
                    | "lightning_fabric.accelerators.registry",
                "_AcceleratorRegistry"
            )
            | ("transformers.tokenization_utils_base", "BatchEncoding")
            | ("transformers.feature_extraction_utils", "BatchFeature")
    ) || (module.starts_with("transformers.") && super::model_output(name))
}

/// Whether `module.name` is one of torch's optimizers (`torch.optim.Adam`,
/// `torch.optim.sgd.SGD`, a subclass in torch's tree), whose
/// `__setstate__` calls methods of the values in its state. Not the
/// learning-rate schedulers and averaging helpers beside them.
fn torch_optimizer(module: &str, name: &str) -> bool {
    let sub = module.strip_prefix("torch.optim");
    matches!(sub, Some(rest) if rest.is_empty() || rest.starts_with('.'))
        && !matches!(module, "torch.optim.lr_scheduler" | "torch.optim.swa_utils")
        && !name.ends_with("LR")
        && !name.contains("Scheduler")
}

/// The methods the unpickler calls on an object the pickle made: APPEND
/// calls `append`, APPENDS `extend` (or `append`). Python looks them up on
/// the instance first, so a BUILD that set one chose what is called.
/// (SETITEM and SETITEMS go through the type's `__setitem__`, and BUILD's
/// `__setstate__` set by an earlier BUILD is a dunder, a gadget already.)
const IMPLICIT_METHODS: [&str; 2] = ["append", "extend"];

impl Recorder {
    /// A container in a legacy persistent id (`('module', container,
    /// source_file, source)` in a stream, `(container, source_file,
    /// source)` in a tar): when the other fields are all truthy, torch's
    /// `_check_container_source` reads the container's source with
    /// `inspect.getsource` and, when it differs from the saved one and
    /// `container.dump_patches` is true, writes a diff to
    /// `container.__name__ + ".patch"`. A class named there (what
    /// `torch.save` writes) is torch's own case; an object the pickle
    /// made (a module object with a chosen `__name__`, `__file__` and
    /// `dump_patches`) chooses the file written: the global that made it
    /// is dangerous.
    fn container_source(&mut self, heap: &Heap, items: &[Value]) {
        let (container, fields) = match items {
            [first, container, fields @ ..] if heap.text(*first) == Some("module") => {
                (*container, fields)
            }
            [container, fields @ ..] => (*container, fields),
            [] => return,
        };
        let truthy = |v: Value| match v {
            Value::None | Value::Bool(false) | Value::Int(0) => false,
            Value::Float(f) => f != 0.0,
            _ => heap.text(v) != Some(""),
        };
        if fields.is_empty() || !fields.iter().all(|&f| truthy(f)) {
            return;
        }
        if let Some(Origin::Made(g)) = self.origin(container) {
            if let Some(u) = self.globals.get_mut(g) {
                u.class = GlobalClass::Dangerous(Danger::FileSystem);
            }
        }
    }

    /// Once the pickle has run: the classes of a package (not the standard
    /// library, torch or numpy) called only with one constant are enum
    /// member lookups ([`Usage::LookedUp`]). Whether the same pickle
    /// instantiates another class of the package does not matter: a file
    /// can always add one, and a user's enum is often the only object of
    /// its package in a file (a training script's hyper-parameters).
    /// `module.name` of the global `v` is (not of what a call made).
    pub(super) fn global_name(&self, v: Value) -> Option<String> {
        self.path_of(v)
            .map(|(module, name)| format!("{module}.{name}"))
    }

    pub(super) fn settle_lookups(&mut self) {
        // Not the code every loading machine has: any file can name a
        // class of that, and a capitalized name of it may be a class that
        // acts (`subprocess.Popen` re-exported by a module of CPython's
        // test suite, or of a library): its enums are listed by name.
        let own = |module: &str| !super::libraries::shipped(module);
        let class_like = |name: &str| {
            !name.contains('.') && name.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        };
        for (&g, &only) in &self.lookups {
            let Some(u) = self.globals.get_mut(g) else {
                continue;
            };
            if only
                && u.usage == Usage::Called
                && u.class == GlobalClass::Unknown
                && class_like(&u.name)
                && own(&u.module)
            {
                u.usage = Usage::LookedUp;
            }
        }
    }

    /// Once the pickle has run: a callable the scanner does not know that
    /// the file calls (not a lookup) is at the level its name says it
    /// acts at ([`super::dangerous_when_called`]).
    pub(super) fn settle_effects(&mut self) {
        for &g in &self.instance_getattr {
            if let Some(u) = self.globals.get_mut(g) {
                if u.usage == Usage::Referenced {
                    u.class = GlobalClass::Data;
                    u.usage = Usage::LookedUp;
                }
            }
        }
        for u in &mut self.globals {
            if u.usage == Usage::Called && u.class == GlobalClass::Unknown {
                // An attribute path (`chararray.tofile`) is a method: its
                // last name says what it does.
                let effect = match u.name.rsplit_once('.') {
                    Some((_, method)) => super::dangerous_method(method)
                        .or_else(|| super::dangerous_when_called(&u.name)),
                    None => super::dangerous_when_called(&u.name),
                };
                if let Some(d) = effect {
                    u.class = GlobalClass::Dangerous(d);
                }
            }
        }
        // What is still an unknown call, into code every loading machine
        // has (not the file's own model code), is no checkpoint's call:
        // a payload's. Its enums are listed by name (`KNOWN_ENUMS`): a
        // capitalized class of it called with one word may be `Popen`.
        for u in &mut self.globals {
            if u.usage == Usage::Called
                && u.class == GlobalClass::Unknown
                && super::libraries::shipped(&u.module)
            {
                u.class = GlobalClass::Dangerous(Danger::LibraryCall);
            }
        }
    }

    /// Objects the pickle made among the members of plain sequences and
    /// sets in `values`, and the keys of plain dicts, two levels down (a
    /// list of pairs), not below an object the pickle made; the globals
    /// among the first level's members go to `named` (a library's table in
    /// the list `OrderedDict` unpacks). Each value looked at is charged as
    /// work.
    fn made_members(
        &self,
        heap: &Heap,
        values: &[Value],
        named: &mut Vec<Value>,
    ) -> Result<Vec<Value>> {
        let made = |v: Value| matches!(self.origin(v), Some(Origin::Made(_)));
        // The members of a container (a dict's keys), with no copy of a
        // sequence's; none of anything else, an object the pickle made
        // included.
        let members = |v: Value| -> Cow<'_, [Value]> {
            if !matches!(v, Value::Obj(_)) || made(v) {
                return Cow::Borrowed(&[]);
            }
            if let Some(seq) = heap.sequence(v) {
                return Cow::Borrowed(seq);
            }
            if let Some(d) = heap.dict(v) {
                return Cow::Owned(d.entries().iter().map(|&(k, _)| k).collect());
            }
            Cow::Owned(heap.members(v).unwrap_or_default())
        };
        let mut found = Vec::new();
        let mut nested = Vec::new();
        let mut looked = 0u64;
        for &v in values {
            for &m in members(v).iter() {
                looked += 1;
                if made(m) {
                    found.push(m);
                    continue;
                }
                if matches!(self.origin(m), Some(Origin::Global(_))) {
                    named.push(m);
                    continue;
                }
                for &n in members(m).iter() {
                    looked += 1;
                    if made(n) {
                        found.push(n);
                    } else if hashed_whole(heap, n) {
                        nested.push(n);
                    }
                }
            }
        }
        // Hashing a tuple or a frozenset hashes its members, however deep
        // (`Counter([((x,),)])`): below two levels, those are followed,
        // each once, at most [`WALK_VISITS`] values.
        let mut seen = HashSet::new();
        while let Some(t) = nested.pop() {
            let Value::Obj(id) = t else {
                continue;
            };
            if !seen.insert(id) {
                continue;
            }
            for &x in members(t).iter() {
                looked += 1;
                if looked > WALK_VISITS as u64 {
                    self.overflowed.set(true);
                    nested.clear();
                    break;
                }
                if made(x) {
                    found.push(x);
                } else if hashed_whole(heap, x) {
                    nested.push(x);
                }
            }
        }
        heap.charge_work(looked)?;
        Ok(found)
    }

    /// Objects of classes the scanner does not know that the pickle made,
    /// that hold something, and that `result` does not reach: the load
    /// frees them as it ends (left on the stack, kept only in the memo,
    /// dropped by POP or replaced), and their classes' `__del__` run. One
    /// pass over what `result` reaches, each value charged as work; none
    /// when no such object was made.
    pub(super) fn unreturned(
        &self,
        heap: &Heap,
        result: Value,
    ) -> Result<(Vec<Value>, Vec<Value>)> {
        let mut candidates: Vec<ObjId> = self
            .origins
            .iter()
            .filter(|&(_, o)| {
                matches!(o, Origin::Made(g) if self.globals.get(*g).is_some_and(|u| {
                    u.class == GlobalClass::Unknown && !plain_container(&u.module, &u.name)
                }))
            })
            .map(|(&id, _)| id)
            .filter(|&id| {
                self.held.contains_key(&id)
                    || matches!(heap.get(Value::Obj(id)), Some(Obj::Object(o))
                        if !o.items.entries().is_empty() || !o.list.is_empty())
            })
            .collect();
        heap.charge_work(self.origins.len() as u64)?;
        if candidates.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        heap.charge_work(self.given.len() as u64)?;
        let given: HashMap<ObjId, Value> = self.given.iter().copied().collect();
        let mut reached = HashSet::new();
        let mut queue = vec![result];
        while let Some(v) = queue.pop() {
            let Value::Obj(id) = v else {
                continue;
            };
            if !reached.insert(id) {
                continue;
            }
            let below = self.children(heap, v, id);
            heap.charge_work(below.len() as u64 + 1)?;
            queue.extend(below.into_iter().map(|(_, x)| x));
            queue.extend(given.get(&id).copied());
        }
        candidates.sort_unstable();
        let (kept, freed): (Vec<ObjId>, Vec<ObjId>) =
            candidates.into_iter().partition(|id| reached.contains(id));
        Ok((
            freed.into_iter().map(Value::Obj).collect(),
            kept.into_iter().map(Value::Obj).collect(),
        ))
    }

    fn inert(&mut self, heap: &mut Heap, origin: Option<Origin>) -> Result<Value> {
        let v = heap.alloc(Obj::Object(Box::new(Object {
            class: Value::None,
            args: Value::None,
            state: None,
            items: Default::default(),
            list: Vec::new(),
        })))?;
        if let (Value::Obj(id), Some(o)) = (v, origin) {
            self.origins.insert(id, o);
        }
        Ok(v)
    }

    fn origin(&self, v: Value) -> Option<Origin> {
        match v {
            Value::Obj(id) => self.origins.get(&id).copied(),
            _ => None,
        }
    }

    /// Whether `v` is something calling runs code the file chose: a global
    /// (a function, a class), a wrapper (a partial, what a builtin handed
    /// back), or a bound method of an instance.
    fn is_callable(&self, v: Value) -> bool {
        matches!(self.origin(v), Some(Origin::Global(_)))
            || matches!(v, Value::Obj(id) if self.wrapped.contains_key(&id) || self.bound.contains_key(&id))
    }

    fn global_index(&self, v: Value) -> Option<usize> {
        match self.origin(v) {
            Some(Origin::Global(i)) => Some(i),
            _ => None,
        }
    }

    /// The functions and classes (bare globals) and wrappers among
    /// `values` and their members one level down (a tuple, list or dict
    /// passed in).
    fn callables_among(&self, heap: &Heap, values: &[Value]) -> Result<Vec<Value>> {
        let callable = |v: Value| self.is_callable(v);
        let mut found = Vec::new();
        for &v in values {
            if callable(v) {
                found.push(v);
                continue;
            }
            let members = match heap.dict(v) {
                Some(d) => d.entries().iter().map(|&(_, x)| x).collect(),
                None => heap.members(v).unwrap_or_default(),
            };
            heap.charge_work(members.len() as u64)?;
            found.extend(members.into_iter().filter(|&m| callable(m)));
        }
        Ok(found)
    }

    /// The origin of the first of `values`, or of their members one level
    /// down (a tuple or list passed in), that has one.
    fn origin_within(&self, heap: &Heap, values: &[Value]) -> Result<Option<Origin>> {
        for &v in values {
            if let Some(o) = self.origin(v) {
                return Ok(Some(o));
            }
            // A value that is no container has no members to look in.
            let Some(members) = heap.members(v) else {
                continue;
            };
            heap.charge_work(members.len() as u64)?;
            if let Some(o) = members.iter().find_map(|&m| self.origin(m)) {
                return Ok(Some(o));
            }
        }
        Ok(None)
    }

    fn mark(&mut self, global: Option<usize>, usage: Usage) {
        if let (Some(i), Usage::Called) = (global, usage) {
            // A call by any other way than `call`'s with one constant.
            self.lookups.insert(i, false);
        }
        if let Some(g) = global.and_then(|i| self.globals.get_mut(i)) {
            g.usage = g.usage.max(usage);
            // Plain data only for the arguments `call` checks: called any
            // other way (by `map`, a wrapper, as what a call made), it is
            // a call of an unknown callable.
            if usage == Usage::Called
                && g.class == GlobalClass::Data
                && conditional_data(&g.module, &g.name)
            {
                g.class = GlobalClass::Unknown;
            }
        }
    }

    /// What a call of known data does when its arguments make it act:
    /// `re._compile(pattern, flags)` with `re.DEBUG` among the flags
    /// prints the pattern's parse tree (a library call outside its data
    /// use, as any uncatalogued one);
    /// `_codecs.encode` or `decode` with a codec other than the text
    /// codecs pickles name imports `encodings.<codec>`, the module the
    /// codec registry finds for it (an import). `None` for any other call.
    fn acting_arguments(
        &self,
        heap: &Heap,
        callable: Value,
        items: &[Value],
    ) -> Option<GlobalClass> {
        let (module, name) = self.path_of(callable)?;
        match (module, name) {
            ("re", "_compile") => match items.get(1).copied()? {
                Value::Int(flags) if flags & RE_DEBUG == 0 => None,
                _ => Some(GlobalClass::Dangerous(Danger::LibraryCall)),
            },
            ("_codecs" | "codecs", "encode" | "decode") => {
                match heap.text(items.get(1).copied()?) {
                    Some(codec) if pickle_codec(codec) => None,
                    _ => Some(GlobalClass::Dangerous(Danger::Import)),
                }
            }
            _ => None,
        }
    }

    /// Whether `v` is a global that is plain data for some arguments only
    /// (and not yet seen called with others).
    fn conditional(&self, v: Value) -> bool {
        self.global_index(v)
            .and_then(|i| self.globals.get(i))
            .is_some_and(|g| g.class == GlobalClass::Data && conditional_data(&g.module, &g.name))
    }

    /// The global `v` is when it is one of typing's forms or aliases
    /// (`typing.Union`, `typing_extensions.Literal`: a capitalized name of
    /// the module, no attribute path), whose subscription only builds an
    /// alias.
    fn typing_form(&self, v: Value) -> Option<usize> {
        let g = self.global_index(v)?;
        let u = self.globals.get(g)?;
        (matches!(u.module.as_str(), "typing" | "typing_extensions")
            && u.class == GlobalClass::Unknown
            && !u.name.contains('.')
            && u.name.starts_with(|c: char| c.is_ascii_uppercase()))
        .then_some(g)
    }

    /// Whether `v` is an alias a typing form's subscription built.
    fn typing_alias(&self, v: Value) -> bool {
        matches!(self.origin(v), Some(Origin::Made(g))
        if self.globals.get(g).is_some_and(|u| {
            matches!(u.module.as_str(), "typing" | "typing_extensions")
                && u.usage == Usage::Instantiated
        }))
    }

    fn path_of(&self, v: Value) -> Option<(&str, &str)> {
        let g = self.globals.get(self.global_index(v)?)?;
        Some((g.module.as_str(), g.name.as_str()))
    }

    /// `v` is called: the global it is or came from, and through a
    /// wrapper what the wrapper holds (each wrapper opened once, so a
    /// cycle of wrappers ends).
    fn calls(&mut self, heap: &Heap, v: Value) -> Result<()> {
        let mut stack = vec![v];
        while let Some(v) = stack.pop() {
            heap.charge_work(1)?;
            let method = match v {
                Value::Obj(id) => self.bound.get(&id).cloned(),
                _ => None,
            };
            if let Some((class, name)) = method {
                self.method_called(class, &name);
            } else if let Some(Origin::Global(g) | Origin::Made(g)) = self.origin(v) {
                self.mark(Some(g), Usage::Called);
            }
            if let Value::Obj(id) = v {
                if let Some(wrapped) = self.wrapped.remove(&id) {
                    stack.extend(wrapped);
                }
            }
        }
        Ok(())
    }

    /// Method `name` of an instance of global `class` is called: recorded
    /// as a global of its own (`module.Class.name`), called, at the level
    /// the method's effect has (`Path.touch`, `ndarray.tofile`: files),
    /// else an unknown call: a method of data is still code the file chose
    /// to run, with arguments it chose.
    fn method_called(&mut self, class: usize, name: &str) {
        if let Some(index) = self.method_global(class, name) {
            self.lookups.insert(index, false);
            if let Some(u) = self.globals.get_mut(index) {
                u.usage = Usage::Called;
            }
        }
    }

    /// The global a bound method is recorded as (`module.Class.name`),
    /// made when first seen, named only: dangerous in any use when it is
    /// a method of data the scanner knows (a path, an array, a tensor)
    /// that reaches the file system (`Path.touch`, `ndarray.tofile`), as
    /// `os.system` is wherever it is; else an unknown callable (the
    /// model's own method: a module's hook). The index.
    fn method_global(&mut self, class: usize, name: &str) -> Option<usize> {
        let owner = self.globals.get(class)?;
        let key = (owner.module.clone(), format!("{}.{name}", owner.name));
        if let Some(&i) = self.by_path.get(&key) {
            return Some(i);
        }
        let data = owner.class != GlobalClass::Unknown;
        let danger = if data {
            super::dangerous_method(name)
        } else {
            None
        };
        let i = self.globals.len();
        self.globals.push(GlobalUse {
            module: key.0.clone(),
            name: key.1.clone(),
            offset: owner.offset,
            usage: Usage::Referenced,
            class: danger.map_or(GlobalClass::Unknown, GlobalClass::Dangerous),
        });
        self.by_path.insert(key, i);
        Some(i)
    }

    /// The attributes BUILD's `state` sets on `obj` (from a dict state, or
    /// either dict of a `(state, slotstate)` pair) that the unpickler may
    /// call later: see [`IMPLICIT_METHODS`].
    fn note_methods(&mut self, heap: &Heap, obj: Value, state: Value) -> Result<()> {
        let Value::Obj(id) = obj else {
            return Ok(());
        };
        let parts = match heap.tuple(state) {
            Some(items) => items.to_vec(),
            None => vec![state],
        };
        heap.charge_work(parts.len() as u64)?;
        for part in parts {
            let Some(dict) = heap.dict(part) else {
                continue;
            };
            heap.charge_work(dict.entries().len() as u64)?;
            for &(k, v) in dict.entries() {
                if let Some(name) = heap.text(k).filter(|k| IMPLICIT_METHODS.contains(k)) {
                    self.methods
                        .entry(id)
                        .or_default()
                        .push((name.to_owned(), v));
                }
            }
        }
        Ok(())
    }

    /// The wrapper `made` holds `func`: calling it calls `func`.
    fn wrap(&mut self, made: Value, func: Value) {
        if let Value::Obj(id) = made {
            self.wrapped.entry(id).or_default().push(func);
        }
    }

    /// `obj` was given `v` (constructor arguments, a BUILD state).
    fn hold(&mut self, obj: Value, v: Value) {
        if let Value::Obj(id) = obj {
            self.held.entry(id).or_default().push(v);
        }
    }

    /// Visit what `start` holds, breadth first, at most [`WALK_DEPTH`]
    /// levels down and [`WALK_VISITS`] values: a container's members, an
    /// object's items and elements, and what it was given ([`hold`]);
    /// `visit` gets each value with the key it is stored under, when that
    /// is a string. Never recursive; each visit charged as work.
    fn walk(
        &self,
        heap: &Heap,
        start: Value,
        mut visit: impl FnMut(Option<&str>, Value),
    ) -> Result<()> {
        let mut queue = std::collections::VecDeque::from([(start, 0usize)]);
        let mut seen = HashSet::new();
        let mut visits = 0usize;
        while let Some((v, depth)) = queue.pop_front() {
            let Value::Obj(id) = v else {
                continue;
            };
            if depth >= WALK_DEPTH || !seen.insert(id) {
                continue;
            }
            let below = self.children(heap, v, id);
            heap.charge_work(below.len() as u64 + 1)?;
            for (key, x) in below {
                visits += 1;
                if visits > WALK_VISITS {
                    self.overflowed.set(true);
                    return Ok(());
                }
                visit(key, x);
                queue.push_back((x, depth + 1));
            }
        }
        Ok(())
    }

    /// What `v` (object `id`) holds one level down: a container's members,
    /// a mapping's values and keys (a key may be a callable: iterating a
    /// mapping, `keys()`, `reversed` hand it out), an object's items and
    /// elements, and what it was given ([`hold`]), each value with the key
    /// it is stored under when that is text.
    fn children<'h>(&self, heap: &'h Heap, v: Value, id: ObjId) -> Vec<(Option<&'h str>, Value)> {
        let mut below: Vec<(Option<&str>, Value)> = Vec::new();
        let keys = |entries: &[(Value, Value)]| -> Vec<(Option<&'h str>, Value)> {
            entries
                .iter()
                .filter(|&&(k, _)| matches!(k, Value::Obj(_)) && heap.text(k).is_none())
                .map(|&(k, _)| (None, k))
                .collect()
        };
        match heap.get(v) {
            Some(Obj::Dict(d)) => {
                below.extend(d.entries().iter().map(|&(k, x)| (heap.text(k), x)));
                below.extend(keys(d.entries()));
            }
            Some(Obj::Object(o)) => {
                below.extend(o.items.entries().iter().map(|&(k, x)| (heap.text(k), x)));
                below.extend(keys(o.items.entries()));
                below.extend(o.list.iter().map(|&x| (None, x)));
            }
            _ => {
                if let Some(members) = heap.members(v) {
                    below.extend(members.into_iter().map(|x| (None, x)));
                }
            }
        }
        if let Some(given) = self.held.get(&id) {
            below.extend(given.iter().map(|&x| (None, x)));
        }
        below
    }

    /// The values stored under any of `names` in what `obj` holds: an
    /// instance attribute BUILD set, or an item a class's `__getattr__`
    /// answers attribute lookups with (a dict subclass's items, a
    /// `UserDict`'s `data`, a module's `_modules`).
    fn held_by_name(&self, heap: &Heap, obj: Value, names: &[&str]) -> Result<Vec<Value>> {
        let mut found = Vec::new();
        self.walk(heap, obj, |key, v| {
            if key.is_some_and(|k| names.contains(&k)) {
                found.push(v);
            }
        })?;
        Ok(found)
    }

    /// The callables `obj` holds: globals (functions, classes) and
    /// wrappers of them, anywhere [`walk`](Self::walk) reaches.
    fn held_callables(&self, heap: &Heap, obj: Value) -> Result<Vec<Value>> {
        let mut found = Vec::new();
        self.walk(heap, obj, |_, v| {
            if self.is_callable(v) {
                found.push(v);
            }
        })?;
        Ok(found)
    }

    /// The callables among `values` and anywhere below them that
    /// [`walk`](Self::walk) reaches: what a builtin handed these values may
    /// hand back or call (`next`, `min`, `reversed`, `dict`...), in order.
    fn callables_within(&self, heap: &Heap, values: &[Value]) -> Result<Vec<Value>> {
        let callable = |v: Value| self.is_callable(v);
        let mut found: Vec<Value> = values.iter().copied().filter(|&v| callable(v)).collect();
        for &v in values {
            found.extend(self.held_callables(heap, v)?);
        }
        Ok(found)
    }

    /// `values` are handed to code that uses them (a call's arguments, the
    /// fields of a persistent id torch formats and compares, a legacy
    /// header torch compares): Python runs the methods of any object the
    /// pickle made among them (`repr`, `str`, `format`, `len`, `==`,
    /// iteration, `keys()`, `items()`...), and what such an object holds
    /// (an attribute BUILD set, an item, what it was given) may be what
    /// those methods call. Each callable below an object the pickle made
    /// is called; callables in plain containers alone are not (a call
    /// given functions is judged by what it is). One breadth-first pass,
    /// at most [`USED_DEPTH`] levels (deeper, an object that holds
    /// anything makes the pickle ambiguous) and [`WALK_VISITS`] values,
    /// each charged as work.
    pub(super) fn used(&mut self, heap: &Heap, values: &[Value]) -> Result<()> {
        self.used_as(heap, values, Use::Any)
    }

    /// [`used`](Self::used), for values only hashed, compared or converted
    /// ([`Use::Unargued`]): the methods that run (`__hash__`, `__eq__`,
    /// `__index__`, `__iter__`) are given nothing the file chose, so a
    /// bare function or class below an object (a frozen dataclass's or a
    /// namedtuple's field: `act=F.gelu` in a dict key) is not taken for
    /// called: calling it would give it no argument. Wrappers
    /// (`functools.partial`, a bound method) carry their arguments and are
    /// called as under [`used`](Self::used); a bare callable of a known
    /// effect is at its level wherever it is.
    pub(super) fn used_unargued(&mut self, heap: &Heap, values: &[Value]) -> Result<()> {
        self.used_as(heap, values, Use::Unargued)
    }

    /// [`used_unargued`](Self::used_unargued), for values iterated,
    /// measured or tested for truth ([`Use::Iterated`]): a bare function
    /// kept under an attribute's name by an object of a class the scanner
    /// does not know is called.
    fn used_iterated(&mut self, heap: &Heap, values: &[Value]) -> Result<()> {
        self.used_as(heap, values, Use::Iterated)
    }

    fn used_as(&mut self, heap: &Heap, values: &[Value], how: Use) -> Result<()> {
        if values.is_empty() || self.nothing_to_call(heap)? {
            return Ok(());
        }
        let mut any = false;
        for &v in values {
            if self.may_hold(heap, v)? {
                any = true;
                break;
            }
        }
        if !any {
            return Ok(());
        }
        let made = |r: &Recorder, v: Value| matches!(r.origin(v), Some(Origin::Made(_)));
        let callable = |r: &Recorder, v: Value| r.is_callable(v);
        // Each value with its depth, whether an object the pickle made is
        // above it, the class of the nearest such object, and whether that
        // object is one of `values` (whose own methods run).
        let mut queue: std::collections::VecDeque<(Value, usize, bool, Option<usize>, bool)> =
            values
                .iter()
                .map(|&v| (v, 0, made(self, v), None, false))
                .collect();
        let mut seen = HashSet::new();
        let mut visits = 0usize;
        let mut called = Vec::new();
        while let Some((v, depth, inside, owner, owner_given)) = queue.pop_front() {
            let Value::Obj(id) = v else {
                continue;
            };
            if !seen.insert((id, inside)) {
                continue;
            }
            // Deeper than the walk follows: what lies below is not known,
            // and the pickle is ambiguous (a chain of objects, each
            // calling the next, hides a callable at its end).
            if depth >= USED_DEPTH {
                if self.may_hold(heap, v)? {
                    self.overflowed.set(true);
                }
                continue;
            }
            // An instance holds its own class (what made it was given it):
            // its methods are that class's, not a call of it.
            let (own, own_given) = match self.origin(v) {
                Some(Origin::Made(c)) => (Some(c), depth == 0),
                _ => (owner, owner_given),
            };
            let below = self.children(heap, v, id);
            heap.charge_work(below.len() as u64 + 1)?;
            for (key, x) in below {
                visits += 1;
                if visits > WALK_VISITS {
                    self.overflowed.set(true);
                    break;
                }
                let own_class = own.is_some() && self.global_index(x) == own;
                let bare = match how {
                    Use::Any => false,
                    Use::Unargued => self.global_index(x).is_some(),
                    // An attribute of an object given, whose class the
                    // scanner does not know: its own methods may call it.
                    Use::Iterated => {
                        self.global_index(x).is_some()
                            && !(key.is_some() && own_given && own.is_some_and(|c| !self.plain(c)))
                    }
                };
                if inside && callable(self, x) && !own_class && !bare {
                    called.push(x);
                }
                queue.push_back((x, depth + 1, inside || made(self, x), own, own_given));
            }
            if visits > WALK_VISITS {
                break;
            }
        }
        for v in called {
            self.calls(heap, v)?;
        }
        Ok(())
    }

    /// Objects the pickle constructed and torch's own functions iterate,
    /// measure or convert (`OrderedDict(x)` runs `x.keys()` and
    /// `x[key]`): the methods of their class run on the state the file
    /// gave them. Of a class of code every loading machine has that the
    /// scanner has no entry for, that is library code no checkpoint runs,
    /// acting on what the file chose (a mapping whose lookup imports the
    /// module its state names): an uncatalogued library call.
    pub(super) fn library_methods_run(&mut self, values: &[Value]) {
        for &v in values {
            match self.origin(v) {
                Some(Origin::Made(c)) => {
                    if let Some(u) = self.globals.get_mut(c) {
                        if u.class == GlobalClass::Unknown
                            && u.usage == Usage::Instantiated
                            && super::libraries::shipped(&u.module)
                        {
                            u.class = GlobalClass::Dangerous(Danger::LibraryCall);
                        }
                    }
                }
                Some(Origin::Global(_)) => self.library_objects_used(&[v]),
                None => {}
            }
        }
    }

    /// [`library_methods_run`](Self::library_methods_run) on `values` and
    /// on the members of the containers among them, one level down (a
    /// list's elements, a dict's keys: `dict([pair])` unpacks each pair).
    fn library_methods_run_within(&mut self, heap: &Heap, values: &[Value]) -> Result<()> {
        let mut all = values.to_vec();
        for &v in values {
            if self.origin(v).is_some() {
                continue;
            }
            if let Some(seq) = heap.sequence(v) {
                all.extend_from_slice(seq);
            } else if let Some(d) = heap.dict(v) {
                all.extend(d.entries().iter().map(|&(k, _)| k));
            }
        }
        heap.charge_work(all.len() as u64)?;
        self.library_methods_run(&all);
        Ok(())
    }

    /// Objects a library already holds, named by the file and given to a
    /// callable that iterates, converts or compares them
    /// (`dict(transformers.CONFIG_MAPPING)`, `str(builtins.license)`):
    /// their methods run, which no entry of the scanner's covers. A name
    /// in a class's spelling (`BertConfig`) is passed over: a class given
    /// to a builtin is converted or compared by `type`'s methods.
    fn library_objects_used(&mut self, values: &[Value]) {
        for &v in values {
            let Some(Origin::Global(c)) = self.origin(v) else {
                continue;
            };
            if let Some(u) = self.globals.get_mut(c) {
                let last = u.name.rsplit('.').next().unwrap_or_default();
                // Capitalized, with lower case letters or as one word:
                // `BertConfig`, `GRU`; not `CONFIG_MAPPING` or `license`.
                let word = last.trim_start_matches('_');
                let class_like = word.starts_with(|ch: char| ch.is_ascii_uppercase())
                    && (word.bytes().any(|b| b.is_ascii_lowercase()) || !word.contains('_'));
                if u.class == GlobalClass::Unknown
                    && !class_like
                    && super::libraries::shipped(&u.module)
                {
                    u.class = GlobalClass::Dangerous(Danger::LibraryCall);
                }
            }
        }
    }

    /// Whether the global at `g` is a library's (see
    /// [`libraries`](super::libraries)), not a model's own code.
    fn is_library(&self, g: usize) -> bool {
        self.globals
            .get(g)
            .is_some_and(|u| super::libraries::shipped(&u.module))
    }

    /// Whether the pickle has named nothing that calling could run: no
    /// wrapper or bound method, and every global torch's allowlist or
    /// known data. Then [`used`](Self::used) has nothing to find, however
    /// deep what it is given (a key of nested tuples) goes. Charged as
    /// work, one unit per global.
    fn nothing_to_call(&self, heap: &Heap) -> Result<bool> {
        if !self.wrapped.is_empty() || !self.bound.is_empty() {
            return Ok(false);
        }
        heap.charge_work(self.globals.len() as u64)?;
        Ok(self
            .globals
            .iter()
            .all(|u| matches!(u.class, GlobalClass::Tensor | GlobalClass::Data)))
    }

    /// Whether `v` may hold anything [`used`](Self::used) would find: an
    /// object the pickle made that holds something (items, elements, what
    /// it was given), or a container with such a member or a container
    /// among its members (one level is looked at, without recursion).
    /// Cheap, and never wrong the other way: a tensor's rebuild arguments
    /// (numbers, tuples of numbers, an empty `OrderedDict`) are passed over.
    fn may_hold(&self, heap: &Heap, v: Value) -> Result<bool> {
        // `v` itself, then (for a container) each member, where a
        // container member is enough.
        let holds = |x: Value, top: bool| -> Option<bool> {
            let Value::Obj(id) = x else {
                return Some(false);
            };
            match heap.get(x) {
                Some(Obj::Object(o)) => Some(
                    self.held.contains_key(&id)
                        || !o.items.entries().is_empty()
                        || !o.list.is_empty(),
                ),
                Some(Obj::Tuple(_) | Obj::List(_) | Obj::Dict(_) | Obj::Set(_)) => {
                    if top {
                        None
                    } else {
                        Some(true)
                    }
                }
                _ => Some(false),
            }
        };
        if let Some(answer) = holds(v, true) {
            return Ok(answer);
        }
        let member = |m: Value| holds(m, false).unwrap_or(true);
        if let Some(d) = heap.dict(v) {
            heap.charge_work(d.entries().len() as u64)?;
            return Ok(d.entries().iter().any(|&(k, x)| member(k) || member(x)));
        }
        if let Some(seq) = heap.sequence(v) {
            heap.charge_work(seq.len() as u64)?;
            return Ok(seq.iter().any(|&m| member(m)));
        }
        let members = heap.members(v).unwrap_or_default();
        heap.charge_work(members.len() as u64)?;
        Ok(members.into_iter().any(member))
    }

    /// What `v` stands for, as the value a builtin hands back from
    /// `values` (`next(it, default)`, `min`, `reversed`, an item taken by
    /// a key the scanner cannot follow): the origin of the first value
    /// with one, and every callable among or below them wrapped in, so
    /// that calling it calls each of them.
    fn any_of(&mut self, heap: &mut Heap, values: &[Value]) -> Result<Value> {
        let origin = self.origin_within(heap, values)?;
        let candidates = self.callables_within(heap, values)?;
        let v = self.inert(heap, origin)?;
        for c in candidates {
            self.wrap(v, c);
        }
        Ok(v)
    }

    /// The values a BUILD state part that is a mapping made by a call sets
    /// as dunders or under names the scanner cannot read: of a `dict`,
    /// `OrderedDict` or `defaultdict`, the pairs it was given (a dict, or
    /// a sequence of pairs) and its items, those whose key is a dunder or
    /// no text; of a class the scanner does not know, every callable it
    /// holds (its `keys()` and `__getitem__` may answer anything). Nothing
    /// for other values.
    fn smuggled_by(&self, heap: &Heap, part: Value) -> Result<Vec<Value>> {
        let Some(Origin::Made(m)) = self.origin(part) else {
            return Ok(Vec::new());
        };
        let unknown = self
            .globals
            .get(m)
            .is_some_and(|u| u.class == GlobalClass::Unknown);
        if unknown {
            return self.callables_within(heap, &[part]);
        }
        if !self.unknown_or_mapping(m) {
            return Ok(Vec::new());
        }
        let mut pairs: Vec<(Value, Value)> = Vec::new();
        if let Some(Obj::Object(o)) = heap.get(part) {
            pairs.extend(o.items.entries().iter().copied());
        }
        let given = match part {
            Value::Obj(id) => self.held.get(&id).cloned().unwrap_or_default(),
            _ => Vec::new(),
        };
        for args in given {
            for a in heap.tuple(args).map(<[Value]>::to_vec).unwrap_or_default() {
                if let Some(d) = heap.dict(a) {
                    pairs.extend(d.entries().iter().copied());
                } else if let Some(items) = heap.sequence(a) {
                    heap.charge_work(items.len() as u64)?;
                    for &item in items {
                        match heap.sequence(item) {
                            Some(&[k, v]) => pairs.push((k, v)),
                            // Pairs the scanner cannot read: anything.
                            _ => pairs.push((Value::None, item)),
                        }
                    }
                }
            }
        }
        heap.charge_work(pairs.len() as u64)?;
        let mut found = Vec::new();
        for (k, v) in pairs {
            // A number is no attribute name (setattr refuses it); a
            // computed key may be any.
            let unreadable = matches!(k, Value::Obj(_)) && heap.text(k).is_none();
            if unreadable || dunder(heap, k) {
                found.extend(self.callables_within(heap, &[v])?);
            }
        }
        Ok(found)
    }

    /// Whether global `g` is a class the scanner does not know, or one
    /// that makes a mapping of what it is given (`dict`, `OrderedDict`,
    /// `defaultdict`).
    fn unknown_or_mapping(&self, g: usize) -> bool {
        self.globals.get(g).is_some_and(|u| {
            u.class == GlobalClass::Unknown
                || matches!(
                    (u.module.as_str(), u.name.as_str()),
                    ("builtins" | "__builtin__", "dict")
                        | ("collections", "OrderedDict" | "defaultdict")
                )
        })
    }

    /// The objects the pickle made within `v`'s tuples, however deep
    /// (each tuple once, at most [`WALK_VISITS`] values), other than plain
    /// mappings (a `__setstate__` that keeps a dict of hooks it is given
    /// calls none of them).
    fn made_in_tuples(&self, heap: &Heap, v: Value) -> Result<Vec<Value>> {
        let mut found = Vec::new();
        let mut stack = vec![v];
        let mut seen = HashSet::new();
        let mut looked = 0u64;
        while let Some(t) = stack.pop() {
            let Value::Obj(id) = t else {
                continue;
            };
            if !seen.insert(id) {
                continue;
            }
            for &x in heap.tuple(t).unwrap_or_default() {
                looked += 1;
                if looked > WALK_VISITS as u64 {
                    self.overflowed.set(true);
                    stack.clear();
                    break;
                }
                if heap.tuple(x).is_some() {
                    stack.push(x);
                } else if matches!(self.origin(x), Some(Origin::Made(_))) && !self.plain_mapping(x)
                {
                    found.push(x);
                }
            }
        }
        heap.charge_work(looked)?;
        Ok(found)
    }

    /// Objects of classes the scanner does not know that the load returns:
    /// freed when the caller lets them go, their `__del__` runs then. What
    /// a finalizer calls is the instance's own cleanup (`self.close()`,
    /// `self.teardown(...)`, `self.file.close()`): a callable stored, at
    /// any depth below the object, under a name whose words say cleanup
    /// ([`FINALIZER_WORDS`]) is called. (Every callable a returned model
    /// holds would be too many: hooks, activations, partials of layers.)
    pub(super) fn finalized(&mut self, heap: &Heap, kept: &[Value]) -> Result<()> {
        // A class known to have a finalizer that calls through the
        // instance (`super::finalizers`): all it holds is used, as for an
        // object the load frees.
        let known: Vec<Value> = kept
            .iter()
            .copied()
            .filter(|&v| match self.origin(v) {
                Some(Origin::Made(g)) => self
                    .path_of_global(g)
                    .is_some_and(|(m, n)| super::finalizers::has_finalizer(m, n)),
                _ => false,
            })
            .collect();
        self.used(heap, &known)?;
        // One pass over all of them (a model's modules hold each other):
        // each value once, charged as work.
        let mut called = Vec::new();
        let mut queue: std::collections::VecDeque<Value> = kept.iter().copied().collect();
        let mut seen = HashSet::new();
        // Objects of one class share their attributes' names: each name's
        // words are looked at once.
        let mut named: HashMap<&str, bool> = HashMap::new();
        while let Some(v) = queue.pop_front() {
            let Value::Obj(id) = v else {
                continue;
            };
            if !seen.insert(id) {
                continue;
            }
            let below = self.children(heap, v, id);
            heap.charge_work(below.len() as u64 + 1)?;
            for (key, x) in below {
                let cleanup = key.is_some_and(|k| {
                    *named.entry(k).or_insert_with(|| {
                        super::words(k)
                            .iter()
                            .any(|w| FINALIZER_WORDS.contains(&w.as_str()))
                    })
                });
                if cleanup
                    && (self.is_callable(x) || matches!(self.origin(x), Some(Origin::Made(_))))
                {
                    called.push(x);
                }
                queue.push_back(x);
            }
        }
        for &v in &called {
            self.calls(heap, v)?;
        }
        self.used_unargued(heap, &called)
    }

    /// A weak reference made with a callback (`weakref.ref(target, cb)`,
    /// `KeyedRef`, `WeakMethod`): the target may die as the load ends
    /// (kept only by the unpickler), and Python calls the callback with
    /// the reference. A callable object there runs its `__call__` (a
    /// module's `forward`), with what it holds at hand.
    fn weak_callback(&mut self, heap: &Heap, cls: Value, items: &[Value]) -> Result<()> {
        let weak = matches!(
            self.path_of(cls),
            Some((
                "weakref" | "_weakref",
                "ref" | "ReferenceType" | "KeyedRef" | "WeakMethod"
            ))
        );
        if !weak {
            return Ok(());
        }
        let callbacks: Vec<Value> = items.iter().skip(1).copied().collect();
        for &c in &callbacks {
            if matches!(self.origin(c), Some(Origin::Made(_))) || self.is_callable(c) {
                self.calls(heap, c)?;
            }
        }
        self.used(heap, &callbacks)
    }

    /// `module.name` of global `g`.
    fn path_of_global(&self, g: usize) -> Option<(&str, &str)> {
        self.globals
            .get(g)
            .map(|u| (u.module.as_str(), u.name.as_str()))
    }

    /// Whether `v` is a mapping that runs nothing of the file's when asked
    /// whether it holds a key: a dict the pickle built, or one a call of
    /// `dict`, `OrderedDict` or `defaultdict` made; or no object at all.
    fn plain_mapping(&self, v: Value) -> bool {
        match self.origin(v) {
            Some(Origin::Made(g)) => matches!(
                self.path_of_global(g),
                Some((
                    "builtins" | "__builtin__" | "collections",
                    "dict" | "OrderedDict" | "defaultdict"
                ))
            ),
            Some(Origin::Global(_)) => false,
            None => true,
        }
    }

    /// Whether an instance of global `g` keeps what APPEND, SETITEM or
    /// ADDITEMS put in it as it is, calling none of its methods (a list,
    /// a dict and their kin; keys are hashed apart from this).
    fn stores_as_given(&self, g: usize) -> bool {
        self.globals.get(g).is_some_and(|u| {
            matches!(
                (u.module.as_str(), u.name.as_str()),
                (
                    "builtins" | "__builtin__",
                    "dict" | "list" | "set" | "frozenset" | "object"
                ) | (
                    "collections",
                    "OrderedDict" | "defaultdict" | "Counter" | "deque" | "ChainMap"
                )
            ) || plain_container(&u.module, &u.name)
        })
    }

    /// Whether an instance of global `g` stores what its `__setitem__`,
    /// `append` or `extend` are given and calls nothing else: a class the
    /// scanner knows as data or tensor machinery, or a known container.
    fn plain(&self, g: usize) -> bool {
        self.globals.get(g).is_some_and(|u| {
            matches!(u.class, GlobalClass::Tensor | GlobalClass::Data)
                || plain_container(&u.module, &u.name)
        })
    }

    /// `cls.__new__(cls, *items)` (NEWOBJ, `copyreg.__newobj__`): a class
    /// made by `type` or a metaclass from `(name, bases, namespace)`; a
    /// `map` or `filter`, which calls its function as it is consumed; a
    /// class the scanner does not know, given functions or classes (a
    /// weak reference's callback): they may be called. Bare functions and
    /// classes given to the `__new__` of a class outside the standard
    /// library are not: such a `__new__` is a namedtuple's (which stores
    /// its fields: `Pair("warm", warmup)`) or an `object.__new__` that
    /// ignores its arguments; wrappers (`functools.partial`, a bound
    /// method) still are.
    fn new_with(&mut self, heap: &Heap, cls: Value, items: &[Value]) -> Result<()> {
        let Some(g) = self.global_index(cls) else {
            return Ok(());
        };
        if let Some(namespace) = class_args(heap, items) {
            self.makes_class(heap, g, namespace)?;
        }
        let path = self.path_of(cls);
        if matches!(path, Some(("builtins" | "__builtin__", "map" | "filter"))) {
            if let Some(&f) = items.first() {
                self.calls(heap, f)?;
            }
        }
        self.weak_callback(heap, cls, items)?;
        // A builtin type's or torch's `__new__` consumes what it is given
        // (`tuple.__new__(tuple, reader)` iterates it): an object of a
        // library class there runs its methods, as given to a call.
        let consumes = self
            .globals
            .get(g)
            .is_some_and(|u| matches!(u.class, GlobalClass::Data | GlobalClass::Tensor));
        if consumes {
            self.library_methods_run(items);
        }
        let unknown = self
            .globals
            .get(g)
            .is_some_and(|u| u.class == GlobalClass::Unknown);
        if unknown {
            let stdlib = self.path_of(cls).is_some_and(|(module, _)| {
                super::stdlib::is_stdlib(module.split('.').next().unwrap_or(module))
            });
            for c in self.callables_among(heap, items)? {
                if stdlib || self.global_index(c).is_none() {
                    self.calls(heap, c)?;
                }
            }
        }
        self.stdlib_made_without_init(g);
        Ok(())
    }

    /// An object of a class of the standard library that the scanner has
    /// no entry for, made without its `__init__` (NEWOBJ,
    /// `copyreg.__newobj__`, `copyreg._reconstructor`): its methods act on
    /// whatever state the file gives it, when the program prints, iterates
    /// or compares it (`traceback.FrameSummary` reads the source file its
    /// state names, a `shlex` opens the file its pushed-back text names).
    /// Library code outside the known-safe set, as a call of the class
    /// is. The builtin types are left to their own rules.
    fn stdlib_made_without_init(&mut self, g: usize) {
        if let Some(u) = self.globals.get_mut(g) {
            let top = u.module.split('.').next().unwrap_or_default();
            let stdlib =
                super::stdlib::is_stdlib(top) && !matches!(top, "builtins" | "__builtin__");
            if stdlib && u.class == GlobalClass::Unknown {
                u.class = GlobalClass::Dangerous(Danger::LibraryCall);
            }
        }
    }

    /// `type(name, bases, namespace)` through global `g`: a class whose
    /// methods are what the file put in the namespace; Python calls its
    /// dunders itself (`__setstate__` on BUILD, `__init__` when called,
    /// `__lt__` in `sorted`, `__hash__`...): a gadget, each value called.
    fn makes_class(&mut self, heap: &Heap, g: usize, namespace: Value) -> Result<()> {
        if let Some(u) = self.globals.get_mut(g) {
            u.class = GlobalClass::Dangerous(Danger::Gadget);
        }
        let values: Vec<Value> = heap
            .dict(namespace)
            .map(|d| d.entries().iter().map(|&(_, v)| v).collect())
            .unwrap_or_default();
        heap.charge_work(values.len() as u64)?;
        for v in values {
            self.calls(heap, v)?;
        }
        Ok(())
    }
}

/// `re.DEBUG`: a pattern compiled with it prints its parse tree.
const RE_DEBUG: i64 = 128;

/// Whether `codec` names one of the text codecs pickles use (protocol 2
/// writes bytes as `_codecs.encode(text, "latin1")`), spelt as Python's
/// codec registry accepts it (any case, `-` or ` ` for `_`).
fn pickle_codec(codec: &str) -> bool {
    let normal: String = codec
        .chars()
        .map(|c| match c {
            '-' | ' ' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    matches!(
        normal.as_str(),
        "latin1"
            | "latin_1"
            | "latin"
            | "l1"
            | "iso8859_1"
            | "iso_8859_1"
            | "utf8"
            | "utf_8"
            | "u8"
            | "ascii"
            | "us_ascii"
    )
}

/// A constant: None, a bool, a number, a string or bytes, or a tuple of
/// those (an enum's value may be a tuple).
fn constant(heap: &Heap, v: Value) -> bool {
    let scalar = |v: Value| match v {
        Value::Obj(_) => matches!(
            heap.get(v),
            Some(Obj::Str(_) | Obj::Bytes(_) | Obj::BigInt(_))
        ),
        _ => true,
    };
    scalar_or_tuple(heap, v, scalar)
}

/// What an enum member of a package's own enum class pickles with: a
/// number, or a word (at most 64 letters, digits, `_`, `-` and `.`:
/// `"train"`, `"bf16-mixed"`, `"NCHW"`), or a tuple of those. A string an
/// enum value seldom is (a path, code, a sentence) makes the call of an
/// unknown class a call: a constructor that evaluates or opens its
/// argument (`pydantic.TypeAdapter("...")`) is not taken for a lookup.
fn enum_value(heap: &Heap, v: Value) -> bool {
    let scalar = |v: Value| match v {
        Value::Obj(_) => match heap.get(v) {
            Some(Obj::BigInt(_)) => true,
            Some(Obj::Str(_)) => heap.text(v).is_some_and(|t| {
                !t.is_empty()
                    && t.len() <= 64
                    && t.chars()
                        .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
            }),
            _ => false,
        },
        _ => true,
    };
    scalar_or_tuple(heap, v, scalar)
}

/// Whether `v` is `scalar`, or a tuple the pickle built of such.
fn scalar_or_tuple(heap: &Heap, v: Value, scalar: impl Fn(Value) -> bool) -> bool {
    scalar(v)
        || heap
            .tuple(v)
            .is_some_and(|items| items.iter().all(|&i| scalar(i)))
}

/// A tuple or a set the pickle built, whose hash is its members' (a
/// frozenset's; a set is unhashable, and followed all the same).
fn hashed_whole(heap: &Heap, v: Value) -> bool {
    matches!(heap.get(v), Some(Obj::Tuple(_) | Obj::Set(_)))
}

/// A list, tuple or dict the pickle built (not an object a global made).
fn container(heap: &Heap, v: Value) -> bool {
    matches!(
        heap.get(v),
        Some(Obj::List(_) | Obj::Tuple(_) | Obj::Dict(_))
    )
}

/// Whether `key` names a dunder attribute (`__setstate__`,
/// `__pydantic_fields_set__`...).
fn dunder(heap: &Heap, key: Value) -> bool {
    heap.text(key)
        .is_some_and(|k| k.len() > 4 && k.starts_with("__") && k.ends_with("__"))
}

/// Dunders Python looks up on an instance by `getattr` and calls (pickle's
/// BUILD and reduce, `copy`; torch's check for `__torch_function__`, made
/// on the argument of every op such as the `copy_` of `load_state_dict`):
/// an entry of the instance's dict shadows the class's method. Special
/// methods Python calls by syntax (`__hash__`, `__eq__`, `__del__`...) are
/// looked up on the type, and an entry named so in the instance's dict is
/// only data.
const INSTANCE_DUNDERS: [&str; 9] = [
    "__torch_function__",
    "__setstate__",
    "__reduce__",
    "__reduce_ex__",
    "__getstate__",
    "__getnewargs__",
    "__getnewargs_ex__",
    "__deepcopy__",
    "__copy__",
];

/// The methods BUILD (`items`) and `__setstate__` methods (pydantic's
/// `get`, `Module`'s `keys` and `__getitem__`...) call on a state that is
/// not a dict.
const STATE_METHODS: [&str; 9] = [
    "items",
    "keys",
    "values",
    "get",
    "__getitem__",
    "__iter__",
    "__contains__",
    "setdefault",
    "pop",
];

/// Whether BUILD setting `key` changes what a later opcode or copy calls:
/// one of [`INSTANCE_DUNDERS`], or, set by `setattr` (a slot state),
/// `__class__` or `__dict__` (the instance's type or its whole dict; put
/// into the dict, they are entries its descriptors ignore).
fn shadows(heap: &Heap, key: Value, by_setattr: bool) -> bool {
    heap.text(key).is_some_and(|k| {
        INSTANCE_DUNDERS.contains(&k) || (by_setattr && matches!(k, "__class__" | "__dict__"))
    })
}

/// What an instance of a class keeps in its own dict, for BUILD: which
/// callables there are what the class's code, or the program's use of
/// the object, calls (see [`Recorder::held_in_dict`]).
struct DictRules {
    /// Data or a library's mapping (an `OrderedDict`, a `Counter`, a
    /// model output, an address, a Lightning `AttributeDict`): keeps no
    /// callable, so one there shadows a method that the class's code or
    /// the program calls (`keys` when a state dict is loaded,
    /// `most_common` in a `Counter`'s repr).
    keeps_no_callable: bool,
    /// For data whose attributes are the user's values (a namespace's
    /// parsed arguments, a parser's `func`), the names of its own methods:
    /// only those and the mapping methods shadow (a namespace as a state
    /// dict's `_metadata` has its `get` called by `load_state_dict`).
    own_methods: Option<&'static [&'static str]>,
    /// An object of another class of the standard library (a `Logger`, a
    /// `shlex`): keeps no wrapper; one there is what its own code calls
    /// on itself (`Logger.__repr__` calls `getEffectiveLevel`). Its
    /// functions and classes (a parser's `formatter_class`) are its own.
    keeps_no_wrapper: bool,
    /// transformers' objects: their saving methods' names shadow (a
    /// config's repr calls `to_json_string`).
    config_methods: Option<&'static [&'static str]>,
    /// An object of any library: the mapping methods' names shadow (a
    /// `ParameterDict`'s `items`, which its `extra_repr` calls).
    library: bool,
    /// An object whose methods call the callables it holds: of a library
    /// outside the model libraries (a networkx view calls its filter on
    /// each key, an mpmath solver the function it iterates over), or a
    /// torch data pipe (a `Mapper` calls its `fn` when iterated or
    /// indexed, any pipe its own `repr_hook` when printed). Its package,
    /// whose callables it keeps (networkx's filters, the pipes' own
    /// `DataChunk`); a wrapper, or a callable of the standard library or
    /// of another library, there is called. A model's own function is
    /// kept: its code runs when the program uses the object, as a
    /// model's does.
    calls_held: Option<String>,
}

/// What BUILD's putting a value into an instance's dict makes of it.
enum Held {
    /// It replaces what a later opcode or a copy calls (a dunder): a
    /// gadget, and the value is called.
    Smuggled,
    /// It shadows a method the class's code calls: the value is called.
    Called,
    /// Data the class's code reads (another dunder): its methods run.
    Read,
    /// The instance's own value.
    Kept,
}

impl Recorder {
    /// The [`DictRules`] of instances of the global at `g`.
    fn dict_rules(&self, g: usize) -> DictRules {
        let Some(u) = self.globals.get(g) else {
            return DictRules {
                keeps_no_callable: false,
                own_methods: None,
                keeps_no_wrapper: false,
                config_methods: None,
                library: false,
                calls_held: None,
            };
        };
        let top = u.module.split('.').next().unwrap_or_default();
        let keeps_no_callable = matches!(u.class, GlobalClass::Data | GlobalClass::Tensor)
            || plain_container(&u.module, &u.name);
        let own_methods = super::user_valued(&u.module, &u.name);
        let stdlib = super::stdlib::is_stdlib(top);
        let library = super::libraries::shipped(&u.module);
        let non_model = u.class == GlobalClass::Unknown
            && library
            && !stdlib
            && !super::libraries::model_library(top);
        let calls_held = non_model
            || (u.class == GlobalClass::Unknown
                && super::libraries::calls_what_it_holds(&u.module));
        DictRules {
            keeps_no_callable,
            own_methods,
            keeps_no_wrapper: !keeps_no_callable && own_methods.is_none() && stdlib,
            config_methods: super::libraries::config_methods(&u.module),
            library,
            calls_held: calls_held.then(|| top.to_owned()),
        }
    }

    /// What `v`, put under `k` into the dict of an instance whose class
    /// has `rules` (by `setattr` when `by_setattr`), is to the class's
    /// code.
    fn held_in_dict(
        &self,
        heap: &Heap,
        rules: &DictRules,
        k: Value,
        v: Value,
        by_setattr: bool,
    ) -> Held {
        let name = heap.text(k);
        let callable = self.is_callable(v);
        let function = self.global_index(v).is_some();
        // A wrapper or an object the pickle made under the name of a
        // method torch's own code calls on the instance (`Module`
        // re-adding hooks calls `register_parameter`, an optimizer's
        // `__setstate__` `_patch_step_function`) replaces it; a function
        // or class there is called as itself.
        let base_method = name.is_some_and(|k| TORCH_BASE_METHODS.binary_search(&k).is_ok());
        let made = matches!(self.origin(v), Some(Origin::Made(_)));
        if shadows(heap, k, by_setattr) || (base_method && !function && (callable || made)) {
            return Held::Smuggled;
        }
        if dunder(heap, k) {
            // Another dunder (pydantic's `__pydantic_fields_set__`).
            return Held::Read;
        }
        let in_list =
            |names: Option<&[&str]>| name.is_some_and(|k| names.is_some_and(|n| n.contains(&k)));
        let shadows_data_method = (rules.keeps_no_callable
            || (rules.keeps_no_wrapper && !function))
            && rules
                .own_methods
                .is_none_or(|names| in_list(Some(names)) || in_list(Some(&STATE_METHODS)));
        let shadows_library_method =
            in_list(rules.config_methods) || (rules.library && in_list(Some(&STATE_METHODS)));
        let foreign = rules.calls_held.as_deref().is_some_and(|own| {
            self.path_of(v).is_none_or(|(module, _)| {
                super::libraries::shipped(module)
                    && module.split('.').next().unwrap_or_default() != own
            })
        });
        let called = base_method || shadows_data_method || shadows_library_method || foreign;
        if callable && called {
            Held::Called
        } else {
            Held::Kept
        }
    }
}

impl Interpreter for Recorder {
    fn global(&mut self, heap: &mut Heap, module: &str, name: &str, offset: u64) -> Result<Value> {
        heap.charge_bytes(module.len() + name.len())?;
        let key = (module.to_owned(), name.to_owned());
        let index = match self.by_path.get(&key) {
            Some(&i) => i,
            None => {
                let i = self.globals.len();
                self.globals.push(GlobalUse {
                    module: key.0.clone(),
                    name: key.1.clone(),
                    offset,
                    usage: Usage::Referenced,
                    class: classify(module, name),
                });
                self.by_path.insert(key, i);
                i
            }
        };
        self.inert(heap, Some(Origin::Global(index)))
    }

    fn call(&mut self, heap: &mut Heap, callable: Value, args: Value) -> Result<Value> {
        // Arguments that are no tuple: none are looked at (torch would
        // fail the call).
        let items = heap.tuple(args).map_or_else(Vec::new, <[Value]>::to_vec);
        // A `defaultdict`'s factory runs on any lookup of a key it lacks
        // (`__setstate__`s that index their state, `__getattr__`s that
        // index their data): called, as soon as it is made.
        self.weak_callback(heap, callable, &items)?;
        if self.path_of(callable) == Some(("collections", "defaultdict")) {
            // It is called with nothing: a bare function or class is judged
            // by what it is (`defaultdict(list)`, a module's own function),
            // a wrapper or an object that carries arguments is called.
            if let Some(&factory) = items.first() {
                match self.global_index(factory) {
                    None => self.calls(heap, factory)?,
                    // A library's function or object (`cgi.print_environ`,
                    // `builtins.help`) is called as it stands; a model's
                    // own factory is judged by what it is.
                    Some(g) if self.is_library(g) => self.mark(Some(g), Usage::Called),
                    Some(_) => {}
                }
            }
        }
        heap.charge_work(items.len() as u64)?;
        // Known data that its arguments can make act: judged by what
        // they make it do.
        if let Some(class) = self.acting_arguments(heap, callable, &items) {
            if let Some(u) = self
                .global_index(callable)
                .and_then(|g| self.globals.get_mut(g))
            {
                if !matches!(u.class, GlobalClass::Dangerous(_)) {
                    u.class = class;
                }
            }
        }
        // What a builtin handed back may be any of what it was given
        // (`any_of`): calling it calls each.
        if let Value::Obj(id) = callable {
            let stands_for_several = self.wrapped.contains_key(&id)
                && !matches!(self.origin(callable), Some(Origin::Made(_)));
            if stands_for_several {
                self.calls(heap, callable)?;
            }
        }
        let arg = |i: usize| items.get(i).copied().unwrap_or(Value::None);
        match self.origin(callable) {
            // A partial made and kept calls nothing; calling it later calls
            // its function (see `calls`).
            Some(Origin::Global(g)) if self.path_of(callable) == Some(("functools", "partial")) => {
                self.mark(Some(g), Usage::Instantiated);
                let made = self.inert(heap, Some(Origin::Made(g)))?;
                self.wrap(made, arg(0));
                Ok(made)
            }
            // An enum member looked up by its value, an item taken from a
            // container the pickle built: plain data. Any other call of
            // these is a call of an unknown callable.
            Some(Origin::Global(g)) if self.conditional(callable) => {
                // `conditional` knew the callable by its path; without one
                // it would be a call like any other.
                let enum_lookup = self
                    .path_of(callable)
                    .is_some_and(|(module, name)| known_enum(module, name));
                // `typing.Optional[int]`, `typing.Dict[str, typing.Any]`:
                // how an annotation pickles. A typing form subscripted with
                // constants, globals and such annotations builds an alias.
                let form = if enum_lookup || items.len() != 2 {
                    None
                } else {
                    self.typing_form(arg(0)).filter(|_| {
                        let one = |v: Value| {
                            constant(heap, v)
                                || self.global_index(v).is_some()
                                || self.typing_alias(v)
                                // `type(None)`, in `Optional[...]`.
                                || matches!(self.origin(v), Some(Origin::Made(t))
                                    if self.path_of_global(t) == Some(("builtins", "type")))
                        };
                        one(arg(1))
                            || heap
                                .tuple(arg(1))
                                .is_some_and(|t| t.iter().all(|&v| one(v)))
                    })
                };
                if let Some(form) = form {
                    self.mark(Some(form), Usage::Instantiated);
                    return self.inert(heap, Some(Origin::Made(form)));
                }
                let plain = if enum_lookup {
                    items.len() == 1 && constant(heap, arg(0))
                } else {
                    self.path_of(callable).is_some()
                        && items.len() == 2
                        && container(heap, arg(0))
                        && constant(heap, arg(1))
                };
                if !plain {
                    self.mark(Some(g), Usage::Called);
                    return self.inert(heap, Some(Origin::Made(g)));
                }
                if enum_lookup {
                    self.mark(Some(g), Usage::Instantiated);
                    return self.inert(heap, Some(Origin::Made(g)));
                }
                // The item itself when it can be found (a bool indexes as
                // 0 or 1, a dict by an equal string key); else any of
                // what the container holds.
                let (seq, key) = (heap.sequence(arg(0)), arg(1));
                let index = match key {
                    Value::Int(i) => Some(i),
                    Value::Bool(b) => Some(i64::from(b)),
                    _ => None,
                };
                if let (Some(seq), Some(i)) = (seq, index) {
                    let len = i64::try_from(seq.len()).unwrap_or(i64::MAX);
                    let at = if i < 0 { i.saturating_add(len) } else { i };
                    if let Some(&item) = usize::try_from(at).ok().and_then(|at| seq.get(at)) {
                        return Ok(item);
                    }
                }
                if let (Some(d), Some(k)) = (heap.dict(arg(0)), heap.text(key)) {
                    let found = d
                        .entries()
                        .iter()
                        .find(|&&(dk, _)| heap.text(dk) == Some(k));
                    if let Some(&(_, item)) = found {
                        return Ok(item);
                    }
                }
                self.any_of(heap, &[arg(0)])
            }
            // `getattr(torch._C._VariableFunctionsClass, "tanh")`: how torch
            // pickles its native functions (`torch.tanh`): that function,
            // judged as `torch.<name>` is.
            Some(Origin::Global(g))
                if self.path_of(callable) == Some(("builtins", "getattr"))
                    && items.len() == 2
                    && self.path_of(arg(0)) == Some(("torch._C", "_VariableFunctionsClass"))
                    && heap.text(arg(1)).is_some_and(|n| {
                        !n.is_empty()
                            && !n.starts_with('_')
                            && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    }) =>
            {
                self.instance_getattr.insert(g);
                if let Some(class) = self.global_index(arg(0)) {
                    if let Some(u) = self.globals.get_mut(class) {
                        u.class = GlobalClass::Data;
                    }
                }
                let name = heap.text(arg(1)).unwrap_or_default().to_owned();
                let offset = self.globals.get(g).map_or(0, |u| u.offset);
                self.global(heap, "torch", &name, offset)
            }
            // `getattr(zoneinfo.ZoneInfo, "_unpickle")`: how a zone pickles;
            // the classmethod, data as its class is.
            Some(Origin::Global(g))
                if self.path_of(callable) == Some(("builtins", "getattr"))
                    && items.len() == 2
                    && matches!(
                        self.path_of(arg(0)),
                        Some(("zoneinfo" | "zoneinfo._zoneinfo", "ZoneInfo"))
                    )
                    && heap.text(arg(1)) == Some("_unpickle") =>
            {
                self.instance_getattr.insert(g);
                let (module, offset) = match (self.path_of(arg(0)), self.globals.get(g)) {
                    (Some((m, _)), Some(u)) => (m.to_owned(), u.offset),
                    _ => ("zoneinfo".to_owned(), 0),
                };
                self.global(heap, &module, "ZoneInfo._unpickle", offset)
            }
            // `getattr(instance, "name")`: a bound method or an attribute
            // of an instance the pickle made (torch pickles a module's
            // hook so), not a reach into a module; calling the result
            // calls what the instance's class holds.
            Some(Origin::Global(g))
                if self.path_of(callable) == Some(("builtins", "getattr"))
                    && items.len() == 2
                    && matches!(self.origin(arg(0)), Some(Origin::Made(_)))
                    && heap
                        .str(arg(1))
                        .is_some_and(|n| !n.starts_with("__") && !n.contains('.')) =>
            {
                self.instance_getattr.insert(g);
                let o = self.origin(arg(0));
                let method = self.inert(heap, o)?;
                if let (Value::Obj(id), Some(Origin::Made(class)), Some(name)) =
                    (method, o, heap.text(arg(1)))
                {
                    self.method_global(class, name);
                    self.bound.insert(id, (class, name.to_owned()));
                }
                // The method runs with what its instance holds at hand.
                self.hold(method, arg(0));
                Ok(method)
            }
            Some(Origin::Global(g)) => {
                // Any callable given `(name, bases, namespace)` makes a
                // class as `type` does (a metaclass: `abc.ABCMeta`,
                // typing's).
                if let Some(namespace) = class_args(heap, &items) {
                    self.makes_class(heap, g, namespace)?;
                }
                let lookup = items.len() == 1 && enum_value(heap, arg(0));
                let before = self.lookups.get(&g).copied();
                self.mark(Some(g), Usage::Called);
                if lookup && before != Some(false) {
                    self.lookups.insert(g, true);
                }
                // A callable the scanner does not know, given functions or
                // classes (or wrappers of them): it may call them (a
                // worker's initializer, a cleanup, a `nodetype`, a mapped
                // function).
                let unknown = self
                    .globals
                    .get(g)
                    .is_some_and(|u| u.class == GlobalClass::Unknown);
                if unknown {
                    for c in self.callables_among(heap, &items)? {
                        self.calls(heap, c)?;
                    }
                }
                // Whatever the callable is, the objects the pickle made
                // that it is given have their methods run by it; torch's
                // own functions (rebuilds, storages, OrderedDict) only
                // those given to them directly (a rebuild sets what a
                // state dict holds as attributes, calling none of it).
                let torch_own = self
                    .globals
                    .get(g)
                    .is_some_and(|u| u.class == GlobalClass::Tensor);
                if torch_own {
                    let mut direct: Vec<Value> = items
                        .iter()
                        .copied()
                        .filter(|&v| matches!(self.origin(v), Some(Origin::Made(_))))
                        .collect();
                    // Members of sequences and keys of dicts it is given
                    // are iterated, hashed or converted (a size's
                    // `__index__`, a Counter's or an OrderedDict's keys,
                    // a quantizer's parameters); values a state dict sets
                    // as attributes are not.
                    let mut named = Vec::new();
                    direct.extend(self.made_members(heap, &items, &mut named)?);
                    let path = self
                        .path_of(callable)
                        .map(|(m, n)| (m.to_owned(), n.to_owned()));
                    let path = path.as_ref().map(|(m, n)| (m.as_str(), n.as_str()));
                    // `set_tensor_metadata` reads each value as a bool.
                    if path == Some(("torch._utils", "_rebuild_tensor_v2")) {
                        if let Some(d) = heap.dict(arg(6)) {
                            direct.extend(d.entries().iter().map(|&(_, v)| v));
                        }
                    }
                    // Objects a library holds, named: given directly, or
                    // one level inside what is given.
                    self.library_methods_run(&direct);
                    self.library_methods_run(&items);
                    self.library_methods_run(&named);
                    self.used_iterated(heap, &direct)?;
                    // `_rebuild_from_type_v2(func, type, args, state)` calls
                    // `func(*args)`: what `args` holds is `func`'s
                    // arguments, the values of a dict among them too
                    // (`_rebuild_njt(kwargs)` builds a `NestedTensor` whose
                    // `__init__` calls `kwargs["_metadata_cache"].get`).
                    if matches!(
                        path,
                        Some((
                            "torch._tensor" | "torch._utils",
                            "_rebuild_from_type_v2" | "_rebuild_from_type"
                        ))
                    ) {
                        // A rebuild given to a rebuild as its `func` calls
                        // its own `func(*args)` in turn: followed a few
                        // levels, without recursion. `args` may be a list.
                        let mut given = Vec::new();
                        let (mut func, mut args) = (arg(0), arg(2));
                        for _ in 0..8 {
                            let members = heap.sequence(args).unwrap_or_default();
                            heap.charge_work(members.len() as u64)?;
                            for &a in members {
                                given.push(a);
                                if let Some(d) = heap.dict(a) {
                                    heap.charge_work(d.entries().len() as u64)?;
                                    given.extend(d.entries().iter().map(|&(_, v)| v));
                                } else if let Some(seq) = heap.sequence(a) {
                                    heap.charge_work(seq.len() as u64)?;
                                    given.extend_from_slice(seq);
                                }
                            }
                            let nested = matches!(
                                self.path_of(func),
                                Some((
                                    "torch._tensor" | "torch._utils",
                                    "_rebuild_from_type_v2" | "_rebuild_from_type"
                                ))
                            );
                            if !nested {
                                break;
                            }
                            (func, args) = match members {
                                [f, _, a, ..] => (*f, *a),
                                _ => break,
                            };
                        }
                        given.retain(|&v| matches!(self.origin(v), Some(Origin::Made(_))));
                        self.used_iterated(heap, &given)?;
                    }
                    // `_set_obj_state(obj, state)`: the dict part of the
                    // state has its `items()` called.
                    if matches!(
                        path,
                        Some((
                            "torch._tensor" | "torch._utils",
                            "_rebuild_from_type_v2" | "_rebuild_parameter_with_state"
                        ))
                    ) {
                        let state = arg(3);
                        let dict_state = match heap.tuple(state) {
                            Some(&[first, _]) => first,
                            _ => state,
                        };
                        if matches!(self.origin(dict_state), Some(Origin::Made(_))) {
                            for v in self.held_by_name(heap, dict_state, &STATE_METHODS)? {
                                self.calls(heap, v)?;
                            }
                        }
                        // Each of its halves is set by `setattr` on a
                        // tensor subclass: a wrapper under a dunder or a
                        // `Tensor` method's name shadows what torch calls
                        // later (`Tensor.__setstate__` runs
                        // `self.set_(*state)`, BUILD finds `__setstate__` on
                        // the instance), and a property setter of the class
                        // runs with the value (NestedTensor's stores into
                        // `self._metadata_cache[...]`, an object the file
                        // made). Wrappers are called, objects the pickle
                        // made that are no plain mapping are used. A
                        // tensor's plain attributes (`tag`, `no_decay`) are
                        // data and call nothing.
                        let halves = match heap.tuple(state) {
                            Some(&[a, b]) => vec![a, b],
                            _ => vec![state],
                        };
                        let mut wrappers = Vec::new();
                        let mut objects = Vec::new();
                        for half in halves {
                            let Some(d) = heap.dict(half) else {
                                continue;
                            };
                            heap.charge_work(d.entries().len() as u64)?;
                            for &(k, v) in d.entries() {
                                let made = matches!(self.origin(v), Some(Origin::Made(_)));
                                let shadows = dunder(heap, k)
                                    || heap
                                        .text(k)
                                        .is_some_and(super::tensor_methods::tensor_method);
                                let wrapper = self.is_callable(v) || made;
                                if shadows && wrapper {
                                    wrappers.push(v);
                                } else if made && !self.plain_mapping(v) {
                                    objects.push(v);
                                }
                            }
                        }
                        for v in wrappers {
                            self.calls(heap, v)?;
                        }
                        // Tensors, parameters and buffers have no Python
                        // `__setattr__` or property of their own to run.
                        let plain_tensor = path
                            == Some(("torch._utils", "_rebuild_parameter_with_state"))
                            || matches!(
                                self.path_of(arg(1)),
                                Some((
                                    "torch" | "torch._tensor" | "torch.nn.parameter",
                                    "Tensor" | "Parameter" | "Buffer"
                                ))
                            );
                        if !plain_tensor {
                            self.used_unargued(heap, &objects)?;
                        }
                    }
                } else {
                    // A known-safe callable (a builtin that iterates,
                    // converts or compares) runs the methods of the
                    // objects it is given.
                    let known = self
                        .globals
                        .get(g)
                        .is_some_and(|u| u.class == GlobalClass::Data);
                    if known {
                        let direct: Vec<Value> = items
                            .iter()
                            .copied()
                            .filter(|&v| matches!(self.origin(v), Some(Origin::Made(_))))
                            .collect();
                        self.library_methods_run(&direct);
                        // copyreg's helpers are given classes to make.
                        if !matches!(self.path_of(callable), Some(("copyreg" | "copy_reg", _))) {
                            self.library_methods_run_within(heap, &items)?;
                        }
                    }
                    self.used(heap, &items)?;
                }
                // What comes out: an instance of the class a constructor is
                // given (so that calling it, or its `__new__`, counts against
                // that class), else something the callable made.
                let mut made = g;
                // Calls that call or instantiate what they are given.
                match self.path_of(callable) {
                    Some(("torch._tensor", "_rebuild_from_type_v2")) => {
                        let (func, new_type) = (arg(0), arg(1));
                        self.calls(heap, func)?;
                        self.mark(self.global_index(new_type), Usage::Instantiated);
                        made = self.global_index(new_type).unwrap_or(g);
                    }
                    Some(("copyreg" | "copy_reg", "_reconstructor")) => {
                        let (cls, base) = (arg(0), arg(1));
                        self.mark(self.global_index(cls), Usage::Instantiated);
                        if let Some(c) = self.global_index(cls) {
                            self.stdlib_made_without_init(c);
                        }
                        made = self.global_index(cls).unwrap_or(g);
                        let plain_object = self.path_of(base) == Some(("builtins", "object"));
                        if !plain_object {
                            self.calls(heap, base)?;
                        }
                    }
                    Some(("copyreg" | "copy_reg", "__newobj__" | "__newobj_ex__"))
                    | Some(("torch._utils", "_rebuild_wrapper_subclass")) => {
                        self.mark(self.global_index(arg(0)), Usage::Instantiated);
                        made = self.global_index(arg(0)).unwrap_or(g);
                        // `cls.__new__(cls, *args)`: what NEWOBJ of `cls`
                        // does with them.
                        let rest = items.get(1..).unwrap_or_default().to_vec();
                        self.new_with(heap, arg(0), &rest)?;
                    }
                    // A masked array: its class and its base class are
                    // instantiated (`__new__`).
                    Some(("numpy.ma.core", "_mareconstruct")) => {
                        self.mark(self.global_index(arg(1)), Usage::Instantiated);
                        self.mark(self.global_index(arg(0)), Usage::Instantiated);
                        made = self.global_index(arg(0)).unwrap_or(g);
                    }
                    // numpy's generator constructors call the bit generator
                    // class (or constructor) they are given.
                    Some((
                        "numpy.random._pickle",
                        "__randomstate_ctor" | "__generator_ctor" | "__bit_generator_ctor",
                    )) => {
                        self.calls(heap, arg(0))?;
                        self.calls(heap, arg(1))?;
                    }
                    // TorchScript's wrappers return their argument: whatever
                    // it is, it comes out as itself.
                    Some((
                        "torch.jit._pickle",
                        "build_tensorlist" | "build_intlist" | "build_doublelist"
                        | "build_boollist" | "restore_type_tag",
                    )) => return Ok(arg(0)),
                    // Builtins that call what they are given (map, filter,
                    // iter with a sentinel) or hand back one of their
                    // arguments or its members (next, min, max, ...): the
                    // callable is called, and what comes out keeps the
                    // origin of what went in.
                    Some(("builtins" | "__builtin__", name)) => {
                        let calls_first = matches!(name, "map" | "filter")
                            || (name == "iter" && items.len() == 2);
                        let makes_class = name == "type" && items.len() == 3;
                        // `dict(...)` hands back a new mapping, none of
                        // what it was given.
                        let makes_dict = name == "dict";
                        // `type(x)`: the class of what the pickle made, a
                        // module's own class (a BUILD on it patches it).
                        if name == "type" && items.len() == 1 {
                            if let Some(Origin::Made(c)) = self.origin(arg(0)) {
                                return self.inert(heap, Some(Origin::Global(c)));
                            }
                        }
                        if calls_first {
                            self.calls(heap, arg(0))?;
                        }
                        // `type(name, bases, namespace)` makes a class whose
                        // methods are what the file put in the namespace;
                        // Python calls its dunders itself (`__setstate__`
                        // on BUILD, `__lt__` in `sorted`, `__format__`,
                        // `__hash__`...): a gadget, each value called.
                        // (`type(x)`, one argument, as `type(None)` pickles,
                        // is not.)
                        if makes_class {
                            self.makes_class(heap, g, arg(2))?;
                        }
                        // What comes out may be any of what went in (the
                        // last of a reversed list, a `next` default, an
                        // item two levels down): calling it calls each.
                        if !makes_dict
                            && (self.origin_within(heap, &items)?.is_some()
                                || !self.callables_within(heap, &items)?.is_empty())
                        {
                            // It keeps what it was given (`set([...])`'s
                            // members are returned with it, not freed).
                            let v = self.any_of(heap, &items)?;
                            if let Value::Obj(id) = v {
                                self.given.push((id, args));
                            }
                            return Ok(v);
                        }
                    }
                    _ => {}
                }
                let made_value = self.inert(heap, Some(Origin::Made(made)))?;
                if let Value::Obj(id) = made_value {
                    self.given.push((id, args));
                }
                // What calling the made object calls: the origin of
                // `types.GenericAlias(origin, args)` (how `list[int]`
                // pickles); the function of a partial or the origin of an
                // alias that `copyreg.__newobj__(cls, *args)` makes
                // (`__newobj_ex__` takes the arguments as a tuple).
                let forwards = |path: Option<(&str, &str)>| {
                    matches!(
                        path,
                        Some(("functools", "partial") | ("types", "GenericAlias"))
                    )
                };
                let target = match self.path_of(callable) {
                    Some(("types", "GenericAlias")) => Some(arg(0)),
                    Some(("copyreg" | "copy_reg", "__newobj__"))
                        if forwards(self.path_of(arg(0))) =>
                    {
                        Some(arg(1))
                    }
                    Some(("copyreg" | "copy_reg", "__newobj_ex__"))
                        if forwards(self.path_of(arg(0))) =>
                    {
                        heap.tuple(arg(1)).and_then(|a| a.first().copied())
                    }
                    _ => None,
                };
                if let Some(target) = target {
                    self.wrap(made_value, target);
                }
                // What a class the scanner does not know was given: its
                // methods may call it later. What a mapping was made of
                // (`dict([...])`, `OrderedDict([...])`): its items, which a
                // BUILD given it as state sets.
                if self.unknown_or_mapping(made) && !items.is_empty() {
                    self.hold(made_value, args);
                }
                Ok(made_value)
            }
            // Calling an instance runs its class's `__call__` (a partial's
            // function), a bound method that method: given functions, it
            // may call them, and it runs the methods of objects it is
            // given (`Pattern.sub` calls a callable replacement).
            Some(Origin::Made(g)) => {
                self.calls(heap, callable)?;
                for c in self.callables_among(heap, &items)? {
                    self.calls(heap, c)?;
                }
                self.used(heap, &items)?;
                self.inert(heap, Some(Origin::Made(g)))
            }
            None => {
                self.used(heap, &items)?;
                self.inert(heap, None)
            }
        }
    }

    fn new_object(&mut self, heap: &mut Heap, cls: Value, args: Value) -> Result<Value> {
        match self.origin(cls) {
            Some(Origin::Global(g)) => {
                self.mark(Some(g), Usage::Instantiated);
                let items = heap.tuple(args).map_or_else(Vec::new, <[Value]>::to_vec);
                self.new_with(heap, cls, &items)?;
                let made = self.inert(heap, Some(Origin::Made(g)))?;
                // `partial.__new__(partial, func, ...)` holds `func`, and
                // `GenericAlias.__new__(GenericAlias, origin, args)` its
                // origin: calling either calls it.
                if matches!(
                    self.path_of(cls),
                    Some(("functools", "partial") | ("types", "GenericAlias"))
                ) {
                    let func = heap.tuple(args).and_then(|a| a.first().copied());
                    self.wrap(made, func.unwrap_or(Value::None));
                }
                self.hold(made, args);
                Ok(made)
            }
            // `instance.__new__`: whatever made the instance runs again.
            Some(Origin::Made(g)) => {
                self.calls(heap, cls)?;
                self.inert(heap, Some(Origin::Made(g)))
            }
            None => self.inert(heap, None),
        }
    }

    fn instantiate(&mut self, heap: &mut Heap, cls: Value, args: Value) -> Result<Value> {
        // OBJ and INST call `cls(*args)`: its `__init__` runs, or the
        // function.
        self.call(heap, cls, args)
    }

    fn build(&mut self, heap: &mut Heap, obj: Value, state: Value) -> Result<()> {
        // BUILD looks `__setstate__` up on the instance: an attribute an
        // earlier BUILD set, or an item its class's `__getattr__` answers
        // with (a dict subclass, a `UserDict`, a module's `_modules`).
        if let Some(Origin::Made(g)) = self.origin(obj) {
            let found = self.held_by_name(heap, obj, &["__setstate__"])?;
            if !found.is_empty() {
                if let Some(u) = self.globals.get_mut(g) {
                    u.class = GlobalClass::Dangerous(Danger::Gadget);
                }
            }
            for v in found {
                self.calls(heap, v)?;
            }
        }
        // A second BUILD on an object: its class's `__setstate__` runs
        // (or the dict is updated again), and what the first put in the
        // instance's dict shadows the class's methods that code calls
        // (`DataNormSparsifier.__setstate__` calls `self._convert_mask`):
        // the wrappers an earlier state held are called.
        if let (Value::Obj(id), Some(Origin::Made(_))) = (obj, self.origin(obj)) {
            if !self.built.insert(id) {
                let earlier = self.held.get(&id).cloned().unwrap_or_default();
                for c in self.callables_within(heap, &earlier)? {
                    if self.global_index(c).is_none() {
                        self.calls(heap, c)?;
                    }
                }
            }
        }
        self.hold(obj, state);
        self.note_methods(heap, obj, state)?;
        match self.origin(obj) {
            // BUILD fills the instance: its class's `__setstate__` (code
            // of the class, not of the file) or its `__dict__`. A partial
            // takes its function from the state. A dunder attribute set
            // here (`__setstate__`, `__reduce__`...) changes what a later
            // BUILD or call runs: a gadget, and its value is called. Not
            // for TorchScript's own classes (`__torch__.*`): TorchScript's
            // loader sets their attributes as slots of the compiled type,
            // calling nothing (TorchScript 1.x wrote `__constants__` and
            // `__overloads__` there), and no Python module of that name
            // exists for Python's unpickler to build them from.
            Some(Origin::Made(g)) => {
                self.mark(Some(g), Usage::Instantiated);
                let torchscript = self
                    .globals
                    .get(g)
                    .is_some_and(|u| u.module == "__torch__" || u.module.starts_with("__torch__."));
                let parts = match heap.tuple(state) {
                    Some(items) => items.to_vec(),
                    None => vec![state],
                };
                heap.charge_work(parts.len() as u64)?;
                if self
                    .globals
                    .get(g)
                    .is_some_and(|u| wrapper_class(&u.module, &u.name))
                {
                    if let Some(&func) = parts.first() {
                        self.wrap(obj, func);
                    }
                }
                let pair_or_single = heap.tuple(state).is_none_or(|t| t.len() == 2);
                let optimizer = self
                    .globals
                    .get(g)
                    .is_some_and(|u| torch_optimizer(&u.module, &u.name));
                let mut smuggled = Vec::new();
                let mut run_on = Vec::new();
                let mut setattr_on = false;
                let mut calls_on_state = Vec::new();
                // Objects the class's code (or torch's) consults as data:
                // a state that is an object (`UUID.__setstate__` reads
                // `state['int']`), what a module's `__setattr__` probes.
                let mut consulted = Vec::new();
                let mut dict_values = Vec::new();
                let pair = heap.tuple(state).is_some_and(|t| t.len() == 2);
                let rules = self.dict_rules(g);
                let mut shadowed = Vec::new();
                for (n, part) in parts.into_iter().enumerate().filter(|_| !torchscript) {
                    // The second of a pair is set attribute by attribute
                    // (`setattr`), the first into the instance's dict.
                    let by_setattr = pair && n == 1;
                    let Some(dict) = heap.dict(part) else {
                        // A state that is a mapping made by a call
                        // (`dict([...])`, `OrderedDict(...)`, a class the
                        // scanner does not know): the names it sets are not
                        // known, so any callable in it may be what a dunder
                        // or a method now is.
                        // BUILD splits only a pair into state and slot
                        // state; any other tuple goes to `__setstate__`.
                        if pair_or_single {
                            smuggled.extend(self.smuggled_by(heap, part)?);
                        }
                        // An object the pickle made, as state: BUILD calls
                        // its `items()`, a class's `__setstate__` its
                        // mapping methods (`get`, `keys`...): an attribute
                        // of it by such a name is what runs.
                        if matches!(self.origin(part), Some(Origin::Made(_))) {
                            calls_on_state.extend(self.held_by_name(heap, part, &STATE_METHODS)?);
                        }
                        // A state that is an object (made, or named from
                        // a library) is read as a mapping.
                        consulted.push(part);
                        continue;
                    };
                    heap.charge_work(dict.entries().len() as u64)?;
                    // A slot state is set by `setattr`: the class's own
                    // `__setattr__` runs for each, with the name and value
                    // the file chose (transformers' `ModelOutput` calls a
                    // method of itself first).
                    if by_setattr && !dict.entries().is_empty() {
                        setattr_on = true;
                    }
                    dict_values.extend(dict.entries().iter().map(|&(_, v)| v));
                    for &(k, v) in dict.entries() {
                        match self.held_in_dict(heap, &rules, k, v, by_setattr) {
                            Held::Smuggled => smuggled.push(v),
                            Held::Called => shadowed.push(v),
                            Held::Read => run_on.push(v),
                            Held::Kept => {}
                        }
                    }
                    // A module's `__setstate__` fills in the hook dicts a
                    // state lacks through `Module.__setattr__`, which asks
                    // `name in self._parameters` (then `_buffers`,
                    // `_modules`): an object there that is no plain
                    // mapping runs its `__contains__`.
                    for &(k, v) in dict.entries() {
                        let probed =
                            matches!(heap.text(k), Some("_parameters" | "_buffers" | "_modules"));
                        if probed && !self.plain_mapping(v) {
                            run_on.push(v);
                            consulted.push(v);
                        }
                    }
                    // An optimizer's `__setstate__` (torch's code) calls
                    // methods of what its state holds: `setdefault` of
                    // `defaults` and of each of `param_groups`, `get` and
                    // `values` of `state`.
                    if optimizer {
                        run_on.extend(
                            dict.entries()
                                .iter()
                                .filter(|(k, _)| {
                                    matches!(
                                        heap.text(*k),
                                        Some("defaults" | "param_groups" | "state")
                                    )
                                })
                                .map(|&(_, v)| v),
                        );
                    }
                }
                self.used(heap, &run_on)?;
                if setattr_on {
                    self.used_unargued(heap, &[obj])?;
                    // A library class's own `__setattr__` runs for each
                    // slot, and may consult what the dict state just put
                    // in the instance (`PretrainedConfig` looks names up in
                    // its `attribute_map`).
                    if self.is_library(g) {
                        consulted.extend(dict_values.iter().copied());
                    }
                }
                heap.charge_work(consulted.len() as u64)?;
                self.library_methods_run(&consulted);
                // A state that is a tuple but no pair goes whole to the
                // class's `__setstate__`, which reads its members
                // (numpy's converts a shape's with `__index__`,
                // `Random.setstate` indexes them): they are used.
                if !pair_or_single && !torchscript {
                    let members = self.made_in_tuples(heap, state)?;
                    self.used_unargued(heap, &members)?;
                }
                // A `defaultdict`'s factory set by a slot state.
                if self.path_of_global(g) == Some(("collections", "defaultdict")) {
                    for c in self.callables_within(heap, &[state])? {
                        self.calls(heap, c)?;
                    }
                }
                for v in calls_on_state.into_iter().chain(shadowed) {
                    self.calls(heap, v)?;
                }
                if !smuggled.is_empty() {
                    if let Some(u) = self.globals.get_mut(g) {
                        u.class = GlobalClass::Dangerous(Danger::Gadget);
                    }
                }
                for v in smuggled {
                    self.calls(heap, v)?;
                }
            }
            // BUILD on a module, class or function itself sets its
            // attributes: whatever is looked up there later (a rebuild
            // function, a method) can be replaced. Dangerous whatever it is.
            Some(Origin::Global(g)) => {
                if let Some(g) = self.globals.get_mut(g) {
                    g.class = GlobalClass::Dangerous(Danger::Gadget);
                }
            }
            None => {}
        }
        Ok(())
    }

    fn dynamic_global(
        &mut self,
        heap: &mut Heap,
        module: Value,
        name: Value,
        offset: u64,
    ) -> Result<Value> {
        // A global named by values computed while unpickling (the result
        // of another global, which BUILD may have turned into a string):
        // nothing here can say what it will resolve to.
        let computed = |r: &Recorder, v: Value| match r.origin(v) {
            Some(Origin::Global(i) | Origin::Made(i)) => r
                .globals
                .get(i)
                .map(|g| format!("<computed from {}.{}>", g.module, g.name)),
            None => None,
        };
        // The scanner keeps protocol-0/1 strings as bytes; torch.load
        // decodes them as UTF-8, so such operands are plain names.
        let text = |v: Value| {
            heap.str(v).map(str::to_owned).or_else(|| {
                heap.bytes(v)
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .map(str::to_owned)
            })
        };
        if let (Some(m), Some(n)) = (text(module), text(name)) {
            return self.global(heap, &m, &n, offset);
        }
        // Operands that are neither text nor traceable to a global (a value
        // a persistent id or a call handed back) may be strings by then.
        let unknown = || "<computed>".to_owned();
        let m = text(module)
            .or_else(|| computed(self, module))
            .unwrap_or_else(unknown);
        let n = text(name)
            .or_else(|| computed(self, name))
            .unwrap_or_else(unknown);
        let v = self.global(heap, &m, &n, offset)?;
        if let Some(i) = self.global_index(v) {
            if let Some(g) = self.globals.get_mut(i) {
                g.class = GlobalClass::Dangerous(Danger::Gadget);
            }
        }
        Ok(v)
    }

    fn method_call(
        &mut self,
        heap: &mut Heap,
        target: Value,
        methods: &[&str],
        values: &[Value],
    ) -> Result<()> {
        match self.origin(target) {
            // An item or element put into a module's own object (a
            // registry, a cache, a list of hooks): the interpreter's state
            // changed, and whatever was put there is called by the code
            // that reads it.
            Some(Origin::Global(g)) => {
                if let Some(u) = self.globals.get_mut(g) {
                    u.class = GlobalClass::Dangerous(Danger::StateChange);
                }
                for &v in values {
                    self.calls(heap, v)?;
                    for c in self.held_callables(heap, v)? {
                        self.calls(heap, c)?;
                    }
                }
            }
            Some(Origin::Made(g)) => {
                // `extend` and `append` are looked up on the instance: an
                // attribute BUILD set, or what the class's `__getattr__`
                // answers with, is what Python calls. (`__setitem__` goes
                // through the type.)
                let by_name: Vec<&str> = methods
                    .iter()
                    .copied()
                    .filter(|m| !m.starts_with("__"))
                    .collect();
                let mut called = if by_name.is_empty() {
                    Vec::new()
                } else {
                    self.held_by_name(heap, target, &by_name)?
                };
                if let Value::Obj(id) = target {
                    if let Some(attrs) = self.methods.get(&id) {
                        called.extend(
                            attrs
                                .iter()
                                .filter(|(k, _)| by_name.contains(&k.as_str()))
                                .map(|&(_, v)| v),
                        );
                    }
                }
                for v in called {
                    self.calls(heap, v)?;
                }
                // A class the scanner does not know runs its own method,
                // with everything the object holds at hand, however deep
                // (a module whose `forward` is another's).
                if !self.plain(g) {
                    self.used(heap, &[target])?;
                }
                // SETITEM(S) on a mapping a call made (`OrderedDict()`,
                // `Counter()`, `dict()`) hashes and compares each key, as a
                // pickle dict's keys are: an object among them runs its
                // `__hash__` and `__eq__`.
                if methods.contains(&"__setitem__") {
                    let keys: Vec<Value> = values.iter().step_by(2).copied().collect();
                    heap.charge_work(keys.len() as u64)?;
                    self.used_unargued(heap, &keys)?;
                }
                // What the values go into, when it is no container that
                // stores them as they are: a `bytearray` or an array
                // converts each (`__index__`, `__int__`, `__float__`); a
                // class the scanner does not know is handed them.
                if !self.stores_as_given(g) {
                    let given: Vec<Value> = if methods.contains(&"__setitem__") {
                        values.iter().skip(1).step_by(2).copied().collect()
                    } else {
                        values.to_vec()
                    };
                    heap.charge_work(given.len() as u64)?;
                    if self.plain(g) {
                        self.used_unargued(heap, &given)?;
                    } else {
                        self.used(heap, &given)?;
                    }
                }
            }
            None => {}
        }
        Ok(())
    }

    fn extension(&mut self, heap: &mut Heap, code: u32, offset: u64) -> Result<Value> {
        // Whatever `copyreg`'s extension registry holds for the code when
        // the file is loaded: nothing in the file says what that is (an
        // earlier part of it may have registered it).
        let v = self.global(
            heap,
            "copyreg",
            &format!("_inverted_registry[{code}]"),
            offset,
        )?;
        if let Some(g) = self.global_index(v).and_then(|i| self.globals.get_mut(i)) {
            g.class = GlobalClass::Dangerous(Danger::Gadget);
        }
        Ok(v)
    }

    fn persistent_load(&mut self, heap: &mut Heap, pid: Value) -> Result<Value> {
        // torch's zip persistent_load builds storages from the id (the
        // storage type is only named); its legacy one returns the id's
        // second item for a `module` id, and the tar loader its first item:
        // a global carried in an id comes back as itself.
        // An id that is no tuple carries nothing.
        let items = heap.tuple(pid).map_or_else(Vec::new, <[Value]>::to_vec);
        heap.charge_work(items.len() as u64)?;
        // torch compares the location with strings and formats the key
        // into a record name: an object among the fields runs its methods;
        // the tar loader converts an id that is no tuple (`int(saved_id)`).
        self.used(heap, &items)?;
        // torch reads the storage type's `dtype`, formats the key: an
        // object of a library class there runs its methods.
        self.library_methods_run(&items);
        if items.is_empty() {
            self.used(heap, &[pid])?;
        }
        self.container_source(heap, &items);
        if let Some(&v) = items.iter().find(|&&v| self.origin(v).is_some()) {
            return Ok(v);
        }
        self.inert(heap, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_method_names_are_sorted_for_their_search() {
        assert!(TORCH_BASE_METHODS.windows(2).all(|w| w[0] < w[1]));
        assert!(TORCH_BASE_METHODS
            .binary_search(&"register_parameter")
            .is_ok());
    }
}
