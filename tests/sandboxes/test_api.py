"""The sandbox contract, the same for every backend."""
from __future__ import annotations

import asyncio
import os

import pytest

from sandboxes import ExecResult, OutputBuffer, Sandbox, SandboxError, make_sandbox
from tests.sandboxes.conftest import kinds


@pytest.fixture(params=kinds("local", "bwrap", "docker"))
def kind(request):
    return request.param


def test_exec_exit_code_and_merged_output(make):
    sb = make()
    assert isinstance(sb, Sandbox)
    r = sb.exec("echo out; echo err >&2; exit 3")
    assert isinstance(r, ExecResult)
    assert (r.exit_code, r.timed_out) == (3, False)
    assert "out\n" in r.output and "err\n" in r.output
    assert r.duration_s > 0
    assert sb.exec("true").ok


def test_env_from_config_and_call(make):
    sb = make(env={"A": "from-config", "B": "config"})
    r = sb.exec('echo "$A $B $C"', env={"B": "call", "C": "c"})
    assert r.output == "from-config call c\n"


def test_workdir_default_and_override(make):
    sb = make()
    sb.exec("mkdir -p sub/deeper && echo hi > sub/deeper/f")
    assert sb.exec("cat deeper/f", workdir="sub").output == "hi\n"
    home = sb.exec("pwd").output.strip()
    assert sb.exec("pwd", workdir=f"{home}/sub").output.strip() == f"{home}/sub"


def test_write_then_read_text_and_bytes(make):
    sb = make()
    sb.write_file("a/b/c.txt", "héllo\n")
    assert sb.read_file("a/b/c.txt") == "héllo\n"
    assert sb.exec("cat a/b/c.txt").output == "héllo\n"
    blob = bytes(range(256)) * 10
    sb.write_file("bin.dat", blob)
    assert sb.download("bin.dat") == blob
    sb.exec("echo changed > a/b/c.txt")  # files we wrote belong to the sandbox user
    assert sb.read_file("a/b/c.txt") == "changed\n"


def test_missing_workdir_is_a_failed_command(make):
    r = make().exec("true", workdir="/no/such/dir")
    assert r.exit_code != 0 and not r.timed_out


def test_read_missing_file_raises(make):
    sb = make()
    with pytest.raises((FileNotFoundError, SandboxError)):
        sb.read_file("does/not/exist")


def test_upload_and_download_tree(make, tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(src / "run.sh", 0o755)
    sb = make()
    sb.upload(str(src), "proj")
    assert sb.exec("./run.sh && cat pkg/mod.py", workdir="proj").output == "ran\nX = 1\n"
    sb.exec("echo new > proj/pkg/new.txt")
    dest = tmp_path / "back"
    assert sb.download("proj", str(dest)) == str(dest)
    assert (dest / "pkg" / "new.txt").read_text() == "new\n"
    assert (dest / "pkg" / "mod.py").read_text() == "X = 1\n"


def test_timeout_kills_and_reports(make):
    sb = make()
    r = sb.exec("echo started; sleep 30", timeout=0.5)
    assert r.timed_out and r.duration_s < 5
    assert "started" in r.output
    assert sb.exec("echo still usable").output == "still usable\n"


def test_default_timeout_from_config(make):
    sb = make(timeout=0.5)
    assert sb.exec("sleep 30").timed_out


def test_output_truncated_with_note(make):
    sb = make(max_output_bytes=1000)
    r = sb.exec("echo FIRST; yes middle | head -n 100000; echo LAST")
    assert len(r.output) < 1300
    assert r.output.startswith("FIRST\n") and r.output.endswith("LAST\n")
    assert "truncated" in r.output and "max_output_bytes=1000" in r.output


def test_close_is_idempotent_and_final(make):
    sb = make()
    sb.close()
    sb.close()
    with pytest.raises(SandboxError):
        sb.exec("true")


def test_context_manager_and_async(kind, request):
    from tests.sandboxes.conftest import backend_config

    backend, cfg = backend_config(kind, request)

    async def main():
        async with make_sandbox(backend, **cfg) as sb:
            results = await asyncio.gather(*(sb.aexec(f"echo {i}") for i in range(3)))
            await sb.awrite_file("x", "1")
            return [r.output for r in results], await sb.aread_file("x")

    outputs, x = asyncio.run(main())
    assert sorted(outputs) == ["0\n", "1\n", "2\n"] and x == "1"


def test_limits_report(make, kind):
    limits = make().limits
    assert limits["backend"] == kind
    if kind != "local":
        assert limits["network"] == "none"


# -- backend-independent ------------------------------------------------------------

def test_local_refused_without_unsafe():
    with pytest.raises(SandboxError, match="unsafe=True"):
        make_sandbox("local")


def test_unknown_option_names_the_closest():
    with pytest.raises(TypeError, match="did you mean 'memory_mb'"):
        make_sandbox("bwrap", memroy_mb=512)
    with pytest.raises(ValueError, match="no sandbox backend named .firecracker.: the registered ones are .*docker"):
        make_sandbox("firecracker")


def test_output_buffer_keeps_head_and_tail():
    buf = OutputBuffer(10)
    for chunk in (b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"):
        buf.feed(chunk)
    text = buf.text()
    assert text.startswith("abcde") and text.endswith("vwxyz") and "16 bytes" in text
    small = OutputBuffer(100)
    small.feed(b"hello")
    assert small.text() == "hello" and not small.truncated


def test_exec_before_start_is_an_error():
    sb = make_sandbox("local", unsafe=True)
    with pytest.raises(SandboxError, match="start"):
        sb.exec("true")


def test_close_during_exec_stops_it(make, host_guard):
    import threading
    import time

    sb = make()
    outcome = {}

    def run():
        try:
            outcome["result"] = sb.exec("sleep 30", timeout=60)
        except SandboxError as e:  # the sandbox went away under the call
            outcome["error"] = e

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    sb.close()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 10
    assert "error" in outcome or outcome["result"].exit_code != 0
