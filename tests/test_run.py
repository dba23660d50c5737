"""The whole system end to end: `python -m roll_agent.run` on small settings."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from roll_agent.checkpoint import Checkpointer
from roll_agent.config_loader import load_config
from roll_agent.metrics import read_rows
from roll_agent.run import train
from tests.conftest import run

ROOT = Path(__file__).parent.parent
SMALL = [
    "model.tiny.hidden_size=32", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
    "rollout.num_env_groups=2", "rollout.groups_per_batch=2", "rollout.group_size=2",
    "rollout.group_size_redundancy=1", "rollout.max_turns=3", "rollout.max_new_tokens=4",
    "eval.num_episodes=2", "eval.every=0", "logging.progress=false", "logging.backends=[jsonl]",
    "warmup.sft_steps=0",
]


def small_cfg(tmp_path, *extra):
    return load_config(None, SMALL + [f"output_dir={tmp_path}", "max_steps=2", *extra])


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["ppo", "tis", "cispo", "topr"])
def test_each_loss_trains_two_steps(tmp_path, loss):
    cfg = small_cfg(tmp_path, f"algorithm.loss={loss}", "algorithm.kl_coef=0.01", "algorithm.entropy_coef=0.001")
    assert run(train(cfg), timeout=300) == 2
    rows = [r for r in read_rows(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["version"] for r in rows] == [1, 2]
    for r in rows:
        for key in ("reward_mean", "success_rate", "episode_len_mean", "staleness_mean", "staleness_max",
                    "episodes_stale_dropped", "episodes_cancelled", "episodes_env_error", "accounting_ok", "gen_tokens_per_s", "train_tokens_per_s",
                    "time_wait_data_s", "time_train_s", "time_sync_s", "loss", "entropy", "grad_norm",
                    "is_weight_mean", "kl"):
            assert key in r, key
        assert r["grad_norm"] == r["grad_norm"]  # not NaN
    final = [r for r in read_rows(tmp_path / "metrics.jsonl") if "accounting_ok" in r and "loss" not in r]
    assert len(final) == 1 and final[0]["accounting_ok"] and final[0]["episodes_total_started"] > 0
    evals = [r for r in read_rows(tmp_path / "metrics.jsonl") if "eval_success_rate" in r]
    assert [r["step"] for r in evals] == [0, 2]
    assert (tmp_path / "curves.png").stat().st_size > 1000
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "step_000002" / "model")
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("trainer_process", ["true", "false"])
def test_weights_reach_the_engine_after_each_step(tmp_path, trainer_process):
    """After training, the engine serves exactly the trainer's weights (in-process sync), whether the
    trainer runs in a child process (shared memory) or in a thread of this one."""
    cfg = small_cfg(tmp_path, "warmup.sft_steps=2", "warmup.episodes_per_step=2",
                    f"runtime.trainer_process={trainer_process}")
    run(train(cfg), timeout=300)
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "step_000002" / "model")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base_model")
    moved = [not torch.equal(a, b) for a, b in zip(trained.parameters(), base.parameters())]
    assert any(moved), "training must change the weights"
    rows = [r for r in read_rows(tmp_path / "metrics.jsonl") if "sync_bytes" in r]
    assert all(r["sync_bytes"] == sum(p.numel() * 4 for p in trained.parameters()) for r in rows)


def test_trainer_state_round_trips_exactly(tmp_path, tiny_model_dir):
    """Optimizer, RNG and version come back exactly as saved."""
    import random

    from roll_agent.config import AlgorithmConfig, TrainerConfig
    from roll_agent.train.trainer import TorchTrainer
    from roll_agent.types import Group, Trajectory

    def batch():
        trajs = []
        for i in range(4):
            t = Trajectory(group_id=0, reward=float(i % 2))
            t.append([1, 2, 3], generated=False)
            t.append([4 + i, 5], generated=True, logprobs=[-1.0, -1.0], versions=[0, 0])
            trajs.append(t)
        return [Group(0, 0, "x", trajs)]

    a = TorchTrainer(tiny_model_dir, TrainerConfig(), AlgorithmConfig())
    a.step(batch())
    checkpointer = Checkpointer(tmp_path)
    saved = checkpointer.save(1, a, AutoTokenizer.from_pretrained(tiny_model_dir), {"buffer": {"k": 1}})
    after_save = [torch.rand(3), random.random()]
    b = TorchTrainer(tiny_model_dir, TrainerConfig(), AlgorithmConfig(), seed=123)
    assert checkpointer.latest() == saved and checkpointer.load(saved, b) == {"buffer": {"k": 1}}
    assert b.version == 1
    assert torch.equal(torch.rand(3), after_save[0]) and random.random() == after_save[1]
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    for k in sa["state"]:
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(sa["state"][k][name], sb["state"][k][name])
    # the same next step from both gives the same weights
    a.step(batch())
    b.step(batch())
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_stale_drop_warning_names_the_bias_and_the_fix_once_drops_are_many():
    from roll_agent.controller import stale_drop_warning

    assert stale_drop_warning({"episodes_total_started": 50, "episodes_total_stale_dropped": 40}) is None  # too early
    assert stale_drop_warning({"episodes_total_started": 1000, "episodes_total_stale_dropped": 99}) is None
    warning = stale_drop_warning({"episodes_total_started": 1764, "episodes_total_stale_dropped": 208})
    assert warning.startswith("12% of the 1764 episodes")
    assert "rollout.num_env_groups" in warning and "rollout.async_ratio" in warning
    assert stale_drop_warning({}) is None  # a row without the accounting (evaluation rows)


@pytest.mark.parametrize(("override", "named"), [
    ("envs=[{id: roll_agent/FrozenLak-v0}]", "Did you mean 'roll_agent/FrozenLake-v0'?"),
    ("envs=[{id: roll_agent/FrozenLake-v0, kwargs: {sizee: 4}}]", "Did you mean envs[0].kwargs.size?"),
    ("model.path=/nonexistent/checkpoint", "model.path='/nonexistent/checkpoint' is not a directory"),
])
def test_a_misnamed_env_kwarg_or_model_path_exits_2_before_any_work(tmp_path, override, named):
    cmd = [sys.executable, "-m", "roll_agent.run", *SMALL, f"output_dir={tmp_path}", override]
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith("config error: ") and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "base_model").exists()  # nothing was built


@pytest.mark.slow
def test_why_episodes_failed_is_in_the_log_once_and_counted_by_reason_in_the_metrics(tmp_path, caplog):
    """An env that raises on some steps: its error (with where it raised) is logged once for its
    class, and each step's row counts the failed episodes by outcome and reason class."""
    env = "envs=[{id: roll_agent/Simulated-v0, kwargs: {episode_len: 2, fail_prob: 0.3}}]"
    cfg = small_cfg(tmp_path, env, "rollout.num_env_groups=4", "max_steps=3")
    with caplog.at_level("WARNING", logger="roll_agent.controller"):
        assert run(train(cfg), timeout=300) == 3
    key = "episodes_reason/env_error/SimulatedEnvError"
    rows = [r for r in read_rows(tmp_path / "metrics.jsonl") if "loss" in r]
    counts = [r.get(key, 0) for r in rows]
    assert counts[-1] > 0 and counts == sorted(counts)  # cumulative
    assert rows[-1]["episodes_total_env_error"] >= counts[-1]
    said = [r.getMessage() for r in caplog.records if "episodes_reason/env_error/SimulatedEnvError" in r.getMessage()]
    assert len(said) == 1, said
    assert "SimulatedEnvError: simulated failure at step" in said[0] and "simulated.py" in said[0]  # where it raised


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["early", "at_the_batch_timeout"])
def test_a_run_whose_every_episode_fails_says_why_while_it_waits_and_when_it_stops(tmp_path, caplog, stop):
    """By default such a run stops once three episodes of every env of every lane failed with no group
    completed (seconds, not the batch timeouts' 90 minutes); with that off, at the batch timeout."""
    env = "envs=[{id: roll_agent/Simulated-v0, kwargs: {episode_len: 2, fail_prob: 1.0}}]"
    if stop == "early":
        extra = ["watchdog.batch_timeout_s=600"]
        expected = (r"(\d+) episodes failed while the run waited for the batch of version 1, and no group completed: "
                    r"\d+ ended env_error with SimulatedEnvError, the first:\nenv g\d-e\d \([\w-]+, seed \d+\): "
                    r"SimulatedEnvError: simulated failure")
    else:
        extra = ["watchdog.stop_after_failed_episodes=-1", "watchdog.batch_timeout_s=8", "watchdog.max_batch_stalls=1"]
        expected = (r"no batch for version 1 after 1 waits of 8s .* episodes ended env_error with SimulatedEnvError, "
                    r"the first: env g\d-e\d \([\w-]+, seed \d+\): SimulatedEnvError: simulated failure")
    cfg = small_cfg(tmp_path, env, *extra)
    with caplog.at_level("WARNING", logger="roll_agent.controller"), pytest.raises(RuntimeError, match=expected) as e:
        run(train(cfg), timeout=300)
    if stop == "early":
        assert int(e.value.args[0].split()[0]) >= 3 * 2 * 3  # rollout.num_env_groups=2 lanes of 2 + 1 envs
    said = [r.getMessage() for r in caplog.records if "episodes_reason/env_error/SimulatedEnvError" in r.getMessage()]
    assert len(said) == 1 and "simulated.py" in said[0]  # said while waiting (no step ever came), once
