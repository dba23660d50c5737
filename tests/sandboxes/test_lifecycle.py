"""Lifecycle: warm pool, fast kill, cleanup after a crashed owner, exec modes, images."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sandboxes import make_sandbox, pool
from sandboxes.build_image import _sources_entries, build_task_image, debian_mirror
from tests.sandboxes.conftest import our_containers

REPO = str(Path(__file__).resolve().parents[2])


def _crash_after(code: str) -> str:
    """Run `code` in a child that then dies by SIGKILL (no atexit, no finally); its stdout."""
    script = f"import os, sys\nsys.path.insert(0, {REPO!r})\n{textwrap.dedent(code)}\nos.kill(os.getpid(), 9)\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == -9, out.stderr
    return out.stdout.strip()


@pytest.mark.docker
def test_warm_pool_hands_out_started_containers(docker_image, host_guard):
    cfg = dict(pool_size=2, memory_mb=256)
    try:
        with make_sandbox("docker", **cfg) as first:  # creates the pool; this one may be cold
            assert first.exec("echo hi").output == "hi\n"
        p = pool.warm_pool(make_sandbox("docker", **cfg).config)
        assert p.wait_full(120)
        warm_ids = {c.id for c in p.ready}
        t0 = time.monotonic()
        with make_sandbox("docker", **cfg) as sb:
            assert sb.id in warm_ids
            assert sb.exec("echo warm").output == "warm\n"
            assert time.monotonic() - t0 < 2.0
        assert sb.id not in {c["Id"] for c in pool.client(None).api.containers(all=True)}  # never reused
    finally:
        pool.shutdown_pools()
    assert our_containers() == []


@pytest.mark.docker
def test_close_kills_at_once(docker_image):
    sb = make_sandbox("docker").start()
    sb.exec("trap '' TERM; (trap '' TERM; sleep 1000) & true")
    t0 = time.monotonic()
    sb.close()
    assert time.monotonic() - t0 < 3.0  # no 10 s SIGTERM grace period
    assert sb.id not in our_containers()


@pytest.mark.docker
@pytest.mark.slow
def test_containers_of_a_crashed_run_are_removed(docker_image, host_guard):
    cid = _crash_after("""
        from sandboxes import make_sandbox
        sb = make_sandbox("docker").start()
        print(sb.id, flush=True)
    """)
    api = pool.client(None).api
    # the crash left it behind (its server may exit on the closed attach socket: running or not)
    assert cid in {c["Id"] for c in api.containers(all=True)}
    pool._swept.discard(None)
    assert pool.sweep_stale(None) >= 1
    assert cid not in {c["Id"] for c in api.containers(all=True)}


@pytest.mark.slow
def test_bwrap_leftovers_of_a_crashed_run_are_removed(bwrap_ok, tmp_path, host_guard):
    from sandboxes import bwrap_setup

    left = _crash_after(f"""
        from sandboxes import make_sandbox
        sb = make_sandbox("bwrap", tmp_root={str(tmp_path)!r}).start()
        print(sb.dir, *(sb.cgroup.dirs if sb.cgroup else []), flush=True)
    """).split()
    assert all(os.path.isdir(p) for p in left)
    bwrap_setup._swept.discard(str(tmp_path))
    with make_sandbox("bwrap", tmp_root=str(tmp_path)) as sb:
        assert sb.exec("true").ok
    assert not any(os.path.exists(p) for p in left)


@pytest.mark.docker
def test_exec_mode_exec_fallback(docker_image, host_guard):
    with make_sandbox("docker", exec_mode="exec") as sb:
        r = sb.exec("echo $((6 * 7)); id -u")
        assert r.output == "42\n1000\n"
        r = sb.exec("sleep 30 & setsid sleep 31 & while :; do :; done", timeout=1)
        assert r.timed_out and r.duration_s < 6
        sb.write_file("f", "x")
        assert sb.read_file("f") == "x"


@pytest.mark.docker
def test_agent_cannot_kill_the_command_server(docker_image):
    with make_sandbox("docker") as sb:
        sb.exec("kill -9 -1; kill -9 1")
        assert sb.exec("echo alive").output == "alive\n"


@pytest.mark.docker
@pytest.mark.slow
def test_image_without_user_runs_root_without_capabilities(docker_image):
    client = pool.client(None)
    tag = "roll-agent-test-rootuser:latest"
    client.images.build(fileobj=io.BytesIO(f"FROM {docker_image}\nUSER root\n".encode()), tag=tag, rm=True)
    try:
        with make_sandbox("docker", image=tag) as sb:
            assert sb.limits["user"].startswith("root")
            out = sb.exec("id -u; grep CapEff /proc/self/status").output
            assert out.split()[0] == "0" and "0000000000000000" in out
    finally:
        pool._users.pop((None, tag), None)
        client.images.remove(tag, force=True)


@pytest.mark.docker
@pytest.mark.slow
def test_task_image_with_repo_at_testbed(docker_image, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "test_calc.py").write_text("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    tags = [build_task_image(str(repo))]
    try:
        assert build_task_image(str(repo)) == tags[0]  # content-addressed: cached
        with make_sandbox("docker", image=tags[0], workdir="/testbed") as sb:
            r = sb.exec("python3 -m pytest -q test_calc.py 2>&1 | tail -1; git status --short | head -3")
            assert "1 passed" in r.output, r.output
            sb.write_file("calc.py", "def add(a, b):\n    return a - b\n")  # the agent may edit the repo
            assert sb.exec("python3 -m pytest -q test_calc.py").exit_code != 0
        (repo / "calc.py").write_text("def add(a, b):\n    return b + a\n")
        tags.append(build_task_image(str(repo)))
        assert tags[1] != tags[0]  # new content, new image
    finally:
        for tag in tags:
            pool.client(None).images.remove(tag, force=True)


def test_debian_mirror_from_apt_sources():
    one_line = "deb [arch=amd64] http://mirror.example/debian bookworm main\n"
    deb822 = "Types: deb\nURIs: http://m2.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
    assert list(_sources_entries(one_line)) == [("http://mirror.example/debian", ["bookworm"])]
    assert ("http://m2.example/debian", ["bookworm", "bookworm-updates"]) in list(_sources_entries(deb822))
    assert debian_mirror().startswith("http")


def test_local_keeps_a_given_workdir(tmp_path):
    with make_sandbox("local", unsafe=True, workdir=str(tmp_path)) as sb:
        sb.write_file("f.txt", "x")
    assert (tmp_path / "f.txt").read_text() == "x"


@pytest.mark.slow
def test_bwrap_as_an_unprivileged_user(bwrap_ok):
    """Run by a non-root user, bwrap isolates through a user namespace instead."""
    if os.geteuid() != 0:
        pytest.skip("this run is already unprivileged: every bwrap test covered that path")
    import shutil
    import tempfile

    home = tempfile.mkdtemp(prefix="roll-unpriv-", dir="/tmp")
    os.chown(home, 65534, 65534)
    script = textwrap.dedent("""
        import sys
        from sandboxes import make_sandbox
        with make_sandbox("bwrap") as sb:
            sb.write_file("f", "x\\n")
            print(sb.exec("id -u; cat f; cat /proc/self/status | grep CapEff").output, sb.limits["user"])
            print(sb.exec("python3 -c 'import socket; socket.create_connection((\\"127.0.0.1\\", 22), 1)'").exit_code)
    """)
    env = {"PATH": os.environ["PATH"], "HOME": home, "ROLL_AGENT_CACHE": home, "PYTHONPATH": REPO}
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
    try:
        probe = subprocess.run(argv + [sys.executable, "-c", "import sandboxes"], env=env, capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"{sys.executable} or {REPO} is not readable by an unprivileged uid")
        out = subprocess.run(argv + [sys.executable, "-c", script], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.split()
        assert lines[:3] == ["1000", "x", "CapEff:"] and "user namespace" in out.stdout, out.stdout
        assert lines[-1] != "0"  # no network
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_bwrap_extra_writable_dir_and_limits_report(bwrap_ok, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("A\n")
    with make_sandbox("bwrap", writable=("/testbed",), memory_mb=300) as sb:
        sb.upload(str(repo), "/testbed")
        assert sb.exec("cat a.txt && echo B > b.txt", workdir="/testbed").output == "A\n"
        assert sb.exec("cat /testbed/b.txt; touch /usr/x 2>&1 | grep -c Read-only").output == "B\n1\n"
        limits = sb.limits
        if os.geteuid() == 0:
            assert "cgroup v" in limits["cgroup"] and limits["memory_mb"] == 300
        else:
            assert limits["memory_mb"] is None  # says so instead of pretending


@pytest.mark.docker
def test_unresponsive_container_is_killed_at_the_host_deadline(docker_image, host_guard):
    sb = make_sandbox("docker").start()
    try:
        pool.client(None).api.pause(sb.id)  # freezes the command server too
        r = sb.exec("echo never", timeout=1)
        assert r.timed_out and "container killed" in r.output and r.duration_s < 10
        assert sb.id not in our_containers()
    finally:
        sb.close()
