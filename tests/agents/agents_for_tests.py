"""Agents the tests run as `tests.agents.agents_for_tests:NAME` (importable from the repository root)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path


async def editing_agent(task: dict, client) -> float:
    """Three calls; the third drops the first exchange (a history-editing agent: a fork)."""
    history = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": task["question"]}]
    for follow_up in ("Are you sure?", "Say it once more."):
        reply = await client.chat.completions.create(model="m", messages=history, max_tokens=6)
        history += [{"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": follow_up}]
    await client.chat.completions.create(model="m", messages=[history[0]] + history[3:], max_tokens=6)
    return float(task["id"] % 2)


async def pid_agent(task: dict, client, marker_dir: str) -> float:
    """One call; leaves a file named by the process that ran it in `marker_dir`."""
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"task {task['id']}"}],
                                         max_tokens=4)
    (Path(marker_dir) / f"pid-{os.getpid()}").touch()
    return 1.0


async def dying_agent(task: dict, client, marker_dir: str) -> float:
    """The first time it plays task 0, kills the process it runs in (SIGKILL); else as pid_agent."""
    first = Path(marker_dir) / "killed"
    if task["id"] == 0 and not first.exists():
        first.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return await pid_agent(task, client, marker_dir)


async def sleepy_agent(task: dict, client, marker_dir: str) -> float:
    """Waits forever, leaving `started`, and `cancelled` when it is cancelled."""
    (Path(marker_dir) / "started").touch()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        (Path(marker_dir) / "cancelled").touch()
        raise
    return 0.0


async def unsendable_agent(task: dict, client):
    """Returns what cannot travel back from a worker process (a lambda does not pickle)."""
    return lambda: 1.0


async def staggered_solve(task: dict, client):
    """The example calculator agent (examples/openai_agent/agent.py, on sys.path) after a random
    pause of up to 0.5 s, as an agent with work of its own would: episodes do not run in lockstep."""
    import agent

    await asyncio.sleep(random.uniform(0, 0.5))
    return await agent.solve(task, client)


# what hostile_agent sends before its good call: (name, path, raw body)
HOSTILE_REQUESTS = [
    ("ids above the vocabulary", "/completions", b'{"prompt": [1000000, 1000001], "max_tokens": 2}'),
    ("negative ids", "/completions", b'{"prompt": [-5, 3], "max_tokens": 2}'),
    ("non-integer ids", "/completions", b'{"prompt": [1.5, 3], "max_tokens": 2}'),
    ("ids as strings", "/completions", b'{"prompt": ["7", 3], "max_tokens": 2}'),
    ("an empty prompt", "/completions", b'{"prompt": [], "max_tokens": 2}'),
    ("nested 100,000 deep", "/chat/completions", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ("not UTF-8", "/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe\xfa"}]}'),
]


async def hostile_agent(task: dict, client, marker_dir: str) -> float:
    """Sends each of HOSTILE_REQUESTS on one keep-alive connection, then a good chat call on the
    same connection; writes what came back (status, JSON error or not) to `marker_dir`."""
    import json

    import httpx

    answers = {}
    headers = {"authorization": f"Bearer {client.api_key}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=str(client.base_url).rstrip("/"), headers=headers, timeout=60,
                                 limits=httpx.Limits(max_connections=1)) as http:
        for name, path, body in HOSTILE_REQUESTS:
            reply = await http.post(path, content=body)
            try:
                error = reply.json()["error"]
            except (ValueError, KeyError, TypeError):
                error = None
            answers[name] = {"status": reply.status_code, "error": error}
        good = await http.post("/chat/completions", json={
            "messages": [{"role": "user", "content": f"task {task['id']}"}], "max_tokens": 4})
        answers["good call after them"] = {"status": good.status_code, "error": None}
    (Path(marker_dir) / f"task-{task['id']}-{os.getpid()}-{random.random()}.json").write_text(json.dumps(answers))
    return float(task["id"] % 2)


def broken_tool_parser(text: str):
    """A user's tool parser with a bug (endpoint.tool_parser: module:function)."""
    raise KeyError("the parser's own bug")
