"""Agent episodes (roll_agent/Agent-v0): a user's agent, unchanged, played as the episodes of
groups and trained; its failures end only its episode."""

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

from roll_agent.config import EnvSpec, RolloutConfig
from roll_agent.types import Status
from tests.agents.conftest import answering, stack_for, train_stack
from tests.conftest import run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai_agent"
sys.path.insert(0, str(EXAMPLE))  # the example agent's module, as PYTHONPATH gives it to a run


def calculator_model(text: str) -> str:
    """Calls the calculator on the question, then answers with the tool's result (wrong for odd
    first operands, so a group's rewards differ)."""
    last_turn = text.rsplit("<|im_start|>", 2)[-2]
    if "<tool_response>" in last_turn:
        result = last_turn.split("<tool_response>\n")[1].split("\n")[0]
        a = int(re.search(r"What is (\d+)", text).group(1))
        return f"The answer is {int(result) + (a % 2)}."
    a, op, b = re.search(r"What is (\d+) (.) (\d+)\?", text).groups()
    return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s %s %s"}}\n</tool_call>' % (a, op, b)


def agent_spec(**kwargs) -> EnvSpec:
    base = {"agent": "agent:solve", "tasks": str(EXAMPLE / "tasks.jsonl"), "reward": "agent:score", "timeout_s": 30}
    return EnvSpec(id="roll_agent/Agent-v0", tag="calc", kwargs={**base, **kwargs})


ROLLOUT = RolloutConfig(async_ratio=1, num_env_groups=2, groups_per_batch=2, group_size=2, group_size_redundancy=1,
                        max_turns=4, max_new_tokens=256, max_context_tokens=4096)


def play(formatter, spec: EnvSpec, steps: int = 2, rollout: RolloutConfig = ROLLOUT):
    return train_stack(stack_for(formatter, answering(formatter, calculator_model), rollout=rollout, specs=[spec]),
                       steps)


def test_the_example_openai_sdk_agent_plays_groups_and_is_scored(formatter):
    stack, consumed = play(formatter, agent_spec())
    episodes = [t for _, batch in consumed for g in batch for t in g.trajectories]
    assert len(episodes) == 8 and all(t.status == Status.FINISHED for t in episodes)
    for t in episodes:
        a = int(re.search(r"What is (\d+)", formatter.tokenizer.decode(t.token_ids)).group(1))
        assert t.reward == (0.0 if a % 2 else 1.0)
        # two calls (tool call, answer), one segment: the tool result extended the first
        assert t.metrics["agent_calls"] == 2 and t.metrics["agent_segments"] == 1 and not t.segments
        assert t.num_turns == 2 and sum(t.loss_mask) > 0
    counts = stack.buffer.ledger.counts
    assert counts["cancelled"] > 0  # the redundant runs were cancelled
    assert stack.stats().accounting()["accounting_ok"]


def test_a_crashing_agent_ends_its_episode_as_env_error_and_the_run_goes_on(formatter, tmp_path):
    module = tmp_path / "flaky_agent.py"
    module.write_text(
        "import agent\n"
        "async def solve(task, client):\n"
        "    if task['id'] % 3 == 0:\n"
        "        raise RuntimeError('the agent fell over on task %d' % task['id'])\n"
        "    if task['id'] % 3 == 1:\n"
        "        return 'I never asked the model'\n"
        "    return await agent.solve(task, client)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        stack, consumed = play(formatter, agent_spec(agent="flaky_agent:solve"), steps=2)
    finally:
        sys.path.remove(str(tmp_path))
    counts = stack.buffer.ledger.counts
    assert counts["env_error"] > 0
    for _, batch in consumed:
        for group in batch:
            assert all(t.status == Status.FINISHED for t in group.trajectories)
    assert stack.stats().accounting()["accounting_ok"]


def test_errors_name_what_to_fix(formatter):
    from roll_agent.agents.task_env import AgentTaskEnv

    with pytest.raises(ValueError, match="exactly one of agent"):
        AgentTaskEnv(tasks=str(EXAMPLE / "tasks.jsonl"))
    with pytest.raises(ValueError, match="exactly one task source"):
        AgentTaskEnv(agent="agent:solve")
    env = AgentTaskEnv(agent="agent:solve", tasks=str(EXAMPLE / "tasks.jsonl"))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="give reward: module:function"):
        env.step("a text answer with no reward function to score it")


