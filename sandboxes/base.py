"""The sandbox contract, the result type and what every backend shares.

A sandbox runs commands an agent wrote; nothing it does may reach the host. The
contract is deliberately small (start / exec / files / close) so that env code can
switch backends by config alone.
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import functools
import os
import threading
import weakref
from collections import deque
from typing import Any, Protocol, runtime_checkable


class SandboxError(RuntimeError):
    """A sandbox could not do what was asked (not: the command failed; that is an ExecResult)."""


@dataclasses.dataclass
class ExecResult:
    exit_code: int
    output: str  # stdout and stderr interleaved as the command wrote them
    timed_out: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@runtime_checkable
class Sandbox(Protocol):
    """What env code may rely on, whatever the backend."""

    limits: dict[str, Any]

    def start(self) -> "Sandbox": ...
    def exec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None,
             workdir: str | None = None) -> ExecResult: ...
    def read_file(self, path: str) -> str: ...
    def write_file(self, path: str, content: str | bytes) -> None: ...
    def upload(self, local_dir: str, path: str) -> None: ...
    def download(self, path: str, dest: str | None = None) -> bytes | str: ...
    def close(self) -> None: ...

    async def aexec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None,
                    workdir: str | None = None) -> ExecResult: ...


class OutputBuffer:
    """Keeps the head and the tail of a stream within `limit` bytes.

    Agents run test suites and builds whose logs can be gigabytes; the first lines
    (what ran) and the last ones (the failure) are what a model can use, so the
    middle is dropped, with a note saying how much.
    """

    def __init__(self, limit: int | None):
        self.limit = limit
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if self.limit is None:
            self.head += data
            return
        room = self.limit // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail.append(data)
            self.tail_len += len(data)
            keep = self.limit - self.limit // 2
            while self.tail_len - len(self.tail[0]) >= keep:
                self.tail_len -= len(self.tail.popleft())

    @property
    def truncated(self) -> bool:
        return self.limit is not None and self.total > self.limit

    def getvalue(self) -> bytes:
        tail = b"".join(self.tail)
        if not self.truncated:
            return bytes(self.head) + tail
        keep = self.limit - self.limit // 2
        tail = tail[-keep:] if keep else b""
        dropped = self.total - len(self.head) - len(tail)
        note = f"\n[... {dropped} bytes of output truncated (limit max_output_bytes={self.limit}) ...]\n"
        return bytes(self.head) + note.encode() + tail

    def text(self) -> str:
        return self.getvalue().decode("utf-8", errors="replace")


_live: "weakref.WeakSet[SandboxBase]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """A sandbox the caller forgot to close still goes at interpreter exit."""
    for sb in list(_live):
        try:
            sb.close()
        except Exception:  # noqa: BLE001 - exiting anyway; the next run sweeps leftovers
            pass


_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _in_thread(fn, *args):
    """Run a blocking sandbox call off the event loop, in a pool of its own.

    Not asyncio.to_thread: the loop's default pool has cpu+4 workers, so on a small
    machine a few long `exec`s would queue every other env's calls behind them. The
    threads here mostly wait on a process or a socket; ROLL_AGENT_SANDBOX_THREADS sizes it.
    """
    global _executor
    with _executor_lock:
        if _executor is None:
            size = int(os.environ.get("ROLL_AGENT_SANDBOX_THREADS", "256"))
            _executor = concurrent.futures.ThreadPoolExecutor(size, thread_name_prefix="roll-agent-sandbox")
    return asyncio.get_running_loop().run_in_executor(_executor, functools.partial(fn, *args))


class SandboxBase:
    """Context manager and async variants on top of a backend's blocking methods.

    The async variants run in a worker thread: an env manager's event loop drives
    hundreds of envs and must never sit in a blocking syscall for one of them.
    """

    limits: dict[str, Any]

    def _track_live(self) -> None:
        """Backends call this in start(): a started sandbox is closed at exit at the latest."""
        _live.add(self)

    def start(self):  # pragma: no cover - backends override
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - backends override
        raise NotImplementedError

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self):
        return await self.astart()

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def astart(self):
        return await _in_thread(self.start)

    async def aexec(self, cmd, timeout=None, env=None, workdir=None) -> ExecResult:
        return await _in_thread(self.exec, cmd, timeout, env, workdir)

    async def aread_file(self, path: str) -> str:
        return await _in_thread(self.read_file, path)

    async def awrite_file(self, path: str, content: str | bytes) -> None:
        await _in_thread(self.write_file, path, content)

    async def aclose(self) -> None:
        await _in_thread(self.close)


def resolve(path: str, workdir: str) -> str:
    """Sandbox paths: relative ones are taken from the work dir, like a shell would."""
    import posixpath

    return posixpath.normpath(path if path.startswith("/") else posixpath.join(workdir, path))
