"""Host-side process plumbing shared by the `local` and `bwrap` backends.

Output is pumped with a deadline (not `communicate(timeout)`, which buffers all of it),
and a timed-out command is killed as a process group: the shell's children die with it.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from .base import OutputBuffer

_LINGER_S = 0.2  # after the command exits, how long to wait for children still holding the pipe


@dataclass
class Completed:
    returncode: int  # 128 + signal for a killed process, as a shell reports it
    out: OutputBuffer
    err: OutputBuffer | None
    timed_out: bool
    duration_s: float


def spawn(argv: list[str], *, stdin=None, merge_stderr: bool = True, **popen_kw) -> subprocess.Popen:
    """Start argv in a new session (its own process group, killable as a whole).

    stdin: None, subprocess.PIPE (bytes fed later by collect) or a readable file object.
    """
    return subprocess.Popen(argv, stdin=stdin or subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                            start_new_session=True, **popen_kw)


def collect(proc: subprocess.Popen, *, t0: float, timeout: float, limit: int | None,
            data: bytes | None = None, on_exit=None) -> Completed:
    """Feed `data`, gather the output until the process ends or the deadline; then kill
    its process group if it is late. on_exit(proc) runs whatever happens."""
    try:
        if data is not None:
            threading.Thread(target=_feed, args=(proc.stdin, data), daemon=True).start()
        out, err = OutputBuffer(limit), OutputBuffer(64_000) if proc.stderr else None
        streams = {proc.stdout: out} | ({proc.stderr: err} if proc.stderr else {})
        timed_out = not _pump(proc, streams, t0 + timeout)
        if timed_out:
            kill_group(proc)
        rc = proc.wait()
    finally:
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()
        if on_exit:
            on_exit(proc)
    return Completed(128 - rc if rc < 0 else rc, out, err, timed_out, time.monotonic() - t0)


def run(argv: list[str], *, timeout: float, limit: int | None, stdin=None,
        merge_stderr: bool = True, on_spawn=None, on_exit=None, **popen_kw) -> Completed:
    """spawn + collect. stdin: None, bytes, or a readable file object.

    on_spawn(proc)/on_exit(proc) let a sandbox track what is running so close()
    can kill it from another thread.
    """
    t0 = time.monotonic()
    feed = isinstance(stdin, bytes)
    proc = spawn(argv, stdin=subprocess.PIPE if feed else stdin, merge_stderr=merge_stderr, **popen_kw)
    if on_spawn:
        on_spawn(proc)
    return collect(proc, t0=t0, timeout=timeout, limit=limit, data=stdin if feed else None, on_exit=on_exit)


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, ValueError, OSError):
        pass  # the command exited without reading all of its input


def _pump(proc: subprocess.Popen, streams: dict, deadline: float) -> bool:
    """Copy output into the buffers until EOF; False if the deadline passed first."""
    sel = selectors.DefaultSelector()
    for f in streams:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    exited_at = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return False
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > _LINGER_S:
                break  # a background child kept the pipe open; do not wait for it
            wait = min(deadline - now, 0.05 if exited_at is None else _LINGER_S)
            for key, _ in sel.select(max(wait, 0.001)):
                data = os.read(key.fd, 65536)
                if data:
                    streams[key.fileobj].feed(data)
                else:
                    sel.unregister(key.fileobj)
        remaining = deadline - time.monotonic()
        try:
            proc.wait(timeout=max(remaining, 0.001))
        except subprocess.TimeoutExpired:
            return False
        return True
    finally:
        sel.close()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the session we started (the command and every child that stayed in it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


# -- ownership of leftovers: a crashed run's containers, dirs and cgroups are recognised
# by an owner tag "<pid>-<start time>" that cannot be confused with a later process
# that reuses the pid.

def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_tag(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_start_time(pid)}"


def owner_alive(tag: str) -> bool:
    try:
        pid, start = tag.split("-", 1)
        return _start_time(int(pid)) == start
    except ValueError:
        return False
