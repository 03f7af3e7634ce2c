"""Tensor-parallel ranks reading a sharded checkpoint through ptload.

    torchrun --nproc_per_node 4 examples/python/tp_gather.py DIR_OR_INDEX [PRESET | RULES]

DIR_OR_INDEX is a directory of shards, an index file, or a
torch.distributed.checkpoint directory (saved at any world size). Each rank
reads only its own slices (``shard=(rank, world)`` with a split preset,
default ``llama``, or comma-separated ``GLOB=DIM`` rules), then the ranks exchange them with
``torch.distributed`` collectives (gloo on CPU, NCCL on GPUs) and every
rank checks that the gathered tensors equal the whole state dict read
without slicing. Exits non-zero on any difference.
"""

import sys

import torch
import torch.distributed as dist

import ptload.torch


def gather(part, world):
    """Every rank's ``part`` (shapes may differ by one along one dim)."""
    shapes = [None] * world
    dist.all_gather_object(shapes, tuple(part.shape))
    biggest = [max(s[d] for s in shapes) for d in range(part.dim())]
    padded = torch.zeros(biggest, dtype=part.dtype)
    padded[tuple(slice(0, n) for n in part.shape)] = part
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous())
    return [p[tuple(slice(0, n) for n in s)] for p, s in zip(parts, shapes)]


def main():
    path = sys.argv[1]
    how = sys.argv[2] if len(sys.argv) > 2 else "llama"
    rules = {"splits": how.split(",")} if "=" in how else {"preset": how}
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = ptload.torch.load_file(path, key="all", shard=(rank, world), **rules)
    whole = ptload.torch.load_file(path, key="all")
    assert list(mine) == list(whole), "ranks and the whole name different tensors"
    split = 0
    for name, full in whole.items():
        parts = gather(mine[name], world)
        dims = [d for d in range(full.dim()) if parts[0].shape[d] != full.shape[d]]
        if not dims and all(p.shape == full.shape for p in parts):
            if not all(torch.equal(p, full) for p in parts):
                raise SystemExit(f"rank {rank}: {name}: a replicated copy differs")
            continue
        dim = dims[0] if dims else next(
            d for d in range(full.dim()) if any(p.shape[d] != full.shape[d] for p in parts)
        )
        if not torch.equal(torch.cat(parts, dim), full):
            raise SystemExit(f"rank {rank}: {name}: the gathered slices differ from the whole")
        split += 1
    mine_bytes = sum(t.numel() * t.element_size() for t in mine.values())
    all_bytes = sum(t.numel() * t.element_size() for t in whole.values())
    print(
        f"rank {rank}/{world}: read {mine_bytes} of {all_bytes} bytes; "
        f"{split} split and {len(whole) - split} replicated tensors gathered equal the whole",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
