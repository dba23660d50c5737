"""WeightSync: move the trainer's weights into the engines while the proxy is suspended.

`InProcessSync` copies tensors between models in one process. Each push reports the
bytes moved and the seconds it took.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import torch

NamedTensors = Iterable[tuple[str, torch.Tensor]]


class InProcessSync:
    def __init__(self, named_weights: Callable[[], NamedTensors]):
        self.named_weights = named_weights
        self.total_bytes = 0
        self.total_seconds = 0.0

    async def push(self, engines: list, version: int) -> dict:
        start = time.perf_counter()
        tensors = list(self.named_weights())
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        for engine in engines:
            await engine.load_weights(tensors, version)
        seconds = time.perf_counter() - start
        self.total_bytes += nbytes * len(engines)
        self.total_seconds += seconds
        return {"bytes": nbytes * len(engines), "seconds": seconds}
