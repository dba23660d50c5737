"""The rollout side under Ray: the proxy over engine actors, the buffer actor, the env
workers, and the clients through which a component in one actor calls one in another.
Engines, trainer and proxy sit in `Host` actors; their clients are derived from the
contracts (roll_agent/runtime/forward.py, roll_agent/protocols.py).

Faults: an engine actor that dies is restarted by Ray. Its `RemoteEngine` then reports
itself not alive, and the LLMProxy handles it as it does any crashed engine: its requests
are re-issued from their prefix elsewhere (or wait for it), `restart()` waits for Ray's
restart, and the proxy pushes it the served weights before it serves again. Ray hands
calls made during a restart to the restarted actor, so a kill between requests raises
nothing: the restarted engine is caught by its weight version (an answer at another
version than it was synced to) or, at the next push, by its new pid (`confirm`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections import Counter
from dataclasses import dataclass, field

import ray
from ray.exceptions import RayActorError

from roll_agent.config import Config, RolloutConfig
from roll_agent.protocols import Buffer, Engine, Ledger, Proxy
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.rollout.accounting import PROXY_FAULTS
from roll_agent.rollout.buffer import SampleBuffer
from roll_agent.rollout.env_manager import EnvServices
from roll_agent.rollout.env_workers import EnvWorkers
from roll_agent.rollout.groups import GroupScheduler
from roll_agent.runtime.forward import answer, answer_async, forwards
from roll_agent.runtime.ray_supervisor import WorkerSnapshot, restarted_pid
from roll_agent.sync import actors as actor_sync
from roll_agent.sync import make_weight_sync
from roll_agent.types import EngineOutput, GenerateRequest, GenerateResult, Group, Status
from roll_agent.watchdog import Watchdog

log = logging.getLogger(__name__)


async def call(ref):
    """Await an actor call; if the awaiting task is cancelled, cancel the call too (a
    redundant episode's request must stop in the proxy and the engine, not run on).
    Not recursive: the cancelled call stops its own sub-calls (the proxy aborts the engine
    request); Ray's recursive cancel would fail them first, which the proxy counts as
    request failures."""
    try:
        return await ref
    except asyncio.CancelledError:
        ray.cancel(ref, recursive=False)
        raise


# ---- proxy and engines -----------------------------------------------------------
class EngineLost(RuntimeError):
    """The engine actor died, or was restarted since it was last synced."""


@forwards(Engine)
class RemoteEngine:
    """An engine actor (a Host of the engine) as the LLMProxy sees it: the Engine protocol,
    forwarded; an actor that died or restarted makes the call fail with `alive` false."""

    alive = True  # False once a call found the actor dead or restarted, until restart()
    restartable = True  # restart(): Ray restarts the actor; this waits until it answers

    def __init__(self, handle, index: int):
        self.handle = handle
        self.index = index
        self.version = 0  # the version last pushed to it
        self.pid = None  # the actor's process as of the last push: another one is a restart

    def _lost(self, why: str) -> EngineLost:
        self.alive = False
        return EngineLost(f"engine {self.index} {why}")

    async def _forward_async(self, name: str, args: tuple, kwargs: dict):
        """The actor's answer; its own state is not taken over (`version` is what was pushed to it)."""
        try:
            result, state = await call(self.handle.invoke.remote(name, args, kwargs))
        except RayActorError as exc:
            raise self._lost(f"died: {exc}") from exc
        if state["version"] != self.version:  # restarted between requests: it serves its initial weights
            raise self._lost(f"answered at version {state['version']}, pushed {self.version}: restarted")
        return result, {}

    async def generate(self, prompt_ids, sampling, request_id, on_tokens=None) -> EngineOutput:
        """The actor's answer, whole: a token sink does not cross processes (`on_tokens` is not called)."""
        return (await self._forward_async("generate", (prompt_ids, sampling, request_id), {}))[0]

    async def abort(self, request_id: str) -> None:
        """Forwarded while the actor is alive; a dead one has nothing left to abort."""
        if self.alive:
            try:
                await self._forward_async("abort", (request_id,), {})
            except EngineLost:
                pass

    async def restart(self) -> None:
        """Wait for Ray's restart of the actor (ActorDiedError once its restarts are spent)."""
        self.pid = await restarted_pid(self.handle.ping.remote, f"engine {self.index}")
        self.alive = True

    async def confirm(self) -> None:
        """Before a push: raise EngineLost if the actor died or is a new process since the last one."""
        try:
            pid = await self.handle.ping.remote()
        except RayActorError as exc:
            raise self._lost(f"died: {exc}") from exc
        if self.pid is not None and pid != self.pid:
            raise self._lost(f"was restarted (pid {self.pid} -> {pid})")
        self.pid = pid

    async def apply(self, fn, *args):
        """`fn(engine, *args)` in the actor (a weight sync's work there)."""
        try:
            return await self.handle.apply.remote(fn, *args)
        except RayActorError as exc:
            raise self._lost(f"died: {exc}") from exc

    async def load_weights(self, named_tensors, version: int, verify: bool = False) -> tuple[int, dict]:
        """Weights through the object store: `named_tensors` is best the object the trainer returned
        (an ObjectRef: each engine actor reads it, nothing passes through this one). Returns the bytes
        and, when verifying, the received tensors' checksums."""
        if not isinstance(named_tensors, ray.ObjectRef):
            named_tensors = list(named_tensors)
        moved = await self.apply(actor_sync.load_weights, named_tensors, version, verify)
        self.version = version
        return moved

    async def close(self) -> None:
        """The engine closes in its actor and leaves the weight-broadcast group; a dead one has nothing to close."""
        try:
            await self.apply(_close_engine)
        except EngineLost:
            pass


async def _close_engine(engine) -> None:
    await engine.close()
    actor_sync.leave_group()


def build_proxy(cfg: Config, engine_handles: list, trainer, version: int) -> LLMProxy:
    """The proxy actor's component: the LLMProxy over the engine actors, pushing the trainer
    actor's weights into them (roll_agent/sync/__init__.py: broadcast or object_store)."""
    sync = make_weight_sync(cfg, trainer)
    engines = [RemoteEngine(h, i) for i, h in enumerate(engine_handles)]
    # the watchdog times requests (request_timeout_s); its counts reach the driver's (`report`)
    return LLMProxy(engines, cfg.proxy, version=version, watchdog=Watchdog(cfg.watchdog), weight_sync=sync)


# what the driver runs in the proxy actor (`Host.apply`), beside the Proxy contract
@dataclass
class ProxyReport:
    """The proxy actor's counters, as the driver's refresh reads them."""

    stats: dict  # LLMProxy.stats and the served version
    watchdog: dict  # its watchdog's counters (requests stuck)
    oldest: list[str]  # its oldest waits


def report(proxy: LLMProxy) -> ProxyReport:
    return ProxyReport({**proxy.stats, "version": proxy.version}, dict(proxy.watchdog.stats), proxy.watchdog.oldest())


async def close_proxy(proxy: LLMProxy) -> None:
    await proxy.close()
    await proxy.watchdog.close()


@forwards(Proxy)
class RemoteProxy:
    """The proxy actor as an EnvManager (or the controller) sees it. `version` is the served
    version as of the last answer, or as the env worker set it at a weight update."""

    def __init__(self, handle, version: int = 0):
        self.handle = handle
        self.version = version
        self.stats: dict = {"gen_tokens": 0, **dict.fromkeys(PROXY_FAULTS, 0)}  # the driver's, as of its last refresh

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """The answer, whole: a token sink does not cross processes (the request goes without it)."""
        result, state = await self._forward_async("generate", (dataclasses.replace(request, on_tokens=None),), {})
        self.__dict__.update(state)
        return result

    async def _forward_async(self, name: str, args: tuple, kwargs: dict):
        return await call(self.handle.invoke.remote(name, args, kwargs))

    def _forward(self, name: str, args: tuple, kwargs: dict):
        self.handle.invoke.remote(name, args, kwargs)  # a notification: not waited for
        return None, {}

    async def refresh(self) -> ProxyReport:
        """The proxy actor's counters now (`stats` takes them)."""
        report_now = await self.handle.apply.remote(report)
        self.stats = report_now.stats
        return report_now

    async def close(self) -> None:
        await self.handle.apply.remote(close_proxy)


# ---- buffer and env workers ---------------------------------------------------------
@dataclass
class BufferSnapshot:
    """What the driver reads of the buffer actor synchronously, taken at one instant."""

    counts: dict = field(default_factory=dict)  # the episode ledger's
    in_flight: int = 0  # started, not ended: in env workers, or waiting here
    waiting: int = 0  # groups ready to train on
    state: dict = field(default_factory=dict)  # what a checkpoint keeps (the episodes in flight counted as cancelled)
    held: dict = field(default_factory=dict)  # (worker, incarnation) -> groups admitted, not yet put
    stats: dict = field(default_factory=lambda: {"groups_put": 0})  # the SampleBuffer's counters
    reasons: dict = field(default_factory=dict)  # the ledger's failure counts by reason class
    examples: dict = field(default_factory=dict)  # and the first reason of each


class BufferHost:
    """The SampleBuffer, its episode ledger, and who holds what: the admission places and
    in-flight episodes of an env worker that died are given back (places) and ended as
    `lost` (episodes), so neither admission nor accounting leaks."""

    def __init__(self, cfg: RolloutConfig, version: int):
        self.buffer = SampleBuffer(cfg, version=version)
        self.held: Counter = Counter()  # (worker, incarnation) -> groups admitted, not yet put/released
        self.in_flight: Counter = Counter()  # (worker, incarnation) -> episodes started, not ended in a lane nor put
        self.dead: set = set()
        self.last_group_id: dict[int, int] = {}  # worker -> highest group id it put

    async def call_as(self, owner: tuple, name: str, args: tuple, kwargs: dict):
        """A Buffer call (or, named `ledger.start` / `ledger.end`, a Ledger call) of the env-worker
        incarnation `owner` (a RemoteBuffer's)."""
        view = OwnedBuffer(self, owner)
        if name.startswith("ledger."):
            return answer(view, Ledger, name.removeprefix("ledger."), args, kwargs)
        return await answer_async(view, Buffer, name, args, kwargs)

    async def release_owner(self, owner: tuple) -> int:
        """The worker incarnation `owner` died: give back its places, end its episodes as lost
        (returns how many)."""
        self.dead.add(owner)
        for _ in range(self.held.pop(owner, 0)):
            await self.buffer.release()
        lost = self.in_flight.pop(owner, 0)
        self.buffer.ledger.end(Status.LOST, lost, f"EnvWorkerDied: env worker {owner[0]} (incarnation {owner[1]}) "
                                                  "died with these episodes in flight")
        return lost

    def barrier(self) -> None:
        """Called by a worker after its fire-and-forget ledger calls: answered once they are counted."""

    def last_group_ids(self) -> dict[int, int]:
        return dict(self.last_group_id)

    async def get_batch(self, train_version: int) -> list[Group]:
        return await self.buffer.get_batch(train_version)

    async def set_version(self, version: int) -> None:
        await self.buffer.set_version(version)

    def snapshot(self) -> BufferSnapshot:
        in_flight = sum(self.in_flight.values()) + self.buffer.num_waiting_episodes
        ledger = self.buffer.ledger
        return BufferSnapshot(dict(ledger.counts), in_flight, len(self.buffer), self.buffer.state_dict(in_flight),
                              dict(self.held), dict(self.buffer.stats), dict(ledger.reasons), dict(ledger.examples))

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state)


