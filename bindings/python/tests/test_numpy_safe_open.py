"""ptload.numpy without torch, and safetensors' interface on .pt files."""

import json
import os
import subprocess
import sys
import warnings

import pytest

from conftest import EXPECTED, fixture, fixture_files

import ptload
import ptload.torch

warnings.filterwarnings("ignore", category=UserWarning)

NO_TORCH = r"""
import hashlib, json, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, Block())
import ptload, ptload.numpy
assert "torch" not in sys.modules
out = {}
for name in sys.argv[1:]:
    arrays = ptload.numpy.load_file(name, key="all", strip_prefix="none")
    out[name] = {k: [str(v.dtype), list(v.shape), hashlib.sha256(v.tobytes()).hexdigest(),
                     v.flags.writeable] for k, v in arrays.items()}
assert "torch" not in sys.modules
print(json.dumps(out))
"""

NUMPY_FILES = ["basic.pt", "dtypes.pt", "views.pt", "bigendian.pt", "conj_neg.pt", "legacy_views.pt"]

NUMPY_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu", "C64": "complex64",
    "C128": "complex128", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
    "U8": "uint8", "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
    # Packed float4 pairs: their bytes.
    "F4_E2M1_X2": "uint8",
}


def test_numpy_without_torch_equals_torch_answers():
    paths = [fixture(n) for n in NUMPY_FILES]
    run = subprocess.run([sys.executable, "-c", NO_TORCH, *paths], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    checked = 0
    for name, path in zip(NUMPY_FILES, paths):
        with open(os.path.join(EXPECTED, name + ".json")) as fh:
            expected = {t["name"]: t for t in json.load(fh)["tensors"]}
        for tname, (dtype, shape, digest, _writeable) in got[path].items():
            e = expected[tname]
            if e["dtype"] == "C32":
                # Widened to complex64: same shape, values checked below.
                assert dtype == "complex64" and shape == e["shape"], tname
                continue
            assert dtype == NUMPY_DTYPES[e["dtype"]], tname
            assert shape == e["shape"], tname
            assert digest == e["sha256"], f"{name}: {tname}"
            checked += 1
    assert checked > 40


def test_complex32_widens_exactly():
    import torch

    import ptload.numpy

    arrays = ptload.numpy.load_file(fixture("dtypes.pt"), key="all", strip_prefix="none")
    theirs = torch.load(fixture("dtypes.pt"), weights_only=True)
    names = [k for k, v in theirs.items() if isinstance(v, torch.Tensor) and v.dtype == torch.complex32]
    assert names
    for k in names:
        assert (arrays[k] == theirs[k].to(torch.complex64).numpy()).all()


def test_numpy_views_are_read_only_zero_copy():
    import numpy as np

    import ptload.numpy

    arrays = ptload.numpy.load_file(fixture("basic.pt"))
    w = arrays["0.weight"]
    assert not w.flags.writeable
    assert not w.flags.owndata  # a view of the map
    with pytest.raises(ValueError):
        w[0, 0] = 1.0
    assert isinstance(w, np.ndarray)


def test_safe_open_like_safetensors():
    import torch

    import ptload

    theirs = torch.load(fixture("basic.pt"), weights_only=True)
    with ptload.safe_open(fixture("basic.pt"), framework="pt") as f:
        assert f.offset_keys() == list(theirs.keys())
        assert f.keys() == sorted(theirs.keys())
        assert f.metadata() == {"format": "pt"}
        for k in f.keys():
            assert torch.equal(f.get_tensor(k), theirs[k])
        part = f.get_slice("0.weight")
        assert part.get_shape() == list(theirs["0.weight"].shape)
        assert part.get_dtype() == "F32"
        assert torch.equal(part[1:3, :2], theirs["0.weight"][1:3, :2])
    with ptload.safe_open(fixture("basic.pt"), framework="numpy") as f:
        import numpy as np

        assert np.array_equal(f.get_slice("0.weight")[2:], theirs["0.weight"][2:].numpy())


def test_load_file_selects_and_warns_like_the_cli():
    import torch

    import ptload.torch

    with pytest.warns(UserWarning):
        sd = ptload.torch.load_file(fixture("training.ckpt"))
    full = torch.load(fixture("training.ckpt"), weights_only=False)["model_state_dict"]
    assert list(sd) == list(full)
    for k in sd:
        assert torch.equal(sd[k], full[k])
    with pytest.warns(UserWarning):
        stripped = ptload.torch.load_file(fixture("dataparallel.pt"))
    assert all(not k.startswith("module.") for k in stripped)


def test_automatic_choices_warn_only_when_they_change_something():
    """hf_lm.pt: "model" holds tensors, so does a top-level entry that is
    not training state; the whole file is taken, which changes nothing, so
    nothing is said (taking "model" alone would drop lm_head). A training
    checkpoint's model is taken and said, in this API's terms, at the
    caller's line."""
    import warnings

    from ptload.numpy import load_file

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        whole = load_file(fixture("hf_lm.pt"))
        assert list(whole) == list(load_file(fixture("hf_lm.pt"), key=None))
        model = load_file(fixture("hf_lm.pt"), key="model")  # asked for: not said
    assert 0 < len(model) < len(whole)
    with pytest.warns(UserWarning) as caught:
        load_file(fixture("training.ckpt"))
    assert [w.filename for w in caught] == [__file__]
    text = str(caught[0].message)
    assert '"model_state_dict": a training checkpoint\'s model' in text, text
    assert "KeySelect" not in text, text


def test_the_readers_advice_is_put_in_python_terms():
    from ptload._io import open_checkpoint

    _, said = open_checkpoint(fixture("hf_lm.pt"), objects=False).select("auto", "auto", [], [])
    assert said == [("whole_file", 'key auto: the whole file: "model" holds tensors, but so does '
                     'lm_head, which is not training state; to take only "model", '
                     'pass key="model"')], said


def test_one_include_or_exclude_pattern_may_be_a_string():
    from ptload.numpy import load_file

    path = fixture("llama_tiny.pt")
    every = load_file(path, key=None)
    assert list(load_file(path, key=None, include="lm_head.weight")) == ["lm_head.weight"]
    rest = load_file(path, key=None, exclude="lm_head.weight")
    assert len(rest) == len(every) - 1 and "lm_head.weight" not in rest
    q = load_file(path, key=None, include="*.q_proj.*")
    assert q and all(".q_proj." in k for k in q)


def test_key_orders_and_get_tensors_follow_safetensors():
    """keys() sorted, offset_keys() in the file's order, get_tensors() and
    load_file in the file's order, as safetensors gives them."""
    import numpy as np

    import ptload

    path = fixture("llama_tiny.pt")
    with ptload.safe_open(path, framework="numpy", key=None, backend="pread") as f:
        order = f.offset_keys()
        assert f.keys() == sorted(order) and order != sorted(order)
        every = f.get_tensors()
    assert list(every) == order
    from ptload.numpy import load_file

    loaded = load_file(path, key=None, backend="mmap")
    assert list(loaded) == order
    assert all(np.array_equal(loaded[k], every[k]) for k in order)
    with pytest.raises(ValueError, match="backend"):
        ptload.safe_open(path, backend="gpu")


def test_what_is_said_of_the_automatic_choices():
    from ptload._io import open_checkpoint
    from ptload._safe import _changed

    ckpt = open_checkpoint(fixture("training.ckpt"), objects=False)
    _, said = ckpt.select("auto", "auto", [], [])
    assert [kind for kind, _ in said] == ["key", "left_out"], said
    assert said[1][1] == 'left out 27 tensors outside "model_state_dict" (optimizer_state_dict: 27)'
    _, named = ckpt.select("model_state_dict", "auto", [], ["*.bias"])
    assert [kind for kind, _ in named] == ["left_out", "filtered"], named
    _, stripped = open_checkpoint(fixture("dataparallel.pt"), objects=False).select(
        "auto", "auto", [], [])
    assert ("stripped", 'strip_prefix auto: removed "module." from every name') in stripped
    assert not _changed("whole_file", "auto", "auto")
    assert _changed("key", "auto", "auto") and _changed("key", "auto", "none")
    assert _changed("left_out", "auto", "auto") and not _changed("left_out", "model", "auto")
    assert not _changed("filtered", "auto", "auto")
    assert _changed("stripped", None, "auto") and not _changed("stripped", "auto", "module.")


def test_the_pread_backend_reads_each_storage_into_memory_of_its_own(tmp_path):
    """backend="pread": the tensors and arrays equal torch's, share a
    storage as the file's tensors do, and stay as they were when the file
    is overwritten afterwards (no map behind them)."""
    import shutil

    import numpy as np
    import torch

    import ptload

    path = tmp_path / "views.pt"
    shutil.copy(fixture("views.pt"), path)
    theirs = torch.load(path, weights_only=True)
    for framework in ("pt", "numpy"):
        with ptload.safe_open(path, framework=framework, key=None, backend="pread") as f:
            got = {k: f.get_tensor(k) for k in f.offset_keys()}
        for k, t in theirs.items():
            ours = got[k] if framework == "pt" else torch.from_numpy(np.ascontiguousarray(got[k]))
            assert torch.equal(ours, t), (framework, k)
        if framework == "pt":
            ptrs = {k: v.untyped_storage().data_ptr() for k, v in got.items()}
            shared = {k: t.untyped_storage().data_ptr() for k, t in theirs.items()}
            for a in theirs:
                for b in theirs:
                    assert (ptrs[a] == ptrs[b]) == (shared[a] == shared[b]), (a, b)
        with open(path, "r+b") as fh:
            size = fh.seek(0, 2)
            fh.seek(0)
            fh.write(b"\0" * size)
        for k, t in theirs.items():
            ours = got[k] if framework == "pt" else torch.from_numpy(np.ascontiguousarray(got[k]))
            assert torch.equal(ours, t), (framework, k, "changed with the file")
        shutil.copy(fixture("views.pt"), path)


@pytest.mark.parametrize("name", ["legacy.pt", "legacy_views.pt"])
def test_legacy_files_are_closed_after_use(name):
    """load_file and safe_open (with or without ``with``) leave no file
    open: no ResourceWarning under -X dev -W error."""
    code = (
        "import gc, ptload, ptload.torch\n"
        f"p = {fixture(name)!r}\n"
        "ptload.torch.load_file(p)\n"
        "with ptload.safe_open(p, 'pt') as f:\n"
        "    [f.get_tensor(k) for k in f.keys()]\n"
        "f = ptload.safe_open(p, 'pt', backend='pread')\n"
        "[f.get_tensor(k) for k in f.keys()]\n"
        "del f\n"
        "gc.collect()\n"
    )
    run = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error::ResourceWarning", "-c", code],
        capture_output=True, text=True,
    )
    assert run.returncode == 0 and "ResourceWarning" not in run.stderr, run.stderr


