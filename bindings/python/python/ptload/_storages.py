"""Storages as torch storages: each storage of a file once, on the device
its placement chose, tied tensors sharing it; the dtype tables and what a
``map_location`` callable receives. Used by ``ptload.torch.load`` and by
``safe_open(framework="pt")``; it knows nothing of either."""

from __future__ import annotations

import io
import mmap as _mmap
import os
import warnings
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Collection,
    Dict,
    Iterable,
    List,
    Optional,
    Set,
    Tuple,
    Union,
    cast,
)

import torch

from . import _ptload
from ._errors import DeviceError, Error
from ._io import read_at, user_stacklevel

if TYPE_CHECKING:
    from typing import TypedDict

    from ._ptload import Checkpoint, StorageRecord, Uploaded
    from .torch import MapLocation

    class _Placement(TypedDict, total=False):
        """``Checkpoint.placement``'s keywords, as ``ptload.torch.load``'s
        ``place``/``budget``/``balance`` give them."""

        place: List[Tuple[str, str]]
        budget: List[Tuple[int, int]]
        balance: int

    # (index, key, location, nbytes) -> the device a storage goes to.
    _Placer = Callable[[int, str, str, int], str]

__all__ = ["StorageStandIn"]

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

_QDTYPES: Dict[str, Optional[torch.dtype]] = {
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


_from_dlpack: Callable[[Any], torch.Tensor] = (
    getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack
)


def _torch_dtype(name: str) -> torch.dtype:
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

    def __init__(
        self, nbytes: int, device: Union[str, int, torch.device], key: str, tensors: Iterable[str] = ()
    ) -> None:
        self._nbytes = nbytes
        self.device = torch.device(device)
        self._key = key
        # The names of the tensors on this storage (torch's callable sees
        # only the location tag): a mapper can place by layer name.
        self.tensors = tuple(tensors)

    def size(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return self._nbytes

    def nbytes(self) -> int:
        return self._nbytes

    def element_size(self) -> int:
        return 1

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def cuda(
        self, device: Union[int, str, torch.device, None] = None, non_blocking: bool = False
    ) -> StorageStandIn:
        if device is None:
            device = torch.device("cuda", 0)
        elif isinstance(device, int):
            device = torch.device("cuda", device)
        return StorageStandIn(self._nbytes, device, self._key, self.tensors)

    def cpu(self) -> StorageStandIn:
        return StorageStandIn(self._nbytes, "cpu", self._key, self.tensors)

    def to(self, *args: Any, **kwargs: Any) -> StorageStandIn:
        # torch's storage.to takes the device by keyword only.
        if args:
            _lenient("storage.to(device) with the device given by position (torch's "
                     "storage.to takes device= by keyword)")
        device = kwargs.get("device", args[0] if args else None)
        if device is None:
            return self
        return StorageStandIn(self._nbytes, device, self._key, self.tensors)

    def __repr__(self) -> str:
        return f"StorageStandIn(nbytes={self._nbytes}, device={self.device})"


def _placer(map_location: MapLocation, names: Callable[[int], List[str]]) -> _Placer:
    """A function (index, key, location, nbytes) -> the device storage
    ``index`` should go to; ``names(index)`` gives its tensors' names."""
    if map_location is None:
        return lambda i, key, loc, n: loc
    if isinstance(map_location, (str, torch.device)):
        target = str(map_location)
        return lambda i, key, loc, n: target
    if isinstance(map_location, dict):
        if not all(isinstance(v, str) for v in map_location.values()):
            _lenient("a map_location dict whose values are not strings (torch.device values)")
        table = {str(k): str(v) for k, v in map_location.items()}
        return lambda i, key, loc, n: table.get(loc, loc)
    if callable(map_location):

        def call(i: int, key: str, loc: str, n: int) -> str:
            result = map_location(StorageStandIn(n, "cpu", key, names(i)), loc)
            if result is None:
                return loc
            if isinstance(result, StorageStandIn):
                return str(result.device)
            if isinstance(result, (str, torch.device)):
                _lenient(
                    f"a map_location callable that returns a {type(result).__name__} "
                    "instead of a storage"
                )
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


def _lenient(what: str) -> None:
    """ptload accepts ``what`` where torch.load raises TypeError: said once
    per load (``_lenient.said`` is reset at each), so code that will also
    run under torch is told."""
    # The set is an attribute of this function, which mypy does not model.
    if what in _lenient.said:  # type: ignore[attr-defined]
        return
    _lenient.said.add(what)  # type: ignore[attr-defined]
    warnings.warn(
        f"ptload accepts {what}, but torch.load raises TypeError for it",
        UserWarning,
        stacklevel=user_stacklevel(),
    )


_lenient.said = set()  # type: ignore[attr-defined]


def _cuda_count() -> int:
    """CUDA devices torch can use (0 when torch has none)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cuda_ordinal(device: torch.device) -> int:
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
        self,
        ckpt: Checkpoint,
        source_path: Optional[str],
        mmap: Optional[bool],
        map_location: MapLocation,
        strict: bool,
        bar: Any = None,
        only: Optional[Collection[int]] = None,
        data: Union[bytes, bytearray, None] = None,
        placement: Optional[_Placement] = None,
        pread: bool = False,
        remote: bool = False,
    ) -> None:
        self.ckpt = ckpt
        self.pread = pread
        # Read by ranged requests (a URL): each storage's bytes are fetched
        # by the reader when first asked for, into memory of their own.
        self.remote = remote
        self._names: Optional[List[List[str]]] = None
        # The checkpoint's bytes when it came as bytes or a stream: storages
        # are views of one copy of them, as torch's storages of one file
        # are of its buffer (slices of one storage share its memory).
        self.data = data
        # A tqdm bar over the bytes read or uploaded, or None.
        self.bar = bar
        self._infos: Optional[List[StorageRecord]] = None
        self.built: Dict[int, torch.Tensor] = {}
        # A storage seen as a dtype: a typed view of its bytes, or the
        # storage itself where they do not divide into that dtype.
        self.typed: Dict[Tuple[int, torch.dtype], Union[torch.Tensor, torch.UntypedStorage]] = {}
        self._roots: Optional[Dict[int, Tuple[int, int]]] = None
        self._file: Optional[io.BufferedReader] = None
        self.legacy = ckpt.format() == "legacy"
        self.strict = strict
        # (what, saved location, target device, why) per storage kept on the host.
        self.fallbacks: List[Tuple[str, str, str, str]] = []
        self.big = ckpt.byte_order() == "big"
        self.source_path = source_path
        self.mmap = mmap
        self._map: Optional[_mmap.mmap]
        self._memory: Optional[bytearray]
        self._map = self._memory = None
        self.uploaded: Optional[Uploaded] = None
        self.on_host: Set[int] = set()  # storages kept on the host instead of a GPU
        placer = _placer(map_location, self.names)
        self._targets: Optional[List[str]] = None
        # Every storage's target when map_location is one device (asked
        # per tensor by safe_open: no call per storage).
        self._target_all: Optional[str] = None
        # The keywords that chose each storage's device where they did
        # (a strict refusal names them, not map_location).
        self._chosen_by: Optional[List[Optional[str]]] = None
        if placement is not None:
            # place/budget/balance decide first; map_location the rest.
            decided = ckpt.placement(**placement)
            chooser = " or ".join(
                f"{k}=" for k in ("place", "budget", "balance") if placement.get(k)
            )
            self._chosen_by = [chooser if d is not None else None for d in decided]
            self._targets = [
                d if d is not None else placer(n, i.key, i.location, i.nbytes)
                for n, (d, i) in enumerate(zip(decided, self.infos))
            ]
            # Per storage, all alike, or None: each where it was saved.
            self.on_cpu: Union[List[bool], bool, None] = [
                torch.device(t).type == "cpu" for t in self._targets
            ]
            wanted = [(i, t) for i, t in enumerate(self._targets) if not self.on_cpu[i]]
        elif map_location is None:
            self.on_cpu = None  # each storage where it was saved
            wanted = [(i, loc) for i, loc in ckpt.off_host()]
        elif isinstance(map_location, (str, torch.device)):
            self._target_all = str(map_location)
            self.on_cpu = torch.device(map_location).type == "cpu"
            every = range(len(self.infos)) if only is None else sorted(only)
            wanted = [] if self.on_cpu else [(i, str(map_location)) for i in every]
        else:
            # Asked once per storage, in the order torch asks map_location
            # (the order storages are first met).
            self._targets = [placer(n, i.key, i.location, i.nbytes) for n, i in enumerate(self.infos)]
            self.on_cpu = [torch.device(t).type == "cpu" for t in self._targets]
            wanted = [(i, t) for i, t in enumerate(self._targets) if not self.on_cpu[i]]
        self.placer = placer
        self._upload([(i, torch.device(t)) for i, t in wanted])
        if self.on_host:
            if not isinstance(self.on_cpu, list):
                if self.on_cpu is None:
                    self.on_cpu = [i.location == "cpu" for i in self.infos]
                else:
                    self.on_cpu = [self.on_cpu] * len(self.infos)
            for i in self.on_host:
                self.on_cpu[i] = True

    def _upload(self, wanted: List[Tuple[int, torch.device]]) -> None:
        """Storages bound for GPUs: those torch can reach are uploaded at
        once by ptload-device; the others stay on the host (with a warning,
        or an error when strict)."""
        wanted = [(i, d) for i, d in wanted if d.type == "cuda"]
        if not wanted:
            return
        count = _cuda_count()
        targets: List[Tuple[int, int]] = []
        for i, device in wanted:
            ordinal = _cuda_ordinal(device)
            if ordinal < count:
                targets.append((i, ordinal))
            else:
                self._fall_back(i, device, _ptload.fallback_text(ordinal, count))
        if not targets or max(o for _, o in targets) >= _ptload.cuda_device_count():
            return  # the driver is not ptload's to use: torch copies each one
        self.uploaded = self.ckpt.upload(targets, _advance(self.bar))
        ordinals = dict(targets)
        for i, why in self.uploaded.fallbacks():
            self._fall_back(i, torch.device("cuda", ordinals[i]), why)

    def _fall_back(self, index: int, device: torch.device, why: str) -> None:
        self._refuse_or_note(index, device, why)
        self.on_host.add(index)

    def _refuse_or_note(self, index: int, device: torch.device, why: str) -> None:
        """A storage that cannot go to ``device``: an error when strict,
        else noted for the one warning, by its tensors' names."""
        info = self.infos[index]
        location = info.location
        what = _storage_words(self.names(index), info.key)
        if self.strict:
            chooser = self._chosen_by[index] if self._chosen_by is not None else None
            advice = (
                f"{chooser} put it there; change it, or pass strict=False to keep it on the host"
                if chooser
                else "pass map_location to choose another device"
            )
            raise DeviceError(f"{what} saved on {location} cannot go to {device}: {why} (strict=True; {advice})")
        self.fallbacks.append((what, location, str(device), why))

    def names(self, index: int) -> List[str]:
        """The names of the tensors on storage ``index``."""
        if self._names is None:
            self._names = self.ckpt.storage_names()
        return self._names[index]

    @property
    def infos(self) -> List[StorageRecord]:
        """A ``StorageRecord`` per storage (key, location, dtype, numel,
        nbytes, file_offset)."""
        if self._infos is None:
            self._infos = self.ckpt.storages()
        return self._infos

    def target(self, index: int) -> str:
        """The device storage ``index`` goes to."""
        if self._targets is not None:
            return self._targets[index]
        if self._target_all is not None:
            return self._target_all
        info = self.infos[index]
        return self.placer(index, info.key, info.location, info.nbytes)

    def map(self) -> Optional[_mmap.mmap]:
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

    def memory(self) -> Optional[bytearray]:
        """``mmap=False``: the file read once; bytes or a stream: one
        writable copy of them. Made on first use."""
        if self._memory is None and self.data is not None:
            data = self.data
            self._memory = data if isinstance(data, bytearray) else bytearray(data)
        if self._memory is None and self.source_path is not None and self.mmap is False:
            with open(self.source_path, "rb") as fh:
                memory = bytearray(os.fstat(fh.fileno()).st_size)
                with memoryview(memory) as view:
                    read_at(fh, 0, view, self.source_path)
                self._memory = memory
        return self._memory

    def tensor(
        self, index: int, dtype: torch.dtype, shape: List[int], stride: List[int], offset: int
    ) -> torch.Tensor:
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

    def get(self, index: int, elem_size: int) -> torch.UntypedStorage:
        """Storage ``index`` as a torch ``UntypedStorage``, on its device;
        a view of another storage as a slice of that one's."""
        root = self._root_of(index)
        if root is not None:
            start, nbytes = root[1], self.infos[index].nbytes
            # torch leaves a storage's slice untyped.
            return cast("torch.UntypedStorage", self.get(root[0], elem_size)[start : start + nbytes])
        return self.flat(index, elem_size).untyped_storage()

    def flat(self, index: int, elem_size: int) -> torch.Tensor:
        """Storage ``index``'s bytes as a uint8 tensor on its device."""
        flat = self.built.get(index)
        if flat is not None:
            return flat
        nbytes, offset = self.infos[index].nbytes, self.infos[index].file_offset
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
    def reads_each(self) -> bool:
        """``mmap=False`` on a legacy file, or ``pread``: each storage is
        read from the file into memory of its own, as torch reads a legacy
        file's (their bytes follow an 8-byte header, so they are rarely
        aligned, and a copy of the whole file would be copied again)."""
        return self.mmap is False and self.source_path is not None and (self.legacy or self.pread)

    def _read(self, offset: int, nbytes: int) -> torch.Tensor:
        """``nbytes`` of the file from ``offset``, into a new tensor."""
        # Only called with a file to read (reads_each, or _host's check).
        if self._file is None:
            self._file = open(cast(str, self.source_path), "rb")
        flat = torch.empty(nbytes, dtype=torch.uint8)
        # numpy's stubs give arrays the buffer protocol on Python 3.12+ only.
        with memoryview(flat.numpy()) as view:  # type: ignore[arg-type, unused-ignore]
            read_at(self._file, offset, view, cast(str, self.source_path))
        if self.bar is not None:
            self.bar.update(nbytes)
        return flat

    def close(self) -> None:
        f = getattr(self, "_file", None)  # None too when __init__ failed early
        if f is not None:
            self._file = None
            f.close()

    def __del__(self) -> None:
        # A safe_open used without ``with``: the file closes with it, not
        # at the collector's leisure with a ResourceWarning.
        self.close()

    def _root_of(self, index: int) -> Optional[Tuple[int, int]]:
        """``(root, byte offset)`` when storage ``index`` lies inside
        another storage's bytes: the storage views torch before 0.4 saved
        (slices of one storage) in legacy files. None otherwise, and always
        for zip files, whose storages are records of their own."""
        if self._roots is None:
            self._roots = {}
            if self.ckpt.format() == "legacy":
                spans = sorted(
                    (info.file_offset, -info.nbytes, i)
                    for i, info in enumerate(self.infos)
                    if info.file_offset is not None and info.nbytes > 0
                )
                outer = None
                for start, minus_len, i in spans:
                    end = start - minus_len
                    if outer is not None and end <= outer[1]:
                        self._roots[i] = (outer[2], start - outer[0])
                    else:
                        outer = (start, end, i)
        return self._roots.get(index)

    def _host(self, index: int, nbytes: int, offset: Optional[int], elem_size: int) -> torch.Tensor:
        if nbytes == 0:
            return torch.empty((0,), dtype=torch.uint8)
        aligned = offset is not None and offset % max(elem_size, 1) == 0
        swapped = self.big and elem_size > 1
        mapped = self.map() if offset is not None and aligned and not swapped else None
        if mapped is not None:
            # offset is an int here: mapped is None otherwise.
            return torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=cast(int, offset))
        if self.reads_each and offset is not None and not swapped:
            return self._read(offset, nbytes)
        memory = self.memory() if offset is not None and not swapped else None
        if memory is not None:
            # mmap=False: the file read once; storages are views of that copy.
            # offset is an int here: memory is None otherwise.
            flat = torch.frombuffer(memory, dtype=torch.uint8, count=nbytes, offset=cast(int, offset))
            return flat if aligned else flat.clone()
        if offset is not None and not swapped and self.source_path is not None:
            # Misaligned in a mapped file (a legacy file's storages): read
            # into memory of its own, one copy.
            return self._read(offset, nbytes)
        # A bytearray of its own: the tensor is made over it, no copy.
        data = self.ckpt.storage_bytes(index, elem_size)
        if self.remote and self.bar is not None:
            self.bar.update(nbytes)
        return torch.frombuffer(data, dtype=torch.uint8)

    def _place(self, index: int, storage: torch.Tensor, target: str) -> torch.Tensor:
        if target == "cpu":
            return storage
        device = torch.device(target)
        if device.type == "cpu":
            return storage
        if device.type == "meta":
            return torch.empty(storage.numel(), dtype=torch.uint8, device="meta")
        why: Optional[str] = None
        if device.type == "cuda":
            visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if (device.index or 0) >= visible:
                why = _ptload.fallback_text(device.index or 0, visible)
        else:
            if device.type not in ("cuda",) and not _device_available(device):
                why = f"device {device} is not available"
        if why is None:
            try:
                return storage.to(device=device)
            except torch.cuda.OutOfMemoryError:
                why = _ptload.fallback_text(device.index or 0, 0, out_of_memory=True)
            except RuntimeError as e:  # an unusable device
                why = str(e).splitlines()[0]
        self._refuse_or_note(index, device, why)
        return storage


def _device_available(device: torch.device) -> bool:
    try:
        torch.empty(0, device=device)
        return True
    except (RuntimeError, AssertionError):
        return False


def _swap_unit(dtype: torch.dtype) -> int:
    """Bytes reversed together when the file's byte order is not the
    host's: a complex number's parts one at a time."""
    return dtype.itemsize // 2 if dtype.is_complex else dtype.itemsize


def _shared_mmap() -> bool:
    """Whether torch's mmap option is MAP_SHARED
    (``torch.serialization.set_default_mmap_options``): writes to loaded
    tensors then reach the file."""
    get = getattr(torch.serialization, "get_default_mmap_options", None)
    shared = getattr(_mmap, "MAP_SHARED", None)
    return get is not None and shared is not None and get() == shared


def _storage_words(names: List[str], key: str) -> str:
    """A storage as its user knows it: by the tensors on it (a legacy
    file's storage keys are memory addresses)."""
    if not names:
        return f"storage {key}"
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{shown} (storage {key})" if len(names) == 1 else f"{shown} (one storage, key {key})"


def _advance(bar: Any) -> Optional[Callable[[int], Any]]:
    """A callable that moves ``bar`` to the bytes done so far, or None."""
    if bar is None:
        return None
    return lambda done: bar.update(done - bar.n)
