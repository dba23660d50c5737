"""SWE-bench 5.x instances as the official harness reads them: its log-parser names (from the
`swebench` package), `eval_script`, `eval_type`, and its verdict rules."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from envs.swe.grading import RESOLVED, UNRESOLVED, harness_eval_script, harness_row, verdict
from envs.swe.instance import InstanceError, SWEInstance, instance_from_dict
from envs.swe.log_parsers import get_parser

from .conftest import unavailable


@pytest.fixture(scope="module")
def official():
    """get_parser for the harness's names; the swebench package is the `swe` extra."""
    try:
        import swebench.harness.log_parsers  # noqa: F401
    except ImportError as e:
        unavailable(f"the swebench package is not installed (pip install -e .[swe]): {e}")
    return lambda name, **fields: get_parser(name, SWEInstance("repo__x-1", **fields))


# -- the official parser names, on the kind of log each repository prints -----------------

def test_parse_log_pytest(official):
    log = ("PASSED tests/test_a.py::test_x\nFAILED tests/test_a.py::test_y - AssertionError: boom\n"
           "ERROR tests/test_a.py::test_z - RuntimeError\nSKIPPED [2] tests/test_a.py:7: no network\n"
           "XFAIL tests/test_a.py::test_known - bug\nsome other line\n")
    assert official("parse_log_pytest")(log) == {
        "tests/test_a.py::test_x": "PASSED", "tests/test_a.py::test_y": "FAILED",
        "tests/test_a.py::test_z": "ERROR", "tests/test_a.py::test_known": "XFAIL"}


@pytest.mark.parametrize("name", ["parse_log_pytest_options", "parse_log_requests"])
def test_parse_log_pytest_options_keeps_only_the_file_name_of_a_path_option(official, name):
    log = ("PASSED tests/test_requests.py::test_path[/tmp/abs/dir/file.txt]\n"
           "FAILED tests/test_requests.py::test_mode[rb] - OSError\n")
    assert official(name)(log) == {"tests/test_requests.py::test_path[/file.txt]": "PASSED",
                                   "tests/test_requests.py::test_mode[rb]": "FAILED"}


def test_parse_log_django(official):
    log = ("test_ok (admin_views.tests.AdminViewTests) ... ok\n"
           "test_skip (admin_views.tests.AdminViewTests) ... skipped 'needs sqlite'\n"
           "test_fail (admin_views.tests.AdminViewTests) ... FAIL\n"
           "test_err (admin_views.tests.AdminViewTests) ... ERROR\n"
           "Ran 4 tests in 0.120s\n")
    assert official("parse_log_django", repo="django/django", version="4.0")(log) == {
        "test_ok (admin_views.tests.AdminViewTests)": "PASSED",
        "test_skip (admin_views.tests.AdminViewTests)": "SKIPPED",
        "test_fail (admin_views.tests.AdminViewTests)": "FAILED",
        "test_err (admin_views.tests.AdminViewTests)": "ERROR"}


def test_parse_log_sympy(official):
    log = ("sympy/core/tests/test_basic.py[3] \ntest_equality ok\ntest_matches_basic F\ntest_has E\n"
           "________________ sympy/core/tests/test_basic.py:test_matches_basic ________________\n")
    assert official("parse_log_sympy")(log) == {
        "test_equality": "PASSED", "test_matches_basic": "FAILED", "test_has": "ERROR",
        "sympy/core/tests/test_basic.py:test_matches_basic": "FAILED"}


def test_parse_log_matplotlib_names_mouse_buttons_by_number(official):
    log = ("PASSED lib/matplotlib/tests/test_widgets.py::test_span[MouseButton.LEFT]\n"
           "FAILED lib/matplotlib/tests/test_widgets.py::test_span[MouseButton.RIGHT] - assert\n")
    assert official("parse_log_matplotlib")(log) == {
        "lib/matplotlib/tests/test_widgets.py::test_span[1]": "PASSED",
        "lib/matplotlib/tests/test_widgets.py::test_span[3]": "FAILED"}


