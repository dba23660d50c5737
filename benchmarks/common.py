"""Shared assembly for the rollout benchmarks: the real stack (LLMProxy + scripted
engines, EnvManagers, GroupScheduler, SampleBuffer) on the simulated env, the way
tests/rollout/harness.py assembles it (copied, so benchmarks never import tests/)."""

from __future__ import annotations

import os
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from roll_agent.config import EndpointConfig, EnvSpec, ProxyConfig, RolloutConfig, ScriptedEngineConfig  # noqa: E402
from roll_agent.controller import update_weights  # noqa: E402
from roll_agent.proxy.engines.scripted import ScriptedEngine  # noqa: E402
from roll_agent.rollout.chat import ChatFormatter  # noqa: E402
from roll_agent.rollout.stack import RolloutStack, build_rollout  # noqa: E402

SIM_ID = "roll_agent/Simulated-v0"


def make_formatter() -> ChatFormatter:
    """A small BPE tokenizer with the ChatML template, trained on the simulated env's text."""
    from roll_agent.tiny_model import build_tokenizer

    corpus = ["Answer with any text. This env is simulated.", "task 123456 step 7", "left right up down"] * 20
    return ChatFormatter(build_tokenizer(corpus, vocab_size=300))


def sim_spec(tag: str = "", num_groups: int = 0, **kwargs) -> EnvSpec:
    return EnvSpec(id=SIM_ID, tag=tag, num_groups=num_groups, kwargs=kwargs)


def scripted_engines(engine_cfg: ScriptedEngineConfig, num_engines: int = 2) -> list[ScriptedEngine]:
    return [ScriptedEngine(engine_cfg, seed=i) for i in range(num_engines)]


def build_stack(formatter: ChatFormatter, rollout: RolloutConfig, specs: list[EnvSpec],
                engine_cfg: ScriptedEngineConfig, num_engines: int = 2, endpoint: EndpointConfig | None = None
                ) -> RolloutStack:
    return build_rollout(formatter, rollout, specs, scripted_engines(engine_cfg, num_engines), ProxyConfig(),
                         endpoint_cfg=endpoint)


async def consume(stack: RolloutStack, batches: int, on_batch=None) -> tuple[float, list[float]]:
    """Play the trainer with zero training time: take `batches` batches, bumping the version
    after each like the controller. Returns (wall seconds from scheduler start, per-batch
    fill times: from the moment the previous version was live to the batch being ready)."""
    start = live = time.perf_counter()
    fills = []
    stack.scheduler.start()
    try:
        for v in range(batches):
            batch = await stack.buffer.get_batch(v)
            fills.append(time.perf_counter() - live)
            if on_batch is not None:
                on_batch(v, batch)
            await update_weights(stack, v + 1)
            live = time.perf_counter()
        return time.perf_counter() - start, fills
    finally:
        await stack.close()


def table(rows: list[tuple], header: tuple) -> str:
    cols = [header] + [tuple(f"{c:.3f}" if isinstance(c, float) else str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cols]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def result_line(**values) -> str:
    return "RESULT " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
