"""Progress bars (tqdm, when installed) for loads and reads."""

import os
import warnings

__all__ = []


def _tqdm(wanted, stacklevel, **kwargs):
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


def _progress(names, wanted, path):
    """``names``, through a tqdm bar when asked for and tqdm is installed."""
    bar = _tqdm(
        wanted, 3, iterable=names, desc=os.path.basename(os.fspath(path)), unit="tensor"
    )
    return names if bar is None else bar


def _byte_bar(wanted, total, name):
    """A tqdm bar over ``total`` bytes when asked for and tqdm is
    installed, else None."""
    return _tqdm(wanted, 4, total=total, desc=name, unit="B", unit_scale=True)
