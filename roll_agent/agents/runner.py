"""Run a user's agent for one task against the endpoint.

Two kinds of agent, both unchanged from how they run against OpenAI:

- a function `module:function`, `async def agent(task, client)` (or a plain `def`, run in a
  thread): `client` is an `openai.AsyncOpenAI` (`openai.OpenAI` for a plain function) whose
  `base_url` and `api_key` are the episode's session; it returns a reward (a number) or a
  result that the task's reward function scores. It runs in an agent worker process
  (roll_agent/agents/workers.py) when the endpoint has them, else in this process;
- a command (a list, or a string split like a shell's), run as a subprocess in its own process
  group with `OPENAI_BASE_URL` / `OPENAI_API_KEY` (and `OPENAI_API_BASE` / `ROLL_AGENT_TASK_FILE`)
  set, the task as JSON on stdin and in that file (`{task_file}` in an argument is replaced by
  its path); its result is {returncode, stdout, stderr, task_file}.

Whatever goes wrong (the agent raises, runs past `timeout_s`, exits non-zero) is an AgentError
carrying the tail of its traceback or stderr. A cancelled run (a redundant episode) kills the
subprocess's whole process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import shlex
import signal
import tempfile
import traceback
from dataclasses import dataclass, field
from typing import Any

from roll_agent.registry import load_named

TAIL_CHARS = 4000  # of a failing agent's stderr or traceback, kept in the episode's error


class AgentError(RuntimeError):
    """The agent failed: raised, timed out, or exited non-zero (the message says which, with its tail)."""


@dataclass
class AgentSpec:
    function: str = ""  # module:function
    command: list[str] = field(default_factory=list)
    timeout_s: float = 600.0
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables for a command
    kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments for a function
    local: bool = False  # a function agent runs in this process, never in an agent worker (its task holds a live env)

    def __post_init__(self) -> None:
        if isinstance(self.command, str):
            self.command = shlex.split(self.command)
        if bool(self.function) == bool(self.command):
            raise ValueError("an agent env needs exactly one of agent (module:function) and command")
        if self.function and ":" not in self.function:
            raise ValueError(f"agent={self.function!r}: name the function as module:function")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")

    def load(self):
        return load_named(self.function, "agent")


_ssl_context = None


def _http_client(is_async: bool):
    """An HTTP client of the run's own for its openai client. Not one pool shared by all runs:
    with hundreds of agents at once, each request would scan all the pool's connections (the
    single largest cost of an agent call, profiled). Built on one SSL context for all runs:
    a fresh one loads the CA store (~100 ms a client)."""
    import ssl

    import openai

    global _ssl_context
    _ssl_context = _ssl_context or ssl.create_default_context()
    return (openai.DefaultAsyncHttpxClient if is_async else openai.DefaultHttpxClient)(verify=_ssl_context)


async def run_agent(spec: AgentSpec, task: Any, base_url: str, api_key: str, workers=None) -> Any:
    """`workers`: agent worker processes (roll_agent/agents/workers.py) for a function agent that
    may leave this process (None: it runs here)."""
    if spec.function and workers is not None and not spec.local:
        return await workers.run(spec, task, base_url, api_key)
    if spec.function:
        return await run_function(spec, task, base_url, api_key)
    return await _run_command(spec, task, base_url, api_key)


async def run_function(spec: AgentSpec, task: Any, base_url: str, api_key: str) -> Any:
    import openai

    fn = spec.load()
    is_async = inspect.iscoroutinefunction(fn)
    kind = openai.AsyncOpenAI if is_async else openai.OpenAI
    client = kind(base_url=base_url, api_key=api_key, max_retries=0, timeout=spec.timeout_s,
                  http_client=_http_client(is_async))
    try:
        async with asyncio.timeout(spec.timeout_s):
            if is_async:
                return await fn(task, client, **spec.kwargs)
            return await asyncio.to_thread(fn, task, client, **spec.kwargs)
    except TimeoutError as exc:
        raise AgentError(f"the agent {spec.function} did not finish within timeout_s={spec.timeout_s:.0f}s") from exc
    except Exception as exc:
        tail = "".join(traceback.format_exception(exc))[-TAIL_CHARS:]
        raise AgentError(f"the agent {spec.function} raised {type(exc).__name__}: {exc}\n{tail}") from exc
    finally:
        closing = client.close()  # and its HTTP client
        if inspect.isawaitable(closing):
            await closing


async def _run_command(spec: AgentSpec, task: Any, base_url: str, api_key: str) -> dict:
    if isinstance(task, dict):  # the live task env (for function agents) does not travel as JSON
        task = {k: v for k, v in task.items() if k != "env"}
    payload = json.dumps(task)
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="roll-agent-task-", delete=False) as f:
        f.write(payload)
        task_file = f.name
    env = {**os.environ, **spec.env, "OPENAI_BASE_URL": base_url, "OPENAI_API_BASE": base_url,
           "OPENAI_API_KEY": api_key, "ROLL_AGENT_TASK_FILE": task_file}
    argv = [a.replace("{task_file}", task_file) for a in spec.command]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, cwd=spec.cwd, start_new_session=True)
    except OSError as exc:
        os.unlink(task_file)
        raise AgentError(f"cannot start the agent command {argv}: {exc}") from exc
    try:
        async with asyncio.timeout(spec.timeout_s):
            out, err = await proc.communicate(payload.encode())
    except TimeoutError as exc:
        _kill_group(proc)
        err = await _rest(proc)
        raise AgentError(f"the agent command {argv[0]} did not finish within timeout_s={spec.timeout_s:.0f}s; "
                         f"stderr tail:\n{err[-TAIL_CHARS:]}") from exc
    except BaseException:  # cancelled (a redundant episode): nothing of it may outlive the episode
        _kill_group(proc)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(task_file)
        if proc.returncode is None:
            _kill_group(proc)
    stderr = err.decode(errors="replace")
    if proc.returncode != 0:
        raise AgentError(f"the agent command {argv[0]} exited with code {proc.returncode}; stderr tail:\n"
                         f"{stderr[-TAIL_CHARS:]}")
    return {"returncode": proc.returncode, "stdout": out.decode(errors="replace"), "stderr": stderr[-TAIL_CHARS:],
            "task_file": task_file}


def _kill_group(proc) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _rest(proc) -> str:
    """What a killed command wrote to stderr (bounded wait)."""
    try:
        async with asyncio.timeout(5):
            _, err = await proc.communicate()
        return err.decode(errors="replace")
    except (TimeoutError, ValueError):
        return ""