class OwnedBuffer:
    """The Buffer (and its Ledger) as one env-worker incarnation fills it, in the buffer actor:
    every call is counted against its owner; a dead owner's late calls change nothing."""

    is_fresh = SampleBuffer.is_fresh

    def __init__(self, host: BufferHost, owner: tuple):
        self.host, self.owner = host, owner
        self.async_ratio = host.buffer.async_ratio
        self.ledger = self

    def start(self, n: int = 1) -> None:
        if self.owner not in self.host.dead:
            self.host.buffer.ledger.start(n)
            self.host.in_flight[self.owner] += n

    def end(self, outcome: Status, n: int = 1, reason: str = "") -> None:
        if self.owner not in self.host.dead:  # a late message of a dead worker: its episodes already ended as lost
            self.host.buffer.ledger.end(outcome, n, reason)
            self.host.in_flight[self.owner] -= n

    async def admit(self) -> None:
        host = self.host
        await host.buffer.admit()
        if self.owner in host.dead:  # admitted after its worker died: nobody will use the places
            await host.buffer.release()
        else:
            host.held[self.owner] += 1

    async def release(self) -> None:
        if self.owner not in self.host.dead:
            self.host.held[self.owner] -= 1
            await self.host.buffer.release()

    async def put(self, group: Group) -> None:
        host = self.host
        if self.owner not in host.dead:
            host.held[self.owner] -= 1
            host.in_flight[self.owner] -= len(group.trajectories)  # in flight still, now counted as waiting here
            host.last_group_id[self.owner[0]] = max(group.group_id, host.last_group_id.get(self.owner[0], -1))
            await host.buffer.put(group)


