"""The SWE env: tool-call parsing, the file editor, and whole episodes in docker sandboxes."""

from __future__ import annotations

import dataclasses
import json

import gymnasium
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs  # noqa: F401  registers roll_agent/SWE-v0
from envs.swe.env import SWEEpisodeError
from envs.swe.instance import write_jsonl
from envs.swe.tools import (MAX_ACTION_CHARS, ToolCall, ToolCallError, Tools, ToolsConfig, parse_action,
                            truncate)
from roll_agent.check_env import check_text_env
from sandboxes import make_sandbox


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


FIX = call("str_replace_editor", command="str_replace", path="calc/__init__.py",
           old_str="    return x + b\n", new_str="    return x * b\n")
WRONG = call("str_replace_editor", command="str_replace", path="calc/__init__.py",
             old_str="    return a + b\n", new_str="    return a - b\n")
SUBMIT = call("submit")


# -- parsing --------------------------------------------------------------------------------


def test_tool_calls_in_the_chat_template_convention():
    assert parse_action("I will look.\n" + call("bash", command="ls -la")) == ToolCall("bash", {"command": "ls -la"})
    # arguments JSON-encoded a second time (some templates do), "parameters" as the key
    assert parse_action('<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>'
                        ).arguments == {"command": "pwd"}
    assert parse_action('<tool_call>{"name": "submit", "parameters": {}}</tool_call>').name == "submit"
    two = parse_action(call("bash", command="a") + call("bash", command="b"))
    assert two.arguments == {"command": "a"} and "only the first of 2" in two.note


def test_fenced_command_fallback():
    assert parse_action("Let me run\n```bash\ngrep -n mul calc/*.py\n```\n") == ToolCall(
        "bash", {"command": "grep -n mul calc/*.py"})
    assert parse_action("```\nls\n```").arguments == {"command": "ls"}
    with pytest.raises(ToolCallError, match="no tool call"):
        parse_action("```python\nprint(1)\n```")


@pytest.mark.parametrize(("text", "message"), [
    ("", "no tool call"),
    ("zzz", "no tool call"),
    ("<tool_call>{", "unterminated"),
    ("<tool_call>{'name': 'bash'}</tool_call>", "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "JSON object"),
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown tool 'rm_rf'"),
    ('<tool_call>{"name": "bash", "arguments": {}}</tool_call>', "needs argument"),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls", "sudo": true}}</tool_call>', "no argument"),
    ('<tool_call>{"name": "bash", "arguments": 7}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "str_replace_editor", "arguments": {"command": "delete", "path": "a"}}</tool_call>',
     "must be one of"),
    ('<tool_call>{"name": "bash", "arguments": {"command": "\\ud800"}}</tool_call>', "lone surrogate"),
    ('<tool_call>{"name": "bash", "arguments": {"command": null}}</tool_call>', "must be a string"),
    ("<tool_call>" + "{" * 5000 + "}" * 5000 + "</tool_call>", "JSON"),
    ("x" * (MAX_ACTION_CHARS + 1), "too long"),
])
def test_malformed_calls_are_errors_for_the_model(text, message):
    with pytest.raises(ToolCallError, match=message):
        parse_action(text)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text().map(lambda t: "<tool_call>" + t),
                 st.text().map(lambda t: '<tool_call>{"name": "bash", "arguments": {"command": ' + t),
                 st.text().map(lambda t: "```bash\n" + t)))
def test_any_text_parses_or_is_a_tool_call_error(text):
    try:
        parsed = parse_action(text)
    except ToolCallError as exc:
        assert str(exc)
    else:
        assert parsed.name in ("bash", "str_replace_editor", "submit")


def test_truncation_keeps_head_and_tail():
    text = "".join(f"line {i}\n" for i in range(10_000))
    cut = truncate(text, 1000)
    assert len(cut) < 1200 and cut.startswith("line 0\n") and cut.endswith("line 9999\n")
    assert "characters truncated" in cut
    assert truncate("short", 1000) == "short"


# -- editor and bash on a real (local) sandbox ----------------------------------------------


@pytest.fixture
def tools(tmp_path):
    with make_sandbox("local", unsafe=True, workdir=str(tmp_path)) as sb:
        yield Tools(sb, str(tmp_path), ToolsConfig(max_output_chars=600, max_view_lines=5))


