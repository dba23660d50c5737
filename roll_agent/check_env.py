"""Conformance checker for text envs: gymnasium's env_checker plus the roll_agent text contract.

    python -m roll_agent.check_env roll_agent/FrozenLake-v0 size=8 is_slippery=true
    python -m roll_agent.check_env my_package.my_env:MyGame-v0

What an env must do: text observations and actions (`spaces.Text`, printable ASCII
accepted); any string is a legal `step` argument (one the env cannot parse must not
raise); seeded episodes are deterministic; `close()` may be called twice.

What roll_agent reads when an env offers it (a plain gymnasium env passes without it;
each missing key is reported as a warning, `ContractWarning`):
- `reset` info `instructions`: the task, put before the first observation;
- step info `success` (bool): else an episode succeeded when its last reward is positive;
- step info `invalid_action` (bool): an action the env could not parse, state unchanged;
  without it no action counts as invalid (the checks on garbage actions only see that
  stepping with them does not raise);
- reset/step info `admissible_actions`, `tools`, and `env.unwrapped.expert_action()`;
- reset/step info `state_key` (a str or int): which states are the same, for turn-level credit
  (`algorithm.advantage: gigpo` groups the turns of a task group played from equal keys); without
  it a turn's state is a hash of its observation. When given it must be in every info, and an
  invalid action must leave it as it was.
"""

from __future__ import annotations

import argparse
import asyncio
import numbers
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import numpy as np
from gymnasium.utils.env_checker import check_env, data_equivalence

from envs import parse_kwargs
from roll_agent.config import EnvSpec
from roll_agent.env_extras import expert, extras
from roll_agent.env_registry import make_env
from roll_agent.rollout.env_workers import EnvWorkers, declares_thread_safe
from roll_agent.worker_process import WorkerError

SEED = 123
EPISODE_STEPS = 8
# Outputs a model really produces when it goes wrong. Junk avoids letters so it cannot
# contain an action word by chance.
GARBAGE_ACTIONS = {
    "empty": "",
    "unknown word": "zzz",
    "10 kB of junk": ("#!?%&*(){}[]~^ 0123456789\n" * 400)[:10_000],
    "unicode": "\u52a8\u4f5c \u00fc\u00f1\u00ee\u00e7\u00f8d\u00e9 \U0001f642 \u200b\u202e",
    "unterminated tool call": "<tool_call>{",
}

# What the action space must accept: visible ASCII plus the whitespace models emit.
MODEL_CHARS = frozenset(map(chr, range(32, 127))) | {"\n", "\t"}

Step = tuple[str, float, bool, bool, dict]
OPTIONAL_STEP_KEYS = {
    "success": "success is taken to be a positive last reward",
    "invalid_action": "no action counts as invalid (the invalid-action checks only see that stepping does not raise)",
}


class ContractWarning(UserWarning):
    """An optional part of the text-env contract the env does not offer."""


