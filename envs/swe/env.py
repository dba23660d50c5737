"""`roll_agent/SWE-v0`: fix a repository's bug through tools in a sandbox; graded by its tests.

A task is an SWEInstance (SWE-bench schema) from `dataset` (a JSONL file). `reset(seed)`
picks one (seed modulo the number of tasks, or `options={"instance_id": ...}`), starts
a sandbox on the instance's image with the repository at its work dir (/testbed) and
returns the problem statement; `info["instructions"]` is the system prompt with the
tool descriptions, `info["tools"]` their JSON schemas. `step(text)` parses one tool
call (envs.swe.tools) and runs it. The episode ends on `submit` or at `max_steps`
(the work so far is submitted then): the diff against base_commit, new files
included, is graded in a fresh sandbox by `envs.swe.grading.grade` -> reward 1 when
resolved, else 0 (or the share of passing tests with `partial_credit=True`).

A response that is not a tool call is an invalid action (an error observation; the
state is unchanged). A sandbox that dies mid-episode ends the episode: `step` raises
SWEEpisodeError (the rollout records the episode as `env_error`) and `env.status` says
"sandbox_error".
"""

from __future__ import annotations

import json
import logging
import shlex
from typing import Any

import gymnasium

from envs.swe.instance import SWEInstance, load_instances
from envs.swe.tools import (MAX_ACTION_CHARS, TOOL_SCHEMAS, ToolCallError, Tools, ToolsConfig, describe_tools,
                            parse_action, truncate)
from sandboxes import SandboxError

log = logging.getLogger(__name__)
# Any BMP character but surrogates: code and logs are not ASCII. Others become U+FFFD.
CHARSET = "".join(map(chr, range(9, 11))) + "".join(chr(c) for c in range(32, 0x10000)
                                                     if not 0xD800 <= c <= 0xDFFF)
_CHARSET = frozenset(CHARSET)
OBS_MAX_CHARS = 60_000
ACTION_MAX_CHARS = MAX_ACTION_CHARS  # longer responses are refused by the parser anyway
PROBLEM_MAX_CHARS = 20_000
SYSTEM_PROMPT = (
    "You are a software engineer fixing an issue in the repository at {workdir} (your current directory). "
    "Find the cause, edit the source files to fix it, check your fix by running the code or the tests, "
    "then submit. Do not edit the tests.\n"
)
# Bytecode and caches the agent's test runs leave behind are not part of a fix.
_PATCH_FILE = "/tmp/roll_agent_agent.patch"
_DIFF_EXCLUDES = "':(exclude)*.pyc' ':(exclude)**/__pycache__/**' ':(exclude).pytest_cache/**'"


