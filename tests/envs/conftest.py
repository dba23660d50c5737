"""Game data the env tests train on, built once per test run (never taken from a warm cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs import BUILTIN_ENVS

REPO = Path(__file__).resolve().parents[2]
TEXTWORLD_IDS = [env_id for env_id, (entry, _) in BUILTIN_ENVS.items() if entry == "envs.textworld_env:TextWorldEnv"]
GAMES_PER_ENV = 2  # the training tests cycle over them (num_games: seed % 2)
# the TextWorld variant that trains 2 steps in tests/envs/test_env_training.py: the variants are
# one env class over different game generators, each checked by check_env (test_check_env.py)
TRAINED_TEXTWORLD = "roll_agent/TWCooking-v0"


@pytest.fixture(scope="session")
def textworld_games(tmp_path_factory, request) -> str:
    """A cache dir with games 0..GAMES_PER_ENV-1 of the trained TextWorld env, generated here
    by the project's own CLI (`python -m envs.textworld_env generate`, ~1-3 s a game), one
    progress line per env."""
    pytest.importorskip("textworld")
    from envs.textworld_env import resolve_settings

    cache = tmp_path_factory.mktemp("tw-games")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(REPO)}  # hash-fixed: generates in-process
    for env_id in [TRAINED_TEXTWORLD]:
        kwargs = BUILTIN_ENVS[env_id][1]
        settings = resolve_settings(kwargs["challenge"], kwargs.get("level"), kwargs.get("settings"))
        start = time.monotonic()
        cmd = [sys.executable, "-m", "envs.textworld_env", "generate", "--challenge", kwargs["challenge"],
               "--seeds", f"0-{GAMES_PER_ENV - 1}", "--cache-dir", str(cache),
               *(f"{key}={json.dumps(value)}" for key, value in settings.items())]
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        with capture.global_and_fixture_disabled():
            print(f"\n[textworld_games] {GAMES_PER_ENV} games of {env_id}: {time.monotonic() - start:.0f}s",
                  end="", flush=True)
    return str(cache)
