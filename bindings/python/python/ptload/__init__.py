"""ptload: load PyTorch checkpoints without running their pickle.

- ``ptload.torch.load(f, map_location=None, ...)``: what
  ``torch.load(f, weights_only=True)`` returns, object for object, built
  by a reader that never imports or calls what the file names.
- ``ptload.safe_open(path, framework="pt" | "numpy")``,
  ``ptload.torch.load_file`` and ``ptload.numpy.load_file``: safetensors'
  interface on ``.pt`` / ``.pth`` / ``.bin`` / ``.ckpt`` files.
- ``ptload.numpy``: numpy arrays without torch installed.
- ``ptload.patch()``: ``torch.load`` in the process goes through
  ``ptload.torch.load`` (transformers, Lightning and old code unchanged);
  ``ptload.unpatch()`` puts torch's back; ``ptload.patched()`` says
  whether it is in force.

Every error is a ``ptload.Error``, of a class per kind that is also the
exception torch raises in the same case (``ptload.ContainerError`` is a
``RuntimeError``, ``ptload.UnsafeGlobalError`` a
``pickle.UnpicklingError``...).

Importing ``ptload`` or ``ptload.numpy`` never imports torch.
"""

import atexit

from ._errors import (
    ContainerError,
    CorruptRecordError,
    DecodeError,
    DeviceError,
    EmptyFileError,
    Error,
    InvalidObjectError,
    IoError,
    LimitError,
    NotACheckpointError,
    PickleError,
    TensorError,
    UnsafeGlobalError,
    UnsupportedError,
)
from ._graph import Global, Inert
from ._safe import safe_open
from ._patch import patch, patched, unpatch  # noqa: F401 - torch.load made ptload's, process-wide
from ._ptload import release_staging as _release_staging


def release_staging() -> int:
    """Unpin the page-locked host memory that loads onto GPUs keep.

    The first load onto a GPU pins its staging buffers (128 MiB per
    device by default) and keeps them for the next load of the process, so
    later loads pin nothing. This frees them now and returns the bytes
    freed; it also runs when the interpreter exits. A later load pins
    again.
    """
    return _release_staging()


atexit.register(release_staging)

__version__ = "0.1.0"

__all__ = [
    "Error",
    "ContainerError",
    "CorruptRecordError",
    "DecodeError",
    "DeviceError",
    "EmptyFileError",
    "InvalidObjectError",
    "IoError",
    "LimitError",
    "NotACheckpointError",
    "PickleError",
    "TensorError",
    "UnsafeGlobalError",
    "UnsupportedError",
    "Global",
    "Inert",
    "safe_open",
    "patch",
    "patched",
    "release_staging",
    "unpatch",
    "__version__",
]
