"""Env worker processes: envs whose engines are not thread-safe (TextWorld, ALFWorld, a user's
C extension) or whose steps hold the GIL run in worker processes instead of the thread pool.

Each worker is a fresh Python process (`python -c ...serve(fd)`, not a fork of a process that
holds a model) hosting several env instances and serving their calls one at a time, so its
engine state is its own and no lock is shared between workers. An EnvManager sees a
`WorkerEnv`: an async env (`areset` / `astep`) whose calls travel over a socket pair. A
worker that dies (a segfault in C code, SIGKILL) fails the calls in flight on it (those
episodes end as `env_error`), and the next env made or reset there starts a fresh worker;
an env whose call is still pending when its episode gives up on it (past the step timeout)
takes its worker down with it, since a call stuck in C cannot be interrupted.

How many workers an env gets: `envs[].workers` (0: the thread pool), or by default the CPU
count (at most `MAX_DEFAULT_WORKERS`: each worker holds its own engine and games in memory) for
an env class that declares `metadata["thread_safe"] = False`, else 0.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

import gymnasium

from roll_agent.config import EnvSpec

log = logging.getLogger(__name__)

MAX_DEFAULT_WORKERS = 16  # more: `envs[].workers: N`


class EnvWorkerError(RuntimeError):
    """The env raised in its worker (the message carries the worker-side exception)."""


class EnvWorkerDied(EnvWorkerError):
    """The worker process hosting the env died during (or before) the call."""


def declares_thread_safe(env_id: str) -> bool:
    """The env class's `metadata["thread_safe"]` (true when it does not say, or cannot be read)."""
    import envs  # noqa: F401  registers the built-in envs

    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        entry = gymnasium.spec(name).entry_point
        creator = gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    except Exception:  # an id that cannot be resolved fails where the env is made, with its own error
        return True
    return bool(getattr(creator, "metadata", {}).get("thread_safe", True))


def num_workers(spec: EnvSpec) -> int:
    if spec.workers is not None:
        return spec.workers
    return 0 if declares_thread_safe(spec.id) else min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS)


# ---- the worker process ----------------------------------------------------------------


def serve(fd: int) -> None:
    """A worker's main loop: (call id, op, env key, args) in, (call id, ok, result) out."""
    from roll_agent.rollout.envs import make_env

    conn = Connection(fd)
    hosted: dict[int, gymnasium.Env] = {}
    while True:
        try:
            call_id, op, key, args = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        try:
            if op == "make":
                hosted[key] = make_env(args[0])
                result = None
            elif op == "reset":
                result = hosted[key].reset(seed=args[0])
            elif op == "step":
                result = hosted[key].step(args[0])
            elif op == "call":  # a method of the env itself (the warm-start's expert_action)
                result = getattr(hosted[key].unwrapped, args[0])(*args[1:])
            elif op == "report":  # the env's optional episode_report() (roll_agent/rollout/env_manager.py)
                report = getattr(hosted[key].unwrapped, "episode_report", None)
                result = report() if report is not None else {}
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


