"""Env groups with redundancy.

`num_env_groups` lanes each own `group_size + group_size_redundancy` EnvManagers.
A lane plays one group at a time: every env of the group plays the same task seed
(GRPO needs this); the group completes when `group_size` episodes end well, and the
redundant rest are cancelled for real (their pending engine requests aborted). More
lanes than a batch needs give group-level redundancy: the first groups to complete
fill each batch. Groups that can no longer be consumed (too stale) are cancelled
early so their envs start fresh work. A lane draws its next task seed when a group starts,
and each env whose episode ended resets for it at once (`rollout.prepare_next_reset`), while
the lane still waits for the rest of the group and for admission.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Callable

from roll_agent.config import EnvSpec, RolloutConfig
from roll_agent.rollout.buffer import SampleBuffer
from roll_agent.rollout.env_manager import EnvManager
from roll_agent.types import Group, Status, Trajectory

TRAIN_SEED_SPACE = 1_000_000  # training seeds stay below eval.seed_offset


def partition(specs: list[EnvSpec], num_groups: int) -> list[EnvSpec]:
    """One spec per lane: explicit `num_groups` first, the rest split evenly."""
    fixed = sum(s.num_groups for s in specs)
    free = [s for s in specs if s.num_groups == 0]
    if fixed > num_groups or (fixed < num_groups and not free) or (fixed == num_groups and free and fixed):
        raise ValueError(
            f"envs[*].num_groups add up to {fixed} but rollout.num_env_groups={num_groups}; "
            "make them add up, or leave num_groups at 0 for envs that share the rest"
        )
    lanes: list[EnvSpec] = []
    for spec in specs:
        lanes += [spec] * spec.num_groups
    rest = num_groups - fixed
    for i in range(rest):
        lanes.append(free[i % len(free)])
    return lanes


class Lane:
    def __init__(self, index: int, spec: EnvSpec, managers: list[EnvManager]):
        self.index = index
        self.spec = spec
        self.managers = managers
        self.tasks: list[asyncio.Task] = []
        self.running: set[asyncio.Task] = set()  # episodes whose outcome is not decided yet
        self.kept: list[Trajectory] = []  # episodes of the current group that ended well
        self.stale = False  # the current group was cancelled as too old to train on
        self.group_id = -1
        self.next_seed: int | None = None  # the task of the lane's next group, its envs prepare for it

    def min_generated_version(self) -> int | None:
        versions = [v for m in self.managers if m.current for t in m.current.samples() for v in t.versions if v >= 0]
        return min(versions) if versions else None


class GroupScheduler:
    def __init__(self, cfg: RolloutConfig, specs: list[EnvSpec], buffer: SampleBuffer,
                 make_manager: Callable[[str, EnvSpec], EnvManager], seed: int = 0, first_group_id: int = 0,
                 lane_ids: range | None = None, group_id_stride: int = 1):
        """`lane_ids` and `group_id_stride` let several schedulers (one per Ray env worker) share the
        lanes of one config: each drives its own lanes and draws group ids from its own residue class."""
        self.cfg = cfg
        self.buffer = buffer
        self._rng = random.Random(seed)
        self._next_group_id = first_group_id
        self._stride = group_id_stride
        self.lanes = []
        for i, spec in enumerate(partition(specs, cfg.num_env_groups)):
            if lane_ids is not None and i not in lane_ids:
                continue
            size = cfg.group_size + cfg.group_size_redundancy
            self.lanes.append(Lane(i, spec, [make_manager(f"g{i}-e{j}", spec) for j in range(size)]))
        self.counts: Counter = Counter()  # groups: put, stale, failed
        self.ledger = buffer.ledger  # episodes: started and each outcome
        self._drivers: list[asyncio.Task] = []
        self._stopping = False

    def start(self) -> None:
        self._drivers = [asyncio.create_task(self._drive(lane), name=f"lane-{lane.index}") for lane in self.lanes]

    def _new_group_id(self) -> int:
        gid = self._next_group_id
        self._next_group_id += self._stride
        return gid

    def _new_seed(self) -> int:
        return self._rng.randrange(TRAIN_SEED_SPACE)

    async def _drive(self, lane: Lane) -> None:
        seed = self._new_seed()
        while True:
            await self.buffer.admit()
            gid = self._new_group_id()
            lane.group_id, lane.stale, lane.kept = gid, False, []
            lane.next_seed = self._new_seed() if self.cfg.prepare_next_reset else None
            lane.tasks = [asyncio.create_task(m.run_episode(seed, gid)) for m in lane.managers]
            lane.running = set(lane.tasks)
            for task, manager in zip(lane.tasks, lane.managers):
                task.add_done_callback(lambda t, lane=lane, m=manager: self._settle(lane, t, m))
            self.ledger.start(len(lane.tasks))
            kept = await self._collect(lane)
            if kept:
                self.counts["groups_put"] += 1
                await self.buffer.put(Group(gid, seed, lane.spec.name, kept))
            else:
                await self.buffer.release()
            seed = lane.next_seed if lane.next_seed is not None else self._new_seed()

    def _settle(self, lane: Lane, task: asyncio.Task, manager: EnvManager) -> None:
        """Record how one episode ended, exactly once (a done callback: also for a task cancelled
        unstarted), and have its env reset for the lane's next task."""
        lane.running.discard(task)
        if lane.next_seed is not None and not self._stopping:
            manager.prepare(lane.next_seed)
        if task.cancelled():
            self.ledger.end(Status.CANCELLED)
            return
        traj = task.result()  # run_episode turns every failure into a status
        if traj.status in (Status.FINISHED, Status.TRUNCATED):
            lane.kept.append(traj)  # its outcome is decided when the group is trained on or dropped
        else:
            self.ledger.end(traj.status, reason=traj.error and f"env {traj.env_id} ({traj.env_tag}, seed {traj.seed}): "
                                                               f"{traj.error}")

    async def _collect(self, lane: Lane) -> list[Trajectory]:
        """Wait for `group_size` good episodes, then cancel the rest (the redundant ones)."""
        try:
            while lane.running and len(lane.kept) < self.cfg.group_size:
                await asyncio.wait(set(lane.running), return_when=asyncio.FIRST_COMPLETED)
        finally:
            await self._cancel(lane.running)
        kept, extra, lane.kept = lane.kept[: self.cfg.group_size], lane.kept[self.cfg.group_size:], []
        if extra:  # ended well at the same moment as the last needed one: redundant
            self.ledger.end(Status.CANCELLED, len(extra))
        if lane.stale:
            self.counts["groups_stale"] += 1
            self.ledger.end(Status.STALE_DROPPED, len(kept))
            return []
        if not kept:
            self.counts["groups_failed"] += 1
        return kept

    async def _cancel(self, tasks) -> None:
        tasks = list(tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def num_in_flight(self) -> int:
        """Episodes started and not yet given an outcome, as the live structures hold them."""
        return sum(len(lane.running) + len(lane.kept) for lane in self.lanes) + self.buffer.num_waiting_episodes

    async def on_version(self, version: int) -> None:
        """Cancel running groups whose tokens are already too old to be trained on."""
        for lane in self.lanes:
            oldest = lane.min_generated_version()
            if oldest is not None and not self.buffer.is_fresh(oldest, version) and lane.running:
                lane.stale = True
                await self._cancel(lane.running)

    async def cancel_running(self) -> int:
        """Cancel every running episode (the watchdog's answer to a batch that never fills)."""
        running = [t for lane in self.lanes for t in lane.running]
        await self._cancel(running)
        return len(running)

    def state_dict(self) -> dict:
        return {"next_group_id": self._next_group_id, "rng": self._rng.getstate(), "counts": dict(self.counts)}

    def load_state_dict(self, state: dict) -> None:
        self._next_group_id = state["next_group_id"]
        self._rng.setstate(state["rng"])
        self.counts.update(state["counts"])

    async def stop(self) -> None:
        self._stopping = True
        for task in self._drivers:
            task.cancel()
        await asyncio.gather(*self._drivers, return_exceptions=True)
        for lane in self.lanes:
            await self._cancel(lane.running)
            for manager in lane.managers:
                await manager.close()
