"""The scripted engine's replay for mini-swe-agent on the minicalc task (tests/swe/conftest.py):
apply GOLD with git, then submit; a task whose statement says "(second report)" is submitted
untouched. engine.scripted.script = tests.agents.mini_swe_script:answer"""

import json

GOLD = ""  # set by the test: the task's gold patch


def bash(command: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


def answer(prompt: str) -> str:
    submit = bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    if "(second report)" in prompt:
        return "THOUGHT: nothing to change.\n" + submit
    if "<tool_response>" not in prompt:
        return "THOUGHT: apply the fix.\n" + bash("git apply <<'PATCH'\n" + GOLD + "PATCH")
    return "THOUGHT: submit.\n" + submit
