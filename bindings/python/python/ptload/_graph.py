"""Rebuilding the unpickled object from the reader's flat node graph.

The reader gives every value once, numbered in the order the pickle made
it; members of immutable values (tuples, frozensets, sizes, tensors) come
before them. Building is one loop over those numbers, never recursive:
node ``i`` is made at step ``i``, and a mutable container (list, dict,
set, foreign object) is filled at the step of its last member, which is
when the pickle itself would have filled it. So a value built from a
container (a ``Counter`` from a dict) sees it complete, and cycles are
just references to objects that already exist.

Nothing the file names is imported or called, except the globals the
caller allowed by name (``allow_globals``), as ``torch.serialization``'s
``add_safe_globals`` would.
"""

from __future__ import annotations

import collections
import importlib
from typing import (
    TYPE_CHECKING,
    AbstractSet,
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
    cast,
)

if TYPE_CHECKING:
    import argparse
    import datetime
    import pathlib

    import numpy as np
    import numpy.typing as npt
    import torch

    # A node of the reader's graph: its kind, then what that kind carries
    # (values, member numbers). The objects built from them are Any, as
    # whatever the pickle made is.
    _Node = Tuple[Any, ...]
    # How a plain type is made from its call's arguments (None: kept inert).
    _PlainFactory = Callable[[Tuple[Any, ...]], Any]
    # What the datetime module's pickled types are (a datetime is a date).
    _DateLike = Union[datetime.date, datetime.time, datetime.timedelta]

__all__ = ["Global", "Inert", "build", "PLAIN_TYPES"]

# Nodes without members: made before every other node, so a value whose
# data came later in the pickle (a numpy array's bytes, set by BUILD) finds
# it made.
_LEAVES = frozenset(
    ("none", "bool", "int", "float", "str", "bytes", "bytearray", "bigint", "global",
     "npdtype", "npscalar", "device", "dtype", "layout", "storage")
)


