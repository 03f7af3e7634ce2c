"""Opening what the package is given (a path, a URL, bytes, a binary file
object) with the reader, and the file helpers the loaders share; the
errors they raise are ``_errors``' classes."""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import IO, TYPE_CHECKING, Any, Dict, Optional, Tuple, Union

from ._errors import ContainerError, DecodeError, EmptyFileError

if TYPE_CHECKING:
    from types import FrameType

    from typing_extensions import TypeGuard

    from ._ptload import Checkpoint

    # What the loaders open: a path, a URL (a str), bytes, or a binary file
    # object.
    _Source = Union[str, os.PathLike[str], bytes, bytearray, memoryview, IO[bytes]]

__all__ = [
    "is_url",
    "open_checkpoint",
    "read_at",
    "read_stream",
    "require_file",
    "stream_ended",
    "url_name",
    "user_stacklevel",
]


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the first frame
    outside this package (for the function that calls ``warnings.warn``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    level = 1
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame = frame.f_back
        level += 1
    return level


def require_file(path: str) -> None:
    """A missing path is the FileNotFoundError torch and safetensors
    raise, so code catching OSError works."""
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


_NOT_SEEKABLE = (
    ". You can only torch.load from a file that is seekable. Please pre-load the data "
    "into a buffer like io.BytesIO and try to load from it instead."
)


def read_stream(f: IO[bytes]) -> Tuple[Union[bytes, bytearray], int]:
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
        data: Union[bytes, bytearray] = f.read()
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


def read_at(fh: io.BufferedIOBase, offset: int, view: memoryview, path: str) -> None:
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


def stream_ended(start: int) -> EmptyFileError:
    """The error for a stream read to its end at ``start`` (several objects
    saved one after another, all read): torch's ``EOFError``, saying where,
    not that the checkpoint is empty."""
    e = EmptyFileError(
        f"Ran out of input: nothing follows byte {start} of the stream "
        "(every object saved on it was read)"
    )
    e.kind = "NotACheckpoint"
    return e


def is_url(f: object) -> TypeGuard[str]:
    """Whether ``f`` is a URL the reader fetches by ranged requests
    (``http://``, ``https://``, ``s3://``, ``gs://``, ``az://``) rather
    than a path: a ``str`` only, as ``pathlib`` folds ``//``. The reader
    holds the one list of schemes."""
    from . import _ptload

    return isinstance(f, str) and _ptload.is_url(f)


def url_name(url: str) -> str:
    """The last segment of ``url``'s path, for messages and progress bars."""
    return url.split("?", 1)[0].split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def open_checkpoint(
    f: _Source,
    *,
    objects: bool = True,
    in_memory: bool = False,
    encoding: Optional[str] = None,
    byte_order: Optional[str] = None,
    refuse_at: Optional[str] = None,
) -> Checkpoint:
    """Open ``f`` (a path, a URL, bytes, or a binary file object) with the
    reader. A URL is read by ranged requests: what opening parses now, each
    storage's bytes when first asked for (``in_memory`` does not apply).
    ``refuse_at``: the scanner's level at which the file is refused."""
    from . import _ptload

    opts: Dict[str, Any] = {"objects": objects, "encoding": encoding, "byte_order": byte_order, "refuse_at": refuse_at}
    source: Union[str, bytes, bytearray]
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
