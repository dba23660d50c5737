"""Weights from the trainer actor to the engine actors, pushed by the LLMProxy that owns the
engines (in the proxy actor, roll_agent/runtime/ray_hosts.py).

`BroadcastSync`: a bucketed `torch.distributed` broadcast (buckets.py), the trainer rank 0,
the engines ranks 1..E (gloo on CPU, NCCL on GPU). The group is formed for the engines a
push is given and kept while they stay the same actors: a push to other engines, or to an
engine restarted since (a new pid), forms it again. `ObjectStoreSync` (LoRA adapters,
small): the trainer returns them once, every engine reads that one object.

With `weight_sync.verify`, every engine checksums the tensors it received (per tensor, a
float64 sum weighted by position) and the push fails unless each matches the trainer's:
the check that weights crossed nodes intact.

Both first confirm each engine is the actor process it was (`RemoteEngine.confirm`); an
engine that died or was restarted fails the push marked not alive, which the proxy takes
out of routing, restarts and syncs on its own. The functions below run inside the actors
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

from roll_agent.protocols import SyncReport
from roll_agent.sync.buckets import Spec, broadcast_receive, broadcast_send, spec_of

GROUP_TIMEOUT = datetime.timedelta(minutes=5)  # a rank that never arrives fails the sync instead of hanging it
CHECKSUM_RTOL = 1e-9  # float64 sums of the same values; only the reduction order may differ (CPU vs GPU)


def checksums(named) -> dict[str, float]:
    """Per tensor, its float64 sum weighted by position: a value lost, changed or moved (within a
    tensor or to another one) changes it."""
    sums = {}
    for name, t in named:
        flat = t.detach().reshape(-1).double()
        ramp = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64, device=flat.device)
        sums[name] = float(flat @ ramp)
    return sums


def check_checksums(trainer: dict[str, float], engines: list, received: list[dict[str, float]]) -> None:
    """Raise unless every engine received exactly the trainer's tensors."""
    for engine, got in zip(engines, received):
        for name, want in trainer.items():
            have = got.get(name)
            if have is None or abs(have - want) > CHECKSUM_RTOL * max(1.0, abs(want)):
                raise RuntimeError(f"weight_sync.verify: engine {engine.index} received {name} with checksum {have}, "
                                   f"the trainer sent {want}: the weights were corrupted on the way")


def join_group(_component, init_method: str, world_size: int, rank: int, backend: str) -> None:
    leave_group()  # a group formed again: leave the old one first
    dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank,
                            timeout=GROUP_TIMEOUT)


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


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


def trainer_checksums(trainer) -> dict[str, float]:
    return checksums(trainer.named_weights())


def cpu_weights(trainer) -> list:
    """For the object store: CPU copies, stored once and read by every engine."""
    return [(name, t.detach().cpu().clone()) for name, t in trainer.named_weights()]


# ---- in an engine actor -------------------------------------------------------------------
async def engine_join_group(engine, *args) -> None:
    await asyncio.to_thread(join_group, engine, *args)


async def receive(engine, spec: Spec, bucket_mb: float, version: int, device: str,
                  verify: bool = False) -> tuple[int, dict[str, float]]:
    """Receive the broadcast bucket by bucket, loading each into the engine as it arrives.
    Returns the bytes and, when verifying, the received tensors' checksums."""
    buckets = broadcast_receive(spec, bucket_mb, device=device)
    total, sums = 0, {}
    with torch.no_grad():
        while (named := await asyncio.to_thread(next, buckets, None)) is not None:
            if verify:
                sums.update(checksums(named))
            await engine.load_weights(named, version)
            total += sum(t.numel() * t.element_size() for _, t in named)
    return total, sums


async def load_weights(engine, named: list, version: int, verify: bool = False) -> tuple[int, dict[str, float]]:
    """The object-store path: `named` arrives resolved from the object the trainer returned."""
    sums = checksums(named) if verify else {}
    await engine.load_weights(named, version)
    return sum(t.numel() * t.element_size() for _, t in named), sums