class Global:
    """A reference to a class or function the file names; never imported."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}"

    def __repr__(self) -> str:
        return f"ptload.Global({self.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Global) and other.path == self.path

    def __hash__(self) -> int:
        return hash(("ptload.Global", self.module, self.name))


class Inert:
    """An object the file describes but nobody ran: what would have been
    called (``module``, ``name``), with what (``args``), and what would
    have been set on it (``state``, ``items``, ``list``). Never called."""

    __slots__ = ("module", "name", "args", "state", "items", "list", "new", "callee")

    def __init__(
        self,
        module: str,
        name: str,
        args: Tuple[Any, ...] = (),
        new: bool = False,
        callee: Optional[Inert] = None,
    ) -> None:
        self.module = module
        self.name = name
        self.args = args
        self.state: Any = None
        self.items: Dict[Any, Any] = {}
        self.list: List[Any] = []
        self.new = new
        # What was called when it is no global but the result of another
        # call (``getattr(Path, "touch")(p)``): that call's record.
        self.callee = callee

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}"

    def __repr__(self) -> str:
        what = self.path if self.callee is None else f"the result of {self.callee!r}"
        return f"ptload.Inert({what}, args={_short(self.args)}, state={_short(self.state)})"

    def __getitem__(self, key: Any) -> Any:
        return self.items[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.list or self.items)

    def __len__(self) -> int:
        return len(self.list or self.items)

    def state_dict(self, prefix: str = "") -> collections.OrderedDict[str, torch.Tensor]:
        """For the record of a pickled ``nn.Module`` (a class ptload did not
        build), what the module's ``state_dict()`` would give: parameters,
        then persistent buffers, then each child's under its name, in the
        module's order, tensors detached. Walked with a stack, never
        recursively. A record that is no module raises TypeError."""
        import collections

        if not _module_state(self):
            raise TypeError(f"{self.path} is not a module: it has no parameters, buffers or children")
        out: collections.OrderedDict[str, torch.Tensor] = collections.OrderedDict()
        # Inert records, or module classes the caller allowed (built for real).
        stack: List[Tuple[str, Any]] = [(prefix, self)]
        seen: Set[int] = set()
        while stack:
            at, module = stack.pop()
            if id(module) in seen:
                continue  # a module reached twice is saved once, as torch does
            seen.add(id(module))
            if isinstance(module, Inert):
                state = _module_state(module)
                if state is None:
                    continue
                params = state.get("_parameters") or {}
                buffers = state.get("_buffers") or {}
                skip = state.get("_non_persistent_buffers_set") or set()
                children = state.get("_modules") or {}
                for name, value in params.items():
                    if value is not None:
                        out[at + name] = value.detach()
                for name, value in buffers.items():
                    if value is not None and name not in skip:
                        out[at + name] = value.detach()
                stack.extend(
                    (f"{at}{name}.", child)
                    for name, child in reversed(list(children.items()))
                    if child is not None
                )
            elif hasattr(module, "state_dict"):
                # A module class the caller allowed: built for real.
                out.update(module.state_dict(prefix=at))
        return out

    def __getattr__(self, attr: str) -> Any:
        state = object.__getattribute__(self, "state")
        if isinstance(state, tuple) and len(state) == 2:
            for part in state:
                if isinstance(part, dict) and attr in part:
                    return part[attr]
        if isinstance(state, dict) and attr in state:
            return state[attr]
        if attr.startswith("__") and attr.endswith("__"):
            # Protocol lookups (copy, pickle, numpy, IPython): the plain
            # answer, as any object without them gives.
            raise AttributeError(attr)
        raise AttributeError(self._explain(attr))

    def _explain(self, attr: str) -> str:
        """Why ``attr`` is missing, and what the record offers instead."""
        what = self.path if self.callee is None else f"the result of {self.callee!r}"
        text = (
            f"{attr!r}: this is a ptload.Inert record of {what}, an object the file describes "
            f"that ptload did not build (it runs no code from the file), so it has no methods "
            f"of its class. It offers .module, .name, .args, .state, .items and .list"
        )
        if _module_state(self) is not None:
            text += (
                "; as a pickled nn.Module, .state_dict() gives its tensors: build the model "
                "with your own class and call model.load_state_dict(record.state_dict())"
            )
        return text + (
            ". To build it for real from a file you trust, pass "
            f"allow_globals=[{self.path!r}] (its class is then imported and called)."
        )


def _module_state(record: Inert) -> Optional[Dict[str, Any]]:
    """The attribute dict of a pickled ``nn.Module``'s record (its BUILD
    state, which holds ``_parameters``, ``_buffers`` and ``_modules``), or
    None."""
    state = record.state
    if isinstance(state, tuple) and len(state) == 2:
        state = state[0]
    if isinstance(state, dict) and any(k in state for k in ("_parameters", "_buffers", "_modules")):
        return state
    return None


def _short(value: object) -> str:
    text = repr(value) if not isinstance(value, (dict, list, tuple)) else type(value).__name__
    return text if len(text) < 60 else text[:57] + "..."


def _namespace() -> argparse.Namespace:
    import argparse

    return argparse.Namespace()


# Plain types users keep in checkpoints that torch's allowlist lacks: built
# as the real objects from their data; the file's callable is never called.
# Each entry: how to make it at its step, and how to fill it (or None).
def _plain_complex(args: Tuple[Any, ...]) -> Optional[complex]:
    return complex(*args[:2]) if len(args) <= 2 and all(isinstance(a, (int, float)) for a in args) else None


def _plain_slice(args: Tuple[Any, ...]) -> Optional[slice]:
    ok = len(args) <= 3 and all(a is None or isinstance(a, int) for a in args)
    return slice(*args) if ok else None


def _plain_range(args: Tuple[Any, ...]) -> Optional[range]:
    ok = 1 <= len(args) <= 3 and all(isinstance(a, int) for a in args)
    return range(*args) if ok else None


def _plain_path(kind: str) -> Callable[[Tuple[Any, ...]], Optional[pathlib.PurePath]]:
    """A path of ``kind``, the concrete class where this system can make it
    (a saved ``PosixPath`` is a ``PosixPath`` here, as pickle gives it),
    else its pure form (a ``WindowsPath`` on Linux). Making one does no I/O."""

    def make(args: Tuple[Any, ...]) -> Optional[pathlib.PurePath]:
        import pathlib

        if not all(isinstance(a, str) for a in args):
            return None
        try:
            return cast("pathlib.PurePath", getattr(pathlib, kind)(*args))
        except NotImplementedError:  # WindowsPath on POSIX, PosixPath on Windows
            return cast("pathlib.PurePath", getattr(pathlib, "Pure" + kind)(*args))

    return make


def _plain_datetime(kind: str) -> Callable[[Tuple[Any, ...]], Optional[_DateLike]]:
    def make(args: Tuple[Any, ...]) -> Optional[_DateLike]:
        import datetime

        cls: Callable[..., _DateLike] = getattr(datetime, kind)
        if kind == "timedelta":
            ok = len(args) <= 3 and all(isinstance(a, int) for a in args)
            return cls(*args) if ok else None
        if args and isinstance(args[0], bytes) and len(args) <= 2 and (
            len(args) == 1 or args[1] is None or isinstance(args[1], datetime.tzinfo)
        ):
            try:
                return cls(*args)
            except (TypeError, ValueError):
                return None
        return None

    return make


def _plain_timezone(args: Tuple[Any, ...]) -> Optional[datetime.timezone]:
    import datetime

    if 1 <= len(args) <= 2 and isinstance(args[0], datetime.timedelta) and (
        len(args) == 1 or isinstance(args[1], str)
    ):
        try:
            return datetime.timezone(*args)
        except (TypeError, ValueError):
            return None
    return None


def _plain_counter(args: Tuple[Any, ...]) -> Optional[collections.Counter[Any]]:
    if len(args) == 1 and isinstance(args[0], dict):
        return collections.Counter(args[0])
    return collections.Counter() if not args else None


_SAFE_FACTORIES: Dict[Tuple[str, str], Optional[Callable[[], Any]]] = {
    ("builtins", n): getattr(__builtins__, n, None) if not isinstance(__builtins__, dict) else __builtins__.get(n)
    for n in ("list", "dict", "set", "int", "float", "str", "tuple", "bool", "bytes")
}


def _plain_defaultdict(
    args: Tuple[Any, ...], resolve_global: Optional[Callable[[str, str], Any]]
) -> Optional[collections.defaultdict[Any, Any]]:
    if len(args) == 0:
        return collections.defaultdict()
    factory = args[0]
    if factory is None:
        return collections.defaultdict()
    if isinstance(factory, Global):
        real = _SAFE_FACTORIES.get((factory.module, factory.name))
        if real is not None:
            return collections.defaultdict(real)
        # A factory is called on a missing key: keep it inert, never called.
        return None
    return None


def _plain_deque(args: Tuple[Any, ...]) -> Optional[collections.deque[Any]]:
    # deque's reduce is (deque, ((), maxlen)) or (deque, ()), its items
    # appended after.
    if not args:
        return collections.deque()
    if len(args) in (1, 2) and isinstance(args[0], (list, tuple)):
        maxlen = args[1] if len(args) == 2 else None
        if maxlen is None or isinstance(maxlen, int):
            return collections.deque(args[0], maxlen)
    return None


PLAIN_TYPES: Dict[Tuple[str, str], _PlainFactory] = {
    ("builtins", "complex"): _plain_complex,
    ("builtins", "slice"): _plain_slice,
    ("builtins", "range"): _plain_range,
    ("collections", "Counter"): _plain_counter,
    ("collections", "deque"): _plain_deque,
    ("pathlib", "PosixPath"): _plain_path("PosixPath"),
    ("pathlib", "PurePosixPath"): _plain_path("PurePosixPath"),
    ("pathlib", "WindowsPath"): _plain_path("WindowsPath"),
    ("pathlib", "PureWindowsPath"): _plain_path("PureWindowsPath"),
    ("pathlib", "Path"): _plain_path("Path"),
    ("datetime", "datetime"): _plain_datetime("datetime"),
    ("datetime", "date"): _plain_datetime("date"),
    ("datetime", "time"): _plain_datetime("time"),
    ("datetime", "timedelta"): _plain_datetime("timedelta"),
    ("datetime", "timezone"): _plain_timezone,
}
# Made empty at their step, filled with their state at the fill step.
PLAIN_NEW = {("argparse", "Namespace")}
PLAIN_TYPE_NAMES = sorted(
    {f"{m}.{n}" for m, n in PLAIN_TYPES}
    | {f"{m}.{n}" for m, n in PLAIN_NEW}
    | {"collections.defaultdict"}
)

# The numpy globals the reader decodes itself (torch's full unpickler would
# import them): their objects come back as real numpy scalars, dtypes and
# arrays, not as Inert records.
NUMPY_BUILT_NAMES = frozenset(
    {f"numpy.{core}.multiarray.{n}" for core in ("core", "_core") for n in ("scalar", "_reconstruct")}
    | {"numpy.dtype", "numpy.ndarray"}
)


def _resolve(module: str, name: str) -> Any:
    """Import an allowed global (the caller trusts it by name)."""
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _numpy_dtype(descr: str, big_endian: bool) -> np.dtype[Any]:
    import numpy as np

    code = descr.lstrip("<>=|")
    order = ">" if big_endian else "<"
    if code[:1] in ("b", "S", "U", "V", "O", "?") or code in ("i1", "u1"):
        return np.dtype(code)
    return np.dtype(order + code)


def build(
    root: int,
    nodes: Sequence[_Node],
    make_leaf: Callable[[str, _Node, List[Any]], Any],
    allowed: Union[AbstractSet[str], Dict[str, Any]] = frozenset(),
    unknown: str = "inert",
) -> Any:
    """Build node ``root`` of ``nodes``.

    ``make_leaf(kind, node, objs)`` builds the nodes only a backend knows
    (tensors, parameters, storages, sparse tensors, devices, dtypes,
    layouts); ``allowed`` holds the ``module.name`` globals the caller
    trusts (a set, or a dict giving the object for a name, None to import
    it), which are called as pickle would.
    """
    builder = _Builder(nodes, make_leaf, allowed, unknown)
    # What the file's data makes fail (a deque's negative maxlen, a sparse
    # tensor torch finds invalid) is the file's error: a ptload.Error, as
    # every other refusal of the file is.
    try:
        builder.run()
    except Error:
        raise
    except (TypeError, ValueError, OverflowError, RuntimeError, IndexError, KeyError) as e:
        raise InvalidObjectError.of(type(e))(f"building the object: {type(e).__name__}: {e}") from e
    return builder.objs[root]


def _fill_schedule(nodes: Sequence[_Node]) -> List[List[int]]:
    """For each step ``i`` (the making of node ``i``), the mutable nodes to
    fill right after it: each at the step of its last member, so that every
    member exists when it is filled."""

    def when(child: int) -> int:
        # Scalars are leaves made first; other children by their step.
        return -1 if nodes[child][0] in _LEAVES else child

    # The step at which each mutable node is filled: that of its last
    # member; a BUILD state (whose items are copied onto the object) must be
    # complete first, so its own fill step counts too.
    fill_at: Dict[int, int] = {}
    states: Dict[int, int] = {}
    for i, node in enumerate(nodes):
        kind = node[0]
        if kind in ("list", "set"):
            if node[1]:
                fill_at[i] = max(max(when(c) for c in node[1]), i)
        elif kind in ("dict", "object"):
            members = list(node[2]) if kind == "dict" else list(node[5]) + list(node[6])
            state = node[3] if kind == "dict" else node[4]
            if state is not None:
                members.append(state)
                states[i] = state
            if members:
                fill_at[i] = max(max(when(c) for c in members), i)
    for i, state in states.items():
        fill_at[i] = max(fill_at[i], fill_at.get(state, -1))
    # Within a step, later nodes first: a BUILD state (made after its
    # object) is filled before the object copies it.
    fills: List[List[int]] = [[] for _ in range(len(nodes))]
    for i, step in sorted(fill_at.items(), key=lambda item: -item[0]):
        fills[step].append(i)
    return fills


class _Builder:
    """The objects of one graph, made in the pickle's order: leaves first,
    then each node, each mutable node filled once its members exist."""

    def __init__(
        self,
        nodes: Sequence[_Node],
        make_leaf: Callable[[str, _Node, List[Any]], Any],
        allowed: Union[AbstractSet[str], Dict[str, Any]],
        unknown: str,
    ) -> None:
        self.nodes = nodes
        self.make_leaf = make_leaf
        self.allowed = allowed
        self.unknown = unknown
        self.objs: List[Any] = [None] * len(nodes)

    def run(self) -> None:
        nodes, objs = self.nodes, self.objs
        fills = _fill_schedule(nodes)
        for i, node in enumerate(nodes):
            if node[0] in _LEAVES:
                objs[i] = self.make(node)
        for i, node in enumerate(nodes):
            if node[0] not in _LEAVES:
                objs[i] = self.make(node)
            for m in fills[i]:
                self.fill(m, nodes[m])

    def make(self, node: _Node) -> Any:
        objs = self.objs
        kind = node[0]
        if kind == "none":
            return None
        if kind in ("bool", "int", "float", "str"):
            return node[1]
        if kind == "bytes":
            return node[1]
        if kind == "bytearray":
            return bytearray(node[1])
        if kind == "bigint":
            return int.from_bytes(node[1], "little", signed=True)
        if kind == "tuple":
            return tuple(objs[c] for c in node[1])
        if kind == "list":
            return []
        if kind == "dict":
            return collections.OrderedDict() if node[1] else {}
        if kind == "set":
            return set()
        if kind == "frozenset":
            return frozenset(objs[c] for c in node[1])
        if kind == "global":
            return self.global_(node[1], node[2])
        if kind == "npdtype":
            if node[3]:
                # Fields or a subarray: its code alone (V12) would lose them.
                self.unbuilt(f"a structured numpy dtype ({node[1]})")
                return Inert("numpy", "dtype", (node[1],))
            return _numpy_dtype(node[1], node[2])
        if kind == "npscalar":
            import numpy as np

            dtype = _numpy_dtype(node[1], node[2])
            return np.frombuffer(node[3], dtype=dtype, count=1)[0]
        if kind == "ndarray":
            return self.ndarray(node)
        if kind == "object":
            return self.object(node)
        return self.make_leaf(kind, node, objs)

    def unbuilt(self, what: str) -> None:
        # With unknown="error" nothing comes back inert: say what could not
        # be built, rather than hand back a record the caller did not ask for.
        if self.unknown == "error":
            raise Error(f"{what} is kept inert, never built; pass unknown='inert' to get it as a ptload.Inert")

    def global_(self, module: str, name: str) -> Any:
        path = f"{module}.{name}"
        allowed = self.allowed
        # A name or a glob of the caller's, by the reader's rule.
        if allowed and _ptload.global_allowed(list(allowed), module, name):
            given = allowed.get(path) if isinstance(allowed, dict) else None
            if given is not None:
                return given
            try:
                return _resolve(module, name)
            except (ImportError, AttributeError) as e:
                raise Error(f"{path} is allowed but cannot be imported here: {e}") from None
        return Global(module, name)

    def ndarray(self, node: _Node) -> Union[Inert, npt.NDArray[Any]]:
        import numpy as np

        descr, shape, fortran, data = node[1], node[2], node[3], self.objs[node[4]]
        if descr is None or not isinstance(data, bytes):
            self.unbuilt(f"a numpy array of shape {tuple(shape)} whose dtype ptload does not build")
            return Inert("numpy", "ndarray", (descr, tuple(shape), data))
        dtype = _numpy_dtype(descr[0], descr[1])
        count = 1
        for d in shape:
            count *= d
        if count * dtype.itemsize != len(data):
            raise Error(
                f"numpy array of shape {tuple(shape)} and dtype {dtype} "
                f"holds {len(data)} bytes"
            )
        flat = np.frombuffer(data, dtype=dtype, count=count).copy()
        if not dtype.isnative:
            # numpy unpickles an array of the other byte order in the host's.
            flat = flat.astype(dtype.newbyteorder("="))
        return flat.reshape(tuple(shape), order="F" if fortran else "C")

    def object(self, node: _Node) -> Any:
        new, cls, args = node[1], self.objs[node[2]], self.objs[node[3]]
        if not isinstance(args, tuple):
            args = (args,)
        if isinstance(cls, Global):
            module, name = cls.module, cls.name
            key = (module, name)
            if key in PLAIN_NEW:
                return _namespace()
            if key == ("collections", "defaultdict"):
                made = _plain_defaultdict(args, None)
                if made is not None:
                    return made
            elif key in PLAIN_TYPES:
                made = PLAIN_TYPES[key](args)
                if made is not None:
                    return made
            return Inert(module, name, args, new)
        if isinstance(cls, Inert):
            return Inert(cls.module, cls.name, args, new, callee=cls)
        if isinstance(cls, type) or callable(cls):
            # An allowed global, resolved: called as pickle would.
            if new:
                return cls.__new__(cls, *args)
            return cls(*args)
        return Inert("?", "?", args, new)

    def fill(self, i: int, node: _Node) -> None:
        objs = self.objs
        kind, obj = node[0], objs[i]
        if kind == "list":
            obj.extend(objs[c] for c in node[1])
        elif kind == "set":
            obj.update(objs[c] for c in node[1])
        elif kind == "dict":
            items = node[2]
            for k in range(0, len(items), 2):
                obj[objs[items[k]]] = objs[items[k + 1]]
            if node[3] is not None:
                _set_state(obj, objs[node[3]], dict_like=True)
        elif kind == "object":
            state = objs[node[4]] if node[4] is not None else None
            items, listed = node[5], node[6]
            if isinstance(obj, Inert):
                obj.state = state
                for k in range(0, len(items), 2):
                    obj.items[objs[items[k]]] = objs[items[k + 1]]
                obj.list.extend(objs[c] for c in listed)
                return
            for k in range(0, len(items), 2):
                obj[objs[items[k]]] = objs[items[k + 1]]
            if listed:
                if hasattr(obj, "extend"):
                    obj.extend(objs[c] for c in listed)
                else:
                    for c in listed:
                        obj.append(objs[c])
            if state is not None:
                _set_state(obj, state, dict_like=False)


def _set_state(obj: Any, state: Any, dict_like: bool) -> None:
    """BUILD, as pickle does it: ``__setstate__`` when the (allowed) class
    has one, else the state dict (and slot dict) as attributes."""
    setstate = getattr(type(obj), "__setstate__", None)
    if setstate is not None and not dict_like and type(obj).__module__ not in (
        "argparse",
        "collections",
    ):
        setstate(obj, state)
        return
    slots: Any = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if isinstance(state, dict):
        if dict_like:
            for k, v in state.items():
                setattr(obj, k, v)
        else:
            obj.__dict__.update(state)
    if isinstance(slots, dict):
        for k, v in slots.items():
            setattr(obj, k, v)


from . import _ptload  # noqa: E402
from ._errors import Error, InvalidObjectError  # noqa: E402
