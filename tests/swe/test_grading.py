"""Grading: log parsers, loaders, verdicts, and real grading runs in docker and bwrap."""
from __future__ import annotations

import dataclasses
import json

import pytest

from envs.swe.grading import EMPTY_PATCH, ERROR, RESOLVED, UNRESOLVED, grade, patch_files, verdict
from envs.swe.instance import InstanceError, SWEInstance, gold_predictions, load_instances, load_predictions
from envs.swe.log_parsers import get_parser, parse_pytest, parse_unittest, register_parser

PYTEST_LOG = """\
tests/a.py::test_v PASSED                                                [ 10%]
tests/a.py::test_w[x-1] FAILED                                           [ 20%]
=========================== short test summary info ============================
PASSED tests/a.py::test_one
PASSED tests/a.py::test_param[a b]
FAILED tests/a.py::test_two - AssertionError: assert 1 == 2
ERROR tests/a.py::test_three - RuntimeError: fixture broke
SKIPPED [1] tests/a.py:40: no network
XFAIL tests/a.py::test_four - known bug
XPASS tests/a.py::test_five
PASSED tests/a.py::test_teardown
ERROR tests/a.py::test_teardown - teardown failed
\x1b[32mPASSED\x1b[0m tests/a.py::test_colour
"""


def test_pytest_parser_reads_summary_and_verbose_lines():
    r = parse_pytest(PYTEST_LOG)
    assert r == {"tests/a.py::test_v": "PASSED", "tests/a.py::test_w[x-1]": "FAILED",
                 "tests/a.py::test_one": "PASSED", "tests/a.py::test_param[a b]": "PASSED",
                 "tests/a.py::test_two": "FAILED", "tests/a.py::test_three": "ERROR",
                 "tests/a.py::test_four": "XFAIL", "tests/a.py::test_five": "XPASS",
                 "tests/a.py::test_teardown": "ERROR", "tests/a.py::test_colour": "PASSED"}


def test_a_failure_is_not_overwritten_by_a_later_pass():
    assert parse_pytest("ERROR t.py::x - boom\nPASSED t.py::x\n") == {"t.py::x": "ERROR"}


def test_unittest_parser():
    log = ("test_a (pkg.tests.T) ... ok\ntest_b (pkg.tests.T) ... FAIL\ntest_c (pkg.tests.T) ... skipped 'why'\n"
           "test_d (pkg.tests.T) ... expected failure\nRan 4 tests in 0.1s\n")
    assert parse_unittest(log) == {"test_a (pkg.tests.T)": "PASSED", "test_b (pkg.tests.T)": "FAILED",
                                   "test_c (pkg.tests.T)": "SKIPPED", "test_d (pkg.tests.T)": "XFAIL"}


def test_parsers_are_pluggable_by_name_and_by_import_path():
    register_parser("every-line-passes", lambda log: {ln: "PASSED" for ln in log.splitlines()})
    assert get_parser("every-line-passes")("t1\nt2") == {"t1": "PASSED", "t2": "PASSED"}
    assert get_parser("envs.swe.log_parsers:parse_unittest") is parse_unittest
    with pytest.raises(ValueError, match="unknown log parser 'nope'.*pytest"):
        get_parser("nope")
    with pytest.raises(ValueError, match="cannot be imported"):
        get_parser("no_such_module:f")


def test_verdict_and_partial_credit():
    inst = SWEInstance("i", FAIL_TO_PASS=["f1", "f2"], PASS_TO_PASS=["p1", "p2"])
    ok = {"f1": "PASSED", "f2": "XFAIL", "p1": "PASSED", "p2": "PASSED"}
    assert verdict(inst, ok, partial_credit=False)[:2] == (RESOLVED, 1.0)
    half = {"f1": "PASSED", "p1": "FAILED", "p2": "PASSED"}  # f2 missing from the log: not passed
    status, reward, f2p, p2p = verdict(inst, half, partial_credit=True)
    assert (status, reward) == (UNRESOLVED, 0.5)
    assert f2p == {"success": ["f1"], "failure": ["f2"]} and p2p == {"success": ["p2"], "failure": ["p1"]}
    assert verdict(inst, half, partial_credit=False)[1] == 0.0


