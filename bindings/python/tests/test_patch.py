"""ptload.patch(): torch.load becomes ptload's for real libraries.

transformers' ``from_pretrained`` on ``.bin`` checkpoints (one file and a
sharded set) and Lightning's ``load_from_checkpoint`` on a checkpoint a
real ``Trainer`` wrote, with a spy on ``ptload.torch.load`` proving it did
the loading; a checkpoint whose pickle would touch a marker file, which
ptload never creates while torch's own ``weights_only=False`` does; and
``patch``/``unpatch`` putting torch's function back exactly.

diffusers' ``from_pretrained`` on a ``.bin`` model and its state-dict
reader on a ``.ckpt`` too. transformers, Lightning and diffusers are
required: a missing one fails its tests (CI installs them); nothing here
is skipped.
"""

import argparse
import collections
import importlib
import inspect
import io
import json
import logging
import os
import pathlib
import pickle
import subprocess
import sys
import warnings

import pytest
import torch

import ptload
import ptload.torch

TORCH_LOAD = torch.load


def need(module):
    """Import ``module``; missing, the test fails (it is never skipped)."""
    return importlib.import_module(module)


@pytest.fixture(autouse=True)
def _unpatched():
    """Every test starts and ends with torch's own torch.load."""
    ptload.unpatch()
    assert torch.load is TORCH_LOAD and torch.serialization.load is TORCH_LOAD
    yield
    ptload.unpatch()
    assert torch.load is TORCH_LOAD and torch.serialization.load is TORCH_LOAD


