"""50 sandboxes at once, then nothing left behind: no containers, processes, mounts,
work dirs or cgroups."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sandboxes import make_sandbox, procs
from tests.sandboxes.conftest import backend_config, kinds, our_containers

N = 50
pytestmark = pytest.mark.slow


@pytest.fixture(params=kinds("bwrap", "docker"))
def kind(request):
    return request.param


def _cgroups() -> list[str]:
    """This process's sandbox cgroups (named after their owner; other runs may have theirs)."""
    root, mine = Path("/sys/fs/cgroup"), procs.owner_tag() + "-"
    return sorted(str(p) for d in (root / "roll_agent", *root.glob("*/roll_agent")) if d.is_dir()
                  for p in d.iterdir() if p.is_dir() and p.name.startswith(mine))


def test_fifty_concurrent_sandboxes_leave_nothing(kind, request, host_guard, tmp_path):
    backend, cfg = backend_config(kind, request)
    if backend == "bwrap":
        cfg = {**cfg, "tmp_root": str(tmp_path / "sbx")}
    cgroups_before = _cgroups()
    all_up = asyncio.Event()
    up = 0

    async def one(i: int) -> str:
        nonlocal up
        async with make_sandbox(backend, memory_mb=256, pids=64, **cfg) as sb:
            up += 1
            if up == N:
                all_up.set()
            await asyncio.wait_for(all_up.wait(), 600)  # all N exist at the same time
            if i == 0 and backend == "docker":
                assert len(our_containers()) >= N
            await sb.awrite_file("n.txt", str(i))
            r = await sb.aexec("echo $(( $(cat n.txt) * 2 ))")
            return r.output.strip()

    async def main():  # the async API's own thread pool lets all N run at once
        return await asyncio.gather(*(one(i) for i in range(N)))

    assert asyncio.run(main()) == [str(2 * i) for i in range(N)]
    assert our_containers() == []
    assert _cgroups() == cgroups_before
    if backend == "bwrap":
        assert os.listdir(tmp_path / "sbx") == []  # per-sandbox dirs all removed
