"""bwrap backend: each exec is a fresh bubblewrap sandbox over one persistent work dir.

No daemon; an exec costs ~10-25 ms. Isolation: new pid/net/ipc/uts/cgroup namespaces,
a read-only root (the host's or a built rootfs) assembled on an empty tmpfs, only the
sandbox's own dirs writable, rlimits set inside the sandbox, and a per-sandbox cgroup
(memory, pids, cpu) when we are root.

Two ways to drop privilege, by who we are:
- not root: bwrap makes a user namespace (uid 1000 inside = you outside, no caps);
- root: bwrap sets up the namespaces as root (so the rootfs and work dirs may sit under
  /root), then `setpriv` inside makes the command a fresh unprivileged host uid, one
  per sandbox, with every capability dropped and no_new_privs: a sandbox that escaped
  its namespaces would still be a nobody, and per-uid limits (RLIMIT_NPROC) are not
  shared between sandboxes.

Processes do not outlive their exec: bwrap's pid-namespace init is killed with its
parent (--die-with-parent), which takes every process in the namespace with it.

Latency: each exec leaves the next one's bwrap started, in the cgroup, waiting for its
per-exec options (environment, cwd, the command) on a pipe (`--args`), so neither the
spawn nor the cgroup join (an RCU grace period) is on the next exec's critical path.
"""
from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path

from . import bwrap_setup, cgroups, procs
from .base import ExecResult, SandboxBase, SandboxError, resolve
from .config import SANDBOX_UID, BwrapConfig, cache_dir
from .hostfs import extract_to, rmtree, write_all

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_CMD_VAR = "__ROLL_AGENT_CMD"
# `sh -c "$cmd"` where cmd comes from the environment (and leaves it); eval keeps it one process
_EVAL = ["/bin/sh", "-c", f'__roll_agent_cmd=${_CMD_VAR}; unset {_CMD_VAR}; eval "$__roll_agent_cmd"']


