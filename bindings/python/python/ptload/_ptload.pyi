"""Type stubs of the Rust extension (see src/lib.rs)."""

from os import PathLike
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union, final

__all__ = [
    "Error",
    "MAX_EXPANDED_VIEW_BYTES",
    "ERROR_KINDS",
    "Checkpoint",
    "TensorRecord",
    "QuantRecord",
    "StorageRecord",
    "GlobalRecord",
    "WarningRecord",
    "ReadAhead",
    "Selection",
    "Uploaded",
    "PlacedTensors",
    "cuda_device_count",
    "release_staging",
    "fallback_text",
    "global_allowed",
    "describe_capsule",
    "open",
    "is_url",
    "parse_place",
    "parse_device",
    "parse_budget",
    "module_blocked",
    "select",
]

class Error(Exception):
    @property
    def message(self) -> Any: ...
    kind: str
    offset: Optional[int]
    record: Optional[str]
    tensor: Optional[str]
    file: Optional[str]
    hint: Optional[str]

@final
class QuantRecord:
    per: str
    kind: str
    scheme: str
    scale: Optional[float]
    zero_point: Optional[int]
    axis: Optional[int]
    values_shape: Optional[List[int]]

@final
class TensorRecord:
    name: str
    dtype: str
    shape: List[int]
    stride: List[int]
    offset: int
    storage: Optional[int]
    requires_grad: bool
    conj: bool
    neg: bool
    quantization: Optional[QuantRecord]

@final
class StorageRecord:
    key: str
    location: str
    dtype: str
    numel: int
    nbytes: int
    file_offset: Optional[int]

@final
class GlobalRecord:
    module: str
    name: str
    torch_allowed: bool
    called: bool
    instantiated: bool
    record: str
    offset: int

@final
class WarningRecord:
    kind: str
    message: str
    def __str__(self) -> str: ...
    def __repr__(self) -> str: ...

@final
class ReadAhead:
    def stop(self) -> None: ...

@final
class Checkpoint:
    def format(self) -> str: ...
    def safetensors_metadata(self) -> List[Tuple[str, str]]: ...
    def byte_order(self) -> str: ...
    def is_mapped(self) -> bool: ...
    def refused_globals(self, allowed: List[str]) -> List[str]: ...
    def globals(self) -> List[GlobalRecord]: ...
    def read_ahead(self, storages: List[int]) -> ReadAhead: ...
    def warnings(self) -> List[WarningRecord]: ...
    def storages(self) -> List[StorageRecord]: ...
    def storage_names(self) -> List[List[str]]: ...
    def placement(
        self,
        place: Sequence[Tuple[str, str]] = ...,
        budget: Optional[Sequence[Tuple[int, int]]] = ...,
        balance: Optional[int] = ...,
    ) -> List[Optional[str]]: ...
    def end_offset(self) -> int: ...
    def off_host(self) -> List[Tuple[int, str]]: ...
    def storage_bytes(self, index: int, swap_unit: int) -> bytearray: ...
    def objects(self) -> Tuple[int, List[Tuple[Any, ...]], List[TensorRecord]]: ...
    def tensors(self) -> List[TensorRecord]: ...
    def select(
        self, key: str = ..., strip: str = ..., include: Sequence[str] = ..., exclude: Sequence[str] = ...
    ) -> Tuple[List[Tuple[str, int]], List[Tuple[str, str]]]: ...
    def tensor_bytes(self, index: int, objects: bool = ...) -> bytes: ...
    def torch_tensors(
        self,
        from_dlpack: Any,
        source: Union[str, bytes, bytearray],
        mmap: bool,
        on_cpu: Union[None, bool, Sequence[bool]],
        uploaded: Optional[Uploaded] = ...,
        progress: Optional[Callable[[int], Any]] = ...,
        shared: bool = ...,
        host: bool = ...,
        flat: bool = ...,
    ) -> List[Any]: ...
    def upload(
        self, targets: Sequence[Tuple[int, int]], progress: Optional[Callable[[int], Any]] = ...
    ) -> Uploaded: ...
    def build_plain(self, made: List[Any], set_state: Any) -> Optional[Tuple[Any]]: ...

@final
class Uploaded:
    def fallbacks(self) -> List[Tuple[int, str]]: ...
    def on_device(self, index: int) -> bool: ...
    def capsule(self, index: int) -> Any: ...

@final
class Selection:
    def decisions(self) -> List[Tuple[str, str]]: ...
    def files(self) -> List[str]: ...
    def tensors(self) -> List[TensorRecord]: ...
    def tensor_bytes(self, index: int) -> bytes: ...
    def read_ahead(self) -> ReadAhead: ...
    def upload(
        self, ordinal: int, progress: Optional[Callable[[int], Any]] = ...
    ) -> PlacedTensors: ...

@final
class PlacedTensors:
    def capsule(self, index: int) -> Any: ...
    def raw(self, index: int) -> Optional[Tuple[Any, List[int], List[int]]]: ...
    def fallbacks(self) -> List[Tuple[int, str]]: ...

def select(
    path: Union[str, PathLike],
    *,
    key: str = ...,
    strip: str = ...,
    include: Sequence[str] = ...,
    exclude: Sequence[str] = ...,
    shard: Optional[Tuple[int, int]] = ...,
    splits: Sequence[str] = ...,
    preset: Optional[str] = ...,
    rank_files: Optional[str] = ...,
) -> Selection: ...

def open(
    source: Union[str, bytes, bytearray, PathLike],
    *,
    objects: bool = ...,
    in_memory: bool = ...,
    encoding: Optional[str] = ...,
    byte_order: Optional[str] = ...,
    refuse_at: Optional[str] = ...,
) -> Checkpoint: ...

def is_url(path: str) -> bool: ...
def parse_place(lists: List[str]) -> List[Tuple[str, str]]: ...
def parse_device(text: str) -> str: ...
def parse_budget(text: str) -> Tuple[str, float, int]: ...
def cuda_device_count() -> int: ...
def release_staging() -> int: ...
def describe_capsule(
    capsule: Any,
) -> Tuple[Tuple[int, int], Tuple[int, int, int], List[int], List[int], bytes]: ...

MAX_EXPANDED_VIEW_BYTES: int
ERROR_KINDS: List[str]

def module_blocked(module: str) -> bool: ...
def global_allowed(allowed: List[str], module: str, name: str) -> bool: ...
def fallback_text(ordinal: int, visible: int, out_of_memory: bool = ...) -> str: ...
