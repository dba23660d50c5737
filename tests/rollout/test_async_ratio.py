"""The async ratio bounds staleness strictly, per token (docs/architecture.md, section 2: SampleBuffer)."""

import asyncio
import random

from hypothesis import given, settings, strategies as st

from roll_agent.config import RolloutConfig, ScriptedEngineConfig
from tests.conftest import run
from tests.rollout.harness import build, train_loop


@settings(max_examples=12, deadline=None)
@given(async_ratio=st.sampled_from([0, 1, 2, 4]), seed=st.integers(0, 10_000))
def test_no_consumed_token_is_older_than_the_bound(formatter, async_ratio, seed):
    rng = random.Random(seed)
    rollout = RolloutConfig(async_ratio=async_ratio, num_env_groups=rng.choice([2, 3]), groups_per_batch=2,
                            group_size=2, group_size_redundancy=rng.choice([0, 1]), max_turns=3)
    env = {"latency": "longtail", "mean_s": 0.004, "std_s": 0.004, "episode_len": 3, "min_len": 1}
    engine = ScriptedEngineConfig(response_tokens=3, token_latency_s=rng.choice([0.0, 0.001]))
    stack = build(formatter, rollout, env, engine_cfg=engine)

    async def go():
        try:
            return await train_loop(stack, steps=6, train_s=rng.choice([0.0, 0.01, 0.03]))
        finally:
            await stack.close()

    consumed = run(go())
    assert len(consumed) == 6
    for v, batch in consumed:
        assert len(batch) == rollout.groups_per_batch
        for group in batch:
            assert len(group.trajectories) == rollout.group_size
            for traj in group.trajectories:
                generated = [ver for ver, m in zip(traj.versions, traj.loss_mask) if m]
                assert generated, "every consumed episode has model tokens"
                assert v - min(generated) <= async_ratio, (v, generated)
                assert max(generated) <= v  # nothing from the future


def test_async_ratio_zero_is_exactly_on_policy(formatter):
    rollout = RolloutConfig(async_ratio=0, num_env_groups=3, groups_per_batch=2, group_size=3,
                            group_size_redundancy=1, max_turns=3)
    env = {"latency": "normal", "mean_s": 0.003, "std_s": 0.003, "episode_len": 3, "min_len": 1}
    stack = build(formatter, rollout, env, engine_cfg=ScriptedEngineConfig(response_tokens=3, token_latency_s=0.001))

    async def go():
        try:
            return await train_loop(stack, steps=5, train_s=0.02)
        finally:
            await stack.close()

    for v, batch in run(go()):
        versions = {ver for g in batch for t in g.trajectories for ver, m in zip(t.versions, t.loss_mask) if m}
        assert versions == {v}


def test_admission_bounds_how_far_generation_runs_ahead(formatter):
    """With no training at all, admission stops after (a + 1) batches plus the extra groups."""
    rollout = RolloutConfig(async_ratio=1, num_env_groups=3, groups_per_batch=2, group_size=2,
                            group_size_redundancy=0, max_turns=2)
    stack = build(formatter, rollout, {"episode_len": 2})

    async def go():
        stack.scheduler.start()
        await asyncio.sleep(0.5)
        started = stack.buffer.ledger.counts["started"]
        await stack.close()
        return started

    started = run(go())
    expected_groups = (rollout.async_ratio + 1) * rollout.groups_per_batch + 1
    assert started == expected_groups * rollout.group_size
