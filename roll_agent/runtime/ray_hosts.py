"""The rollout-side actors (proxy, buffer, env workers) and the clients through which a
component in one actor calls a component in another. The components are the plain
classes of the local runtime; a client only turns a method call into an actor call.

Faults: an engine actor that dies is restarted by Ray; its requests come back to the
LLMProxy as aborts (re-issued from their prefix, so no episode is lost), and the proxy
host re-forms the weight-sync group and re-syncs all engines at the served version
before the restarted one serves again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import ray
from ray.exceptions import ActorDiedError, RayActorError

from roll_agent.config import Config, RolloutConfig
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.rollout.buffer import SampleBuffer
from roll_agent.rollout.env_manager import EnvManager
from roll_agent.rollout.groups import GroupScheduler
from roll_agent.types import EngineOutput, Group, Status
from roll_agent.watchdog import Watchdog

log = logging.getLogger(__name__)
DOWN_RETRY_S = 0.05  # a request routed to a restarting engine comes back as an abort after this


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
class RemoteEngine:
    """An engine actor as the LLMProxy sees it (the Engine protocol)."""

    alive = True
    restartable = False  # Ray restarts a dead engine actor (ProxyHost re-syncs it)

    def __init__(self, handle, index: int, on_lost):
        self.handle = handle
        self.index = index
        self.version = 0
        self.down = False
        self._on_lost = on_lost

    async def generate(self, prompt_ids, sampling, request_id) -> EngineOutput:
        if self.down:
            await asyncio.sleep(DOWN_RETRY_S)
            return EngineOutput([], [], "abort")
        try:
            return await call(self.handle.generate.remote(prompt_ids, sampling, request_id))
        except RayActorError:
            self._on_lost(self)
            return EngineOutput([], [], "abort")  # the proxy re-issues it from its prefix

    async def abort(self, request_id: str) -> None:
        if not self.down:
            try:
                await self.handle.abort.remote(request_id)
            except RayActorError:
                self._on_lost(self)

    async def load_weights(self, named_tensors, version: int) -> int:
        """Weights through the object store: `named_tensors` is best the object the trainer returned
        (an ObjectRef: each engine actor reads it, nothing passes through this one). Returns the bytes."""
        if not isinstance(named_tensors, ray.ObjectRef):
            named_tensors = list(named_tensors)
        return await self.handle.load_weights.remote(named_tensors, version)

    async def close(self) -> None:
        try:
            await self.handle.close.remote()
        except RayActorError:
            pass


class BroadcastSync:
    """torch.distributed broadcast from the trainer actor to every engine actor."""

    def __init__(self, trainer, bucket_mb: float, backend: str):
        self.trainer = trainer
        self.bucket_mb = bucket_mb
        self.backend = backend
        self.spec = None
        self.formed = False

    async def _form(self, engines: list[RemoteEngine]) -> None:
        if self.spec is None:
            self.spec = await self.trainer.weight_spec.remote()
        init = await self.trainer.rendezvous.remote()
        world = len(engines) + 1
        await asyncio.gather(self.trainer.join_group.remote(init, world, 0, self.backend),
                             *(e.handle.join_group.remote(init, world, e.index + 1, self.backend) for e in engines))
        self.formed = True

    async def push(self, engines: list[RemoteEngine], version: int) -> dict:
        start = time.perf_counter()
        if not self.formed:
            await self._form(engines)
        try:
            sent, *_ = await asyncio.gather(self.trainer.send_weights.remote(self.bucket_mb),
                                            *(e.handle.receive.remote(self.spec, self.bucket_mb, version)
                                              for e in engines))
        except Exception:
            self.formed = False  # a rank failed mid-broadcast: the next sync forms the group anew
            raise
        return {"bytes": sent["bytes"] * len(engines), "seconds": time.perf_counter() - start}


class ObjectStoreSync:
    """For small payloads (LoRA adapters): the trainer returns them once, each engine reads that object."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.formed = True

    async def push(self, engines: list[RemoteEngine], version: int) -> dict:
        start = time.perf_counter()
        ref = self.trainer.named_weights.remote()
        moved = await asyncio.gather(*(e.load_weights(ref, version) for e in engines))
        return {"bytes": sum(moved), "seconds": time.perf_counter() - start}


