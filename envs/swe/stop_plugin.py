"""pytest plugin run inside the grading sandbox: stop at the first failing verdict test.

The verdict is "resolved" iff every FAIL_TO_PASS and PASS_TO_PASS test passes, so the
first of those tests to fail decides it ("unresolved"); everything pytest would run
after it cannot change that. This plugin ends the session there, like `-x`, except
that failures of tests outside the two lists do not stop it (they decide nothing).

It also runs the FAIL_TO_PASS tests first: after collection (and after every other
plugin's reordering: trylast) it moves them to the front, in their own order, and
leaves everything else in the order pytest had (a stable partition). A wrong patch
usually fails a FAIL_TO_PASS test, and in file order that test may come after
hundreds of PASS_TO_PASS tests. The order cannot change a verdict unless the test
suite is order-dependent: each test's outcome depends only on the code and on itself,
so the set of verdict tests that fail is the same in any order (with the plugin: the
run stops at one of them, found earlier). A suite whose tests leak state into later
ones (a test that passes only after another ran, module state set up by the first
test of a file, ...) can give a different verdict, as it would under pytest-randomly.
`--no-fail-fast` (grading's fail_fast=False) does not load this plugin: everything
runs, in file order, as in the official harness.

Grading copies this file into the sandbox (not imported from the host: the image's
python and pytest run it; standard library only, Python 3.5 syntax; the host imports
it for the marker lines) and loads
it with `-p` through PYTEST_ADDOPTS and PYTHONPATH; on import it takes its own entries
out of both again, so processes the tests start see the environment without it.
ROLL_AGENT_STOP_IDS names the file with the verdict test ids (FAIL_TO_PASS and
PASS_TO_PASS), one a line; ROLL_AGENT_RUN_FIRST the file with the FAIL_TO_PASS ids to
run first (unset: no reordering).
"""
import os

LOADED = "roll_agent: stop plugin loaded"  # grading trusts a run only when this line is there
STOPPED = "roll_agent: stopped at the first failing FAIL_TO_PASS/PASS_TO_PASS test: "
_DIR = os.path.dirname(os.path.abspath(__file__))
_IDS_FILE = os.environ.pop("ROLL_AGENT_STOP_IDS", "")
_FIRST_FILE = os.environ.pop("ROLL_AGENT_RUN_FIRST", "")


def _unwrap(name, ours, sep):
    value = os.environ.get(name, "")
    if value == ours:
        del os.environ[name]
    elif value.startswith(ours + sep):
        os.environ[name] = value[len(ours) + len(sep):]


_unwrap("PYTEST_ADDOPTS", "-p roll_agent_stop", " ")
_unwrap("PYTHONPATH", _DIR, os.pathsep)


def _trylast(hook):
    """Our order is the last word: after pytest's fixture grouping and other plugins' orders."""
    if __name__ != "roll_agent_stop":  # the host imports this file for the marker lines only
        return hook
    import pytest  # loaded: pytest is what imports this plugin
    try:
        return pytest.hookimpl(trylast=True)(hook)
    except AttributeError:  # pytest < 2.8
        hook.trylast = True
        return hook


def _read_ids(path):
    if not path:
        return set()
    with open(path) as f:
        return {line.rstrip("\n") for line in f if line.strip()}


class _Stop:
    def __init__(self, ids, first=(), session=None):
        self.ids, self.first, self.session = ids, set(first), session

    def pytest_sessionstart(self, session):
        self.session = session
        self._say(LOADED)

    @_trylast
    def pytest_collection_modifyitems(self, items):
        if not self.first:
            return
        first = [item for item in items if item.nodeid in self.first]
        if first and len(first) < len(items):
            items[:] = first + [item for item in items if item.nodeid not in self.first]

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
    config.pluginmanager.register(_Stop(_read_ids(_IDS_FILE), _read_ids(_FIRST_FILE)), "roll_agent_stop_session")
