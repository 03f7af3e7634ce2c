"""Progress bars (tqdm, when installed) for loads and reads."""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterable, List, Union

__all__: List[str] = []


# A bar is a tqdm object (Any: tqdm ships no type information), or None.
def _tqdm(wanted: bool, stacklevel: int, **kwargs: Any) -> Any:
    """A tqdm bar made with ``kwargs`` when asked for and tqdm is
    installed; None otherwise (with a warning when tqdm is missing)."""
    if not wanted:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        warnings.warn(
            "progress=True needs tqdm: pip install tqdm", UserWarning, stacklevel=stacklevel + 1
        )
        return None
    return tqdm(**kwargs)


def _progress(names: Iterable[str], wanted: bool, path: Union[str, os.PathLike[str]]) -> Iterable[str]:
    """``names``, through a tqdm bar when asked for and tqdm is installed."""
    bar = _tqdm(
        wanted, 3, iterable=names, desc=os.path.basename(os.fspath(path)), unit="tensor"
    )
    return names if bar is None else bar


def _byte_bar(wanted: bool, total: int, name: str) -> Any:
    """A tqdm bar over ``total`` bytes when asked for and tqdm is
    installed, else None."""
    return _tqdm(wanted, 4, total=total, desc=name, unit="B", unit_scale=True)
