"""Every built-in env trains 2 steps end to end; mixed-env runs report per-tag metrics;
a user's own env (examples/custom_env) trains with only a config."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import envs
from roll_agent.metrics import read_rows
from roll_agent.run import train
from tests.conftest import run
from tests.envs.conftest import GAMES_PER_ENV, TEXTWORLD_IDS, TRAINED_TEXTWORLD
from tests.test_run import small_cfg

ROOT = Path(__file__).parent.parent.parent
# one TextWorld variant trains (TRAINED_TEXTWORLD): the others are the same env class over other
# game generators, and each passes check_env (tests/envs/test_check_env.py)
IDS = [env_id for env_id in envs.registered_ids() if env_id not in TEXTWORLD_IDS or env_id == TRAINED_TEXTWORLD]


@pytest.mark.slow
@pytest.mark.parametrize("env_id", IDS)
def test_builtin_env_trains_two_steps(tmp_path, env_id, request):
    if env_id == "roll_agent/SWE-v0":
        pytest.skip("needs a task dataset and its docker images: tests/swe/test_swe_training.py trains it")
    if env_id == "roll_agent/Agent-v0":
        pytest.skip("needs an agent and tasks: tests/agents/test_agent_episodes.py trains it")
    kwargs = ""
    if env_id == TRAINED_TEXTWORLD:  # games generated once for the run (the default would generate one per episode)
        cache = request.getfixturevalue("textworld_games")
        kwargs = f", kwargs: {{cache_dir: '{cache}', num_games: {GAMES_PER_ENV}}}"
    cfg = small_cfg(tmp_path, f"envs=[{{id: '{env_id}'{kwargs}}}]")
    assert run(train(cfg), timeout=300) == 2
    rows = [r for r in read_rows(tmp_path / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2


@pytest.mark.slow
def test_mixed_env_run_reports_per_tag_metrics(tmp_path):
    cfg = small_cfg(
        tmp_path,
        "rollout.num_env_groups=4", "rollout.groups_per_batch=4",
        "envs=[{id: roll_agent/FrozenLake-v0, num_groups: 2}, {id: roll_agent/Sokoban-v0, num_groups: 2}]",
        "eval.num_episodes=2",
    )
    run(train(cfg), timeout=300)
    rows = read_rows(tmp_path / "metrics.jsonl")
    train_rows = [r for r in rows if "loss" in r]
    for key in ("reward_mean/FrozenLake-v0", "success_rate/Sokoban-v0", "episode_len_mean/FrozenLake-v0"):
        assert all(key in r for r in train_rows), key
    evals = [r for r in rows if "eval_success_rate" in r]
    assert all("eval_success_rate/Sokoban-v0" in r for r in evals)


@pytest.mark.slow
def test_custom_env_example_trains_from_its_config(tmp_path):
    from tests.test_run import SMALL

    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'examples' / 'custom_env'}{os.pathsep}{ROOT}"}
    cmd = [sys.executable, "-m", "roll_agent.run", "--config", "examples/custom_env/config.yaml",
           *SMALL, f"output_dir={tmp_path}", "max_steps=2", "warmup.sft_steps=1"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    rows = read_rows(tmp_path / "metrics.jsonl")
    assert [r["version"] for r in rows if "loss" in r] == [1, 2]
    assert any(r.get("eval_success_rate") is not None for r in rows)
