"""safetensors' ``safe_open`` on torch checkpoints.

``safe_open(path, framework="pt" | "numpy")`` lists the state dict the CLI
would take (a training checkpoint's model, ``module.`` stripped; what the
automatic choices did is said as a warning) and hands out its tensors:
numpy arrays are read-only views of the map where the bytes lie as numpy
needs them (little-endian, aligned, no conj/neg bit), copies otherwise;
torch tensors view a private map. Nothing here imports torch unless
``framework="pt"``.
"""

import mmap as _mmap
import os
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Iterable,
    List,
    Literal,
    Optional,
    Set,
    Tuple,
    Union,
    cast,
)
import sys
import warnings

from ._errors import Error, UnsupportedError
from ._io import (
    is_url,
    open_checkpoint,
    read_at,
    require_file,
    user_stacklevel,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch

    from ._ptload import PlacedTensors, Selection, TensorRecord
    from ._ptload import ReadAhead as _ReadAhead
    from ._storages import _Storages

__all__ = ["safe_open", "numpy_dtype"]


def numpy_dtype(name: str) -> Optional["np.dtype[Any]"]:
    """The numpy dtype of a ptload dtype name (bf16 and float8 through
    ``ml_dtypes``); None when numpy has none (complex32, packed float4)."""
    import numpy as np

    plain = {
        "F64": "<f8",
        "F32": "<f4",
        "F16": "<f2",
        "C64": "<c8",
        "C128": "<c16",
        "I8": "i1",
        "I16": "<i2",
        "I32": "<i4",
        "I64": "<i8",
        "U8": "u1",
        "U16": "<u2",
        "U32": "<u4",
        "U64": "<u8",
        "BOOL": "?",
    }
    if name in plain:
        return np.dtype(plain[name])
    extra = {
        "BF16": "bfloat16",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
        "F8_E4M3FNUZ": "float8_e4m3fnuz",
        "F8_E5M2FNUZ": "float8_e5m2fnuz",
        "F8_E8M0": "float8_e8m0fnu",
    }
    if name in extra:
        try:
            import ml_dtypes
        except ImportError:
            raise Error(
                f"{name} tensors need the ml_dtypes package for numpy: pip install ml_dtypes"
            ) from None
        # Found by name (getattr), so mypy cannot tell which dtype this is.
        return cast("np.dtype[Any]", np.dtype(getattr(ml_dtypes, extra[name])))
    return None


def _changed(kind: str, key: Optional[str], strip_prefix: Optional[str]) -> bool:
    """Whether a decision of the reader's (its kind, from the binding)
    changed what the caller gets: not the whole file kept, nor what an
    explicit key or include/exclude left out as asked."""
    if kind in ("key", "left_out", "unsure"):
        return key == "auto"
    if kind == "stripped":
        return strip_prefix == "auto"
    return kind not in ("whole_file", "filtered")


def _array_dtype(info: "TensorRecord") -> "np.dtype[Any]":
    """The numpy dtype of a tensor tuple's arrays: packed float4 pairs come
    as their bytes, as torch stores them."""
    name = info.dtype
    dtype = numpy_dtype("U8" if name == "F4_E2M1_X2" else name)
    if dtype is None:
        raise Error(f"{info.name}: numpy has no dtype for {name}")
    return dtype


def _array_from_bytes(data: bytes, info: "TensorRecord") -> "npt.NDArray[Any]":
    """A tensor's row-major, host-order bytes as a numpy array; complex32,
    which numpy lacks, widened to complex64 (exactly)."""
    import numpy as np

    shape = tuple(info.shape)
    if info.dtype == "C32":
        halves = np.frombuffer(data, dtype="<f2").astype("<f4")
        return halves.view("<c8").reshape(shape)
    return np.frombuffer(data, dtype=_array_dtype(info)).reshape(shape)


class _Slice:
    """``safe_open(...).get_slice(name)``: index it to read only that part."""

    def __init__(self, owner: "safe_open", name: str) -> None:
        self._owner = owner
        self._name = name

    def get_shape(self) -> List[int]:
        return list(self._owner._info(self._name).shape)

    def get_dtype(self) -> str:
        return self._owner._info(self._name).dtype

    def __getitem__(self, key: Any) -> Any:
        view = self._owner._view(self._name)
        part = view[key]
        if self._owner._framework == "numpy":
            import numpy as np

            return np.array(part)
        return part.clone()


class safe_open:
    """Open a torch checkpoint with safetensors' interface.

    ``framework``: ``"pt"`` (torch tensors) or ``"numpy"`` (``"np"``).
    ``device``: where ``get_tensor`` puts torch tensors. ``key``,
    ``strip_prefix``, ``include``, ``exclude``: which tensors and names,
    as ``ptload convert`` takes them.

    ``path`` may also be a directory of shards or an index file
    (``pytorch_model.bin.index.json``): one state dict over every file.
    ``shard=(rank, world)`` with ``splits`` (``"GLOB=DIM"`` rules, first
    match wins) and/or a split ``preset`` (``"llama"``, ``"gpt2"``, ...)
    gives that tensor-parallel rank's slices, in ``torch.tensor_split``
    semantics, reading only their bytes; unmatched tensors come whole.
    Sets and slices come as copies. ``rank_files``: read the directory
    ``path``'s rank files (each rank's ``torch.save`` of its part of a
    sharded model, no placement recorded) as one state dict, each tensor
    cut as the rules say (``"GLOB=DIM"`` or ``"GLOB=replicate"``,
    comma-separated, first match wins; ``"fsdp2"``: every parameter on dim
    0, as FSDP2's ``fully_shard`` cuts them), as the CLI's
    ``--rank-files``.

    ``path`` may be an ``http://``, ``https://``, ``s3://``, ``gs://`` or
    ``az://`` URL of a checkpoint file or of a set's index (a ``str``): it
    is read by ranged requests, fetching what opening parses and then each
    storage's bytes when a tensor over it is first asked for, into memory of
    its own (not a map, whichever ``backend``); ``shard=`` gives a rank's
    slices of it (fetching only the ranges they lie in).

    ``backend``: ``"mmap"`` (tensors view a private map of the file) or
    ``"pread"`` (each storage is read from the file into memory of its own
    when first asked for; no tensor holds the map, so a file that changes
    or goes away afterwards, as on a network file system, cannot reach
    them).
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        framework: str = "pt",
        device: Any = "cpu",
        *,
        key: Optional[str] = "auto",
        strip_prefix: Optional[str] = "auto",
        include: Union[str, Iterable[str]] = (),
        exclude: Union[str, Iterable[str]] = (),
        shard: Optional[Tuple[int, int]] = None,
        splits: Union[str, Iterable[str]] = (),
        preset: Optional[str] = None,
        backend: str = "mmap",
        rank_files: Optional[str] = None,
    ) -> None:
        if backend not in ("mmap", "pread"):
            raise ValueError(f"backend {backend!r}: 'mmap' or 'pread'")
        if framework in ("np", "numpy"):
            framework = "numpy"
        elif framework not in ("pt", "torch"):
            raise ValueError(f"framework {framework!r}: ptload gives 'pt' or 'numpy'")
        else:
            framework = "pt"
        self._framework = framework
        self._device = device
        # A URL is read by ranged requests: each storage's bytes fetched
        # into memory of their own when first asked for, whichever backend.
        self._remote = is_url(path)
        self._pread = backend == "pread" and not self._remote
        self._path = os.fsdecode(os.fspath(path))
        if not self._remote:
            require_file(self._path)
        # One pattern may be given as a string, as `splits` may.
        include = [include] if isinstance(include, str) else list(include)
        exclude = [exclude] if isinstance(exclude, str) else list(exclude)
        self._map: Optional[_mmap.mmap] = None
        self._torch_storages: Optional["_Storages"] = None
        self._placed: Optional["PlacedTensors"] = None
        self._sel: Optional["Selection"] = None
        if self._remote:
            # An index or a directory URL: the reader opens the set, or
            # says why it cannot.
            bare = self._path.split("?", 1)[0].split("#", 1)[0]
            is_set = bare.endswith(".json") or bare.endswith("/")
        else:
            is_set = os.path.isdir(self._path) or self._path.endswith(".json")
        if shard is not None or splits or preset or is_set or rank_files is not None:
            from . import _ptload

            self._sel = _ptload.select(
                self._path,
                key=key if key is not None else "all",
                strip=strip_prefix if strip_prefix is not None else "none",
                include=list(include),
                exclude=list(exclude),
                # tuple() keeps the (rank, world) pair's two items.
                shard=cast("Tuple[int, int]", tuple(shard)) if shard is not None else None,
                splits=[splits] if isinstance(splits, str) else list(splits),
                preset=preset,
                rank_files=rank_files,
            )
            self._warn(self._sel.decisions(), key, strip_prefix)
            self._tensors = self._sel.tensors()
            self._index = {t.name: i for i, t in enumerate(self._tensors)}
            return
        self._ckpt = open_checkpoint(self._path, objects=False)
        selected, decisions = self._ckpt.select(
            key if key is not None else "all",
            strip_prefix if strip_prefix is not None else "none",
            list(include),
            list(exclude),
        )
        self._warn(decisions, key, strip_prefix)
        self._tensors = self._ckpt.tensors()
        self._index = dict(selected)
        self._storages = self._ckpt.storages()
        self._big = self._ckpt.byte_order() == "big"
        if self._ckpt.is_mapped() and not self._pread:
            with open(self._path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size:
                    access = _mmap.ACCESS_READ if framework == "numpy" else _mmap.ACCESS_COPY
                    self._map = _mmap.mmap(fh.fileno(), 0, access=access)

    def _local_path(self) -> Optional[str]:
        """The file tensors may map or read themselves; None for a URL,
        whose bytes only the reader fetches."""
        return None if self._remote else self._path

    def _warn(
        self, decisions: List[Tuple[str, str]], key: Optional[str], strip_prefix: Optional[str]
    ) -> None:
        said = [text for kind, text in decisions if _changed(kind, key, strip_prefix)]
        if said:
            warnings.warn(
                f"{os.path.basename(self._path)}: " + "; ".join(said),
                UserWarning,
                stacklevel=user_stacklevel(),
            )

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def _made_at_once(self) -> Dict[str, "torch.Tensor"]:
        """The selected tensors made in one call, as ``ptload.torch.load``
        makes a state dict's (DLPack views of a private map of the file, one
        torch storage per file storage): ``{name: tensor}`` for those it
        can make, empty where the per-tensor path is needed (a set or a
        rank, a URL, pread, numpy, a GPU device, a big-endian file)."""
        if (
            self._sel is not None
            or self._remote
            or self._pread
            or self._framework != "pt"
            or self._big
            or str(self._device) != "cpu"
            or not self._ckpt.is_mapped()
        ):
            return {}
        from ._storages import _from_dlpack

        made = self._ckpt.torch_tensors(_from_dlpack, self._path, True, True, flat=True)
        # Conj/neg bits and requires_grad are torch.load's; get_tensor
        # resolves the bits and gives plain tensors, as safetensors does.
        # Such a tensor goes through get_tensor, and so does every other
        # tensor of its storage, so that they keep sharing it.
        slow = {
            self._tensors[i].storage
            for i, t in enumerate(made)
            if t is None or t.requires_grad or t.is_conj() or t.is_neg()
        }
        return {
            name: made[i]
            for name, i in self._index.items()
            if self._tensors[i].storage not in slow
        }

    def _read_ahead(self) -> "Optional[_ReadAhead]":
        """For a URL or bucket object read to the host: the selected
        tensors' whole storages fetched ahead of ``get_tensor`` called in
        offset order, several requests in flight (``stop()`` it when
        done). None for a local file, and for a GPU device (its upload
        streams the storages itself)."""
        if not self._remote or str(self._device) not in ("cpu", "None"):
            return None
        if self._sel is not None:
            return self._sel.read_ahead()
        storages = [self._tensors[self._index[name]].storage for name in self.offset_keys()]
        return self._ckpt.read_ahead([s for s in storages if s is not None])

    def close(self) -> None:
        """Close the file kept open for reading storages (a legacy file's,
        or with ``backend="pread"``); tensors already made stay valid, and a
        later read opens it again. The end of a ``with`` block calls it."""
        if self._torch_storages is not None:
            self._torch_storages.close()

    def keys(self) -> List[str]:
        """The tensors' names, sorted (as safetensors gives them)."""
        return sorted(self._index)

    def offset_keys(self) -> List[str]:
        """The tensors' names in the file's order."""
        return list(self._index)

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, ``{name: tensor}`` in the file's order."""
        return {name: self.get_tensor(name) for name in self.offset_keys()}

    def metadata(self) -> Optional[Dict[str, str]]:
        """A safetensors file's ``__metadata__``, as safetensors gives it;
        ``{"format": "pt"}`` for a torch checkpoint (what transformers
        checks for)."""
        if self._sel is None and self._ckpt.format() == "safetensors":
            # None where the header has no __metadata__, as safetensors says.
            return dict(self._ckpt.safetensors_metadata()) or None
        return {"format": "pt"}

    def _info(self, name: str) -> "TensorRecord":
        try:
            return self._tensors[self._index[name]]
        except KeyError:
            raise KeyError(f"no tensor named {name!r}") from None

    def get_slice(self, name: str) -> "_Slice":
        self._info(name)
        return _Slice(self, name)

    def get_tensor(self, name: str) -> Any:
        placed = self._placed_tensor(name)
        if placed is not None:
            return placed
        view = self._view(name)
        if self._framework == "numpy" or self._uploaded(name):
            return view
        if self._device not in (None, "cpu") and str(self._device) != "cpu":
            return view.to(self._device)
        return view

    def _upload(self) -> None:
        """``load_file`` onto a GPU: the storages of every selected tensor
        are uploaded at once by ptload-device, as ``ptload.torch.load``
        uploads them; a set's tensors and a rank's slices are loaded by
        ptload-device file by file (a slice gathered from the map straight
        into its staging buffers). A tensor the pipeline could not place
        goes by ``Tensor.to`` in ``get_tensor``, as safetensors moves each
        one."""
        if self._framework != "pt" or self._torch_storages is not None or self._placed is not None:
            return
        import torch

        from ._storages import _cuda_ordinal, _Storages

        device = self._device
        if isinstance(device, int):
            device = torch.device("cuda", device)
        device = torch.device(device)
        if device.type != "cuda":
            return
        if self._sel is not None:
            self._placed = self._sel.upload(_cuda_ordinal(device))
            return
        # Storage numbers (the difference drops None).
        wanted = cast("Set[int]", {self._tensors[i].storage for i in self._index.values()} - {None})
        self._torch_storages = _Storages(
            self._ckpt, self._local_path(), None, device, False, only=wanted, remote=self._remote
        )

    def _placed_tensor(self, name: str) -> Optional["torch.Tensor"]:
        """``name`` on its GPU when :meth:`_upload` placed it there (a
        set's or a rank's tensor), else None."""
        if self._placed is None:
            return None
        info = self._info(name)
        index = self._index[name]
        from . import _storages

        capsule = self._placed.capsule(index)
        if capsule is not None:
            return _storages._from_dlpack(capsule)
        # A dtype DLPack has no code for: its bytes, viewed as torch's.
        raw = self._placed.raw(index)
        dtype = _storages._DTYPES.get(info.dtype)
        if raw is None or dtype is None:
            return None
        capsule, shape, stride = raw
        return _storages._from_dlpack(capsule).view(dtype).as_strided(shape, stride, 0)

    def _uploaded(self, name: str) -> bool:
        """Whether ``name``'s storage was uploaded by :meth:`_upload`."""
        storages = self._torch_storages
        if storages is None or storages.uploaded is None or self._sel is not None:
            return False
        storage = self._info(name).storage
        return storage is not None and storages.uploaded.on_device(storage)

    # A numpy array or a torch tensor, as the framework says (Any, as for
    # get_tensor: callers use either's methods).
    def _view(self, name: str) -> Any:
        info = self._info(name)
        index = self._index[name]
        if self._sel is not None:
            return self._copied(self._sel.tensor_bytes(index), info)
        if self._framework == "numpy":
            return self._numpy(index, info)
        return self._torch(index, info)

    def _copied(self, data: bytes, info: "TensorRecord") -> Any:
        """A set's or a rank's tensor: its row-major bytes, as an array."""
        dtype_name, shape = info.dtype, tuple(info.shape)
        if self._framework == "numpy":
            return _array_from_bytes(data, info)
        import torch

        from ._storages import _DTYPES

        dtype = _DTYPES.get(dtype_name)
        if dtype is None:
            raise Error(f"{info.name}: this torch has no dtype for {dtype_name}")
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape(shape)

    def _numpy(self, index: int, info: "TensorRecord") -> "npt.NDArray[Any]":
        import numpy as np

        shape, stride, offset, storage = info.shape, info.stride, info.offset, info.storage
        conj, neg, quant = info.conj, info.neg, info.quantization
        if info.dtype == "C32":
            return _array_from_bytes(self._ckpt.tensor_bytes(index), info)
        dtype = _array_dtype(info)
        size = dtype.itemsize
        buffer: Union[_mmap.mmap, bytearray, None] = self._map
        if storage is not None and self._pread and not (conj or neg) and quant is None:
            buffer, base = self._read_storage(storage)
        else:
            base = 0
        if storage is not None and buffer is not None and not (conj or neg) and quant is None:
            file_offset = self._storages[storage].file_offset
            little = sys.byteorder == "little" and (not self._big or size == 1)
            if file_offset is not None and little and (file_offset + offset * size) % size == 0:
                return np.ndarray(
                    tuple(shape),
                    dtype=dtype,
                    buffer=buffer,
                    offset=file_offset - base + offset * size,
                    strides=tuple(s * size for s in stride),
                )
        return _array_from_bytes(self._ckpt.tensor_bytes(index), info)

    def _read_storage(self, storage: int) -> Tuple[Optional[bytearray], int]:
        """``backend="pread"``: storage ``storage``'s bytes read from the
        file into memory of their own (once; arrays of it share them), and
        the file offset they start at. (None, 0) for a storage whose bytes
        are not in the file as they are (inflated)."""
        cache: Dict[int, Tuple[Optional[bytearray], int]] = self.__dict__.setdefault("_read", {})
        if storage not in cache:
            nbytes, file_offset = self._storages[storage].nbytes, self._storages[storage].file_offset
            if file_offset is None:
                cache[storage] = (None, 0)
            else:
                data = bytearray(nbytes)
                with open(self._path, "rb") as fh, memoryview(data) as view:
                    read_at(fh, file_offset, view, self._path)
                cache[storage] = (data, file_offset)
        return cache[storage]

    def _torch(self, index: int, info: "TensorRecord") -> "torch.Tensor":
        import torch

        from ._storages import _DTYPES, _Storages

        if self._torch_storages is None:
            # pread: each storage read into memory of its own; else views
            # of a private map.
            mmap = False if self._pread else None
            self._torch_storages = _Storages(
                self._ckpt, self._local_path(), mmap, "cpu", False, pread=self._pread,
                remote=self._remote,
            )
        shape, stride, offset, storage = info.shape, info.stride, info.offset, info.storage
        dtype = _DTYPES.get(info.dtype)
        if dtype is None:
            raise Error(f"{info.name}: this torch has no dtype for {info.dtype}")
        if storage is None:
            return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        t = self._torch_storages.tensor(storage, dtype, shape, stride, offset)
        if info.conj:
            t = t.conj().resolve_conj()
        if info.neg:
            t = t._neg_view().resolve_neg()
        return t
