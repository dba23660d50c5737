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
