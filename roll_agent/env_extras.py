"""What an env may do beyond gymnasium's reset/step, declared once: a small Protocol per extra,
and the functions the rest of roll_agent uses to find and call them (no other module probes an
env for a method). `check_env` reports which of these an env has (`extras`).

    AsyncEnv       areset(seed=...) / astep(action): awaited on the event loop, no thread per call
    ExpertEnv      expert_action() -> str: the warm-start's demonstrations, check_env's expert play
    ReportingEnv   episode_report() -> dict: an episode's extras for the rollout dumps (kept out of
                   `info`, whose seeded episodes must repeat)
    EvaluatingEnv  evaluate(result) -> reward or (reward, info): scores an agent's result when the
                   env is an agent env's task env
    WarmUpEnv      warm_up(): a process's one-time work (an engine's import), done while the model loads
    AgentEnv       agent: an AgentSpec; its episodes are a user's agent run (roll_agent/Agent-v0)
    RemoteEnv      an env in a worker process (roll_agent/rollout/env_workers.py: WorkerEnv), whose
                   expert and report are awaited there

Declared on the class, not probed: `metadata["thread_safe"] = False` (the env runs in worker
processes) and `metadata["free_text_actions"]`; per step, `info["state_key"]` (roll_agent/types.py).
A method set to None opts out (an async env that wants its blocking calls in a thread).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class AsyncEnv(Protocol):
    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple: ...

    async def astep(self, action: Any) -> tuple: ...


@runtime_checkable
class ExpertEnv(Protocol):
    def expert_action(self) -> str: ...


@runtime_checkable
class ReportingEnv(Protocol):
    def episode_report(self) -> dict: ...


@runtime_checkable
class EvaluatingEnv(Protocol):
    def evaluate(self, result: Any) -> Any: ...


@runtime_checkable
class WarmUpEnv(Protocol):
    def warm_up(self) -> None: ...


@runtime_checkable
class AgentEnv(Protocol):
    agent: Any


@runtime_checkable
class RemoteEnv(Protocol):
    async def aexpert_action(self) -> str: ...

    async def aepisode_report(self) -> dict: ...


def _inner(env):
    """The env under gymnasium's wrappers (an env in a worker process is its own)."""
    return getattr(env, "unwrapped", env)


def has(obj, extra: type) -> bool:
    """`obj` (an env, or an env class) has `extra`: each of the Protocol's members, none set to None."""
    return all(getattr(obj, m, None) is not None for m in _members(extra))


def _members(extra: type) -> list[str]:
    """The names a Protocol declares (its methods and annotated attributes)."""
    return [n for n in (*vars(extra), *getattr(extra, "__annotations__", {})) if not n.startswith("_")]


def async_env(env) -> AsyncEnv | None:
    """The env itself when it resets and steps on the event loop, else None (a thread runs them)."""
    inner = _inner(env)
    return inner if has(inner, AsyncEnv) else None


def agent_of(env):
    """An agent env's AgentSpec (its episodes are the agent's runs), else None."""
    inner = _inner(env)
    return inner.agent if has(inner, AgentEnv) else None


def expert(env):
    """The env's expert_action (called in this process), or None."""
    inner = _inner(env)
    return inner.expert_action if has(inner, ExpertEnv) else None


def expert_action_here(env) -> str:
    """The env's `expert_action()` in this process; a ValueError naming the fix when it has none."""
    act = expert(env)
    if act is None:
        spec = getattr(env, "spec", None)
        raise ValueError(f"{spec.id if spec else type(_inner(env)).__name__} has no expert_action(); "
                         "set warmup.sft_steps=0")
    return act()


async def expert_action(env) -> str:
    """The env's `expert_action()`, in this process or in the env's worker process."""
    inner = _inner(env)
    if has(inner, RemoteEnv):  # asked in the worker, where an env without one fails the same way
        return await inner.aexpert_action()
    return expert_action_here(env)


def episode_report(env) -> dict:
    """The env's `episode_report()` in this process, {} when it has none."""
    inner = _inner(env)
    return dict(inner.episode_report()) if has(inner, ReportingEnv) else {}


async def aepisode_report(env) -> dict:
    """The env's `episode_report()`, in this process or in its worker process."""
    inner = _inner(env)
    return dict(await inner.aepisode_report()) if has(inner, RemoteEnv) else episode_report(env)


def evaluator(env):
    """The env's `evaluate(result)`, or None."""
    inner = _inner(env)
    return inner.evaluate if has(inner, EvaluatingEnv) else None


def thread_safe(env_class) -> bool:
    """The class's `metadata["thread_safe"]` (true when it does not say)."""
    return bool((getattr(env_class, "metadata", None) or {}).get("thread_safe", True))


def warms_up(env_class) -> bool:
    return has(env_class, WarmUpEnv)


EXTRAS = {"async (areset/astep)": AsyncEnv, "expert_action": ExpertEnv, "episode_report": ReportingEnv,
          "evaluate": EvaluatingEnv, "warm_up": WarmUpEnv, "agent": AgentEnv}


def extras(env) -> list[str]:
    """The extras `env` has, by name (check_env's report), and whether it is thread-safe."""
    inner = _inner(env)
    found = [name for name, extra in EXTRAS.items() if has(inner, extra)]
    return found + ([] if thread_safe(type(inner)) else ["not thread-safe (worker processes)"])
