"""Agent mode end to end: a policy plays SWE tasks in docker sandboxes, its predictions are evaluated."""

from __future__ import annotations

import dataclasses
import json

import pytest

from envs.swe.instance import load_predictions, write_jsonl
from roll_agent import swe_eval
from roll_agent.config import Config, RolloutConfig
from roll_agent.proxy.engines.scripted import ScriptedEngine
from roll_agent.proxy.llm_proxy import LLMProxy
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.swe_agent import SWE_ENV_ID, policy_config, rollout_predictions, swe_env_spec
from tests.conftest import run
from tests.swe.test_swe_env import FIX, SUBMIT, call

# the second task's script breaks `add` instead of fixing `mul`: submitted, but unresolved
SCRIPTS = {
    "minicalc__mul-1": [call("bash", command="grep -n 'return' calc/__init__.py"), FIX, SUBMIT],
    "minicalc__mul-2": ["Let me break something.\n```bash\nsed -i 's/return a + b/return a - b/' calc/__init__.py\n```",
                        SUBMIT],
}


@pytest.fixture(scope="module")
def two_tasks(swe_instance, tmp_path_factory):
    path = tmp_path_factory.mktemp("swe-agent") / "tasks.jsonl"
    second = dataclasses.replace(swe_instance, instance_id="minicalc__mul-2",
                                 problem_statement="Second report (task two): mul(2, 5) gives 7.")
    write_jsonl(path, [swe_instance.to_dict(), second.to_dict()])
    return str(path)


def scripted_policy(tokenizer):
    """An engine that plays SCRIPTS: it reads which task and turn it is from the prompt."""
    formatter = ChatFormatter(tokenizer)

    def script(prompt_ids: list[int]) -> list[int]:
        prompt = tokenizer.decode(prompt_ids)
        task = "minicalc__mul-2" if "task two" in prompt else "minicalc__mul-1"
        turn = prompt.count("<|im_start|>assistant") - 1
        return formatter.encode(SCRIPTS[task][turn]) + [formatter.end_of_turn_id]

    return ScriptedEngine(script=script), formatter


@pytest.mark.docker
@pytest.mark.slow
def test_scripted_policy_resolves_one_task_and_not_the_other(two_tasks, tokenizer, tmp_path):
    engine, formatter = scripted_policy(tokenizer)
    rollout = RolloutConfig(max_turns=5, max_new_tokens=512, max_context_tokens=32_768, temperature=1.0)
    spec = swe_env_spec(Config(), two_tasks, "docker", None)
    assert spec.id == SWE_ENV_ID and spec.kwargs["grade_on_submit"] is False

    async def go():
        proxy = LLMProxy([engine])
        try:
            return await rollout_predictions(spec, 2, proxy, formatter, rollout, tmp_path / "predictions.jsonl",
                                             "scripted-policy", workers=2)
        finally:
            await proxy.close()

    path = run(go(), timeout=120)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["instance_id"] for r in rows] == ["minicalc__mul-1", "minicalc__mul-2"]
    assert all(r["model_name_or_path"] == "scripted-policy" and r["end"] == "submitted" for r in rows)
    assert [r["num_turns"] for r in rows] == [3, 2] and all(r["episode_status"] == "finished" for r in rows)
    assert "+    return x * b" in rows[0]["model_patch"] and "+    return a - b" in rows[1]["model_patch"]
    assert set(load_predictions(path)) == {"minicalc__mul-1", "minicalc__mul-2"}  # SWE-bench format

    assert swe_eval.main(["--dataset", two_tasks, "--predictions", str(path), "--workers", "2",
                          "--output-dir", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["resolved_ids"] == ["minicalc__mul-1"] and report["unresolved_ids"] == ["minicalc__mul-2"]


@pytest.mark.docker
@pytest.mark.slow
def test_swe_eval_policy_mode_with_a_checkpoint(two_tasks, tiny_model_dir, tmp_path):
    """`--policy CHECKPOINT`: an untrained model writes no tool calls, so both patches are empty."""
    out = tmp_path / "eval"
    assert swe_eval.main(["--dataset", two_tasks, "--policy", tiny_model_dir, "--workers", "2",
                          "--override", "rollout.max_turns=2", "--override", "rollout.max_new_tokens=8",
                          "--override", "rollout.max_context_tokens=32768",
                          "--output-dir", str(out)]) == 0
    rows = load_predictions(out / "predictions.jsonl")
    assert set(rows) == {"minicalc__mul-1", "minicalc__mul-2"}
    assert all(r["model_name_or_path"] == tiny_model_dir and r["num_turns"] == 2 for r in rows.values())
    report = json.loads((out / "report.json").read_text())
    assert report["empty_patch_ids"] == ["minicalc__mul-1", "minicalc__mul-2"]


def test_policy_argument_forms(tiny_model_dir, tmp_path):
    assert policy_config(tiny_model_dir).model.path == tiny_model_dir
    yaml_path = tmp_path / "p.yaml"
    yaml_path.write_text("engine:\n  type: openai\n  openai:\n    base_url: http://127.0.0.1:1/v1\n")
    cfg = policy_config(str(yaml_path), ["rollout.max_turns=3"])
    assert cfg.engine.type == "openai" and cfg.rollout.max_turns == 3
    assert swe_env_spec(cfg, "d.jsonl", "bwrap", ["a"]).kwargs == {
        "max_steps": 3, "dataset": "d.jsonl", "sandbox": "bwrap", "instance_ids": ["a"], "grade_on_submit": False}
    with pytest.raises(FileNotFoundError, match="no such file"):
        policy_config(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        policy_config(str(tmp_path))


class ScriptedServer:
    """An OpenAI-compatible completions server on 127.0.0.1 that plays SCRIPTS (text only)."""

    def __init__(self, tokenizer):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = tokenizer.decode(body["prompt"])
                task = "minicalc__mul-2" if "task two" in prompt else "minicalc__mul-1"
                action = SCRIPTS[task][prompt.count("<|im_start|>assistant") - 1]
                server.requests += 1
                data = json.dumps({"choices": [{"index": 0, "text": action, "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.docker
@pytest.mark.slow
def test_swe_eval_policy_mode_with_a_served_model(two_tasks, tokenizer, tmp_path):
    """`--policy CONFIG` with engine.type=openai: the model is served elsewhere (here: a stub on 127.0.0.1)."""
    tokenizer.save_pretrained(tmp_path / "tokenizer")  # the chat template and ids the rollout frames with
    server = ScriptedServer(tokenizer)
    config = tmp_path / "served.yaml"
    config.write_text(
        f"model: {{path: {tmp_path / 'tokenizer'}}}\n"
        f"engine: {{type: openai, openai: {{base_url: '{server.url}', model: scripted, api_key_env: ''}}}}\n"
        "rollout: {max_turns: 5, max_new_tokens: 512, max_context_tokens: 32768}\n")
    try:
        assert swe_eval.main(["--dataset", two_tasks, "--policy", str(config), "--workers", "2",
                              "--output-dir", str(tmp_path / "eval")]) == 0
    finally:
        server.close()
    assert server.requests == 5  # 3 turns + 2 turns
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["resolved_ids"] == ["minicalc__mul-1"] and report["unresolved_ids"] == ["minicalc__mul-2"]