@forwards(Ledger)
class RemoteLedger:
    """The buffer actor's ledger as a GroupScheduler records into it (from done callbacks, so the
    calls are notifications; Ray delivers one caller's calls in order)."""

    def __init__(self, handle, owner: tuple):
        self.handle, self.owner = handle, owner

    def _forward(self, name: str, args: tuple, kwargs: dict):
        self.handle.call_as.remote(self.owner, f"ledger.{name}", args, kwargs)
        return None, {}


@forwards(Buffer)
class RemoteBuffer:
    """The buffer actor as a GroupScheduler sees it, on behalf of one env-worker incarnation."""

    is_fresh = SampleBuffer.is_fresh  # a pure function of async_ratio: no call needed

    def __init__(self, handle, cfg: RolloutConfig, owner: tuple):
        self.handle, self.owner = handle, owner
        self.async_ratio = cfg.async_ratio
        self.ledger = RemoteLedger(handle, owner)

    async def _forward_async(self, name: str, args: tuple, kwargs: dict):
        return await call(self.handle.call_as.remote(self.owner, name, args, kwargs))


class EnvWorker:
    """Many env groups in one actor: a GroupScheduler over this worker's share of the lanes, its
    env managers built as the local rollout's are (EnvServices), generating through the proxy
    actor and filling the buffer actor."""

    def __init__(self, cfg: Config, index: int, num_workers: int, model_path: str, proxy, buffer):
        from transformers import AutoTokenizer

        from roll_agent.rollout.chat import ChatFormatter

        self.cfg = cfg
        self.index = index
        self.lane_ids = range(index, cfg.rollout.num_env_groups, num_workers)
        self.formatter = ChatFormatter(AutoTokenizer.from_pretrained(model_path))
        self.proxy_handle, self.buffer_handle = proxy, buffer
        self.env_workers = EnvWorkers()  # worker processes for envs that are not thread-safe, warming up now
        self.env_workers.start(cfg.envs)
        self.services: EnvServices | None = None
        self.scheduler: GroupScheduler | None = None
        self.incarnation = -1
        self._stop = asyncio.Event()

    async def run(self, incarnation: int, version: int, state: dict | None) -> WorkerSnapshot:
        """Drive this worker's lanes until stop(); returns its final snapshot."""
        cfg = self.cfg
        self.incarnation = incarnation
        # agent envs' agents call this actor's own endpoint (a free port each: several actors per node)
        self.services = EnvServices.build(self.formatter, cfg.rollout, RemoteProxy(self.proxy_handle, version),
                                          cfg.envs, Watchdog(cfg.watchdog), dataclasses.replace(cfg.endpoint, port=0),
                                          self.env_workers)
        buffer = RemoteBuffer(self.buffer_handle, cfg.rollout, (self.index, incarnation))
        seed = cfg.seed + 10_007 * self.index + 1_000_003 * incarnation  # a restart plays new tasks
        first = state["next_group_id"] if state else self.index
        self.scheduler = GroupScheduler(cfg.rollout, cfg.envs, buffer, self.services.env_manager, seed=seed,
                                        first_group_id=first, lane_ids=self.lane_ids, group_id_stride=self.lane_ids.step)
        if state and "rng" in state:
            self.scheduler.load_state_dict(state)
        self.scheduler.start()
        await self._stop.wait()
        await self.scheduler.stop()
        await self.buffer_handle.barrier.remote()  # the cancelled episodes are counted before run() returns
        snapshot = self.snapshot()
        await self.services.close()
        return snapshot

    async def cancel_running(self) -> int:
        return await self.scheduler.cancel_running() if self.scheduler is not None else 0

    async def on_version(self, version: int) -> None:
        if self.scheduler is not None:
            self.services.proxy.version = version
            await self.scheduler.on_version(version)

    def snapshot(self) -> WorkerSnapshot:
        if self.scheduler is None:
            return WorkerSnapshot(self.incarnation)
        services = self.services
        return WorkerSnapshot(self.incarnation, self.scheduler.state_dict(), dict(services.watchdog.stats),
                              services.watchdog.oldest(), services.workers.restarts(), dict(services.endpoint.http_errors))

    def stop(self) -> None:
        self._stop.set()

    def pid(self) -> int:
        return os.getpid()