@pytest.mark.slow
def test_on_policy_the_trainer_scores_every_trained_token_as_the_sampler_did(tmp_path):
    """hf engine, fp32, async_ratio 0: the trainer's log-probs of the agent's tokens, forks included,
    equal the engine's (a token the model did not see would show as a gap)."""
    from roll_agent.metrics import read_rows
    from roll_agent.run import train
    from tests.test_run import small_cfg

    tasks = str(EXAMPLE / "tasks.jsonl")
    cfg = small_cfg(tmp_path, "rollout.async_ratio=0", "rollout.max_turns=4", "rollout.max_new_tokens=6",
                    "rollout.max_context_tokens=512", "model.tiny.max_position_embeddings=512",
                    f"envs=[{{id: roll_agent/Agent-v0, kwargs: {{agent: 'tests.agents.agents_for_tests:editing_agent', "
                    f"tasks: '{tasks}', timeout_s: 120}}}}]")
    assert run(train(cfg), timeout=400) == 2
    rows = [r for r in read_rows(tmp_path / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["logprob_diff_mean"] <= 1e-5, r["logprob_diff_mean"]
        assert r["agent_segments_per_episode"] == 2.0 and r["agent_fork_share"] > 0
        assert r["staleness_max"] == 0


def test_weight_updates_amid_32_concurrent_agent_sessions_are_invisible_to_the_agents(formatter):
    from roll_agent.config import ScriptedEngineConfig

    rollout = RolloutConfig(async_ratio=1, num_env_groups=8, groups_per_batch=4, group_size=4,
                            group_size_redundancy=0, max_turns=4, max_new_tokens=256, max_context_tokens=4096)
    slow = ScriptedEngineConfig(token_latency_s=0.003)  # each answer takes ~0.1 s: updates land mid-answer
    # the example agent after a random pause (< 0.5 s): episodes out of lockstep, as real agents'
    spec = agent_spec(agent="tests.agents.agents_for_tests:staggered_solve")
    stack, consumed = train_stack(stack_for(formatter, answering(formatter, calculator_model), rollout=rollout,
                                            specs=[spec], engine_cfg=slow, num_engines=2), steps=4, timeout=180)
    assert stack.services.endpoint.stats["errors"] == 0, stack.services.endpoint.error_codes
    counts = stack.buffer.ledger.counts
    assert counts["env_error"] == 0 and stack.stats().accounting()["accounting_ok"]
    switched = 0
    for version, batch in consumed:
        for group in batch:
            assert group.min_version >= version - rollout.async_ratio  # the strict staleness bound
            for t in group.trajectories:
                assert t.status == Status.FINISHED
                answer_versions = [v for v, m in zip(t.versions, t.loss_mask) if m]
                switched += len(set(answer_versions)) > 1
    assert switched > 0  # some episodes' tokens span a weight update
    assert stack.proxy.stats["reissues"] > 0  # answers suspended mid-way were finished after the update


def score_cli(task: dict, result: dict) -> float:
    """The CLI agent's reward: its printed answer mentions the task's answer."""
    return float(str(task["answer"]) in result["stdout"])


@pytest.mark.slow
def test_a_command_line_agent_and_its_faults(formatter, tmp_path):
    """A subprocess agent: a good run is scored from its output; a crash (its stderr recorded), a hang
    past its timeout and a run that never calls the model each end their episode as env_error, and
    no agent process outlives the run."""
    import json
    import subprocess

    modes = ["", "crash", "hang", "silent", "", ""]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": i, "question": f"Say {i}", "answer": i, "mode": m}) + "\n"
                             for i, m in enumerate(modes)))
    spec = EnvSpec(id="roll_agent/Agent-v0", kwargs={
        "command": [sys.executable, str(Path(__file__).parent / "cli_agent.py")], "tasks": str(tasks),
        "reward": "tests.agents.test_agent_episodes:score_cli", "timeout_s": 20})
    rollout = RolloutConfig(async_ratio=1, num_env_groups=2, groups_per_batch=2, group_size=2, group_size_redundancy=1,
                            max_turns=2, max_new_tokens=32, max_context_tokens=1024)
    stack = stack_for(formatter, answering(formatter, lambda text: "I say " + text.split("Say ")[-1].split("<")[0]),
                      rollout=rollout, specs=[spec])

    async def go():
        managers = [stack.env_manager(f"cli-{i}", spec) for i in range(len(modes))]
        try:
            return await asyncio.gather(*(m.run_episode(seed=i) for i, m in enumerate(managers)))
        finally:
            for m in managers:
                await m.close()
            await stack.close()

    episodes = run(go(), timeout=120)
    by_mode = dict(zip(["ok0", "crash", "hang", "silent", "ok4", "ok5"], episodes))
    for name in ("ok0", "ok4", "ok5"):
        assert by_mode[name].status == Status.FINISHED and by_mode[name].reward == 1.0, by_mode[name].error
    assert by_mode["crash"].status == Status.ENV_ERROR
    assert "exited with code 3" in by_mode["crash"].error and "something went wrong" in by_mode["crash"].error
    assert by_mode["hang"].status == Status.ENV_ERROR and "timeout_s=20" in by_mode["hang"].error
    assert by_mode["silent"].status == Status.ENV_ERROR and "no model call" in by_mode["silent"].error
    left = subprocess.run(["pgrep", "-f", "cli_agent.py"], capture_output=True, text=True).stdout.split()
    assert not left, left


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_agent_episodes_train_under_ray(tmp_path, monkeypatch):
    """runtime.type=ray: each env-worker actor serves its own endpoint to the agents it runs, the
    driver one to the evaluation agents."""
    pytest.importorskip("ray")
    from roll_agent.metrics import read_rows
    from roll_agent.run import train
    from tests.runtime.test_ray_runtime import ray_cfg

    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")  # the actors import the agent
    tasks = str(EXAMPLE / "tasks.jsonl")
    cfg = ray_cfg(tmp_path, "max_steps=2", "rollout.max_turns=4", "rollout.max_new_tokens=6",
                  f"envs=[{{id: roll_agent/Agent-v0, kwargs: {{agent: 'tests.agents.agents_for_tests:editing_agent', "
                  f"tasks: '{tasks}', timeout_s: 120}}}}]")
    assert run(train(cfg), timeout=500) == 2
    rows = read_rows(tmp_path / "metrics.jsonl")
    steps = [r for r in rows if "loss" in r]
    assert [r["version"] for r in steps] == [1, 2]
    for r in steps:
        assert r["agent_calls_per_episode"] == 3.0 and r["agent_segments_per_episode"] == 2.0
        assert r["episodes_env_error"] == 0 and r["accounting_ok"]
    evals = [r for r in rows if "eval_success_rate" in r]
    assert evals and all(r["eval_episodes"] > 0 for r in evals)