# ---- the pushes (in the proxy actor) ----------------------------------------------------------
async def _each(calls) -> list:
    """Await every call; then raise the first failure (all have ended, so every engine that
    failed is already marked not alive)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


async def _verified(report: SyncReport, trainer, engines: list, received: list[dict[str, float]] | None) -> SyncReport:
    """`received`: each engine's checksums, or None when not verifying."""
    if received is None:
        return report
    check_checksums(await trainer.apply.remote(trainer_checksums), engines, received)
    return {**report, "verified_engines": len(engines)}


class BroadcastSync:
    def __init__(self, trainer, bucket_mb: float, trainer_device: str = "cpu", engine_device: str = "cpu",
                 verify: bool = False):
        self.trainer = trainer  # the trainer actor (a Host)
        self.bucket_mb = bucket_mb
        self.verify = verify
        self.devices = trainer_device, engine_device
        self.backend = "nccl" if engine_device.startswith("cuda") else "gloo"
        self.spec = None
        self.members: tuple | None = None  # (index, pid) of the engines in the group formed last

    @classmethod
    def from_config(cls, trainer, cfg) -> "BroadcastSync":
        """weight_sync.type=broadcast: `trainer` is the trainer actor."""
        return cls(trainer, cfg.weight_sync.bucket_mb, cfg.trainer.device, cfg.engine.device, cfg.weight_sync.verify)

    async def _form(self, engines: list) -> None:
        if self.spec is None:
            self.spec = await self.trainer.apply.remote(weight_spec)
        init = await self.trainer.apply.remote(rendezvous)
        world = len(engines) + 1
        await _each([self.trainer.apply.remote(join_group, init, world, 0, self.backend),
                     *(e.apply(engine_join_group, init, world, rank, self.backend)
                       for rank, e in enumerate(engines, start=1))])

    async def push(self, engines: list, version: int) -> SyncReport:
        """`engines`: RemoteEngines (roll_agent/runtime/ray_hosts.py) to load `version` into."""
        start = time.perf_counter()
        await _each([e.confirm() for e in engines])
        members = tuple((e.index, e.pid) for e in engines)
        trainer_device, engine_device = self.devices
        try:
            if members != self.members:
                self.members = None
                await self._form(engines)
                self.members = members
            sent, *received = await _each([
                self.trainer.apply.remote(send_weights, self.bucket_mb, trainer_device),
                *(e.apply(receive, self.spec, self.bucket_mb, version, engine_device, self.verify) for e in engines)])
        except Exception:
            self.members = None  # a rank failed mid-broadcast: the next push forms the group anew
            raise
        for engine in engines:
            engine.version = version  # what the actor's engine serves now (RemoteEngine checks its answers by it)
        report = {"bytes": sent["bytes"] * len(engines), "seconds": time.perf_counter() - start}
        return await _verified(report, self.trainer, engines, [sums for _, sums in received] if self.verify else None)


class ObjectStoreSync:
    def __init__(self, trainer, verify: bool = False):
        self.trainer = trainer
        self.verify = verify

    @classmethod
    def from_config(cls, trainer, cfg) -> "ObjectStoreSync":
        """weight_sync.type=object_store: `trainer` is the trainer actor."""
        return cls(trainer, cfg.weight_sync.verify)

    async def push(self, engines: list, version: int) -> SyncReport:
        start = time.perf_counter()
        await _each([e.confirm() for e in engines])
        ref = self.trainer.apply.remote(cpu_weights)
        moved = await _each([e.load_weights(ref, version, self.verify) for e in engines])
        report = {"bytes": sum(n for n, _ in moved), "seconds": time.perf_counter() - start}
        return await _verified(report, self.trainer, engines, [sums for _, sums in moved] if self.verify else None)
