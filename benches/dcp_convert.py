#!/usr/bin/env python3
"""Converting a torch.distributed.checkpoint (DCP) directory to safetensors:
``ptload convert`` against torch's way (``dcp_to_torch_save`` into a
``torch.save`` file, loaded back and written with safetensors'
``save_file``): wall time and peak resident memory of each, in processes of
their own, medians of N runs.

    target/ci-python/bin/python benches/dcp_convert.py [--gib 2] [--runs 3] [--out DIR]

Input, written once to DIR (default /tmp/ptload-bench/dcp-<gib>g): a
Llama-shaped state dict of about GIB GiB of bf16 tensors (24 layers, the
width chosen to fill the size), each
2-D tensor sharded on dim 0 over 2 ranks as DTensors and saved with
``dcp.save`` on gloo. The ptload binary is target/release/ptload (build it
first: ``cargo build --release -p ptload-cli``). Both outputs are checked
equal tensor for tensor before timing. Peak RSS is from GNU time
(``/usr/bin/time -f %M``).
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shapes(gib):
    """Names and shapes of a Llama-like model of about ``gib`` GiB in bf16."""
    # 24 layers of about 12 h^2 bf16 values take 85% of the size; two
    # vocabulary matrices the rest.
    layers = 24
    hidden = max(64, int((0.85 * gib * 2**30 / (layers * 12 * 2)) ** 0.5) // 64 * 64)
    per_layer = 4 * hidden * hidden + 3 * hidden * (hidden * 8 // 3)
    vocab = max(1000, int((gib * 2**30 / 2 - layers * per_layer) / (2 * hidden)))
    out = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden)}
    inter = hidden * 8 // 3
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{n}.weight"] = (hidden, hidden)
        out[p + "mlp.gate_proj.weight"] = (inter, hidden)
        out[p + "mlp.up_proj.weight"] = (inter, hidden)
        out[p + "mlp.down_proj.weight"] = (hidden, inter)
        out[p + "input_layernorm.weight"] = (hidden,)
    return out


def _save_rank(rank, world, store, out, gib):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    state = {}
    for name, shape in shapes(gib).items():
        t = torch.randn(shape, generator=g).to(torch.bfloat16)
        state[name] = distribute_tensor(t, mesh, [Shard(0) if len(shape) > 1 else Replicate()])
    dcp.save(state, checkpoint_id=out)
    dist.barrier()
    dist.destroy_process_group()


def make_dcp(out, gib):
    if os.path.exists(os.path.join(out, ".metadata")):
        return
    import torch.multiprocessing as mp

    os.makedirs(out, exist_ok=True)
    store = tempfile.mktemp()
    mp.spawn(_save_rank, args=(2, store, out, gib), nprocs=2, join=True)


TORCH_WAY = r"""
import sys, torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from safetensors.torch import save_file
dcp_dir, tmp, out = sys.argv[1:4]
dcp_to_torch_save(dcp_dir, tmp)
sd = torch.load(tmp, weights_only=True)
save_file({k: v.contiguous() for k, v in sd.items()}, out)
"""


def timed(cmd):
    """(seconds, peak RSS in MB) of ``cmd`` run under GNU time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        start = time.perf_counter()
        subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tf.name, *cmd], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        return seconds, int(tf.read().split()[-1]) / 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = args.out or f"/tmp/ptload-bench/dcp-{args.gib:g}g"
    make_dcp(out, args.gib)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    work = tempfile.mkdtemp(prefix="dcp-convert-")
    ptload = os.path.join(ROOT, "target", "release", "ptload")
    ours_out, theirs_out, tmp = (os.path.join(work, n) for n in ("ptload.safetensors", "torch.safetensors", "torch.pt"))
    ptload_cmd = [ptload, "--quiet", "convert", out, ours_out, "--key", "all", "--force"]
    torch_cmd = [sys.executable, "-c", TORCH_WAY, out, tmp, theirs_out]
    # The same tensors first.
    subprocess.run(ptload_cmd, check=True)
    subprocess.run(torch_cmd, check=True)
    from safetensors import safe_open

    with safe_open(ours_out, "pt") as a, safe_open(theirs_out, "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        import torch

        for k in a.keys():
            assert torch.equal(a.get_tensor(k), b.get_tensor(k)), k
    rows = {"ptload convert": [], "dcp_to_torch_save + torch.load + save_file": []}
    for _ in range(args.runs):
        for name, cmd in (("ptload convert", ptload_cmd), ("dcp_to_torch_save + torch.load + save_file", torch_cmd)):
            rows[name].append(timed(cmd))
    result = {
        name: {
            "seconds": statistics.median(s for s, _ in runs),
            "peak RSS MB": statistics.median(m for _, m in runs),
        }
        for name, runs in rows.items()
    }
    ours, theirs = result["ptload convert"], result["dcp_to_torch_save + torch.load + save_file"]
    print(json.dumps({
        "info": {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.release()}",
            "checkpoint": f"{out}: {size / 1e9:.2f} GB, {len(shapes(args.gib))} tensors, 2 ranks",
            "runs": args.runs,
        },
        "results": result,
        "time ratio (torch / ptload)": theirs["seconds"] / ours["seconds"],
        "ptload peak RSS / checkpoint size": ours["peak RSS MB"] * 2**20 / size,
    }, indent=2))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
