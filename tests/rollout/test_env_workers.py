"""Envs in worker processes (roll_agent/rollout/env_workers.py): the same episodes as in
this process, a worker's death ends only the episodes in flight on it."""

import asyncio
import os
import signal
import time
from pathlib import Path

import gymnasium
import pytest

from roll_agent.config import ConfigError, EnvSpec, RolloutConfig
from roll_agent.config_loader import load_config
from roll_agent.rollout.env_workers import MAX_DEFAULT_WORKERS, EnvWorkers, num_workers
from roll_agent.env_registry import make_env
from roll_agent.types import Status
from roll_agent.worker_process import WorkerError
from tests.conftest import run
from tests.rollout.harness import build, train_loop

LAKE = EnvSpec(id="roll_agent/FrozenLake-v0", kwargs={"size": 4}, workers=2)
SCRIPT = ["right", "down", "zzz", "down", "right", "down", "left", "up"]


def test_how_many_workers_an_env_gets(monkeypatch):
    # TextWorld and ALFWorld declare metadata["thread_safe"] = False: workers by default
    # (one per CPU, at most MAX_DEFAULT_WORKERS: each holds its own engine in memory)
    default = min(os.cpu_count(), MAX_DEFAULT_WORKERS)
    assert num_workers(EnvSpec(id="roll_agent/TWCooking-v0")) == default
    assert num_workers(EnvSpec(id="roll_agent/ALFWorld-v0")) == default
    monkeypatch.setattr(os, "cpu_count", lambda: 96)
    assert num_workers(EnvSpec(id="roll_agent/ALFWorld-v0")) == MAX_DEFAULT_WORKERS
    assert num_workers(EnvSpec(id="roll_agent/ALFWorld-v0", workers=32)) == 32
    assert num_workers(EnvSpec(id="roll_agent/FrozenLake-v0")) == 0
    assert num_workers(EnvSpec(id="roll_agent/TWCooking-v0", workers=0)) == 0
    assert num_workers(EnvSpec(id="roll_agent/FrozenLake-v0", workers=3)) == 3
    assert load_config(overrides=["envs=[{id: roll_agent/FrozenLake-v0, workers: 2}]"]).envs[0].workers == 2
    with pytest.raises(ConfigError, match="workers must be >= 0"):
        load_config(overrides=["envs=[{id: roll_agent/FrozenLake-v0, workers: -1}]"])


def play_alone(spec: EnvSpec, seed: int) -> list:
    env = make_env(spec)
    try:
        seen = [env.reset(seed=seed)]
        seen += [env.step(action) for action in SCRIPT]
        return seen
    finally:
        env.close()


async def play_in(workers: EnvWorkers, spec: EnvSpec, seed: int) -> list:
    env = await workers.pool(spec).make(spec)
    try:
        seen = [await env.areset(seed=seed)]
        seen += [await env.astep(action) for action in SCRIPT]
        return seen
    finally:
        env.close()


def test_envs_in_workers_play_as_they_do_alone():
    async def go():
        workers = EnvWorkers()
        try:
            # 8 envs at once over 2 workers: several envs per worker, their calls interleaved
            return await asyncio.gather(*(play_in(workers, LAKE, seed) for seed in range(8)))
        finally:
            workers.close()

    together = run(go())
    assert together == [play_alone(LAKE, seed) for seed in range(8)]


def test_an_env_error_in_a_worker_names_the_env_and_the_worker_goes_on():
    spec = EnvSpec(id="roll_agent/Simulated-v0", kwargs={"fail_prob": 1.0}, workers=1)

    async def go():
        workers = EnvWorkers()
        try:
            env = await workers.pool(spec).make(spec)
            await env.areset(seed=0)
            with pytest.raises(WorkerError, match="SimulatedEnvError"):
                await env.astep("anything")
            env.close()
            with pytest.raises(WorkerError, match="Cannot make env"):
                await workers.pool(spec).make(EnvSpec(id="roll_agent/NoSuchEnv-v0"))
            return await play_in(workers, EnvSpec(id=LAKE.id, kwargs=LAKE.kwargs, workers=1), 3)
        finally:
            workers.close()

    assert run(go()) == play_alone(LAKE, 3)


