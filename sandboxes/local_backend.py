"""local backend: commands run on the host, as you, with no isolation at all.

Useful for trusted scripted tests and debugging only; it must be asked for by name
(`unsafe=True`), so a config typo can never run agent commands unsandboxed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading

from . import procs
from .base import ExecResult, SandboxBase, SandboxError, resolve
from .config import LocalConfig


class LocalSandbox(SandboxBase):
    config_class = LocalConfig

    def __init__(self, config: LocalConfig):
        if not config.unsafe:
            raise SandboxError(
                "the 'local' sandbox backend runs agent commands on this machine without any isolation; "
                "pass unsafe=True to make_sandbox('local', ...) if that is really what you want, "
                "or use backend 'bwrap' or 'docker'")
        self.config = config
        self.workdir: str | None = None
        self._owns_dir = config.workdir is None
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.limits = {"backend": "local", "isolation": "none", "network": "host", "user": "yours"}

    def start(self) -> "LocalSandbox":
        self._track_live()
        if self.workdir is None:
            self.workdir = self.config.workdir or tempfile.mkdtemp(prefix="roll-local-")
            os.makedirs(self.workdir, exist_ok=True)
        return self

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = list(self._running)
        for proc in running:
            procs.kill_group(proc)
        if self._owns_dir and self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _check(self) -> str:
        if self.workdir is None or self._closed:
            raise SandboxError("local sandbox is not running: call start() (or use it as a context manager)")
        return self.workdir

    def exec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None,
             workdir: str | None = None) -> ExecResult:
        root = self._check()
        full_env = {**os.environ, **self.config.env, **(env or {})}
        cwd = resolve(workdir or root, root)
        if not os.path.isdir(cwd):  # like the other backends: a failed command, not an exception
            return ExecResult(126, f"sandbox: no such directory: {cwd}\n", False, 0.0)
        c = procs.run(["/bin/sh", "-c", cmd], timeout=timeout or self.config.timeout,
                      limit=self.config.max_output_bytes, env=full_env, cwd=cwd,
                      on_spawn=self._track, on_exit=self._untrack)
        return ExecResult(c.returncode, c.out.text(), c.timed_out, c.duration_s)

    def _track(self, proc):
        with self._lock:
            self._running.add(proc)

    def _untrack(self, proc):
        with self._lock:
            self._running.discard(proc)

    def read_file(self, path: str) -> str:
        with open(resolve(path, self._check()), "rb") as f:
            return f.read().decode("utf-8", errors="replace")

    def write_file(self, path: str, content: str | bytes) -> None:
        full = resolve(path, self._check())
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)

    def upload(self, local_dir: str, path: str) -> None:
        shutil.copytree(local_dir, resolve(path, self._check()), symlinks=True, dirs_exist_ok=True)

    def download(self, path: str, dest: str | None = None) -> bytes | str:
        full = resolve(path, self._check())
        if dest is None:
            with open(full, "rb") as f:
                return f.read()
        if os.path.isdir(full):
            shutil.copytree(full, dest, symlinks=True)
        else:
            shutil.copy2(full, dest)
        return dest
