"""LLMProxy: one front door to several inference engines.

Routing is least-loaded first, then sticky per env (prefix-cache reuse). A weight
update is suspend -> update -> resume: suspend stops dispatch and aborts in-flight
requests (or lets them drain); each aborted request keeps its partial tokens and is
re-issued from its prefix after resume, so callers never see the abort and per-token
versions show the switch.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from roll_agent.config import ProxyConfig
from roll_agent.types import GenerateRequest, GenerateResult, SamplingParams


class GenerationAborted(Exception):
    """Raised to a caller whose env's requests were aborted with `abort(env_id)`."""


class LLMProxy:
    def __init__(self, engines: list, cfg: ProxyConfig | None = None, version: int = 0):
        if not engines:
            raise ValueError("LLMProxy needs at least one engine")
        self.engines = engines
        self.cfg = cfg or ProxyConfig()
        self.version = version
        self._load = [0] * len(engines)
        self._sticky: dict[str, int] = {}
        self._inflight: dict[str, tuple[int, str, str]] = {}  # sub-request id -> (engine, env, request)
        self._aborted_envs: set[str] = set()
        self._running = asyncio.Event()
        self._running.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self.stats = {"requests": 0, "reissues": 0, "user_aborts": 0, "gen_tokens": 0}

    # ---- callers -------------------------------------------------------
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        attempt = 0
        self.stats["requests"] += 1
        while True:
            await self._running.wait()
            if request.env_id in self._aborted_envs:
                raise GenerationAborted(request.env_id)
            idx = self._route(request.env_id)
            version = self.version
            sub_id = f"{request.request_id}.{attempt}"
            sampling = _remaining(request.sampling, len(tokens))
            self._inflight[sub_id] = (idx, request.env_id, request.request_id)
            self._load[idx] += 1
            self._drained.clear()
            try:
                out = await self.engines[idx].generate(request.prompt_ids + tokens, sampling, sub_id)
            except asyncio.CancelledError:
                await self.engines[idx].abort(sub_id)
                raise
            finally:
                self._load[idx] -= 1
                del self._inflight[sub_id]
                if not self._inflight:
                    self._drained.set()
            tokens += out.token_ids
            logprobs += out.logprobs
            versions += [version] * len(out.token_ids)
            self.stats["gen_tokens"] += len(out.token_ids)
            if out.finish_reason != "abort":
                return GenerateResult(tokens, logprobs, versions, out.finish_reason, request.request_id, attempt)
            if request.env_id in self._aborted_envs:
                raise GenerationAborted(request.env_id)
            if len(tokens) >= request.sampling.max_new_tokens:
                return GenerateResult(tokens, logprobs, versions, "length", request.request_id, attempt)
            attempt += 1
            self.stats["reissues"] += 1

    def _route(self, env_id: str) -> int:
        least = min(range(len(self._load)), key=self._load.__getitem__)
        sticky = self._sticky.get(env_id)
        if sticky is not None and self._load[sticky] <= self._load[least] + self.cfg.sticky_slack:
            return sticky
        if env_id:
            self._sticky[env_id] = least
        return least

    # ---- commands ------------------------------------------------------
    async def suspend(self) -> None:
        """Stop dispatch; abort in-flight requests (re-issued after resume) or let them finish."""
        self._running.clear()
        if self.cfg.suspend_mode == "abort":
            await asyncio.gather(*(self.engines[i].abort(sub) for sub, (i, _, _) in list(self._inflight.items())))
        await self._drained.wait()

    async def update_weights(self, push: Callable[[list, int], Awaitable[dict]], version: int) -> dict:
        """Run `push(engines, version)` while suspended; returns its report (bytes, seconds)."""
        if self._running.is_set():
            raise RuntimeError("update_weights needs a suspended proxy: call suspend() first")
        start = time.perf_counter()
        report = await push(self.engines, version)
        self.version = version
        report.setdefault("seconds", time.perf_counter() - start)
        return report

    async def resume(self) -> None:
        self._running.set()

    async def abort(self, env_id: str) -> None:
        """Abort every in-flight request of `env_id`; its callers get GenerationAborted."""
        self._aborted_envs.add(env_id)
        self.stats["user_aborts"] += 1
        targets = [(i, sub) for sub, (i, env, _) in list(self._inflight.items()) if env == env_id]
        await asyncio.gather(*(self.engines[i].abort(sub) for i, sub in targets))

    def clear_abort(self, env_id: str) -> None:
        self._aborted_envs.discard(env_id)

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    async def close(self) -> None:
        await asyncio.gather(*(e.close() for e in self.engines))


def _remaining(sampling: SamplingParams, used: int) -> SamplingParams:
    if used == 0:
        return sampling
    return SamplingParams(
        max_new_tokens=sampling.max_new_tokens - used,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        greedy=sampling.greedy,
        stop_token_ids=sampling.stop_token_ids,
    )