def test_a_worker_killed_mid_episode_ends_only_its_episodes_and_the_run_goes_on(formatter):
    rollout = RolloutConfig(async_ratio=1, num_env_groups=2, groups_per_batch=2, group_size=2,
                            group_size_redundancy=1, max_turns=4)
    # blocking 50 ms steps, so a kill finds calls in flight
    spec = EnvSpec(id="roll_agent/Simulated-v0", workers=2,
                   kwargs={"episode_len": 4, "latency": "fixed", "mean_s": 0.05, "async_step": False})
    stack = build(formatter, rollout, specs=[spec])
    killed = []

    async def killer():
        pool = stack.services.workers.pool(spec)
        while not killed:
            await asyncio.sleep(0.05)
            worker = pool.workers[0]
            if worker is not None and worker.died is None and worker.busy():
                os.kill(worker.process.pid, signal.SIGKILL)
                killed.append(worker.process.pid)

    async def go():
        task = asyncio.create_task(killer())
        try:
            return await train_loop(stack, steps=4)
        finally:
            task.cancel()
            await stack.close()

    consumed = run(go())
    assert killed and len(consumed) == 4
    assert stack.stats().env_worker_restarts == stack.services.workers.restarts() >= 1
    assert stack.buffer.ledger.counts["env_error"] >= 1
    assert stack.stats().accounting()["accounting_ok"]
    for _, batch in consumed:
        assert all(t.status != Status.ENV_ERROR for g in batch for t in g.trajectories)


def test_a_call_hung_past_its_timeout_takes_its_worker_down_and_the_next_env_gets_a_fresh_one():
    hangs = EnvSpec(id="roll_agent/Simulated-v0", kwargs={"hang_prob": 1.0, "hang_s": 600.0}, workers=1)

    async def go():
        workers = EnvWorkers()
        pool = workers.pool(hangs)
        try:
            env = await pool.make(hangs)
            await env.areset(seed=0)
            hung = pool.workers[0]
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(env.astep("anything"), 0.3)
            env.close()  # what the EnvManager does with an env that timed out
            for _ in range(100):
                if hung.died is not None:
                    break
                await asyncio.sleep(0.05)
            assert hung.died is not None and "-9" in hung.died
            fresh = await pool.make(hangs)  # on a restarted worker
            obs, _ = await fresh.areset(seed=1)
            return obs, fresh.worker is not hung, pool.restarts
        finally:
            workers.close()

    obs, moved, restarts = run(go())
    assert obs and moved and restarts == 1


@pytest.mark.parametrize("where", ["thread", "async", "worker"])
def test_the_envs_episode_report_reaches_the_trajectory_wherever_the_env_runs(formatter, where):
    """An env's optional episode_report() (run-to-run extras, kept out of info) joins the
    episode's kept info, from a blocking env, an async env and an env in a worker process."""
    rollout = RolloutConfig(async_ratio=0, num_env_groups=1, groups_per_batch=1, group_size=2,
                            group_size_redundancy=0, max_turns=3)
    spec = EnvSpec(id="roll_agent/Simulated-v0", workers=1 if where == "worker" else 0,
                   kwargs={"episode_len": 2, "latency": "fixed", "mean_s": 0.01, "async_step": where == "async"})
    stack = build(formatter, rollout, specs=[spec])

    async def go():
        try:
            return await train_loop(stack, steps=1)
        finally:
            await stack.close()

    [(_, batch)] = run(go())
    for traj in batch[0].trajectories:
        # two steps of 10 ms each: the report, beside the last step's info
        assert traj.info["latency_s"] == pytest.approx(0.01 * traj.num_turns), traj.info
        assert traj.info["invalid_action"] is False


class WarmMarkerEnv(gymnasium.Env):
    """An env whose class leaves a file named by its process's pid when warmed up."""

    metadata = {"thread_safe": False}
    observation_space = action_space = gymnasium.spaces.Text(8)

    def warm_up(self) -> None:
        (Path(os.environ["ROLL_AGENT_TEST_WARM_DIR"]) / str(os.getpid())).touch()

    def reset(self, *, seed=None, options=None):
        return "ready", {}

    def step(self, action):
        return "done", 1.0, True, False, {}


gymnasium.register("tests/WarmMarker-v0", entry_point=WarmMarkerEnv)


def test_started_workers_warm_up_before_any_env_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLL_AGENT_TEST_WARM_DIR", str(tmp_path))  # the workers inherit it
    spec = EnvSpec(id=f"{__name__}:tests/WarmMarker-v0")  # not thread-safe: workers by default
    workers = EnvWorkers()
    try:
        workers.start([spec])
        pool = workers.pool(spec)
        pids = {str(w.process.pid) for w in pool.workers}
        assert len(pids) == num_workers(spec)
        deadline = time.monotonic() + 120
        while {p.name for p in tmp_path.iterdir()} != pids and time.monotonic() < deadline:
            time.sleep(0.1)
        assert {p.name for p in tmp_path.iterdir()} == pids  # each worker warmed itself up, unasked
        assert all(w.hosted == 0 for w in pool.workers)
        workers.start([spec])  # started already: no new worker
        assert {str(w.process.pid) for w in pool.workers} == pids

        async def play():
            env = await pool.make(spec)
            try:
                return await env.areset(seed=0), await env.astep("go")
            finally:
                env.close()

        assert run(play()) == (("ready", {}), ("done", 1.0, True, False, {}))
    finally:
        workers.close()
