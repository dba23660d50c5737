"""roll_agent/env_extras.py: an env's extras found from their declarations, in one place."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import gymnasium
import pytest

import envs  # noqa: F401  registers the built-in envs
from roll_agent import env_extras as extras
from roll_agent.config import EnvSpec
from roll_agent.rollout.env_workers import EnvWorkers

ROOT = Path(__file__).parents[1]
ABILITIES = {"areset", "astep", "episode_report", "aepisode_report", "expert_action", "aexpert_action", "warm_up",
             "agent", "evaluate", "thread_safe", "metadata"}


def test_no_module_but_the_adapter_probes_an_env_for_an_extra():
    """No `getattr(x, "<extra>", ...)` / `hasattr(x, "<extra>")` outside roll_agent/env_extras.py."""
    found = []
    for path in (ROOT / "roll_agent").rglob("*.py"):
        if path.name == "env_extras.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in ABILITIES):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    assert not found, "\n".join(found)


class Plain(gymnasium.Env):
    def reset(self, *, seed=None, options=None):
        return "obs", {}

    def step(self, action):
        return "obs", 0.0, True, False, {}


class Rich(Plain):
    metadata = {"thread_safe": False}

    async def areset(self, *, seed=None, options=None):
        return self.reset(seed=seed)

    async def astep(self, action):
        return self.step(action)

    def expert_action(self):
        return "go"

    def episode_report(self):
        return {"took": 1}

    @classmethod
    def warm_up(cls):
        pass


class OptedOut(Rich):
    """An async env that wants its blocking calls in a thread says so by None."""
    areset = astep = None


def test_extras_are_found_from_their_declarations():
    assert extras.extras(Plain()) == []
    assert extras.extras(Rich()) == ["async (areset/astep)", "expert_action", "episode_report", "warm_up",
                                     "not thread-safe (worker processes)"]
    wrapped = gymnasium.wrappers.TimeLimit(Rich(), 5)  # found under gymnasium's wrappers
    assert extras.async_env(wrapped) is wrapped.unwrapped and extras.expert(wrapped)() == "go"
    assert extras.episode_report(wrapped) == {"took": 1} and extras.episode_report(Plain()) == {}
    assert extras.async_env(OptedOut()) is None and extras.agent_of(Rich()) is None
    assert extras.warms_up(Rich) and not extras.warms_up(Plain) and not extras.thread_safe(Rich)
    with pytest.raises(ValueError, match="has no expert_action\\(\\); set warmup.sft_steps=0"):
        asyncio.run(extras.expert_action(Plain()))


@pytest.mark.slow
def test_an_env_in_a_worker_process_has_its_extras_there():
    """The expert and the report of an env hosted in a worker process (not thread-safe) are asked there."""
    workers = EnvWorkers()
    spec = EnvSpec(id="roll_agent/Sokoban-v0", workers=1)

    async def go():
        env = await workers.pool(spec).make(spec)
        try:
            await env.areset(seed=3)
            return extras.async_env(env) is env, await extras.expert_action(env), await extras.aepisode_report(env)
        finally:
            env.close()

    try:
        is_async, action, report = asyncio.run(go())
    finally:
        workers.close()
    assert is_async and isinstance(action, str) and action and report == {}