def test_patch_files():
    diff = "diff --git a/x.py b/y.py\n--- a/x.py\n+++ b/y.py\n@@\n--- /dev/null\n+++ b/new.py\n"
    assert patch_files(diff) == ["x.py", "y.py", "new.py"]


# -- loaders ------------------------------------------------------------------------

def _jsonl(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def test_loaders_accept_swe_bench_gym_and_smith_rows(tmp_path):
    bench = {"instance_id": "a", "repo": "o/r", "base_commit": "abc", "patch": "p", "test_patch": "",
             "FAIL_TO_PASS": '["t::x"]', "PASS_TO_PASS": "[]", "hints_text": None, "version": "1.0"}
    smith = {"instance_id": "b", "repo": "swesmith/o__r", "patch": "p", "image_name": "img:1",
             "FAIL_TO_PASS": ["t::y"], "PASS_TO_PASS": ["t::z"], "problem_statement": "s"}
    a, b = load_instances(_jsonl(tmp_path, [bench, smith]))
    assert a.FAIL_TO_PASS == ["t::x"] and a.PASS_TO_PASS == [] and a.hints_text == "" and a.image is None
    assert b.image == "img:1" and b.base_commit == "" and b.tests == ["t::y", "t::z"]
    with pytest.raises(InstanceError, match=r"d.jsonl:2: missing required field 'base_commit' \(swe-gym"):
        load_instances(_jsonl(tmp_path, [bench, smith]), fmt="swe-gym")


def test_bad_lines_name_line_and_field(tmp_path):
    rows = [{"instance_id": "ok", "base_commit": "c", "FAIL_TO_PASS": [], "PASS_TO_PASS": ["t"]},
            "{not json",
            {"instance_id": "bad-f2p", "base_commit": "c", "FAIL_TO_PASS": "t::x", "PASS_TO_PASS": []},
            {"instance_id": "bad-type", "base_commit": 3, "FAIL_TO_PASS": [], "PASS_TO_PASS": []},
            {"base_commit": "c"}]
    path = _jsonl(tmp_path, rows)
    with pytest.raises(InstanceError, match=r"d.jsonl:2: .*not valid JSON"):
        load_instances(path)
    good, bad = load_instances(path, errors="collect")
    assert [i.instance_id for i in good] == ["ok"]
    assert [b.instance_id for b in bad] == [f"{path}:2", "bad-f2p", "bad-type", f"{path}:5"]
    assert "field 'FAIL_TO_PASS' is a string but not a JSON list" in bad[1].reason
    assert "field 'base_commit' must be a string, got int" in bad[2].reason
    assert "missing required field(s) ['instance_id', 'FAIL_TO_PASS', 'PASS_TO_PASS']" in bad[3].reason


def test_predictions_loader(tmp_path):
    rows = [{"instance_id": "a", "model_name_or_path": "m", "model_patch": "diff"},
            {"instance_id": "b", "model_name_or_path": "m", "model_patch": None}]
    preds = load_predictions(_jsonl(tmp_path, rows))
    assert preds["a"]["model_patch"] == "diff" and preds["b"]["model_patch"] == ""
    as_list = tmp_path / "p.json"
    as_list.write_text(json.dumps(rows))
    assert load_predictions(as_list) == preds
    with pytest.raises(InstanceError, match=r"p.jsonl:1: prediction 'a' has no 'model_patch'"):
        load_predictions(_jsonl(tmp_path, [{"instance_id": "a"}], "p.jsonl"))
    inst = SWEInstance("x", patch="fix")
    assert gold_predictions([inst])["x"]["model_patch"] == "fix"


# -- grading in real sandboxes --------------------------------------------------------

def _grader(backend, request, swe_project):
    """grade(patch_name_or_text, **kw) on the minicalc instance in `backend`."""
    if backend == "docker":
        inst = dataclasses.replace(swe_project.instance, image=request.getfixturevalue("swe_image"))
    else:
        request.getfixturevalue("swe_bwrap")
        inst = swe_project.instance

    def _grade(patch, instance=None, **kw):
        return grade(instance or inst, swe_project.patches.get(patch, patch), sandbox=backend, **kw)

    _grade.instance = inst
    return _grade


@pytest.fixture(params=[pytest.param("docker", marks=pytest.mark.docker), "bwrap"])
def graded(request, swe_project):
    """In each backend: what depends on the sandbox (start, exec, timeouts, files)."""
    return _grader(request.param, request, swe_project)


@pytest.fixture
def graded_bwrap(request, swe_project):
    """The git/patch logic runs the same commands in every backend: checked in the fastest one."""
    return _grader("bwrap", request, swe_project)


def test_gold_patch_resolves(graded):
    r = graded("gold")
    assert (r.status, r.reward, r.apply_method, r.reason) == (RESOLVED, 1.0, "git apply", "")
    assert r.fail_to_pass["success"] == graded.instance.FAIL_TO_PASS
    assert r.pass_to_pass["success"] == graded.instance.PASS_TO_PASS
    assert "4 passed" in r.test_output and "$ run tests" in r.log


def test_wrong_patch_is_unresolved_with_partial_credit(graded):
    r = graded("wrong", partial_credit=True)
    assert (r.status, r.reward) == (UNRESOLVED, 0.75)
    assert r.pass_to_pass["failure"] == ["tests/test_calc.py::test_add"]


def test_patch_that_does_not_apply_is_an_error_with_the_reason(graded):
    r = graded("not_applying")
    assert r.status == ERROR and r.reason.startswith("patch does not apply")
    assert "Hunk #1 FAILED" in r.log and r.reward == 0.0


def test_a_reversed_patch_is_not_applied_backwards_but_counts_as_already_applied(graded_bwrap):
    # its reverse applies: the change is in the tree already (the official harness's "verified
    # already applied"); the tree stays as it was, so the tests still fail
    r = graded_bwrap("reversed")
    assert (r.status, r.apply_method) == (UNRESOLVED, "already applied")
    assert "Reversed (or previously applied) patch detected!  Skipping patch." in r.log
    assert r.tests["tests/test_mul.py::test_mul"] == "FAILED"


def test_empty_patch(graded_bwrap):
    graded = graded_bwrap
    assert graded("empty").status == EMPTY_PATCH and graded("  \n").status == EMPTY_PATCH


def test_fallbacks_3way_then_fuzz(graded_bwrap):
    graded = graded_bwrap
    r = graded("three_way")
    assert (r.status, r.apply_method) == (RESOLVED, "git apply --3way")
    r = graded("fuzzy")
    assert (r.status, r.apply_method) == (RESOLVED, "patch --fuzz")


def test_model_cannot_rewrite_the_tests_that_judge_it(graded_bwrap):
    graded = graded_bwrap
    # the bug stays; the patch plants a tests/test_mul.py that passes: test_patch's version replaces it
    cheat = ("--- /dev/null\n+++ b/tests/test_mul.py\n@@ -0,0 +1,6 @@\n+def test_mul():\n+    pass\n+\n+\n"
             "+def test_mul_zero():\n+    pass\n")
    r = graded(cheat)
    assert r.status == UNRESOLVED and r.stopped_at == "tests/test_mul.py::test_mul"
    assert r.fail_to_pass["failure"] == ["tests/test_mul.py::test_mul"]
    assert r.not_run == ["tests/test_mul.py::test_mul_zero"]


def test_malformed_instances_are_errors(graded_bwrap):
    graded = graded_bwrap
    no_tests = dataclasses.replace(graded.instance, FAIL_TO_PASS=[], PASS_TO_PASS=[])
    assert graded("gold", instance=no_tests).reason.startswith("malformed instance: no FAIL_TO_PASS")
    bad_parser = dataclasses.replace(graded.instance, log_parser="nope")
    assert "unknown log parser 'nope'" in graded("gold", instance=bad_parser).reason
    bad_base = dataclasses.replace(graded.instance, base_commit="0" * 40)
    r = graded("gold", instance=bad_base)
    assert r.status == ERROR and "cannot check out base_commit" in r.reason


def test_timeout_is_an_error(graded):
    slow = dataclasses.replace(graded.instance, test_cmd="sleep 30")
    r = graded("gold", instance=slow, timeout=1)
    assert (r.status, r.reason) == (ERROR, "timeout: the tests ran past 1s")


@pytest.mark.docker
def test_docker_needs_an_image(swe_project, swe_image):
    r = grade(swe_project.instance, swe_project.patches["gold"], sandbox="docker")
    assert r.status == ERROR and "no 'image' for the docker sandbox" in r.reason
    missing = dataclasses.replace(swe_project.instance, image="roll-agent-task:does-not-exist")
    r = grade(missing, swe_project.patches["gold"], sandbox="docker")
    assert r.status == ERROR and r.reason.startswith("sandbox could not start") and "not found" in r.reason


# -- fail fast: pytest stops at the first failing verdict test -------------------------

def test_fail_fast_stops_at_the_first_failing_verdict_test_with_the_same_verdict(graded):
    fast, full = graded("wrong"), graded("wrong", fail_fast=False)
    assert fast.status == full.status == UNRESOLVED
    # test_calc.py runs first: its failing test_add ends the run before tests/test_mul.py
    assert fast.stopped_at == "tests/test_calc.py::test_add" and "tests/test_mul.py::test_mul" not in fast.tests
    assert fast.pass_to_pass["failure"] == full.pass_to_pass["failure"] == ["tests/test_calc.py::test_add"]
    assert fast.not_run == ["tests/test_mul.py::test_mul", "tests/test_mul.py::test_mul_zero",
                            "tests/test_calc.py::test_clamp"]
    assert full.stopped_at == "" and full.tests["tests/test_mul.py::test_mul"] == "PASSED"
    assert fast.tests["tests/test_calc.py::test_add"] == full.tests["tests/test_calc.py::test_add"] == "FAILED"


def test_a_failure_outside_the_verdict_tests_does_not_stop_the_run(graded_bwrap):
    # test_add is in neither list: its failure decides nothing, so the run goes on
    inst = dataclasses.replace(graded_bwrap.instance, PASS_TO_PASS=["tests/test_calc.py::test_clamp"])
    r = graded_bwrap("wrong", instance=inst)
    assert (r.status, r.stopped_at) == (RESOLVED, "")
    assert r.tests["tests/test_calc.py::test_add"] == "FAILED"


def test_the_tests_see_the_environment_without_the_stop_plugin(graded_bwrap):
    env_test = ("--- /dev/null\n+++ b/tests/test_env.py\n@@ -0,0 +1,7 @@\n+import os\n+import subprocess\n+\n+\n"
                "+def test_env():\n+    assert 'roll_agent' not in repr(sorted(os.environ.items()))\n"
                "+    assert subprocess.run(['sh', '-c', 'echo \"$PYTEST_ADDOPTS$PYTHONPATH\"'], capture_output=True)"
                ".stdout == b'\\n'\n")
    inst = dataclasses.replace(graded_bwrap.instance, test_patch=graded_bwrap.instance.test_patch + env_test,
                               FAIL_TO_PASS=[*graded_bwrap.instance.FAIL_TO_PASS, "tests/test_env.py::test_env"])
    r = graded_bwrap("gold", instance=inst)
    assert (r.status, r.stopped_at) == (RESOLVED, ""), r.test_output[-2000:]
    assert "roll_agent: stop plugin loaded" in r.test_output


def test_a_test_command_without_pytest_runs_again_plain(graded_bwrap):
    lines = "".join(f"PASSED {t}\\n" for t in graded_bwrap.instance.tests)
    inst = dataclasses.replace(graded_bwrap.instance, test_cmd=f"printf '{lines}'")
    r = graded_bwrap("gold", instance=inst)
    assert r.status == RESOLVED and "run tests (again, without the stop plugin" in r.log
