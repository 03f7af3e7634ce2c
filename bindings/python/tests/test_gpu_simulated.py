"""GPU placement on the simulated CUDA driver (simcuda/, run by .ci/run).

Storages bound for GPUs are uploaded together by ptload-device and handed
to torch as DLPack capsules of device memory. torch cannot see the
simulated driver, so here torch's consumer is replaced by one that reads
each capsule's view back through the driver and makes a CPU tensor of the
same dtype, shape and strides; everything else (the placement decisions,
the upload, the capsules, building the object) is the real path. torch's
own consumption of a device capsule runs only on a real GPU.
"""

import os
import warnings

import pytest
import torch

import ptload._storages
import ptload.torch
import served
from conftest import fixture
from ptload import _ptload
from test_torch_load import assert_same_object

pytestmark = pytest.mark.skipif(
    os.environ.get("SIMCUDA_EXPECTED") != "1",
    reason="needs the simulated CUDA driver: .ci/run runs these with "
    "LD_LIBRARY_PATH=simcuda/target/release SIMCUDA_EXPECTED=1",
)

_DL = {
    (2, 64): torch.float64, (2, 32): torch.float32, (2, 16): torch.float16,
    (4, 16): torch.bfloat16, (5, 64): torch.complex64, (5, 128): torch.complex128,
    (0, 8): torch.int8, (0, 16): torch.int16, (0, 32): torch.int32,
    (0, 64): torch.int64, (1, 8): torch.uint8, (6, 8): torch.bool,
}


class Consumer:
    """Stands in for ``torch._C._from_dlpack``: host capsules go to torch;
    device capsules are read back and recorded (device, bytes)."""

    def __init__(self):
        self.devices = []
        self.real = torch._C._from_dlpack

    def __call__(self, capsule):
        (kind, ordinal), (code, bits, lanes), shape, strides, data = _ptload.describe_capsule(capsule)
        if kind == 1:
            return self.real(capsule)
        assert kind == 2, kind
        assert lanes == 1
        self.devices.append(ordinal)
        dtype = _DL[(code, bits)]
        if data:
            base = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype)
        else:
            base = torch.empty((0,), dtype=dtype)
        return base.as_strided(shape, strides, 0)


@pytest.fixture
def gpus(monkeypatch):
    """The simulated devices, visible to ptload.torch as torch's; the
    consumer that records what landed on them."""
    count = _ptload.cuda_device_count()
    assert count >= 1, "the simulated driver was not loaded"
    consumer = Consumer()
    for module in (ptload.torch, ptload._storages):
        monkeypatch.setattr(module, "_cuda_count", lambda: count)
        monkeypatch.setattr(module, "_from_dlpack", consumer)
    consumer.count = count
    return consumer


def torch_cpu(name):
    return torch.load(fixture(name), weights_only=True, map_location="cpu")


