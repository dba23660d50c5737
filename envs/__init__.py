"""Built-in roll_agent environments. Importing this package registers them with gymnasium.

Entry points are lazy strings, so registering imports nothing heavy; an env's module is
only imported when the env is made. A user's env registers the same way in its own module.
"""

from __future__ import annotations

from typing import Any

import gymnasium

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