class SWEEpisodeError(RuntimeError):
    """The episode cannot go on (its sandbox died); `status` names why."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def clean(text: str, limit: int = OBS_MAX_CHARS) -> str:
    text = "".join(c if c in _CHARSET else "\ufffd" for c in text.replace("\r\n", "\n").replace("\r", "\n"))
    return truncate(text, limit)


class SWEEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, dataset: str | None = None, instance_ids: list[str] | None = None, sandbox: str = "docker",
                 sandbox_options: dict[str, Any] | None = None, max_steps: int = 20,
                 tools: dict[str, Any] | None = None, partial_credit: bool = False,
                 grade_options: dict[str, Any] | None = None, grade_on_submit: bool = True,
                 invalid_action_penalty: float = 0.0):
        if not dataset:
            raise ValueError("roll_agent/SWE-v0 needs dataset=PATH to a JSONL file of SWE-bench-schema tasks "
                             "(e.g. data/swe_tasks/tasks.jsonl; make one with `python -m roll_agent.swe_tasks make`)")
        if sandbox not in ("docker", "bwrap"):
            raise ValueError(f"sandbox={sandbox!r}: use 'docker' or 'bwrap'")
        instances, malformed = load_instances(dataset, errors="collect")
        if malformed:  # one bad line should not stop a run over the rest
            log.warning("%s: skipping %d malformed task line(s), e.g. %s", dataset, len(malformed), malformed[0].reason)
        self.instances = select_instances(instances, instance_ids, dataset)
        self.sandbox_backend = sandbox
        self.sandbox_options = dict(sandbox_options or {})
        self.max_steps = max_steps
        self.tools_cfg = ToolsConfig(**(tools or {}))
        self.partial_credit = partial_credit
        self.grade_options = dict(grade_options or {})
        self.grade_on_submit = grade_on_submit  # False: the episode only records its patch (graded later)
        self.invalid_action_penalty = invalid_action_penalty  # per unparsable response (teaches the format)
        self.observation_space = gymnasium.spaces.Text(OBS_MAX_CHARS + 1000, charset=CHARSET)
        self.action_space = gymnasium.spaces.Text(ACTION_MAX_CHARS, charset=CHARSET)
        self.instance: SWEInstance | None = None
        self.status = "not_started"  # running | submitted | turn_limit | sandbox_error
        self.last_grade = None  # the GradeResult of the last finished episode
        self.last_episode: dict[str, Any] = {}  # instance_id, patch, end, grade_status of the last episode
        self._sandbox = None
        self._tools: Tools | None = None
        self._steps = 0
        self._expert_applied = False

    # -- episode --------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._release()
        options = options or {}
        if "instance_id" in options:
            self.instance = select_instances(self.instances, [options["instance_id"]], "the dataset")[0]
        else:
            index = seed if seed is not None else int(self.np_random.integers(len(self.instances)))
            self.instance = self.instances[index % len(self.instances)]
        self._steps, self._expert_applied, self.last_grade, self.last_episode = 0, False, None, {}
        self._start_sandbox(self.instance)
        self.status = "running"
        info = {"instructions": SYSTEM_PROMPT.format(workdir=self.instance.workdir) + describe_tools(),
                "tools": TOOL_SCHEMAS, "instance_id": self.instance.instance_id,
                "success": False, "invalid_action": False}
        return clean(f"<issue>\n{self.instance.problem_statement}\n</issue>", PROBLEM_MAX_CHARS), info

    def step(self, action: str):
        if self._tools is None:
            raise RuntimeError("step() before reset() (or after the episode ended): call reset() first")
        self._steps += 1
        try:
            call = parse_action(action)
        except ToolCallError as exc:
            return self._next(f"Error: {exc}", invalid=True)
        try:
            if call.name == "submit":
                return self._finish("submitted")
            return self._next(self._tools.run(call), invalid=False)
        except SandboxError as exc:
            self.status = "sandbox_error"
            self._release()
            raise SWEEpisodeError("sandbox_error", f"the sandbox died: {exc}") from exc

    def _next(self, observation: str, invalid: bool):
        penalty = self.invalid_action_penalty if invalid else 0.0
        if self._steps >= self.max_steps:  # the turn limit submits the work so far
            obs, reward, terminated, truncated, info = self._finish("turn_limit")
            return obs, reward + penalty, terminated, truncated, {**info, "invalid_action": invalid}
        return clean(observation), penalty, False, False, self._info(False, invalid)

    def _finish(self, how: str):
        patch = self.current_patch()
        self._release()
        self.status = how
        self.last_episode = {"instance_id": self.instance.instance_id, "patch": patch, "end": how}
        if not self.grade_on_submit:
            info = {**self._info(False, False), "patch": patch, "end": how}
            return clean(f"Submitted ({how})."), 0.0, how == "submitted", how == "turn_limit", info
        from envs.swe.grading import grade

        result = grade(self.instance, patch, sandbox=self.sandbox_backend, partial_credit=self.partial_credit,
                       **self.grade_options)
        self.last_grade = result
        self.last_episode["grade_status"] = result.status
        info = {**self._info(result.resolved, False), "patch": patch, "grade_status": result.status,
                "grade_reason": result.reason, "end": how}
        obs = f"Submitted ({how}). Grade: {result.status}" + (f" ({result.reason})" if result.reason else "")
        return clean(obs), float(result.reward), how == "submitted", how == "turn_limit", info

    def episode_report(self) -> dict:
        """The last episode's grading log (each grading command, its output, exit code and time) for
        the rollout dumps; not in `info`, whose seeded episodes must repeat exactly."""
        if self.last_grade is None:
            return {}
        return {"grade_log": self.last_grade.log, "grade_duration_s": round(self.last_grade.duration_s, 3)}

    def evaluate(self, result=None) -> tuple[float, dict]:
        """Grade the work in the sandbox now, as a submit would: for an agent that ran its own loop
        in this env's sandbox (roll_agent/Agent-v0 with this env as its task_env); `result` unused."""
        if self._sandbox is None:
            raise RuntimeError("evaluate() before reset() (or after the episode ended): call reset() first")
        try:
            _, reward, _, _, info = self._finish("submitted")
        except SandboxError as exc:
            self.status = "sandbox_error"
            self._release()
            raise SWEEpisodeError("sandbox_error", f"the sandbox died: {exc}") from exc
        return reward, info

    @property
    def sandbox(self):
        """The episode's running sandbox (None between episodes), the repository at `self.instance.workdir`."""
        return self._sandbox

    def _info(self, success: bool, invalid: bool) -> dict:
        return {"success": success, "invalid_action": invalid, "instance_id": self.instance.instance_id,
                "steps": self._steps}

    # -- sandbox --------------------------------------------------------------------------
    def _start_sandbox(self, inst: SWEInstance) -> None:
        from envs.swe.sources import prepare_sandbox

        options = {"timeout": self.tools_cfg.command_timeout_s, "max_output_bytes": 64_000, **self.sandbox_options}
        options["env"] = {"PYTHONDONTWRITEBYTECODE": "1", **options.get("env", {})}
        sandbox = prepare_sandbox(inst, self.sandbox_backend, options)
        self._sandbox, self._tools = sandbox, Tools(sandbox, inst.workdir, self.tools_cfg)

    def current_patch(self) -> str:
        """The agent's change so far against base_commit as a unified diff, new files included."""
        if self._sandbox is None:
            return self.last_episode.get("patch", "")
        base = shlex.quote(self.instance.base_commit or "HEAD")
        # written to a file and read back: exec output is capped, and a patch must come whole
        cmd = (f"git rev-parse -q --verify {base}^{{commit}} >/dev/null || {{ echo 'base commit missing'; exit 3; }}; "
               f"git add -A -- . {_DIFF_EXCLUDES} && git -c core.quotepath=false diff --cached --no-color "
               f"--no-ext-diff --binary {base} > {_PATCH_FILE}")
        r = self._sandbox.exec(cmd, timeout=120, workdir=self.instance.workdir)
        if r.exit_code != 0 or r.timed_out:
            raise SandboxError(f"taking the diff failed (exit {r.exit_code}): {r.output[-500:]}")
        return self._sandbox.read_file(_PATCH_FILE)

    def _release(self) -> None:
        sandbox, self._sandbox, self._tools = self._sandbox, None, None
        if sandbox is not None:
            sandbox.close()

    def close(self) -> None:
        self._release()

    # -- demonstrations -------------------------------------------------------------------
    def expert_action(self) -> str:
        """The gold fix applied with `git apply`, then submit."""
        if self._expert_applied or not self.instance.patch:
            return '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
        self._expert_applied = True
        command = f"git apply - <<'ROLL_AGENT_PATCH'\n{self.instance.patch}ROLL_AGENT_PATCH"
        return f"<tool_call>{json.dumps({'name': 'bash', 'arguments': {'command': command}})}</tool_call>"


def select_instances(instances: list[SWEInstance], ids: list[str] | None, where: Any) -> list[SWEInstance]:
    if not instances:
        raise ValueError(f"no tasks in {where}")
    if not ids:
        return list(instances)
    by_id = {i.instance_id: i for i in instances}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ValueError(f"instance_ids {missing} are not in {where} (it has e.g. {sorted(by_id)[:5]})")
    return [by_id[i] for i in ids]
