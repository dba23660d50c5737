"""Escape suite: what an agent command tries, the sandbox must stop, and the host must be
unaffected afterwards (host_guard checks processes, mounts and containers after each).
"""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.sandboxes.conftest import cmdlines_containing, host_pids, kinds, wait_until

pytestmark = pytest.mark.slow
TIGHT = dict(memory_mb=256, pids=64, file_size_mb=16, timeout=20)


@pytest.fixture(params=kinds("docker", "bwrap", "bwrap-rootfs"))
def kind(request):
    return request.param


@pytest.fixture
def sb(host_guard, make):
    return make(**TIGHT)


class _Listener:
    """A TCP server on the host counting who got through."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            conn.close()


def _host_addresses() -> list[str]:
    addrs = {"127.0.0.1", "172.17.0.1"}  # loopback and docker's default bridge gateway
    try:
        addrs |= {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except OSError:
        pass
    return sorted(addrs)


def test_network_egress_blocked(sb):
    srv = _Listener()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=2):
        pass  # the server is reachable from the host itself
    assert wait_until(lambda: srv.hits == 1, 5)
    script = (f"import socket\nfor a in {_host_addresses()!r}:\n"
              f"    try:\n        socket.create_connection((a, {srv.port}), timeout=2); print('CONNECTED', a)\n"
              f"    except OSError as e: print('blocked', a, e)\n")
    r = sb.exec(f"python3 -c {_q(script)}")
    assert "CONNECTED" not in r.output, r.output
    assert srv.hits == 1
    dns = sb.exec("getent hosts deb.debian.org || python3 -c \"import socket; socket.getaddrinfo('pypi.org', 443)\"")
    assert dns.exit_code != 0, dns.output
    srv.sock.close()


def test_secret_outside_unreadable(sb, tmp_path):
    secret = "TOPSECRET-" + secrets.token_hex(8)
    paths = [tmp_path / "secret.txt", os.path.expanduser("~/.roll_agent_test_secret")]
    for p in paths:
        with open(p, "w") as f:
            f.write(secret)
        os.chmod(p, 0o600)
    try:
        r = sb.exec("; ".join(f"cat {p}" for p in paths) + "; ls -la ~ /root 2>&1 | head -5")
        assert secret not in r.output
        sock = sb.exec("ls /var/run/docker.sock /run/docker.sock /run/containerd 2>/dev/null; echo n=$?")
        assert "docker.sock" not in sock.output  # the docker daemon would be root on the host
    finally:
        os.unlink(paths[1])


def test_writes_outside_workdir_do_not_reach_host(sb, tmp_path):
    tag = secrets.token_hex(6)
    targets = [f"/etc/roll_escape_{tag}", f"/usr/roll_escape_{tag}", f"/tmp/roll_escape_{tag}",
               f"/var/tmp/roll_escape_{tag}", str(tmp_path / "escape"), f"/roll_escape_{tag}"]
    sb.exec("; ".join(f"echo x > {t}" for t in targets) + "; echo ok > inside")
    for t in targets:
        assert not os.path.exists(t), t
    assert sb.read_file("inside") == "ok\n"


def test_fork_bomb_contained(sb):
    before = len(host_pids())
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], len(host_pids()))
            time.sleep(0.05)

    t = threading.Thread(target=sample)
    t.start()
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    try:
        r = sb.exec(f"python3 -c {_q(bomb)}", timeout=4)
    finally:
        stop.set()
        t.join()
    assert r.timed_out
    assert peak[0] - before <= TIGHT["pids"] + 15, f"{peak[0] - before} processes: pids limit not enforced"
    assert wait_until(lambda: len(host_pids()) <= before + 3), "fork bomb processes survived"
    assert sb.exec("echo alive").output == "alive\n"


def test_memory_bomb_killed(sb):
    bomb = "l = []\nfor i in range(400):\n    l.append(b'x' * 10**7)\nprint('survived')\n"
    r = sb.exec(f"python3 -c {_q(bomb)}", timeout=60)
    assert r.exit_code != 0 and "survived" not in r.output, r
    assert sb.exec("echo alive").output == "alive\n"


def test_disk_fill_bounded(sb):
    r = sb.exec("head -c 100000000 /dev/zero > big; stat -c %s big")
    size = int(r.output.split()[-1])
    assert size <= TIGHT["file_size_mb"] * 1024 * 1024, r.output


def test_timeout_kills_whole_tree(sb):
    marks = [str(40000 + secrets.randbelow(20000) * 3 + i) for i in range(3)]
    cmd = (f"sleep {marks[0]} & setsid sleep {marks[1]} & sh -c 'sleep {marks[2]}; true' & "
           "while :; do :; done")
    r = sb.exec(cmd, timeout=2)
    assert r.timed_out and r.duration_s < 8, r
    for m in marks:
        assert wait_until(lambda: not cmdlines_containing(f"sleep {m}"), 5), cmdlines_containing(f"sleep {m}")
    assert sb.exec("echo alive").output == "alive\n"


def test_cannot_signal_host_processes(sb):
    victim = subprocess.Popen(["sleep", "600"])
    try:
        r = sb.exec(f"kill -9 {victim.pid}; echo rc=$?; kill -9 -1; true")
        assert "rc=0" not in r.output
        time.sleep(0.2)
        assert victim.poll() is None, "a host process was killed from inside the sandbox"
    finally:
        victim.kill()
        victim.wait()


def test_mount_and_setuid_refused(sb):
    r = sb.exec("mkdir -p m; mount -t tmpfs none m; echo mount_rc=$?; "
                "python3 -c 'import os; os.setuid(0)' 2>/dev/null; echo setuid_rc=$?; "
                "chroot / true 2>/dev/null; echo chroot_rc=$?; "
                "grep -E '^(NoNewPrivs|CapEff)' /proc/self/status")
    out = r.output
    assert "mount_rc=0" not in out and "setuid_rc=0" not in out and "chroot_rc=0" not in out, out
    assert "NoNewPrivs:\t1" in out and "CapEff:\t0000000000000000" in out, out


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
