"""``torch.load`` that never runs the file, and safetensors' ``load_file``.

``load(f)`` returns what ``torch.load(f, weights_only=True)`` returns,
object for object: containers with their types, tensors with torch's
dtype, shape, strides, storage offset and ``requires_grad``, parameters,
tied tensors sharing one storage, quantized and sparse tensors, conj/neg
bits. Tensors view the file through a private (copy-on-write) map unless
``mmap=False``: writing to them never changes the file.
"""

import gc
import mmap as _mmap
import os
import sys
import warnings

import torch

from . import _graph, _ptload
from ._errors import (
    ContainerError,
    DeviceError,
    Error,
    InvalidObjectError,
    UnsafeGlobalError,
    UnsupportedError,
    open_checkpoint,
    read_stream,
    user_stacklevel,
)

__all__ = ["load", "load_file", "StorageStandIn"]

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "C32": torch.complex32,
    "C64": torch.complex64,
    "C128": torch.complex128,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
for _name, _attr in [
    ("U16", "uint16"),
    ("U32", "uint32"),
    ("U64", "uint64"),
    ("F8_E4M3", "float8_e4m3fn"),
    ("F8_E5M2", "float8_e5m2"),
    ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
    ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
    ("F8_E8M0", "float8_e8m0fnu"),
    ("F4_E2M1_X2", "float4_e2m1fn_x2"),
]:
    if hasattr(torch, _attr):
        _DTYPES[_name] = getattr(torch, _attr)

_QDTYPES = {
    "qint8": torch.qint8,
    "quint8": torch.quint8,
    "qint32": torch.qint32,
    "quint4x2": getattr(torch, "quint4x2", None),
    "quint2x4": getattr(torch, "quint2x4", None),
}

_LAYOUTS = {
    "strided": torch.strided,
    "sparse_coo": torch.sparse_coo,
    "sparse_csr": torch.sparse_csr,
    "sparse_csc": torch.sparse_csc,
    "sparse_bsr": torch.sparse_bsr,
    "sparse_bsc": torch.sparse_bsc,
}


_from_dlpack = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack


def _torch_dtype(name):
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise Error(f"torch.{name} is not a dtype this torch knows")
    return dtype


class StorageStandIn:
    """What a ``map_location`` callable receives instead of a storage: the
    parts such functions use. Moving it only records where it should go;
    ptload does the copy (falling back to the host when the GPU is missing
    or full, with a warning)."""

    __slots__ = ("_nbytes", "device", "_key", "tensors")

    def __init__(self, nbytes, device, key, tensors=()):
        self._nbytes = nbytes
        self.device = torch.device(device)
        self._key = key
        # The names of the tensors on this storage (torch's callable sees
        # only the location tag): a mapper can place by layer name.
        self.tensors = tuple(tensors)

    def size(self):
        return self._nbytes

    def __len__(self):
        return self._nbytes

    def nbytes(self):
        return self._nbytes

    def element_size(self):
        return 1

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def cuda(self, device=None, non_blocking=False):
        if device is None:
            device = torch.device("cuda", 0)
        elif isinstance(device, int):
            device = torch.device("cuda", device)
        return StorageStandIn(self._nbytes, device, self._key, self.tensors)

    def cpu(self):
        return StorageStandIn(self._nbytes, "cpu", self._key, self.tensors)

    def to(self, device=None, *args, **kwargs):
        device = kwargs.get("device", device)
        if device is None:
            return self
        return StorageStandIn(self._nbytes, device, self._key, self.tensors)

    def __repr__(self):
        return f"StorageStandIn(nbytes={self._nbytes}, device={self.device})"


