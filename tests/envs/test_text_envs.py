"""Behaviour of the built-in text games: FrozenLake, Sokoban and the toy-text adapters."""

from __future__ import annotations

import re

import gymnasium
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs  # noqa: F401  registers the ids
from envs.frozen_lake import FrozenLakeEnv
from envs.sokoban import SokobanEnv, generate_level, push, solve
from envs.text_adapter import ToyTextEnv, parse_action


def play_expert(env: gymnasium.Env, seed: int, max_steps: int = 200) -> tuple[list, dict]:
    """Follow expert_action() from a seeded reset; returns (steps, last info)."""
    env.reset(seed=seed)
    steps = []
    for _ in range(max_steps):
        obs, reward, terminated, truncated, info = env.step(env.unwrapped.expert_action())
        assert not info["invalid_action"]
        steps.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            return steps, info
    raise AssertionError(f"expert did not finish in {max_steps} steps")


# -- action parsing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("left", "left"),
        ("I go LEFT... no wait, Down.", "down"),
        ("<answer>right</answer>", "right"),
        ('<tool_call>{"direction": "up"}</tool_call>', "up"),
        ("leftover downstairs", None),
        ("0", None),
        ("2", None),
        ("", None),
        ("\u017fup", "up"),  # the long s is not a letter for the lookbehind, "up" still whole
    ],
)
def test_parse_action_takes_the_last_whole_word(text, expected):
    assert parse_action(text, ("left", "down", "right", "up")) == expected


def test_parse_action_ignores_unicode_case_folding():
    # With unicode IGNORECASE the Kelvin sign would match "k"; actions stay ASCII words.
    assert parse_action("stic\u212a", ("stick", "hit")) is None


# -- FrozenLake ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [4, 8])
def test_frozen_lake_expert_reaches_goal(size):
    env = gymnasium.make("roll_agent/FrozenLake-v0", size=size)
    for seed in range(20):
        steps, info = play_expert(env, seed)
        assert info["success"] and steps[-1][1] == 1.0 and steps[-1][2]
        assert sum(step[1] for step in steps) == 1.0
        assert "You reached the goal!" in steps[-1][0]


def test_frozen_lake_hole_ends_episode_without_success():
    env = FrozenLakeEnv()
    for seed in range(50):
        env.reset(seed=seed)
        hole_word = next((w for w in env.actions if env._neighbour(env.position, w) == "hole"), None)
        if hole_word:
            obs, reward, terminated, truncated, info = env.step(hole_word)
            assert terminated and not truncated and reward == 0.0
            assert not info["success"] and not info["invalid_action"]
            assert "You fell into a hole." in obs
            return
    pytest.fail("no seed starts next to a hole")


def test_frozen_lake_observation_has_grid_and_short_description():
    env = FrozenLakeEnv(size=4)
    obs, info = env.reset(seed=7)
    *grid, description = obs.split("\n")
    assert grid == ["".join("P" if (r, c) == (0, 0) else t.replace("S", "F") for c, t in enumerate(row))
                    for r, row in enumerate(env.desc)]
    assert "".join(grid).count("P") == 1 and grid[-1].endswith("G")
    kinds = "(wall|frozen|hole|goal)"
    assert re.fullmatch(rf"left: {kinds}, down: {kinds}, right: {kinds}, up: {kinds}\. goal: 3 down, 3 right\.",
                        description)
    assert description.startswith("left: wall") and description.count("up: wall") == 1
    assert len(description.split()) < 40
    assert "left, down, right or up" in info["instructions"]


def test_frozen_lake_invalid_action_keeps_state():
    env = FrozenLakeEnv(invalid_action_penalty=-0.5)
    obs, _ = env.reset(seed=3)
    expert = env.expert_action()
    for garbage in ["jump", "1", "", "LEFTRIGHT"]:
        new_obs, reward, terminated, truncated, info = env.step(garbage)
        assert info["invalid_action"] and not info["success"]
        assert reward == -0.5 and not terminated and not truncated
        assert new_obs.startswith("Invalid action. Answer with one word: left, down, right or up.")
        assert new_obs.endswith(obs)
    assert env.position == (0, 0) and env.expert_action() == expert


def test_frozen_lake_maps_are_per_seed_and_deterministic():
    a, b = FrozenLakeEnv(), FrozenLakeEnv()
    assert a.reset(seed=11) == b.reset(seed=11)
    assert a.step("down") == b.step("down")
    maps = {tuple(a.reset(seed=seed)[0].split("\n")[:4]) for seed in range(20)}
    assert len(maps) > 10


def test_frozen_lake_max_steps_truncates():
    env = FrozenLakeEnv(max_steps=2)
    env.reset(seed=0)
    assert env.step("up")[3] is False  # into the wall: valid, nothing happens
    assert env.step("nonsense")[3] is True