class ProxyHost:
    """The LLMProxy over engine actors, and the weight sync that feeds them."""

    def __init__(self, cfg: Config, engine_handles: list, trainer, sync_type: str, version: int):
        self.engines = [RemoteEngine(h, i, self._engine_lost) for i, h in enumerate(engine_handles)]
        self.watchdog = Watchdog(cfg.watchdog)  # request_timeout_s; its counts reach the driver's
        self.proxy = LLMProxy(self.engines, cfg.proxy, version=version, watchdog=self.watchdog)
        backend = "nccl" if cfg.engine.device.startswith("cuda") else "gloo"
        self.sync = ObjectStoreSync(trainer) if sync_type == "object_store" else \
            BroadcastSync(trainer, cfg.weight_sync.bucket_mb, backend)
        self.faults = Counter()  # engine_restarts, engine_requests_lost, sync_retries
        self.max_restarts = cfg.runtime.ray.max_restarts
        self._lock = asyncio.Lock()  # one suspend-update-resume at a time (the controller's or a recovery)
        self._recovering: set[int] = set()

    async def generate(self, request):
        return await self.proxy.generate(request)

    def clear_abort(self, env_id: str) -> None:
        self.proxy.clear_abort(env_id)

    def stats(self) -> dict:
        return {**self.proxy.stats, **self.faults, "version": self.proxy.version}

    def watchdog_report(self) -> dict:
        return {"stats": dict(self.watchdog.stats), "oldest": self.watchdog.oldest()}

    async def update_weights(self, version: int) -> dict:
        self.watchdog.start()  # the first call of the run (the initial sync): the loop is running
        async with self._lock:
            await self.proxy.suspend()
            try:
                for retry in range(self.max_restarts + 1):
                    try:
                        return await self.proxy.update_weights(self.sync.push, version)
                    except Exception:  # an engine died mid-sync (the trainer then sees "connection closed"):
                        if retry == self.max_restarts:  # wait for its restart, then sync all again
                            raise  # _alive raises first for an actor that is gone for good
                        self.faults["sync_retries"] += 1
                        log.warning("weight sync to version %d failed; retrying once every engine answers",
                                    version, exc_info=True)
                        await asyncio.gather(*(_alive(e.handle) for e in self.engines))
            finally:
                await self.proxy.resume()

    def _engine_lost(self, engine: RemoteEngine) -> None:
        self.faults["engine_requests_lost"] += 1
        if engine.index not in self._recovering:
            engine.down = True
            self._recovering.add(engine.index)
            asyncio.get_running_loop().create_task(self._recover(engine))

    async def _recover(self, engine: RemoteEngine) -> None:
        """Wait for Ray to restart the engine actor, then sync every engine to the served version."""
        try:
            await _alive(engine.handle)
        except ActorDiedError:
            log.error("engine %d is dead for good (runtime.ray.max_restarts spent)", engine.index)
            return
        self.sync.formed = False
        await self.update_weights(self.proxy.version)
        engine.down = False
        self._recovering.discard(engine.index)
        self.faults["engine_restarts"] += 1
        log.warning("engine %d restarted and re-synced to version %d", engine.index, self.proxy.version)

    async def close(self) -> None:
        await self.proxy.close()
        await self.watchdog.close()


async def _alive(handle) -> None:
    """Return once the actor answers (Ray restarts a dead one); ActorDiedError if it never will."""
    while True:
        try:
            await handle.ping.remote()
            return
        except ActorDiedError:
            raise
        except RayActorError:  # restarting
            await asyncio.sleep(0.5)


