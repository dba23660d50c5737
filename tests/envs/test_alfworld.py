"""ALFWorld env on the real alfworld engine: the real game in shared/data/alfworld, won by ALFWorld's expert."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import gymnasium
import pytest

if importlib.util.find_spec("alfworld") is None:  # not importorskip: importing alfworld makes dirs
    pytest.skip("alfworld is not installed (pip install -e '.[envs]')", allow_module_level=True)

import envs  # noqa: E402,F401  registers the ids
from envs.alfworld_env import ALFWorldEnv, find_games, generate, scene_tasks  # noqa: E402
from roll_agent.check_env import GARBAGE_ACTIONS, check_text_env  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _data_dir() -> Path | None:
    """$ALFWORLD_DATA if it has games, else the shared/ beside the repo (how CI lays it out)."""
    for candidate in (os.environ.get("ALFWORLD_DATA"), REPO.parent / "shared" / "data" / "alfworld"):
        if candidate and list(Path(candidate).glob("json_2.1.1/valid_unseen/*/*/game.tw-pddl")):
            return Path(candidate)
    return None


DATA = _data_dir()
pytestmark = pytest.mark.skipif(DATA is None, reason="no ALFWorld data (set ALFWORLD_DATA)")
REAL_TASK = "pick_heat_then_place_in_recep-Potato-None-SinkBasin-14"


def play_expert(env: ALFWorldEnv, seed: int, max_steps: int = 80) -> tuple[list[float], dict]:
    env.reset(seed=seed)
    rewards = []
    for _ in range(max_steps):
        _, reward, terminated, truncated, info = env.step(f"Next: {env.expert_action()}")
        assert not info["invalid_action"]
        rewards.append(reward)
        if terminated or truncated:
            return rewards, info
    raise AssertionError(f"expert did not finish in {max_steps} steps")


@pytest.fixture(scope="module")
def env():
    env = ALFWorldEnv(data_dir=str(DATA))
    yield env
    env.close()


def test_finds_the_real_game():
    games = find_games(DATA, "valid_unseen", ["pick_heat_then_place_in_recep"])
    assert [g.parent.parent.name for g in games] == [REAL_TASK]
    assert find_games(DATA, "valid_unseen", ["pick_two_obj_and_place"]) == []
    assert find_games(DATA, "train", ["pick_heat_then_place_in_recep"]) == []


@pytest.mark.slow
def test_handcoded_expert_wins_the_real_game(env):
    obs, info = env.reset(seed=0)
    assert "heat some potato and put it in sinkbasin" in info["instructions"]
    assert "go to microwave 1" in info["admissible_actions"] and "Available actions:" in obs
    rewards, info = play_expert(env, seed=0)
    assert info["success"] is True and rewards[-1] == 1.0 and sum(rewards) == 1.0


@pytest.mark.slow
def test_planner_expert_wins_the_real_game():
    env = ALFWorldEnv(data_dir=str(DATA), expert="planner")
    rewards, info = play_expert(env, seed=5)
    assert info["success"] and rewards[-1] == 1.0 and len(rewards) < 16  # the planner knows where things are
    env.close()


@pytest.mark.slow
def test_garbage_is_invalid_and_keeps_state(env):
    obs, info = env.reset(seed=0)
    for garbage in [*GARBAGE_ACTIONS.values(), "go to cabinet 9", "take potato 1 from countertop 2"]:
        after, reward, terminated, truncated, step_info = env.step(garbage)
        assert step_info["invalid_action"] and not terminated and not truncated and reward == 0.0
        assert obs in after and step_info["admissible_actions"] == info["admissible_actions"]
    # Case and spacing are free; the command still reaches the engine.
    after, _, _, _, step_info = env.step("GO TO   Fridge 1")
    assert not step_info["invalid_action"] and after.startswith("You arrive at fridge 1.")


@pytest.mark.slow
def test_seeded_resets_are_deterministic(env):
    first = env.reset(seed=3)
    steps = [env.step(a)[:3] for a in ("go to countertop 2", "go to fridge 1", "open fridge 1")]
    assert env.reset(seed=3) == first
    assert [env.step(a)[:3] for a in ("go to countertop 2", "go to fridge 1", "open fridge 1")] == steps


def test_bad_arguments_fail_clearly(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no solvable ALFWorld games"):
        ALFWorldEnv(data_dir=str(tmp_path))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
        ALFWorldEnv()
    with pytest.raises(ValueError, match="split"):
        ALFWorldEnv(data_dir=str(DATA), split="test")
    with pytest.raises(ValueError, match="expert"):
        ALFWorldEnv(data_dir=str(DATA), expert="oracle")
    with pytest.raises(ValueError, match="task types"):
        ALFWorldEnv(data_dir=str(DATA), task_types=[9])


def test_data_dir_from_the_environment(monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(DATA))
    env = gymnasium.make("roll_agent/ALFWorld-v0")
    assert env.unwrapped.data_dir == DATA and len(env.unwrapped.games) >= 1
    env.close()


@pytest.mark.slow
def test_close_releases_everything(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = ALFWorldEnv(data_dir=str(DATA), task_types=[4])
    env.reset(seed=0)
    env.step("look")
    env.close()
    env.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="after close"):
        env.reset(seed=0)


def test_scene_tasks_of_the_real_scene():
    problem = next(DATA.glob("json_2.1.1/valid_unseen/*/*/initial_state.pddl")).read_text()
    tasks = scene_tasks(problem)
    own = {"object_target": "Potato", "parent_target": "SinkBasin", "toggle_target": "", "mrecep_target": "",
           "object_sliced": False}
    assert {"task_type": "pick_heat_then_place_in_recep", "pddl_params": own} in tasks
    # A kitchen without lamps has no look-at-in-light task; two potatoes allow a pick-two one.
    assert not any(t["task_type"] == "look_at_obj_in_light" for t in tasks)
    assert any(t["task_type"] == "pick_two_obj_and_place" and t["pddl_params"]["object_target"] == "Potato"
               for t in tasks)


@pytest.mark.slow
def test_generated_games_are_won_through_the_env(tmp_path):
    """In a fresh interpreter: textworld's PDDL engine loads and unloads a copy of fast-downward's
    libdownward.so per env, and after many of those in one long process (the whole suite, every
    test module imported) a later load crashed inside it here (a segfault at the same offset of
    libdownward.so, 3 of 3 full runs; never in a process of its own). The env worker processes
    keep training runs out of that."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from tests.envs.test_alfworld import check_generated_games; "
            "check_generated_games(Path(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=500, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def check_generated_games(tmp_path: Path) -> None:
    # Read-only source, as shared/ is: generation only reads it.
    made = generate(DATA, tmp_path / "gen", new_tasks=1, seed=1, log=lambda *_: None)
    assert len(made) == 2 and not list((tmp_path / "gen").glob("**/.*"))
    for game in made:
        data = json.loads(game.read_text())
        assert data["solvable"] is True and data["walkthrough"]
        assert (game.parent / "traj_data.json").is_file() and (game.parent / "initial_state.pddl").is_file()
    assert (tmp_path / "gen" / "logic" / "alfred.twl2").is_file()
    env = ALFWorldEnv(data_dir=str(tmp_path / "gen"))
    assert sorted(env.games) == sorted(made)
    names = set()
    for seed in range(len(env.games)):
        rewards, info = play_expert(env, seed=seed, max_steps=150)
        assert info["success"] and rewards[-1] == 1.0
        names.add(env.game.parent.parent.name)
    assert REAL_TASK in names and len(names) == 2
    env.close()


@pytest.mark.slow
def test_generate_command(tmp_path):
    import subprocess
    import sys

    src = tmp_path / "src"
    shutil.copytree(DATA, src)  # without logic/: the wheel's copy of the domain is used
    shutil.rmtree(src / "logic")
    # the command as a user runs it, in its own interpreter (see test_generated_games_are_won_through_the_env)
    done = subprocess.run([sys.executable, "-m", "envs.alfworld_env", "generate", "--data-dir", str(src), "--out",
                           str(tmp_path / "out"), "--new-tasks", "0"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith(f"1 games written under {tmp_path / 'out'}")
    assert check_text_env("roll_agent/ALFWorld-v0", data_dir=str(tmp_path / "out"))
