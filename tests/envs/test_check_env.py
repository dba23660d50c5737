"""The conformance checker: every registered env passes it, broken envs fail it clearly."""

from __future__ import annotations

import importlib.util
import string

import gymnasium
import pytest
from gymnasium import spaces

from envs import BUILTIN_ENVS, parse_kwargs, registered_ids
from envs.frozen_lake import FrozenLakeEnv
from roll_agent.check_env import ContractWarning, check_text_env, main

ALL_CHECKS = [
    "make",
    "spaces",
    "gymnasium env_checker",
    "reset and instructions",
    "string actions",
    "expert action",
    "garbage actions are invalid",
    "invalid action keeps state",
    "state keys",
    "seeded determinism",
    "in a worker process",
    "close twice",
]


class RaisesOnEmpty(FrozenLakeEnv):
    def step(self, action):
        if action == "":
            raise ValueError("empty action")
        return super().step(action)


class NoInstructions(FrozenLakeEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.instructions = ""


class StepCountInStateKey(FrozenLakeEnv):
    """Keys its states by the step count: the same position after an invalid action is a new key."""

    def _info(self, invalid):
        return {**super()._info(invalid), "state_key": f"{self._render()} after {self._steps} steps"}


class DictStateKey(FrozenLakeEnv):
    def _info(self, invalid):
        return {**super()._info(invalid), "state_key": {"position": self.position}}


class GuessTheLetter(gymnasium.Env):
    """A user's env written for gymnasium alone: text spaces, empty infos, reward 1 for the
    right letter; nothing of roll_agent's optional info keys."""

    def __init__(self):
        charset = string.printable
        self.observation_space = spaces.Text(max_length=200, charset=charset)
        self.action_space = spaces.Text(max_length=10_000, min_length=0, charset=charset)
        self.secret, self.tries = "a", 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret, self.tries = "abcdef"[int(self.np_random.integers(6))], 0
        return "Guess a letter from a to f.", {}

    def step(self, action):
        self.tries += 1
        right = action.strip().lower() == self.secret
        return ("Right!" if right else "No."), float(right), right, self.tries >= 6, {}


# Registered without a namespace so they stay out of registered_ids(); made through the
# `module:Name-v0` form the checker accepts for a user's env.
gymnasium.register(id="RaisesOnEmpty-v0", entry_point=f"{__name__}:RaisesOnEmpty")
gymnasium.register(id="NoInstructions-v0", entry_point=f"{__name__}:NoInstructions")
gymnasium.register(id="StepCountInStateKey-v0", entry_point=f"{__name__}:StepCountInStateKey")
gymnasium.register(id="DictStateKey-v0", entry_point=f"{__name__}:DictStateKey")
gymnasium.register(id="GuessTheLetter-v0", entry_point=f"{__name__}:GuessTheLetter")
gymnasium.register(id="OnlyHere-v0", entry_point=GuessTheLetter)  # a class object: this process only


@pytest.mark.parametrize("env_id", registered_ids())
def test_every_registered_env_passes(env_id):
    if env_id == "roll_agent/Simulated-v0" and importlib.util.find_spec("envs.simulated") is None:
        pytest.skip("envs/simulated.py is not written yet")
    if env_id == "roll_agent/SWE-v0":
        pytest.skip("needs a task dataset and its docker images: checked in tests/swe/test_swe_env.py")
    if env_id == "roll_agent/Agent-v0":
        pytest.skip("needs an agent and tasks; its episodes are an agent's runs: tests/agents/")
    assert check_text_env(env_id) == ALL_CHECKS


def test_every_builtin_is_registered():
    assert set(BUILTIN_ENVS) <= set(registered_ids())
    assert all(env_id.startswith("roll_agent/") for env_id in registered_ids())


def test_kwargs_reach_the_env():
    assert check_text_env("roll_agent/FrozenLake-v0", size=8, is_slippery=True, max_steps=20) == ALL_CHECKS
    assert check_text_env("roll_agent/Sokoban-v0", dim=7, num_boxes=2) == ALL_CHECKS


@pytest.mark.parametrize(
    ("env_name", "message"),
    [
        ("RaisesOnEmpty-v0", r"garbage actions are invalid: raised ValueError: empty action"),
        ("NoInstructions-v0", r'reset and instructions: reset info\["instructions"\] must be a non-empty str when'),
        ("StepCountInStateKey-v0", r'state keys: an invalid action changed info\["state_key"\]'),
        ("DictStateKey-v0", r'state keys: reset info\["state_key"\] must be a str or an int, got dict'),
    ],
)
def test_broken_env_fails_with_a_clear_message(env_name, message):
    with pytest.raises(AssertionError, match=message):
        check_text_env(f"{__name__}:{env_name}")


def test_unknown_id_fails_at_make():
    with pytest.raises(AssertionError, match="make: raised"):
        check_text_env("roll_agent/NoSuchEnv-v0")


def test_parse_kwargs_reads_yaml_scalars():
    assert parse_kwargs(["size=8", "p_frozen=0.5", "is_slippery=true", "max_steps=null", "game=Taxi"]) == {
        "size": 8,
        "p_frozen": 0.5,
        "is_slippery": True,
        "max_steps": None,
        "game": "Taxi",
    }
    with pytest.raises(ValueError, match="expected key=value"):
        parse_kwargs(["size"])


def test_cli_prints_each_check_and_exit_status(capsys):
    assert main(["roll_agent/FrozenLake-v0", "size=5"]) == 0
    out = capsys.readouterr().out
    assert [line.split(maxsplit=1)[1] for line in out.splitlines()[:-2]] == ALL_CHECKS
    assert out.splitlines()[-2] == "EXTRAS  expert_action (roll_agent/env_extras.py)"  # what it has beyond gymnasium
    assert out.splitlines()[-1] == "roll_agent/FrozenLake-v0: all checks passed"
    assert main([f"{__name__}:RaisesOnEmpty-v0"]) == 1
    assert "FAIL  garbage actions are invalid" in capsys.readouterr().out


def test_a_plain_gymnasium_env_passes_with_warnings_for_the_optional_keys(capsys):
    with pytest.warns(ContractWarning) as caught:
        assert check_text_env(f"{__name__}:GuessTheLetter-v0") == ALL_CHECKS
    messages = {str(w.message) for w in caught}
    assert any('no "instructions"' in m for m in messages)
    assert any('no "success": success is taken to be a positive last reward' in m for m in messages)
    assert any('no "invalid_action"' in m for m in messages)
    assert any('no "state_key": turns are keyed by a hash of their observation' in m for m in messages)
    assert main([f"{__name__}:GuessTheLetter-v0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    warned = [line for line in lines if line.startswith("WARN")]
    assert len(warned) == 4 and set(warned) == {f"WARN  {m}" for m in messages}
    assert lines[-2] == "EXTRAS  none (roll_agent/env_extras.py)"
    assert lines[-1] == f"{__name__}:GuessTheLetter-v0: all checks passed (4 warnings)"


def test_an_env_registered_only_in_this_process_passes_with_a_warning_about_workers():
    # a fresh worker process cannot make it; it needs none unless a config sets envs[].workers
    with pytest.warns(ContractWarning) as caught:
        assert check_text_env("OnlyHere-v0") == ALL_CHECKS
    assert any("cannot be made in a fresh process" in str(w.message) for w in caught)
