"""LLMProxy: one front door to several inference engines.

Routing is least-loaded first, then sticky per env (prefix-cache reuse). A weight
update is suspend -> update -> resume: suspend stops dispatch and aborts in-flight
requests (or lets them drain); each aborted request keeps its partial tokens and is
re-issued from its prefix after resume, so callers never see the abort and per-token
versions show the switch. A request with a token sink (`GenerateRequest.on_tokens`) gets its
tokens as the engine samples them (an engine that cannot stream: each engine call's at its
end), across re-issues each once: what was streamed stays in the answer, also when the engine
call then fails.

The proxy owns its WeightSync (roll_agent/protocols.py): the controller's update is
`suspend(); push_weights(version); resume()`, and a restarted engine is pushed the
served weights the same way, one update at a time.

Faults: a request that raises or passes the watchdog's `request_timeout_s` is aborted
and re-issued from its prefix on another engine (up to `max_request_retries` times).
An engine that reports itself dead (`alive` false: after a failed request, or a failed
push) is taken out of routing, restarted in the background when it can be
(`restart()`), given the served weights, and put back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass

from roll_agent.config import ProxyConfig
from roll_agent.protocols import SyncReport, Unsupported, WeightSync
from roll_agent.sync.inprocess import VersionOnlySync
from roll_agent.types import GenerateRequest, GenerateResult, TokenSink
from roll_agent.watchdog import Watchdog

log = logging.getLogger(__name__)


class EngineFailure(RuntimeError):
    """A request failed on every try, or no engine is left to serve it."""


class LLMProxy:
    def __init__(self, engines: list, cfg: ProxyConfig | None = None, version: int = 0,
                 watchdog: Watchdog | None = None, weight_sync: WeightSync | None = None):
        """`weight_sync`: how the trainer's weights reach these engines (None: the version only,
        for engines with no weights to load)."""
        if not engines:
            raise ValueError("LLMProxy needs at least one engine")
        self.engines = engines
        self.cfg = cfg or ProxyConfig()
        self.version = version
        self._load = [0] * len(engines)
        self._sticky: dict[str, int] = {}
        self._inflight: dict[str, tuple[int, str, str]] = {}  # sub-request id -> (engine, env, request)
        self._running = asyncio.Event()
        self._running.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self.watchdog = watchdog or Watchdog()
        self._down: set[int] = set()  # crashed engines, out of routing until restarted
        self._up = asyncio.Event()  # set whenever an engine comes back
        self._restarts: set[asyncio.Task] = set()
        self.weight_sync = weight_sync or VersionOnlySync()
        self._updating = asyncio.Lock()  # held from suspend() to resume(), and by a restart's push
        self.stats = {"requests": 0, "reissues": 0, "gen_tokens": 0, "request_failures": 0,
                      "engine_crashes": 0, "engine_restarts": 0, "sync_retries": 0}

    # ---- callers -------------------------------------------------------
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        answer = _Answer(request.on_tokens, request.sampling.top_logprobs > 0)
        attempt = failures = 0
        failed_on: set[int] = set()  # engines this request failed on: tried last
        self.stats["requests"] += 1
        while True:
            await self._running.wait()
            idx = await self._route_live(request.env_id, failed_on)
            version = self.version
            sub_id = f"{request.request_id}.{attempt}"
            sampling = dataclasses.replace(request.sampling,
                                           max_new_tokens=request.sampling.max_new_tokens - len(answer.tokens))
            streamed = _Streamed(answer, version) if request.on_tokens else None
            self._inflight[sub_id] = (idx, request.env_id, request.request_id)
            self._load[idx] += 1
            self._drained.clear()
            try:
                async with self.watchdog.watch("request", f"request {sub_id} of env {request.env_id} on engine {idx}",
                                               self.watchdog.cfg.request_timeout_s):
                    out = await self.engines[idx].generate(request.prompt_ids + answer.tokens, sampling, sub_id,
                                                           on_tokens=streamed)
            except asyncio.CancelledError:
                await self.engines[idx].abort(sub_id)
                raise
            except Unsupported:  # the request, not the engine: the caller is told
                raise
            except Exception as exc:  # engine error, crash, or stuck past the watchdog: re-issue elsewhere
                failures += 1  # (what it streamed stays: the caller has seen it, and it was sampled)
                failed_on.add(idx)
                await self._failed(idx, sub_id, request, exc, failures)
                attempt += 1
                continue
            finally:
                if streamed is not None:
                    streamed.open = False  # a late call from the engine is not part of the answer
                self._load[idx] -= 1
                del self._inflight[sub_id]
                if not self._inflight:
                    self._drained.set()
            done = streamed.count if streamed is not None else 0  # already in the answer
            top = out.top_logprobs[done:] if out.top_logprobs is not None else None
            answer.add(out.token_ids[done:], out.logprobs[done:], top, version)
            self.stats["gen_tokens"] += len(out.token_ids)
            if out.finish_reason != "abort":
                return answer.result(out.finish_reason, request.request_id, attempt)
            if len(answer.tokens) >= request.sampling.max_new_tokens:
                return answer.result("length", request.request_id, attempt)
            attempt += 1
            self.stats["reissues"] += 1

    async def _failed(self, idx: int, sub_id: str, request: GenerateRequest, exc: Exception, failures: int) -> None:
        self.stats["request_failures"] += 1
        self._sticky.pop(request.env_id, None)  # try another engine next
        await self.engines[idx].abort(sub_id)  # a stuck request must not keep running on the engine
        if not self.engines[idx].alive:
            self._crashed(idx, exc)
        if failures > self.cfg.max_request_retries:
            raise EngineFailure(f"request {request.request_id} of env {request.env_id} failed {failures} times; "
                                f"last: {type(exc).__name__}: {exc}") from exc
        self.stats["reissues"] += 1

    def _crashed(self, idx: int, exc: BaseException) -> None:
        """Engine `idx` reported itself dead: out of routing, restarted in the background if it can be."""
        if idx in self._down:
            return
        self.stats["engine_crashes"] += 1
        log.warning("engine %d crashed (%s): out of routing until restarted", idx, exc)
        self._down.add(idx)
        if self.engines[idx].restartable:
            task = asyncio.create_task(self._restart(idx), name=f"restart-engine-{idx}")
            self._restarts.add(task)
            task.add_done_callback(self._restarts.discard)

    async def _restart(self, idx: int) -> None:
        engine = self.engines[idx]
        try:
            await engine.restart()
            async with self._updating:  # not during a weight update: the weights served now, not its initial ones
                await self.weight_sync.push([engine], self.version)
        except Exception:
            log.exception("engine %d failed to restart; it stays out of routing", idx)
            return
        self.stats["engine_restarts"] += 1
        self._down.discard(idx)
        self._up.set()

    async def _route_live(self, env_id: str, avoid: set[int]) -> int:
        """Route among live engines; with all down, wait for a restart (none pending: EngineFailure)."""
        while len(self._down) == len(self.engines):
            if not self._restarts:
                raise EngineFailure("every engine has crashed and none can be restarted")
            self._up.clear()
            await self._up.wait()
        if avoid:
            live = [i for i in range(len(self.engines)) if i not in self._down]
            others = [i for i in live if i not in avoid] or live
            return min(others, key=self._load.__getitem__)
        return self._route(env_id)

    def _route(self, env_id: str) -> int:
        live = [i for i in range(len(self.engines)) if i not in self._down]
        least = min(live, key=self._load.__getitem__)
        sticky = self._sticky.get(env_id)
        if (sticky is not None and sticky not in self._down
                and self._load[sticky] <= self._load[least] + self.cfg.sticky_slack):
            return sticky
        if env_id:
            self._sticky[env_id] = least
        return least

    # ---- commands ------------------------------------------------------
    async def suspend(self) -> None:
        """Stop dispatch; abort in-flight requests (re-issued after resume) or let them finish.
        One suspend at a time: a second (or a restart's push) waits for the first's resume."""
        await self._updating.acquire()
        self._running.clear()
        if self.cfg.suspend_mode == "abort":
            await asyncio.gather(*(self.engines[i].abort(sub) for sub, (i, _, _) in list(self._inflight.items())))
        await self._drained.wait()

    async def push_weights(self, version: int) -> SyncReport:
        """Push `version` into the live engines (a restarted one gets it from its restart). An
        engine that dies during the push is taken out (and restarted), and the rest pushed again."""
        if self._running.is_set():
            raise RuntimeError("push_weights needs a suspended proxy: call suspend() first")
        start = time.perf_counter()
        report: SyncReport = {"bytes": 0, "seconds": 0.0}
        while live := [i for i in range(len(self.engines)) if i not in self._down]:
            try:
                report = await self.weight_sync.push([self.engines[i] for i in live], version)
                break
            except Exception as exc:
                lost = [i for i in live if not self.engines[i].alive]
                if not lost:  # no engine died: the sync itself failed
                    raise
                self.stats["sync_retries"] += 1
                for i in lost:
                    self._crashed(i, exc)
        self.version = version
        return {**report, "seconds": time.perf_counter() - start}

    async def resume(self) -> None:
        self._running.set()
        self._updating.release()

    async def close(self) -> None:
        for task in list(self._restarts):
            task.cancel()
        await asyncio.gather(*self._restarts, return_exceptions=True)
        await asyncio.gather(*(e.close() for e in self.engines))


class _Answer:
    """A request's tokens so far, over its re-issues. Each run added is passed on to the request's
    sink at once: a streaming caller sees every token of the answer once, in order, and no other."""

    def __init__(self, sink: TokenSink | None, top: bool):
        self.sink = sink
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.top: list | None = [] if top else None

    def add(self, ids: list[int], logprobs: list[float], top: list | None, version: int) -> None:
        if not ids:
            return
        if self.top is not None:
            if top is None:
                raise Unsupported("an engine returned no top_logprobs though they were asked for", "top_logprobs")
            self.top += top
        self.tokens += ids
        self.logprobs += logprobs
        self.versions += [version] * len(ids)
        if self.sink is not None:
            self.sink(ids, logprobs, top)

    def result(self, finish_reason: str, request_id: str, reissues: int) -> GenerateResult:
        return GenerateResult(self.tokens, self.logprobs, self.versions, finish_reason, request_id, reissues, self.top)


@dataclass
class _Streamed:
    """One engine call's sink: the tokens it streams join the answer as they come, until the call is over."""

    answer: _Answer
    version: int
    count: int = 0
    open: bool = True

    def __call__(self, ids: list[int], logprobs: list[float], top: list | None = None) -> None:
        if self.open:
            self.count += len(ids)
            self.answer.add(ids, logprobs, top, self.version)