def test_frozen_lake_slippery_mentions_it_and_still_plays():
    env = FrozenLakeEnv(is_slippery=True, max_steps=50)
    _, info = env.reset(seed=0)
    assert "slippery" in info["instructions"]
    steps, _ = play_expert(env, seed=0, max_steps=50)
    assert steps[-1][2] or steps[-1][3]


# -- Sokoban ------------------------------------------------------------------------------


@pytest.mark.parametrize(("num_boxes", "seeds"), [(1, range(20)), (2, range(10))])
def test_sokoban_expert_solves_generated_levels(num_boxes, seeds):
    env = gymnasium.make("roll_agent/Sokoban-v0", dim=6, num_boxes=num_boxes)
    for seed in seeds:
        steps, info = play_expert(env, seed)
        assert info["success"] and steps[-1][2] and not steps[-1][3]
        assert steps[-1][1] >= 1.0
        assert f"Boxes on targets: {num_boxes} of {num_boxes}." in steps[-1][0]


def test_sokoban_levels_are_deterministic_per_seed():
    a, b = SokobanEnv(), SokobanEnv()
    assert a.reset(seed=5) == b.reset(seed=5)
    assert a.step("left") == b.step("left")
    assert len({a.reset(seed=seed)[0] for seed in range(10)}) == 10


def test_sokoban_rendering_and_shaping():
    env = SokobanEnv(num_boxes=2, box_on_target_reward=0.0)
    obs, info = env.reset(seed=1)
    grid = obs.split("\n")[:6]
    assert all(len(row) == 6 for row in grid) and set(grid[0]) == {"#"}
    cells = "".join(grid)
    assert cells.count("P") + cells.count("S") == 1
    assert cells.count("X") + cells.count("*") == 2
    assert cells.count("O") + cells.count("*") + cells.count("S") == 2
    steps, _ = play_expert(env, seed=1)
    assert [step[1] for step in steps][-1] == 1.0 and sum(step[1] for step in steps) == 1.0


def test_sokoban_expert_replans_after_a_detour():
    env = SokobanEnv()
    rng = np.random.default_rng(0)
    solved = 0
    for seed in range(10):
        env.reset(seed=seed)
        for _ in range(3):
            env.step(str(rng.choice(env.actions)))
        if solve(env.level.floor, env.level.targets, env.state) is None:
            continue  # the detour dead-locked a box
        while not env.step(env.expert_action())[2]:
            pass
        solved += 1
    assert solved >= 5


def test_generated_levels_replay_to_solution():
    level = generate_level(7, 2, np.random.default_rng(3))
    state = level.start
    for expected, move in level.plan:
        assert state == expected
        state = push(level.floor, state, move)
    assert state[1] == level.targets


# -- toy-text adapters --------------------------------------------------------------------


def test_taxi_expert_delivers():
    env = gymnasium.make("roll_agent/Taxi-v0")
    for seed in range(10):
        steps, info = play_expert(env, seed)
        assert info["success"] and steps[-1][1] == 20.0 and len(steps) < 30
        assert "Passenger: delivered at" in steps[-1][0]


def test_cliff_walking_expert_takes_the_safe_shortest_path():
    env = gymnasium.make("roll_agent/CliffWalking-v0")
    steps, info = play_expert(env, seed=0)
    assert info["success"] and len(steps) == 13
    assert all(step[1] == -1.0 for step in steps)


def test_blackjack_plays_to_termination():
    env = gymnasium.make("roll_agent/Blackjack-v0")
    outcomes = set()
    for seed in range(30):
        steps, info = play_expert(env, seed, max_steps=12)
        outcomes.add(steps[-1][1])
        assert info["success"] == (steps[-1][1] > 0)
        assert "Dealer's cards:" in steps[-1][0]
    assert outcomes == {-1.0, 0.0, 1.0}


def test_toy_text_words_not_digits():
    env = ToyTextEnv("Taxi")
    obs, info = env.reset(seed=0)
    assert info["admissible_actions"] == ["south", "north", "east", "west", "pickup", "dropoff"]
    assert env.step("4")[4]["invalid_action"]
    assert not env.step("Then: PICKUP")[4]["invalid_action"]
    with pytest.raises(ValueError, match="unknown toy-text game"):
        ToyTextEnv("Pong")


# -- arbitrary text never raises ----------------------------------------------------------

ACTION_TEXT = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(["left", "UP", "down", "right", "<tool_call>", "{", "0", " ", "\n", "\u00e9"]))
    .map("".join),
)
GAMES = {"frozen_lake": FrozenLakeEnv(max_steps=5), "sokoban": SokobanEnv(max_steps=5)}


@pytest.mark.parametrize("game", sorted(GAMES))
@settings(max_examples=150, deadline=None)
@given(actions=st.lists(ACTION_TEXT, min_size=1, max_size=4))
def test_arbitrary_text_actions_never_raise(game, actions):
    env = GAMES[game]
    env.reset(seed=len(actions))
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and isinstance(reward, float)
        assert info["invalid_action"] == (parse_action(action, env.actions) is None)
        if terminated or truncated:
            break
