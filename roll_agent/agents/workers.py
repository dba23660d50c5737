"""Agent worker processes: function agents run outside the rollout's process.

A function agent's own work (the openai SDK building each request, its HTTP client, the
agent's logic) costs more CPU per model call than the endpoint serving it. In the rollout's
process it competes with the engine and the endpoint for one interpreter; in `size` worker
processes it runs on the other cores. Each worker is an asyncio loop hosting many agent runs
at once (an agent mostly waits on its model calls); its runs reach the endpoint over loopback
exactly as in this process, with the episode's own base URL and key.

Runs whose task holds a live env (a `task_env`'s task: the agent acts in it) stay in this
process (`AgentSpec.local`), as do command agents (their own subprocesses already). A run is
cancelled across the pipe (a redundant episode), and a worker that dies fails only the runs in
flight on it (`env_error` episodes); the next run starts a fresh worker.

How many: `endpoint.agent_workers` (0: in this process), by default one fewer than the CPUs
this process may use, at most `MAX_DEFAULT_AGENT_WORKERS`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from multiprocessing.connection import Connection
from typing import Any

from roll_agent.agents.runner import AgentError, AgentSpec, run_function
from roll_agent.worker_process import WorkerError, WorkerPool

MAX_DEFAULT_AGENT_WORKERS = 8
REPLY_GRACE_S = 30.0  # past the agent's own timeout (enforced in the worker) before the parent gives up


def default_agent_workers(configured: int | None) -> int:
    if configured is not None:
        return configured
    return min(len(os.sched_getaffinity(0)) - 1, MAX_DEFAULT_AGENT_WORKERS)


# ---- the worker process ----------------------------------------------------------------


def serve(fd: int) -> None:
    """A worker's main loop: ("run", key, (spec, task, base_url, api_key)) starts an agent run,
    answered (call id, ok, result or error text) when it ends; ("cancel", key) cancels it."""
    import openai  # noqa: F401  every run needs it: imported before the first, not during it

    asyncio.run(_serve(Connection(fd)))


async def _serve(conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()

    def read() -> None:  # recv blocks: a thread feeds the loop
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                message = None
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, message)
            except RuntimeError:  # the loop has ended (quit): nothing is listening
                return
            if message is None:
                return

    threading.Thread(target=read, name="agent-worker-reader", daemon=True).start()
    runs: dict[int, asyncio.Task] = {}

    def reply(message: tuple) -> None:
        try:
            conn.send(message)
        except (BrokenPipeError, OSError):
            pass
        except Exception as exc:  # a result that does not pickle
            conn.send((message[0], False, f"the agent's result cannot be sent from its worker: {exc}"))

    async def run(call_id: int, key: int, spec: AgentSpec, task: Any, base_url: str, api_key: str) -> None:
        try:
            message = (call_id, True, await run_function(spec, task, base_url, api_key))
        except asyncio.CancelledError:
            message = (call_id, False, "cancelled")  # nobody waits for it; it clears the parent's books
        except Exception as exc:  # AgentError, or the agent could not be imported
            message = (call_id, False, str(exc))
        finally:
            runs.pop(key, None)
        reply(message)

    while (message := await inbox.get()) is not None:
        call_id, op, key, args = message
        if op == "run":
            runs[key] = asyncio.create_task(run(call_id, key, *args))
        elif op == "cancel":
            if key in runs:
                runs[key].cancel()
        elif op == "quit":
            break
    for task in list(runs.values()):
        task.cancel()
    await asyncio.gather(*runs.values(), return_exceptions=True)


# ---- the parent side ---------------------------------------------------------------------


class AgentWorkers:
    """`size` agent worker processes shared by the endpoint's sessions; a run goes to the one
    with fewest runs in flight."""

    def __init__(self, size: int):
        self.pool = WorkerPool(size, __name__, "agent")

    async def run(self, spec: AgentSpec, task: Any, base_url: str, api_key: str) -> Any:
        worker = self.pool.place()
        key = next(self.pool.keys)
        worker.hosted += 1
        try:
            async with asyncio.timeout(spec.timeout_s + REPLY_GRACE_S):
                return await worker.call("run", key, spec, task, base_url, api_key)
        except WorkerError as exc:  # the agent failed (its error as text), or its worker died
            raise AgentError(str(exc)) from exc
        except TimeoutError as exc:
            worker.notify("cancel", key)
            raise AgentError(f"the agent {spec.function} did not finish within timeout_s={spec.timeout_s:.0f}s "
                             f"(its {self.pool.name} worker {worker.index} did not answer)") from exc
        except asyncio.CancelledError:
            # a redundant episode: its session closes now (what the agent asks from here on is
            # answered "ended"), and its run in the worker is cancelled when the message arrives
            worker.notify("cancel", key)
            raise
        finally:
            worker.hosted -= 1

    @property
    def restarts(self) -> int:
        return self.pool.restarts

    def close(self) -> None:
        self.pool.close()