@pytest.mark.parametrize(
    "name",
    ["multi_gpu.pt", "views.pt", "dtypes.pt", "bigendian.pt", "conj_neg.pt",
     "quantized.pt", "sparse.pt", "parameter_state.pt", "llama_tiny.pt", "legacy.pt",
     "st_dtypes.safetensors"],
)
def test_every_storage_goes_to_the_gpu_and_reads_back_as_torch(gpus, name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback
        ours = ptload.torch.load(fixture(name), map_location="cuda:0")
    assert_same_object(ours, torch_cpu(name))
    ckpt = _ptload.open(fixture(name))
    storages = [s for s in ckpt.storages() if s.nbytes > 0]
    # Every storage that holds bytes became (at least) one device capsule.
    assert len(gpus.devices) >= len(storages) > 0
    assert set(gpus.devices) == {0}


def test_storages_go_where_they_were_saved(gpus):
    """map_location=None: multi_gpu.pt was saved on cuda:0..cuda:3; each
    storage lands on its device, or stays on the host saying why."""
    ckpt = _ptload.open(fixture("multi_gpu.pt"))
    locations = [s.location for s in ckpt.storages() if s.nbytes]
    saved = [int(loc.split(":")[1]) for loc in locations if loc.startswith("cuda:")]
    assert len(set(saved)) == 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = ptload.torch.load(fixture("multi_gpu.pt"))
    assert_same_object(ours, torch_cpu("multi_gpu.pt"))
    on_gpu = sorted(o for o in saved if o < gpus.count)
    assert sorted(gpus.devices) == on_gpu
    missing = [o for o in saved if o >= gpus.count]
    texts = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if missing:
        assert len(texts) == 1, texts
        assert f"only {gpus.count} CUDA device(s) are visible" in texts[0]
    else:
        assert texts == []


def test_a_dict_moves_one_device_to_another(gpus):
    ours = ptload.torch.load(
        fixture("multi_gpu.pt"), map_location={f"cuda:{i}": "cuda:0" for i in range(4)}
    )
    assert_same_object(ours, torch_cpu("multi_gpu.pt"))
    assert gpus.devices and set(gpus.devices) == {0}


def test_tutorial_mapper_splits_by_size(gpus):
    """A size threshold: big storages to the GPU, small ones on the CPU."""
    ckpt = _ptload.open(fixture("llama_tiny.pt"))
    sizes = [s.nbytes for s in ckpt.storages()]
    limit = sorted(sizes)[len(sizes) // 2]

    def mapper(storage, location):
        return storage.cuda(0) if storage.nbytes() > limit else "cpu"

    ours = ptload.torch.load(fixture("llama_tiny.pt"), map_location=mapper)
    assert_same_object(ours, torch_cpu("llama_tiny.pt"))
    big = [n for n in sizes if n > limit]
    assert len(gpus.devices) == len(big) > 0


def test_a_missing_device_is_an_error_when_strict(gpus):
    with pytest.raises(ptload.Error, match=f"cuda:{gpus.count}"):
        ptload.torch.load(fixture("views.pt"), map_location=f"cuda:{gpus.count}", strict=True)
    with pytest.warns(RuntimeWarning, match="CUDA device"):
        ours = ptload.torch.load(fixture("views.pt"), map_location=f"cuda:{gpus.count}")
    assert_same_object(ours, torch_cpu("views.pt"))
    assert gpus.devices == []


@pytest.mark.skipif(
    "SIMCUDA_MEMORY" not in os.environ,
    reason="needs a small simulated device (.ci/run sets SIMCUDA_MEMORY)",
)
def test_a_full_gpu_keeps_storages_on_the_host(gpus):
    """multi_gpu.pt holds more than the device: what does not fit stays on
    the host with ptload-device's reason; strict raises."""
    with pytest.warns(RuntimeWarning, match="out of memory on cuda:0"):
        ours = ptload.torch.load(fixture("multi_gpu.pt"), map_location="cuda:0")
    assert_same_object(ours, torch_cpu("multi_gpu.pt"))
    with pytest.raises(ptload.Error, match="out of memory"):
        ptload.torch.load(fixture("multi_gpu.pt"), map_location="cuda:0", strict=True)


def test_an_exception_while_uploading_comes_out_of_the_call(gpus):
    """An exception raised while Python waits for an upload (here by the
    progress callback; a Ctrl-C comes from the signal check beside it)
    comes out of the call and tells the upload to stop (ptload-device's
    ``LoadOptions::cancel``, whose stopping mid-file and freeing are tested
    in Rust); the device is usable again at once."""
    ckpt = _ptload.open(fixture("many_tensors.pt"))
    targets = [(i, 0) for i, s in enumerate(ckpt.storages()) if s.nbytes > 0]

    def stop(done):
        raise KeyError(f"stopped at {done} bytes")

    with pytest.raises(KeyError, match="stopped at"):
        ckpt.upload(targets, stop)
    uploaded = ckpt.upload(targets)
    assert uploaded.fallbacks() == []
    assert all(uploaded.on_device(i) for i, _ in targets)


@pytest.mark.parametrize(
    "name", ["llama_tiny.pt", "views.pt", "dtypes.pt", "bigendian.pt", "st_dtypes.safetensors"]
)
def test_load_file_onto_a_gpu_uploads_through_the_pipeline(gpus, name):
    """safetensors' ``load_file(path, device="cuda:0")`` on a ``.pt`` file:
    the selected tensors' storages are uploaded at once by ptload-device
    (one device capsule per storage, none moved by ``Tensor.to``), and the
    tensors equal the CPU load's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # what key="auto" chose
        ours = ptload.torch.load_file(fixture(name), device="cuda:0")
        want = ptload.torch.load_file(fixture(name))
    assert list(ours) == list(want) and want
    assert_same_object(ours, want)
    ckpt = _ptload.open(fixture(name))
    storages = {t.storage for t in ckpt.tensors() if t.storage is not None}
    holding = {i for i in storages if ckpt.storages()[i].nbytes > 0}
    assert 0 < len(holding) <= len(gpus.devices) <= len(storages)
    assert set(gpus.devices) == {0}


@pytest.mark.skipif(not served.NGINX, reason=served.WHY_NOT)
@pytest.mark.parametrize("name", ["llama_tiny.pt", "legacy.pt", "bigendian.pt"])
def test_a_url_uploads_through_the_pipeline(gpus, name):
    """A checkpoint at a URL, read by ranged requests: ptload-device
    uploads its storages from the bytes the reader fetches, as from a
    local file's."""
    server = served.Nginx()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no fallback
            ours = ptload.torch.load(server.url(f"files/{name}"), map_location="cuda:0")
    finally:
        server.stop()
    assert_same_object(ours, torch_cpu(name))
    ckpt = _ptload.open(fixture(name))
    storages = [s for s in ckpt.storages() if s.nbytes > 0]
    assert len(gpus.devices) >= len(storages) > 0
    assert set(gpus.devices) == {0}


@pytest.mark.parametrize("world", [2, 3])
def test_a_ranks_slices_go_to_the_gpu_through_the_pipeline(gpus, world):
    """``load_file`` of a sharded set with ``shard=(rank, world)`` onto
    cuda:0: ptload-device loads each file (a rank's slices gathered from
    the map straight into its staging buffers), and every tensor arrives
    as a device capsule of its own, none moved by ``Tensor.to`` (which
    would fail here: torch sees no GPU), equal to torch's
    ``tensor_split`` of the whole tensor."""
    theirs = torch_cpu("llama_tiny.pt")
    dims = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 0,
            "up_proj": 0, "down_proj": 1}
    rules = [f"*.{k}.weight={d}" for k, d in dims.items()]
    sharded = fixture("llama_tiny_sharded")
    for rank in range(world):
        before = len(gpus.devices)
        ours = ptload.torch.load_file(sharded, device="cuda:0", key="all",
                                      shard=(rank, world), splits=rules)
        assert list(ours) == list(theirs)
        assert len(gpus.devices) - before == len(ours)
        assert set(gpus.devices) == {0}
        sliced = 0
        for name, t in theirs.items():
            part = name.split(".")[-2]
            if name.endswith(".weight") and part in dims:
                t = torch.tensor_split(t, world, dims[part])[rank]
                sliced += 1
            assert ours[name].shape == t.shape and torch.equal(ours[name], t), name
        assert sliced >= 7


def test_a_selection_of_every_dtype_goes_to_the_gpu_once(gpus):
    """Through the selection path (``shard=(0, 1)``), every dtype of
    dtypes.pt lands on cuda:0 as one capsule per tensor: typed where DLPack
    has a code for the dtype, bytes viewed as torch's dtype where it has
    none (float8, unsigned 16 to 64 bits); none is moved by ``Tensor.to``
    (which would fail here) or uploaded twice."""
    want = ptload.torch.load_file(fixture("dtypes.pt"), key="all")
    before = len(gpus.devices)
    ours = ptload.torch.load_file(fixture("dtypes.pt"), device="cuda:0", key="all", shard=(0, 1))
    assert list(ours) == list(want) and want
    assert len(gpus.devices) - before == len(ours)
    for name, t in want.items():
        assert ours[name].dtype == t.dtype and ours[name].shape == t.shape, name
        raw = lambda x: x.reshape(-1).contiguous().view(torch.uint8)  # noqa: E731
        assert torch.equal(raw(ours[name]), raw(t)), name


def test_staging_is_pinned_by_the_first_load_and_kept_until_released(gpus):
    ptload.release_staging()
    want = torch_cpu("llama_wide.pt")
    for _ in range(3):
        assert_same_object(ptload.torch.load(fixture("llama_wide.pt"), map_location="cuda:0"), want)
    # The first load pinned the staging; the others reused it.
    kept = ptload.release_staging()
    assert kept > 0
    assert ptload.release_staging() == 0
    assert_same_object(ptload.torch.load(fixture("llama_wide.pt"), map_location="cuda:0"), want)
    assert ptload.release_staging() == kept