@pytest.fixture
def spy(monkeypatch):
    """The files ``ptload.torch.load`` was called on, in order."""
    calls = []
    real = ptload.torch.load

    def counting(f, *args, **kwargs):
        calls.append(os.path.basename(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else f)
        return real(f, *args, **kwargs)

    monkeypatch.setattr(ptload.torch, "load", counting)
    return calls


def assert_same(a, b, where="root"):
    """Same types, keys and values; tensors equal."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, argparse.Namespace):
        assert_same(vars(a), vars(b), where)
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# -- patch, unpatch, with ----------------------------------------------------


def test_patch_and_unpatch_put_torch_load_back_exactly():
    returned = ptload.patch()
    assert torch.load is not TORCH_LOAD
    assert torch.serialization.load is torch.load
    assert torch.load.__wrapped__ is TORCH_LOAD
    ptload.unpatch()
    assert torch.load is TORCH_LOAD and torch.serialization.load is TORCH_LOAD
    ptload.unpatch()  # unpatched already: nothing happens
    assert torch.load is TORCH_LOAD
    with returned:  # what patch() returned still works as a block
        pass
    assert torch.load is TORCH_LOAD


def test_patching_twice_is_idempotent():
    ptload.patch()
    first = torch.load
    ptload.patch()
    assert torch.load is first
    ptload.unpatch()  # one unpatch undoes both
    assert torch.load is TORCH_LOAD and torch.serialization.load is TORCH_LOAD
    # New defaults replace the old ones; torch's function still comes back.
    ptload.patch(unknown="inert")
    ptload.patch(strict=True)
    assert torch.load.__wrapped__ is TORCH_LOAD
    ptload.unpatch()
    assert torch.load is TORCH_LOAD


def test_with_block_restores_on_exit_and_on_exception():
    with ptload.patch() as patched:
        assert torch.load is not TORCH_LOAD
        assert torch.serialization.load is torch.load
    assert patched is not None
    assert torch.load is TORCH_LOAD and torch.serialization.load is TORCH_LOAD
    with pytest.raises(KeyError):
        with ptload.patch():
            raise KeyError("inside")
    assert torch.load is TORCH_LOAD and torch.serialization.load is TORCH_LOAD


def test_nested_with_blocks_restore_what_was_there():
    ptload.patch()
    outer = torch.load
    with ptload.patch(unknown="inert"):
        assert torch.load is not outer
    assert torch.load is outer  # the plain patch() is still in force
    with ptload.patch():  # same defaults: nothing changes, nothing to undo
        assert torch.load is outer
    assert torch.load is outer
    with ptload.patch(strict=True):
        ptload.unpatch()
        assert torch.load is TORCH_LOAD
    assert torch.load is outer  # the block puts back what it found
    ptload.unpatch()  # and unpatch still knows torch's function
    assert torch.load is TORCH_LOAD and torch.serialization.load is TORCH_LOAD


def test_signature_and_identity_are_torch_loads():
    with ptload.patch():
        assert inspect.signature(torch.load) == inspect.signature(TORCH_LOAD)
        # The wrapper's own parameters, not only what __wrapped__ shows.
        own = inspect.signature(torch.load, follow_wrapped=False).parameters
        theirs = inspect.signature(TORCH_LOAD).parameters
        assert [(p.name, p.kind, p.default) for p in own.values()] == [
            (p.name, p.kind, p.default) for p in theirs.values()
        ]
        assert torch.load.__name__ == TORCH_LOAD.__name__


def test_the_patch_can_be_seen():
    """After patch(), torch.load says it is ptload's: patched(), its repr
    (with the options in force), its docstring, and a DEBUG line per load."""
    assert not ptload.patched()
    with ptload.patch(unknown="inert"):
        assert ptload.patched()
        assert "ptload" in repr(torch.load) and "unknown='inert'" in repr(torch.load)
        assert torch.load.__doc__.startswith("torch.load replaced by ptload.patch(unknown='inert')")
        assert TORCH_LOAD.__doc__ in torch.load.__doc__
        assert torch.load.__module__.startswith("ptload")
    assert not ptload.patched()
    assert "ptload" not in repr(torch.load)


def test_each_patched_load_logs_one_debug_line(tmp_path, caplog):
    path = tmp_path / "w.pt"
    torch.save({"w": torch.ones(2)}, path)
    with ptload.patch(), caplog.at_level(logging.DEBUG, logger="ptload"):
        torch.load(path)
        torch.load(path)
    lines = [r for r in caplog.records if r.name == "ptload" and "ptload.torch.load" in r.getMessage()]
    assert len(lines) == 2 and str(path) in lines[0].getMessage()


def test_patch_takes_a_default_map_location(tmp_path, spy):
    """map_location given to patch() applies to the calls that pass none;
    a call's own wins."""
    path = tmp_path / "w.pt"
    torch.save({"w": torch.ones(2)}, path)
    with ptload.patch(map_location="meta"):
        assert torch.load(path)["w"].device.type == "meta"
        assert torch.load(path, map_location="cpu")["w"].device.type == "cpu"


def test_refusal_under_patch_names_patchs_options(tmp_path):
    """Through from_pretrained no ptload keyword reaches torch.load: the
    refusal names ptload.patch(allow_globals=...) and says weights_only=False
    is safe under ptload."""
    path = tmp_path / "ns.pt"
    torch.save({"args": argparse.Namespace(lr=0.1), "w": torch.ones(2)}, path)
    with ptload.patch(), pytest.raises(ptload.UnsafeGlobalError) as info:
        torch.load(path)
    assert "ptload.patch(allow_globals=[...])" in str(info.value)
    assert "weights_only=False is safe" in str(info.value)
    with pytest.raises(ptload.UnsafeGlobalError) as direct:
        ptload.torch.load(path)
    assert "ptload.patch" not in str(direct.value) and "allow_globals=[...]" in str(direct.value)


def test_patch_takes_only_ptloads_options():
    with pytest.raises(TypeError, match="weights_only=False is safe under ptload"):
        ptload.patch(weights_only=False)
    with pytest.raises(TypeError, match="mmap"):
        ptload.patch(mmap=True)
    with pytest.raises(TypeError, match="no_such_option"):
        ptload.patch(no_such_option=1)
    assert torch.load is TORCH_LOAD


def test_import_ptload_still_imports_no_torch():
    code = "import sys, ptload; ptload.patch; ptload.unpatch; assert 'torch' not in sys.modules"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


# -- torch.load calls --------------------------------------------------------


def test_patched_torch_load_is_ptloads_and_gives_torchs_answer(tmp_path, spy):
    torch.manual_seed(0)
    state = collections.OrderedDict(w=torch.randn(3, 4), b=torch.arange(5), n={"step": 7})
    state["tied"] = state["w"][1]
    path = tmp_path / "state.pt"
    torch.save(state, path)
    expected = TORCH_LOAD(path, weights_only=True)
    with ptload.patch():
        by_path = torch.load(path)
        by_str = torch.serialization.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        by_file = torch.load(io.BytesIO(path.read_bytes()), map_location=lambda s, loc: s)
    assert spy[:2] == ["state.pt", "state.pt"] and len(spy) == 3
    assert isinstance(spy[2], io.BytesIO)
    for got in (by_path, by_str, by_file):
        assert_same(got, expected)
        assert got["tied"].untyped_storage().data_ptr() == got["w"].untyped_storage().data_ptr()


def test_arguments_pass_through_unchanged(monkeypatch):
    seen = []
    monkeypatch.setattr(ptload.torch, "load", lambda *a, **k: seen.append((a, k)) or "loaded")
    with ptload.patch(strict=True):
        got = torch.load("a.pt", "cpu", None, weights_only=False, mmap=True, encoding="latin1")
        torch.serialization.load("b.pt", strict=False)
    assert got == "loaded"
    assert seen == [
        (("a.pt", "cpu", None), {"weights_only": False, "mmap": True, "encoding": "latin1", "strict": True}),
        (("b.pt", None, None), {"weights_only": None, "mmap": None, "strict": False}),
    ]


def test_defaults_reach_every_call_and_a_calls_keywords_win(tmp_path, spy):
    path = tmp_path / "ns.pt"
    torch.save({"args": argparse.Namespace(lr=0.5, name="x"), "w": torch.ones(2)}, path)
    with ptload.patch():
        with pytest.raises(pickle.UnpicklingError, match="argparse.Namespace"):
            torch.load(path)
    with ptload.patch(unknown="inert"):
        got = torch.load(path)
        with pytest.raises(pickle.UnpicklingError, match="argparse.Namespace"):
            torch.load(path, unknown="error")
    assert_same(got, TORCH_LOAD(path, weights_only=False))
    with ptload.patch(allow_globals=["argparse.Namespace"]):
        assert_same(torch.load(path), TORCH_LOAD(path, weights_only=False))
    assert len(spy) == 4


# -- transformers --------------------------------------------------------------


def tiny_model(kind):
    transformers = need("transformers")
    torch.manual_seed(1234)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=4, vocab_size=101, n_positions=64,
            bos_token_id=0, eos_token_id=0,
        )
        return transformers.GPT2LMHeadModel(config).eval(), transformers.AutoModelForCausalLM
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
        vocab_size=103, max_position_embeddings=64,
    )
    return transformers.BertModel(config).eval(), transformers.AutoModel


