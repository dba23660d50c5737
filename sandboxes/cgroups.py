"""Per-sandbox cgroups for the bwrap backend, where the host lets us make them.

rlimits are per process; a cgroup bounds the whole sandbox (total memory, process
count, CPU share) and lets us kill everything in it at once. They need root (or a
delegated subtree), so they are best effort: `probe()` says why not, and the sandbox
reports it in its `limits`.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from . import procs

ROOT = Path("/sys/fs/cgroup")
GROUP = "roll_agent"


def probe() -> tuple[str | None, str]:
    """("v2" | "v1" | None, why)."""
    if os.geteuid() != 0:
        return None, "cgroups skipped: not root (rlimits still apply)"
    if (ROOT / "cgroup.controllers").exists():
        have = (ROOT / "cgroup.controllers").read_text().split()
        if {"memory", "pids"} <= set(have):
            return "v2", "cgroup v2"
        return None, f"cgroups skipped: v2 without memory/pids controllers ({have})"
    if (ROOT / "memory").is_dir() and (ROOT / "pids").is_dir():
        return "v1", "cgroup v1 (memory, pids, cpu)"
    return None, "cgroups skipped: no memory/pids controller mounted"


class Cgroup:
    """One sandbox's cgroup (a directory per controller on v1, one directory on v2)."""

    def __init__(self, mode: str, name: str):
        self.mode = mode
        if mode == "v2":
            self.dirs = [ROOT / GROUP / name]
        else:
            self.dirs = [ROOT / c / GROUP / name for c in ("memory", "pids", "cpu") if (ROOT / c).is_dir()]

    @classmethod
    def create(cls, mode: str, name: str, memory_mb: int, pids: int, cpus: float | None) -> "Cgroup":
        if mode == "v2":
            _enable_v2_controllers(cpus is not None)
        cg = cls(mode, name)
        for d in cg.dirs:
            d.mkdir(parents=True, exist_ok=True)
        mem = str(memory_mb * 1024 * 1024)
        try:
            if mode == "v2":
                cg._write("memory.max", mem)
                cg._write("memory.swap.max", "0", required=False)
                cg._write("pids.max", str(pids))
                if cpus:
                    cg._write("cpu.max", f"{int(cpus * 100_000)} 100000", required=False)
            else:
                cg._write("memory.limit_in_bytes", mem)
                cg._write("memory.memsw.limit_in_bytes", mem, required=False)
                cg._write("pids.max", str(pids))
                if cpus:
                    cg._write("cpu.cfs_period_us", "100000", required=False)
                    cg._write("cpu.cfs_quota_us", str(int(cpus * 100_000)), required=False)
        except OSError:
            cg.remove()
            raise
        return cg

    def _write(self, fname: str, value: str, required: bool = True) -> None:
        done = False
        for d in self.dirs:
            if (d / fname).exists():
                (d / fname).write_text(value)
                done = True
        if required and not done:
            raise OSError(f"cgroup file {fname} not found under {self.dirs}")

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        found = set()
        for f in self.procs_files:
            try:
                found |= {int(x) for x in Path(f).read_text().split()}
            except OSError:
                pass
        return found

    def kill(self, exclude: frozenset[int] = frozenset()) -> None:
        """Kill everything in the cgroup but `exclude`; repeat, since a fork may race the first pass."""
        if self.mode == "v2" and not exclude and (self.dirs[0] / "cgroup.kill").exists():
            try:
                (self.dirs[0] / "cgroup.kill").write_text("1")
            except OSError:
                pass
        for _ in range(50):
            left = self.pids() - exclude
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill()
        for d in self.dirs:
            for _ in range(100):  # rmdir fails (EBUSY) until the killed tasks are reaped
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def _enable_v2_controllers(cpu: bool) -> None:
    want = ["+memory", "+pids"] + (["+cpu"] if cpu else [])
    (ROOT / GROUP).mkdir(exist_ok=True)
    for d in (ROOT, ROOT / GROUP):
        for c in want:
            try:
                (d / "cgroup.subtree_control").write_text(c)
            except OSError:
                pass  # already on, or not available (cpu): limits then report it missing


def sweep_stale(mode: str | None) -> None:
    """Remove cgroups left by crashed runs (their owner process is gone)."""
    if mode is None:
        return
    parents = [ROOT / GROUP] if mode == "v2" else [ROOT / c / GROUP for c in ("memory", "pids", "cpu")]
    names = set()
    for p in parents:
        if p.is_dir():
            names |= {d.name for d in p.iterdir() if d.is_dir()}
    for name in names:
        if not procs.owner_alive(name.rsplit("-", 1)[0]):
            Cgroup(mode, name).remove()