def _readable(name):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ptload.safe_open(fixture(name), "pt", key="all", strip_prefix="none")
        return True
    except ptload.Error:
        return False


@pytest.mark.parametrize("name", [n for n in fixture_files() if _readable(n)])
def test_load_file_made_at_once_equals_tensor_by_tensor(name):
    """load_file makes a file's tensors in one call where it can; each is
    what safe_open's get_tensor gives (values, dtype, shape, strides, no
    grad, bits resolved), and tensors of one storage share it."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = ptload.torch.load_file(fixture(name), key="all", strip_prefix="none")
        with ptload.safe_open(fixture(name), "pt", key="all", strip_prefix="none") as f:
            one_by_one = {k: f.get_tensor(k) for k in f.offset_keys()}
    assert list(whole) == list(one_by_one)
    for k, want in one_by_one.items():
        got = whole[k]
        assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride()), k
        assert not got.requires_grad and not got.is_conj() and not got.is_neg(), k
        if want.device.type != "meta" and not want.is_quantized:
            # Bytes, not values: NaNs in random data compare equal this way.
            raw = lambda t: t.reshape(-1).contiguous().view(torch.uint8)  # noqa: E731
            assert torch.equal(raw(got), raw(want)), k
    shared = {}
    for k, want in one_by_one.items():
        if want.device.type == "cpu" and want.numel():
            shared.setdefault(want.untyped_storage().data_ptr(), []).append(k)
    for names in shared.values():
        ptrs = {whole[k].untyped_storage().data_ptr() for k in names}
        assert len(ptrs) == 1, names


def test_load_file_says_when_auto_is_unsure():
    """Where --key auto is unsure (two models, or tensors under no key it
    knows), load_file's warning says so and names the key= to pass."""
    with pytest.warns(UserWarning, match=r'unsure which model.*pass key="model_ema"'):
        sd = ptload.torch.load_file(fixture("model_ema.pth"))
    assert sd and not any(k.startswith(("optimizer", "model_ema")) for k in sd)
    with pytest.warns(UserWarning, match=r"unsure where the model is.*student, teacher.*key="):
        ptload.torch.load_file(fixture("dino.pth"))
    with pytest.warns(UserWarning, match=r'"model_state"'):
        sd = ptload.torch.load_file(fixture("resemblyzer.pt"))
    assert not any(k.startswith("optimizer") for k in sd)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ptload.torch.load_file(fixture("dino.pth"), key="student", strip_prefix=None)  # asked for: not said


def test_load_file_keeps_a_storage_shared_when_one_of_its_tensors_is_made_apart(tmp_path):
    """A tensor made through get_tensor (here: one saved with
    requires_grad) keeps sharing its storage with the others of it."""
    import torch

    base = torch.arange(8.0, requires_grad=True)
    path = tmp_path / "tied.pt"
    torch.save({"a": base, "b": base.detach()[2:6], "p": base.detach().view(2, 4)}, path)
    sd = ptload.torch.load_file(path, key="all", strip_prefix="none")
    with ptload.safe_open(path, "pt", key="all", strip_prefix="none") as f:
        one_by_one = {k: f.get_tensor(k) for k in f.offset_keys()}
    ptrs = lambda d: {k: v.untyped_storage().data_ptr() for k, v in d.items()}  # noqa: E731
    same = lambda d: {frozenset(k for k in d if d[k] == p) for p in d.values()}  # noqa: E731
    assert same(ptrs(sd)) == same(ptrs(one_by_one))
    assert not any(t.requires_grad for t in sd.values())
