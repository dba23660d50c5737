"""SampleBuffer: completed groups wait here for training; the async ratio `a` bounds
how stale they may be.

- Admission: a group may start only while the places held by running and accepted
  groups stay within `(a + v + 1) * episodes_per_batch` plus an allowance for the
  extra groups that give group-level redundancy (AReaL's rule). A group holds
  `group_size` places; its redundant episodes ride free. Groups that fail, are
  cancelled, or are dropped as stale give their places back.
- Consumption: the step that makes version `v+1` takes a group only if
  `v - min(token versions) <= a` for every trajectory in it; older groups are
  dropped and counted. This is what makes the bound strict per token.
"""

from __future__ import annotations

import asyncio
from collections import deque

from roll_agent.config import RolloutConfig
from roll_agent.rollout.accounting import EpisodeLedger
from roll_agent.types import Group, Status


class SampleBuffer:
    def __init__(self, cfg: RolloutConfig, version: int = 0):
        self.async_ratio = cfg.async_ratio
        self.episodes_per_batch = cfg.episodes_per_batch
        self.groups_per_batch = cfg.groups_per_batch
        self.group_size = cfg.group_size
        self.extra_places = max(0, cfg.num_env_groups - cfg.groups_per_batch) * cfg.group_size
        self.version = version
        self.consumed_places = 0  # groups already trained on keep their places
        self.held = 0  # places of running groups and groups waiting here
        self._groups: deque[Group] = deque()
        self._cond = asyncio.Condition()
        self.stats = {"groups_put": 0, "groups_consumed": 0, "groups_dropped_stale": 0, "episodes_dropped_stale": 0}
        self.ledger = EpisodeLedger()  # episode outcomes; the scheduler records the ones decided in lanes

    def capacity(self) -> int:
        return (self.async_ratio + self.version + 1) * self.episodes_per_batch + self.extra_places

    def _fits(self) -> bool:
        return self.consumed_places + self.held + self.group_size <= self.capacity()

    async def admit(self) -> None:
        """Wait until one more group may start, and take its places."""
        async with self._cond:
            await self._cond.wait_for(self._fits)
            self.held += self.group_size

    async def release(self) -> None:
        """A group that will never reach the buffer (failed, cancelled) gives back its places."""
        async with self._cond:
            self.held -= self.group_size
            self._cond.notify_all()

    async def put(self, group: Group) -> None:
        # appended before the lock is taken: a group is never in neither its lane nor here (accounting)
        self._groups.append(group)
        self.stats["groups_put"] += 1
        async with self._cond:
            self._cond.notify_all()

    @property
    def num_waiting_episodes(self) -> int:
        return sum(len(g.trajectories) for g in self._groups)

    async def set_version(self, version: int) -> None:
        """The engines now serve `version`: admission widens by one batch per version."""
        async with self._cond:
            self.version = version
            self._cond.notify_all()

    def is_fresh(self, min_version: int, train_version: int) -> bool:
        return train_version - min_version <= self.async_ratio

    async def get_batch(self, train_version: int) -> list[Group]:
        """The first `groups_per_batch` fresh groups to complete, for the step that makes `train_version + 1`.
        Taken all at once when that many are here: a wait that is cancelled takes nothing."""
        async with self._cond:
            while True:
                self._drop_stale(train_version)
                if len(self._groups) >= self.groups_per_batch:
                    break
                await self._cond.wait()
            batch = [self._groups.popleft() for _ in range(self.groups_per_batch)]
            for group in batch:
                self.held -= self.group_size
                self.consumed_places += self.group_size
                for traj in group.trajectories:
                    self.ledger.end(traj.status)
            self.stats["groups_consumed"] += len(batch)
        return batch

    def _drop_stale(self, train_version: int) -> None:
        """Drop (and count) the waiting groups too old to train `train_version + 1` on."""
        stale = [g for g in self._groups if not self.is_fresh(g.min_version, train_version)]
        if stale:
            fresh = [g for g in self._groups if self.is_fresh(g.min_version, train_version)]
            self._groups.clear()
            self._groups.extend(fresh)
            for group in stale:
                self.held -= self.group_size
                self.stats["groups_dropped_stale"] += 1
                self.stats["episodes_dropped_stale"] += len(group.trajectories)
                self.ledger.end(Status.STALE_DROPPED, len(group.trajectories))
            self._cond.notify_all()  # their places are free

    def state_dict(self, in_flight: int = 0) -> dict:
        return {"consumed_places": self.consumed_places, "stats": dict(self.stats),
                "episodes": self.ledger.state_dict(in_flight)}

    def load_state_dict(self, state: dict) -> None:
        self.consumed_places = state["consumed_places"]
        self.stats.update(state["stats"])
        self.ledger.load_state_dict(state.get("episodes", {}))

    def __len__(self) -> int:
        return len(self._groups)
