"""The GroupScheduler interface over env-worker actors, and what happens when one dies.

Each env worker drives its share of the lanes until stopped. When its actor dies, Ray
restarts it (runtime.ray.max_restarts); the supervisor has the buffer actor give the dead
incarnation's admission places back and end its in-flight episodes as `lost` (ledger),
waits until the restarted actor answers (with its node gone, Ray first has to find it
room on the nodes left), and starts it on fresh groups (new task seeds, group ids after
the last one it put, so no id repeats).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from ray.exceptions import ActorDiedError, RayActorError, RayTaskError

from roll_agent.config import ConfigError

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 30.0  # a worker Ray cannot place again never answers its stop


@dataclass
class WorkerSnapshot:
    """An env worker's state and counters as its last refresh (or its end) left them."""

    incarnation: int = -1
    state: dict | None = None  # its GroupScheduler's (what a checkpoint keeps)
    watchdog: dict = field(default_factory=dict)  # its watchdog's counters
    oldest: list[str] = field(default_factory=list)  # its oldest waits
    env_worker_restarts: int = 0
    agent_http: dict = field(default_factory=dict)  # its agent endpoint's error answers, by class


async def restarted_pid(ping, name: str, stopping=lambda: False) -> int | None:
    """The pid `ping()` (an actor call) returns once Ray's restart of the actor answers; None if
    `stopping()` first; ActorDiedError if Ray will not restart it. Says every minute that it
    still waits (with its node gone, the actor needs room on the nodes left)."""
    since, warned = time.monotonic(), 0
    while not stopping():
        try:
            return await asyncio.wait_for(ping(), 5.0)
        except ActorDiedError:
            raise
        except (RayActorError, asyncio.TimeoutError):
            waited = time.monotonic() - since
            if waited >= 60 * (warned + 1):
                warned += 1
                log.warning("%s still waits for Ray to restart it (%.0f s): the cluster may have no room for it on "
                            "the nodes left (runtime.ray resources and labels)", name, waited)
            await asyncio.sleep(0.2)
    return None


class WorkerSupervisor:
    """The env-worker actors as a RolloutStack's scheduler."""

    def __init__(self, workers: list, buffer, version: int, max_restarts: int):
        """`buffer`: the buffer actor's client (roll_agent/runtime/ray_runtime.py, BufferClient): it
        gives back a dead worker's places and counts the episodes in flight."""
        self.workers = workers
        self.buffer = buffer
        self.version = version
        self.max_restarts = max_restarts
        self.incarnations = [0] * len(workers)
        self.snapshots = [WorkerSnapshot() for _ in workers]
        self._resume: list = [None] * len(workers)
        self._tasks: list[asyncio.Task] = []
        self._stopping = False

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._supervise(w), name=f"env-worker-{w}") for w in range(len(self.workers))]

    async def _supervise(self, w: int) -> None:
        state, restarts = self._resume[w], 0
        while True:
            try:
                self.snapshots[w] = await self.workers[w].run.remote(self.incarnations[w], self.version, state)
                return
            except RayTaskError as exc:  # it raised, it did not die: a restart would raise again
                log.error("env worker %d failed: its lanes stop. %s", w, exc)
                return
            except RayActorError:
                if self._stopping:
                    return
                state = await self._retire(w)
                restarts += 1
                if restarts > self.max_restarts:
                    log.error("env worker %d died %d times: its lanes stop (runtime.ray.max_restarts=%d)",
                              w, restarts, self.max_restarts)
                    return
                log.warning("env worker %d died; waiting for Ray to restart it", w)
                if not await self._restarted(w):
                    return
                log.warning("env worker %d restarted; its lanes start new groups", w)

    async def _restarted(self, w: int) -> bool:
        """Wait until worker `w`'s restarted actor answers; False if it never will or the run stops."""
        try:
            return await restarted_pid(self.workers[w].pid.remote, f"env worker {w}", lambda: self._stopping) is not None
        except ActorDiedError:
            log.error("env worker %d cannot be restarted: its lanes stop", w)
            return False

    async def _retire(self, w: int) -> dict:
        """Account for a dead incarnation; returns the state its successor starts from."""
        lost = await self.buffer.handle.release_owner.remote((w, self.incarnations[w]))
        log.warning("env worker %d incarnation %d died: %d episodes lost", w, self.incarnations[w], lost)
        snap = self.snapshots[w]
        stride = len(self.workers)
        last_put = (await self.buffer.handle.last_group_ids.remote()).get(w, w - stride)
        known = snap.state["next_group_id"] if snap.state else w
        self.incarnations[w] += 1
        self.snapshots[w] = WorkerSnapshot()
        return {"next_group_id": max(known, last_put + stride)}

    @property
    def num_in_flight(self) -> int:
        """As the buffer actor's ledger counted them at the last refresh."""
        return self.buffer.snapshot.in_flight

    async def on_version(self, version: int) -> None:
        self.version = version
        await asyncio.gather(*(wk.on_version.remote(version) for wk in self.workers), return_exceptions=True)

    async def cancel_running(self) -> int:
        """Every worker cancels its running episodes (the watchdog's answer to a batch that never fills)."""
        counts = await asyncio.gather(*(wk.cancel_running.remote() for wk in self.workers), return_exceptions=True)
        return sum(c for c in counts if isinstance(c, int))

    async def refresh(self) -> None:
        snaps = await asyncio.gather(*(wk.snapshot.remote() for wk in self.workers), return_exceptions=True)
        for w, snap in enumerate(snaps):
            if isinstance(snap, WorkerSnapshot) and snap.incarnation == self.incarnations[w]:
                self.snapshots[w] = snap

    def state_dict(self) -> dict:
        return {"workers": [s.state for s in self.snapshots]}

    def load_state_dict(self, state: dict) -> None:
        workers = state.get("workers")
        if workers is None or len(workers) != len(self.workers):
            raise ConfigError("this checkpoint was written by another runtime or another runtime.ray.env_workers "
                              "count: resume with the settings that wrote it")
        self._resume = list(workers)

    async def stop(self) -> None:
        self._stopping = True
        stops = [asyncio.ensure_future(wk.stop.remote()) for wk in self.workers]
        await asyncio.wait(stops, timeout=STOP_TIMEOUT_S)
        _, pending = await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S) if self._tasks else ((), ())
        for task in (*stops, *pending):  # a worker still waiting for room on the cluster
            task.cancel()
        await asyncio.gather(*stops, *pending, return_exceptions=True)