class _Worker:
    """One worker process and the calls in flight on it. Calls are sent from any thread;
    a reader thread settles their futures on the loop that made them. Sending holds its own
    lock, never the one the reader takes, so the worker's answers are always drained and a
    full socket cannot deadlock the two."""

    def __init__(self, index: int):
        ours, theirs = socket.socketpair()
        code = f"import sys; sys.path[:0] = {sys.path!r}; from roll_agent.rollout.env_workers import serve; serve({theirs.fileno()})"
        self.process = subprocess.Popen([sys.executable, "-c", code], pass_fds=[theirs.fileno()])
        theirs.close()
        self.index = index
        self.conn = Connection(ours.detach())
        self.hosted = 0  # envs living here
        self.died: str | None = None  # why it is gone
        self._lock = threading.Lock()  # the pending calls and `died`
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, tuple[int, asyncio.AbstractEventLoop, asyncio.Future]] = {}  # id: key, loop, future
        threading.Thread(target=self._read, name=f"env-worker-{index}-reader", daemon=True).start()

    def call(self, op: str, key: int, *args) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            call_id, alive = next(self._ids), self.died is None
            if alive:
                self._pending[call_id] = (key, loop, future)
        if alive and self._send((call_id, op, key, args)):
            return future
        with self._lock:
            self._pending.pop(call_id, None)
        if not future.done():
            future.set_exception(EnvWorkerDied(self.died or f"env worker {self.index} is gone"))
        return future

    def notify(self, op: str, key: int) -> None:
        """A call whose answer nobody waits for (close); safe from any thread."""
        self._send((-1, op, key, ()))

    def _send(self, message: tuple) -> bool:
        with self._send_lock:
            try:
                self.conn.send(message)
                return True
            except OSError:  # the worker is gone (or going): the reader fails what was in flight
                return False

    def _read(self) -> None:
        while True:
            try:
                call_id, ok, result = self.conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                entry = self._pending.pop(call_id, None)
            if entry is not None:
                _settle(*entry[1:], ok, result)
        code = self.process.wait()
        with self._lock:
            self.died = f"env worker {self.index} (pid {self.process.pid}) died with exit code {code}"
            pending, self._pending = self._pending, {}
        with self._send_lock:
            self.conn.close()
        if pending:
            log.warning("%s; %d env call(s) in flight on it fail", self.died, len(pending))
        for _, loop, future in pending.values():
            _settle(loop, future, False, EnvWorkerDied(self.died))

    def busy(self) -> bool:
        """Whether any call is unanswered."""
        with self._lock:
            return bool(self._pending)

    def answering(self, key: int) -> bool:
        """Whether a call of env `key` is still unanswered (its caller may have stopped waiting)."""
        with self._lock:
            return any(k == key for k, _, _ in self._pending.values())

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()

    def close(self) -> None:
        self.notify("quit", -1)  # the worker closes its envs and exits
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, ok: bool, result) -> None:
    def settle() -> None:
        if future.done():  # its caller was cancelled
            return
        if ok:
            future.set_result(result)
        else:
            future.set_exception(result if isinstance(result, BaseException) else EnvWorkerError(result))

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


class EnvWorkerPool:
    """`size` worker processes for one env spec; a new env goes to the one hosting fewest."""

    def __init__(self, size: int, name: str = "env"):
        if size < 1:
            raise ValueError(f"an env worker pool needs at least one worker, got {size}")
        self.size = size
        self.name = name
        self.workers: list[_Worker | None] = [None] * size
        self.restarts = 0
        self._keys = itertools.count()
        self._closed = False

    def _place(self) -> _Worker:
        if self._closed:
            raise EnvWorkerError(f"the {self.name} env workers are closed")
        for i, worker in enumerate(self.workers):
            if worker is None or worker.died is not None:
                if worker is not None:
                    self.restarts += 1
                    log.warning("restarting %s env worker %d (%s)", self.name, i, worker.died)
                self.workers[i] = _Worker(i)
        return min(self.workers, key=lambda w: w.hosted)

    async def make(self, spec: EnvSpec) -> WorkerEnv:
        env = WorkerEnv(self, spec)
        try:
            await env.place()
        except BaseException:  # failed, timed out or cancelled: the worker closes it once it is made
            env.close(kill_if_pending=False)
            raise
        return env

    def close(self) -> None:
        self._closed = True
        for worker in self.workers:
            if worker is not None:
                worker.close()


class WorkerEnv:
    """An env living in a worker process, as the EnvManager drives it (an async env)."""

    def __init__(self, pool: EnvWorkerPool, spec: EnvSpec):
        self.pool = pool
        self.spec = spec
        self.worker: _Worker | None = None
        self.key = next(pool._keys)

    @property
    def unwrapped(self) -> WorkerEnv:
        return self

    async def place(self) -> None:
        """Make the env on the least loaded live worker (a dead one is restarted first)."""
        self.worker = self.pool._place()
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

    async def acall(self, method: str, *args):
        """`env.unwrapped.<method>(*args)` in the worker (e.g. `expert_action`)."""
        return await self._call("call", method, *args)

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
            log.warning("env %s has a call pending in %s env worker %d: killing the worker",
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

    def restarts(self) -> int:
        return sum(p.restarts for p in self.pools.values() if p is not None)

    def close(self) -> None:
        for pool in self.pools.values():
            if pool is not None:
                pool.close()
