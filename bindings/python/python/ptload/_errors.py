"""ptload's exceptions: one base, ``ptload.Error``, and a class per kind of
failure, each also the exception ``torch.load`` raises in the same case
(``RuntimeError`` for a corrupt container, ``pickle.UnpicklingError`` for a
pickle it refuses, ``UnicodeDecodeError`` for a Python 2 string that does not
decode...), so code written for torch catches them unchanged. Each carries
``kind`` (the reader's error kind), ``offset``, ``record``, ``tensor``,
``file`` (the file of a set it concerns) and ``hint`` (what to do).
"""

import errno
import io
import os
import pickle
import struct
import sys

from ._ptload import Error

__all__ = [
    "Error",
    "NotACheckpointError",
    "EmptyFileError",
    "ContainerError",
    "PickleError",
    "CorruptRecordError",
    "DecodeError",
    "UnsafeGlobalError",
    "TensorError",
    "LimitError",
    "UnsupportedError",
    "DeviceError",
    "InvalidObjectError",
    "IoError",
    "from_reader",
    "read_at",
    "open_checkpoint",
    "is_url",
]

# The reader's errors set these per instance; errors raised by the Python
# layer (a usage error, strict placement) have no offset in a file.
Error.kind = "Other"
Error.offset = None
Error.record = None
Error.tensor = None
Error.file = None
Error.hint = None
# Named where users import it, so an error pickles (multiprocessing sends
# it back to the parent) and prints as ptload.Error.
Error.__module__ = "ptload"


def _rebuild(cls, message, fields):
    e = cls(message)
    e.__dict__.update(fields)
    return e


def _reduce(self):
    cls = type(self)
    exc_type = getattr(cls, "_exc_type", None)
    if exc_type is not None:
        cls = (InvalidObjectError, exc_type)
    return (_rebuild_from, (cls, self.message, dict(self.__dict__)))


def _rebuild_from(cls, message, fields):
    if isinstance(cls, tuple):
        cls = cls[0].of(cls[1])
    return _rebuild(cls, message, fields)


Error.message = property(lambda self: str(self.args[0]) if self.args else "")
Error.__reduce__ = _reduce


class ContainerError(Error, RuntimeError):
    """A zip or legacy container that is malformed, or a layout ptload does
    not read: torch raises ``RuntimeError`` (``PytorchStreamReader failed
    ...``, ``Invalid magic number; corrupt file?``)."""


# What torch's unpickler lets through on corrupt bytes, as the broken byte
# leads it: its own refusal, a string that does not decode, a memo key or
# stack slot that is not there, data that ends early, a struct too short.
_CORRUPT_PICKLE = (pickle.UnpicklingError, UnicodeDecodeError, KeyError, IndexError, EOFError, struct.error)


class PickleError(Error, *_CORRUPT_PICKLE):
    """The pickle program is malformed. On such bytes torch's unpickler
    raises whatever the broken byte leads it to (``UnpicklingError``,
    ``UnicodeDecodeError``, ``KeyError``, ``IndexError``, ``EOFError``,
    ``struct.error``); this error is each of them, so torch's ``except``
    clauses catch it whichever byte broke."""

    __str__ = Exception.__str__

    def __init__(self, message, encoding="utf-8"):
        UnicodeDecodeError.__init__(self, encoding, b"", 0, 0, message)
        self.args = (message,)


class NotACheckpointError(Error, RuntimeError, *_CORRUPT_PICKLE):
    """The bytes are not a torch checkpoint. torch hands bytes that are no
    zip to its unpickler, which fails as the first bytes lead it: a
    magic-number check (``RuntimeError``), ``UnpicklingError``, or a
    ``KeyError`` / ``IndexError`` / ``EOFError`` from the opcode a text
    byte happens to be (``h`` reads the memo, ``s`` pops an empty stack);
    this error is each of them, so torch's ``except`` clauses catch it."""

    __str__ = Exception.__str__

    def __init__(self, message, encoding="utf-8"):
        UnicodeDecodeError.__init__(self, encoding, b"", 0, 0, message)
        self.args = (message,)


class EmptyFileError(NotACheckpointError, EOFError):
    """An empty file or stream: torch's ``EOFError: Ran out of input``."""


