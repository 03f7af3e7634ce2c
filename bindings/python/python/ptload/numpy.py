"""numpy arrays from torch checkpoints, without torch.

``load_file(path)`` gives ``{name: numpy.ndarray}`` for the state dict the
CLI would take. Arrays are read-only views of the file's map where the
bytes lie as numpy needs them (little-endian, aligned, no conj/neg bit),
copies otherwise; bf16 and float8 come as ``ml_dtypes`` arrays. This
module never imports torch.
"""

import os
from typing import TYPE_CHECKING, Dict, Iterable, Optional, Tuple, Union

from ._progress import _progress
from ._safe import numpy_dtype, safe_open

if TYPE_CHECKING:
    import numpy

__all__ = ["load_file", "numpy_dtype"]


def load_file(
    path: Union[str, "os.PathLike[str]"],
    *,
    key: Optional[str] = "auto",
    strip_prefix: Optional[str] = "auto",
    include: Union[str, Iterable[str]] = (),
    exclude: Union[str, Iterable[str]] = (),
    shard: Optional[Tuple[int, int]] = None,
    splits: Union[str, Iterable[str]] = (),
    preset: Optional[str] = None,
    progress: bool = False,
    backend: str = "mmap",
    rank_files: Optional[str] = None,
) -> Dict[str, "numpy.ndarray"]:
    """``{name: numpy.ndarray}``, as safetensors.numpy.load_file gives; a
    directory of shards or an index file, ``shard=(rank, world)`` with
    ``splits``/``preset``, and ``rank_files``, as :class:`ptload.safe_open`
    takes them.
    ``progress=True`` shows a tqdm bar when tqdm is installed."""
    with safe_open(
        path, framework="numpy", key=key, strip_prefix=strip_prefix,
        include=include, exclude=exclude, shard=shard, splits=splits, preset=preset,
        backend=backend, rank_files=rank_files,
    ) as f:
        # From a URL, the storages are fetched ahead of the loop.
        ahead = f._read_ahead()
        try:
            return {name: f.get_tensor(name) for name in _progress(f.offset_keys(), progress, path)}
        finally:
            if ahead is not None:
                ahead.stop()
