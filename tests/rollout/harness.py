"""The real rollout stack on the shipped fakes (scripted engine, simulated env); the test
plays the trainer."""

from __future__ import annotations

import asyncio

from roll_agent.config import EnvSpec, ProxyConfig, RolloutConfig, ScriptedEngineConfig
from roll_agent.controller import update_weights
from roll_agent.proxy.engines.scripted import ScriptedEngine
from roll_agent.rollout.stack import RolloutStack, build_rollout


def build(formatter, rollout: RolloutConfig, env_kwargs: dict | None = None, num_engines: int = 2,
          engine_cfg: ScriptedEngineConfig | None = None, specs: list[EnvSpec] | None = None,
          proxy_cfg: ProxyConfig | None = None) -> RolloutStack:
    engines = [ScriptedEngine(engine_cfg or ScriptedEngineConfig(), seed=i) for i in range(num_engines)]
    specs = specs or [EnvSpec(id="roll_agent/Simulated-v0", kwargs=env_kwargs or {})]
    return build_rollout(formatter, rollout, specs, engines, proxy_cfg)


async def train_loop(stack: RolloutStack, steps: int, train_s: float = 0.0) -> list[tuple[int, list]]:
    """Consume `steps` batches like the controller; returns (train_version, batch) pairs."""
    stack.scheduler.start()
    consumed = []
    for v in range(steps):
        batch = await stack.buffer.get_batch(v)
        consumed.append((v, batch))
        if train_s:
            await asyncio.sleep(train_s)
        await update_weights(stack, v + 1)
    return consumed
