"""ptload's exceptions: one base, ``ptload.Error``."""

import errno
import os
import pickle
import sys

from ._ptload import Error

__all__ = ["Error", "UnsafeGlobalError", "open_checkpoint"]

# The reader's errors set these per instance; errors raised by the Python
# layer (a usage error, strict placement) have no offset in a file.
Error.kind = "Other"
Error.offset = None
Error.record = None
Error.tensor = None
# Named where users import it, so an error pickles (multiprocessing sends
# it back to the parent) and prints as ptload.Error.
Error.__module__ = "ptload"


class UnsafeGlobalError(Error, pickle.UnpicklingError):
    """The file names globals outside torch's ``weights_only`` allowlist.

    A subclass of ``pickle.UnpicklingError``, as torch's own refusal is, so
    code that catches torch's error keeps working. ``globals`` lists every
    forbidden ``module.name``.
    """

    def __init__(self, message, globals_=()):
        super().__init__(message)
        self.globals = list(globals_)
        self.kind = "UnsupportedGlobal"
        self.offset = None
        self.record = None
        self.tensor = None

    def __reduce__(self):
        return (type(self), (str(self), self.globals))


UnsafeGlobalError.__module__ = "ptload"


def user_stacklevel():
    """The ``stacklevel`` that makes a warning point at the first frame
    outside this package (for the function that calls ``warnings.warn``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    level = 1
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame = frame.f_back
        level += 1
    return level


def require_file(path):
    """A missing path is the FileNotFoundError torch and safetensors
    raise, so code catching OSError works."""
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


def read_binary(f):
    """The rest of a binary file object, as bytes; a text-mode one is a
    TypeError, never a path."""
    data = f.read()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"the file object gave {type(data).__name__}, not bytes: open the file in binary mode ('rb')"
        )
    return bytes(data)


def open_checkpoint(f, *, objects=True, in_memory=False, encoding=None):
    """Open ``f`` (a path, bytes, or a binary file object) with the reader."""
    from . import _ptload

    if isinstance(f, (bytes, bytearray, memoryview)):
        return _ptload.open(bytes(f), objects=objects, encoding=encoding)
    if isinstance(f, (str, os.PathLike)):
        path = os.fsdecode(os.fspath(f))
        if os.path.isdir(path):
            raise IsADirectoryError(
                errno.EISDIR,
                "a directory, not a checkpoint file (ptload.torch.load_file and "
                "ptload.safe_open read a directory of shards)",
                path,
            )
        require_file(path)
        return _ptload.open(path, objects=objects, in_memory=in_memory, encoding=encoding)
    if hasattr(f, "read"):
        return _ptload.open(read_binary(f), objects=objects, encoding=encoding)
    raise TypeError(
        f"expected a path, bytes or a binary file object, got {type(f).__name__}"
    )
