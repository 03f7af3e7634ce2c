"""ptload.torch.load where code written for torch.load takes its paths:
torch's exceptions, weights_only=False, file objects, the default load
endianness, storages typed per reference, tensor attributes. Each case runs
torch.load on the same input and holds ptload to what torch did."""

import io
import mmap
import os
import pickle
import struct
import sys
import warnings
import zipfile

import pytest
import torch

import ptload
import ptload.torch
from conftest import fixture

warnings.filterwarnings("ignore", category=UserWarning)


def _torch_version():
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def torch_raises(source, **kwargs):
    """The exception torch.load raises on ``source`` (bytes)."""
    try:
        torch.load(io.BytesIO(source), **kwargs)
    except Exception as e:  # noqa: BLE001 - whatever torch raises is the answer
        return e
    raise AssertionError("torch.load accepted it")


def saved(obj, **kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    return buf.getvalue()


def legacy_with_py2_key(value):
    """A legacy checkpoint of ``{<key>: tensor}`` whose key is a Python 2
    str (SHORT_BINSTRING) of ``value`` bytes, as Python 2's torch wrote it."""
    data = saved({"k": torch.arange(3.0)}, _use_new_zipfile_serialization=False)
    key = b"X\x01\x00\x00\x00k"  # the key as Python 3 pickles it
    assert data.count(key) == 1
    return data.replace(key, b"U" + bytes([len(value)]) + value)


def sparse_with_bad_indices():
    """A sparse tensor whose saved indices break its invariants (as torch's
    test spoofs one): torch validates it on load and raises."""
    x = torch.zeros(3, 3)
    x[1][1] = 1
    x = x.to_sparse()

    class Spoof:
        def __reduce_ex__(self, proto):
            bad = x._indices().clone()
            bad[0][0] = 3
            return (torch._utils._rebuild_sparse_tensor, (x.layout, (bad, x._values(), x.size())))

    return saved({"s": Spoof()})


def truncated_zip():
    data = saved({"w": torch.ones(4)})
    return data[: len(data) - 30]


def bad_legacy_magic():
    data = bytearray(saved({"w": torch.ones(4)}, _use_new_zipfile_serialization=False))
    # The magic number is the first pickle's 10-byte long (\x8a\x0a ...).
    at = data.index(b"\x8a\x0a") + 2
    data[at] ^= 0xFF
    return bytes(data)


def _zip_entries(data):
    """``(name, local header offset, data start, size)`` of each entry of
    the zip ``data``, in the file's order."""
    out = []
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            at = info.header_offset
            name_len, extra_len = struct.unpack("<HH", data[at + 26 : at + 30])
            out.append((info.filename, at, at + 30 + name_len + extra_len, info.compress_size))
    return out


def _flipped(data, at):
    out = bytearray(data)
    out[at] ^= 0xFF
    return bytes(out)


def pickle_byte_flipped():
    """A byte flipped inside data.pkl's first string (a key): torch's
    unpickler fails on it; ptload's checksum of the record refuses it."""
    data = saved({"weight": torch.ones(4)})
    name, _, start, size = _zip_entries(data)[0]
    assert name.endswith("data.pkl")
    return _flipped(data, data.index(b"weight", start, start + size) + 2)


CASES = {
    "not a checkpoint": (b"data that is no checkpoint at all", {}),
    "plain text": (b"hello world, this is just text\n", {}),
    "plain text popping": (b"some plain text\n", {}),
    "zip cut short by 10 bytes": (saved({"w": torch.ones(4)})[:-10], {}),
    "byte flipped in data.pkl": (pickle_byte_flipped(), {}),
    "empty": (b"", {}),
    "truncated zip": (truncated_zip(), {}),
    "bad legacy magic number": (bad_legacy_magic(), {}),
    "invalid sparse tensor": (sparse_with_bad_indices(), {}),
    "weights-only refusal": (saved({"f": pickle.dumps}), {}),
    "python 2 str not ascii": (legacy_with_py2_key(b"\xe9t\xe9"), {"encoding": "ascii"}),
    "python 2 str not utf-8": (legacy_with_py2_key(b"\xe9t\xe9"), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_errors_are_what_torch_raises(case):
    """Whatever torch raises for an input, ptload's error is an instance of
    that class too (and a ptload.Error with its kind)."""
    source, kwargs = CASES[case]
    if case == "invalid sparse tensor" and _torch_version() < (2, 15):
        # ptload validates sparse tensors as the pinned torch does; older
        # versions (a GPU machine's image) load the spoofed tensor.
        pytest.skip(f"torch {torch.__version__} does not validate sparse tensors on load")
    theirs = torch_raises(source, **kwargs)
    with pytest.raises(ptload.Error) as info:
        ptload.torch.load(io.BytesIO(source), **kwargs)
    ours = info.value
    assert isinstance(ours, type(theirs)), (
        f"{case}: torch raises {type(theirs).__name__} ({theirs}); ptload's "
        f"{type(ours).__name__} is not one"
    )
    assert ours.kind and type(ours).__module__ == "ptload"


def _corruptions():
    """Every kind of record of both layouts damaged: a byte flipped in the
    middle of each zip entry and in its local header, the central
    directory and its end record, truncations; a byte flipped every few
    bytes of a legacy file (magic number, protocol, sys_info, the object
    pickle, the storage keys, storage data) and truncations."""
    zipped = saved({"w": torch.arange(6.0), "n": 3, "s": "text"})
    cases = {}
    for name, header, start, size in _zip_entries(zipped):
        cases[f"zip {name}: byte flipped"] = _flipped(zipped, start + size // 2)
        cases[f"zip {name}: local header"] = _flipped(zipped, header)
    cases["zip central directory"] = _flipped(zipped, zipped.rindex(b"PK\x01\x02"))
    cases["zip end record"] = _flipped(zipped, zipped.rindex(b"PK\x05\x06"))
    for cut in (1, 22, 100, len(zipped) // 2, len(zipped) - 10):
        cases[f"zip cut by {cut}"] = zipped[:-cut]
    legacy = saved({"w": torch.arange(6.0), "n": 3}, _use_new_zipfile_serialization=False)
    for at in range(0, len(legacy), 7):
        cases[f"legacy byte {at} flipped"] = _flipped(legacy, at)
    for cut in (1, 10, len(legacy) // 2, len(legacy) - 4):
        cases[f"legacy cut by {cut}"] = legacy[:-cut]
    return cases


CORRUPTIONS = _corruptions()
# Records torch parses and ptload does not need to read the tensors: torch
# fails on their damage; ptload reads the checkpoint intact (docs/python.md).
UNREAD_RECORDS = (".storage_alignment", "serialization_id")


def _outcome(load, data):
    try:
        return load(io.BytesIO(data)), None
    except Exception as e:  # noqa: BLE001 - the exception is the answer
        return None, e


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corruptions_raise_what_torch_raises(case):
    """For each damaged file, in this run: where torch raises, ptload
    raises a ptload.Error that is also torch's class; where torch loads,
    ptload loads the same values."""
    data = CORRUPTIONS[case]
    theirs, their_error = _outcome(torch.load, data)
    ours, our_error = _outcome(ptload.torch.load, data)
    if their_error is None:
        assert our_error is None, f"{case}: torch loads it; ptload raised {our_error!r}"
        assert list(ours) == list(theirs)
        for k, v in theirs.items():
            assert torch.equal(ours[k], v) if isinstance(v, torch.Tensor) else ours[k] == v
        return
    if our_error is None and any(r in case for r in UNREAD_RECORDS):
        assert torch.equal(ours["w"], torch.arange(6.0))
        return
    assert isinstance(our_error, ptload.Error), f"{case}: ptload loaded what torch refuses ({their_error!r})"
    assert isinstance(our_error, type(their_error)), (
        f"{case}: torch raises {type(their_error).__name__} ({their_error}); ptload's "
        f"{type(our_error).__name__} ({our_error}) is not one"
    )


def test_mmap_of_a_legacy_file_is_refused_as_torch_refuses_it(tmp_path):
    path = tmp_path / "legacy.pt"
    path.write_bytes(saved({"w": torch.ones(3)}, _use_new_zipfile_serialization=False))
    with pytest.raises(RuntimeError, match="mmap can only be used") as theirs:
        torch.load(path, mmap=True)
    with pytest.raises(ptload.Error, match="mmap can only be used") as ours:
        ptload.torch.load(path, mmap=True)
    assert isinstance(ours.value, type(theirs.value))
    assert torch.equal(ptload.torch.load(path)["w"], torch.ones(3))


def test_error_classes_read_and_pickle_as_before():
    """The widened classes keep their message as str() (KeyError would
    quote it) and survive pickling, as multiprocessing sends them."""
    with pytest.raises(ptload.Error) as info:
        ptload.torch.load(io.BytesIO(CASES["plain text"][0]))
    assert not str(info.value).startswith(("'", '"'))
    for case in ("plain text", "byte flipped in data.pkl"):
        with pytest.raises(ptload.Error) as info:
            ptload.torch.load(io.BytesIO(CASES[case][0]))
        again = pickle.loads(pickle.dumps(info.value))
        assert type(again) is type(info.value) and str(again) == str(info.value)


def test_invalid_objects_keep_torchs_words():
    """A sparse tensor torch refuses: torch's message, so tests matching
    it match ours."""
    with pytest.raises(RuntimeError, match="size is inconsistent with indices"):
        ptload.torch.load(io.BytesIO(CASES["invalid sparse tensor"][0]))


def test_python2_strings_decode_as_torch_decodes_them():
    data = legacy_with_py2_key(b"\xe9t\xe9")
    with pytest.raises(UnicodeDecodeError) as info:
        ptload.torch.load(io.BytesIO(data), encoding="ascii")
    assert info.value.encoding == "ascii"
    for encoding in ("latin1", "bytes"):
        theirs = torch.load(io.BytesIO(data), encoding=encoding)
        ours = ptload.torch.load(io.BytesIO(data), encoding=encoding)
        assert list(ours) == list(theirs)
        assert torch.equal(next(iter(ours.values())), next(iter(theirs.values())))
    ascii_key = legacy_with_py2_key(b"key")
    assert list(ptload.torch.load(io.BytesIO(ascii_key), encoding="ascii")) == ["key"]


def test_an_inert_module_explains_itself():
    """A whole-model pickle under weights_only=False: calling a method of
    its class says what the record is and what it offers, and its
    state_dict() is torch's."""
    with pytest.warns(UserWarning, match="ptload ran nothing"):
        model = ptload.torch.load(fixture("whole_module.pt"), weights_only=False)
    with pytest.raises(AttributeError) as info:
        model.eval()
    text = str(info.value)
    assert "'eval'" in text and "ptload.Inert record of __main__.WholeNet" in text
    assert ".state_dict()" in text and "load_state_dict" in text and "allow_globals" in text
    assert not hasattr(model, "__array_interface__")  # protocol probes stay plain
    from test_torch_load import expected_tensors, reachable_tensors

    assert expected_tensors("whole_module.pt") <= reachable_tensors(model.state_dict())


def test_numpy_objects_are_not_called_inert_in_the_warning():
    with pytest.warns(UserWarning) as record:
        out = ptload.torch.load(fixture("training.ckpt"), weights_only=False)
    text = " ".join(str(w.message) for w in record)
    assert "ptload ran nothing" in text and "numpy" in text
    assert "Inert records: numpy" not in text and "built from their data" in text
    assert type(out["best_acc"]).__module__ == "numpy"


@pytest.mark.parametrize("name", ["training.ckpt", "whole_module.pt", "training_rng.ckpt"])
def test_weights_only_false_runs_nothing_and_warns(name):
    """torch's full unpickler would import and call these files' globals;
    ptload's weights_only=False gives the tensors torch's full load gave
    (recorded by fixtures/generate.py) and the rest as inert records, with
    one warning naming them."""
    from test_torch_load import expected_tensors, reachable_tensors

    with pytest.warns(UserWarning, match="ptload ran nothing") as record:
        ours = ptload.torch.load(fixture(name), weights_only=False)
    assert len([w for w in record if "ptload ran nothing" in str(w.message)]) == 1
    assert expected_tensors(name) <= reachable_tensors(ours)
    assert expected_tensors(name)


@pytest.mark.parametrize("legacy", [True, False])
def test_objects_saved_one_after_another_load_in_turn(legacy):
    """A stream holding a pickle, a checkpoint, a pickle and another
    checkpoint: each load starts where the stream stands and leaves it just
    past the checkpoint, so the next object reads. torch does so for legacy
    files (and ptload stops where torch stops); for zip files torch's reader
    refuses the first checkpoint there, ptload reads them all."""
    a, b = torch.randn(5, 5), torch.arange(7)
    kwargs = {"_use_new_zipfile_serialization": False} if legacy else {}
    stream = io.BytesIO()
    pickle.dump(41, stream)
    torch.save(a, stream, **kwargs)
    pickle.dump(43, stream)
    torch.save({"b": b}, stream, **kwargs)
    ends = {}
    for loader in (torch.load, ptload.torch.load) if legacy else (ptload.torch.load,):
        stream.seek(0)
        got = [pickle.load(stream), loader(stream), pickle.load(stream)]
        ends[loader] = stream.tell()
        got.append(loader(stream))
        assert got[0] == 41 and got[2] == 43
        assert torch.equal(got[1], a) and torch.equal(got[3]["b"], b)
        assert stream.tell() == len(stream.getvalue())
    if legacy:
        assert ends[torch.load] == ends[ptload.torch.load]


def test_two_zip_archives_in_one_stream_give_the_first_as_torch_does():
    """Two zip checkpoints one after another, read from the start: torch
    gives the first; so does ptload (whose reader finds an archive from its
    directory at the end), never the second. A zip followed by other bytes
    loads, in both."""
    a = torch.randn(3)
    stream = io.BytesIO()
    torch.save(a, stream)
    torch.save({"b": torch.arange(2)}, stream)
    data = stream.getvalue()
    assert torch.equal(torch.load(io.BytesIO(data)), a)
    assert torch.equal(ptload.torch.load(io.BytesIO(data)), a)
    with ptload.safe_open(_write(data), framework="pt") as f:
        assert torch.equal(f.get_tensor(next(iter(f.keys()))), a)
    junk = saved(a) + b"trailing bytes"
    assert torch.equal(ptload.torch.load(io.BytesIO(junk)), torch.load(io.BytesIO(junk)))


def _write(data):
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".pt")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


class Tracked(io.BytesIO):
    """A stream that records which of its methods were called."""

    def __init__(self, data):
        super().__init__(data)
        self.calls = set()

    def readinto(self, view):
        self.calls.add("readinto")
        return super().readinto(view)

    def read(self, *args):
        self.calls.add("read")
        return super().read(*args)


def test_file_objects_are_read_with_readinto_and_must_seek():
    data = saved({"w": torch.arange(6.0)})
    stream = Tracked(data)
    assert torch.equal(ptload.torch.load(stream)["w"], torch.arange(6.0))
    assert "readinto" in stream.calls and "read" not in stream.calls

    class Unseekable:
        def __init__(self, data):
            self.read = io.BytesIO(data).read

    with pytest.raises(AttributeError, match="seekable"):
        torch.load(Unseekable(data))
    with pytest.raises(AttributeError, match="You can only torch.load from a file that is seekable"):
        ptload.torch.load(Unseekable(data))


def without_byteorder_record(data):
    """The archive rewritten without its byteorder record, as torch before
    1.12 wrote files (entries stored, so storages keep their bytes)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            if not info.filename.endswith("/byteorder"):
                dst.writestr(info.filename, src.read(info))
    return out.getvalue()


@pytest.mark.parametrize("setting", ["NATIVE", "LITTLE", "BIG", None])
def test_files_without_a_byteorder_record_follow_the_default_endianness(setting):
    """A zip checkpoint without a byteorder record is read in the order
    torch.serialization.set_default_load_endianness says, by torch and by
    ptload alike."""
    from torch.serialization import LoadEndianness, get_default_load_endianness, set_default_load_endianness

    values = {"d": torch.randn(3, dtype=torch.float64), "i": torch.arange(4, dtype=torch.int32)}
    data = without_byteorder_record(saved(values))
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert not any(n.endswith("byteorder") for n in z.namelist())
    before = get_default_load_endianness()
    try:
        set_default_load_endianness(getattr(LoadEndianness, setting) if setting else None)
        theirs = torch.load(io.BytesIO(data))
        ours = ptload.torch.load(io.BytesIO(data))
    finally:
        set_default_load_endianness(before)
    for k in values:
        assert torch.equal(ours[k], theirs[k]), k
    big = setting == "BIG" or (setting == "NATIVE" and sys.byteorder == "big")
    assert torch.equal(ours["i"], values["i"]) != big


def test_one_storage_saved_as_two_dtypes():
    """An empty untyped storage referenced as two dtypes (torch.save allows
    it when empty): each reference keeps its own dtype, as in torch."""
    for dtype, other in [(torch.float32, torch.float64), (torch.int8, torch.bool)]:
        a = torch.tensor([], dtype=dtype)
        s = torch.TypedStorage(wrap_storage=a.untyped_storage(), dtype=other, _internal=True)
        for objs in ([a, s], [s, a]):
            data = saved(objs)
            theirs = torch.load(io.BytesIO(data))
            ours = ptload.torch.load(io.BytesIO(data))
            assert [x.dtype for x in ours] == [x.dtype for x in theirs]


def test_tensor_attributes_are_set_as_torch_sets_them():
    """Python attributes on a tensor or a parameter (t.foo = ...) are saved
    as its state; torch sets them back, and so does ptload."""
    t = torch.zeros(3)
    t.foo, t.pi = "foo", 3.14
    p = torch.nn.Parameter(torch.ones(2))
    p.tag = {"layer": 3}
    data = saved({"t": t, "p": p})
    for weights_only in (True, False):
        ours = ptload.torch.load(io.BytesIO(data), weights_only=weights_only)
        theirs = torch.load(io.BytesIO(data), weights_only=weights_only)
        for k in ("t", "p"):
            assert type(ours[k]) is type(theirs[k])
            assert ours[k].__dict__ == theirs[k].__dict__ != {}


def test_shared_mmap_option_writes_through(tmp_path):
    """With torch's mmap option MAP_SHARED, writing to a tensor loaded with
    mmap=True writes the file (as torch's do); the default (private) never
    does."""
    from torch.serialization import get_default_mmap_options, set_default_mmap_options

    path = tmp_path / "sd.pt"
    torch.save({"w": torch.arange(4.0)}, path)
    before = get_default_mmap_options()
    ptload.torch.load(path, mmap=True)["w"][0] = 42
    assert torch.load(path)["w"][0] == 0
    try:
        set_default_mmap_options(mmap.MAP_SHARED)
        ptload.torch.load(path, mmap=True)["w"][0] = 42
    finally:
        set_default_mmap_options(before)
    assert torch.load(path)["w"][0] == 42
    assert os.path.getsize(path) > 0


def test_torchs_forcing_variables_are_read(monkeypatch, tmp_path):
    """TORCH_FORCE_WEIGHTS_ONLY_LOAD makes weights_only=False a refusal, in
    torch and in ptload; TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD makes an unset
    weights_only the full load (inert records in ptload)."""
    import argparse

    path = tmp_path / "ns.pt"
    torch.save({"args": argparse.Namespace(lr=0.5), "w": torch.ones(2)}, path)
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=False)
    with pytest.raises(pickle.UnpicklingError):
        ptload.torch.load(path, weights_only=False)
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    assert torch.load(path)["args"].lr == 0.5
    assert ptload.torch.load(path)["args"].lr == 0.5


class _TouchPayload:
    """Pickles as a call of ``Path.touch``, which protocol 2 writes as the
    result of ``getattr(pathlib.Path, "touch")``."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def test_a_call_of_a_call_is_recorded_as_one(tmp_path):
    """The record of ``getattr(Path, "touch")(p)`` says what was called (the
    result of the getattr call, in ``.callee``); nothing runs."""
    import pathlib

    marker = tmp_path / "marker"
    path = tmp_path / "payload.pt"
    torch.save({"x": _TouchPayload(str(marker))}, path)
    with pytest.warns(UserWarning, match="ptload ran nothing"):
        got = ptload.torch.load(path, weights_only=False)["x"]
    assert not marker.exists()
    assert isinstance(got, ptload.Inert) and got.callee is not None
    assert got.callee.path == "builtins.getattr" and got.callee.args[1] == "touch"
    assert got.args == (pathlib.Path(marker),) and "the result of" in repr(got)


def test_paths_come_back_as_pickle_gives_them(tmp_path):
    import pathlib

    path = tmp_path / "paths.pt"
    saved_paths = {"p": pathlib.Path("/data/x"), "pure": pathlib.PurePosixPath("a/b"), "w": pathlib.PureWindowsPath("C:/x")}
    torch.save(saved_paths, path)
    ours = ptload.torch.load(path, unknown="inert")
    theirs = torch.load(path, weights_only=False)
    for k in saved_paths:
        assert type(ours[k]) is type(theirs[k]) and ours[k] == theirs[k], k


@pytest.mark.parametrize("make", [
    lambda: torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1)),
    lambda: torch.nn.GRU(4, 3, num_layers=2),
    lambda: torch.nn.BatchNorm1d(5),
    lambda: torch.nn.ModuleDict({"a": torch.nn.Conv2d(1, 2, 3), "b": torch.nn.Embedding(4, 2)}),
])
def test_a_pickled_modules_record_gives_its_state_dict(make, tmp_path):
    """torch.save(model) pickles the module; ptload keeps it inert, and the
    record's state_dict() is the module's own, names, order and values."""
    torch.manual_seed(0)
    model = make()
    path = tmp_path / "model.pt"
    torch.save(model, path)
    with pytest.warns(UserWarning, match="ptload ran nothing"):
        record = ptload.torch.load(path, weights_only=False)
    assert isinstance(record, ptload.Inert)
    ours, theirs = record.state_dict(), model.state_dict()
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[k], theirs[k]) and not ours[k].requires_grad for k in theirs)
    with pytest.raises(TypeError, match="not a module"):
        ptload.Inert("x", "y").state_dict()


def test_a_module_of_a_class_defined_in_main_gives_torchs_state_dict():
    """whole_module.pt: a module whose class lives in the writer's
    __main__ (so torch itself cannot load it here); its record's
    state_dict() has the names and bytes torch's state_dict() had when
    fixtures/generate.py wrote the file, non-persistent buffers left out."""
    import json

    from conftest import EXPECTED
    from test_torch_load import reachable_tensors

    record = ptload.torch.load(fixture("whole_module.pt"), unknown="inert")
    ours = record.state_dict()
    with open(os.path.join(EXPECTED, "whole_module.pt.json")) as fh:
        expected = json.load(fh)["tensors"]
    assert list(ours) == [t["name"] for t in expected]
    for t in expected:
        assert reachable_tensors(ours[t["name"]]) == {(t["dtype"], tuple(t["shape"]), t["sha256"])}


def test_a_stream_read_to_its_end_says_so():
    """Objects saved one after another on one stream: each load reads the
    next, and the one after the last raises torch's EOFError, saying the
    stream was read to its end (not that the checkpoint is empty)."""
    buf = io.BytesIO()
    torch.save({"a": torch.ones(2)}, buf)
    torch.save({"b": torch.zeros(3)}, buf)
    buf.seek(0)
    assert torch.equal(ptload.torch.load(buf)["a"], torch.ones(2))
    assert torch.equal(ptload.torch.load(buf)["b"], torch.zeros(3))
    end = buf.tell()
    with pytest.raises(EOFError, match=f"nothing follows byte {end} of the stream") as info:
        ptload.torch.load(buf)
    assert isinstance(info.value, ptload.Error) and "empty" not in str(info.value)
    with pytest.raises(EOFError, match="the checkpoint is empty"):
        ptload.torch.load(io.BytesIO(b""))
