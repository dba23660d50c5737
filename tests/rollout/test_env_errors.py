"""An env that raises or hangs ends only its own episode, with status env_error."""

import asyncio

from roll_agent.config import RolloutConfig
from roll_agent.types import Status
from tests.conftest import run
from tests.rollout.harness import build, train_loop


def test_raising_and_hanging_envs_end_only_their_episode(formatter):
    rollout = RolloutConfig(async_ratio=2, num_env_groups=3, groups_per_batch=2, group_size=2,
                            group_size_redundancy=1, max_turns=3, step_timeout_s=0.2)
    env = {"episode_len": 3, "fail_prob": 0.15, "hang_prob": 0.1, "hang_s": 60.0}
    stack = build(formatter, rollout, env)

    async def go():
        try:
            return await train_loop(stack, steps=4)
        finally:
            await stack.close()

    consumed = run(go())
    assert len(consumed) == 4
    counts = stack.buffer.ledger.counts
    assert counts["env_error"] > 0
    assert stack.stats().accounting()["accounting_ok"]
    for _, batch in consumed:
        for group in batch:
            assert all(t.status != Status.ENV_ERROR for t in group.trajectories)


def test_blocking_env_steps_run_off_the_event_loop(formatter):
    """Blocking steps run in threads: the envs' step time overlaps instead of adding up."""
    import time

    rollout = RolloutConfig(async_ratio=0, num_env_groups=4, groups_per_batch=4, group_size=4,
                            group_size_redundancy=0, max_turns=2)
    env = {"episode_len": 2, "latency": "fixed", "mean_s": 0.1, "async_step": False}
    stack = build(formatter, rollout, env)

    async def go():
        stack.scheduler.start()
        try:
            t0 = time.perf_counter()
            batch = await stack.buffer.get_batch(0)
            return batch, time.perf_counter() - t0
        finally:
            await stack.close()

    batch, elapsed = run(go())
    env_time = sum(t.timing["env_s"] for g in batch for t in g.trajectories)
    # 16 envs each blocking 0.2 s: run serially the overlap would be 1
    assert env_time / elapsed > 4, (env_time, elapsed)


def test_a_step_hung_past_its_timeout_is_reported_by_the_watchdog(formatter):
    rollout = RolloutConfig(num_env_groups=1, groups_per_batch=1, group_size=2, group_size_redundancy=0,
                            max_turns=3, step_timeout_s=0.05)
    stack = build(formatter, rollout, {"episode_len": 3, "hang_prob": 1.0, "hang_s": 60.0})

    async def go():
        stack.scheduler.start()
        try:
            while stack.buffer.ledger.counts["env_error"] < 2:
                await asyncio.sleep(0.01)
        finally:
            await stack.close()

    run(go(), timeout=30)
    assert stack.watchdog.stats["stuck_env"] >= 2
    assert stack.stats().accounting()["accounting_ok"]
