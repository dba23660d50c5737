"""docker backend: one container per sandbox, commands via `docker exec`.

Containers run with no network, memory/pids/CPU/file-size limits, every capability
dropped, no_new_privs and the image's non-root user (the base image's uid 1000).
Each is labelled with its owner process and removed on close with SIGKILL (no stop
grace period); containers whose owner died are removed at the next start. A warm pool
(pool.py) hides the ~0.5 s container start.

Commands go to a command server that is the container's main process
(container_server.py, exec_mode="server"), or, for images without python3, through
one `docker exec` each (exec_mode="exec"). Either way a timed-out command is killed
with its process group, and children that left the group (setsid) are found by a
per-exec marker in their environment. A host-side deadline backs both up: a container
that stops answering is killed.
"""
from __future__ import annotations

import io
import os
import secrets
import select
import shlex
import struct
import tarfile
import tempfile
import threading
import time

from . import pool
from .base import ExecResult, OutputBuffer, SandboxBase, SandboxError, resolve
from .hostfs import extract_to
from .config import DockerConfig

_MARK = "ROLL_AGENT_EXEC"
_GRACE_S = 3.0  # host-side slack over the in-container timeout before we intervene


class DockerSandbox(SandboxBase):
    config_class = DockerConfig

    def __init__(self, config: DockerConfig):
        self.config = config
        self.id: str | None = None
        self.channel = None
        self._closed = False
        self._lock = threading.Lock()
        self._owner: tuple[int, int] | None = None
        self.limits: dict = {}

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> "DockerSandbox":
        if self.id is not None:
            return self
        cfg = self.config
        self._track_live()
        self.api = pool.client(cfg.docker_host).api
        pool.sweep_stale(cfg.docker_host)
        self.limits = self._limits_report()  # fails early on a missing image
        c = pool.warm_pool(cfg).acquire() if cfg.pool_size > 0 else None
        c = c or pool.create_container(cfg)
        with self._lock:
            self.id, self.channel = c.id, c.channel
            closed = self._closed
        if closed:  # closed by another thread while we were starting
            pool.discard(cfg, c)
        return self

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.channel:
            self.channel.close()
        if self.id:
            pool.remove(self.api, self.id)

    def _check(self) -> str:
        if self.id is None or self._closed:
            raise SandboxError("docker sandbox is not running: call start() (or use it as a context manager)")
        return self.id

    def _limits_report(self) -> dict:
        cfg = self.config
        user = pool.effective_user(cfg)
        return {"backend": "docker", "image": cfg.image, "network": cfg.network, "exec_mode": cfg.exec_mode,
                "user": user or "root (the image sets no USER), all capabilities dropped",
                "command_server": "root with SETUID/SETGID/KILL only" if user and cfg.exec_mode == "server"
                                  else "none" if cfg.exec_mode == "exec" else "root, no capabilities",
                "memory_mb": cfg.memory_mb, "pids": cfg.pids, "cpus": cfg.cpus,
                "file_size_mb": cfg.file_size_mb, "no_new_privileges": True, "capabilities": "none",
                "disk_total": "unbounded (per-file limit only; overlay2 quotas need xfs+pquota)",
                "processes_survive_exec": True}

    # -- commands --------------------------------------------------------------
    def exec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None,
             workdir: str | None = None) -> ExecResult:
        cid = self._check()
        cfg = self.config
        timeout = timeout or cfg.timeout
        wd = resolve(workdir or cfg.workdir, cfg.workdir)
        if self.channel:
            return self._exec_server(cmd, timeout, {**cfg.env, **(env or {})}, wd)
        return self._exec_docker(cid, cmd, timeout, {**cfg.env, **(env or {})}, wd)

    def _exec_docker(self, cid: str, cmd: str, timeout: float, env: dict, wd: str) -> ExecResult:
        """exec_mode="exec": one `docker exec` per command, under coreutils `timeout`."""
        mark = secrets.token_hex(8)
        environment = {**env, _MARK: mark}
        t0 = time.monotonic()
        argv = ["timeout", "-s", "KILL", f"{timeout:.3f}", "/bin/sh", "-c", cmd]
        exec_id = self._exec_create(cid, argv, environment, wd)
        out = OutputBuffer(self.config.max_output_bytes)
        finished = self._stream(exec_id, out, t0 + timeout + _GRACE_S)
        duration = time.monotonic() - t0
        if not finished:
            self._kill_marked(cid, mark)
        code = self._exit_code(exec_id)
        timed_out = not finished or (code == 137 and duration >= timeout * 0.98)
        if timed_out:
            self._kill_marked(cid, mark)  # children that escaped timeout's process group
        return ExecResult(code if code is not None else 137, out.text(), timed_out, duration)

    def _exec_server(self, cmd: str, timeout: float, env: dict, workdir: str) -> ExecResult:
        from .channel import ServerGone

        t0 = time.monotonic()
        req = {"cmd": cmd, "env": env, "cwd": workdir, "timeout": timeout,
               "limit": self.config.max_output_bytes, "mark": secrets.token_hex(8)}
        try:
            head, data = self.channel.request(req, t0 + timeout + _GRACE_S)
        except TimeoutError:
            # the server itself is stuck (e.g. frozen by a fork bomb): nothing in the
            # container can be trusted to work again, so the container goes
            self.close()
            return ExecResult(137, "[sandbox unresponsive after the timeout; container killed]\n", True,
                              time.monotonic() - t0)
        except ServerGone as e:
            if self._closed:
                raise SandboxError("docker sandbox closed while the command ran") from None
            raise SandboxError(f"docker sandbox {self.id[:12]} is dead: {e}") from None
        return ExecResult(head["rc"], data.decode("utf-8", errors="replace"), head["timed_out"],
                          time.monotonic() - t0)

    def _exec_create(self, cid: str, argv: list[str], environment: dict, workdir: str) -> str:
        import docker

        try:
            return self.api.exec_create(cid, argv, environment=environment, workdir=workdir)["Id"]
        except docker.errors.APIError as e:
            raise SandboxError(f"docker exec in {cid[:12]} failed: {e.explanation or e}") from e

    def _stream(self, exec_id: str, out: OutputBuffer, deadline: float) -> bool:
        """Read the multiplexed stdout/stderr frames into `out`; False if the deadline passed."""
        sock = self.api.exec_start(exec_id, socket=True)
        raw = getattr(sock, "_sock", sock)
        buf = b""
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                ready, _, _ = select.select([raw], [], [], left)
                if not ready:
                    continue
                chunk = raw.recv(65536)
                if not chunk:
                    return True
                buf += chunk
                while len(buf) >= 8:  # frame: 1 byte stream, 3 pad, 4 byte big-endian size
                    size = struct.unpack(">I", buf[4:8])[0]
                    if len(buf) < 8 + size:
                        break
                    out.feed(buf[8:8 + size])
                    buf = buf[8 + size:]
        finally:
            sock.close()
            if raw is not sock:
                raw.close()

    def _exit_code(self, exec_id: str) -> int | None:
        for _ in range(100):  # the stream can end a moment before the exit code is recorded
            info = self.api.exec_inspect(exec_id)
            if not info.get("Running"):
                return info.get("ExitCode")
            time.sleep(0.005)
        return None

    def _kill_marked(self, cid: str, mark: str) -> None:
        script = (f'for p in /proc/[0-9]*; do grep -qsF "{_MARK}={mark}" "$p/environ" '
                  f'&& kill -9 "${{p#/proc/}}" 2>/dev/null; done; true')
        try:
            exec_id = self.api.exec_create(cid, ["/bin/sh", "-c", script])["Id"]
            self.api.exec_start(exec_id)
        except Exception:  # noqa: BLE001 - best effort; the container is killed at close anyway
            pass

    # -- files (docker's archive API: the daemon resolves paths inside the container) --
    def read_file(self, path: str) -> str:
        return self._read_bytes(path).decode("utf-8", errors="replace")

    def _read_bytes(self, path: str) -> bytes:
        tar = self._get_archive(resolve(path, self.config.workdir))
        with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
            member = tf.next()
            if member is None or not member.isfile():
                raise SandboxError(f"{path} is not a regular file; use download(path, dest) for directories")
            return tf.extractfile(member).read()

    def _get_archive(self, full: str) -> bytes:
        import docker

        try:
            stream, _ = self.api.get_archive(self._check(), full)
        except docker.errors.NotFound as e:
            raise FileNotFoundError(f"sandbox: no such file: {full}") from e
        return b"".join(stream)

    def write_file(self, path: str, content: str | bytes) -> None:
        full = resolve(path, self.config.workdir)
        data = content.encode() if isinstance(content, str) else content
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = self._tarinfo(os.path.basename(full))
            ti.size, ti.mtime = len(data), int(time.time())
            tf.addfile(ti, io.BytesIO(data))
        self._put_archive(os.path.dirname(full), buf.getvalue())

    def upload(self, local_dir: str, path: str) -> None:
        if not os.path.isdir(local_dir):
            raise SandboxError(f"upload: {local_dir!r} is not a directory (use write_file for one file)")
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as f:
            with tarfile.open(fileobj=f, mode="w") as tf:
                tf.add(local_dir, arcname=".", filter=self._chown)
            f.seek(0)
            self._put_archive(resolve(path, self.config.workdir), f.read())

    def download(self, path: str, dest: str | None = None) -> bytes | str:
        full = resolve(path, self.config.workdir)
        if dest is None:
            return self._read_bytes(full)
        return extract_to(self._get_archive(full), os.path.basename(full), dest)

    def _put_archive(self, dirpath: str, data: bytes) -> None:
        import docker

        cid = self._check()
        try:
            self.api.put_archive(cid, dirpath, data)
        except docker.errors.NotFound:  # the dir is missing: make it as the sandbox user, retry
            r = self.exec(f"mkdir -p -- {shlex.quote(dirpath)}", workdir="/")
            if r.exit_code != 0:
                raise SandboxError(f"cannot create {dirpath} in the sandbox: {r.output.strip()}") from None
            self.api.put_archive(cid, dirpath, data)

    def _tarinfo(self, name: str) -> tarfile.TarInfo:
        return self._chown(tarfile.TarInfo(name))

    def _chown(self, ti: tarfile.TarInfo) -> tarfile.TarInfo:
        """Files we put in belong to the sandbox user, so the agent can edit them."""
        if self._owner is None:
            self._owner = self._resolve_owner()
        ti.uid, ti.gid = self._owner
        ti.uname = ti.gname = ""
        return ti

    def _resolve_owner(self) -> tuple[int, int]:
        user = pool.effective_user(self.config)
        if not user:
            return 0, 0
        uid, _, gid = user.partition(":")
        if uid.isdigit() and (gid.isdigit() or not gid):
            return int(uid), int(gid or uid)
        r = self.exec("id -u; id -g", workdir="/")
        ids = r.output.split()
        if r.exit_code != 0 or len(ids) != 2:
            raise SandboxError(f"cannot resolve the sandbox user {user!r}: {r.output}")
        return int(ids[0]), int(ids[1])
