"""``ptload.patch()``: make ``torch.load`` ptload's loader, process-wide.

Libraries that call ``torch.load`` (transformers' ``from_pretrained`` on
``.bin`` files, Lightning's ``load_from_checkpoint``, ``torch.hub``) then
read checkpoints with :func:`ptload.torch.load` and never run a file's
pickle code::

    ptload.patch()                  # until ptload.unpatch()
    with ptload.patch(unknown="inert"):
        model = AutoModel.from_pretrained(path)

The replacement has ``torch.load``'s signature and passes every argument
through unchanged (``encoding`` from ``**pickle_load_args``); keywords
given to ``patch()`` are ptload's own options (``unknown``,
``allow_globals``, ``strict``, ``progress``...) added to every call, where
a call's own keywords win. ``map_location`` may be given too: it applies
to the calls that pass none. Both ``torch.load`` and
``torch.serialization.load`` are replaced; a module that took its own
reference to ``torch.load`` before ``patch()`` (``from torch import load``)
keeps torch's.

``ptload.patched()`` says whether the patch is in force, ``repr(torch.load)``
names ptload and the options, and each load logs one line at ``DEBUG`` on
the ``ptload`` logger.
"""

import contextvars
import importlib
import inspect
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Literal, Mapping, Optional, Tuple, Union

if TYPE_CHECKING:
    import torch

    from ._safe import safe_open
    from .torch import DeviceLike, FileLike, MapLocation

    # torch.load and torch.serialization.load, in that order.
    _LoadPair = Tuple[Callable[..., Any], ...]

__all__ = ["patch", "unpatch", "patched"]

_lock = threading.Lock()


def _current() -> "_LoadPair":
    import torch

    return torch.load, torch.serialization.load


def _install(pair: "_LoadPair") -> None:
    import torch

    torch.load, torch.serialization.load = pair


def _originals(pair: "_LoadPair") -> "_LoadPair":
    """torch's own functions under ``pair``: a wrapper of ours knows what
    it replaced; anything else is taken as it is."""
    return tuple(getattr(fn, "__ptload_originals__", (fn, fn))[i] for i, fn in enumerate(pair))


def _check_options(defaults: Mapping[str, Any]) -> None:
    """``defaults`` must be ptload.torch.load's keyword options that
    torch.load does not have (torch's own arguments are given per call)."""
    import torch

    from . import torch as ptorch

    theirs = inspect.signature(torch.serialization.load).parameters
    ours = inspect.signature(ptorch.load).parameters
    options = sorted(
        name
        for name, p in ours.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in theirs
    )
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ours.values())
    # map_location is the one torch argument a program may want for every
    # load (a checkpoint saved on a GPU this machine lacks): a default for
    # the calls that give none.
    wrong = sorted(
        k
        for k in defaults
        if (k in theirs and k != "map_location") or not (takes_any or k in options or k in theirs)
    )
    if wrong:
        why = ""
        if "weights_only" in wrong:
            why = (
                "; weights_only is each call's own, and weights_only=False is safe under "
                "ptload: it runs nothing from the file either"
            )
        raise TypeError(
            f"patch() takes map_location (for calls that give none) and ptload.torch.load's "
            f"own options ({', '.join(options)}), not {', '.join(wrong)}{why}"
        )


_log = logging.getLogger("ptload")

# Set while a patched torch.load runs, so the refusals it raises name
# ptload.patch()'s options (a library's from_pretrained passes no ptload
# keyword through to torch.load).
_in_patch: contextvars.ContextVar[bool] = contextvars.ContextVar("ptload_in_patch", default=False)


def in_patch() -> bool:
    """Whether the current load came through a patched ``torch.load``."""
    return _in_patch.get()


class _PatchedLoad:
    """``torch.load`` as :func:`patch` makes it: torch.load's signature
    (``inspect.signature`` follows ``__wrapped__`` to torch's), ptload's
    loader behind it, and a repr and docstring that say so."""

    def __init__(self, originals: "_LoadPair", defaults: Mapping[str, Any]) -> None:
        self.__ptload_defaults__ = dict(defaults)
        self.__ptload_originals__ = originals
        self.__wrapped__ = originals[0]
        self.__name__ = getattr(originals[0], "__name__", "load")
        self.__qualname__ = self.__name__
        self.__module__ = __name__
        shown = "".join(f", {k}={v!r}" for k, v in sorted(self.__ptload_defaults__.items()))
        self._shown = shown
        self.__doc__ = (
            f"torch.load replaced by ptload.patch({shown.lstrip(', ')}): the checkpoint is read "
            "by ptload.torch.load, which never runs code from the file; ptload.unpatch() puts "
            "torch's function back.\n\ntorch's own documentation:\n\n"
            + (getattr(originals[0], "__doc__", None) or "")
        )

    def __call__(
        self,
        f: "FileLike",
        map_location: "MapLocation" = None,
        pickle_module: Any = None,
        *,
        weights_only: Optional[bool] = None,
        mmap: Optional[bool] = None,
        **pickle_load_args: Any,
    ) -> Any:
        # Looked up at each call, so importing ptload never imports torch.
        from . import torch as ptorch

        options = {**self.__ptload_defaults__, **pickle_load_args}
        if map_location is None:
            map_location = options.pop("map_location", None)
        else:
            options.pop("map_location", None)
        _log.debug(
            "torch.load(%r) read by ptload.torch.load (ptload.patch options: %s)",
            f if isinstance(f, (str, os.PathLike)) else type(f).__name__,
            self._shown.lstrip(", ") or "none",
        )
        token = _in_patch.set(True)
        try:
            return ptorch.load(
                f, map_location, pickle_module, weights_only=weights_only, mmap=mmap, **options
            )
        finally:
            _in_patch.reset(token)

    def __repr__(self) -> str:
        return f"<torch.load patched by ptload.patch({self._shown.lstrip(', ')}): ptload.torch.load>"

    def __reduce__(self) -> Tuple[Callable[[], Callable[..., Any]], Tuple[()]]:
        # Pickled by reference, as torch's function is (a DataLoader worker
        # started by spawn gets `torch.load` in its own process).
        return (_torch_load, ())


