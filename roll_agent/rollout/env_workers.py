"""Env worker processes: envs whose engines are not thread-safe (TextWorld, ALFWorld, a user's
C extension) or whose steps hold the GIL run in worker processes instead of the thread pool.

Each worker is a fresh Python process (`python -c ...serve(fd)`, not a fork of a process that
holds a model) hosting several env instances and serving their calls one at a time, so its
engine state is its own and no lock is shared between workers. An EnvManager sees a
`WorkerEnv`: an async env (`areset` / `astep`) whose calls travel over a socket pair
(roll_agent/worker_process.py, the parent's side it shares with agent workers). A
worker that dies (a segfault in C code, SIGKILL) fails the calls in flight on it (those
episodes end as `env_error`), and the next env made or reset there starts a fresh worker;
an env whose call is still pending when its episode gives up on it (past the step timeout)
takes its worker down with it, since a call stuck in C cannot be interrupted.

The workers of the run's env specs start with the runtime (`EnvWorkers.start`) and warm up at
once, while the run loads its model: where the env class has a `warm_up()` method, each worker
makes one env and calls it (what a process's first game load does once: TextWorld's imports its
engine and parses the logic its games share, ~2 s; ALFWorld's imports its engine, ~1.4 s). A
worker started later (a restart) pays that on its first `make`.

How many workers an env gets: `envs[].workers` (0: the thread pool), or by default the CPU
count (at most `MAX_DEFAULT_WORKERS`: each worker holds its own engine and games in memory) for
an env class that declares `metadata["thread_safe"] = False`, else 0.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
from multiprocessing.connection import Connection

import gymnasium

from roll_agent.config import EnvSpec
from roll_agent.env_extras import episode_report, expert_action_here, thread_safe, warms_up
from roll_agent.worker_process import WorkerPool, WorkerProcess

log = logging.getLogger(__name__)

MAX_DEFAULT_WORKERS = 16  # more: `envs[].workers: N`


def env_creator(env_id: str):
    """The class (or function) that makes `env_id`, its module imported."""
    import envs  # noqa: F401  registers the built-in envs

    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    entry = gymnasium.spec(name).entry_point
    return gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry


def declares_thread_safe(env_id: str) -> bool:
    """The env class's `metadata["thread_safe"]` (true when it does not say, or cannot be read)."""
    try:
        creator = env_creator(env_id)
    except Exception:  # an id that cannot be resolved fails where the env is made, with its own error
        return True
    return thread_safe(creator)


def num_workers(spec: EnvSpec) -> int:
    if spec.workers is not None:
        return spec.workers
    return 0 if declares_thread_safe(spec.id) else min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS)


def warm_up(spec: EnvSpec) -> None:
    """One env of `spec` made and its `warm_up()` called, if its class has one; then closed."""
    from roll_agent.env_registry import make_env

    if warms_up(env_creator(spec.id)):
        env = make_env(spec)
        try:
            env.unwrapped.warm_up()
        finally:
            env.close()


# ---- the worker process ----------------------------------------------------------------