def _make(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """Make `env_id` as the rollout does (importing `envs` registered the built-ins); a
    `module:Name-v0` id imports `module` first."""
    return gymnasium.make(env_id, disable_env_checker=True, **kwargs)


def check_text_env(env_id: str, **kwargs: Any) -> list[str]:
    """Run every check on `env_id` made with `kwargs`; returns the names of the checks passed.

    Raises AssertionError naming the failed check (an exception the env raised included).
    """
    return list(iter_checks(env_id, **kwargs))


def iter_checks(env_id: str, **kwargs: Any) -> Iterator[str]:
    """Yield each check's name once it passed."""
    env = _run("make", lambda: _make(env_id, **kwargs))
    yield "make"
    closed = False
    try:
        for name, check in CHECKS:
            _run(name, lambda: check(env))
            yield name
        _run("in a worker process", lambda: check_worker_process(env, env_id, kwargs))
        yield "in a worker process"
        closed = True
        _run("close twice", lambda: (env.close(), env.close()))
        yield "close twice"
    finally:
        if not closed:
            env.close()


def _run(name: str, thunk: Callable[[], Any]) -> Any:
    try:
        return thunk()
    except AssertionError as exc:
        raise AssertionError(f"{name}: {exc}") from exc
    except Exception as exc:
        raise AssertionError(f"{name}: raised {type(exc).__name__}: {exc}") from exc


# -- the checks ---------------------------------------------------------------------------


def check_spaces(env: gymnasium.Env) -> None:
    assert isinstance(env.unwrapped, gymnasium.Env), f"{type(env.unwrapped)} is not a gymnasium.Env"
    for label, space in (("observation", env.observation_space), ("action", env.action_space)):
        assert isinstance(space, gymnasium.spaces.Text), f"{label}_space must be spaces.Text, got {space}"
    missing = MODEL_CHARS - env.action_space.character_set
    assert not missing, f"action_space charset lacks printable ASCII characters {sorted(missing)}"


def check_gymnasium(env: gymnasium.Env) -> None:
    check_env(env.unwrapped, skip_render_check=True)


def check_reset(env: gymnasium.Env) -> None:
    obs, info = env.reset(seed=SEED)
    _check_obs(env, obs, "reset")
    assert isinstance(info, dict), f"reset info must be a dict, got {type(info)}"
    if "instructions" not in info:
        warnings.warn('reset info has no "instructions": the first prompt is the observation alone',
                      ContractWarning, stacklevel=2)
        return
    instructions = info["instructions"]
    assert isinstance(instructions, str) and instructions.strip(), (
        f'reset info["instructions"] must be a non-empty str when given, got {instructions!r}'
    )


def check_valid_actions(env: gymnasium.Env) -> None:
    _, info = env.reset(seed=SEED)
    for action in info.get("admissible_actions") or [_probe_action(env, info)]:
        env.reset(seed=SEED)
        _, _, _, _, step_info = _checked_step(env, action)
        assert not step_info.get("invalid_action"), f"admissible action {action!r} was treated as invalid"


def check_expert_action(env: gymnasium.Env) -> None:
    act = expert(env)
    if act is None:
        return
    env.reset(seed=SEED)
    action = act()
    assert isinstance(action, str), f"expert_action() must return a str, got {type(action)}"
    assert not _checked_step(env, action)[4].get("invalid_action"), f"expert action {action!r} is invalid"


def _free_text(env: gymnasium.Env) -> bool:
    """Envs whose every text is a valid action declare metadata["free_text_actions"]."""
    return bool(env.unwrapped.metadata.get("free_text_actions"))


def check_garbage_actions(env: gymnasium.Env) -> None:
    for label, garbage in GARBAGE_ACTIONS.items():
        env.reset(seed=SEED)
        _, _, terminated, _, info = _checked_step(env, garbage)
        if _free_text(env) or "invalid_action" not in info:
            continue  # stepping with it must not raise; nothing is invalid
        assert info["invalid_action"] is True, f"{label} action {garbage[:40]!r} was not flagged invalid"
        assert not terminated, f"{label} action {garbage[:40]!r} ended the episode"


def check_invalid_keeps_state(env: gymnasium.Env) -> None:
    # The same valid action after an invalid one must do exactly what it does without it.
    if _free_text(env):
        return
    _, info = env.reset(seed=SEED)
    action = _probe_action(env, info)
    direct = _checked_step(env, action)
    env.reset(seed=SEED)
    if "invalid_action" not in _checked_step(env, GARBAGE_ACTIONS["unknown word"])[4]:
        return  # the env does not say what is invalid: nothing to compare
    after_garbage = _checked_step(env, action)
    assert data_equivalence(direct[:3], after_garbage[:3]), (
        f"an invalid action changed the state: {action!r} then gives {after_garbage[:3]!r}, "
        f"not {direct[:3]!r}"
    )


def check_state_keys(env: gymnasium.Env) -> None:
    _, info = env.reset(seed=SEED)
    steps = _episode(env)
    infos = [info, *(step[4] for step in steps)]
    if not any("state_key" in i for i in infos):
        warnings.warn('reset/step info has no "state_key": turns are keyed by a hash of their observation '
                      "(gigpo's anchor states)", ContractWarning, stacklevel=2)
        return
    for where, i in (("reset", infos[0]), *((f"step {n}", i) for n, i in enumerate(infos[1:], 1))):
        assert "state_key" in i, f'{where} info has no "state_key" though other infos do: give it in every info'
        key = i["state_key"]
        assert isinstance(key, (str, int, np.integer)) and not isinstance(key, bool), (
            f'{where} info["state_key"] must be a str or an int, got {type(key).__name__}')
    if _free_text(env):
        return
    _, info = env.reset(seed=SEED)
    after = _checked_step(env, GARBAGE_ACTIONS["unknown word"])[4]
    if after.get("invalid_action"):
        assert after["state_key"] == info["state_key"], (
            f'an invalid action changed info["state_key"] ({info["state_key"]!r} -> {after["state_key"]!r}): '
            "the state is the same, so its key must be")


def check_determinism(env: gymnasium.Env) -> None:
    first_reset, second_reset = env.reset(seed=SEED), env.reset(seed=SEED)
    assert data_equivalence(first_reset, second_reset), "two resets with the same seed differ"
    first, second = _episode(env), _episode(env)
    assert data_equivalence(first, second), "the same seed and actions gave different steps"


def check_worker_process(env: gymnasium.Env, env_id: str, kwargs: dict[str, Any]) -> None:
    """The seeded episode played in an env worker process (where roll_agent runs an env that
    declares metadata["thread_safe"] = False, or any env whose spec sets `workers`), after the
    worker's warm-up (the env's `warm_up()`, where it has one), equals the same episode here."""
    actions: list[str] = []
    here = [env.reset(seed=SEED), *_episode(env, actions)]
    spec = EnvSpec(id=env_id, kwargs=dict(kwargs), workers=1)

    async def play() -> list | None:
        workers = EnvWorkers()
        try:
            try:
                await workers.pool(spec).warm(spec)  # its warm_up(), as a run's workers do
                remote = await workers.pool(spec).make(spec)
            except WorkerError as exc:
                if declares_thread_safe(env_id):  # it never needs a worker unless a config asks
                    warnings.warn(f"{env_id} cannot be made in a fresh process ({exc}), so it cannot run with "
                                  "envs[].workers: register it in an importable module and name it "
                                  "'module:Name-v0'", ContractWarning, stacklevel=2)
                    return None
                raise
            return [await remote.areset(seed=SEED), *[await remote.astep(a) for a in actions]]
        finally:
            workers.close()

    there = asyncio.run(play())
    assert there is None or data_equivalence(here, there), (
        "the seeded episode differs when the env runs in a worker process: does it depend on "
        "state set up in this process only, or return values that do not pickle the same?")


CHECKS: list[tuple[str, Callable[[gymnasium.Env], None]]] = [
    ("spaces", check_spaces),
    ("gymnasium env_checker", check_gymnasium),
    ("reset and instructions", check_reset),
    ("string actions", check_valid_actions),
    ("expert action", check_expert_action),
    ("garbage actions are invalid", check_garbage_actions),
    ("invalid action keeps state", check_invalid_keeps_state),
    ("state keys", check_state_keys),
    ("seeded determinism", check_determinism),
]


# -- helpers ------------------------------------------------------------------------------


def _check_obs(env: gymnasium.Env, obs: Any, where: str) -> None:
    assert isinstance(obs, str), f"{where} observation must be a str, got {type(obs)}"
    assert env.observation_space.contains(obs), (
        f"{where} observation is outside observation_space (length or charset): {obs[:80]!r}"
    )


def _checked_step(env: gymnasium.Env, action: str) -> Step:
    """env.step(action), asserting the return types and the info fields every step must have."""
    result = env.step(action)
    assert isinstance(result, tuple) and len(result) == 5, f"step must return 5 values, got {result!r}"
    obs, reward, terminated, truncated, info = result
    where = f"step({action[:40]!r})"
    _check_obs(env, obs, where)
    assert isinstance(reward, numbers.Real) and not isinstance(reward, bool), f"{where} reward {reward!r}"
    for label, flag in (("terminated", terminated), ("truncated", truncated)):
        assert isinstance(flag, (bool, np.bool_)), f"{where} {label} must be a bool, got {flag!r}"
    assert isinstance(info, dict), f"{where} info must be a dict"
    for key, without in OPTIONAL_STEP_KEYS.items():
        if key not in info:
            warnings.warn(f'step info has no "{key}": {without}', ContractWarning, stacklevel=2)
        else:
            assert isinstance(info[key], (bool, np.bool_)), f'{where} info["{key}"] must be a bool, got {info[key]!r}'
    return result


def _probe_action(env: gymnasium.Env, info: dict) -> str:
    """A valid action to try: an admissible one, else the expert's, else a seeded sample."""
    if info.get("admissible_actions"):
        return info["admissible_actions"][0]
    act = expert(env)
    if act is not None:
        return act()
    env.action_space.seed(SEED)
    return env.action_space.sample()


def _episode(env: gymnasium.Env, actions: list[str] | None = None) -> list[Step]:
    """Up to EPISODE_STEPS steps from the seeded reset, cycling through valid actions
    (appended to `actions` when given)."""
    _, info = env.reset(seed=SEED)
    steps = []
    for i in range(EPISODE_STEPS):
        admissible = info.get("admissible_actions")
        action = admissible[i % len(admissible)] if admissible else _probe_action(env, info)
        if actions is not None:
            actions.append(action)
        steps.append(_checked_step(env, action))
        info = steps[-1][4]
        if steps[-1][2] or steps[-1][3]:
            break
    return steps


# -- command line -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_id", help="gymnasium id, e.g. roll_agent/Sokoban-v0 or my_module:MyEnv-v0")
    parser.add_argument("kwargs", nargs="*", metavar="key=value", help="env kwargs (YAML scalars)")
    args = parser.parse_args(argv)
    try:
        kwargs = parse_kwargs(args.kwargs)
    except ValueError as exc:
        parser.error(str(exc))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ContractWarning)
        try:
            for name in iter_checks(args.env_id, **kwargs):
                print(f"PASS  {name}")
        except AssertionError as exc:
            print(f"FAIL  {exc}")
            return 1
    notes = dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, ContractWarning))
    for note in notes:
        print(f"WARN  {note}")
    env = make_env(EnvSpec(id=args.env_id, kwargs=kwargs))
    try:
        print(f"EXTRAS  {', '.join(extras(env)) or 'none'} (roll_agent/env_extras.py)")
    finally:
        env.close()
    print(f"{args.env_id}: all checks passed" + (f" ({len(notes)} warnings)" if notes else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
