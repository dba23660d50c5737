"""The rollout half of the system, assembled: LLMProxy, one EnvManager per env in
groups, the GroupScheduler and the SampleBuffer, plus what the EnvManagers share
(`EnvServices`: the thread pool for blocking envs, the worker processes for envs that are not
thread-safe, and the OpenAI-compatible endpoint agent envs' agents call, started on first use).
The training run, the tests and the benchmarks all build it here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roll_agent.config import EndpointConfig, EnvSpec, ProxyConfig, RolloutConfig, WatchdogConfig
from roll_agent.protocols import WeightSync
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.rollout.accounting import RolloutStats
from roll_agent.rollout.buffer import SampleBuffer
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.rollout.env_manager import EnvManager, EnvServices
from roll_agent.rollout.env_workers import EnvWorkers
from roll_agent.rollout.groups import GroupScheduler
from roll_agent.types import Group
from roll_agent.watchdog import Watchdog

@dataclass
class RolloutStack:
    """The Rollout contract (roll_agent/protocols.py) over its parts. Locally they are the parts
    themselves; under Ray (roll_agent/runtime/ray_runtime.py) the proxy, buffer and scheduler are
    clients of the proxy actor, the buffer actor and the env-worker actors with the same interface."""

    proxy: Any  # LLMProxy
    buffer: Any  # SampleBuffer
    scheduler: Any  # GroupScheduler
    services: EnvServices  # what the env managers share (evaluation envs' included)

    @property
    def watchdog(self) -> Watchdog:
        return self.services.watchdog

    def env_manager(self, env_id: str, spec: EnvSpec) -> EnvManager:
        return self.services.env_manager(env_id, spec)

    def start(self) -> None:
        self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()
        await self.refresh()  # the controller's last accounting row reads it

    async def get_batch(self, version: int) -> list[Group]:
        return await self.buffer.get_batch(version)

    def num_ready(self) -> int:
        return len(self.buffer)

    async def cancel_running(self) -> int:
        return await self.scheduler.cancel_running()

    def state_dict(self) -> dict:
        return {"buffer": self.buffer.state_dict(self.scheduler.num_in_flight),
                "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state["buffer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def stats(self) -> RolloutStats:
        """The cumulative counters now (`.accounting()`: the episode identity check)."""
        services = self.services
        return RolloutStats.of(self.buffer.ledger, self.scheduler.num_in_flight, self.proxy.stats,
                               self.watchdog.metrics(), services.workers.restarts(), services.endpoint.http_errors,
                               self.buffer.stats["groups_put"])

    async def on_version(self, version: int) -> None:
        await self.buffer.set_version(version)
        await self.scheduler.on_version(version)
        await self.refresh()

    async def refresh(self) -> None:
        """Nothing to pull: the counters `stats()` reads are in this process."""

    async def close(self) -> None:
        try:
            await self.scheduler.stop()
            await self.proxy.close()
        finally:
            await self.services.close()


def build_rollout(formatter: ChatFormatter, cfg: RolloutConfig, specs: list[EnvSpec], engines: list,
                  proxy_cfg: ProxyConfig | None = None, seed: int = 0, version: int = 0,
                  watchdog_cfg: WatchdogConfig | None = None, weight_sync: WeightSync | None = None,
                  endpoint_cfg: EndpointConfig | None = None, workers: EnvWorkers | None = None) -> RolloutStack:
    """`weight_sync`: how the trainer's weights reach `engines` (None: only the version, for scripted engines).
    `workers`: env worker processes already started (`EnvWorkers.start`); the stack closes them."""
    watchdog = Watchdog(watchdog_cfg)
    proxy = LLMProxy(engines, proxy_cfg, version=version, watchdog=watchdog, weight_sync=weight_sync)
    buffer = SampleBuffer(cfg, version=version)
    services = EnvServices.build(formatter, cfg, proxy, specs, watchdog, endpoint_cfg, workers)
    scheduler = GroupScheduler(cfg, specs, buffer, services.env_manager, seed=seed)
    return RolloutStack(proxy, buffer, scheduler, services)
