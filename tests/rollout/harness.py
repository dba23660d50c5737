"""The real rollout stack (proxy, env managers, groups, buffer) on the shipped fakes:
the scripted engine and the simulated env. The test plays the trainer."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from roll_agent.config import EnvSpec, ProxyConfig, RolloutConfig, ScriptedEngineConfig
from roll_agent.proxy.engines.scripted import ScriptedEngine
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.rollout.buffer import SampleBuffer
from roll_agent.rollout.env_manager import EnvManager
from roll_agent.rollout.groups import GroupScheduler


@dataclass
class Stack:
    proxy: LLMProxy
    buffer: SampleBuffer
    scheduler: GroupScheduler
    engines: list
    executor: ThreadPoolExecutor

    async def bump(self, version: int) -> None:
        """What the controller does after a training step: suspend, update, resume."""
        async def push(engines, v):
            for e in engines:
                await e.load_weights([], v)
            return {"bytes": 0}

        await self.proxy.suspend()
        await self.proxy.update_weights(push, version)
        await self.proxy.resume()
        await self.buffer.set_version(version)
        await self.scheduler.on_version(version)

    async def close(self) -> None:
        await self.scheduler.stop()
        await self.proxy.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


def build(formatter, rollout: RolloutConfig, env_kwargs: dict | None = None, num_engines: int = 2,
          engine_cfg: ScriptedEngineConfig | None = None, specs: list[EnvSpec] | None = None,
          proxy_cfg: ProxyConfig | None = None) -> Stack:
    engines = [ScriptedEngine(engine_cfg or ScriptedEngineConfig(), seed=i) for i in range(num_engines)]
    proxy = LLMProxy(engines, proxy_cfg or ProxyConfig())
    buffer = SampleBuffer(rollout)
    executor = ThreadPoolExecutor(32)
    specs = specs or [EnvSpec(id="roll_agent/Simulated-v0", kwargs=env_kwargs or {})]

    def manager(env_id, spec):
        return EnvManager(env_id, spec, formatter, proxy, rollout, executor)

    scheduler = GroupScheduler(rollout, specs, buffer, manager, seed=0)
    return Stack(proxy, buffer, scheduler, engines, executor)


async def train_loop(stack: Stack, steps: int, train_s: float = 0.0) -> list[tuple[int, list]]:
    """Consume `steps` batches like the controller; returns (train_version, batch) pairs."""
    stack.scheduler.start()
    consumed = []
    for v in range(steps):
        batch = await stack.buffer.get_batch(v)
        consumed.append((v, batch))
        if train_s:
            await asyncio.sleep(train_s)
        await stack.bump(v + 1)
    return consumed
