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
from concurrent.futures import ThreadPoolExecutor

import ray
from ray.exceptions import RayActorError

from roll_agent.agents.server import AgentEndpoint
from roll_agent.config import Config, RolloutConfig
from roll_agent.protocols import Buffer, Ledger, Proxy
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.rollout.buffer import SampleBuffer
from roll_agent.rollout.env_manager import EnvManager
from roll_agent.rollout.env_workers import EnvWorkers
from roll_agent.rollout.groups import GroupScheduler
from roll_agent.runtime.forward import answer, answer_async, forwards
from roll_agent.runtime.ray_supervisor import restarted_pid
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


class RemoteEngine:
    """An engine actor (a Host of the engine) as the LLMProxy sees it: the Engine protocol; an
    actor that died or restarted makes the call fail with `alive` false."""

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

    async def generate(self, prompt_ids, sampling, request_id, on_tokens=None) -> EngineOutput:
        """The actor's answer, whole: a token sink does not cross processes (`on_tokens` is not called)."""
        try:
            output, state = await call(self.handle.invoke.remote("generate", (prompt_ids, sampling, request_id), {}))
        except RayActorError as exc:
            raise self._lost(f"died: {exc}") from exc
        if state["version"] != self.version:  # restarted between requests: it serves its initial weights
            raise self._lost(f"answered at version {state['version']}, pushed {self.version}: restarted")
        return output

    async def abort(self, request_id: str) -> None:
        if self.alive:
            try:
                await self.handle.invoke.remote("abort", (request_id,), {})
            except RayActorError:
                self.alive = False

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
        try:
            await self.handle.apply.remote(_close_engine)
        except RayActorError:
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
def start_proxy(proxy: LLMProxy) -> None:
    proxy.watchdog.start()


def report(proxy: LLMProxy) -> dict:
    return {"stats": {**proxy.stats, "version": proxy.version}, "watchdog": dict(proxy.watchdog.stats),
            "oldest": proxy.watchdog.oldest()}


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


# ---- buffer and env workers ---------------------------------------------------------
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
        self.buffer.ledger.end(Status.LOST, lost)
        return lost

    def barrier(self) -> None:
        """Called by a worker after its fire-and-forget ledger calls: answered once they are counted."""

    def last_group_ids(self) -> dict[int, int]:
        return dict(self.last_group_id)

    async def get_batch(self, train_version: int) -> list[Group]:
        return await self.buffer.get_batch(train_version)

    async def set_version(self, version: int) -> None:
        await self.buffer.set_version(version)

    def snapshot(self) -> dict:
        """What the driver's façades read synchronously, taken at one instant (`state`: what a
        checkpoint keeps, the episodes in flight counted as cancelled)."""
        in_flight = sum(self.in_flight.values()) + self.buffer.num_waiting_episodes
        return {"stats": dict(self.buffer.stats), "state": self.buffer.state_dict(in_flight), "held": dict(self.held),
                "counts": dict(self.buffer.ledger.counts), "waiting": len(self.buffer), "in_flight": in_flight}

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

    def end(self, outcome: Status, n: int = 1) -> None:
        if self.owner not in self.host.dead:  # a late message of a dead worker: its episodes already ended as lost
            self.host.buffer.ledger.end(outcome, n)
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
    """Many env groups in one actor: a GroupScheduler over this worker's share of the lanes."""

    def __init__(self, cfg: Config, index: int, num_workers: int, model_path: str, proxy, buffer):
        from transformers import AutoTokenizer

        from roll_agent.rollout.chat import ChatFormatter

        self.cfg = cfg
        self.index = index
        self.lane_ids = range(index, cfg.rollout.num_env_groups, num_workers)
        self.formatter = ChatFormatter(AutoTokenizer.from_pretrained(model_path))
        self.proxy_handle, self.buffer_handle = proxy, buffer
        self.executor = ThreadPoolExecutor(cfg.rollout.env_threads, thread_name_prefix="env")
        self.env_workers = EnvWorkers()  # worker processes for envs that are not thread-safe, as locally
        self.env_workers.start(cfg.envs)
        self.scheduler: GroupScheduler | None = None
        self.incarnation = -1
        self._stop = asyncio.Event()

    async def run(self, incarnation: int, version: int, state: dict | None) -> dict:
        """Drive this worker's lanes until stop(); returns the scheduler's final state."""
        cfg, num_workers = self.cfg, self.lane_ids.step
        self.incarnation = incarnation
        proxy = RemoteProxy(self.proxy_handle, version)
        buffer = RemoteBuffer(self.buffer_handle, cfg.rollout, (self.index, incarnation))
        self.watchdog = Watchdog(cfg.watchdog)

        # agent envs' agents call this actor's own endpoint (a free port each: several actors per node)
        endpoint = AgentEndpoint(proxy, self.formatter, cfg.rollout, dataclasses.replace(cfg.endpoint, port=0))
        self.endpoint = endpoint

        def manager(env_id, spec):
            return EnvManager(env_id, spec, self.formatter, proxy, cfg.rollout, self.executor, self.watchdog,
                              self.env_workers, endpoint)

        seed = cfg.seed + 10_007 * self.index + 1_000_003 * incarnation  # a restart plays new tasks
        first = state["next_group_id"] if state else self.index
        self.scheduler = GroupScheduler(cfg.rollout, cfg.envs, buffer, manager, seed=seed, first_group_id=first,
                                        lane_ids=self.lane_ids, group_id_stride=num_workers)
        if state and "rng" in state:
            self.scheduler.load_state_dict(state)
        self.proxy = proxy
        self.scheduler.start()
        self.watchdog.start()
        await self._stop.wait()
        await self.scheduler.stop()
        await endpoint.close()
        await self.watchdog.close()
        await self.buffer_handle.barrier.remote()  # the cancelled episodes are counted before run() returns
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.env_workers.close()
        return self.snapshot()

    async def cancel_running(self) -> int:
        return await self.scheduler.cancel_running() if self.scheduler is not None else 0

    async def on_version(self, version: int) -> None:
        if self.scheduler is not None:
            self.proxy.version = version
            await self.scheduler.on_version(version)

    def snapshot(self) -> dict:
        if self.scheduler is None:
            return {"incarnation": self.incarnation, "state": None, "watchdog": {}, "oldest": [],
                    "env_worker_restarts": 0, "agent_http": {}}
        return {"incarnation": self.incarnation, "state": self.scheduler.state_dict(),
                "watchdog": dict(self.watchdog.stats), "oldest": self.watchdog.oldest(),
                "env_worker_restarts": self.env_workers.restarts(), "agent_http": dict(self.endpoint.http_errors)}

    def stop(self) -> None:
        self._stop.set()

    def pid(self) -> int:
        return os.getpid()
