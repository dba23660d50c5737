"""The plug-in registries (roll_agent/registry.py): a user's engine, trainer, advantage
estimator, loss, tracker, tool parser and sandbox backend, each from tests/plugins.py, used by
config alone; unknown names fail at config time naming the registered ones; every built-in
resolves to code in its own layer."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import httpx
import pytest

from roll_agent.config import ConfigError, EndpointConfig
from roll_agent.config_loader import load_config
from roll_agent.metrics import read_rows
from roll_agent.registry import ADVANTAGES, ENGINES, LOSSES, SANDBOXES, TOOL_PARSERS, TRACKERS, TRAINERS, \
    WEIGHT_SYNCS, Registry, RegistryError
from roll_agent.run import train
from sandboxes import make_sandbox
from tests import plugins
from tests.agents.conftest import answering, session_of, stack_for
from tests.conftest import run
from tests.test_run import SMALL

ROOT = Path(__file__).parents[1]
# where each kind's built-ins live (the layers of tests/test_layering.py)
HOMES = {"engine": ENGINES, "trainer": TRAINERS, "advantage": ADVANTAGES, "loss": LOSSES, "tracker": TRACKERS,
         "tool parser": TOOL_PARSERS, "weight sync": WEIGHT_SYNCS, "sandbox": SANDBOXES}
LAYER = {"engine": "roll_agent.proxy.engines.", "trainer": "roll_agent.train.", "advantage": "roll_agent.train.",
         "loss": "roll_agent.train.", "tracker": "roll_agent.trackers", "tool parser": "roll_agent.agents.",
         "weight sync": "roll_agent.sync.", "sandbox": "sandboxes."}


@pytest.mark.parametrize("kind", HOMES)
def test_every_builtin_names_code_in_its_layer(kind):
    """Read from the source, without importing (vllm and deepspeed may be absent): each built-in's
    module is in its kind's layer and defines the name."""
    for name in HOMES[kind].names():
        module, _, attr = HOMES[kind]._entries[name].partition(":")
        assert module.startswith(LAYER[kind]), (name, module)
        path = ROOT / Path(*module.split(".")).with_suffix(".py")
        body = ast.parse(path.read_text()).body
        for part in attr.split("."):  # Class.method
            found = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part]
            assert found, f"{kind} {name}: {module} defines no {attr}"
            body = found[0].body if isinstance(found[0], ast.ClassDef) else []


def test_builtins_resolve_where_installed():
    for registry in HOMES.values():
        for name in registry.names():
            module = registry._entries[name].partition(":")[0]
            if name in ("vllm", "deepspeed") and importlib.util.find_spec(name) is None:
                continue
            assert callable(registry.get(name)), (registry.kind, name, module)


def test_unknown_names_fail_at_config_time_naming_the_registered_ones(tmp_path):
    cases = {"engine.type=hff": "no engine named 'hff'.*'hf', 'vllm'.*Did you mean 'hf'",
             "trainer.type=torhc": "Did you mean 'torch'",
             "algorithm.advantage=gipgo": "advantage estimator.*'grpo', 'rloo', 'reinforce', 'turn', 'gigpo'",
             "algorithm.loss=tests.plugins:no_such_loss": "tests.plugins.*has no 'no_such_loss'",
             "algorithm.loss=no_such_package.losses:mine": "cannot be imported: No module named 'no_such_package'",
             "logging.backends=[jsonl,tensorbord]": "logging.backends\\[\\]='tensorbord'.*Did you mean 'tensorboard'",
             "endpoint.tool_parser=hermez": "no tool parser named 'hermez'.*'hermes'"}
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_config(None, [override, f"output_dir={tmp_path}"])


