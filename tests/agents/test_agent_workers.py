"""Function agents in agent worker processes (roll_agent/agents/workers.py): they run outside the
rollout's process, a cancelled run is cancelled there, and a worker's death ends only the
episodes in flight on it."""

import asyncio
import json
import os

import pytest

from roll_agent.agents.runner import AgentError, AgentSpec
from roll_agent.agents.workers import AgentWorkers, default_agent_workers
from roll_agent.config import ConfigError, EndpointConfig, EnvSpec, RolloutConfig
from roll_agent.types import Status
from tests.agents.conftest import answering, stack_for, train_stack
from tests.conftest import run

AGENTS = "tests.agents.agents_for_tests"
ROLLOUT = RolloutConfig(async_ratio=1, num_env_groups=2, groups_per_batch=2, group_size=2, group_size_redundancy=1,
                        max_turns=4, max_new_tokens=8, max_context_tokens=4096)


def agent_env(tmp_path, agent: str, task_ids=range(8)) -> EnvSpec:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": i}) + "\n" for i in task_ids))
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    return EnvSpec(id="roll_agent/Agent-v0", kwargs={"agent": f"{AGENTS}:{agent}", "tasks": str(tasks), "timeout_s": 60,
                                                     "agent_kwargs": {"marker_dir": str(markers)}})


def train(formatter, spec: EnvSpec, agent_workers: int):
    return train_stack(stack_for(formatter, answering(formatter, lambda text: "ok"), rollout=ROLLOUT, specs=[spec],
                                 endpoint=EndpointConfig(agent_workers=agent_workers)))


def batch_episodes(consumed):
    return [t for _, batch in consumed for group in batch for t in group.trajectories]


@pytest.mark.parametrize("agent_workers", [0, 2])
def test_function_agents_run_in_the_agent_workers_or_here(formatter, tmp_path, agent_workers):
    stack, consumed = train(formatter, agent_env(tmp_path, "pid_agent"), agent_workers)
    episodes = batch_episodes(consumed)
    assert len(episodes) == 8 and all(t.status == Status.FINISHED and t.reward == 1.0 for t in episodes)
    pids = {int(p.name.removeprefix("pid-")) for p in (tmp_path / "markers").glob("pid-*")}
    if agent_workers:  # the workers ran them (the first to start may run all), none ran here
        workers = {w.process.pid for w in stack.services.endpoint.workers.pool.workers}
        assert len(workers) == agent_workers and pids and pids <= workers and os.getpid() not in pids
    else:
        assert stack.services.endpoint.workers is None and pids == {os.getpid()}
    assert stack.stats().accounting()["accounting_ok"]


def test_a_worker_killed_mid_run_ends_only_its_episodes_and_is_restarted(formatter, tmp_path):
    """dying_agent SIGKILLs its worker on its first run: the runs in flight there end as
    env_error, the next run starts a fresh worker, the batches fill with finished episodes."""
    stack, consumed = train(formatter, agent_env(tmp_path, "dying_agent", task_ids=[0]), agent_workers=1)
    assert (tmp_path / "markers" / "killed").exists()
    assert stack.buffer.ledger.counts["env_error"] >= 1
    assert stack.services.endpoint.workers.restarts == 1
    episodes = batch_episodes(consumed)
    assert len(episodes) == 8 and all(t.status == Status.FINISHED for t in episodes)
    assert stack.stats().accounting()["accounting_ok"]


def test_a_run_in_a_worker_is_cancelled_there_times_out_and_fails_with_its_error(tmp_path):
    workers = AgentWorkers(1)
    url, key = "http://127.0.0.1:9/v1", "unused"  # these agents make no call

    def spec(name: str, timeout_s: float = 60, **kwargs) -> AgentSpec:
        return AgentSpec(function=f"{AGENTS}:{name}", timeout_s=timeout_s, kwargs=kwargs)

    async def until(path, timeout: float = 30):
        async with asyncio.timeout(timeout):
            while not path.exists():
                await asyncio.sleep(0.02)

    async def go():
        # cancelled here (a redundant episode): cancelled in the worker too
        running = asyncio.create_task(workers.run(spec("sleepy_agent", marker_dir=str(tmp_path)), {"id": 0}, url, key))
        await until(tmp_path / "started")
        running.cancel()
        await until(tmp_path / "cancelled")
        with pytest.raises(AgentError, match="did not finish within timeout_s=1s"):
            await workers.run(spec("sleepy_agent", timeout_s=1, marker_dir=str(tmp_path / "x")), {"id": 1}, url, key)
        with pytest.raises(AgentError, match="cannot be sent from its worker"):
            await workers.run(spec("unsendable_agent"), {"id": 2}, url, key)
        with pytest.raises(AgentError, match="the agent .*agents_for_tests.* has no .no_such_agent."):
            await workers.run(spec("no_such_agent"), {"id": 3}, url, key)
        # the worker is the same one throughout: none of this took it down
        assert workers.restarts == 0 and not workers.pool.workers[0].busy()

    (tmp_path / "x").mkdir()
    try:
        run(go(), timeout=90)
    finally:
        workers.close()


def test_how_many_agent_workers():
    assert default_agent_workers(3) == 3 and default_agent_workers(0) == 0
    assert default_agent_workers(None) == min(len(os.sched_getaffinity(0)) - 1, 8)
    with pytest.raises(ConfigError, match="agent_workers must be >= 0"):
        EndpointConfig(agent_workers=-1)
