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
a call's own keywords win. Both ``torch.load`` and
``torch.serialization.load`` are replaced; a module that took its own
reference to ``torch.load`` before ``patch()`` (``from torch import load``)
keeps torch's.
"""

import functools
import inspect
import threading
from typing import Any

__all__ = ["patch", "unpatch"]

_lock = threading.Lock()


def _current():
    import torch

    return torch.load, torch.serialization.load


def _install(pair):
    import torch

    torch.load, torch.serialization.load = pair


def _originals(pair):
    """torch's own functions under ``pair``: a wrapper of ours knows what
    it replaced; anything else is taken as it is."""
    return tuple(getattr(fn, "__ptload_originals__", (fn, fn))[i] for i, fn in enumerate(pair))


def _check_options(defaults):
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
    wrong = sorted(k for k in defaults if k in theirs or not (takes_any or k in options))
    if wrong:
        raise TypeError(
            f"patch() takes ptload.torch.load's own options ({', '.join(options)}), "
            f"not {', '.join(wrong)}"
        )


def _wrapper(originals, defaults):
    """A function with torch.load's signature that loads with ptload."""

    @functools.wraps(originals[0])
    def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **pickle_load_args):
        # Looked up at each call, so importing ptload never imports torch.
        from . import torch as ptorch

        options = {**defaults, **pickle_load_args}
        return ptorch.load(
            f, map_location, pickle_module, weights_only=weights_only, mmap=mmap, **options
        )

    load.__ptload_defaults__ = dict(defaults)
    load.__ptload_originals__ = originals
    return load


class _Patched:
    """What ``patch()`` returns: as a context manager, it puts back on exit
    what ``torch.load`` was when ``patch()`` was called, exception or not."""

    def __init__(self, previous):
        self._previous = previous

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with _lock:
            _install(self._previous)
        return False


def patch(**defaults: Any) -> "_Patched":
    """Replace ``torch.load`` and ``torch.serialization.load`` with
    :func:`ptload.torch.load`, called with ``defaults`` (ptload's options,
    such as ``unknown="inert"`` or ``allow_globals=[...]``) as well as the
    call's own arguments.

    Stays in force until :func:`unpatch`, or until the ``with`` block ends
    when used as ``with ptload.patch(): ...``. Patching again with the same
    defaults changes nothing; with others, it replaces them. ``unpatch``
    always puts torch's own function back.
    """
    _check_options(defaults)
    with _lock:
        previous = _current()
        current = getattr(previous[0], "__ptload_defaults__", None)
        if current is None or not _same(current, defaults) or previous[1] is not previous[0]:
            wrapper = _wrapper(_originals(previous), defaults)
            _install((wrapper, wrapper))
    return _Patched(previous)


def _same(a, b):
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - options that cannot be compared differ
        return False


def unpatch() -> None:
    """Put torch's own ``torch.load`` and ``torch.serialization.load``
    back; nothing happens when they are not patched."""
    with _lock:
        _install(_originals(_current()))
