"""The contracts between components, as small Protocols (docs/architecture.md, section 2).

Each runtime builds objects that satisfy them: the local runtime the components
themselves, the Ray runtime façades over actors. `tests/test_protocols.py` checks every
implementation against its protocol.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Collection, Iterable, NotRequired, Protocol, TypedDict, runtime_checkable

import torch

from roll_agent.types import (EngineOutput, GenerateRequest, GenerateResult, Group, SamplingParams, Status, TokenSink,
                              Trajectory)


class Unsupported(ValueError):
    """What `Engine.generate` raises, before any work, for a request it cannot serve (`param`: the
    SamplingParams field, e.g. top_logprobs); the proxy passes it on to the caller, not retried."""

    def __init__(self, message: str, param: str = ""):
        super().__init__(message, param)  # both in args: it pickles (an engine in a Ray actor)
        self.message, self.param = message, param

    def __str__(self) -> str:
        return self.message


@runtime_checkable
class Engine(Protocol):
    """An inference engine behind the LLMProxy."""

    version: int
    alive: bool  # False once the engine knows it crashed: the proxy takes it out of routing
    restartable: bool  # True: the proxy calls `async restart()` on a crashed engine, then re-syncs it

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str,
                       on_tokens: TokenSink | None = None) -> EngineOutput:
        """Generate; on `abort(request_id)` return at once with the partial output and finish_reason 'abort'.
        An engine that can stream calls `on_tokens` with its tokens as it samples them (a prefix of
        the output it returns); one that cannot ignores it."""

    async def abort(self, request_id: str) -> None: ...

    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Replace the weights (called only while the proxy is suspended and this engine is idle)."""

    async def close(self) -> None: ...


class SyncReport(TypedDict):
    bytes: int  # moved, over all engines
    seconds: float
    verified_engines: NotRequired[int]  # weight_sync.verify: engines whose received tensors matched the trainer's


@runtime_checkable
class WeightSync(Protocol):
    """Moves the trainer's weights into engines; the LLMProxy that owns the engines calls it
    while suspended (a weight update) or for one engine it restarted."""

    async def push(self, engines: list[Engine], version: int) -> SyncReport:
        """Afterwards each of `engines` serves `version`. An engine that died fails the push and
        is left with `alive` false (the proxy takes it out of routing, restarts it, pushes again)."""


@runtime_checkable
class Proxy(Protocol):
    """The LLMProxy: what an EnvManager calls (generate) and what the controller calls
    (suspend -> push_weights -> resume)."""

    version: int  # the weights it serves now: dates an episode's start

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Raises Unsupported for what its engines cannot serve. Passes the tokens to
        `request.on_tokens` as they come, where it can."""

    async def suspend(self) -> None:
        """Stop dispatch; in-flight requests are aborted (re-issued after resume) or drained.
        One suspend at a time: a second waits for the first's resume."""

    async def push_weights(self, version: int) -> SyncReport:
        """While suspended: the proxy's WeightSync pushes `version` into its live engines."""

    async def resume(self) -> None: ...


@runtime_checkable
class Ledger(Protocol):
    """Where episode outcomes are counted (roll_agent/rollout/accounting.py, EpisodeLedger)."""

    def start(self, n: int = 1) -> None: ...

    def end(self, outcome: Status, n: int = 1, reason: str = "") -> None:
        """`reason`: why the episodes failed (an error and its traceback's tail, a timeout), if they did."""


@runtime_checkable
class Buffer(Protocol):
    """The SampleBuffer as a GroupScheduler fills it: admission, finished groups, outcomes."""

    async_ratio: int
    ledger: Ledger

    def is_fresh(self, min_version: int, train_version: int) -> bool: ...

    async def admit(self) -> None:
        """Wait for places for one more group (the async-ratio bound)."""

    async def release(self) -> None:
        """Give back an admitted group's places: it produced nothing."""

    async def put(self, group: Group) -> None: ...


@runtime_checkable
class Trainer(Protocol):
    """What the controller, the warm-start and the checkpointer call; blocking (the controller
    runs `step` in a thread, so rollout goes on)."""

    version: int  # bumped by each `step`

    def step(self, groups: list[Group], capture: Collection[int] = ()) -> dict: ...

    def sft_step(self, trajs: list[Trajectory], lr: float) -> dict[str, float]: ...

    def reset_reference(self) -> None: ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...


@runtime_checkable
class Rollout(Protocol):
    """The rollout half as the controller drives it (`RolloutStack`, under Ray over clients of the actors)."""

    proxy: Proxy  # what its episodes generate through; the controller updates its weights
    watchdog: Any  # the Watchdog of the controller's own waits

    def start(self) -> None:
        """Start playing groups (and the watchdog)."""

    async def stop(self) -> None:
        """Stop playing: the running episodes are cancelled and counted."""

    async def get_batch(self, version: int) -> list[Group]:
        """The next `groups_per_batch` groups fresh enough to train version `version + 1` on; waits."""

    def num_ready(self) -> int:
        """Groups waiting to be trained on."""

    async def cancel_running(self) -> int:
        """Cancel every running episode (they start afresh): the answer to a batch that never fills."""

    async def on_version(self, version: int) -> None:
        """The proxy serves `version` now: admission widens, groups too stale for it are cancelled."""

    def stats(self):
        """A `RolloutStats` (roll_agent/rollout/accounting.py): cumulative counters as of the last refresh."""

    async def refresh(self) -> None:
        """Bring the counters `stats()` reads up to date where they live elsewhere (actors)."""

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the buffer's groups and counters, the scheduler's seeds."""

    def load_state_dict(self, state: dict) -> None: ...

    def env_manager(self, env_id: str, spec) -> Any:
        """An EnvManager for evaluation, its requests through this rollout's proxy."""

    async def close(self) -> None: ...
