"""``torch.load`` that never runs the file, and safetensors' ``load_file``.

``load(f)`` returns what ``torch.load(f, weights_only=True)`` returns,
object for object: containers with their types, tensors with torch's
dtype, shape, strides, storage offset and ``requires_grad``, parameters,
tied tensors sharing one storage, quantized and sparse tensors, conj/neg
bits. Tensors view the file through a private (copy-on-write) map unless
``mmap=False``: writing to them never changes the file.
"""

import gc
import os
import sys
import warnings
from typing import (
    IO,
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
)

import torch

from . import _graph, _ptload
from ._patch import in_patch
from ._storages import (
    _DTYPES,
    _LAYOUTS,
    _QDTYPES,
    StorageStandIn,
    _advance,
    _cuda_count,
    _from_dlpack,
    _lenient,
    _shared_mmap,
    _Storages,
    _swap_unit,
    _torch_dtype,
)
from ._errors import Error, UnsafeGlobalError, UnsupportedError
from ._io import (
    is_url,
    open_checkpoint,
    read_stream,
    stream_ended,
    url_name,
    user_stacklevel,
)

__all__ = ["load", "load_file", "StorageStandIn"]

PathLike = Union[str, "os.PathLike[str]"]
FileLike = Union[PathLike, bytes, bytearray, memoryview, IO[bytes]]
DeviceLike = Union[str, int, "torch.device"]
MapLocation = Union[
    None, str, "torch.device", Mapping[str, str], Callable[[StorageStandIn, str], Any]
]

if TYPE_CHECKING:
    from ._ptload import Checkpoint, QuantRecord, TensorRecord
    from ._storages import _Placement

    # load's place: rules as a string, a dict or pairs.
    _Place = Union[str, Mapping[str, DeviceLike], Iterable[Union[str, Tuple[str, DeviceLike]]], None]

def _tensor(
    storages: _Storages, info: "TensorRecord", objs: List[Any], qparams: Optional[Tuple[int, int]]
) -> torch.Tensor:
    dtype = _DTYPES.get(info.dtype)
    if dtype is None:
        raise Error(f"dtype {info.dtype} is not known to this torch")
    if info.storage is None:
        t = torch.empty_strided(info.shape, info.stride, dtype=dtype, device="meta")
    else:
        t = storages.tensor(info.storage, dtype, info.shape, info.stride, info.offset)
    if info.quantization is not None:
        t = _quantize(t, info.quantization, objs, qparams)
    if info.conj:
        t = t.conj()
    if info.neg:
        t = t._neg_view()
    if info.requires_grad:
        t.requires_grad_(True)
    return t


def _quantize(
    t: torch.Tensor, quant: "QuantRecord", objs: List[Any], qparams: Optional[Tuple[int, int]]
) -> torch.Tensor:
    kind = quant.kind
    qdtype = _QDTYPES.get(kind)
    if qdtype is None:
        raise Error(f"quantized dtype {kind} is not known to this torch")
    values_shape = quant.values_shape
    stride: Union[Tuple[int, ...], List[int]]
    shape, stride = t.shape, t.stride()
    if values_shape is not None:
        # Packed kinds: the reader gives the packed bytes; torch's tensor
        # has the values' shape, row-major.
        shape = torch.Size(values_shape)
        stride, step = [], 1
        for d in reversed(values_shape):
            stride.append(step)
            step *= d
        stride = tuple(reversed(stride))
    # Made empty (one element per channel along the axis), then set over
    # the file's storage: an overlapping view allocates nothing.
    if quant.per == "tensor":
        # The reader gives a per-tensor record its scale and zero point.
        scale, zero_point = cast(float, quant.scale), cast(int, quant.zero_point)
        q = torch._empty_affine_quantized(
            (0,), scale=scale, zero_point=zero_point, dtype=qdtype, device=t.device
        )
    else:
        # A per-channel record has its axis, and qparams: the nodes of its
        # scales and zero points.
        axis = cast(int, quant.axis)
        scales, zero_points = objs[qparams[0]], objs[qparams[1]]  # type: ignore[index]
        small = [1] * len(shape)
        if 0 <= axis < len(shape):
            small[axis] = shape[axis]
        q = torch._empty_per_channel_affine_quantized(
            small, scales=scales, zero_points=zero_points, axis=axis, dtype=qdtype, device=t.device
        )
    q.set_(t.untyped_storage(), t.storage_offset(), shape, stride)
    return q