def edit(tools, **arguments) -> str:
    return tools.run(ToolCall("str_replace_editor", arguments))


def test_editor_create_view_replace_insert(tools, tmp_path):
    assert "File created" in edit(tools, command="create", path="pkg/m.py", file_text="a = 1\nb = 2\na = 1\n")
    assert (tmp_path / "pkg/m.py").read_text() == "a = 1\nb = 2\na = 1\n"
    view = edit(tools, command="view", path="pkg/m.py", view_range=[2, -1])
    assert "     2\tb = 2\n     3\ta = 1" in view and "lines 2-3 of 3" in view
    ambiguous = edit(tools, command="str_replace", path="pkg/m.py", old_str="a = 1", new_str="a = 3")
    assert ambiguous.startswith("Error:") and "occurs 2 times" in ambiguous and "lines 1, 3" in ambiguous
    missing = edit(tools, command="str_replace", path="pkg/m.py", old_str="c = 1", new_str="")
    assert "was not found" in missing
    assert (tmp_path / "pkg/m.py").read_text() == "a = 1\nb = 2\na = 1\n"  # failed edits change nothing
    out = edit(tools, command="str_replace", path="pkg/m.py", old_str="b = 2", new_str="b = 20")
    assert "     2\tb = 20" in out
    edit(tools, command="insert", path="pkg/m.py", insert_line=0, new_str="# top")
    edit(tools, command="insert", path="pkg/m.py", insert_line=4, new_str="z = 9\n")
    assert (tmp_path / "pkg/m.py").read_text() == "# top\na = 1\nb = 20\na = 1\nz = 9\n"
    assert "insert_line must be" in edit(tools, command="insert", path="pkg/m.py", insert_line=9, new_str="x")
    assert "view_range must be" in edit(tools, command="view", path="pkg/m.py", view_range=[1])
    assert "new_str as a string" in edit(tools, command="str_replace", path="pkg/m.py", old_str="z", new_str=None)
    assert "not an existing file" in edit(tools, command="view", path="nope.py")
    assert "pkg/m.py" in edit(tools, command="view", path=".")


def test_long_files_and_outputs_are_cut(tools, tmp_path):
    (tmp_path / "long.txt").write_text("".join(f"{i}\n" for i in range(1, 101)))
    view = edit(tools, command="view", path="long.txt")
    assert "lines 1-5 of 100" in view and "lines 6-100 not shown" in view
    out = tools.run(ToolCall("bash", {"command": "seq 1 5000"}))
    assert out.startswith("1\n2\n") and "characters truncated" in out and out.rstrip().endswith("5000")
    assert "[exit code 3]" in tools.run(ToolCall("bash", {"command": "echo no; exit 3"}))


# -- episodes in docker sandboxes -----------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(swe_instance, tmp_path_factory):
    path = tmp_path_factory.mktemp("swe-env") / "tasks.jsonl"
    write_jsonl(path, [swe_instance.to_dict()])
    return str(path)


def play(env, actions):
    obs, info = env.reset(seed=0)
    steps = []
    for action in actions:
        steps.append(env.step(action))
        if steps[-1][2] or steps[-1][3]:
            break
    return obs, info, steps


@pytest.mark.docker
@pytest.mark.slow
def test_fixing_the_bug_is_rewarded_and_a_wrong_fix_is_not(dataset):
    env = gymnasium.make("roll_agent/SWE-v0", dataset=dataset, disable_env_checker=True)
    try:
        obs, info, steps = play(env, [call("bash", command="grep -n 'return x' calc/__init__.py"), "hmm?",
                                      "<tool_call>{broken", FIX, SUBMIT])
        assert "mul(3, 4) returns 7" in obs and "str_replace_editor" in info["instructions"]
        assert {t["function"]["name"] for t in info["tools"]} == {"bash", "str_replace_editor", "submit"}
        assert "return x + b" in steps[0][0] and not steps[0][4]["invalid_action"]
        assert steps[1][4]["invalid_action"] and steps[2][4]["invalid_action"] and "unterminated" in steps[2][0]
        obs, reward, terminated, truncated, info = steps[-1]
        assert (reward, terminated, truncated, info["success"], info["grade_status"]) == (1.0, True, False, True,
                                                                                          "resolved")
        assert "-    return x + b\n+    return x * b" in info["patch"]
        assert env.unwrapped.status == "submitted"

        *_, (obs, reward, terminated, _, info) = play(env, [FIX, WRONG, SUBMIT])[2]
        assert (reward, info["grade_status"]) == (0.0, "unresolved")
        assert env.unwrapped.last_grade.pass_to_pass["failure"] == ["tests/test_calc.py::test_add"]
    finally:
        env.close()