class RemoteProxy:
    """The proxy actor as an EnvManager sees it. `version` is the served version, set by the
    env worker at each weight update (EnvManager only reads it to date an episode's start)."""

    def __init__(self, handle, version: int = 0):
        self.handle = handle
        self.version = version

    async def generate(self, request):
        return await call(self.handle.generate.remote(request))

    def clear_abort(self, env_id: str) -> None:
        self.handle.clear_abort.remote(env_id)


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

    def ledger_start(self, owner: tuple, n: int) -> None:
        if owner not in self.dead:
            self.buffer.ledger.start(n)
            self.in_flight[owner] += n

    def ledger_end(self, owner: tuple, outcome: Status, n: int) -> None:
        if owner not in self.dead:  # a late message of a dead worker: its episodes already ended as lost
            self.buffer.ledger.end(outcome, n)
            self.in_flight[owner] -= n

    async def admit(self, owner: tuple) -> None:
        await self.buffer.admit()
        if owner in self.dead:  # admitted after its worker died: nobody will use the places
            await self.buffer.release()
        else:
            self.held[owner] += 1

    async def release(self, owner: tuple) -> None:
        if owner not in self.dead:
            self.held[owner] -= 1
            await self.buffer.release()

    async def put(self, owner: tuple, group: Group) -> None:
        if owner not in self.dead:
            self.held[owner] -= 1
            self.in_flight[owner] -= len(group.trajectories)  # in flight still, now counted as waiting here
            self.last_group_id[owner[0]] = max(group.group_id, self.last_group_id.get(owner[0], -1))
            await self.buffer.put(group)

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
        """What the driver's façades read synchronously, taken at one instant."""
        return {"stats": dict(self.buffer.stats), "state": self.buffer.state_dict(), "held": dict(self.held),
                "counts": dict(self.buffer.ledger.counts), "waiting": len(self.buffer),
                "in_flight": sum(self.in_flight.values()) + self.buffer.num_waiting_episodes}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state)


class RemoteLedger:
    """The buffer actor's EpisodeLedger as a GroupScheduler records into it (from done
    callbacks, so the calls are not awaited; Ray delivers one caller's calls in order)."""

    def __init__(self, handle, owner: tuple):
        self.handle = handle
        self.owner = owner

    def start(self, n: int = 1) -> None:
        self.handle.ledger_start.remote(self.owner, n)

    def end(self, outcome: Status, n: int = 1) -> None:
        self.handle.ledger_end.remote(self.owner, outcome, n)


class RemoteBuffer:
    """The buffer actor as a GroupScheduler sees it, on behalf of one env-worker incarnation."""

    is_fresh = SampleBuffer.is_fresh  # a pure function of async_ratio: no call needed

    def __init__(self, handle, cfg: RolloutConfig, owner: tuple):
        self.handle = handle
        self.async_ratio = cfg.async_ratio
        self.owner = owner
        self.ledger = RemoteLedger(handle, owner)

    async def admit(self) -> None:
        await call(self.handle.admit.remote(self.owner))

    async def release(self) -> None:
        await call(self.handle.release.remote(self.owner))

    async def put(self, group: Group) -> None:
        await call(self.handle.put.remote(self.owner, group))


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

        def manager(env_id, spec):
            return EnvManager(env_id, spec, self.formatter, proxy, cfg.rollout, self.executor, self.watchdog)

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
        await self.watchdog.close()
        await self.buffer_handle.barrier.remote()  # the cancelled episodes are counted before run() returns
        self.executor.shutdown(wait=False, cancel_futures=True)
        return self.snapshot()

    async def cancel_running(self) -> int:
        return await self.scheduler.cancel_running() if self.scheduler is not None else 0

    async def on_version(self, version: int) -> None:
        if self.scheduler is not None:
            self.proxy.version = version
            await self.scheduler.on_version(version)

    def snapshot(self) -> dict:
        if self.scheduler is None:
            return {"incarnation": self.incarnation, "state": None, "watchdog": {}, "oldest": []}
        return {"incarnation": self.incarnation, "state": self.scheduler.state_dict(),
                "watchdog": dict(self.watchdog.stats), "oldest": self.watchdog.oldest()}

    def stop(self) -> None:
        self._stop.set()

    def pid(self) -> int:
        return os.getpid()
