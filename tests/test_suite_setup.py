"""The test suite's own guarantees: every test has a timeout, a hanging test is stopped and
reported with the stacks of every thread (and the tests after it still run)."""

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HANGING = '''
import threading
import time


def test_hangs():
    worker = threading.Thread(target=time.sleep, args=(3600,), name="stuck-helper", daemon=True)
    worker.start()
    threading.Event().wait()  # forever


def test_after_the_hang():
    assert True
'''


def test_every_test_has_a_timeout(pytestconfig):
    assert float(pytestconfig.getini("timeout")) > 0, "pyproject's [tool.pytest.ini_options] must set timeout"
    assert pytestconfig.pluginmanager.hasplugin("timeout"), "pytest-timeout is not installed (the dev extra)"


def test_a_hanging_test_is_stopped_and_reported_with_every_threads_stack(tmp_path):
    (tmp_path / "test_hang.py").write_text(HANGING)
    start = time.monotonic()
    # the suite's own config (pyproject's timeout), with a short timeout for this self-test
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
                           "-c", str(ROOT / "pyproject.toml"), "--timeout=3", str(tmp_path / "test_hang.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert time.monotonic() - start < 100
    assert done.returncode == 1, out
    assert "Failed: Timeout (>3.0s)" in out, out
    assert "stuck-helper" in out, "the other threads' stacks are not in the report"
    assert "1 failed, 1 passed" in out, out
