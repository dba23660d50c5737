"""Make envs from their gymnasium ids (built-ins and a user's `module:Name-v0`): envs are the one
plug-in kind whose registry is gymnasium's own (roll_agent/registry.py has the others)."""

from __future__ import annotations

import difflib
import inspect
import re

import gymnasium

from roll_agent.config import ConfigError, EnvSpec


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


def check_env_specs(specs: list[EnvSpec]) -> None:
    """Make (and close) each configured env once, so that a misspelt id or kwarg, or a value
    the env rejects, is a ConfigError naming `envs[i]` before any model is built."""
    for i, spec in enumerate(specs):
        try:
            make_env(spec).close()
        except Exception as exc:  # whatever the env's constructor raises
            raise ConfigError(f"envs[{i}] (id {spec.id!r}, kwargs {dict(spec.kwargs)}) cannot be made: "
                              f"{exc}{_kwarg_hint(i, spec, exc)}") from exc


def _kwarg_hint(i: int, spec: EnvSpec, exc: Exception) -> str:
    """For an unexpected keyword: the env's own parameters, the closest first."""
    bad = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    if not isinstance(exc, TypeError) or not bad:
        return ""
    try:
        entry = gymnasium.spec(spec.id).entry_point
        cls = gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        params = [n for n in inspect.signature(cls).parameters if n not in ("self", "args", "kwargs")]
    except Exception:  # an entry point we cannot inspect: the message alone
        return ""
    close = difflib.get_close_matches(bad.group(1), params, n=1)
    return (f". Did you mean envs[{i}].kwargs.{close[0]}?" if close else "") + f" {spec.id} takes {params}"
