"""The default run (configs/default.yaml, what `python -m roll_agent.run` does) learns."""

import pytest

from roll_agent.config_loader import load_config
from roll_agent.metrics import read_rows
from roll_agent.run import train
from tests.conftest import run

QUIET = ["logging.progress=false", "logging.backends=[jsonl]", "logging.plot=false"]


def _evals(out) -> dict[int, float]:
    return {r["step"]: r["eval_success_rate"] for r in read_rows(out / "metrics.jsonl") if "eval_success_rate" in r}


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the runs' own bounds: 120 + 1200 s
def test_the_default_run_learns(tmp_path):
    """Greedy eval success on the 64 held-out maps rises >= 50 points over the untrained model,
    on the local runtime as a user runs it, and RL does not undo the warm-start. The untrained
    model is the default run's own (same seed, same tiny model) evaluated before any training.
    The default run's whole warm-start plays (300 steps), then 10 of its 40 RL steps with evals
    at 0, 5 and 10: its RL gains come in its first 10 steps (docs/performance.md). Async runs
    are not deterministic and a run can dip for a step, so RL is held to not losing more than
    10 points. (runtime.type=ray runs the same controller: tests/runtime/test_ray_runtime.py.)"""
    untrained = tmp_path / "untrained"
    cfg = load_config(None, [f"output_dir={untrained}", "warmup.sft_steps=0", "max_steps=0", *QUIET])
    assert run(train(cfg), timeout=120) == 0
    before = _evals(untrained)[0]

    cfg = load_config(None, [f"output_dir={tmp_path / 'default'}", "max_steps=10", "eval.every=5", *QUIET])
    assert cfg.runtime.type == "local" and cfg.algorithm.advantage == "gigpo"
    assert run(train(cfg), timeout=1200) == 10
    evals = _evals(tmp_path / "default")
    assert evals[10] - before >= 0.5, (before, evals)
    assert min(evals[5], evals[10]) >= evals[0] - 0.1, evals  # RL kept what the warm-start taught