class BwrapSandbox(SandboxBase):
    config_class = BwrapConfig

    def __init__(self, config: BwrapConfig):
        self.config = config
        self.dir: Path | None = None
        self.cgroup: cgroups.Cgroup | None = None
        self._running: set[subprocess.Popen] = set()
        self._ready: list[tuple[subprocess.Popen, int]] = []  # bwraps waiting for their arguments
        self._inflight = 0
        self._lock = threading.RLock()
        self._closed = False
        self._as_root = os.geteuid() == 0
        self.uid = SANDBOX_UID
        self.limits: dict = {}

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> "BwrapSandbox":
        if self.dir is not None:
            return self
        try:
            return self._start()
        except BaseException:
            self.close()  # a half-made sandbox (dir, cgroup, uid) must not linger
            raise

    def _start(self) -> "BwrapSandbox":
        cfg = self.config
        if shutil.which(cfg.bwrap) is None:
            raise SandboxError(f"bubblewrap not found ({cfg.bwrap!r}); install it: apt-get install -y bubblewrap")
        root = bwrap_setup.root_path(cfg.root)
        self._track_live()
        tmp_root = Path(cfg.tmp_root or cache_dir() / "bwrap")
        tmp_root.mkdir(parents=True, exist_ok=True)
        mode, why = cgroups.probe()
        bwrap_setup.sweep(tmp_root, mode)
        name = f"{procs.owner_tag()}-{secrets.token_hex(4)}"
        self.dir = tmp_root / f"sb-{name}"
        self.dir.mkdir(mode=0o700)
        self._mounts = {"/tmp": self.dir / "tmp"}
        for i, p in enumerate((cfg.workdir, *cfg.writable)):
            self._mounts[p.rstrip("/")] = self.dir / f"w{i}"
        if self._as_root:
            self.uid = bwrap_setup.uids.acquire(cfg.host_uid_base)
        for host in self._mounts.values():
            host.mkdir()
            if self._as_root:  # the unprivileged host uid must own what the sandbox writes
                os.chown(host, self.uid, self.uid)
        if mode:
            try:
                self.cgroup = cgroups.Cgroup.create(mode, name, cfg.memory_mb, cfg.pids, cfg.cpus)
            except OSError as e:
                mode, why = None, f"cgroups skipped: {e}"
        self._prefix = self._static_args(root)
        self.limits = self._limits_report(root, why)
        with self._lock:
            self._ready.append(self._spawn_waiting())
        return self

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = list(self._running)
            for _, w in self._ready:
                os.close(w)
            self._ready.clear()
        for proc in running:
            procs.kill_group(proc)
        for proc in running:  # reap them (collect() reaps the ones it is waiting for too)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if proc.stdout:
                proc.stdout.close()
        if self.cgroup:
            self.cgroup.remove()
        if self.dir is not None:
            rmtree(self.dir)
        if self.uid != SANDBOX_UID:
            bwrap_setup.uids.release(self.uid)

    # -- commands --------------------------------------------------------------
    def exec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None,
             workdir: str | None = None) -> ExecResult:
        t0 = time.monotonic()
        if "\0" in cmd:
            raise ValueError("a command cannot contain NUL characters")
        # bwrap takes options from the pipe but not the command, so the command line is
        # the fixed _EVAL and the command itself travels in an environment variable
        args = self._exec_options({**(env or {}), _CMD_VAR: cmd}, workdir)
        self._begin()
        try:
            proc, w = self._take_waiting()
            try:
                write_all(w, b"".join(a.encode() + b"\0" for a in args))
            except OSError:
                pass  # bwrap is gone (killed by close()); collect() reports its exit
            finally:
                os.close(w)
            c = procs.collect(proc, t0=t0, timeout=timeout or self.config.timeout,
                              limit=self.config.max_output_bytes, on_exit=self._untrack)
        except SandboxError:
            raise
        except Exception as exc:
            if self._closed:  # close() tore the sandbox down under this exec (pipes, procs)
                raise SandboxError(f"sandbox closed during exec: {type(exc).__name__}: {exc}") from exc
            raise
        finally:
            self._end()
        return ExecResult(c.returncode, c.out.text(), c.timed_out, c.duration_s)

    def _take_waiting(self) -> tuple[subprocess.Popen, int]:
        with self._lock:
            while self._ready:
                proc, w = self._ready.pop()
                if proc.poll() is None:
                    return proc, w
                os.close(w)  # died while waiting (killed from outside): never hand it out
                proc.stdout.close()
                self._untrack(proc)
        return self._spawn_waiting()

    def _spawn_waiting(self) -> tuple[subprocess.Popen, int]:
        """A bwrap that has joined the cgroup and now waits for its arguments on a pipe.

        Joining a cgroup costs milliseconds of waiting (measured ~7 ms here; the kernel
        syncs with RCU), so each exec leaves the next one's bwrap ready in the cgroup.
        """
        r, w = os.pipe()
        # isolation is all on the command line: were the pipe to close unwritten (we
        # crashed), bwrap would still run sandboxed, evaluating an empty command
        argv = [*self._prefix, "--args", str(r), "--", *self._setpriv_args(), *self._rlimit_args(), *_EVAL]
        try:
            proc = procs.spawn(self._join_cgroup(argv), pass_fds=(r,), env={"PATH": _PATH})
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._track(proc)
        return proc, w

    def _join_cgroup(self, argv: list[str]) -> list[str]:
        if not self.cgroup:
            return argv
        join = "".join(f"echo $$ > {shlex.quote(f)} && " for f in self.cgroup.procs_files)
        return ["/bin/sh", "-c", join + 'exec "$@"', "sh", *argv]

    def _begin(self) -> None:
        with self._lock:
            if self.dir is None or self._closed:
                raise SandboxError("bwrap sandbox is not running: call start() (or use it as a context manager)")
            self._inflight += 1

    def _end(self) -> None:
        with self._lock:  # held while killing/refilling: no exec of this sandbox starts meanwhile
            self._inflight -= 1
            if self._closed:
                return
            if self.cgroup and not self._inflight:  # belt and braces (the pid namespace did it)
                self.cgroup.kill(exclude=frozenset(p.pid for p, _ in self._ready))
            if not self._ready:
                self._ready.append(self._spawn_waiting())

    def _exec_options(self, env: dict | None, workdir: str | None) -> list[str]:
        """The bwrap options that change per exec: environment and cwd."""
        cfg = self.config
        sandbox_env = {"PATH": _PATH, "HOME": cfg.workdir, "USER": "agent", "LOGNAME": "agent",
                       "LANG": "C.UTF-8", "TERM": "dumb", **cfg.env, **(env or {})}
        env_args = ["--clearenv"] + [a for k, v in sandbox_env.items() for a in ("--setenv", k, v)]
        return [*env_args, "--chdir", resolve(workdir or cfg.workdir, cfg.workdir)]

    def _run(self, argv, limit=None, stdin=None) -> procs.Completed:
        """For file operations: stdin data in, stdout and stderr apart."""
        full = [*self._prefix, *self._exec_options(None, None), "--", *self._setpriv_args(),
                *self._rlimit_args(), *argv]
        self._begin()
        try:
            return procs.run(self._join_cgroup(full), timeout=self.config.timeout,
                             limit=limit, stdin=stdin, merge_stderr=False, env={"PATH": _PATH},
                             on_spawn=self._track, on_exit=self._untrack)
        finally:
            self._end()

    def _track(self, proc):
        with self._lock:
            if self._closed:
                procs.kill_group(proc)
            self._running.add(proc)

    def _untrack(self, proc):
        with self._lock:
            self._running.discard(proc)

    def _static_args(self, root: str) -> list[str]:
        """The bwrap arguments that do not change between execs (computed once)."""
        cfg = self.config
        args = [cfg.bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--hostname", "sandbox", "--die-with-parent", "--new-session"]
        if not self._as_root:
            args += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns",
                     "--cap-drop", "ALL"]
        if not cfg.share_net:
            args.append("--unshare-net")
        hide = [h for h in (cfg.hide if root == "/" else ()) if bwrap_setup.is_real_dir(root, h)]
        args += bwrap_setup.root_args(root, skip=self._mounts)
        for h in hide:  # empty tmpfs over dirs that hold secrets (homes, runtime sockets)
            args += ["--size", str(1 << 20), "--tmpfs", h]
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(64 << 20), "--tmpfs", "/dev/shm"]
        for path, host in self._mounts.items():
            args += ["--bind", str(host), path]
        for h in hide:  # after the binds, so a work dir may live under a hidden dir
            args += ["--remount-ro", h]
        return args + ["--remount-ro", "/"]

    def _rlimit_args(self) -> list[str]:
        # Set inside the sandbox (prlimit runs after bwrap): RLIMIT_NPROC then counts the
        # sandbox's own uid (root) or user namespace (not root), never all of your processes.
        cfg = self.config
        mb = 1024 * 1024
        addr = (cfg.address_space_mb or 4 * cfg.memory_mb) * mb
        return ["prlimit", f"--as={addr}", f"--cpu={cfg.cpu_seconds}", f"--nproc={cfg.pids}",
                f"--fsize={cfg.file_size_mb * mb}", f"--nofile={cfg.nofile}", "--core=0", "--"]

    def _setpriv_args(self) -> list[str]:
        if not self._as_root:
            return []  # the user namespace already made us unprivileged
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--"]

    def _limits_report(self, root: str, cgroup_note: str) -> dict:
        cfg = self.config
        return {"backend": "bwrap", "root": root, "network": "shared" if cfg.share_net else "none",
                "user": f"unprivileged host uid {self.uid}, no capabilities" if self._as_root
                        else f"uid {SANDBOX_UID} in a user namespace (your uid outside)",
                "rlimits": {"address_space_mb": cfg.address_space_mb or 4 * cfg.memory_mb, "nproc": cfg.pids,
                            "cpu_seconds": cfg.cpu_seconds, "file_size_mb": cfg.file_size_mb},
                "cgroup": cgroup_note,
                "memory_mb": cfg.memory_mb if self.cgroup else None, "pids": cfg.pids,
                "cpus": cfg.cpus if self.cgroup else None,
                "processes_survive_exec": False}

    # -- files: done by commands inside the sandbox, so a symlink planted by the agent
    # resolves in the sandbox's view, never the host's --------------------------------
    def read_file(self, path: str) -> str:
        return self._read_bytes(path).decode("utf-8", errors="replace")

    def _read_bytes(self, path: str) -> bytes:
        c = self._run(["cat", "--", resolve(path, self.config.workdir)])
        if c.returncode != 0:
            raise _file_error("read", path, c)
        return c.out.getvalue()

    def write_file(self, path: str, content: str | bytes) -> None:
        data = content.encode() if isinstance(content, str) else content
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        c = self._run(["/bin/sh", "-c", script, "sh", resolve(path, self.config.workdir)], stdin=data)
        if c.returncode != 0:
            raise _file_error("write", path, c)

    def upload(self, local_dir: str, path: str) -> None:
        if not os.path.isdir(local_dir):
            raise SandboxError(f"upload: {local_dir!r} is not a directory (use write_file for one file)")
        packer = subprocess.Popen(["tar", "-C", local_dir, "-cf", "-", "."], stdout=subprocess.PIPE)
        try:
            script = 'mkdir -p -- "$1" && tar -C "$1" -xf - --no-same-owner'
            c = self._run(["/bin/sh", "-c", script, "sh", resolve(path, self.config.workdir)], stdin=packer.stdout)
        finally:
            packer.stdout.close()
            packer.wait()
        if c.returncode != 0:
            raise _file_error("upload to", path, c)

    def download(self, path: str, dest: str | None = None) -> bytes | str:
        full = resolve(path, self.config.workdir)
        if dest is None:
            return self._read_bytes(full)
        parent, name = os.path.split(full)
        c = self._run(["tar", "-C", parent or "/", "-cf", "-", "--", name])
        if c.returncode != 0:
            raise _file_error("download", path, c)
        return extract_to(c.out.getvalue(), name, dest)


def _file_error(what: str, path: str, c: procs.Completed) -> Exception:
    msg = c.err.text().strip() if c.err else ""
    if "No such file" in msg:
        return FileNotFoundError(f"sandbox: cannot {what} {path}: {msg}")
    return SandboxError(f"sandbox: cannot {what} {path} (exit {c.returncode}): {msg}")