def _placer(map_location, names):
    """A function (index, key, location, nbytes) -> the device storage
    ``index`` should go to; ``names(index)`` gives its tensors' names."""
    if map_location is None:
        return lambda i, key, loc, n: loc
    if isinstance(map_location, (str, torch.device)):
        target = str(map_location)
        return lambda i, key, loc, n: target
    if isinstance(map_location, dict):
        table = {str(k): str(v) for k, v in map_location.items()}
        return lambda i, key, loc, n: table.get(loc, loc)
    if callable(map_location):

        def call(i, key, loc, n):
            result = map_location(StorageStandIn(n, "cpu", key, names(i)), loc)
            if result is None:
                return loc
            if isinstance(result, StorageStandIn):
                return str(result.device)
            if isinstance(result, (str, torch.device)):
                return str(result)
            if isinstance(result, torch.UntypedStorage) or hasattr(result, "device"):
                return str(result.device)
            raise Error(
                f"map_location returned a {type(result).__name__}; expected the "
                "storage it was given, a moved storage, or a device"
            )

        return call
    raise TypeError(
        "map_location should be None, a str, a torch.device, a dict or a callable, "
        f"not {type(map_location).__name__}"
    )


def _cuda_count():
    """CUDA devices torch can use (0 when torch has none)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cuda_ordinal(device):
    """The ordinal of a ``cuda`` device (``cuda`` alone: torch's current one)."""
    if device.index is not None:
        return device.index
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


class _Storages:
    """Each storage of the file once, as a torch ``UntypedStorage`` on its
    device; built on first use, so tied tensors share one. Storages bound
    for GPUs are uploaded together first, through ptload-device (with a
    device as ``map_location``, only those in ``only`` when it is given)."""

    def __init__(
        self, ckpt, source_path, mmap, map_location, strict, bar=None, only=None, data=None,
        placement=None, pread=False,
    ):
        self.ckpt = ckpt
        self.pread = pread
        self._names = None
        # The checkpoint's bytes when it came as bytes or a stream: storages
        # are views of one copy of them, as torch's storages of one file
        # are of its buffer (slices of one storage share its memory).
        self.data = data
        self.bar = bar
        self._infos = None
        self.built = {}
        self.typed = {}
        self._roots = None
        self._file = None
        self.legacy = ckpt.format() == "legacy"
        self.strict = strict
        self.fallbacks = []
        self.big = ckpt.byte_order() == "big"
        self.source_path = source_path
        self.mmap = mmap
        self._map = self._memory = None
        self.uploaded = None
        self.on_host = set()  # storages kept on the host instead of a GPU
        placer = _placer(map_location, self.names)
        self._targets = None
        if placement is not None:
            # place/budget/balance decide first; map_location the rest.
            decided = ckpt.placement(**placement)
            self._targets = [
                d if d is not None else placer(n, i[0], i[1], i[4])
                for n, (d, i) in enumerate(zip(decided, self.infos))
            ]
            self.on_cpu = [torch.device(t).type == "cpu" for t in self._targets]
            wanted = [(i, t) for i, t in enumerate(self._targets) if not self.on_cpu[i]]
        elif map_location is None:
            self.on_cpu = None  # each storage where it was saved
            wanted = [(i, loc) for i, loc in ckpt.off_host()]
        elif isinstance(map_location, (str, torch.device)):
            self.on_cpu = torch.device(map_location).type == "cpu"
            every = range(len(self.infos)) if only is None else sorted(only)
            wanted = [] if self.on_cpu else [(i, str(map_location)) for i in every]
        else:
            # Asked once per storage, in the order torch asks map_location
            # (the order storages are first met).
            self._targets = [placer(n, i[0], i[1], i[4]) for n, i in enumerate(self.infos)]
            self.on_cpu = [torch.device(t).type == "cpu" for t in self._targets]
            wanted = [(i, t) for i, t in enumerate(self._targets) if not self.on_cpu[i]]
        self.placer = placer
        self._upload([(i, torch.device(t)) for i, t in wanted])
        if self.on_host:
            if not isinstance(self.on_cpu, list):
                if self.on_cpu is None:
                    self.on_cpu = [i[1] == "cpu" for i in self.infos]
                else:
                    self.on_cpu = [self.on_cpu] * len(self.infos)
            for i in self.on_host:
                self.on_cpu[i] = True

    def _upload(self, wanted):
        """Storages bound for GPUs: those torch can reach are uploaded at
        once by ptload-device; the others stay on the host (with a warning,
        or an error when strict)."""
        wanted = [(i, d) for i, d in wanted if d.type == "cuda"]
        if not wanted:
            return
        count = _cuda_count()
        targets = []
        for i, device in wanted:
            ordinal = _cuda_ordinal(device)
            if ordinal < count:
                targets.append((i, ordinal))
            elif count == 0:
                self._fall_back(i, device, "no CUDA device is available")
            else:
                self._fall_back(i, device, f"only {count} CUDA device(s) are visible")
        if not targets or max(o for _, o in targets) >= _ptload.cuda_device_count():
            return  # the driver is not ptload's to use: torch copies each one
        self.uploaded = self.ckpt.upload(targets, _advance(self.bar))
        ordinals = dict(targets)
        for i, why in self.uploaded.fallbacks():
            self._fall_back(i, torch.device("cuda", ordinals[i]), why)

    def _fall_back(self, index, device, why):
        self._refuse_or_note(index, device, why)
        self.on_host.add(index)

    def _refuse_or_note(self, index, device, why):
        """A storage that cannot go to ``device``: an error when strict,
        else noted for the one warning, by its tensors' names."""
        location = self.infos[index][1]
        what = _storage_words(self.names(index), self.infos[index][0])
        if self.strict:
            raise DeviceError(
                f"{what} saved on {location} cannot go to {device}: {why} "
                "(strict=True; pass map_location to choose another device)"
            )
        self.fallbacks.append((what, location, str(device), why))

    def names(self, index):
        """The names of the tensors on storage ``index``."""
        if self._names is None:
            self._names = self.ckpt.storage_names()
        return self._names[index]

    @property
    def infos(self):
        """(key, location, dtype, numel, nbytes, file_offset) per storage."""
        if self._infos is None:
            self._infos = self.ckpt.storages()
        return self._infos

    def target(self, index):
        """The device storage ``index`` goes to."""
        if self._targets is not None:
            return self._targets[index]
        key, location, _dtype, _numel, nbytes, _offset = self.infos[index]
        return self.placer(index, key, location, nbytes)

    def map(self):
        """A private, writable map of the file: tensors may be written in
        place, the file never is. Made on first use."""
        if self._map is None and self.source_path is not None and self.mmap is not False:
            if self.ckpt.is_mapped():
                shared = self.mmap and _shared_mmap()
                with open(self.source_path, "r+b" if shared else "rb") as fh:
                    if os.fstat(fh.fileno()).st_size:
                        access = _mmap.ACCESS_WRITE if shared else _mmap.ACCESS_COPY
                        self._map = _mmap.mmap(fh.fileno(), 0, access=access)
        return self._map

    def memory(self):
        """``mmap=False``: the file read once; bytes or a stream: one
        writable copy of them. Made on first use."""
        if self._memory is None and self.data is not None:
            data = self.data
            self._memory = data if isinstance(data, bytearray) else bytearray(data)
        if self._memory is None and self.source_path is not None and self.mmap is False:
            with open(self.source_path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                memory = bytearray(size)
                view = memoryview(memory)
                done = 0
                while done < size:
                    n = fh.readinto(view[done:])
                    if not n:
                        raise Error(f"{self.source_path}: the file shrank while it was read")
                    done += n
                self._memory = memory
        return self._memory

    def tensor(self, index, dtype, shape, stride, offset):
        """A tensor over storage ``index``: a strided view of the storage's
        bytes seen as ``dtype``. Each storage is one torch storage, so tied
        tensors share it as in torch."""
        key = (index, dtype)
        typed = self.typed.get(key)
        if typed is None:
            flat = self.flat(index, _swap_unit(dtype))
            if flat.numel() % dtype.itemsize == 0 and flat.numel():
                typed = flat.view(dtype)
            else:
                typed = flat.untyped_storage()
            self.typed[key] = typed
        if isinstance(typed, torch.Tensor):
            return typed.as_strided(shape, stride, offset)
        t = torch.empty((0,), dtype=dtype, device=typed.device)
        t.set_(typed, offset, shape, stride)
        return t

    def get(self, index, elem_size):
        """Storage ``index`` as a torch ``UntypedStorage``, on its device;
        a view of another storage as a slice of that one's."""
        root = self._root_of(index)
        if root is not None:
            start, nbytes = root[1], self.infos[index][4]
            return self.get(root[0], elem_size)[start : start + nbytes]
        return self.flat(index, elem_size).untyped_storage()

    def flat(self, index, elem_size):
        """Storage ``index``'s bytes as a uint8 tensor on its device."""
        flat = self.built.get(index)
        if flat is not None:
            return flat
        key, location, _dtype, _numel, nbytes, offset = self.infos[index]
        if self.uploaded is not None and self.uploaded.on_device(index):
            flat = _from_dlpack(self.uploaded.capsule(index))
            self.built[index] = flat
            return flat
        root = self._root_of(index)
        if root is not None:
            # A view of another storage (legacy files): a slice of its
            # bytes, sharing its memory as torch's storage views do.
            start = root[1]
            flat = self.flat(root[0], elem_size)[start : start + nbytes]
            self.built[index] = flat
            return flat
        flat = self._host(index, nbytes, offset, elem_size)
        if index not in self.on_host:
            flat = self._place(index, flat, self.target(index))
        self.built[index] = flat
        return flat

    @property
    def reads_each(self):
        """``mmap=False`` on a legacy file, or ``pread``: each storage is
        read from the file into memory of its own, as torch reads a legacy
        file's (their bytes follow an 8-byte header, so they are rarely
        aligned, and a copy of the whole file would be copied again)."""
        return self.mmap is False and self.source_path is not None and (self.legacy or self.pread)

    def _read(self, offset, nbytes):
        """``nbytes`` of the file from ``offset``, into a new tensor."""
        if self._file is None:
            self._file = open(self.source_path, "rb")
        flat = torch.empty(nbytes, dtype=torch.uint8)
        self._file.seek(offset)
        done = 0
        with memoryview(flat.numpy()) as view:
            while done < nbytes:
                n = self._file.readinto(view[done:])
                if not n:
                    raise ContainerError(f"{self.source_path}: the file shrank while it was read")
                done += n
        if self.bar is not None:
            self.bar.update(nbytes)
        return flat

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None

    def _root_of(self, index):
        """``(root, byte offset)`` when storage ``index`` lies inside
        another storage's bytes: the storage views torch before 0.4 saved
        (slices of one storage) in legacy files. None otherwise, and always
        for zip files, whose storages are records of their own."""
        if self._roots is None:
            self._roots = {}
            if self.ckpt.format() == "legacy":
                spans = sorted(
                    (info[5], -info[4], i)
                    for i, info in enumerate(self.infos)
                    if info[5] is not None and info[4] > 0
                )
                outer = None
                for start, minus_len, i in spans:
                    end = start - minus_len
                    if outer is not None and end <= outer[1]:
                        self._roots[i] = (outer[2], start - outer[0])
                    else:
                        outer = (start, end, i)
        return self._roots.get(index)

    def _host(self, index, nbytes, offset, elem_size):
        if nbytes == 0:
            return torch.empty((0,), dtype=torch.uint8)
        aligned = offset is not None and offset % max(elem_size, 1) == 0
        swapped = self.big and elem_size > 1
        mapped = self.map() if offset is not None and aligned and not swapped else None
        if mapped is not None:
            return torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=offset)
        if self.reads_each and offset is not None and not swapped:
            return self._read(offset, nbytes)
        memory = self.memory() if offset is not None and not swapped else None
        if memory is not None:
            # mmap=False: the file read once; storages are views of that copy.
            flat = torch.frombuffer(memory, dtype=torch.uint8, count=nbytes, offset=offset)
            return flat if aligned else flat.clone()
        data = self.ckpt.storage_bytes(index, elem_size)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def _place(self, index, storage, target):
        device = torch.device(target)
        if device.type == "cpu":
            return storage
        if device.type == "meta":
            return torch.empty(storage.numel(), dtype=torch.uint8, device="meta")
        why = None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                why = "no CUDA device is available"
            elif (device.index or 0) >= torch.cuda.device_count():
                why = f"only {torch.cuda.device_count()} CUDA device(s) are visible"
        else:
            if device.type not in ("cuda",) and not _device_available(device):
                why = f"device {device} is not available"
        if why is None:
            try:
                return storage.to(device=device)
            except torch.cuda.OutOfMemoryError:
                why = f"{device} is out of memory"
            except RuntimeError as e:  # an unusable device
                why = str(e).splitlines()[0]
        self._refuse_or_note(index, device, why)
        return storage


def _device_available(device):
    try:
        torch.empty(0, device=device)
        return True
    except (RuntimeError, AssertionError):
        return False


def _swap_unit(dtype):
    """Bytes reversed together when the file's byte order is not the
    host's: a complex number's parts one at a time."""
    return dtype.itemsize // 2 if dtype.is_complex else dtype.itemsize


def _tensor(storages, info, objs, qparams):
    (_name, dtype_name, shape, stride, offset, storage_index, requires_grad, conj, neg, quant) = info
    dtype = _DTYPES.get(dtype_name)
    if dtype is None:
        raise Error(f"dtype {dtype_name} is not known to this torch")
    if storage_index is None:
        t = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    else:
        t = storages.tensor(storage_index, dtype, shape, stride, offset)
    if quant is not None:
        t = _quantize(t, quant, objs, qparams)
    if conj:
        t = t.conj()
    if neg:
        t = t._neg_view()
    if requires_grad:
        t.requires_grad_(True)
    return t


def _quantize(t, quant, objs, qparams):
    kind = quant[1]
    qdtype = _QDTYPES.get(kind)
    if qdtype is None:
        raise Error(f"quantized dtype {kind} is not known to this torch")
    values_shape = quant[-1]
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
    if quant[0] == "tensor":
        _, _, scheme, scale, zero_point, _ = quant
        q = torch._empty_affine_quantized(
            (0,), scale=scale, zero_point=zero_point, dtype=qdtype, device=t.device
        )
    else:
        _, _, scheme, axis, _ = quant
        scales, zero_points = objs[qparams[0]], objs[qparams[1]]
        small = [1] * len(shape)
        if 0 <= axis < len(shape):
            small[axis] = shape[axis]
        q = torch._empty_per_channel_affine_quantized(
            small, scales=scales, zero_points=zero_points, axis=axis, dtype=qdtype, device=t.device
        )
    q.set_(t.untyped_storage(), t.storage_offset(), shape, stride)
    return q


def _bounded(t, what):
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
            f"{what}: limit: Limits::max_expanded_view_bytes ({limit}) exceeded: an "
            f"overlapping view of {nbytes} bytes over a {t.untyped_storage().nbytes()}-byte storage"
        )


