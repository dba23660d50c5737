"""Env groups: a group completes at group_size episodes and the extra ones are aborted for real."""

import asyncio

from roll_agent.config import RolloutConfig, ScriptedEngineConfig
from roll_agent.types import Status
from tests.conftest import run
from tests.rollout.harness import build, train_loop


def test_group_completes_at_group_size_and_cancels_the_redundant(formatter):
    rollout = RolloutConfig(async_ratio=8, num_env_groups=2, groups_per_batch=2, group_size=3,
                            group_size_redundancy=2, max_turns=4)
    # slow tokens keep requests in flight when the group completes
    engine = ScriptedEngineConfig(response_tokens=4, token_latency_s=0.003, latency_s=0.0)
    env = {"latency": "longtail", "mean_s": 0.01, "std_s": 0.01, "tail_scale": 20, "episode_len": 4, "min_len": 1}
    stack = build(formatter, rollout, env, engine_cfg=engine)

    async def go():
        try:
            return await train_loop(stack, steps=4)
        finally:
            await stack.close()

    consumed = run(go())
    for _, batch in consumed:
        for group in batch:
            assert len(group.trajectories) == rollout.group_size
            assert len({t.seed for t in group.trajectories}) == 1  # one task per group
            assert all(t.status in (Status.FINISHED, Status.TRUNCATED) for t in group.trajectories)
    counts = stack.scheduler.counts
    assert stack.buffer.ledger.counts["cancelled"] > 0
    assert counts["groups_stale"] == 0 and counts["groups_failed"] == 0
    # every group that completed reached the buffer (none discarded for its cancelled redundant envs)
    assert counts["groups_put"] >= 4 * rollout.groups_per_batch
    aborted_requests = [rid for e in stack.proxy.engines for rid in e.aborted_ids]
    assert aborted_requests, "cancelled episodes must abort their engine requests"
    assert not stack.proxy._inflight


def test_group_level_redundancy_fills_batches_with_the_first_groups(formatter):
    """One lane is a straggler (every step slow): batches never wait for it."""
    from roll_agent.config import EnvSpec

    rollout = RolloutConfig(async_ratio=2, num_env_groups=3, groups_per_batch=2, group_size=2,
                            group_size_redundancy=0, max_turns=2)
    fast = EnvSpec(id="roll_agent/Simulated-v0", tag="fast", num_groups=2, kwargs={"episode_len": 2})
    slow = EnvSpec(id="roll_agent/Simulated-v0", tag="slow", num_groups=1,
                   kwargs={"episode_len": 2, "latency": "fixed", "mean_s": 30.0})
    stack = build(formatter, rollout, specs=[fast, slow])

    async def go():
        try:
            return await asyncio.wait_for(train_loop(stack, steps=3), 10)
        finally:
            await stack.close()

    for _, batch in run(go()):
        assert {g.env_tag for g in batch} == {"fast"}