def test_parse_log_seaborn(official):
    log = ("tests/test_core.py::TestSemantic::test_a PASSED [ 50%]\n"
           "FAILED tests/test_core.py::TestSemantic::test_b - ValueError\n")
    assert official("parse_log_seaborn")(log) == {"tests/test_core.py::TestSemantic::test_a": "PASSED",
                                                  "tests/test_core.py::TestSemantic::test_b": "FAILED"}


@pytest.mark.parametrize("name", ["parse_log_pytest_v2", "parse_log_sphinx", "parse_log_astropy"])
def test_parse_log_pytest_v2_reads_colours_ids_with_spaces_and_old_pytest_lines(official, name):
    log = ("\x1b[32mPASSED\x1b[0m tests/test_build.py::test_html\n"
           "FAILED tests/test_ext.py::test_param[a b] - assert 1 == 2\n"
           "tests/test_old.py::test_legacy PASSED\n")
    assert official(name)(log) == {"tests/test_build.py::test_html": "PASSED",
                                   "tests/test_ext.py::test_param[a b]": "FAILED",
                                   "tests/test_old.py::test_legacy": "PASSED"}


def test_the_harness_parsers_of_other_languages_are_accepted_too(official):
    go = "=== RUN   TestParse\n--- PASS: TestParse (0.00s)\n--- FAIL: TestEmit/empty (0.01s)\n--- SKIP: TestNet (0.00s)\n"
    assert official("parse_log_gotest")(go) == {"TestParse": "PASSED", "TestEmit/empty": "FAILED",
                                                 "TestNet": "SKIPPED"}
    cargo = "running 2 tests\ntest lexer::tests::ident ... ok\ntest parser::tests::expr ... FAILED\n"
    assert official("parse_log_cargo")(cargo) == {"lexer::tests::ident": "PASSED",
                                                  "parser::tests::expr": "FAILED"}


def test_every_name_in_the_harness_registry_is_a_parser_here(official):
    from envs.swe.log_parsers import official_parsers

    names = sorted(official_parsers())
    assert len(names) > 40 and {"parse_log_pytest", "parse_log_django", "parse_log_jest"} <= set(names)
    refused = []
    for name in names:  # each one is found and bound to the instance; it reads a log of no tests as none,
        try:  # or (a few, made for one repository's instances) refuses an instance it does not know,
            assert official(name, version="1.0")("") == {}, name
        except ValueError:  # which grading records as that instance's error
            refused.append(name)
    assert len(refused) <= 3, refused


def test_an_unknown_official_name_lists_the_harness_names(official):
    with pytest.raises(ValueError, match="unknown log parser 'parse_log_nope'; the official harness has: .*"
                                         "parse_log_django"):
        official("parse_log_nope")


# -- the instance fields ------------------------------------------------------------------

def _row(**kw):
    row = {"instance_id": "owner__proj-7", "repo": "owner/proj", "version": "1.0", "base_commit": "abc",
           "patch": "", "test_patch": "", "problem_statement": "", "image": "owner-proj:7",
           "FAIL_TO_PASS": json.dumps(["tests/test_a.py::test_x"]), "PASS_TO_PASS": "[]",
           "eval_script": "#!/bin/bash\nset -uxo pipefail\ncd /testbed\n", "log_parser": "parse_log_pytest",
           "eval_type": "pass_and_fail"}
    return {**row, **kw}


def test_a_swe_bench_5_row_loads_with_its_harness_fields():
    inst = instance_from_dict(_row(), "swe-bench")
    assert (inst.image, inst.log_parser, inst.eval_type) == ("owner-proj:7", "parse_log_pytest", "pass_and_fail")
    assert inst.eval_script.startswith("#!/bin/bash") and inst.FAIL_TO_PASS == ["tests/test_a.py::test_x"]
    defaults = instance_from_dict(_row(log_parser=None, eval_type=None, eval_script=None))
    assert (defaults.log_parser, defaults.eval_type, defaults.eval_script) == ("pytest", "pass_and_fail", None)
    with pytest.raises(InstanceError, match="field 'eval_type' must be one of pass_and_fail, fail_only, got 'x'"):
        instance_from_dict(_row(eval_type="x"))


