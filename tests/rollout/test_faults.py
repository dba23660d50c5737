"""Injected faults (env steps that raise or hang, engine requests that fail or hang, an
engine that crashes) end at most their own episode, the watchdog reports and cancels what
is stuck, and every started episode is accounted for."""

import asyncio
import logging

import pytest

from roll_agent.config import (CheckpointConfig, EvalConfig, ProxyConfig, RolloutConfig, ScriptedEngineConfig,
                               WatchdogConfig)
from roll_agent.controller import AsyncController, Components, update_weights
from roll_agent.proxy.engines.scripted import ScriptedEngine
from roll_agent.proxy.llm_proxy import EngineFailure, LLMProxy
from roll_agent.rollout.stack import build_rollout
from roll_agent.types import GenerateRequest, SamplingParams, Status
from roll_agent.watchdog import Watchdog
from tests.conftest import run
from tests.rollout.harness import train_loop

STEPS = 15
FAULTY_ENV = {"episode_len": 3, "fail_prob": 0.1, "hang_prob": 0.05, "hang_s": 60.0}


def faulty_stack(formatter, rollout, engine_cfgs, env=FAULTY_ENV, request_timeout_s=0.3):
    from roll_agent.config import EnvSpec

    engines = [ScriptedEngine(cfg, seed=i) for i, cfg in enumerate(engine_cfgs)]
    return build_rollout(formatter, rollout, [EnvSpec(id="roll_agent/Simulated-v0", kwargs=env)], engines,
                         ProxyConfig(max_request_retries=4),
                         watchdog_cfg=WatchdogConfig(request_timeout_s=request_timeout_s))


def test_faults_everywhere_batches_fill_and_every_episode_is_accounted(formatter):
    rollout = RolloutConfig(async_ratio=1, num_env_groups=4, groups_per_batch=2, group_size=2,
                            group_size_redundancy=2, max_turns=3, step_timeout_s=0.05)
    flaky = ScriptedEngineConfig(response_tokens=3, fail_prob=0.1, hang_prob=0.03)
    crashing = ScriptedEngineConfig(response_tokens=3, crash_every=10, restart_s=0.01)
    env = {**FAULTY_ENV, "latency": "fixed", "mean_s": 0.01}
    stack = faulty_stack(formatter, rollout, [flaky, crashing], env=env, request_timeout_s=0.05)
    checks = []

    async def go():
        stack.scheduler.start()
        try:
            for v in range(STEPS):
                batch = await stack.buffer.get_batch(v)
                checks.append(stack.stats().accounting())
                assert len(batch) == rollout.groups_per_batch
                assert all(t.status in (Status.FINISHED, Status.TRUNCATED) for g in batch for t in g.trajectories)
                await update_weights(stack, v + 1)
            while stack.proxy._restarts:  # a crash late in the run: its restart pushes the current weights
                await asyncio.sleep(0.005)
            restarted_version.append(stack.proxy.engines[1].version)  # no await since: no restart pending
        finally:
            await stack.close()

    restarted_version = []
    run(go(), timeout=120)
    checks.append(stack.stats().accounting())  # after close: the cancelled rest is counted too
    assert all(c["accounting_ok"] for c in checks), checks
    final = checks[-1]
    assert final["episodes_total_env_error"] > 0 and final["episodes_total_cancelled"] > 0
    assert final["episodes_total_finished"] + final["episodes_total_truncated"] >= STEPS * 2
    stats = stack.proxy.stats
    assert stats["request_failures"] > 0 and stats["engine_crashes"] > 0 and stats["engine_restarts"] > 0
    # hung steps end as env_error past step_timeout_s, or are cancelled with their group first
    # (timing decides which; tests/rollout/test_env_errors.py pins the timeout path)
    assert restarted_version == [STEPS], "a restarted engine gets the current weights"