def save_bin(model, directory, shards=1):
    """Write ``model`` as older hub repos have it: ``config.json`` and
    ``pytorch_model.bin`` from ``torch.save(model.state_dict())``, or
    ``shards`` such files and ``pytorch_model.bin.index.json``."""
    os.makedirs(directory, exist_ok=True)
    model.config.save_pretrained(directory)
    state = model.state_dict()
    if shards == 1:
        torch.save(state, os.path.join(directory, "pytorch_model.bin"))
        return ["pytorch_model.bin"]
    keys = list(state)
    names, weight_map = [], {}
    for i in range(shards):
        name = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = collections.OrderedDict((k, state[k]) for k in keys[i::shards])
        torch.save(part, os.path.join(directory, name))
        names.append(name)
        weight_map.update({k: name for k in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    with open(os.path.join(directory, "pytorch_model.bin.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh)
    return names


def outputs(model, kind):
    ids = torch.tensor([[3, 14, 15, 92, 65, 35, 8, 9]])
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if kind == "gpt2" else out.last_hidden_state


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_from_pretrained_bin_under_patch(tmp_path, spy, kind, shards):
    model, auto = tiny_model(kind)
    files = save_bin(model, tmp_path / "repo", shards)
    assert not any(p.suffix == ".safetensors" for p in (tmp_path / "repo").iterdir())
    # What the weights would be without the file: a model freshly made
    # from the config differs, so equal outputs below come from the file.
    torch.manual_seed(99)
    fresh = type(model)(model.config).eval()
    assert not torch.equal(outputs(fresh, kind), outputs(model, kind))

    with ptload.patch():
        loaded, info = auto.from_pretrained(tmp_path / "repo", output_loading_info=True)
    loaded.eval()
    assert type(loaded) is type(model)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    # Every file was read by ptload (transformers may read a file twice:
    # once on the meta device, once for the weights).
    assert set(files) <= set(spy), spy
    assert torch.equal(outputs(loaded, kind), outputs(model, kind))
    expected = model.state_dict()
    got = loaded.state_dict()
    assert list(got) == list(expected)
    for k in expected:
        assert torch.equal(got[k], expected[k]), k
    if kind == "gpt2":  # the tie survives
        assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()


# -- a file whose pickle runs code ---------------------------------------------


class _Payload:
    """Pickles as a call that creates ``marker`` when unpickled."""

    def __init__(self, how, marker):
        self.how, self.marker = how, str(marker)

    def __reduce__(self):
        if self.how == "os.system":
            return (os.system, (f"touch '{self.marker}'",))
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


CONTROL = """
import sys, torch
torch.load(sys.argv[1], weights_only=False)
"""


@pytest.mark.parametrize(
    "how, named", [("os.system", "posix.system"), ("Path.touch", "builtins.getattr")]
)
def test_marker_payload_never_runs(tmp_path, spy, how, named):
    model, auto = tiny_model("gpt2")
    repo = tmp_path / "repo"
    save_bin(model, repo)
    marker = tmp_path / "MARKER"
    state = model.state_dict()
    state["evil"] = _Payload(how, marker)
    path = repo / "pytorch_model.bin"
    torch.save(state, path)
    assert not marker.exists()

    with ptload.patch():
        # transformers loads with weights_only=True: refused as torch
        # refuses it, naming the global.
        with pytest.raises(pickle.UnpicklingError, match=named.replace(".", r"\.")):
            auto.from_pretrained(repo)
        assert not marker.exists()
        # weights_only=False: the object comes back as an inert record,
        # with one warning, and the weights with it.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = torch.load(path, weights_only=False)
        assert not marker.exists()
        assert isinstance(got["evil"], ptload.Inert), type(got["evil"])
        assert got["evil"].path == named
        if how == "os.system":
            assert got["evil"].args == (f"touch '{marker}'",)
        said = [str(w.message) for w in caught if "ptload.Inert" in str(w.message)]
        assert len(said) == 1 and named in said[0], [str(w.message) for w in caught]
        assert torch.equal(got["transformer.wte.weight"], state["transformer.wte.weight"])
        # The keywords transformers passes change nothing.
        with pytest.raises(pickle.UnpicklingError):
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    assert spy.count("pytorch_model.bin") >= 3
    assert not marker.exists()

    # The control: torch's own weights_only=False load of the same file, in
    # a child process, does create the marker, so the checks above can fail.
    run = subprocess.run(
        [sys.executable, "-c", CONTROL, str(path)], capture_output=True, text=True, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert marker.exists()


# -- Lightning -----------------------------------------------------------------


def lightning_checkpoint(directory):
    """A tiny LightningModule with hyperparameters (an argparse.Namespace
    among them) fitted one step on CPU by a real Trainer, whose
    ModelCheckpoint callback writes the checkpoint."""
    pl = need("pytorch_lightning")

    class Tiny(pl.LightningModule):
        def __init__(self, hidden=4, lr=0.1, args=None):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(3, hidden)
            self.head = torch.nn.Linear(hidden, 1)

        def forward(self, x):
            return self.head(torch.relu(self.layer(x)))

        def training_step(self, batch, batch_idx):
            return self(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    torch.manual_seed(5)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3)), batch_size=4)
    model = Tiny(hidden=6, lr=0.05, args=argparse.Namespace(seed=5, name="tiny", layers=[1, 2]))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = pl.Trainer(
        max_steps=1, logger=False, enable_checkpointing=True, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=directory,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, data)
    written = sorted(pathlib.Path(directory).rglob("*.ckpt"))
    assert len(written) == 1, written
    # The step changed the weights: a checkpoint of the initial ones would
    # not be told apart from a fresh model below.
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    return Tiny, model, written[0]


def assert_same_module(loaded, model):
    assert type(loaded) is type(model)
    assert dict(loaded.hparams) == dict(model.hparams)
    assert isinstance(loaded.hparams["args"], argparse.Namespace)
    assert vars(loaded.hparams["args"]) == vars(model.hparams["args"])
    expected = model.state_dict()
    got = loaded.state_dict()
    assert list(got) == list(expected)
    for k in expected:
        assert torch.equal(got[k], expected[k]), k


def test_lightning_load_from_checkpoint_weights_only_false(tmp_path, spy):
    """What Lightning users write for a checkpoint with a Namespace in its
    hyperparameters since torch 2.6: ``weights_only=False``. ptload loads
    it without running the pickle."""
    Tiny, model, path = lightning_checkpoint(tmp_path)
    with ptload.patch():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = Tiny.load_from_checkpoint(path, weights_only=False)
    assert len(spy) == 1
    assert_same_module(loaded, model)


def test_lightning_load_from_checkpoint_with_inert_default(tmp_path, spy):
    Tiny, model, path = lightning_checkpoint(tmp_path)
    with ptload.patch(unknown="inert"):
        loaded = Tiny.load_from_checkpoint(path)
    assert len(spy) == 1
    assert_same_module(loaded, model)


def test_lightning_checkpoint_refused_as_torch_refuses_it(tmp_path, spy):
    """torch's default (weights_only) refuses the Namespace; so does
    ptload, with the same exception type."""
    Tiny, model, path = lightning_checkpoint(tmp_path)
    with pytest.raises(pickle.UnpicklingError):
        Tiny.load_from_checkpoint(path)
    with ptload.patch():
        with pytest.raises(pickle.UnpicklingError, match="argparse.Namespace"):
            Tiny.load_from_checkpoint(path)
    assert len(spy) == 1


@pytest.mark.parametrize("how", ["weights_only=False", "unknown=inert"])
def test_lightning_whole_checkpoint_equals_torchs(tmp_path, spy, how):
    """Every entry of the Trainer's checkpoint (loops, callbacks, optimizer
    state, hyperparameters) as torch's ``weights_only=False`` gives it."""
    _, _, path = lightning_checkpoint(tmp_path)
    expected = TORCH_LOAD(path, weights_only=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how == "weights_only=False":
            with ptload.patch():
                got = torch.load(path, weights_only=False)
        else:
            with ptload.patch(unknown="inert"):
                got = torch.load(path)
    assert spy == [path.name]
    assert_same(got, expected)
    # Nothing came back inert, so nothing was said about it.
    assert not [w for w in caught if "ptload" in str(w.message)], [str(w.message) for w in caught]


def test_diffusers_reads_bin_and_ckpt_files_through_patch(tmp_path, spy):
    """diffusers' from_pretrained on a model saved as
    diffusion_pytorch_model.bin, and the state-dict reader its single-file
    loading uses on a .ckpt, go through ptload under patch(): the same
    outputs, the same tensors, ptload did the reading."""
    diffusers = need("diffusers")
    from diffusers.models.model_loading_utils import load_state_dict

    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=1, out_channels=1, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=4,
    )
    unet.save_pretrained(tmp_path, safe_serialization=False)
    assert (tmp_path / "diffusion_pytorch_model.bin").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ptload.patch():
            loaded = diffusers.UNet2DModel.from_pretrained(tmp_path)
    assert spy == ["diffusion_pytorch_model.bin"]
    x = torch.randn(1, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(loaded(x, 1).sample, unet(x, 1).sample)
    fresh = diffusers.UNet2DModel.from_config(unet.config)
    with torch.no_grad():
        assert not torch.equal(fresh(x, 1).sample, unet(x, 1).sample)
    ckpt = tmp_path / "model.ckpt"
    torch.save({"state_dict": unet.state_dict(), "global_step": 7}, ckpt)
    with ptload.patch():
        state = load_state_dict(str(ckpt))
    assert spy[-1] == "model.ckpt"
    assert state["global_step"] == 7
    theirs = unet.state_dict()
    assert list(state["state_dict"]) == list(theirs)
    assert all(torch.equal(state["state_dict"][k], theirs[k]) for k in theirs)


def test_a_patched_torch_load_pickles_by_reference():
    """A dataset holding torch.load, sent to spawned DataLoader workers, is
    pickled: the patched function goes by reference, as torch's does, and
    unpickles as torch.load in the receiving process."""
    import functools

    with ptload.patch():
        again = pickle.loads(pickle.dumps(torch.load))
        assert again is torch.load
        partial = pickle.loads(pickle.dumps(functools.partial(torch.load, map_location="cpu")))
        assert partial.func is torch.load


# -- safetensors under transformers ---------------------------------------------


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_from_pretrained_safetensors_under_patch(tmp_path, monkeypatch, kind):
    """patch(safetensors=True): transformers' from_pretrained of a model
    saved as safetensors (its default) reads every file through ptload's
    safe_open, with outputs equal to the original's; the routes are put
    back on exit."""
    import safetensors

    model, auto = tiny_model(kind)
    model.save_pretrained(tmp_path / "repo")
    files = sorted(p.name for p in (tmp_path / "repo").iterdir() if p.suffix == ".safetensors")
    assert files, list((tmp_path / "repo").iterdir())
    opened = []
    real = ptload._safe.safe_open

    def counting(path, *args, **kwargs):
        opened.append(os.path.basename(os.fspath(path)))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(ptload._safe, "safe_open", counting)
    theirs = safetensors.safe_open
    with ptload.patch(safetensors=True):
        assert safetensors.safe_open is not theirs
        loaded = auto.from_pretrained(tmp_path / "repo").eval()
    assert safetensors.safe_open is theirs
    assert set(files) <= set(opened), opened
    assert torch.equal(outputs(loaded, kind), outputs(model, kind))
    import transformers.modeling_utils

    assert transformers.modeling_utils.safe_open is theirs