# -- the harness's verdict rules --------------------------------------------------------------

def test_a_skipped_pass_to_pass_test_is_maintained_a_skipped_fail_to_pass_test_is_not():
    inst = SWEInstance("i", FAIL_TO_PASS=["f"], PASS_TO_PASS=["p"])
    assert verdict(inst, {"f": "PASSED", "p": "SKIPPED"}, False)[0] == RESOLVED
    assert verdict(inst, {"f": "SKIPPED", "p": "PASSED"}, False)[0] == UNRESOLVED


def test_an_id_cut_short_in_its_params_stands_for_the_ids_it_starts_when_they_agree():
    inst = SWEInstance("i", FAIL_TO_PASS=["t.py::test_grammar[log(photon"], PASS_TO_PASS=["t.py::test_b"])
    agree = {"t.py::test_grammar[log(photon)]": "PASSED", "t.py::test_grammar[log(photon/s)]": "XFAIL",
             "t.py::test_b": "PASSED"}
    assert verdict(inst, agree, False)[0] == RESOLVED
    disagree = {**agree, "t.py::test_grammar[log(photon/s)]": "FAILED"}
    assert verdict(inst, disagree, False)[0] == UNRESOLVED


def test_fail_only_passes_every_verdict_test_the_log_does_not_call_failed():
    inst = SWEInstance("i", FAIL_TO_PASS=["f1", "f2"], PASS_TO_PASS=["p"], eval_type="fail_only")
    assert verdict(inst, {"f1": "PASSED", "p": "ERROR"}, False)[0] == RESOLVED  # f2 absent, p ERROR: not FAILED
    assert verdict(inst, {"f1": "FAILED"}, False)[0] == UNRESOLVED


# -- grading an instance by its eval_script, in a real sandbox ---------------------------------

@pytest.fixture
def harness_instance(request, swe_project):
    """The minicalc instance in the harness's shape: its eval.sh, the official pytest parser."""
    request.getfixturevalue("swe_bwrap")
    request.getfixturevalue("official")
    row = harness_row(swe_project.instance)  # test_patch stays, as in the harness's rows: the script applies it
    assert "test_cmd" not in row and row["log_parser"] == "parse_log_pytest" and row["test_patch"]
    return instance_from_dict(json.loads(json.dumps(row)), "swe-bench")


def test_only_parsers_the_harness_has_make_a_harness_row():
    with pytest.raises(ValueError, match="log_parser 'unittest' has no counterpart in the official harness"):
        harness_row(SWEInstance("i", FAIL_TO_PASS=["t"], log_parser="unittest"))


def _grade(swe_project, instance, patch, **kw):
    from envs.swe.grading import grade

    return grade(instance, swe_project.patches.get(patch, patch), sandbox="bwrap", **kw)


def test_eval_script_instance_gold_resolves_wrong_is_unresolved(swe_project, harness_instance):
    gold = _grade(swe_project, harness_instance, "gold")
    assert gold.status == RESOLVED, gold.log[-3000:]
    assert "apply test_patch" not in gold.log and "roll_agent: stop plugin loaded" in gold.test_output
    assert gold.fail_to_pass["success"] == harness_instance.FAIL_TO_PASS
    fast, full = _grade(swe_project, harness_instance, "wrong"), _grade(swe_project, harness_instance, "wrong",
                                                                        fail_fast=False)
    assert fast.status == full.status == UNRESOLVED
    assert fast.stopped_at == "tests/test_calc.py::test_add" and full.stopped_at == ""
    assert full.pass_to_pass["failure"] == ["tests/test_calc.py::test_add"]


def test_only_the_output_between_the_markers_is_read(swe_project, harness_instance):
    # a line before the start marker that looks like a result is not one
    script = harness_instance.eval_script.replace("cd /testbed", "cd /testbed\necho 'FAILED tests/test_mul.py::test_mul'")
    r = _grade(swe_project, dataclasses.replace(harness_instance, eval_script=script), "gold")
    assert r.status == RESOLVED and "tests/test_mul.py::test_mul" in r.tests


