"""pytest plugin run inside the grading sandbox: stop at the first failing verdict test.

The verdict is "resolved" iff every FAIL_TO_PASS and PASS_TO_PASS test passes, so the
first of those tests to fail decides it ("unresolved"); everything pytest would run
after it cannot change that. This plugin ends the session there, like `-x`, except
that failures of tests outside the two lists do not stop it (they decide nothing).
Tests run in the same order as without it, so the test that stopped the run fails the
same way in a full run.

Grading copies this file into the sandbox (not imported from the host: the image's
python and pytest run it; standard library only, Python 3.5 syntax; the host imports
it for the marker lines) and loads
it with `-p` through PYTEST_ADDOPTS and PYTHONPATH; on import it takes its own entries
out of both again, so processes the tests start see the environment without it.
ROLL_AGENT_STOP_IDS names the file with the test ids, one a line.
"""
import os

LOADED = "roll_agent: stop plugin loaded"  # grading trusts a run only when this line is there
STOPPED = "roll_agent: stopped at the first failing FAIL_TO_PASS/PASS_TO_PASS test: "
_DIR = os.path.dirname(os.path.abspath(__file__))
_IDS_FILE = os.environ.pop("ROLL_AGENT_STOP_IDS", "")


def _unwrap(name, ours, sep):
    value = os.environ.get(name, "")
    if value == ours:
        del os.environ[name]
    elif value.startswith(ours + sep):
        os.environ[name] = value[len(ours) + len(sep):]


_unwrap("PYTEST_ADDOPTS", "-p roll_agent_stop", " ")
_unwrap("PYTHONPATH", _DIR, os.pathsep)


class _Stop:
    def __init__(self, ids, session=None):
        self.ids, self.session = ids, session

    def pytest_sessionstart(self, session):
        self.session = session
        self._say(LOADED)

    def pytest_runtest_logreport(self, report):
        if report.failed and report.nodeid in self.ids and self.session is not None:
            self._say(STOPPED + report.nodeid)
            self.session.shouldfail = STOPPED + report.nodeid

    def _say(self, line):
        tr = self.session.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.ensure_newline()
            tr.write_line(line)


def pytest_configure(config):
    ids = set()
    if _IDS_FILE:
        with open(_IDS_FILE) as f:
            ids = {line.rstrip("\n") for line in f if line.strip()}
    config.pluginmanager.register(_Stop(ids), "roll_agent_stop_session")