def test_the_weight_sync_is_checked_against_the_runtime(tmp_path):
    from roll_agent.sync import weight_sync_type

    assert weight_sync_type(load_config(None, [f"output_dir={tmp_path}"])) == "inprocess"
    ray = ["runtime.type=ray", f"output_dir={tmp_path}"]
    assert weight_sync_type(load_config(None, ray)) == "broadcast"
    assert weight_sync_type(load_config(None, ray + ["model.lora.enabled=true"])) == "object_store"
    with pytest.raises(ConfigError, match="weight_sync.type=broadcast moves weights between processes"):
        weight_sync_type(load_config(None, ["weight_sync.type=broadcast", f"output_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match="no weight sync named 'brodcast'.*Did you mean 'broadcast'"):
        load_config(None, ["weight_sync.type=brodcast"])


def test_a_name_resolves_to_its_entry_or_to_the_module_it_names():
    registry = Registry("widget", {"dumps": "json:dumps"})
    assert registry.get("dumps").__name__ == "dumps" and registry.get("json:loads").__name__ == "loads"
    assert registry.get("roll_agent.sync.inprocess:InProcessSync.from_config").__name__ == "from_config"
    with pytest.raises(RegistryError, match="module 'json' has no 'nope'"):
        registry.get("json:nope")


@pytest.mark.slow
def test_a_run_uses_a_plugin_of_each_kind_named_in_its_config(tmp_path):
    """Engine, trainer, advantage estimator, loss, tracker and weight sync from tests/plugins.py, by config alone
    (the trainer in this process so its calls are counted here)."""
    plugins.CALLS.clear()
    for seen in plugins.SEEN.values():
        seen.clear()
    cfg = load_config(None, SMALL + [
        f"output_dir={tmp_path}", "max_steps=2", "runtime.trainer_process=false",
        "engine.type=tests.plugins:CountingEngine", "trainer.type=tests.plugins:CountingTrainer",
        "algorithm.advantage=tests.plugins:last_turn_sign", "algorithm.loss=tests.plugins:vanilla_pg_loss",
        "algorithm.kl_coef=0.0", "logging.backends=[jsonl,tests.plugins:ListTracker]",
        "weight_sync.type=tests.plugins:counting_sync"])
    assert run(train(cfg), timeout=300) == 2
    calls = plugins.CALLS
    assert calls["engine.generate"] > 0 and calls["trainer.step"] == 2 and calls["advantage"] == 2
    assert calls["loss"] > 0 and calls["tracker.open"] == 1 and calls["tracker.close"] == 1
    assert calls["weight_sync.push"] >= 2  # after each step (and the run's first weights)
    # the estimator saw each batch's episodes (2 groups of 2, their turns) and the tracker every step's row
    assert all(len(turns) == 4 and all(n >= 1 for n in turns) for turns in plugins.SEEN["advantage_turns"])
    tracked = {step: row for step, row in plugins.SEEN["tracker_rows"] if "loss" in row}
    steps = [r for r in read_rows(tmp_path / "metrics.jsonl") if "loss" in r]
    assert sorted(tracked) == [r["step"] for r in steps] == [1, 2]
    assert all(tracked[r["step"]]["loss"] == pytest.approx(r["loss"]) for r in steps)


def test_a_tool_parser_named_in_the_endpoint_config_parses_the_answers(formatter):
    endpoint = EndpointConfig(tool_parser="tests.plugins:shouting_tool_parser")
    stack = stack_for(formatter, answering(formatter, lambda _: "quiet words"), endpoint=endpoint)
    tools = [{"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}]

    async def go():
        async with session_of(stack) as (session, url):
            async with httpx.AsyncClient(timeout=30) as client:
                body = {"messages": [{"role": "user", "content": "x"}], "tools": tools}
                return await client.post(f"{url}/chat/completions", json=body)

    plugins.CALLS.clear()
    answer = run(go())
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "QUIET WORDS"
    assert plugins.CALLS["tool_parser"] >= 1


def test_a_sandbox_backend_named_by_module_runs_commands_with_its_own_options():
    plugins.CALLS.clear()
    with make_sandbox("tests.plugins:EchoSandbox", unsafe=True, prefix="hello") as sb:
        result = sb.exec("echo world", timeout=10)
    assert result.exit_code == 0 and result.output == "hello\nworld\n" and plugins.CALLS["sandbox.exec"] == 1
    with pytest.raises(TypeError, match="unknown tests.plugins:EchoSandbox sandbox option 'prefx'.*'prefix'"):
        make_sandbox("tests.plugins:EchoSandbox", unsafe=True, prefx="hello")
