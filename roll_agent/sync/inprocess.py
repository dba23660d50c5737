"""Weight syncs within one process: `InProcessSync` copies the trainer's tensors into each
engine; `VersionOnlySync` moves none (engines that have no weights of their own to load,
such as the scripted engine the tests and benchmarks use, learn the new version only)."""

from __future__ import annotations

import time
from typing import Callable, Iterable

import torch

from roll_agent.protocols import SyncReport

NamedTensors = Iterable[tuple[str, torch.Tensor]]


class InProcessSync:
    def __init__(self, named_weights: Callable[[], NamedTensors]):
        self.named_weights = named_weights

    @classmethod
    def from_config(cls, trainer, cfg) -> "InProcessSync":
        """weight_sync.type=inprocess (the local runtime's): `trainer` is the trainer itself."""
        return cls(trainer.named_weights)

    async def push(self, engines: list, version: int) -> SyncReport:
        start = time.perf_counter()
        tensors = list(self.named_weights())
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        for engine in engines:
            await engine.load_weights(tensors, version)
        return {"bytes": nbytes * len(engines), "seconds": time.perf_counter() - start}


class VersionOnlySync:
    async def push(self, engines: list, version: int) -> SyncReport:
        start = time.perf_counter()
        for engine in engines:
            await engine.load_weights([], version)
        return {"bytes": 0, "seconds": time.perf_counter() - start}
