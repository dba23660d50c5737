"""The actors that hold a model: one inference engine each, and the trainer.

Weights move from the trainer (rank 0) to the engines (ranks 1..E) with the bucketed
`torch.distributed` broadcast (gloo on CPU, NCCL on GPU); the group is formed once and
formed again when an engine actor was restarted. LoRA adapters (small) can instead go
through Ray's object store: the trainer returns them once, every engine reads the same object.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import socket

import torch
import torch.distributed as dist

from roll_agent.config import Config
from roll_agent.proxy.engines import make_engines
from roll_agent.train.broadcast import Spec, broadcast_receive, broadcast_send, spec_of

GROUP_TIMEOUT = datetime.timedelta(minutes=5)  # a rank that never arrives fails the sync instead of hanging it


def _threads(n: int) -> None:
    if n:  # otherwise Ray's default: as many intra-op threads as CPUs reserved for the actor
        torch.set_num_threads(n)


def _join(init_method: str, world_size: int, rank: int, backend: str) -> None:
    if dist.is_initialized():  # a group formed again (an engine was restarted): leave the old one first
        dist.destroy_process_group()
    dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank,
                            timeout=GROUP_TIMEOUT)


class EngineHost:
    def __init__(self, cfg: Config, model_path: str, seed: int):
        _threads(cfg.runtime.torch_threads)
        one = dataclasses.replace(cfg.engine, num_engines=1)
        self.engine = make_engines(one, cfg.model, model_path, seed=seed)[0]
        self.device = cfg.engine.device

    def ping(self) -> int:
        return os.getpid()

    async def generate(self, prompt_ids, sampling, request_id):
        return await self.engine.generate(prompt_ids, sampling, request_id)

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    async def join_group(self, init_method: str, world_size: int, rank: int, backend: str) -> None:
        await asyncio.to_thread(_join, init_method, world_size, rank, backend)

    async def receive(self, spec: Spec, bucket_mb: float, version: int) -> int:
        """Receive a broadcast bucket by bucket, loading each into the engine as it arrives."""
        buckets = broadcast_receive(spec, bucket_mb, device=self.device)
        total = 0
        with torch.no_grad():
            while (named := await asyncio.to_thread(next, buckets, None)) is not None:
                await self.engine.load_weights(named, version)
                total += sum(t.numel() * t.element_size() for _, t in named)
        return total

    async def load_weights(self, named: list, version: int) -> int:
        """The object-store path: `named` arrives resolved from the object the trainer returned."""
        await self.engine.load_weights(named, version)
        return sum(t.numel() * t.element_size() for _, t in named)

    async def close(self) -> None:
        await self.engine.close()
        if dist.is_initialized():
            dist.destroy_process_group()


class TrainerHost:
    """A synchronous actor: Ray runs one call at a time, so a sync never reads weights mid-step."""

    def __init__(self, cfg: Config, model_path: str):
        from roll_agent.train.trainer import trainer_for_run

        _threads(cfg.runtime.torch_threads)
        self.trainer = trainer_for_run(cfg, model_path)  # trainer.type=deepspeed: a world of one in this actor
        self.device = cfg.trainer.device

    def version(self) -> int:
        return self.trainer.version

    def step(self, batch) -> tuple[dict, int]:
        return self.trainer.step(batch), self.trainer.version

    def sft_step(self, trajs, lr: float) -> dict:
        return self.trainer.sft_step(trajs, lr)

    def reset_reference(self) -> None:
        self.trainer.reset_reference()

    def save(self, path: str) -> None:
        from pathlib import Path

        self.trainer.save(Path(path))

    def load(self, path: str) -> int:
        from pathlib import Path

        self.trainer.load(Path(path))
        return self.trainer.version

    def weight_spec(self) -> Spec:
        return spec_of(self.trainer.named_weights())

    def rendezvous(self) -> str:
        """A free port on this node for the weight-sync group's store (rank 0 hosts it)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def join_group(self, init_method: str, world_size: int, rank: int, backend: str) -> None:
        _join(init_method, world_size, rank, backend)

    def send_weights(self, bucket_mb: float) -> dict:
        return broadcast_send(list(self.trainer.named_weights()), bucket_mb, device=self.device)

    def named_weights(self) -> list:
        """For the object store: CPU copies, stored once and read by every engine."""
        return [(name, t.detach().cpu().clone()) for name, t in self.trainer.named_weights()]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
