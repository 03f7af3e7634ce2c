"""ptload's exceptions: one base, ``ptload.Error``, and a class per kind of
failure, each also the exception ``torch.load`` raises in the same case
(``RuntimeError`` for a corrupt container, ``pickle.UnpicklingError`` for a
pickle it refuses, ``UnicodeDecodeError`` for a Python 2 string that does not
decode...), so code written for torch catches them unchanged. Each carries
``kind`` (the reader's error kind), ``offset``, ``record``, ``tensor``,
``file`` (the file of a set it concerns) and ``hint`` (what to do).
"""

from __future__ import annotations

import pickle
import struct
from typing import Any, Callable, ClassVar, Dict, Iterable, Optional, Tuple, Type, Union, cast

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


def _rebuild(cls: Type[Error], message: str, fields: Dict[str, Any]) -> Error:
    e = cls(message)
    e.__dict__.update(fields)
    return e


def _reduce(self: Error) -> Tuple[Callable[..., Error], Tuple[Any, ...]]:
    # The class itself, or for a per-type InvalidObjectError the pair its
    # class is made from again.
    cls: Union[Type[Error], Tuple[Type[InvalidObjectError], Type[BaseException]]] = type(self)
    exc_type = getattr(cls, "_exc_type", None)
    if exc_type is not None:
        cls = (InvalidObjectError, exc_type)
    return (_rebuild_from, (cls, self.message, dict(self.__dict__)))


def _rebuild_from(
    cls: Union[Type[Error], Tuple[Type[InvalidObjectError], Type[BaseException]]],
    message: str,
    fields: Dict[str, Any],
) -> Error:
    if isinstance(cls, tuple):
        cls = cls[0].of(cls[1])
    return _rebuild(cls, message, fields)


# The extension's class gets these two from Python; mypy sees the stub's
# property and object's method, which cannot be assigned to.
Error.message = property(lambda self: str(self.args[0]) if self.args else "")  # type: ignore[method-assign, assignment]
Error.__reduce__ = _reduce  # type: ignore[method-assign, assignment]


class ContainerError(Error, RuntimeError):
    """A zip or legacy container that is malformed, or a layout ptload does
    not read: torch raises ``RuntimeError`` (``PytorchStreamReader failed
    ...``, ``Invalid magic number; corrupt file?``)."""


# What torch's unpickler lets through on corrupt bytes, as the broken byte
# leads it: its own refusal, a string that does not decode, a memo key or
# stack slot that is not there, data that ends early, a struct too short.
_CORRUPT_PICKLE = (pickle.UnpicklingError, UnicodeDecodeError, KeyError, IndexError, EOFError, struct.error)


# mypy cannot read bases unpacked from a tuple (it sees only Error).
class PickleError(Error, *_CORRUPT_PICKLE):  # type: ignore[misc]
    """The pickle program is malformed. On such bytes torch's unpickler
    raises whatever the broken byte leads it to (``UnpicklingError``,
    ``UnicodeDecodeError``, ``KeyError``, ``IndexError``, ``EOFError``,
    ``struct.error``); this error is each of them, so torch's ``except``
    clauses catch it whichever byte broke."""

    __str__ = Exception.__str__

    def __init__(self, message: str, encoding: str = "utf-8") -> None:
        UnicodeDecodeError.__init__(self, encoding, b"", 0, 0, message)
        self.args = (message,)


# mypy cannot read bases unpacked from a tuple (it sees Error and RuntimeError).
class NotACheckpointError(Error, RuntimeError, *_CORRUPT_PICKLE):  # type: ignore[misc]
    """The bytes are not a torch checkpoint. torch hands bytes that are no
    zip to its unpickler, which fails as the first bytes lead it: a
    magic-number check (``RuntimeError``), ``UnpicklingError``, or a
    ``KeyError`` / ``IndexError`` / ``EOFError`` from the opcode a text
    byte happens to be (``h`` reads the memo, ``s`` pops an empty stack);
    this error is each of them, so torch's ``except`` clauses catch it."""

    __str__ = Exception.__str__

    def __init__(self, message: str, encoding: str = "utf-8") -> None:
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

    def __init__(self, message: str, encoding: str = "utf-8") -> None:
        UnicodeDecodeError.__init__(self, encoding, b"", 0, 0, message)
        self.args = (message,)

    def __str__(self) -> str:
        return cast(str, self.message)


class UnsafeGlobalError(Error, pickle.UnpicklingError):
    """The file names globals outside torch's ``weights_only`` allowlist.

    A subclass of ``pickle.UnpicklingError``, as torch's own refusal is, so
    code that catches torch's error keeps working. ``globals`` lists every
    forbidden ``module.name``.
    """

    def __init__(self, message: str, globals_: Iterable[str] = ()) -> None:
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

    _by_type: ClassVar[Dict[Type[BaseException], Type[InvalidObjectError]]] = {}

    @classmethod
    def of(cls, exc_type: Type[BaseException]) -> Type[InvalidObjectError]:
        """The subclass that is also ``exc_type`` (a ``RuntimeError``,
        ``ValueError``, ``TypeError``...)."""
        made = cls._by_type.get(exc_type)
        if made is None:
            bases = (cls,) if issubclass(cls, exc_type) else (cls, exc_type)
            made = cast(
                "Type[InvalidObjectError]",
                type(
                    cls.__name__,
                    bases,
                    {"__module__": "ptload", "__doc__": cls.__doc__, "_exc_type": exc_type},
                ),
            )
            cls._by_type[exc_type] = made
        return made


# The reader's error kinds; one table, read by the extension (to_py).
_BY_KIND: Dict[str, Optional[Type[Error]]] = {
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
    # Kinds of the reader's other callers (specs, outputs, typed reads,
    # cancellation): where they reach Python, the package's base error.
    "InvalidSpec": Error,
    "OutputExists": Error,
    "OutputRefused": Error,
    "Cancelled": Error,
    "DTypeMismatch": Error,
    "NotBorrowable": Error,
}


class IoError(Error, OSError):
    """Reading the file failed."""

    def __init__(self, message: str) -> None:
        OSError.__init__(self, message)


_BY_KIND["Io"] = IoError

# The records of torch's zip layout that torch parses itself (the pickle
# and the small text records); storages it only copies.
_PARSED_RECORDS = ("byteorder", "version", ".format_version", ".storage_alignment", "serialization_id")


def _parsed_by_torch(record: str) -> bool:
    name = record.rsplit("/", 1)[-1]
    return name.endswith(".pkl") or name in _PARSED_RECORDS


for _cls in [c for c in _BY_KIND.values() if c is not Error] + [EmptyFileError, DeviceError, InvalidObjectError, CorruptRecordError]:
    _cls.__module__ = "ptload"


def from_reader(
    kind: str,
    message: str,
    offset: Optional[int] = None,
    record: Optional[str] = None,
    tensor: Optional[str] = None,
    encoding: Optional[str] = None,
    file: Optional[str] = None,
    hint: Optional[str] = None,
) -> Error:
    """The exception for a reader error of ``kind``: ``file`` is the file
    of a set it concerns, ``hint`` what the caller could do (both also in
    the message)."""
    # Every kind's entry is a class by now ("Io" is filled in above).
    cls = cast("Type[Error]", _BY_KIND.get(kind, Error))
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