def _bounded(t: object, what: str) -> None:
    """An overlapping view (stride 0) made without reading may describe
    far more elements than its storage holds; where torch then works
    element by element (a sparse tensor's invariants), it is bounded as
    the reader bounds copying one out."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return
    nbytes = t.numel() * t.element_size()
    limit = _ptload.MAX_EXPANDED_VIEW_BYTES
    if nbytes > limit and nbytes > t.untyped_storage().nbytes():
        raise Error(
            f"{what}: limit: max_expanded_view_bytes ({limit}) exceeded: an "
            f"overlapping view of {nbytes} bytes over a {t.untyped_storage().nbytes()}-byte storage"
        )


def _sparse(layout: str, data: Sequence[Any]) -> torch.Tensor:
    layout = _LAYOUTS[layout]
    for part in data:
        _bounded(part, "sparse tensor component")
    if layout == torch.sparse_coo:
        if len(data) == 2:
            indices, values, size = data[0], data[1], data[2]
            return torch.sparse_coo_tensor(indices, values, size)
        indices, values, size = data[0], data[1], data[2]
        coalesced = data[3] if len(data) > 3 else None
        return torch.sparse_coo_tensor(indices, values, size, is_coalesced=coalesced, check_invariants=True)
    compressed, plain, values, size = data[0], data[1], data[2], data[3]
    return torch.sparse_compressed_tensor(compressed, plain, values, size, layout=layout, check_invariants=True)


def _forbidden(ckpt: "Checkpoint", allowed: Iterable[str]) -> List[str]:
    """The globals the file names that neither torch's allowlist nor the
    caller's names and globs admit: the reader's list."""
    return ckpt.refused_globals(list(allowed))


def _allowed_names(allow_globals: Union[str, Iterable[Any]]) -> Dict[str, Any]:
    """``{"module.name": object or None}``: what ``allow_globals`` names,
    and what torch's own registry holds (``add_safe_globals``, the
    ``safe_globals`` context), as ``torch.load`` reads both. A name given
    as a string is imported when met; an object (or an ``(object, name)``
    pair, torch's alias form) is used as given."""
    names: Dict[str, Any] = {}
    registry: List[Any] = getattr(torch.serialization, "get_safe_globals", lambda: [])()
    if isinstance(allow_globals, str):
        allow_globals = [allow_globals]  # one name, as include= takes one pattern
    for g in list(registry) + list(allow_globals):
        if isinstance(g, str):
            names.setdefault(g, None)
        elif isinstance(g, (tuple, list)) and len(g) == 2:
            obj, name = g
            name = name if isinstance(name, str) else f"{obj.__module__}.{obj.__qualname__}"
            names[name] = obj
        elif hasattr(g, "__module__") and hasattr(g, "__qualname__"):
            names[f"{g.__module__}.{g.__qualname__}"] = g
        else:
            raise TypeError(
                f"allow_globals takes 'module.name' strings, classes or functions, "
                f"or (object, 'module.name') pairs; got {g!r}"
            )
    return names


def load(
    f: FileLike,
    map_location: MapLocation = None,
    pickle_module: Any = None,
    *,
    weights_only: Optional[bool] = None,
    mmap: Optional[bool] = None,
    encoding: Optional[str] = None,
    unknown: str = "error",
    allow_globals: Union[str, Iterable[Any]] = (),
    strict: bool = False,
    progress: bool = False,
    place: Union[str, Mapping[str, DeviceLike], Iterable[Union[str, Tuple[str, DeviceLike]]], None] = None,
    budget: Union[float, int, str, None] = None,
    balance: Optional[int] = None,
    refuse_at: Optional[str] = None,
) -> Any:
    """Load a checkpoint as ``torch.load(f, map_location, weights_only=True)``
    would, without running anything the file names.

    ``f``: a path, an ``http://``, ``https://``, ``s3://``, ``gs://`` or
    ``az://`` URL (a ``str``; read by ranged requests, see below), bytes,
    or a binary file object.
    ``map_location``: None,
    a str, a ``torch.device``, a dict of locations, or a callable
    ``(storage, location)``, which gets a :class:`StorageStandIn` and
    returns it (moved or not), a device, or None. A target device that is
    missing or full keeps the storage on the host with a warning saying
    why; ``strict=True`` raises instead, as torch does. Storages bound for
    GPUs are uploaded together by ptload-device and handed to torch as
    DLPack views of device memory (no copy; ready on any stream when this
    returns; one allocation per device, freed with its last tensor).

    ``unknown``: what to do with globals outside torch's ``weights_only``
    allowlist. ``"error"`` (default) raises :class:`ptload.UnsafeGlobalError`
    (a ``pickle.UnpicklingError``) naming every one; ``"inert"`` returns
    each such object as a :class:`ptload.Inert` record, never called, and
    builds plain types (``argparse.Namespace``, ``collections`` containers,
    numpy scalars, dtypes and arrays, paths, datetimes) as the real objects
    from their data. ``allow_globals``: names (``"module.name"``), globs
    over them (``"mymodels.*"``, as the CLI's ``--allow-global``) or
    objects trusted as ``torch.serialization.add_safe_globals`` trusts them:
    imported and called as pickle would.

    ``mmap``: None or True map the file privately (copy-on-write; tensors
    are views of the map), or shared when torch's default mmap option is
    ``MAP_SHARED``; False reads every storage into memory. A URL is never
    mapped: opening fetches what it parses (a zip's directory and pickle, a
    legacy file's pickle stream), and each storage's bytes are fetched into
    memory of their own when its first tensor is made; ``mmap=True`` with
    a URL is a ValueError. A failed request raises :class:`ptload.IoError`
    (an ``OSError``) naming the URL and the status.
    ``weights_only=False`` (torch's full unpickler) still runs nothing: it
    is ``unknown="inert"`` with one warning naming the globals torch would
    have imported. A ``pickle_module`` is refused, as torch refuses one
    with ``weights_only``. ``encoding``: how Python 2 strings are decoded,
    as torch takes it: ``"utf-8"`` (torch's default), ``"latin1"``,
    ``"ascii"`` or ``"bytes"``; a string that does not decode raises
    ``UnicodeDecodeError``.

    ``f`` as a file object is read from its position, and left just past
    the checkpoint, as torch leaves it (several objects saved one after
    another load in turn).

    Every error is a :class:`ptload.Error` and also what torch raises in
    the same case (``RuntimeError``, ``pickle.UnpicklingError``,
    ``EOFError``, ``UnicodeDecodeError``...).

    ``place``, ``budget``, ``balance``: placements torch's callable cannot
    express, parsed by the same code as the CLI's ``--place``, ``--budget``
    and ``--balance``: rules by tensor name (``"encoder.*=cuda:0,*embed*=cpu"``,
    or ``{"encoder.*": "cuda:0", "*embed*": "cpu"}``, or pairs), each GPU
    filled to a share of its memory (``0.9``, ``"90%"``) or a number of
    bytes (``20 << 30``, ``"20GiB"``; a bare ``2`` is refused as a likely
    mistake), then the host, or storages split by bytes over N GPUs. A
    ``map_location`` callable's storage has ``.tensors``, the names of the
    tensors on it, so it can place by name too.

    ``refuse_at``: refuse a file that ``ptload scan`` puts at this level
    or above (``"dangerous"``, ``"ambiguous"``, ``"unknown-call"``,
    ``"needs-code"``), raising :class:`ptload.UnsafeGlobalError` that names
    what it found, whatever ``unknown`` and ``weights_only`` say: with
    ``weights_only=False``, ``refuse_at="dangerous"`` reads training files
    that pickle their own classes and refuses payloads. None (default):
    no such gate.

    ``progress=True`` shows a tqdm bar over the file's bytes as they are
    read (``mmap=False``) or uploaded to GPUs. Ctrl-C interrupts a load
    at any point, the reading of the file included.
    """
    # Collection passes over the many objects a load makes are most of its
    # cost on files of many small tensors; nothing here makes cycles the
    # collector must break, so it waits until the load is done.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if pickle_module is not None:
            raise UnsupportedError(
                "Can not safely load weights when explicit pickle_module is specified: "
                "ptload never runs a pickle module"
            )
        placement = _placement(map_location, place, budget, balance)
        return _load(
            f, map_location, weights_only, mmap, unknown, allow_globals, strict, progress, encoding,
            placement, refuse_at,
        )
    finally:
        if collecting:
            gc.enable()


def _placement(
    map_location: MapLocation,
    place: "_Place",
    budget: Union[float, int, str, None],
    balance: Optional[int],
) -> Optional["_Placement"]:
    """``place``/``budget``/``balance`` as the extension's placement
    arguments (None when none is given), with the CLI's meanings:
    ``place`` rules (``{"encoder.*": "cuda:0"}``, tensor-name globs, first
    match wins) decide first; ``budget`` fills each visible GPU to a share
    of its memory (a float in (0, 1]) or to a number of bytes (an int),
    then the host; ``balance=N`` splits the storages by bytes over
    ``cuda:0`` .. ``cuda:N-1``. ``map_location`` places what no rule
    matched; it cannot be given with ``budget`` or ``balance``, which decide
    every storage."""
    if place is None and budget is None and balance is None:
        return None
    if budget is not None and balance is not None:
        raise ValueError("budget and balance each place every storage: give one")
    if map_location is not None and (budget is not None or balance is not None):
        raise ValueError(
            "budget and balance place every storage, so map_location would never apply; "
            "give place rules with map_location instead"
        )
    out: _Placement = {"place": _place_rules(place)}
    if budget is not None:
        count = _cuda_count()
        kind, share_of, nbytes = _budget_spec(budget)
        share: Callable[[int], int]
        if kind == "share":
            share = lambda total: int(total * share_of)  # noqa: E731
        else:
            share = lambda total: nbytes  # noqa: E731
        if count == 0:
            warnings.warn(
                "budget: no CUDA device is visible, so every storage the budget places "
                "stays on the host",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )
        out["budget"] = [
            (i, share(torch.cuda.get_device_properties(i).total_memory)) for i in range(count)
        ]
    if balance is not None:
        if isinstance(balance, bool) or not isinstance(balance, int) or balance < 1:
            raise ValueError(f"balance {balance!r}: a number of GPUs, at least 1")
        out["balance"] = balance
    return out


def _device_text(device: DeviceLike) -> str:
    """A device as the reader parses it: ``torch.device`` and ``int``
    (a CUDA ordinal, as torch takes it) as their text."""
    if isinstance(device, bool):
        raise TypeError(f"a device is a str, torch.device or CUDA ordinal, not {device!r}")
    if isinstance(device, int):
        return f"cuda:{device}"
    return str(device)


def _place_rules(place: "_Place") -> List[Tuple[str, str]]:
    """``place`` as ``(pattern, device)`` pairs, parsed by the reader as the
    CLI's ``--place`` is: a string of ``PATTERN=DEVICE`` rules (comma
    separated), a dict ``{pattern: device}``, or an iterable of pairs or
    rule strings. Errors name the keyword and the rule."""
    if place is None:
        return []
    if isinstance(place, str):
        try:
            return _ptload.parse_place([place])
        except ValueError as e:
            raise ValueError(f"place={place!r}: {e}") from None
    items = place.items() if isinstance(place, Mapping) else place
    try:
        items = list(items)
    except TypeError:
        raise TypeError(
            "place takes 'PATTERN=DEVICE' rules (a string, comma separated), a dict "
            f"{{pattern: device}} or (pattern, device) pairs, not {type(place).__name__}"
        ) from None
    rules: List[Tuple[str, str]] = []
    for item in items:
        if isinstance(item, str):
            try:
                rules.extend(_ptload.parse_place([item]))
            except ValueError as e:
                raise ValueError(f"place rule {item!r}: {e}") from None
            continue
        try:
            pattern, device = item
        except (TypeError, ValueError):
            raise TypeError(
                f"place rule {item!r}: expected a (pattern, device) pair or a 'PATTERN=DEVICE' string"
            ) from None
        try:
            rules.append((str(pattern), _ptload.parse_device(_device_text(device))))
        except ValueError as e:
            raise ValueError(f"place rule {pattern!r}: {device!r}: {e}") from None
    return rules


def _budget_spec(budget: Union[float, int, str]) -> Tuple[str, float, int]:
    """``budget`` as the reader parses the CLI's ``--budget``:
    ``(kind, share, bytes)``. Numbers are read as their text (``0.9`` a
    share, ``20 << 30`` bytes, ``2`` refused as a likely mistake for GiB),
    strings as written (``"20GiB"``, ``"90%"``)."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float, str)):
        raise TypeError(
            f"budget is a share of each GPU (0.9, '90%') or bytes (20 << 30, '20GiB'), not {budget!r}"
        )
    try:
        return _ptload.parse_budget(str(budget) if not isinstance(budget, str) else budget)
    except ValueError as e:
        raise ValueError(f"budget={budget!r}: {e}") from None


def _load(
    f: FileLike,
    map_location: MapLocation,
    weights_only: Optional[bool],
    mmap: Optional[bool],
    unknown: str,
    allow_globals: Union[str, Iterable[Any]],
    strict: bool,
    progress: bool,
    encoding: Optional[str] = None,
    placement: Optional["_Placement"] = None,
    refuse_at: Optional[str] = None,
) -> Any:
    # False is torch's full unpickler; ptload still runs nothing: what torch
    # would have imported and called comes back as ptload.Inert records.
    full = not _weights_only(weights_only)
    if unknown not in ("error", "inert"):
        raise ValueError("unknown must be 'error' or 'inert'")
    if full:
        unknown = "inert"
    allowed = _allowed_names(allow_globals)
    stream = None
    remote = is_url(f)
    path: Optional[str]
    source: Union[str, bytes, bytearray]
    if remote:
        # Read by ranged requests: no file to map or read whole here. (A
        # URL is a str.)
        path, source = None, cast(str, f)
    elif isinstance(f, (str, os.PathLike)):
        path = source = os.fspath(f)
    elif isinstance(f, (bytes, bytearray, memoryview)):
        path, source = None, bytes(f)
    elif hasattr(f, "read"):
        path = None
        source, start = read_stream(f)
        stream = (f, start)
        if not source and start > 0:
            raise stream_ended(start)
    else:
        raise TypeError(f"expected a path, bytes or a binary file object, got {type(f).__name__}")
    if mmap and remote:
        raise ValueError(
            "mmap=True maps a local file: a checkpoint at a URL is read by ranged requests "
            "into memory of its own (leave mmap unset, or download the file to map it)"
        )
    if mmap and path is None:
        # torch's words: there is no file to map.
        raise ValueError("f must be a file path in order to use the mmap argument")
    ckpt = open_checkpoint(
        source, objects=True, encoding=encoding, byte_order=_assumed_byte_order(), refuse_at=refuse_at
    )
    if stream is not None:
        # Where torch leaves the stream: just past the checkpoint, so the
        # next object saved after it can be read.
        stream[0].seek(stream[1] + ckpt.end_offset())
    if mmap and ckpt.format() == "legacy":
        # torch maps only the zip layout, and says so.
        raise UnsupportedError(
            "mmap can only be used with files saved with `torch.save(_use_new_zipfile_serialization=True)`: "
            f"{path} is in the legacy layout (torch < 1.6, or _use_new_zipfile_serialization=False); "
            "load it with mmap=None or mmap=False"
        )
    if ckpt.format() == "torchscript":
        raise UnsupportedError(
            "this is a TorchScript archive (torch.jit.save); torch.load hands it to "
            "torch.jit.load. ptload reads its tensors with ptload.safe_open"
        )
    refused = _forbidden(ckpt, allowed)
    if refused and unknown == "error":
        raise UnsafeGlobalError(
            "Weights only load failed: the file names "
            f"{len(refused)} global(s) outside torch's weights_only allowlist: "
            + ", ".join(refused)
            + ". Nothing was run. "
            + (
                # Through from_pretrained or load_from_checkpoint no ptload
                # keyword reaches this call: name what the caller can set.
                "Call ptload.patch(allow_globals=[...]) for the ones you trust, or "
                "ptload.patch(unknown='inert') to get them as inert ptload.Inert records; "
                "weights_only=False is safe too under ptload, which runs nothing from the file."
                if in_patch()
                else "Pass unknown='inert' to get them as inert ptload.Inert records, or "
                "allow_globals=[...] for the ones you trust."
            )
            + "".join(
                f" {p} is allowed, but its module is blocked whatever is allowed, as in torch."
                for p in refused
                if p in allowed
            ),
            refused,
        )
    numpy_built = [p for p in refused if p in _graph.NUMPY_BUILT_NAMES]
    inert = [p for p in refused if p not in _graph.PLAIN_TYPE_NAMES and p not in numpy_built]
    if full and (inert or numpy_built):
        built = "numpy scalars, dtypes and arrays are built from their data as numpy objects"
        if inert:
            said = (
                f"{len(inert)} global(s) torch would have imported come back as ptload.Inert "
                f"records: {', '.join(inert)}" + (f" ({built})" if numpy_built else "")
            )
        else:
            said = f"what torch would have imported from numpy is not imported: {built}"
        warnings.warn(
            f"weights_only=False: ptload ran nothing from this file; {said}",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    bar = None
    if progress:
        from ._progress import _byte_bar

        if remote:
            total, name = ckpt.end_offset(), url_name(cast(str, f))
        else:
            total = os.path.getsize(path) if path is not None else len(source)
            name = os.path.basename(path) if path else "checkpoint"
        bar = _byte_bar(progress, total, name)
    try:
        return _build(
            ckpt, path, source, mmap, map_location, strict, bar, allowed, unknown, placement,
            remote=remote,
        )
    finally:
        if bar is not None:
            bar.close()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "y", "yes", "true")


def _weights_only(asked: Optional[bool]) -> bool:
    """torch.load's reading of ``weights_only``: None is True unless
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set; TORCH_FORCE_WEIGHTS_ONLY_LOAD
    makes it True whatever was asked."""
    if _env_flag("TORCH_FORCE_WEIGHTS_ONLY_LOAD"):
        return True
    if asked is None:
        return not _env_flag("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    return bool(asked)


def _assumed_byte_order() -> str:
    """How torch reads a zip file without a byteorder record:
    ``torch.serialization.set_default_load_endianness`` (little when unset,
    the host's for NATIVE)."""
    get = getattr(torch.serialization, "get_default_load_endianness", None)
    setting = get() if get is not None else None
    if setting is None:
        return "little"
    name = getattr(setting, "name", str(setting)).lower()
    if name == "native":
        return sys.byteorder
    return "big" if name == "big" else "little"


def _build(
    ckpt: "Checkpoint",
    path: Optional[str],
    source: Union[str, bytes, bytearray],
    mmap: Optional[bool],
    map_location: MapLocation,
    strict: bool,
    bar: Any,
    allowed: Dict[str, Any],
    unknown: str,
    placement: Optional["_Placement"] = None,
    remote: bool = False,
) -> Any:
    # Without a path or a URL, the source is the checkpoint's bytes.
    data = cast("Union[bytes, bytearray]", source) if path is None and not remote else None
    # The said set is an attribute of the function, which mypy does not model.
    _lenient.said.clear()  # type: ignore[attr-defined]
    storages = _Storages(
        ckpt, path, mmap, map_location, strict, bar, data=data, placement=placement,
        remote=remote,
    )
    try:
        return _build_with(ckpt, storages, source, mmap, bar, allowed, unknown)
    finally:
        storages.close()


def _build_with(
    ckpt: "Checkpoint",
    storages: _Storages,
    source: Union[str, bytes, bytearray],
    mmap: Optional[bool],
    bar: Any,
    allowed: Dict[str, Any],
    unknown: str,
) -> Any:
    # Most tensors are made in one call, as DLPack views of private memory.
    made = ckpt.torch_tensors(
        _from_dlpack, source, mmap is not False, storages.on_cpu, storages.uploaded,
        _advance(bar), shared=bool(mmap) and _shared_mmap(),
        host=not (storages.reads_each or storages.remote),
    )

    def make_leaf(kind: str, node: Tuple[Any, ...], objs: List[Any]) -> Any:
        if kind == "tensor":
            t = made[node[1]]
            if t is None:
                t = _tensor(storages, tensors[node[1]], objs, node[2])
            if node[3] is not None:
                _graph._set_state(t, objs[node[3]], dict_like=True)
            return t
        if kind == "parameter":
            p = torch.nn.Parameter(objs[node[1]], requires_grad=node[2])
            if node[3] is not None:
                _graph._set_state(p, objs[node[3]], dict_like=True)
            return p
        if kind == "sparse":
            return _sparse(node[1], objs[node[2]])
        if kind == "size":
            return torch.Size(objs[c] for c in node[1])
        if kind == "device":
            return torch.device(node[1])
        if kind == "dtype":
            return _torch_dtype(node[1])
        if kind == "layout":
            return _LAYOUTS[node[1]]
        if kind == "storage":
            # Typed as this reference says (torch types each on its own).
            dtype = _DTYPES.get(node[2], torch.uint8)
            untyped = storages.get(node[1], _swap_unit(dtype))
            # torch's TypedStorage.__init__ has no annotations.
            return torch.storage.TypedStorage(  # type: ignore[no-untyped-call]
                wrap_storage=untyped, dtype=dtype, _internal=True
            )
        raise Error(f"the reader gave a node of unknown kind {kind!r}")

    # Plain containers of such tensors (a state dict) are built in one
    # call too; anything else goes through the general builder.
    plain = ckpt.build_plain(made, _graph._set_state)
    if plain is not None:
        result = plain[0]
    else:
        root, nodes, tensors = ckpt.objects()
        result = _graph.build(root, nodes, make_leaf, allowed, unknown)
    if storages.fallbacks:
        _warn_fallbacks(storages.fallbacks)
    if bar is not None:
        bar.update(bar.total - bar.n)
    return result


def _warn_fallbacks(fallbacks: List[Tuple[str, str, str, str]]) -> None:
    first = fallbacks[0]
    more = f" (and {len(fallbacks) - 1} more storages)" if len(fallbacks) > 1 else ""
    warnings.warn(
        f"{first[0]} saved on {first[1]} stays on the CPU instead of {first[2]}: "
        f"{first[3]}{more}. Pass strict=True to raise instead.",
        RuntimeWarning,
        stacklevel=user_stacklevel(),
    )


def load_file(
    path: PathLike,
    device: DeviceLike = "cpu",
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
) -> Dict[str, "torch.Tensor"]:
    """safetensors' ``load_file`` on a torch checkpoint: ``{name: tensor}``,
    the state dict the CLI would take (``key``/``strip_prefix`` as in
    ``ptload convert``; what ``auto`` decided is printed as a warning when
    it changed anything). ``path`` may be a directory of shards or an index
    file; ``shard=(rank, world)`` with ``splits``/``preset`` gives that
    rank's slices, and ``rank_files`` reads a directory of FSDP rank files
    by stated rules (see :class:`ptload.safe_open`). With a CUDA ``device``,
    one file's selected storages are uploaded at once by ptload-device, as
    :func:`load` uploads them. ``progress=True``
    shows a tqdm bar over the tensors when tqdm is installed."""
    from ._progress import _progress
    from ._safe import safe_open

    with safe_open(
        path, framework="pt", device=device, key=key, strip_prefix=strip_prefix,
        include=include, exclude=exclude, shard=shard, splits=splits, preset=preset,
        backend=backend, rank_files=rank_files,
    ) as f:
        f._upload()
        made = f._made_at_once()
        # From a URL, the storages are fetched ahead of the loop.
        ahead = f._read_ahead()
        try:
            return {
                name: made[name] if name in made else f.get_tensor(name)
                for name in _progress(f.offset_keys(), progress, path)
            }
        finally:
            if ahead is not None:
                ahead.stop()