def _sparse(layout, data):
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


def _usable(allowed, module, name):
    """Whether the caller's trust admits ``module.name``: never for the
    modules torch blocks whatever is allowed (sys, os, posix, nt)."""
    return f"{module}.{name}" in allowed and not _ptload.module_blocked(module)


def _forbidden(ckpt, allowed):
    refused = []
    for module, name, torch_allowed, *_ in ckpt.globals():
        path = f"{module}.{name}"
        if not torch_allowed and not _usable(allowed, module, name) and path not in refused:
            refused.append(path)
    return refused


def _allowed_names(allow_globals):
    """``{"module.name": object or None}``: what ``allow_globals`` names,
    and what torch's own registry holds (``add_safe_globals``, the
    ``safe_globals`` context), as ``torch.load`` reads both. A name given
    as a string is imported when met; an object (or an ``(object, name)``
    pair, torch's alias form) is used as given."""
    names = {}
    registry = getattr(torch.serialization, "get_safe_globals", lambda: [])()
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
    f,
    map_location=None,
    pickle_module=None,
    *,
    weights_only=None,
    mmap=None,
    encoding=None,
    unknown="error",
    allow_globals=(),
    strict=False,
    progress=False,
    place=None,
    budget=None,
    balance=None,
):
    """Load a checkpoint as ``torch.load(f, map_location, weights_only=True)``
    would, without running anything the file names.

    ``f``: a path, bytes, or a binary file object. ``map_location``: None,
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
    from their data. ``allow_globals``: names (``"module.name"``) or
    objects trusted as ``torch.serialization.add_safe_globals`` trusts them:
    imported and called as pickle would.

    ``mmap``: None or True map the file privately (copy-on-write; tensors
    are views of the map), or shared when torch's default mmap option is
    ``MAP_SHARED``; False reads every storage into memory.
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
    express, as the CLI's ``--place``, ``--budget`` and ``--balance``:
    rules by tensor name (``{"encoder.*": "cuda:0", "*embed*": "cpu"}``),
    each GPU filled to a share of its memory (``0.9``) or a number of bytes,
    then the host, or storages split by bytes over N GPUs. A
    ``map_location`` callable's storage has ``.tensors``, the names of the
    tensors on it, so it can place by name too.

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
            placement,
        )
    finally:
        if collecting:
            gc.enable()


def _placement(map_location, place, budget, balance):
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
    rules = list(place.items()) if isinstance(place, dict) else list(place or ())
    out = {"place": [(str(pattern), str(torch.device(device))) for pattern, device in rules]}
    if budget is not None:
        count = _cuda_count()
        if isinstance(budget, bool) or not isinstance(budget, (int, float)):
            raise TypeError(f"budget is a share of each GPU (0.9) or bytes (20 << 30), not {budget!r}")
        if isinstance(budget, float) and 0 < budget <= 1:
            share = lambda total: int(total * budget)  # noqa: E731
        elif isinstance(budget, int) and budget > 1:
            share = lambda total: budget  # noqa: E731
        else:
            raise ValueError(
                f"budget {budget!r}: a share of each GPU's memory in (0, 1] (0.9) or bytes (20 << 30)"
            )
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


def _advance(bar):
    """A callable that moves ``bar`` to the bytes done so far, or None."""
    if bar is None:
        return None
    return lambda done: bar.update(done - bar.n)


def _load(
    f, map_location, weights_only, mmap, unknown, allow_globals, strict, progress, encoding=None,
    placement=None,
):
    # False is torch's full unpickler; ptload still runs nothing: what torch
    # would have imported and called comes back as ptload.Inert records.
    full = not _weights_only(weights_only)
    if unknown not in ("error", "inert"):
        raise ValueError("unknown must be 'error' or 'inert'")
    if full:
        unknown = "inert"
    allowed = _allowed_names(allow_globals)
    stream = None
    if isinstance(f, (str, os.PathLike)):
        path = source = os.fspath(f)
    elif isinstance(f, (bytes, bytearray, memoryview)):
        path, source = None, bytes(f)
    elif hasattr(f, "read"):
        path = None
        source, start = read_stream(f)
        stream = (f, start)
    else:
        raise TypeError(f"expected a path, bytes or a binary file object, got {type(f).__name__}")
    if mmap and path is None:
        # torch's words: there is no file to map.
        raise ValueError("f must be a file path in order to use the mmap argument")
    ckpt = open_checkpoint(source, objects=True, encoding=encoding, byte_order=_assumed_byte_order())
    if stream is not None:
        # Where torch leaves the stream: just past the checkpoint, so the
        # next object saved after it can be read.
        stream[0].seek(stream[1] + ckpt.end_offset())
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
            + ". Nothing was run. Pass unknown='inert' to get them as inert "
            "ptload.Inert records, or allow_globals=[...] for the ones you trust."
            + "".join(
                f" {p} is allowed, but its module is blocked whatever is allowed, as in torch."
                for p in refused
                if p in allowed
            ),
            refused,
        )
    inert = [p for p in refused if p not in _graph.PLAIN_TYPE_NAMES]
    if full and inert:
        warnings.warn(
            f"weights_only=False: ptload ran nothing from this file; {len(inert)} global(s) "
            f"torch would have imported come back as ptload.Inert records: {', '.join(inert)}",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    bar = None
    if progress:
        from ._safe import _byte_bar

        total = os.path.getsize(path) if path is not None else len(source)
        bar = _byte_bar(progress, total, os.path.basename(path) if path else "checkpoint")
    try:
        return _build(ckpt, path, source, mmap, map_location, strict, bar, allowed, unknown, placement)
    finally:
        if bar is not None:
            bar.close()


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "y", "yes", "true")


def _weights_only(asked):
    """torch.load's reading of ``weights_only``: None is True unless
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set; TORCH_FORCE_WEIGHTS_ONLY_LOAD
    makes it True whatever was asked."""
    if _env_flag("TORCH_FORCE_WEIGHTS_ONLY_LOAD"):
        return True
    if asked is None:
        return not _env_flag("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    return bool(asked)


def _assumed_byte_order():
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


def _shared_mmap():
    """Whether torch's mmap option is MAP_SHARED
    (``torch.serialization.set_default_mmap_options``): writes to loaded
    tensors then reach the file."""
    get = getattr(torch.serialization, "get_default_mmap_options", None)
    shared = getattr(_mmap, "MAP_SHARED", None)
    return get is not None and shared is not None and get() == shared


def _build(ckpt, path, source, mmap, map_location, strict, bar, allowed, unknown, placement=None):
    data = source if path is None else None
    storages = _Storages(
        ckpt, path, mmap, map_location, strict, bar, data=data, placement=placement
    )
    try:
        return _build_with(ckpt, storages, source, mmap, bar, allowed, unknown)
    finally:
        storages.close()


def _build_with(ckpt, storages, source, mmap, bar, allowed, unknown):
    # Most tensors are made in one call, as DLPack views of private memory.
    made = ckpt.torch_tensors(
        _from_dlpack, source, mmap is not False, storages.on_cpu, storages.uploaded,
        _advance(bar), shared=bool(mmap) and _shared_mmap(), host=not storages.reads_each,
    )

    def make_leaf(kind, node, objs):
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
            return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)
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


def _storage_words(names, key):
    """A storage as its user knows it: by the tensors on it (a legacy
    file's storage keys are memory addresses)."""
    if not names:
        return f"storage {key}"
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{shown} (storage {key})" if len(names) == 1 else f"{shown} (one storage, key {key})"


def _warn_fallbacks(fallbacks):
    first = fallbacks[0]
    more = f" (and {len(fallbacks) - 1} more storages)" if len(fallbacks) > 1 else ""
    warnings.warn(
        f"{first[0]} saved on {first[1]} stays on the CPU instead of {first[2]}: "
        f"{first[3]}{more}. Pass strict=True to raise instead.",
        RuntimeWarning,
        stacklevel=user_stacklevel(),
    )


def load_file(
    path, device="cpu", *, key="auto", strip_prefix="auto", include=(), exclude=(),
    shard=None, splits=(), preset=None, progress=False, backend="mmap",
):
    """safetensors' ``load_file`` on a torch checkpoint: ``{name: tensor}``,
    the state dict the CLI would take (``key``/``strip_prefix`` as in
    ``ptload convert``; what ``auto`` decided is printed as a warning when
    it changed anything). ``path`` may be a directory of shards or an index
    file; ``shard=(rank, world)`` with ``splits``/``preset`` gives that
    rank's slices (see :class:`ptload.safe_open`). With a CUDA ``device``,
    one file's selected storages are uploaded at once by ptload-device, as
    :func:`load` uploads them. ``progress=True``
    shows a tqdm bar over the tensors when tqdm is installed."""
    from ._safe import _progress, safe_open

    with safe_open(
        path, framework="pt", device=device, key=key, strip_prefix=strip_prefix,
        include=include, exclude=exclude, shard=shard, splits=splits, preset=preset,
        backend=backend,
    ) as f:
        f._upload()
        return {name: f.get_tensor(name) for name in _progress(f.offset_keys(), progress, path)}
