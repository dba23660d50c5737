"""Weights from the trainer actor to the engine actors (the proxy actor runs the push).

`BroadcastSync`: a bucketed `torch.distributed` broadcast, the trainer rank 0, the engines
ranks 1..E (gloo on CPU, NCCL on GPU); the group is formed once, and again after an engine
actor was restarted. `ObjectStoreSync` (LoRA adapters, small): the trainer returns them
once, every engine reads that one object. The functions below run inside the actors
(`Host.apply`, roll_agent/runtime/forward.py), on the component each actor holds.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import time

import ray
import torch
import torch.distributed as dist

from roll_agent.train.broadcast import Spec, broadcast_receive, broadcast_send, spec_of

GROUP_TIMEOUT = datetime.timedelta(minutes=5)  # a rank that never arrives fails the sync instead of hanging it


def join_group(_component, init_method: str, world_size: int, rank: int, backend: str) -> None:
    if dist.is_initialized():  # a group formed again (an engine was restarted): leave the old one first
        dist.destroy_process_group()
    dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank,
                            timeout=GROUP_TIMEOUT)


# ---- in the trainer actor -----------------------------------------------------------------
def weight_spec(trainer) -> Spec:
    return spec_of(trainer.named_weights())


def rendezvous(_trainer) -> str:
    """A free port on this node for the group's store (rank 0 hosts it)."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"tcp://{ray.util.get_node_ip_address()}:{port}"


def send_weights(trainer, bucket_mb: float, device: str) -> dict:
    return broadcast_send(list(trainer.named_weights()), bucket_mb, device=device)


def cpu_weights(trainer) -> list:
    """For the object store: CPU copies, stored once and read by every engine."""
    return [(name, t.detach().cpu().clone()) for name, t in trainer.named_weights()]


# ---- in an engine actor -------------------------------------------------------------------
async def engine_join_group(engine, *args) -> None:
    await asyncio.to_thread(join_group, engine, *args)


async def receive(engine, spec: Spec, bucket_mb: float, version: int, device: str) -> int:
    """Receive the broadcast bucket by bucket, loading each into the engine as it arrives."""
    buckets = broadcast_receive(spec, bucket_mb, device=device)
    total = 0
    with torch.no_grad():
        while (named := await asyncio.to_thread(next, buckets, None)) is not None:
            await engine.load_weights(named, version)
            total += sum(t.numel() * t.element_size() for _, t in named)
    return total


async def load_weights(engine, named: list, version: int) -> int:
    """The object-store path: `named` arrives resolved from the object the trainer returned."""
    await engine.load_weights(named, version)
    return sum(t.numel() * t.element_size() for _, t in named)


async def close_engine(engine) -> None:
    await engine.close()
    if dist.is_initialized():
        dist.destroy_process_group()


# ---- the pushes -------------------------------------------------------------------------------
class BroadcastSync:
    def __init__(self, trainer, bucket_mb: float, trainer_device: str = "cpu", engine_device: str = "cpu"):
        self.trainer = trainer  # the trainer actor (a Host)
        self.bucket_mb = bucket_mb
        self.devices = trainer_device, engine_device
        self.backend = "nccl" if engine_device.startswith("cuda") else "gloo"
        self.spec = None
        self.formed = False

    async def _form(self, engines: list) -> None:
        if self.spec is None:
            self.spec = await self.trainer.apply.remote(weight_spec)
        init = await self.trainer.apply.remote(rendezvous)
        world = len(engines) + 1
        await asyncio.gather(self.trainer.apply.remote(join_group, init, world, 0, self.backend),
                             *(e.handle.apply.remote(engine_join_group, init, world, e.index + 1, self.backend)
                               for e in engines))
        self.formed = True

    async def push(self, engines: list, version: int) -> dict:
        """`engines`: the RemoteEngines (roll_agent/runtime/ray_hosts.py) to load `version` into."""
        start = time.perf_counter()
        if not self.formed:
            await self._form(engines)
        trainer_device, engine_device = self.devices
        try:
            sent, *_ = await asyncio.gather(
                self.trainer.apply.remote(send_weights, self.bucket_mb, trainer_device),
                *(e.handle.apply.remote(receive, self.spec, self.bucket_mb, version, engine_device) for e in engines))
        except Exception:
            self.formed = False  # a rank failed mid-broadcast: the next sync forms the group anew
            raise
        return {"bytes": sent["bytes"] * len(engines), "seconds": time.perf_counter() - start}


class ObjectStoreSync:
    def __init__(self, trainer):
        self.trainer = trainer
        self.formed = True

    async def push(self, engines: list, version: int) -> dict:
        start = time.perf_counter()
        ref = self.trainer.apply.remote(cpu_weights)
        moved = await asyncio.gather(*(e.load_weights(ref, version) for e in engines))
        return {"bytes": sum(moved), "seconds": time.perf_counter() - start}
