"""The two benchmark tasks, seen from TRL: prompts, reward functions and the tool environment.

Both sides play the same gymnasium envs (`envs/`): roll_agent steps them through its env
managers; TRL's `GRPOTrainer` gets prompts made by `env.reset`, rewards computed by the
env's own scoring, and, for the tool task, an `environment_factory` whose `calculator`
tool waits the env's latency and answers with the env's own tool. Imports only the envs
(gymnasium), so it loads in TRL's virtual environment as well as in roll_agent's.
"""

from __future__ import annotations

import asyncio
import random

import gymnasium

import envs  # noqa: F401  registers the envs

SINGLE_TURN = "single_turn"
MULTI_TURN = "multi_turn"
ENV_IDS = {SINGLE_TURN: "roll_agent/ReverseLetters-v0", MULTI_TURN: "roll_agent/ToolLatencyCalculator-v0"}
NO_LATENCY = {"latency_min_s": 0.0, "latency_mean_s": 0.0, "latency_max_s": 0.0}  # warm-start demos, corpus
# the tool task's latency while training, both sides: {} = the env's own (100-500 ms, mean 200);
# NO_LATENCY for the setting that shows the engine's gain apart from overlapping tools
TOOL_LATENCY: dict = {}
SEED_SPACE = 1_000_000  # training seeds, below roll_agent's eval seeds


def make(task: str, **kwargs) -> gymnasium.Env:
    return gymnasium.make(ENV_IDS[task], disable_env_checker=True, **kwargs)


def train_seeds(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(SEED_SPACE) for _ in range(n)]


def prompt_row(task: str, seed: int) -> dict:
    """A conversational dataset row: system = the env's instructions, user = its first observation.

    For the tool task the observation comes from the environment's `reset` (TRL appends it to
    the last user message), so the user message starts empty.
    """
    env = make(task, **(NO_LATENCY if task == MULTI_TURN else {}))
    obs, info = env.reset(seed=seed)
    user = obs if task == SINGLE_TURN else ""
    return {"prompt": [{"role": "system", "content": info["instructions"]}, {"role": "user", "content": user}],
            "seed": seed}


def reverse_reward(completions: list, seed: list[int], **_) -> list[float]:
    """TRL reward function for the single-turn task: the env's own reward for each completion."""
    env = make(SINGLE_TURN)
    rewards = []
    for completion, s in zip(completions, seed):
        env.reset(seed=s)
        rewards.append(float(env.step(completion[-1]["content"])[1]))
    return rewards


def train_kwargs(task: str) -> dict:
    """The env's kwargs while training."""
    return dict(TOOL_LATENCY) if task == MULTI_TURN else {}


class CalculatorToolEnv:
    """TRL `environment_factory` environment: one ToolLatencyCalculator episode per rollout."""

    def __init__(self):
        self.env = make(MULTI_TURN, **TOOL_LATENCY).unwrapped

    def reset(self, seed: int, **_) -> str:
        obs, _ = self.env.reset(seed=int(seed))
        return obs

    async def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / // % and parentheses.

        Args:
            expression: The expression, e.g. 12*34+56.

        Returns:
            The result, or an error message.
        """
        await asyncio.sleep(self.env.sample_latency())
        return self.env.call_tool(expression)


def calculator_reward(completions: list, environments: list, **_) -> list[float]:
    """TRL reward function for the tool task: the env's reward for the final assistant message."""
    rewards = []
    for completion, env in zip(completions, environments):
        final = completion[-1] if completion else {}
        answered = final.get("role") == "assistant" and not final.get("tool_calls")  # else: out of tool calls
        rewards.append(env.env.answer_reward(final.get("content") or "") if answered else 0.0)
    return rewards