def _torch_load() -> Callable[..., Any]:
    """``torch.load`` as it is in the process that unpickles it."""
    import torch

    return torch.load


# safetensors' readers as libraries call them, by (module, name): the
# safetensors package's own and the references transformers took when it
# was imported (`from safetensors import safe_open`). diffusers calls
# `safetensors.torch.load_file` through the module, and its `safe_open`
# import happens at call time, from the package.
_SAFETENSORS_NAMES = (
    ("safetensors", "safe_open"),
    ("safetensors.torch", "safe_open"),
    ("safetensors.torch", "load_file"),
    ("transformers.modeling_utils", "safe_open"),
)


def _st_safe_open(
    filename: Union[str, "os.PathLike[str]"],
    framework: str = "pt",
    device: Any = "cpu",
    backend: Optional[str] = None,
    **kwargs: Any,
) -> "safe_open":
    """safetensors' ``safe_open`` read by ptload: the file's own names (no
    key or prefix choice), its checks, and torch checkpoints too."""
    from ._safe import safe_open

    return safe_open(
        filename, framework, device, key=None, strip_prefix=None,
        backend=backend if backend in ("mmap", "pread") else "mmap",
    )


def _st_load_file(
    filename: Union[str, "os.PathLike[str]"], device: "DeviceLike" = "cpu", **kwargs: Any
) -> Dict[str, "torch.Tensor"]:
    """safetensors' ``load_file`` read by ptload (a GPU device goes through
    ptload-device's pipeline)."""
    from .torch import load_file

    return load_file(filename, device=device, key=None, strip_prefix=None)


# A mark on the functions themselves, which mypy does not model.
_st_safe_open.__ptload_safetensors__ = True  # type: ignore[attr-defined]
_st_load_file.__ptload_safetensors__ = True  # type: ignore[attr-defined]
_ST_WRAPPERS: Dict[str, Callable[..., Any]] = {"safe_open": _st_safe_open, "load_file": _st_load_file}
# What the routes replaced, to put back: {(module, name): original}.
_st_originals: Dict[Tuple[str, str], Callable[..., Any]] = {}


def _route_safetensors() -> None:
    """Point safetensors' readers, where they are imported, at ptload's."""
    import sys

    for module_name, name in _SAFETENSORS_NAMES:
        module = sys.modules.get(module_name)
        if module_name.startswith("safetensors") and module is None:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
        current = getattr(module, name, None) if module is not None else None
        if current is None or getattr(current, "__ptload_safetensors__", False):
            continue
        _st_originals[(module_name, name)] = current
        setattr(module, name, _ST_WRAPPERS[name])


def _unroute_safetensors() -> None:
    import sys

    for (module_name, name), original in list(_st_originals.items()):
        module = sys.modules.get(module_name)
        if module is not None:
            setattr(module, name, original)
        del _st_originals[(module_name, name)]


class _Patched:
    """What ``patch()`` returns: as a context manager, it puts back on exit
    what ``torch.load`` was when ``patch()`` was called (and safetensors'
    readers, when this patch routed them), exception or not."""

    def __init__(self, previous: "_LoadPair", routed: bool = False) -> None:
        self._previous = previous
        self._routed = routed

    def __enter__(self) -> "_Patched":
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        with _lock:
            _install(self._previous)
            if self._routed:
                _unroute_safetensors()
        return False


def patch(*, safetensors: bool = False, **defaults: Any) -> "_Patched":
    """Replace ``torch.load`` and ``torch.serialization.load`` with
    :func:`ptload.torch.load`, called with ``defaults`` (ptload's options,
    such as ``unknown="inert"`` or ``allow_globals=[...]``) as well as the
    call's own arguments.

    Stays in force until :func:`unpatch`, or until the ``with`` block ends
    when used as ``with ptload.patch(): ...``. Patching again with the same
    defaults changes nothing; with others, it replaces them. ``unpatch``
    always puts torch's own function back.

    ``safetensors=True`` routes safetensors' ``safe_open`` and
    ``safetensors.torch.load_file`` through ptload as well, where
    safetensors defines them and where transformers imported them
    (``from_pretrained`` of a safetensors model then reads with ptload's
    checks, a GPU device through ptload-device), with safetensors' answers:
    the file's own names, its ``__metadata__``.
    """
    _check_options(defaults)
    with _lock:
        previous = _current()
        current = getattr(previous[0], "__ptload_defaults__", None)
        if current is None or not _same(current, defaults) or previous[1] is not previous[0]:
            wrapper = _PatchedLoad(_originals(previous), defaults)
            _install((wrapper, wrapper))
        routed = bool(safetensors) and not _st_originals
        if routed:
            _route_safetensors()
    return _Patched(previous, routed)


def _same(a: object, b: object) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - options that cannot be compared differ
        return False


def patched() -> bool:
    """Whether ``torch.load`` is ptload's now (made so by :func:`patch`);
    ``repr(torch.load)`` names the options in force."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return isinstance(getattr(torch, "load", None), _PatchedLoad)


def unpatch() -> None:
    """Put torch's own ``torch.load`` and ``torch.serialization.load``
    back; nothing happens when they are not patched."""
    with _lock:
        _install(_originals(_current()))
        _unroute_safetensors()
