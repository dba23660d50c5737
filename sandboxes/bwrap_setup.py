"""What a bwrap sandbox is made of on the host: its root, its host uid, and the sweep
of what crashed runs left (work dirs, cgroups)."""
from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path

from . import cgroups, procs
from .base import SandboxError
from .hostfs import rmtree

NOT_FROM_ROOT = {"proc", "dev", "sys", "tmp"}  # replaced by fresh mounts
_swept: set[str] = set()
_sweep_lock = threading.Lock()


def root_path(root: str | None) -> str:
    if root is None:
        return "/"
    if root == "base":
        from .build_image import rootfs_path

        path = rootfs_path()
        if not path.is_dir():
            raise SandboxError(f"the base rootfs is not built ({path}); run: python -m sandboxes.build_image")
        return str(path)
    if not os.path.isdir(root):
        raise SandboxError(f"bwrap root {root!r} is not a directory")
    return root


def root_args(root: str, skip) -> list[str]:
    """Read-only binds of the root's top-level entries onto bwrap's empty tmpfs root.

    Binding entry by entry (rather than `/` itself) lets new mount points such as the
    work dir be created in the tmpfs, which is remounted read-only at the end.
    """
    args = []
    tops = {p.strip("/") for p in skip if p.count("/") == 1}  # top-level dirs we replace
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name in NOT_FROM_ROOT or entry.name in tops:
            continue
        dest = "/" + entry.name
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry.path), dest]
        else:
            args += ["--ro-bind", entry.path, dest]
    return args


def is_real_dir(root: str, path: str) -> bool:
    full = os.path.join(root, path.lstrip("/"))
    return os.path.isdir(full) and not os.path.islink(full)


class _UidPool:
    """Host uids for root-run sandboxes: one each, so per-uid limits are per sandbox."""

    def __init__(self, size: int = 65536):
        self.size = size
        self.used: set[int] = set()
        self.ever: set[int] = set()  # for audits: every uid this process handed out
        self.lock = threading.Lock()

    def acquire(self, base: int) -> int:
        # start at a random slot: another process making sandboxes picks other uids
        with self.lock:
            start = secrets.randbelow(self.size)
            for i in range(self.size):
                uid = base + (start + i) % self.size
                if uid not in self.used:
                    self.used.add(uid)
                    self.ever.add(uid)
                    return uid
        raise SandboxError("no free sandbox uid")

    def release(self, uid: int) -> None:
        with self.lock:
            self.used.discard(uid)


uids = _UidPool()


def sweep(tmp_root: Path, cgroup_mode: str | None) -> None:
    """Once per process: remove dirs and cgroups of sandboxes whose owner process died."""
    with _sweep_lock:
        if str(tmp_root) in _swept:
            return
        _swept.add(str(tmp_root))
    for d in tmp_root.glob("sb-*"):
        tag = d.name[3:].rsplit("-", 1)[0]
        if not procs.owner_alive(tag):
            rmtree(d)
    cgroups.sweep_stale(cgroup_mode)
