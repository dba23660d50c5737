"""configs/swe.yaml trains: the RL loop on roll_agent/SWE-v0 with docker sandboxes, tools and grading."""

from __future__ import annotations

from pathlib import Path

import pytest

from envs.swe.instance import write_jsonl
from roll_agent.config_loader import load_config
from roll_agent.metrics import read_rows
from roll_agent.run import train
from roll_agent.trajectory_dumps import read_dumps
from tests.conftest import run

CONFIG = Path(__file__).parents[2] / "configs" / "swe.yaml"


@pytest.mark.docker
@pytest.mark.slow
def test_swe_config_trains_two_steps(swe_instance, tmp_path):
    dataset = tmp_path / "tasks.jsonl"
    write_jsonl(dataset, [swe_instance.to_dict()])
    cfg = load_config(str(CONFIG), [f"output_dir={tmp_path / 'run'}", "max_steps=2"])
    assert cfg.envs[0].id == "roll_agent/SWE-v0"
    cfg.envs[0].kwargs["dataset"] = str(dataset)  # the shared fixture task (its image is built offline)
    assert run(train(cfg), timeout=300) == 2
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in rows if "loss" in r]
    assert [r["version"] for r in steps] == [1, 2]
    assert sum(r["episodes_finished"] + r["episodes_truncated"] for r in steps) >= 4
    assert sum(r["episodes_env_error"] for r in steps) == 0  # sandboxes started, tools ran, grading answered
    for r in steps:
        assert r["episodes"] == 2 and r["episode_len_mean"] > 0 and r["loss"] == r["loss"]  # not NaN
        assert 0 <= r["invalid_action_rate"] <= 1 and -0.1 * 3 <= r["reward_mean"] <= 1.0
    evals = [r for r in rows if "eval_success_rate" in r]
    assert [r["step"] for r in evals] == [0, 2] and all(r["eval_episodes"] == 2 for r in evals)
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "model").is_dir()
    # the rollout dumps keep each SWE episode's end: its diff (maybe empty), how it was graded
    # and the grading log (the env's episode_report: its timings keep it out of info)
    dumped = read_dumps(tmp_path / "run")
    assert {e["kind"] for e in dumped} == {"train", "eval"}
    graded = [e for e in dumped if "grade_status" in e["info"]]
    assert graded and all("patch" in e["info"] and e["info"]["instance_id"] == swe_instance.instance_id
                          for e in graded)
    for e in graded:  # an empty patch (the tiny model's usual) is not run: an empty log
        log = e["info"]["grade_log"]
        assert (log == "") if e["info"]["grade_status"] == "empty_patch" else log.startswith("$ "), log
