"""The SWE task maker: mutation operators (pure), the maker end to end on a tiny local
project (bwrap; images with docker) and the shipped task set (cheap consistency checks)."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from envs.swe.instance import load_instances
from envs.swe.mutations import OPERATORS, mutations
from envs.swe.task_maker import IMAGE_REPO, MakerConfig, _failure_sections, _trim_traceback, make_tasks
from envs.swe.task_source import MakerError, discover_sources, discover_tests, git_snapshot, restore_task_repo

DATASET = Path(__file__).resolve().parents[2] / "data" / "swe_tasks" / "tasks.jsonl"

SAMPLE = '''"""Doc: x < y is not code."""
__version__ = "1.0"
NAMES = ["é", "ü"]  # non-ASCII before a site: ast columns count bytes


def clamp(x, lo, hi):
    if x < lo:  # keep this comment
        return lo
    total = x + 1
    return min(hi, total - 1)


def both(a, b):
    return a and b
'''


def _changed_lines(a: str, b: str) -> list[tuple[str, str]]:
    la, lb = a.splitlines(), b.splitlines()
    assert len(la) == len(lb), "a single-site mutation keeps the line count"
    return [(x, y) for x, y in zip(la, lb) if x != y]


def _by_op(op: str) -> list:
    return mutations(SAMPLE, "m.py", operators=(op,))


def test_compare_flip_rewrites_only_the_operator():
    (m,) = _by_op("compare_flip")
    assert _changed_lines(SAMPLE, m.mutated) == [("    if x < lo:  # keep this comment",
                                                  "    if x <= lo:  # keep this comment")]
    assert m.operator == "compare_flip" and m.lineno == 7 and "`<` -> `<=`" in m.description


def test_each_operator_yields_expected_edits():
    arith = {_changed_lines(SAMPLE, m.mutated)[0][1].strip() for m in _by_op("arith_swap")}
    assert arith == {"total = x - 1", "return min(hi, total + 1)"}
    assert [_changed_lines(SAMPLE, m.mutated)[0][1].strip() for m in _by_op("bool_swap")] == ["return a or b"]
    consts = {_changed_lines(SAMPLE, m.mutated)[0][1].strip() for m in _by_op("constant")}
    assert consts == {"total = x + 2", "total = x + 0", "return min(hi, total - 2)", "return min(hi, total - 0)"}
    assert [_changed_lines(SAMPLE, m.mutated)[0][1].strip() for m in _by_op("negate_condition")] == [
        "if not (x < lo):  # keep this comment"]
    swaps = {_changed_lines(SAMPLE, m.mutated)[0][1].strip() for m in _by_op("swap_arguments")}
    assert swaps == {"return min(total - 1, hi)"}
    drops = {_changed_lines(SAMPLE, m.mutated)[0][1].strip() for m in _by_op("drop_statement")}
    # NAMES = ..., total = ..., and clamp's final return; never an `if` block or a lone statement
    assert {d.split("#")[0].strip() for d in drops} == {"pass"} and sorted(m.lineno for m in _by_op("drop_statement")) == [3, 9, 10]


def test_docstrings_and_dunder_assignments_are_left_alone():
    for m in mutations(SAMPLE, "m.py"):
        assert m.lineno not in (1, 2), m.description


def test_every_mutation_is_minimal_parses_and_changes_the_ast():
    ms = mutations(SAMPLE, "m.py")
    assert {m.operator for m in ms} == set(OPERATORS)
    for m in ms:
        assert ast.dump(ast.parse(m.mutated)) != ast.dump(ast.parse(SAMPLE))
        assert len(_changed_lines(SAMPLE, m.mutated)) == 1
        assert m.source == SAMPLE and m.path == "m.py"


def test_order_is_deterministic_per_seed():
    first = [m.mutated for m in mutations(SAMPLE, "m.py", seed=3)]
    assert first == [m.mutated for m in mutations(SAMPLE, "m.py", seed=3)]
    assert sorted(first) == sorted(m.mutated for m in mutations(SAMPLE, "m.py", seed=4))
    assert first != [m.mutated for m in mutations(SAMPLE, "m.py", seed=4)]


def test_operands_with_comments_between_them_are_skipped():
    src = "x = (a <  # why\n     b)\n"
    assert mutations(src, operators=("compare_flip",)) == []
    src = "y = f(a, b) < g(c)\n"
    (m,) = mutations(src, operators=("compare_flip",))
    assert m.mutated == "y = f(a, b) <= g(c)\n"


def test_unknown_operator_is_an_error_naming_the_valid_ones():
    with pytest.raises(ValueError, match="compare_flip"):
        mutations(SAMPLE, operators=("flip_everything",))
    with pytest.raises(ValueError, match="sandbox"):
        MakerConfig(source="x", sandbox="vm")


def test_problem_statement_traceback_keeps_test_code_and_errors_only():
    log = ("=================================== FAILURES ===================================\n"
           "___________________________________ test_a ____________________________________\n"
           "tests/test_m.py:5: in test_a\n    assert m.f(1) == 2\n"
           "m.py:3: in f\n    return x - 1\nE   assert 0 == 2\n"
           "=========================== short test summary info ============================\n")
    sections = _failure_sections(log)
    trimmed = _trim_traceback(sections["test_a"], {"tests/test_m.py"})
    assert trimmed.splitlines() == ["tests/test_m.py:5: in test_a", "    assert m.f(1) == 2", "m.py:3: in f",
                                    "E   assert 0 == 2"]
    recursion = ("tests/test_m.py:5: in test_a\n" + "m.py:3: in f\n    return f(x)\n" * 50 + "g.py:1: in g\n" * 2
                 + "E   assert <A object at 0x7f0a562deed0> == 1\n")
    assert _trim_traceback(recursion, {"tests/test_m.py"}).splitlines() == [
        "tests/test_m.py:5: in test_a", "m.py:3: in f", "[... the line above repeats 49 more times ...]",
        "g.py:1: in g", "g.py:1: in g", "E   assert <A object at 0x...> == 1"]


# ---------------------------------------------------------------- end to end (tiny local project)

_LIB = '''def area(w, h):
    if w < 0 or h < 0:
        raise ValueError("negative side")
    return w * h


def scale(xs, k):
    out = []
    for x in xs:
        out.append(x * k)
    return out
'''
_TESTS = '''import pytest
from shapes import area, scale


def test_area():
    assert area(2, 3) == 6


def test_area_negative():
    with pytest.raises(ValueError):
        area(-1, 2)


def test_scale():
    assert scale([1, 2], 3) == [3, 6]
'''


def _patch_lines(patch: str) -> list[str]:
    """The code lines a patch removes or adds (the bug and its fix)."""
    return [line[1:] for line in patch.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip()]


def _tiny_project(root: Path) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "shapes.py").write_text(_LIB)
    (root / "tests" / "test_shapes.py").write_text(_TESTS)
    return root


def test_layout_discovery(tmp_path):
    root = _tiny_project(tmp_path / "p")
    (root / "setup.py").write_text("")
    tests = discover_tests(root)
    assert tests == ["tests/test_shapes.py"] and discover_sources(root, tests) == ["shapes.py"]
    with pytest.raises(MakerError, match="--tests"):
        discover_tests(root, ("nothing_*.py",))


def test_snapshot_commits_are_reproducible(tmp_path):
    a, b = _tiny_project(tmp_path / "a"), _tiny_project(tmp_path / "b")
    assert git_snapshot(a) == git_snapshot(b)


@pytest.fixture(scope="module")
def made(tmp_path_factory, swe_bwrap):
    root = _tiny_project(tmp_path_factory.mktemp("maker") / "shapes")
    lines = []
    cfg = MakerConfig(source=str(root), max_tasks=3, seed=1, sandbox="bwrap", log=lines.append)
    return root, make_tasks(cfg), lines


@pytest.mark.slow
def test_maker_end_to_end_tasks_are_verified(made, tmp_path):
    root, tasks, lines = made
    assert 1 <= len(tasks) <= 3, lines
    for t in tasks:
        assert t["FAIL_TO_PASS"] and set(t["FAIL_TO_PASS"]).isdisjoint(t["PASS_TO_PASS"])
        assert set(t["FAIL_TO_PASS"]) | set(t["PASS_TO_PASS"]) == {
            "tests/test_shapes.py::test_area", "tests/test_shapes.py::test_area_negative",
            "tests/test_shapes.py::test_scale"}
        assert t["image"] == f"{IMAGE_REPO}:{t['instance_id']}" and t["test_patch"] == ""
        for test in t["FAIL_TO_PASS"]:
            assert test in t["problem_statement"]
        assert not set(_patch_lines(t["patch"])) & set(t["problem_statement"].splitlines())
        # the buggy repo rebuilds to the same commit, and the gold patch fixes it
        repo = restore_task_repo(root, t["patch"], t["base_commit"], tmp_path / t["instance_id"])
        subprocess.run(["git", "apply", "-"], cwd=repo, input=t["patch"], text=True, check=True)
        assert (repo / "shapes.py").read_text() == _LIB
    # deterministic: the same source and seed make the same tasks
    again = make_tasks(MakerConfig(source=str(root), max_tasks=3, seed=1, sandbox="bwrap", log=lambda _: None))
    assert [t["base_commit"] for t in again] == [t["base_commit"] for t in tasks]


@pytest.mark.slow
@pytest.mark.docker
def test_build_images_then_gold_resolves(made, tmp_path, swe_image):
    from envs.swe.grading import grade, harness_row
    from envs.swe.instance import instance_from_dict
    from roll_agent.swe_tasks import build_images
    from sandboxes.build_image import docker_client

    _, tasks, _ = made
    instances = [instance_from_dict(t) for t in tasks[:1]]
    log = []
    build_images(instances, log=log.append)
    client = docker_client()
    image = client.images.get(instances[0].image)
    assert image.attrs["Config"]["StopSignal"] == "SIGKILL"
    out = client.containers.run(image.id, ["sh", "-c", "stat -c %u /testbed && git rev-parse HEAD && git status "
                                                      "--porcelain"], remove=True).decode().split()
    assert out == ["1000", instances[0].base_commit]
    build_images(instances, log=log.append)
    assert log[-1] == "1 images exist, 0 to build"
    assert grade(instances[0], instances[0].patch, sandbox="docker").status == "resolved"
    assert grade(instances[0], "", sandbox="docker").status == "empty_patch"
    # `swe_tasks make --format harness`: the same task as an SWE-bench 5.x row, run by its eval_script
    harness = instance_from_dict(harness_row(instances[0]))
    assert harness.eval_script and harness.test_cmd is None
    r = grade(harness, harness.patch, sandbox="docker")
    assert r.status == "resolved" and "bash /tmp/roll_agent_eval.sh" in r.log, r.log[-2000:]


# ---------------------------------------------------------------- the shipped task set


def test_shipped_dataset_is_consistent():
    insts = load_instances(DATASET)
    assert len(insts) >= 30
    projects = {i.repo for i in insts}
    assert len(projects) >= 3 and all(p.startswith("pypi/") for p in projects)
    for i in insts:
        assert i.FAIL_TO_PASS and set(i.FAIL_TO_PASS).isdisjoint(i.PASS_TO_PASS), i.instance_id
        files = {t.split("::")[0] for t in i.tests}
        assert i.test_cmd.split()[-len(files):] == sorted(files), i.instance_id
        assert i.image == f"{IMAGE_REPO}:{i.instance_id}" and len(i.base_commit) == 40
        assert i.patch.startswith("diff --git") and i.patch.count("\n@@ ") == 1, i.instance_id
        assert i.extra["source"].startswith("pypi:") and len(i.extra["source_sha256"]) == 64
        assert all(t in i.problem_statement for t in i.FAIL_TO_PASS[:15]), i.instance_id
        assert not set(_patch_lines(i.patch)) & set(i.problem_statement.splitlines()), i.instance_id


def test_a_long_make_shows_its_rate_and_eta():
    from envs.swe.task_maker import progress

    # 1 task from 3 mutations in 90 s: 27 more mutations for the 9 left at that yield, 30 s each
    assert progress(3, 60, 1, 10, 90.0) == "1/10 tasks, 2.0 mutations/min, ETA 13m30s"
    assert progress(3, 60, 0, 10, 90.0).endswith("ETA 28m30s")  # no yield yet: every candidate left
    assert progress(30, 60, 10, 10, 900.0).endswith("ETA 0m00s")
