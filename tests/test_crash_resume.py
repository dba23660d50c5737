"""Crash-resume: one run SIGKILLed five times at random moments (start-up, training,
mid-checkpoint); each resume continues from the last checkpoint, no sample is trained
twice, and the run ends at `max_steps` with its episode accounting intact."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from roll_agent.metrics import read_rows

ROOT = Path(__file__).parent.parent
MAX_STEPS = 20  # above what five kills can reach: each kill comes at most ~3 steps after its resume
FAST = [  # real tiny-model training; the scripted engine keeps generation cheap
    "model.tiny.hidden_size=32", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
    "engine.type=scripted", "rollout.num_env_groups=2", "rollout.groups_per_batch=2", "rollout.group_size=2",
    "rollout.group_size_redundancy=1", "rollout.max_turns=3", "rollout.max_new_tokens=4",
    "eval.num_episodes=0", "logging.progress=false", "logging.backends=[jsonl]", "logging.plot=false",
    "warmup.sft_steps=0", f"max_steps={MAX_STEPS}", "checkpoint.every=1", "checkpoint.keep_last=2", "resume=true",
]


def latest_checkpoint(out: Path) -> int | None:
    done = sorted(p for p in (out / "checkpoints").glob("step_*") if (p / "trainer_state.pt").exists())
    return int(done[-1].name.split("_")[1]) if done else None


@pytest.mark.slow
@pytest.mark.timeout(1200)  # five starts of up to 120 s, then a run of up to 300 s
def test_five_sigkills_then_resume_trains_every_sample_once(tmp_path):
    rng = random.Random(1234)
    cmd = [sys.executable, "-m", "roll_agent.run", *FAST, f"output_dir={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    expected_resumes = []
    startup_kill = rng.randrange(5)
    for kill in range(5):
        start_ckpt = latest_checkpoint(tmp_path)
        if start_ckpt is not None:
            expected_resumes.append(start_ckpt)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # a random moment: one kill lands in start-up (a random delay), the others at a random
        # point of the step or checkpoint save after the run's first new checkpoint
        delay = time.time() + (rng.uniform(0.5, 4.0) if kill == startup_kill else 120)
        while time.time() < delay and proc.poll() is None:
            if (latest_checkpoint(tmp_path) or 0) > (start_ckpt or 0):
                # a random moment of the next step or two; on a fast machine steps are short,
                # so the kill never waits past two new checkpoints (the run must not finish)
                until = time.time() + rng.uniform(0.0, 0.5)
                while time.time() < until and (latest_checkpoint(tmp_path) or 0) < (start_ckpt or 0) + 2:
                    time.sleep(0.01)
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"run {kill} ended before its kill: {proc.stderr.read().decode()[-2000:]}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    start_ckpt = latest_checkpoint(tmp_path)
    if start_ckpt is not None:
        expected_resumes.append(start_ckpt)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]

    rows = read_rows(tmp_path / "metrics.jsonl")
    # each start resumed from the newest checkpoint then on disk (a start killed before it logged is missing)
    resumed = iter(expected_resumes)
    logged = [r["resumed_from_step"] for r in rows if "resumed_from_step" in r]
    assert all(step in resumed for step in logged), (logged, expected_resumes)
    assert logged[-1] == expected_resumes[-1] and len(logged) >= 4, (logged, expected_resumes)
    steps = [r for r in rows if "trained_samples" in r]
    assert [r["step"] for r in steps] == list(range(1, MAX_STEPS + 1))  # no step lost or repeated
    trained = [s for r in steps for s in r["trained_samples"]]
    assert trained and len(trained) == len(set(trained)), "a sample was trained twice"
    assert all(r["accounting_ok"] for r in steps)
    final = torch.load(tmp_path / "checkpoints" / f"step_{MAX_STEPS:06d}" / "trainer_state.pt", weights_only=False)
    assert final["version"] == MAX_STEPS


@pytest.mark.slow
def test_resume_with_no_checkpoint_says_it_starts_from_scratch(tmp_path):
    cmd = [sys.executable, "-m", "roll_agent.run", *FAST, "max_steps=1", f"output_dir={tmp_path}"]
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resume=true, but {tmp_path / 'checkpoints'} holds no checkpoint: this run starts from scratch" in done.stderr
