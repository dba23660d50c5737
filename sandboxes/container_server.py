"""Command server: the main process of a docker sandbox (`python3 -u -c <this file>`).

A `docker exec` costs ~60-90 ms of runc work per command on a small machine; this
server, attached to over the container's stdin/stdout, makes an exec cost one fork.
Protocol: one JSON request per line on stdin; each answer is a JSON header line
followed by exactly `n` raw output bytes on stdout. Commands get their own pipes, so
nothing they print can corrupt the protocol stream.

The server runs as root with only CAP_SETUID/SETGID/KILL; commands run as the sandbox
user (ROLL_AGENT_USER) with no capabilities at all, so an agent's `kill -9 -1` cannot
take the server down with it.

Runs inside the container with the image's python3: standard library only, and no
imports from the host package.
"""
import grp
import json
import os
import pwd
import selectors
import signal
import subprocess
import sys
import time

LINGER_S = 0.2  # after the command exits, how long children holding its pipe may keep us
# The OOM killer should pick a runaway command, not this server.
PREFIX = 'echo 1000 > /proc/self/oom_score_adj 2>/dev/null; exec /bin/sh -c "$0"'


class Buf:
    """Head and tail of the output within `limit` bytes (the host adds no copy of its own)."""

    def __init__(self, limit):
        self.limit, self.head, self.tail, self.total = limit, bytearray(), bytearray(), 0

    def feed(self, data):
        self.total += len(data)
        room = self.limit // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        keep = self.limit - self.limit // 2
        if len(self.tail) > 2 * keep + 65536:
            del self.tail[:-keep]

    def value(self):
        keep = self.limit - self.limit // 2
        if self.total <= self.limit:
            return bytes(self.head + self.tail)
        tail = bytes(self.tail[-keep:]) if keep else b""
        dropped = self.total - len(self.head) - len(tail)
        note = "\n[... %d bytes of output truncated (limit max_output_bytes=%d) ...]\n" % (dropped, self.limit)
        return bytes(self.head) + note.encode() + tail


def pump(proc, buf, deadline):
    """Copy output until EOF; False if the deadline passed first."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    os.set_blocking(proc.stdout.fileno(), False)
    exited = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return False
            if exited is None and proc.poll() is not None:
                exited = now
            if exited is not None and now - exited > LINGER_S:
                return True  # background children keep the pipe; they may run on
            for key, _ in sel.select(max(min(deadline - now, 0.05), 0.001)):
                data = os.read(key.fd, 65536)
                if data:
                    buf.feed(data)
                else:
                    sel.unregister(key.fileobj)
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            return False
        return True
    finally:
        sel.close()


# Finds and kills processes carrying an exec's marker in their environment. Run as the
# sandbox user: reading another uid's /proc/PID/environ would take ptrace rights.
SCAN = """
import os, signal, sys
mark = sys.argv[1].encode()
for _ in range(3):  # again: a marked process may have forked while we scanned
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open("/proc/%s/environ" % pid, "rb") as f:
                    if mark in f.read().split(b"\\0"):
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
"""


def kill_tree(proc, mark):
    """The process group, then anything else carrying this exec's marker (setsid'd children)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    ids = {"user": USER[0], "group": USER[1], "extra_groups": []} if USER else {}
    try:
        subprocess.run([sys.executable, "-c", SCAN, mark], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=10, **ids)
    except (OSError, subprocess.SubprocessError):
        pass  # cannot spawn (pids limit): the group kill above is what we have


def sandbox_user(spec):
    """"name|uid[:group|gid]" -> (uid, gid, home), or None to run commands as ourselves."""
    if not spec:
        return None
    user, _, group = spec.partition(":")
    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        uid, gid, home = pw.pw_uid, pw.pw_gid, pw.pw_dir
    except KeyError:
        uid, gid, home = int(user), int(user), "/"
    if group:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    return uid, gid, home


USER = sandbox_user(os.environ.pop("ROLL_AGENT_USER", ""))


def run(req):
    env = dict(os.environ)
    ids = {}
    if USER:
        ids = {"user": USER[0], "group": USER[1], "extra_groups": []}
        if env.get("HOME") in (None, "/root"):
            env["HOME"] = USER[2]
    env.update(req.get("env") or {})
    env["ROLL_AGENT_EXEC"] = req["mark"]
    t0 = time.monotonic()
    proc = subprocess.Popen(["/bin/sh", "-c", PREFIX, req["cmd"]], cwd=req.get("cwd"), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, **ids)
    buf = Buf(req["limit"])
    try:
        timed_out = not pump(proc, buf, t0 + req["timeout"])
        if timed_out:
            kill_tree(proc, "ROLL_AGENT_EXEC=" + req["mark"])
        rc = proc.wait()
    finally:
        proc.stdout.close()
    return {"rc": 128 - rc if rc < 0 else rc, "timed_out": timed_out, "dur": time.monotonic() - t0}, buf.value()


def main():
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if req.get("op") == "ping":
            head, data = {}, b""
        else:
            try:
                head, data = run(req)
            except Exception as e:  # cannot spawn (pids limit, missing cwd): report, keep serving
                head, data = {"rc": 126, "timed_out": False, "dur": 0.0}, ("sandbox: %s\n" % e).encode()
        head.update(id=req.get("id"), n=len(data))
        out.write(json.dumps(head).encode() + b"\n" + data)
        out.flush()


if __name__ == "__main__":  # python3 -c runs this as __main__; importing it does nothing
    main()
