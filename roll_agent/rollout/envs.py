"""Make envs from their gymnasium ids (built-ins and a user's `module:Name-v0`)."""

from __future__ import annotations

import difflib

import gymnasium

from roll_agent.config import EnvSpec


def make_env(spec: EnvSpec) -> gymnasium.Env:
    import envs  # noqa: F401  registers the built-in envs

    try:
        return gymnasium.make(spec.id, disable_env_checker=True, **dict(spec.kwargs))
    except gymnasium.error.Error as exc:
        known = [i for i in gymnasium.registry if i.startswith("roll_agent/")]
        close = difflib.get_close_matches(spec.id, known, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else f" Registered roll_agent ids: {sorted(known)}."
        raise ValueError(
            f"Cannot make env '{spec.id}': {exc}.{hint} A user env registers with "
            "gymnasium.register(...) in its own module and is named as 'module:Name-v0'."
        ) from exc