@pytest.mark.slow
def test_the_example_agent_trains_from_its_config_alone(tmp_path):
    """examples/openai_agent: `python -m roll_agent.run --config ...` with the agent's module on PYTHONPATH."""
    import subprocess

    from roll_agent.metrics import read_rows
    from tests.test_run import SMALL

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{EXAMPLE}{os.pathsep}{root}"}
    cmd = [sys.executable, "-m", "roll_agent.run", "--config", "examples/openai_agent/config.yaml", *SMALL,
           f"output_dir={tmp_path}", "max_steps=2", "rollout.max_new_tokens=8"]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, timeout=400)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    rows = read_rows(tmp_path / "metrics.jsonl")
    steps = [r for r in rows if "loss" in r]
    assert [r["version"] for r in steps] == [1, 2]
    assert all(r["agent_calls_per_episode"] >= 1 and r["episodes_env_error"] == 0 for r in steps)
    assert any(r.get("eval_success_rate") is not None for r in rows)


async def reverse_agent(task: dict, client) -> str:
    """Answers the task env's prompt in one call; the task env's step scores the answer."""
    reply = await client.chat.completions.create(model="m", messages=[
        {"role": "system", "content": task["instructions"]}, {"role": "user", "content": task["prompt"]}])
    return reply.choices[0].message.content


def test_tasks_from_a_gymnasium_env_scored_by_its_step(formatter):
    """task_env: a built-in env's reset gives the task, its step(answer) the reward."""
    def reverse(text: str) -> str:  # the model answers right for odd-length words only
        letters = text.split("Reverse: ")[-1].split("<")[0].split()
        return " ".join(letters[::-1]) if len(letters) % 2 else " ".join(letters)

    spec = EnvSpec(id="roll_agent/Agent-v0", kwargs={"agent": "tests.agents.test_agent_episodes:reverse_agent",
                                                     "task_env": "roll_agent/ReverseLetters-v0", "timeout_s": 30})
    stack, consumed = train_stack(stack_for(formatter, answering(formatter, reverse), rollout=ROLLOUT, specs=[spec]))
    episodes = [t for _, batch in consumed for g in batch for t in g.trajectories]
    assert episodes and all(t.status == Status.FINISHED for t in episodes)
    for t in episodes:
        letters = formatter.tokenizer.decode(t.token_ids[:t.prompt_len]).split("Reverse: ")[-1].split("<")[0].split()
        assert (t.reward == 1.0) == (len(letters) % 2 == 1 or letters == letters[::-1])