class CorruptRecordError(ContainerError, PickleError):
    """A zip record torch parses (the pickle, ``byteorder``, ``version``...)
    whose bytes fail their checksum or cannot be found: torch would have
    parsed the damaged bytes and failed as a malformed pickle does, so this
    is both a ``ContainerError`` and a ``PickleError``."""


class DecodeError(Error, UnicodeDecodeError):
    """A Python 2 string that does not decode with the ``encoding`` asked
    for: the ``UnicodeDecodeError`` pickle raises."""

    def __init__(self, message, encoding="utf-8"):
        UnicodeDecodeError.__init__(self, encoding, b"", 0, 0, message)
        self.args = (message,)

    def __str__(self):
        return self.message


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


class TensorError(Error, RuntimeError):
    """A storage or tensor record inconsistent with its data."""


class LimitError(Error, RuntimeError):
    """The file asks for more work or memory than the reader's limits allow."""


class UnsupportedError(Error, RuntimeError):
    """Something valid that ptload does not read."""


class DeviceError(Error, RuntimeError):
    """A storage cannot go to the device asked for (with ``strict=True``;
    otherwise it stays on the host with a warning)."""


class InvalidObjectError(Error, RuntimeError):
    """What the file's data makes fail while the object is built (a sparse
    tensor torch finds invalid); the message is torch's own. Subclasses per
    the exception torch raised (``InvalidObjectError.of(ValueError)``)."""

    _by_type = {}

    @classmethod
    def of(cls, exc_type):
        """The subclass that is also ``exc_type`` (a ``RuntimeError``,
        ``ValueError``, ``TypeError``...)."""
        made = cls._by_type.get(exc_type)
        if made is None:
            bases = (cls,) if issubclass(cls, exc_type) else (cls, exc_type)
            made = type(
                cls.__name__,
                bases,
                {"__module__": "ptload", "__doc__": cls.__doc__, "_exc_type": exc_type},
            )
            cls._by_type[exc_type] = made
        return made


# The reader's error kinds; one table, read by the extension (to_py).
_BY_KIND = {
    "Io": None,  # made an OSError below
    "NotACheckpoint": NotACheckpointError,
    "UnsupportedLayout": ContainerError,
    "Zip": ContainerError,
    "Legacy": ContainerError,
    "Pickle": PickleError,
    "Decode": DecodeError,
    "UnsupportedGlobal": UnsafeGlobalError,
    # The scanner's verdict at or above the level refused (refuse_at).
    "Refused": UnsafeGlobalError,
    "Tensor": TensorError,
    "LimitExceeded": LimitError,
    "Unsupported": UnsupportedError,
    # Two tensors under one name (a rename, a set's files): what a state
    # dict cannot hold, raised as it was before it had a kind of its own.
    "DuplicateName": UnsupportedError,
}


class IoError(Error, OSError):
    """Reading the file failed."""

    def __init__(self, message):
        OSError.__init__(self, message)


_BY_KIND["Io"] = IoError

# The records of torch's zip layout that torch parses itself (the pickle
# and the small text records); storages it only copies.
_PARSED_RECORDS = ("byteorder", "version", ".format_version", ".storage_alignment", "serialization_id")


def _parsed_by_torch(record):
    name = record.rsplit("/", 1)[-1]
    return name.endswith(".pkl") or name in _PARSED_RECORDS


for _cls in list(_BY_KIND.values()) + [EmptyFileError, DeviceError, InvalidObjectError, CorruptRecordError]:
    _cls.__module__ = "ptload"


def from_reader(kind, message, offset=None, record=None, tensor=None, encoding=None, file=None, hint=None):
    """The exception for a reader error of ``kind``: ``file`` is the file
    of a set it concerns, ``hint`` what the caller could do (both also in
    the message)."""
    cls = _BY_KIND.get(kind, Error)
    if kind == "Zip" and record and _parsed_by_torch(record):
        cls = CorruptRecordError
    e = cls(message, encoding or "utf-8") if cls is DecodeError else cls(message)
    e.kind = kind
    e.offset = offset
    e.record = record
    e.tensor = tensor
    e.file = file
    e.hint = hint
    return e


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


_NOT_SEEKABLE = (
    ". You can only torch.load from a file that is seekable. Please pre-load the data "
    "into a buffer like io.BytesIO and try to load from it instead."
)


