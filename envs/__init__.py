"""Built-in roll_agent environments. Importing this package registers them with gymnasium.

Entry points are lazy strings, so registering imports nothing heavy; an env's module is
only imported when the env is made. A user's env registers the same way in its own module.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import yaml

# id -> (entry point, default kwargs)
BUILTIN_ENVS: dict[str, tuple[str, dict[str, Any]]] = {
    "roll_agent/FrozenLake-v0": (
        "envs.frozen_lake:FrozenLakeEnv",
        {"size": 4, "p_frozen": 0.8, "is_slippery": False, "max_steps": None},
    ),
    "roll_agent/Sokoban-v0": (
        "envs.sokoban:SokobanEnv",
        {"dim": 6, "num_boxes": 1, "max_steps": 100, "box_on_target_reward": 0.1},
    ),
    "roll_agent/Taxi-v0": ("envs.text_adapter:ToyTextEnv", {"game": "Taxi", "max_steps": 200}),
    "roll_agent/CliffWalking-v0": ("envs.text_adapter:ToyTextEnv", {"game": "CliffWalking", "max_steps": 200}),
    "roll_agent/Blackjack-v0": ("envs.text_adapter:ToyTextEnv", {"game": "Blackjack"}),
    "roll_agent/Simulated-v0": ("envs.simulated:SimulatedEnv", {}),
    "roll_agent/Calculator-v0": ("envs.tool_use:CalculatorEnv", {"max_steps": 6}),
    "roll_agent/ToolLatencyCalculator-v0": (
        "envs.tool_use:ToolLatencyCalculatorEnv",
        {"max_steps": 3, "max_operand": 9, "latency_min_s": 0.1, "latency_mean_s": 0.2, "latency_max_s": 0.5},
    ),
    "roll_agent/ReverseLetters-v0": ("envs.reverse:ReverseLettersEnv", {"min_letters": 3, "max_letters": 6}),
    # TextWorld games generated per seed (and cached) by textworld's own challenge generators.
    "roll_agent/TextWorld-v0": (
        "envs.textworld_env:TextWorldEnv",
        {"challenge": "tw-coin_collector", "level": None, "settings": None, "cache_dir": None, "num_games": None,
         "max_steps": None},
    ),
    "roll_agent/TWCoinCollector-v0": (
        "envs.textworld_env:TextWorldEnv",
        {"challenge": "tw-coin_collector", "level": 1},
    ),
    "roll_agent/TWTreasureHunter-v0": (
        "envs.textworld_env:TextWorldEnv",
        {"challenge": "tw-treasure_hunter", "level": 1},
    ),
    "roll_agent/TWSimple-v0": (
        "envs.textworld_env:TextWorldEnv",
        {"challenge": "tw-simple", "settings": {"rewards": "dense", "goal": "detailed"}},
    ),
    "roll_agent/TWCooking-v0": (
        "envs.textworld_env:TextWorldEnv",
        {"challenge": "tw-cooking", "settings": {"recipe": 1, "take": 1, "go": 1}},
    ),
    # ALFWorld games from a data dir in ALFWorld's layout (data_dir=None: $ALFWORLD_DATA).
    "roll_agent/ALFWorld-v0": (
        "envs.alfworld_env:ALFWorldEnv",
        {"data_dir": None, "split": "valid_unseen", "task_types": None, "num_games": None, "expert": "handcoded",
         "max_steps": None},
    ),
    # SWE tasks (SWE-bench schema) from a JSONL dataset, solved with tools in docker/bwrap sandboxes.
    "roll_agent/SWE-v0": (
        "envs.swe.env:SWEEnv",
        {"dataset": None, "sandbox": "docker", "max_steps": 20, "partial_credit": False},
    ),
    # a user's own agent (a function or a command) run per episode against roll_agent's endpoint;
    # its code is roll_agent's (roll_agent/agents/task_env.py), needs the `agents` extra and kwargs
    "roll_agent/Agent-v0": ("roll_agent.agents.task_env:AgentTaskEnv", {}),
}


def _register(env_id: str, entry_point: str, kwargs: dict[str, Any]) -> None:
    existing = gymnasium.registry.get(env_id)
    if existing is not None and existing.entry_point != entry_point:
        # gymnasium would only warn and override: a clash here is a real bug, so raise.
        raise gymnasium.error.RegistrationError(
            f"{env_id} is already registered to {existing.entry_point!r}, not {entry_point!r}"
        )
    if existing is None:
        gymnasium.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs))


def registered_ids() -> list[str]:
    """Every `roll_agent/` id in gymnasium's registry (built-ins and user envs in that namespace)."""
    return sorted(env_id for env_id in gymnasium.registry if env_id.startswith("roll_agent/"))


for _env_id, (_entry_point, _kwargs) in BUILTIN_ENVS.items():
    _register(_env_id, _entry_point, _kwargs)


def parse_kwargs(pairs: list[str]) -> dict[str, Any]:
    """`key=value` pairs, each value read as a YAML scalar (8, 0.5, true, null, text)."""
    kwargs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected key=value, got {pair!r}")
        kwargs[key] = yaml.safe_load(value)
    return kwargs
