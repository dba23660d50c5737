"""Fixtures for the sandbox tests.

Backends are named by "kind": local, bwrap (host root), bwrap-rootfs (the built base
rootfs) and docker. A missing prerequisite skips a test on a developer machine, but
fails it when CI is set: CI (scripts/test.sh) installs and starts everything, so a
skip there would hide a sandbox that was never tested.
"""
from __future__ import annotations

import collections
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sandboxes import make_sandbox

IN_CI = bool(os.environ.get("CI"))
KINDS = {
    "local": pytest.param("local", id="local"),
    "bwrap": pytest.param("bwrap", id="bwrap"),
    "bwrap-rootfs": pytest.param("bwrap-rootfs", id="bwrap-rootfs"),
    "docker": pytest.param("docker", marks=pytest.mark.docker, id="docker"),
}


def kinds(*names: str) -> list:
    return [KINDS[n] for n in names]


def unavailable(why: str):
    if IN_CI:
        pytest.fail(f"{why} -- CI is set, so this must run: scripts/test.sh installs and starts it")
    pytest.skip(why)


@pytest.fixture(scope="session")
def docker_image() -> str:
    try:
        from sandboxes.build_image import docker_client, ensure_base_image

        client = docker_client()
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure means: no usable daemon
        unavailable(f"no Docker daemon reachable ({type(e).__name__}: {e})")
    return ensure_base_image(client=client)


@pytest.fixture(scope="session")
def bwrap_ok() -> None:
    if shutil.which("bwrap") is None:
        unavailable("bubblewrap is not installed (apt-get install -y bubblewrap)")
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        unavailable(f"bubblewrap cannot make namespaces here: {probe.stderr.strip()}")


@pytest.fixture(scope="session")
def base_rootfs(bwrap_ok) -> Path:
    from sandboxes.build_image import build_rootfs, rootfs_path

    if not rootfs_path().is_dir():
        if os.geteuid() != 0:
            unavailable(f"no base rootfs at {rootfs_path()} (build it as root: python -m sandboxes.build_image)")
        build_rootfs()
    return rootfs_path()


def backend_config(kind: str, request) -> tuple[str, dict]:
    if kind == "local":
        return "local", {"unsafe": True}
    if kind == "bwrap":
        request.getfixturevalue("bwrap_ok")
        return "bwrap", {}
    if kind == "bwrap-rootfs":
        request.getfixturevalue("base_rootfs")
        return "bwrap", {"root": "base"}
    request.getfixturevalue("docker_image")
    return "docker", {}


@pytest.fixture
def make(kind, request):
    """make(**config) -> a started sandbox of this test's kind, closed at teardown."""
    backend, base = backend_config(kind, request)
    opened = []

    def _make(**overrides):
        sb = make_sandbox(backend, **{**base, **overrides})
        opened.append(sb)
        return sb.start()

    yield _make
    for sb in opened:
        sb.close()


# -- host state: what a test must leave exactly as it found it ----------------------

def host_pids() -> set[int]:
    """Processes this test run could have left: its descendants (every bwrap sandbox
    process descends from its bwrap), processes in its own containers, and any running
    as a host uid its bwrap sandboxes used. Other activity on the machine (another test
    run, a build, kernel threads) is not counted."""
    from sandboxes.bwrap_setup import uids as uid_pool

    me, containers, uids = os.getpid(), our_containers(), uid_pool.ever
    parent, suspects = {}, set()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            with open(f"/proc/{p}/cgroup") as f:
                cgroup = f.read()
        except OSError:
            continue
        pid = int(p)
        parent[pid] = int(status["PPid"])
        if int(status["Uid"].split()[0]) in uids or any(c in cgroup for c in containers):
            suspects.add(pid)
    for pid in parent:
        q, hops = pid, 0
        while q > 1 and hops < 64:
            if q == me and pid != me:
                suspects.add(pid)
                break
            q, hops = parent.get(q, 0), hops + 1
    return suspects


def host_mounts() -> collections.Counter:
    """Mount table, minus the mounts of containers that other runs own (they come and go)."""
    with open("/proc/self/mounts") as f:
        lines = f.read().splitlines()
    foreign = _foreign_container_paths()
    return collections.Counter(line for line in lines if not any(p in line for p in foreign))


def _foreign_container_paths() -> list[str]:
    try:
        import docker

        api = docker.from_env().api
    except Exception:  # noqa: BLE001 - no daemon: no containers
        return []
    ours, paths = set(our_containers()), []
    for c in api.containers(all=True):
        if c["Id"] in ours:
            continue
        paths.append(c["Id"])
        try:
            info = api.inspect_container(c["Id"])
            paths.append(info["GraphDriver"]["Data"]["MergedDir"].rsplit("/", 1)[0])
            if info["NetworkSettings"].get("SandboxKey"):
                paths.append(info["NetworkSettings"]["SandboxKey"])
        except Exception:  # noqa: BLE001 - removed meanwhile
            pass
    return paths


def our_containers() -> list[str]:
    try:
        import docker

        from sandboxes import procs
        from sandboxes.config import LABEL, OWNER_LABEL

        api = docker.from_env().api
        return [c["Id"] for c in api.containers(all=True, filters={"label": [f"{LABEL}=1",
                                                                             f"{OWNER_LABEL}={procs.owner_tag()}"]})]
    except Exception:  # noqa: BLE001 - no daemon: no containers
        return []


def cmdlines_containing(needle: str) -> list[str]:
    found = []
    for pid in host_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd and "pytest" not in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def wait_until(pred, timeout: float = 15.0, interval: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(interval)
    return pred()


@pytest.fixture
def host_guard():
    """Snapshot of processes, mounts and containers; after the test they must be back."""
    pids, mounts, containers = host_pids(), host_mounts(), our_containers()
    yield
    assert wait_until(lambda: not host_pids() - pids), \
        f"processes left behind: {sorted(host_pids() - pids)}"
    assert wait_until(lambda: host_mounts() == mounts), \
        f"mounts changed: +{host_mounts() - mounts} -{mounts - host_mounts()}"
    assert wait_until(lambda: our_containers() == containers), "containers left behind"