def test_an_eval_script_without_markers_is_unresolved_with_the_reason(swe_project, harness_instance):
    script = "\n".join(ln for ln in harness_instance.eval_script.splitlines() if ">>>>>" not in ln) + "\n"
    r = _grade(swe_project, dataclasses.replace(harness_instance, eval_script=script), "gold")
    assert (r.status, r.reward, r.tests) == (UNRESOLVED, 0.0, {})
    assert "printed no '>>>>> Start Test Output'" in r.reason


def test_an_eval_script_that_sets_its_own_pythonpath_still_grades_right(swe_project, harness_instance):
    # src-layout projects run `PYTHONPATH=src pytest`: that hides the stop plugin, so the run goes again plain
    inst = dataclasses.replace(swe_project.instance, test_cmd="PYTHONPATH=. python3 -m pytest -rA -p no:cacheprovider tests")
    inst = dataclasses.replace(harness_instance, eval_script=harness_eval_script(inst))
    r = _grade(swe_project, inst, "gold")
    assert r.status == RESOLVED, r.log[-3000:]
    assert "run tests (again, without the stop plugin" in r.log


def test_a_parser_that_raises_ends_only_that_instance_with_the_reason(swe_project, harness_instance, monkeypatch):
    from envs.swe.log_parsers import PARSERS

    def broken(log):
        raise KeyError("no such field")

    monkeypatch.setitem(PARSERS, "test-broken-parser", broken)  # as register_parser does, undone afterwards
    r = _grade(swe_project, dataclasses.replace(harness_instance, log_parser="test-broken-parser"), "gold",
               fail_fast=False)
    assert r.status == "error"
    assert r.reason == "log parser 'test-broken-parser' failed on the test output: KeyError: 'no such field'"


# -- real projects' instances in the official format, graded as the official harness graded them --

HARNESS_SET = Path(__file__).resolve().parents[2] / "data" / "swe_harness"


@pytest.mark.slow
@pytest.mark.docker
def test_our_verdicts_equal_the_official_harness_on_real_projects(swe_image, official):
    """data/swe_harness: SWE-bench 5.x rows (eval_script, parse_log_pytest) from cachetools (a src
    layout: its eval_script sets PYTHONPATH=src) and boltons; verdicts.json is what swebench's own
    run_evaluation gave each instance for each prediction kind (benchmarks/swe_harness_verdicts.py):
    gold, wrong, broken, empty, and the gold fix with CRLF line ends, without its final newline,
    and backwards (already applied)."""
    from benchmarks.swe_eval_vs_swebench import edge_prediction_kinds, prediction_kinds
    from envs.swe.instance import load_instances
    from roll_agent.swe_eval import evaluate
    from roll_agent.swe_tasks import build_images

    expected = json.loads((HARNESS_SET / "verdicts.json").read_text())["verdicts"]
    instances = load_instances(HARNESS_SET / "tasks.jsonl")
    assert {i.repo for i in instances} == {"pypi/cachetools", "pypi/boltons"}
    assert all(i.eval_script and i.log_parser == "parse_log_pytest" for i in instances)
    build_images(instances, log=lambda _: None)  # from the pinned sdists; cached by content
    want = {"gold": "resolved", "wrong": "unresolved", "broken": "error", "empty": "empty_patch",
            "crlf": "resolved", "no_newline": "resolved", "already_applied": "unresolved"}
    for kind, verdict_kind in want.items():
        preds = {i.instance_id: {"model_patch": {**prediction_kinds(i), **edge_prediction_kinds(i)}[kind]}
                 for i in instances}
        got = {iid: r.status for iid, r in evaluate(instances, preds, "docker", workers=2).items()}
        assert got == {iid: v[kind] for iid, v in expected.items()}, kind
        assert set(got.values()) == {verdict_kind}, kind
