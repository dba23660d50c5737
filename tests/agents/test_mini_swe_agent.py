"""mini-swe-agent (from PyPI, unchanged) plays SWE tasks through the endpoint, its commands in
roll_agent's sandbox for the task, its diff graded by envs.swe.grading, and both tasks train."""

import dataclasses

import pytest

from envs.swe.instance import write_jsonl
from roll_agent.config_loader import load_config
from roll_agent.metrics import read_rows
from roll_agent.run import train
from roll_agent.trajectory_dumps import read_dumps
from tests.agents import mini_swe_script
from tests.conftest import run
from tests.test_run import SMALL

pytest.importorskip("minisweagent")


def mini_cfg(tmp_path, dataset, sandbox: str):
    spec = ("{id: roll_agent/Agent-v0, tag: %s, num_groups: 1, kwargs: {agent: 'roll_agent.agents.mini_swe_agent:solve', "
            "agent_kwargs: {step_limit: 4}, task_env: roll_agent/SWE-v0, timeout_s: 300, task_env_kwargs: "
            "{dataset: '%s', sandbox: %s, instance_ids: [%s]}}}")
    envs = "envs=[%s, %s]" % (spec % ("resolved", dataset, sandbox, "minicalc__mul-1"),
                              spec % ("unresolved", dataset, sandbox, "minicalc__mul-2"))
    return load_config(None, SMALL + [
        f"output_dir={tmp_path / 'run'}", "max_steps=2", "engine.type=scripted",
        "engine.scripted.script=tests.agents.mini_swe_script:answer", "rollout.async_ratio=0",
        "rollout.num_env_groups=2", "rollout.groups_per_batch=2", "rollout.group_size=2",
        "rollout.group_size_redundancy=0", "rollout.max_turns=4", "rollout.max_new_tokens=1024",
        "rollout.max_context_tokens=16384", "model.tiny.max_position_embeddings=16384", "eval.num_episodes=0",
        "model.tiny.corpus_episodes=1", "logging.trajectories.groups=2", envs])


@pytest.mark.slow
@pytest.mark.docker
def test_mini_swe_agent_resolves_one_task_and_not_the_other_and_both_train(tmp_path, swe_instance):
    """In docker sandboxes; the agent's commands reach any backend through the SWE env's sandbox
    (its bwrap path: tests/swe/test_swe_env.py::test_an_episode_in_bwrap_from_a_local_repo)."""
    instance = swe_instance
    dataset = tmp_path / "tasks.jsonl"
    second = dataclasses.replace(instance, instance_id="minicalc__mul-2",
                                 problem_statement=instance.problem_statement + " (second report)")
    write_jsonl(dataset, [instance.to_dict(), second.to_dict()])
    mini_swe_script.GOLD = instance.patch
    assert run(train(mini_cfg(tmp_path, dataset, "docker")), timeout=500) == 2
    rows = [r for r in read_rows(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["version"] for r in rows] == [1, 2]
    for r in rows:
        assert r["episodes_env_error"] == 0 and r["accounting_ok"]
        assert r["reward_mean/resolved"] == 1.0 and r["success_rate/resolved"] == 1.0
        assert r["reward_mean/unresolved"] == 0.0
        assert r["agent_calls_per_episode"] >= 1 and r["train_tokens"] > 0
    # the dumps keep the task env's grade and its grading log (Agent-v0 passes them through)
    dumped = read_dumps(tmp_path / "run")
    assert {e["env_tag"] for e in dumped} == {"resolved", "unresolved"}
    for e in dumped:  # the second task's agent submits no diff: graded empty, nothing run
        resolved = e["env_tag"] == "resolved"
        assert e["info"]["grade_status"] == ("resolved" if resolved else "empty_patch"), e["info"]
        assert e["info"]["grade_log"].startswith("$ ") if resolved else e["info"]["grade_log"] == "", e["info"]