def test_stuck_request_is_reported_cancelled_and_reissued(formatter, caplog):
    hang = ScriptedEngine(ScriptedEngineConfig(hang_prob=1.0), seed=0)
    good = ScriptedEngine(ScriptedEngineConfig(), seed=1)
    proxy = LLMProxy([hang, good], watchdog=Watchdog(WatchdogConfig(request_timeout_s=0.05)))
    request = GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=4), env_id="g0-e1")

    async def go():
        with caplog.at_level(logging.WARNING, logger="roll_agent.watchdog"):
            return await proxy.generate(request)

    result = run(go())
    assert len(result.token_ids) == 4 and result.num_reissues == 1
    assert proxy.watchdog.stats["stuck_request"] == 1
    assert any(f"request {request.request_id}.0 of env g0-e1 on engine 0" in r.message for r in caplog.records)
    assert hang.aborted_ids == [f"{request.request_id}.0"], "the stuck request is aborted on its engine"


def test_crashed_engine_is_restarted_and_requests_survive():
    engine = ScriptedEngine(ScriptedEngineConfig(crash_every=3, restart_s=0.01))
    proxy = LLMProxy([engine])

    async def go():
        await proxy.suspend()
        await proxy.push_weights(5)
        await proxy.resume()
        return [await proxy.generate(GenerateRequest([i, 7], SamplingParams(max_new_tokens=3))) for i in range(10)]

    results = run(go())
    assert all(len(r.token_ids) == 3 for r in results)
    assert engine.restarts == proxy.stats["engine_restarts"] >= 3
    assert engine.version == 5


def test_requests_fail_clearly_when_every_try_fails():
    proxy = LLMProxy([ScriptedEngine(ScriptedEngineConfig(fail_prob=1.0))], ProxyConfig(max_request_retries=2))
    with pytest.raises(EngineFailure, match="failed 3 times"):
        run(proxy.generate(GenerateRequest([1], SamplingParams(max_new_tokens=2))))


def test_batch_wait_past_threshold_cancels_and_then_stops_the_run(formatter):
    """Every env hangs far past any step: the watchdog cancels the stuck episodes, then gives up loudly."""
    rollout = RolloutConfig(num_env_groups=2, groups_per_batch=1, group_size=2, group_size_redundancy=0,
                            max_turns=2, step_timeout_s=600)
    stack = faulty_stack(formatter, rollout, [ScriptedEngineConfig()], env={"latency": "fixed", "mean_s": 3600})
    stack.watchdog.cfg = WatchdogConfig(batch_timeout_s=0.2, max_batch_stalls=2)
    parts = Components(stack, trainer=None, eval_managers=[], tokenizer=None)
    controller = AsyncController(parts, None, None, 1, CheckpointConfig(), EvalConfig())

    async def go():
        stack.scheduler.start()
        try:
            await controller._next_batch(0)
        finally:
            await stack.close()

    with pytest.raises(RuntimeError, match="watchdog.batch_timeout_s"):
        run(go())
    assert stack.watchdog.stats["stuck_batch"] == 2
    counts = stack.buffer.ledger.counts
    assert counts["cancelled"] == counts["started"] > 0
    assert stack.stats().accounting()["accounting_ok"]


def test_stale_groups_are_dropped_and_accounted(formatter):
    """a = 0 with slow, long-tailed envs: some groups go stale; they are counted, never trained."""
    rollout = RolloutConfig(async_ratio=0, num_env_groups=4, groups_per_batch=1, group_size=2,
                            group_size_redundancy=0, max_turns=3)
    env = {"latency": "longtail", "mean_s": 0.01, "std_s": 0.01, "tail_scale": 10, "episode_len": 3, "min_len": 1}
    stack = faulty_stack(formatter, rollout, [ScriptedEngineConfig(response_tokens=3)], env=env)

    async def go():
        try:
            return await train_loop(stack, steps=6)
        finally:
            await stack.close()

    run(go())
    acc = stack.stats().accounting()
    assert acc["accounting_ok"], acc
    assert acc["episodes_total_stale_dropped"] > 0
    assert acc["episodes_total_finished"] + acc["episodes_total_truncated"] == 6 * 2
