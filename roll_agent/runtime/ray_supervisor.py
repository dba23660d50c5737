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

from ray.exceptions import ActorDiedError, RayActorError

from roll_agent.config import ConfigError

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 30.0  # a worker Ray cannot place again never answers its stop
EMPTY = {"incarnation": -1, "state": None, "watchdog": {}, "oldest": [], "env_worker_restarts": 0, "agent_http": {}}


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
    def __init__(self, workers: list, buffer, version: int, max_restarts: int):
        """`buffer`: the buffer actor (it gives back a dead worker's places)."""
        self.workers = workers
        self.buffer = buffer
        self.version = version
        self.max_restarts = max_restarts
        self.incarnations = [0] * len(workers)
        self.snapshots = [dict(EMPTY) for _ in workers]
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
        lost = await self.buffer.release_owner.remote((w, self.incarnations[w]))
        log.warning("env worker %d incarnation %d died: %d episodes lost", w, self.incarnations[w], lost)
        snap = self.snapshots[w]
        stride = len(self.workers)
        last_put = (await self.buffer.last_group_ids.remote()).get(w, w - stride)
        known = snap["state"]["next_group_id"] if snap["state"] else w
        self.incarnations[w] += 1
        self.snapshots[w] = dict(EMPTY)
        return {"next_group_id": max(known, last_put + stride)}

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
            if isinstance(snap, dict) and snap["incarnation"] == self.incarnations[w]:
                self.snapshots[w] = snap

    def state_dict(self) -> dict:
        return {"workers": [s["state"] for s in self.snapshots]}

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
