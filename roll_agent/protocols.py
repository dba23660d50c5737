"""The contracts between components, as small Protocols (docs/architecture.md, section 2)."""

from __future__ import annotations

from typing import Iterable, Protocol, runtime_checkable

import torch

from roll_agent.types import EngineOutput, SamplingParams


@runtime_checkable
class Engine(Protocol):
    """An inference engine behind the LLMProxy."""

    version: int

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> EngineOutput:
        """Generate; on `abort(request_id)` return at once with the partial output and finish_reason 'abort'."""

    async def abort(self, request_id: str) -> None: ...

    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Replace the weights (called only while the proxy is suspended and this engine is idle)."""

    async def close(self) -> None: ...
