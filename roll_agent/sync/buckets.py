"""Weight sync between processes: `torch.distributed` broadcast in flat buckets.

The trainer (rank `src`) packs parameters into flat per-dtype buckets of about
`bucket_mb` and broadcasts each; receivers (engines in other processes) unpack into
their own parameters. Both sides derive the same bucket layout from the same ordered
(name, shape, dtype) list, so no metadata travels per sync. gloo on CPU, NCCL on GPU
(the code is the same; NCCL needs the buckets on the GPU).
"""

from __future__ import annotations

import time
from typing import Iterable

import torch
import torch.distributed as dist

Spec = list[tuple[str, torch.Size, torch.dtype]]


def layout(spec: Spec, bucket_mb: float) -> list[list[int]]:
    """Indices of `spec` grouped into same-dtype buckets of at most ~bucket_mb each."""
    limit = max(1, int(bucket_mb * 2**20))
    buckets: list[list[int]] = []
    size = 0
    for i, (_, shape, dtype) in enumerate(spec):
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        start_new = not buckets or size + nbytes > limit or spec[buckets[-1][0]][2] != dtype
        if start_new:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets


def bucket_device(group=None) -> torch.device:
    """The `device` to pass for the group's backend: NCCL moves GPU memory only (this rank's
    current GPU), gloo CPU memory; the tensors themselves may live anywhere."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def spec_of(named: Iterable[tuple[str, torch.Tensor]]) -> Spec:
    return [(name, t.shape, t.dtype) for name, t in named]


def broadcast_send(named: list[tuple[str, torch.Tensor]], bucket_mb: float = 32, src: int = 0, group=None,
                   device: str = "cpu") -> dict:
    """Broadcast every tensor of `named` (in order) from this rank; returns bytes and seconds."""
    start = time.perf_counter()
    total = 0
    with torch.no_grad():
        for bucket in layout(spec_of(named), bucket_mb):
            flat = torch.cat([named[i][1].detach().reshape(-1) for i in bucket]).to(device)
            dist.broadcast(flat, src=src, group=group)
            total += flat.numel() * flat.element_size()
    return {"bytes": total, "seconds": time.perf_counter() - start}


def broadcast_receive(spec: Spec, bucket_mb: float = 32, src: int = 0, group=None, device: str = "cpu"):
    """Yield the sender's tensors bucket by bucket, as lists of (name, tensor) views into the
    received flat bucket: a receiver loads one bucket at a time, never a second full copy."""
    for bucket in layout(spec, bucket_mb):
        numel = sum(torch.Size(spec[i][1]).numel() for i in bucket)
        flat = torch.empty(numel, dtype=spec[bucket[0]][2], device=device)
        dist.broadcast(flat, src=src, group=group)
        named, offset = [], 0
        for i in bucket:
            name, shape, _ = spec[i]
            n = torch.Size(shape).numel()
            named.append((name, flat[offset:offset + n].view(shape)))
            offset += n
        yield named


def broadcast_receive_into(params: list[tuple[str, torch.Tensor]], bucket_mb: float = 32, src: int = 0,
                           group=None, device: str = "cpu") -> dict:
    """Receive the sender's tensors into `params` (same names, shapes and order as sent)."""
    start = time.perf_counter()
    total = 0
    targets = dict(params)
    with torch.no_grad():
        for named in broadcast_receive(spec_of(params), bucket_mb, src, group, device):
            for name, tensor in named:
                targets[name].copy_(tensor)
                total += tensor.numel() * tensor.element_size()
    return {"bytes": total, "seconds": time.perf_counter() - start}