def serve(fd: int) -> None:
    """A worker's main loop: (call id, op, env key, args) in, (call id, ok, result) out."""
    from roll_agent.env_registry import make_env

    conn = Connection(fd)
    hosted: dict[int, gymnasium.Env] = {}
    while True:
        try:
            call_id, op, key, args = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        try:
            if op == "warm":
                result = warm_up(args[0])
            elif op == "make":
                hosted[key] = make_env(args[0])
                result = None
            elif op == "reset":
                result = hosted[key].reset(seed=args[0])
            elif op == "step":
                result = hosted[key].step(args[0])
            elif op == "expert":  # the warm-start's expert_action()
                result = expert_action_here(hosted[key])
            elif op == "report":  # the env's episode_report(), {} when it has none
                result = episode_report(hosted[key])
            elif op == "close":
                env = hosted.pop(key, None)
                result = env.close() if env is not None else None
            elif op == "quit":
                break
            else:
                raise ValueError(f"unknown env worker op {op!r}")
            reply = (call_id, True, result)
        except Exception as exc:
            reply = (call_id, False, f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            break
        except Exception as exc:  # a result that does not pickle
            conn.send((call_id, False, f"the env's {op} result cannot be sent from its worker: {exc}"))
    for env in hosted.values():
        try:
            env.close()
        except Exception:
            pass


# ---- the parent side ---------------------------------------------------------------------


class EnvWorkerPool(WorkerPool):
    """`size` worker processes for one env spec; a new env goes to the one hosting fewest."""

    def __init__(self, size: int, name: str = "env"):
        super().__init__(size, __name__, f"{name} env")

    def start_warm(self, spec: EnvSpec) -> list[WorkerProcess]:
        """Start the workers now; each warms up (`warm_up`) while this process goes on (a run
        loads its model meanwhile). Returns the workers started."""
        started = self.start()
        for worker in started:
            worker.notify("warm", -1, spec)
        return started

    async def warm(self, spec: EnvSpec) -> None:
        """Start the workers and wait until each has warmed up; a failing `warm_up()` raises."""
        self.start()
        await asyncio.gather(*(worker.call("warm", -1, spec) for worker in self.workers))

    async def make(self, spec: EnvSpec) -> WorkerEnv:
        env = WorkerEnv(self, spec)
        try:
            await env.place()
        except BaseException:  # failed, timed out or cancelled: the worker closes it once it is made
            env.close(kill_if_pending=False)
            raise
        return env


class WorkerEnv:
    """An env living in a worker process, as the EnvManager drives it (an async env)."""

    def __init__(self, pool: EnvWorkerPool, spec: EnvSpec):
        self.pool = pool
        self.spec = spec
        self.worker: WorkerProcess | None = None
        self.key = next(pool.keys)

    async def place(self) -> None:
        """Make the env on the least loaded live worker (a dead one is restarted first)."""
        self.worker = self.pool.place()
        self.worker.hosted += 1
        await self._call("make", self.spec)

    async def _call(self, op: str, *args):
        return await self.worker.call(op, self.key, *args)

    async def areset(self, seed: int | None = None):
        if self.worker.died is not None:  # it died between episodes: nothing was lost, start afresh
            self.worker.hosted -= 1
            await self.place()
        return await self._call("reset", seed)

    async def astep(self, action: str):
        return await self._call("step", action)

    async def aexpert_action(self) -> str:
        """The env's `expert_action()` in the worker (roll_agent/env_extras.py: RemoteEnv)."""
        return await self._call("expert")

    async def aepisode_report(self) -> dict:
        """The env's `episode_report()` in the worker, {} when it has none."""
        return await self._call("report")

    def close(self, kill_if_pending: bool = True) -> None:
        """Thread-safe, returns at once. With a call still pending (a step past its timeout, hung
        in C code) the worker cannot serve anything else: it is killed, and restarted on demand."""
        worker, self.worker = self.worker, None
        if worker is None:
            return
        worker.hosted -= 1
        if kill_if_pending and worker.died is None and worker.answering(self.key):
            log.warning("env %s has a call pending in %s worker %d: killing the worker",
                        self.key, self.pool.name, worker.index)
            worker.kill()
        else:
            worker.notify("close", self.key)


class EnvWorkers:
    """One pool per env spec that asks for workers, made on first use; shared by the env managers."""

    def __init__(self):
        self.pools: dict[str, EnvWorkerPool | None] = {}

    def pool(self, spec: EnvSpec) -> EnvWorkerPool | None:
        key = repr((spec.id, sorted(spec.kwargs.items()), spec.workers, spec.name))
        if key not in self.pools:
            n = num_workers(spec)
            self.pools[key] = EnvWorkerPool(n, spec.name) if n else None
        return self.pools[key]

    def start(self, specs: list[EnvSpec]) -> None:
        """Start the workers of every spec that asks for them (see `EnvWorkerPool.start_warm`)."""
        for spec in specs:
            pool = self.pool(spec)
            if pool is not None:
                pool.start_warm(spec)

    def restarts(self) -> int:
        return sum(p.restarts for p in self.pools.values() if p is not None)

    def close(self) -> None:
        for pool in self.pools.values():
            if pool is not None:
                pool.close()
