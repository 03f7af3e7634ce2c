"""ptload's exceptions: one base, ``ptload.Error``."""

import pickle

from ._ptload import Error

__all__ = ["Error", "UnsafeGlobalError", "open_checkpoint"]


class UnsafeGlobalError(Error, pickle.UnpicklingError):
    """The file names globals outside torch's ``weights_only`` allowlist.

    A subclass of ``pickle.UnpicklingError``, as torch's own refusal is, so
    code that catches torch's error keeps working. ``globals`` lists every
    forbidden ``module.name``.
    """

    def __init__(self, message, globals_):
        super().__init__(message)
        self.globals = list(globals_)
        self.kind = "UnsupportedGlobal"
        self.offset = None
        self.record = None
        self.tensor = None


def open_checkpoint(f, *, objects=True, in_memory=False):
    """Open ``f`` (a path, bytes, or a binary file object) with the reader."""
    import os

    from . import _ptload

    if isinstance(f, (bytes, bytearray, memoryview)):
        return _ptload.open(bytes(f), objects=objects)
    if isinstance(f, (str, os.PathLike)):
        return _ptload.open(os.fspath(f), objects=objects, in_memory=in_memory)
    if hasattr(f, "read"):
        return _ptload.open(f.read(), objects=objects)
    raise TypeError(
        f"expected a path, bytes or a binary file object, got {type(f).__name__}"
    )
