"""Typed configs for the sandbox backends, and where the sandbox caches live.

Each backend takes exactly its own dataclass; a misspelt key is an error naming the
closest valid one, because a silently ignored `memory_mb` would be a sandbox with no
memory limit.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Any

from roll_agent.registry import SANDBOXES

BASE_IMAGE = "roll-agent-base:latest"
SANDBOX_UID = 1000  # the non-root user baked into the base image / rootfs
LABEL = "roll_agent.sandbox"
OWNER_LABEL = "roll_agent.owner"


def cache_dir() -> Path:
    """Rootfs, build contexts and bwrap work dirs live here (override: ROLL_AGENT_CACHE)."""
    root = os.environ.get("ROLL_AGENT_CACHE") or os.path.expanduser("~/.cache/roll_agent")
    return Path(root) / "sandboxes"


@dataclasses.dataclass
class _Common:
    timeout: float = 60.0  # default exec timeout, seconds
    max_output_bytes: int = 64_000  # head+tail kept; the middle is replaced by a note
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # added to every exec

    def __post_init__(self):
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.max_output_bytes < 256:
            raise ValueError(f"max_output_bytes must be >= 256, got {self.max_output_bytes}")


@dataclasses.dataclass
class _Limits:
    memory_mb: int = 1024
    pids: int = 256  # processes + threads; bounds fork bombs
    cpus: float | None = 1.0  # CPU quota in cores (None: no quota)
    file_size_mb: int = 256  # largest file a command may write (RLIMIT_FSIZE)
    nofile: int = 1024


@dataclasses.dataclass
class LocalConfig(_Common):
    unsafe: bool = False  # must be True: local runs commands on the host as you
    workdir: str | None = None  # host dir; None: a fresh temp dir removed at close


@dataclasses.dataclass
class BwrapConfig(_Common, _Limits):
    # None: the host's root, read-only; "base": the rootfs built by build_image; or a path.
    root: str | None = None
    workdir: str = "/workspace"  # writable, persists across execs of one sandbox
    writable: tuple[str, ...] = ()  # more writable sandbox dirs (e.g. "/testbed")
    # With the host root, these are replaced by empty tmpfs: homes and runtime dirs hold secrets.
    hide: tuple[str, ...] = ("/root", "/home", "/run", "/var/tmp", "/var/run", "/mnt", "/media", "/srv")
    cpu_seconds: int = 3600  # RLIMIT_CPU per process
    address_space_mb: int | None = None  # RLIMIT_AS; None: 4 x memory_mb (virtual > resident)
    host_uid_base: int = 3_000_000  # when run as root: each sandbox gets its own host uid from here on
    share_net: bool = False
    tmp_root: str | None = None  # host dir for per-sandbox dirs; default <cache>/bwrap
    bwrap: str = "bwrap"

    def __post_init__(self):
        super().__post_init__()
        self.writable = tuple(self.writable)
        for p in (self.workdir, *self.writable):
            if not p.startswith("/") or p.rstrip("/") in ("", "/proc", "/dev", "/tmp"):
                raise ValueError(f"bwrap writable dir {p!r} must be an absolute path other than /, /proc, /dev, /tmp")


@dataclasses.dataclass
class DockerConfig(_Common, _Limits):
    image: str = BASE_IMAGE
    workdir: str = "/workspace"
    # "auto": the image's USER when it sets one (the base image: uid 1000), else root
    # with every capability dropped. Or any `docker run --user` value.
    user: str = "auto"
    network: str = "none"
    pool_size: int = 0  # warm containers kept started for this config
    # "server": a python3 command server is the container's main process (an exec is a
    # fork, ~5 ms); "exec": one `docker exec` per command (~60-90 ms; images without python3).
    exec_mode: str = "server"
    docker_host: str | None = None  # None: DOCKER_HOST or the local socket
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    shm_mb: int = 64

    def __post_init__(self):
        super().__post_init__()
        if self.exec_mode not in ("server", "exec"):
            raise ValueError(f"exec_mode must be 'server' or 'exec', got {self.exec_mode!r}")
        if self.pool_size < 0:
            raise ValueError(f"pool_size must be >= 0, got {self.pool_size}")


def make_config(backend: str, values: dict[str, Any]):
    """The options of the sandbox backend named `backend` (roll_agent/registry.py: SANDBOXES, or a
    user's `module:Class`) as its `config_class`, every key checked."""
    cls = SANDBOXES.get(backend).config_class
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"unknown {backend} sandbox option {key!r}{hint} Valid options: {', '.join(sorted(valid))}")
    return cls(**values)
