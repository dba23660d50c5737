"""Greedy evaluation on held-out seeds, through the same proxy and env managers."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from roll_agent.rollout.env_manager import EnvManager
from roll_agent.types import Trajectory


async def play_greedy(managers: list[EnvManager], seeds: list[int]) -> list[Trajectory]:
    """One greedy episode per seed on each env tag the managers cover (managers of a tag share the seeds)."""
    by_tag: dict[str, list[EnvManager]] = defaultdict(list)
    for manager in managers:
        by_tag[manager.tag].append(manager)
    results: list[Trajectory] = []

    async def worker(manager: EnvManager, queue: asyncio.Queue) -> None:
        while not queue.empty():
            seed = queue.get_nowait()
            results.append(await manager.run_episode(seed, greedy=True))

    jobs = []
    for tag, group in by_tag.items():
        queue: asyncio.Queue = asyncio.Queue()
        for seed in seeds:
            queue.put_nowait(seed)
        jobs += [worker(m, queue) for m in group]
    await asyncio.gather(*jobs)
    return results


def summarize(trajs: list[Trajectory], prefix: str = "", per_tag: bool = False) -> dict[str, float]:
    out = _summary(trajs, prefix)
    if per_tag:
        tags = sorted({t.env_tag for t in trajs})
        for tag in tags:
            for key, value in _summary([t for t in trajs if t.env_tag == tag], prefix).items():
                out[f"{key}/{tag}"] = value
    return out


def _summary(trajs: list[Trajectory], prefix: str) -> dict[str, float]:
    n = max(len(trajs), 1)
    return {
        f"{prefix}success_rate": sum(t.success for t in trajs) / n,
        f"{prefix}reward_mean": sum(t.reward for t in trajs) / n,
        f"{prefix}episode_len_mean": sum(t.num_turns for t in trajs) / n,
        f"{prefix}episodes": float(len(trajs)),
    }
