"""`roll_agent/Agent-v0`: an env whose episode is one run of a user's agent.

The env holds the tasks and the reward; the agent (roll_agent/agents/runner.py) does the rest
through the endpoint. `reset(seed)` gives the task, `step(result)` scores what the agent
returned. The EnvManager sees its `agent` (roll_agent/env_extras.py: AgentEnv) and plays the
episode by running the agent against its session instead of asking the model itself.

    envs:
      - id: roll_agent/Agent-v0
        kwargs:
          agent: my_pkg.my_agent:solve      # or command: "python my_agent.py"
          tasks: data/tasks.jsonl           # one JSON object per line, handed to the agent as is
          reward: my_pkg.my_agent:score     # score(task, result) -> float; optional for an agent
                                            # that returns a number
          timeout_s: 300

Tasks from a gymnasium env instead of a file: `task_env: module:Name-v0` (and
`task_env_kwargs`): its `reset(seed)` gives the task ({prompt, instructions, seed, env}), and
`step(answer)` with the agent's result (as text) gives the reward, or its `evaluate(result)`
when it has one (a reward, or (reward, info)). `task["env"]` is that env itself, for a function
agent that acts in it (roll_agent/agents/mini_swe_agent.py runs its commands in the SWE env's
sandbox); a command agent's JSON task leaves it out, and a function agent given such a task runs
in the rollout's process (others run in agent worker processes: roll_agent/agents/workers.py).
`agent_kwargs` are passed to a function agent as keyword arguments.
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any

import gymnasium
from gymnasium import spaces

from roll_agent.agents.runner import AgentSpec
from roll_agent.config import EnvSpec
from roll_agent.env_extras import episode_report, evaluator
from roll_agent.env_registry import make_env
from roll_agent.registry import load_named

_TEXT = spaces.Text(max_length=1_000_000, charset="".join(chr(c) for c in range(32, 127)) + "\n\t")


class AgentTaskEnv(gymnasium.Env):
    metadata = {"render_modes": [], "free_text_actions": True}

    def __init__(self, agent: str = "", command: list[str] | str = "", tasks: str = "", reward: str = "",
                 task_env: str = "", task_env_kwargs: dict | None = None, timeout_s: float = 600.0,
                 cwd: str | None = None, env: dict | None = None, agent_kwargs: dict | None = None):
        self.agent = AgentSpec(function=agent, command=command or [], timeout_s=timeout_s, cwd=cwd,
                               env={str(k): str(v) for k, v in (env or {}).items()}, kwargs=dict(agent_kwargs or {}),
                               local=bool(task_env))  # a task env's task holds the env: it cannot travel
        if bool(tasks) == bool(task_env):
            raise ValueError("an agent env needs exactly one task source: tasks (a JSONL file) or task_env (a gymnasium id)")
        self.observation_space = _TEXT
        self.action_space = _TEXT
        self.tasks: list[Any] = []
        self.inner = None
        if tasks:
            self.tasks = _read_tasks(Path(tasks))
        else:
            self.inner = make_env(EnvSpec(id=task_env, kwargs=dict(task_env_kwargs or {})))
        self.reward_fn = load_named(reward, "reward") if reward else None
        self.task: Any = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        seed = 0 if seed is None else int(seed)
        if self.inner is not None:
            obs, info = self.inner.reset(seed=seed)
            self.task = {"prompt": str(obs), "instructions": str(info.get("instructions", "")), "seed": seed,
                         "env": self.inner.unwrapped}
        else:
            self.task = self.tasks[seed % len(self.tasks)]
        prompt = self.task.get("prompt") if isinstance(self.task, dict) else None
        return str(prompt if prompt is not None else json.dumps(self.task)), {"task": self.task}

    def step(self, result: Any):
        if self.task is None:
            raise RuntimeError("step() before reset()")
        info: dict = {}
        if self.reward_fn is not None:
            reward = self.reward_fn(self.task, result)
        elif self.inner is not None:
            evaluate = evaluator(self.inner)
            if evaluate is not None:
                reward = evaluate(result)
                if isinstance(reward, tuple):
                    reward, info = reward
            else:
                _, reward, _, _, info = self.inner.step(result if isinstance(result, str) else json.dumps(result))
        elif isinstance(result, numbers.Real) and not isinstance(result, bool):
            reward = result
        else:
            raise ValueError(f"the agent returned {type(result).__name__}, not a number, and the env has no reward "
                             "function: give reward: module:function (called as reward(task, result))")
        reward = float(reward)
        return "", reward, True, False, {**info, "success": bool(info.get("success", reward > 0))}

    def episode_report(self) -> dict:
        """The task env's report of the episode the agent just ran in it (a SWE grading log)."""
        return episode_report(self.inner) if self.inner is not None else {}

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def _read_tasks(path: Path) -> list[Any]:
    if not path.is_file():
        raise ValueError(f"tasks file {path} does not exist")
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            tasks.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n} is not a JSON line: {exc}") from exc
    if not tasks:
        raise ValueError(f"tasks file {path} has no tasks")
    return tasks
