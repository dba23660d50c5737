"""benchmarks/env_workers.py runs end to end at a tiny size and both arms play the same games."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_env_workers_benchmark_runs_and_both_arms_play_the_same_games(tmp_path):
    pytest.importorskip("textworld")
    env = {**os.environ, "PYTHONPATH": str(REPO), "ROLL_AGENT_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "benchmarks/env_workers.py", "--families", "textworld", "--envs", "3",
                           "--steps", "2", "--rounds", "2"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    result = dict(kv.split("=") for kv in done.stdout.splitlines()[-1].split()[1:])
    assert result["textworld_threads_crashed"] == "0" and result["textworld_same_transcripts"] == "1", done.stdout
    assert float(result["textworld_steps_ratio"]) > 0