def test_a_cancelled_command_agent_is_killed_with_its_children(formatter, tmp_path):
    """A redundant episode cancelled mid-run: its agent process (and what it started) is gone."""
    import subprocess

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": 0}\n')
    script = tmp_path / "stubborn_agent.py"
    script.write_text("import subprocess, sys, time\n"
                      "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)  # stubborn child'])\n"
                      "print('started', flush=True)\ntime.sleep(600)\n")
    spec = EnvSpec(id="roll_agent/Agent-v0", kwargs={"command": [sys.executable, str(script)], "tasks": str(tasks),
                                                     "reward": "tests.agents.test_agent_episodes:score_cli"})
    stack = stack_for(formatter, answering(formatter, lambda _: "x"), specs=[spec])

    def running() -> list[str]:
        return subprocess.run(["pgrep", "-f", "stubborn"], capture_output=True, text=True).stdout.split()

    async def go():
        manager = stack.env_manager("cancel-me", spec)
        episode = asyncio.create_task(manager.run_episode(seed=0))
        for _ in range(200):
            if len(running()) >= 2:  # the agent and its child
                break
            await asyncio.sleep(0.05)
        started = len(running())
        episode.cancel()
        await asyncio.gather(episode, return_exceptions=True)
        await manager.close()
        await stack.close()
        for _ in range(100):
            if not running():
                break
            await asyncio.sleep(0.05)
        return started

    assert run(go(), timeout=60) >= 2
    assert not running()


def test_an_agent_env_in_worker_processes_is_a_config_error():
    from roll_agent.config import ConfigError
    from roll_agent.config_loader import load_config

    with pytest.raises(ConfigError, match="workers is not for roll_agent/Agent-v0"):
        load_config(overrides=["envs=[{id: roll_agent/Agent-v0, workers: 2, kwargs: {agent: 'a:b', tasks: t}}]"])


@pytest.mark.slow
def test_bad_requests_get_json_errors_and_the_run_trains_on(tmp_path, caplog):
    """A live run (real tiny model on the hf engine) whose agent sends, in every episode, token ids
    outside the vocabulary, negative and non-integer ids, an empty prompt, JSON nested 100,000
    deep and a body that is not UTF-8: each gets a JSON 400 naming what is wrong, the next call on
    the same connection is answered, nothing of them is recorded, and the run trains its steps."""
    import json

    from roll_agent.metrics import read_rows
    from roll_agent.run import train
    from tests.agents.agents_for_tests import HOSTILE_REQUESTS
    from tests.test_run import small_cfg

    marks = tmp_path / "answers"
    marks.mkdir()
    tasks = str(EXAMPLE / "tasks.jsonl")
    cfg = small_cfg(tmp_path / "run", "rollout.max_new_tokens=6", "rollout.max_context_tokens=512",
                    "model.tiny.max_position_embeddings=512",
                    f"envs=[{{id: roll_agent/Agent-v0, kwargs: {{agent: 'tests.agents.agents_for_tests:hostile_agent', "
                    f"tasks: '{tasks}', timeout_s: 120, agent_kwargs: {{marker_dir: '{marks}'}}}}}}]")
    assert run(train(cfg), timeout=400) == 2
    rows = [r for r in read_rows(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2 and all(r["episodes_refused"] == 0 for r in rows)
    assert all(r["agent_calls_per_episode"] == 1.0 for r in rows)  # only the good call was recorded
    files = list(marks.glob("task-*.json"))
    assert len(files) >= 4
    # counted in metrics.jsonl (so far, every step), each reason logged once with its session
    assert rows[-1]["agent_http_4xx"] >= len(HOSTILE_REQUESTS) * 4 and rows[-1]["agent_http_5xx"] == 0
    warned = [r.getMessage() for r in caplog.records if r.name == "roll_agent.agents.server" and r.levelname == "WARNING"]
    assert sum("outside this model's vocabulary" in m for m in warned) == 1, warned
    assert all("of session " in m for m in warned), warned
    for f in files:
        answers = json.loads(f.read_text())
        assert answers.pop("good call after them")["status"] == 200
        assert set(answers) == {name for name, _, _ in HOSTILE_REQUESTS}
        for name, answer in answers.items():
            assert answer["status"] == 400 and answer["error"]["message"], (name, answer)
        assert answers["ids above the vocabulary"]["error"]["param"] == "prompt.0"
        assert answers["negative ids"]["error"]["code"] == "invalid_token_id"
        assert "nested too deeply" in answers["nested 100,000 deep"]["error"]["message"]