def read_stream(f):
    """The rest of a binary file object from where it stands:
    ``(data, start)``. Read with ``readinto`` when the object has it (one
    buffer, no copies), else ``read``. A stream that cannot seek is refused
    with torch's words (the caller leaves it just past the checkpoint); a
    text-mode one is a TypeError, never a path."""
    try:
        start = f.tell()
        f.seek(start)
    except (io.UnsupportedOperation, AttributeError) as e:
        if "seek" in str(e) or "tell" in str(e):
            raise type(e)(f"{e}{_NOT_SEEKABLE}") from None
        raise
    readinto = getattr(f, "readinto", None)
    if readinto is None:
        data = f.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"the file object gave {type(data).__name__}, not bytes: open the file in binary mode ('rb')"
            )
        return bytes(data), start
    end = f.seek(0, os.SEEK_END)
    if not isinstance(end, int):
        end = f.tell()
    f.seek(start)
    size = max(end - start, 0)
    data = bytearray(size)
    done = 0
    with memoryview(data) as view:
        while done < size:
            n = readinto(view[done:])
            if not n:
                break
            done += n
    if done < size:
        del data[done:]  # the stream ended early (it shrank)
    return data, start


def read_at(fh, offset, view, path):
    """Fill ``view`` (a writable buffer) from the binary file ``fh`` at
    ``offset``; a file that ends first (it shrank while it was read) is a
    ContainerError naming ``path``."""
    fh.seek(offset)
    done, size = 0, len(view)
    while done < size:
        n = fh.readinto(view[done:])
        if not n:
            raise ContainerError(f"{path}: the file shrank while it was read")
        done += n


def stream_ended(start):
    """The error for a stream read to its end at ``start`` (several objects
    saved one after another, all read): torch's ``EOFError``, saying where,
    not that the checkpoint is empty."""
    e = EmptyFileError(
        f"Ran out of input: nothing follows byte {start} of the stream "
        "(every object saved on it was read)"
    )
    e.kind = "NotACheckpoint"
    return e


def is_url(f):
    """Whether ``f`` is a URL the reader fetches by ranged requests
    (``http://``, ``https://``, ``s3://``, ``gs://``, ``az://``) rather
    than a path: a ``str`` only, as ``pathlib`` folds ``//``. The reader
    holds the one list of schemes."""
    from . import _ptload

    return isinstance(f, str) and _ptload.is_url(f)


def url_name(url):
    """The last segment of ``url``'s path, for messages and progress bars."""
    return url.split("?", 1)[0].split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def open_checkpoint(f, *, objects=True, in_memory=False, encoding=None, byte_order=None, refuse_at=None):
    """Open ``f`` (a path, a URL, bytes, or a binary file object) with the
    reader. A URL is read by ranged requests: what opening parses now, each
    storage's bytes when first asked for (``in_memory`` does not apply).
    ``refuse_at``: the scanner's level at which the file is refused."""
    from . import _ptload

    opts = {"objects": objects, "encoding": encoding, "byte_order": byte_order, "refuse_at": refuse_at}
    if is_url(f):
        # The reader learns the length with its first request; an empty
        # file is its error, as any other.
        source, empty = f, False
    elif isinstance(f, (str, os.PathLike)):
        path = os.fsdecode(os.fspath(f))
        if os.path.isdir(path):
            raise IsADirectoryError(
                errno.EISDIR,
                "a directory, not a checkpoint file (ptload.torch.load_file and "
                "ptload.safe_open read a directory of shards)",
                path,
            )
        require_file(path)
        empty = os.path.getsize(path) == 0
        source = path
        opts["in_memory"] = in_memory
    elif isinstance(f, (bytes, bytearray, memoryview)):
        source = f if isinstance(f, (bytes, bytearray)) else bytes(f)
        empty = len(source) == 0
    elif hasattr(f, "read"):
        source, start = read_stream(f)
        empty = len(source) == 0
        if empty and start > 0:
            raise stream_ended(start)
    else:
        raise TypeError(f"expected a path, bytes or a binary file object, got {type(f).__name__}")
    if empty:
        # torch's unpickler on nothing: EOFError.
        e = EmptyFileError("Ran out of input: the checkpoint is empty (0 bytes)")
        e.kind = "NotACheckpoint"
        raise e
    try:
        return _ptload.open(source, **opts)
    except DecodeError as e:
        e.encoding = encoding or "utf-8"
        raise
