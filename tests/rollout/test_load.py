"""Many envs at once in one process (a smaller benchmarks/load.py): no deadlock, every
lane runs, every episode accounted for."""

import asyncio

import pytest

from roll_agent.config import RolloutConfig, ScriptedEngineConfig
from tests.conftest import run
from tests.rollout.harness import build, train_loop


@pytest.mark.slow
def test_300_envs_at_once_complete_and_add_up(formatter):
    lanes, size, steps = 60, 5, 4
    rollout = RolloutConfig(async_ratio=2, num_env_groups=lanes, groups_per_batch=lanes // 2, group_size=size,
                            group_size_redundancy=0, max_turns=4)
    env = {"latency": "normal", "mean_s": 0.01, "std_s": 0.004, "episode_len": 4, "min_len": 2}
    stack = build(formatter, rollout, env, num_engines=4, engine_cfg=ScriptedEngineConfig(response_tokens=4))
    started_at_once = []

    async def go():
        try:
            training = asyncio.create_task(train_loop(stack, steps))
            for _ in range(3):  # every lane's driver admits its first group before any episode can end
                await asyncio.sleep(0)
            started_at_once.append(sum(len(lane.running) for lane in stack.scheduler.lanes))
            return await training
        finally:
            await stack.close()

    consumed = run(go(), timeout=240)
    assert started_at_once == [lanes * size]
    assert len(consumed) == steps
    assert sum(len(g.trajectories) for _, b in consumed for g in b) == steps * (lanes // 2) * size
    acc = stack.stats().accounting()
    assert acc["accounting_ok"], acc
    assert acc["episodes_total_finished"] + acc["episodes_total_truncated"] == steps * (lanes // 2) * size
    assert len(stack.watchdog.waits) == 0 and not stack.proxy._inflight  # nothing left waiting
