"""A deterministic fake engine, shipped for tests and benchmarks (never a default).

Tokens are a pure function of (prompt, seed); latency per request and per token is
configurable; abort returns the partial output at once, like a real engine. Its
log-probs depend on the loaded weights' version, so staleness and importance
weights are observable in tests. Tokens are streamed to `on_tokens` one at a time,
as they come out (after each token's latency); top-k alternatives, when asked, are
the sampled token first and k-1 other ids below it.

Fault injection (ScriptedEngineConfig): a request may raise (`fail_prob`) or hang until
aborted (`hang_prob`); every `crash_every`-th request crashes the engine: its in-flight
requests fail, it reports `alive == False` and refuses work until `restart()`.
Faults are drawn from (seed, request count), so a run is reproducible.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from typing import Callable, Iterable

from roll_agent.config import EngineConfig, ModelConfig, ScriptedEngineConfig
from roll_agent.registry import load_named
from roll_agent.types import EngineOutput, SamplingParams, TokenSink

Script = Callable[[list[int]], list[int]]


class EngineError(RuntimeError):
    """An injected engine fault: a failed request, or an engine that has crashed."""


class ScriptedEngine:
    alive = True  # False from a crash until restart()
    restartable = True  # restart(): back after restart_s with its initial weights

    def __init__(self, cfg: ScriptedEngineConfig | None = None, seed: int = 0, script: Script | None = None,
                 token_range: tuple[int, int] = (10, 200)):
        self.cfg = cfg or ScriptedEngineConfig()
        self.seed = seed
        self.script = script
        self.token_range = token_range
        self.version = 0
        self.weights_loaded = 0
        self.requests_served = 0
        self.aborted_ids: list[str] = []
        self._abort_events: dict[str, asyncio.Event] = {}
        self.restarts = 0
        self._requests = 0  # requests received, the clock the faults are drawn on

    def _tokens(self, prompt_ids: list[int], sampling: SamplingParams) -> tuple[list[int], str]:
        if self.script is not None:
            tokens = list(self.script(prompt_ids))
        else:
            tokens = self._autoregressive(prompt_ids, sampling)
        stop = set(sampling.stop_token_ids)
        for i, t in enumerate(tokens):
            if t in stop:
                return tokens[: i + 1], "stop"
            if i + 1 >= sampling.max_new_tokens:
                return tokens[: i + 1], "length"
        return tokens, "stop"

    def _autoregressive(self, prompt_ids: list[int], sampling: SamplingParams) -> list[int]:
        """Each token is a hash of the context before it, like a real model's greedy decode:
        re-issuing from a prefix continues exactly where an aborted request stopped.
        A response stops with probability 1/response_tokens per token (and at
        4 * response_tokens tokens)."""
        context = list(prompt_ids)
        out: list[int] = []
        lo, hi = self.token_range
        for _ in range(min(sampling.max_new_tokens, 4 * self.cfg.response_tokens)):
            digest = hashlib.blake2b(bytes(str((self.seed, context[-64:])), "utf8"), digest_size=8).digest()
            value = int.from_bytes(digest, "little")
            if sampling.stop_token_ids and value % self.cfg.response_tokens == 0 and out:
                out.append(sampling.stop_token_ids[0])
                break
            token = lo + value % (hi - lo)
            out.append(token)
            context.append(token)
        return out

    def _logprob(self, token: int) -> float:
        return -(1.0 + (token % 7) / 10.0) - 0.001 * self.version

    def _alternatives(self, token: int, k: int) -> list[tuple[int, float]]:
        """The k likeliest tokens where `token` was sampled: itself, then k-1 other ids, each less likely."""
        others = [token - j if token >= k else token + j for j in range(1, k)]
        return [(token, self._logprob(token))] + [(t, self._logprob(token) - 0.5 * j) for j, t in enumerate(others, 1)]

    async def _sleep(self, seconds: float, event: asyncio.Event) -> bool:
        """Sleep unless aborted; True when aborted."""
        if event.is_set():
            return True
        if seconds <= 0:
            return False
        try:
            async with asyncio.timeout(seconds):
                await event.wait()
            return True
        except asyncio.TimeoutError:
            return False

    def _fault(self) -> str:
        self._requests += 1
        cfg = self.cfg
        if cfg.crash_every and self._requests % cfg.crash_every == 0:
            return "crash"
        roll = random.Random(f"{self.seed}-{self._requests}").random()
        if roll < cfg.fail_prob:
            return "fail"
        return "hang" if roll < cfg.fail_prob + cfg.hang_prob else "ok"

    def _crash(self) -> None:
        self.alive = False
        for event in self._abort_events.values():
            event.set()  # in-flight requests wake up and fail

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str,
                       on_tokens: TokenSink | None = None) -> EngineOutput:
        if not self.alive:
            raise EngineError("engine is down (crashed); restart() it")
        fault = self._fault()
        if fault == "crash":
            self._crash()
            raise EngineError(f"engine crashed serving {request_id}")
        if fault == "fail":
            raise EngineError(f"injected failure of request {request_id}")
        event = self._abort_events.setdefault(request_id, asyncio.Event())
        try:
            if fault == "hang":
                await event.wait()
            tokens, reason = self._tokens(prompt_ids, sampling)
            k = sampling.top_logprobs
            out: list[int] = []
            aborted = await self._sleep(self.cfg.latency_s, event)
            for t in tokens:
                if aborted or await self._sleep(self.cfg.token_latency_s, event):
                    aborted = True
                    break
                out.append(t)
                if on_tokens is not None:
                    on_tokens([t], [self._logprob(t)], [self._alternatives(t, k)] if k else None)
            if not self.alive:
                raise EngineError(f"engine crashed while serving {request_id}")
            top = [self._alternatives(t, k) for t in out] if k else None
            if aborted:
                return EngineOutput(out, [self._logprob(x) for x in out], "abort", top)
            self.requests_served += 1
            return EngineOutput(out, [self._logprob(x) for x in out], reason, top)
        finally:
            self._abort_events.pop(request_id, None)

    async def restart(self) -> None:
        """Bring a crashed engine back (after `restart_s`), with its initial weights (version 0)."""
        await asyncio.sleep(self.cfg.restart_s)
        self.alive = True
        self.version = 0
        self.restarts += 1

    async def abort(self, request_id: str) -> None:
        self.aborted_ids.append(request_id)
        event = self._abort_events.get(request_id)
        if event is not None:
            event.set()

    async def load_weights(self, named_tensors: Iterable, version: int) -> None:
        if not self.alive:
            raise EngineError("engine is down (crashed); restart() it")
        for _ in named_tensors:
            pass
        self.weights_loaded += 1
        self.version = version

    async def close(self) -> None:
        for event in self._abort_events.values():
            event.set()


def scripted_engine(model_path: str, cfg: EngineConfig, model_cfg: ModelConfig, seed: int = 0) -> ScriptedEngine:
    """engine.type=scripted: a ScriptedEngine of `engine.scripted`, answering with its user script
    when `engine.scripted.script` names one."""
    script = text_script(cfg.scripted.script, model_path) if cfg.scripted.script else None
    return ScriptedEngine(cfg.scripted, seed=seed, script=script)


def text_script(path: str, model_path: str):
    """`engine.scripted.script`: a user's `module:function` (prompt text -> response text) as the
    scripted engine's token script, framed by the model's tokenizer (the response ends with its eos)."""
    from transformers import AutoTokenizer

    answer = load_named(path, "engine.scripted.script")
    tokenizer = AutoTokenizer.from_pretrained(model_path)

    def script(prompt_ids: list[int]) -> list[int]:
        text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        return tokenizer.encode(answer(text), add_special_tokens=False) + [tokenizer.eos_token_id]
    return script
