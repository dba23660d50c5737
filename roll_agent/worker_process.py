"""Python worker processes that serve calls over a socket pair: the parent's side, shared by env
workers (roll_agent/rollout/env_workers.py) and agent workers (roll_agent/agents/workers.py).

A worker is a fresh Python process (`python -c ...<module>.serve(fd)`, not a fork of a process
that holds a model) with this process's `sys.path`. Messages are pickled tuples: (call id, op,
key, args) to the worker, (call id, ok, result) back, where a failed call's result is the
worker-side error as text. The module's `serve(fd)` decides what the ops mean. A worker that
dies fails the calls in flight on it with `WorkerDied`; its pool starts a fresh one on next use.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

log = logging.getLogger(__name__)


class WorkerError(RuntimeError):
    """The call failed in its worker (the message carries the worker-side exception)."""


class WorkerDied(WorkerError):
    """The worker process died during (or before) the call."""


class WorkerProcess:
    """One worker process and the calls in flight on it. Calls are sent from any thread;
    a reader thread settles their futures on the loop that made them. Sending holds its own
    lock, never the one the reader takes, so the worker's answers are always drained and a
    full socket cannot deadlock the two."""

    def __init__(self, index: int, module: str, name: str = "worker"):
        ours, theirs = socket.socketpair()
        code = f"import sys; sys.path[:0] = {sys.path!r}; from {module} import serve; serve({theirs.fileno()})"
        self.process = subprocess.Popen([sys.executable, "-c", code], pass_fds=[theirs.fileno()])
        theirs.close()
        self.index = index
        self.name = name
        self.conn = Connection(ours.detach())
        self.hosted = 0  # what the pool placed here (envs, agent runs)
        self.died: str | None = None  # why it is gone
        self.closing = False  # asked to quit: what is still in flight is not waited for
        self._lock = threading.Lock()  # the pending calls and `died`
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, tuple[int, asyncio.AbstractEventLoop, asyncio.Future]] = {}  # id: key, loop, future
        threading.Thread(target=self._read, name=f"{name}-worker-{index}-reader", daemon=True).start()

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
            future.set_exception(WorkerDied(self.died or f"{self.name} worker {self.index} is gone"))
        return future

    def notify(self, op: str, key: int, *args) -> None:
        """A call whose answer nobody waits for (close, cancel, warm); safe from any thread."""
        self._send((-1, op, key, args))

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
            self.died = f"{self.name} worker {self.index} (pid {self.process.pid}) died with exit code {code}"
            pending, self._pending = self._pending, {}
        with self._send_lock:
            self.conn.close()
        if pending and not self.closing:
            log.warning("%s; %d call(s) in flight on it fail", self.died, len(pending))
        for _, loop, future in pending.values():
            _settle(loop, future, False, WorkerDied(self.died))

    def busy(self) -> bool:
        """Whether any call is unanswered."""
        with self._lock:
            return bool(self._pending)

    def answering(self, key: int) -> bool:
        """Whether a call of `key` is still unanswered (its caller may have stopped waiting)."""
        with self._lock:
            return any(k == key for k, _, _ in self._pending.values())

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()

    def close(self) -> None:
        self.closing = True
        self.notify("quit", -1)  # the worker closes what it hosts and exits
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
            future.set_exception(result if isinstance(result, BaseException) else WorkerError(result))

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


class WorkerPool:
    """`size` worker processes serving `module`; `place()` picks the live one hosting fewest."""

    def __init__(self, size: int, module: str, name: str = "worker"):
        if size < 1:
            raise ValueError(f"a {name} worker pool needs at least one worker, got {size}")
        self.size = size
        self.module = module
        self.name = name
        self.workers: list[WorkerProcess | None] = [None] * size
        self.restarts = 0
        self.keys = itertools.count()
        self._closed = False

    def start(self) -> list[WorkerProcess]:
        """Start every worker that is missing or dead; returns the ones started."""
        if self._closed:
            raise WorkerError(f"the {self.name} workers are closed")
        started = []
        for i, worker in enumerate(self.workers):
            if worker is None or worker.died is not None:
                if worker is not None:
                    self.restarts += 1
                    log.warning("restarting %s worker %d (%s)", self.name, i, worker.died)
                self.workers[i] = WorkerProcess(i, self.module, self.name)
                started.append(self.workers[i])
        return started

    def place(self) -> WorkerProcess:
        """The least loaded worker, after starting any that is missing or dead."""
        self.start()
        return min(self.workers, key=lambda w: w.hosted)

    def close(self) -> None:
        """Idempotent: a second call finds them closed."""
        if self._closed:
            return
        self._closed = True
        for worker in self.workers:
            if worker is not None:
                worker.close()