@pytest.mark.docker
@pytest.mark.slow
def test_turn_limit_submits_new_files_and_partial_credit(dataset):
    env = gymnasium.make("roll_agent/SWE-v0", dataset=dataset, max_steps=3, partial_credit=True,
                         disable_env_checker=True)
    try:
        new_file = call("str_replace_editor", command="create", path="calc/notes.txt", file_text="mul is fixed\n")
        _, _, steps = play(env, [FIX, WRONG, new_file, SUBMIT])
        assert len(steps) == 3
        obs, reward, terminated, truncated, info = steps[-1]
        assert (terminated, truncated, info["end"]) == (False, True, "turn_limit")
        assert "+++ b/calc/notes.txt" in info["patch"] and "new file mode" in info["patch"]
        assert info["grade_status"] == "unresolved" and reward == pytest.approx(3 / 4)  # 3 of 4 tests pass
    finally:
        env.close()


@pytest.mark.docker
@pytest.mark.slow
def test_a_killed_sandbox_ends_the_episode_with_a_status(dataset):
    from sandboxes.build_image import docker_client

    env = gymnasium.make("roll_agent/SWE-v0", dataset=dataset, disable_env_checker=True)
    try:
        env.reset(seed=0)
        assert env.step(FIX)[1] == 0.0
        docker_client().api.kill(env.unwrapped._sandbox.id)
        with pytest.raises(SWEEpisodeError, match="sandbox died") as err:
            env.step(call("bash", command="ls"))
        assert err.value.status == env.unwrapped.status == "sandbox_error"
        with pytest.raises(RuntimeError, match="call reset"):
            env.step(SUBMIT)
        env.reset(seed=0)  # the next episode gets a fresh sandbox
        assert "calc" in env.step(call("bash", command="ls"))[0]
    finally:
        env.close()


@pytest.mark.docker
@pytest.mark.slow
def test_swe_env_passes_the_conformance_checker(dataset):
    checks = check_text_env("roll_agent/SWE-v0", dataset=dataset, max_steps=4, sandbox_options={"pool_size": 2})
    assert checks[-1] == "close twice" and "seeded determinism" in checks


def test_a_missing_dataset_or_task_is_a_clear_error(swe_project, tmp_path):
    with pytest.raises(ValueError, match="needs dataset=PATH"):
        gymnasium.make("roll_agent/SWE-v0", disable_env_checker=True)
    path = tmp_path / "tasks.jsonl"
    write_jsonl(path, [dataclasses.replace(swe_project.instance, image=None).to_dict()])
    with pytest.raises(ValueError, match=r"instance_ids \['nope'\] are not in"):
        gymnasium.make("roll_agent/SWE-v0", dataset=str(path), instance_ids=["nope"], disable_env_checker=True)
    env = gymnasium.make("roll_agent/SWE-v0", dataset=str(path), disable_env_checker=True)
    with pytest.raises(ValueError, match="has no 'image'"):
        env.reset(seed=0)
    env.close()


@pytest.mark.slow
def test_an_episode_in_bwrap_from_a_local_repo(swe_project, swe_bwrap, tmp_path):
    """No docker: the repo is copied into a bwrap sandbox on the base rootfs, then fixed and graded."""
    path = tmp_path / "tasks.jsonl"
    write_jsonl(path, [swe_project.instance.to_dict()])
    env = gymnasium.make("roll_agent/SWE-v0", dataset=str(path), sandbox="bwrap", disable_env_checker=True)
    try:
        _, _, steps = play(env, [call("bash", command="git status --short && ls"), FIX, SUBMIT])
        assert "calc" in steps[0][0]
        assert steps[-1][1] == 1.0 and steps[-1][4]["grade_status"] == "resolved"
    finally:
        env.close()
