"""Shared SWE fixtures: a tiny real Python project with a bug, its image, and patches.

The project ("minicalc") is a git repo whose `mul` adds instead of multiplying at
base_commit. Its test_patch adds tests/test_mul.py (FAIL_TO_PASS); tests/test_calc.py
is already there and passes (PASS_TO_PASS). Patches:

  gold          the fix
  wrong         fixes mul but breaks add: F2P pass, one P2P fails (unresolved; partial 3/4)
  not_applying  a hunk against code that is not there (no fallback applies it)
  empty         ""
  three_way     the fix made against the previous commit (a comment differs near the hunk):
                `git apply` refuses it, `git apply --3way` merges it
  fuzzy         the fix with a wrong outer context line and no blob ids: only `patch --fuzz` applies it
  reversed      the fix backwards (its new side is what base_commit has): must not apply, in
                particular not as `patch -R`, which `patch --batch` assumes unless told --forward;
                its reverse applies, so it counts as already applied (the tree stays buggy)

Fixtures: swe_project (no docker: repo dir + instance with repo=<local path>, for bwrap),
swe_image (the docker image; skips without a daemon, fails when CI is set), swe_instance
(the instance with that image). Commit dates are fixed and the git index is rebuilt in
the image, so the image's content hash, hence its tag, is the same every run (cached).
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

import pytest

from envs.swe.instance import SWEInstance

IN_CI = bool(os.environ.get("CI"))
TEST_CMD = "python3 -m pytest -rA -p no:cacheprovider tests"
F2P = ["tests/test_mul.py::test_mul", "tests/test_mul.py::test_mul_zero"]
P2P = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_clamp"]

_CALC = '''"""minicalc: tiny arithmetic helpers."""


def add(a, b):
    return a + b


def mul(a, b):
    """a times b."""  # rev {rev}
    x = a
    return x + b


def clamp(x, lo, hi):
    return max(lo, min(x, hi))
'''
_TEST_CALC = '''from calc import add, clamp


def test_add():
    assert add(2, 3) == 5


def test_clamp():
    assert clamp(7, 0, 5) == 5
'''
_TEST_MUL = '''from calc import mul


def test_mul():
    assert mul(3, 4) == 12


def test_mul_zero():
    assert mul(5, 0) == 0
'''
_NOT_APPLYING = '''diff --git a/calc/__init__.py b/calc/__init__.py
--- a/calc/__init__.py
+++ b/calc/__init__.py
@@ -20,4 +20,4 @@ def clamp(x, lo, hi):
 def div(a, b):
     """a over b."""
-    return a * b
+    return a / b
 
'''
_FUZZY = '''--- a/calc/__init__.py
+++ b/calc/__init__.py
@@ -8,7 +8,7 @@
 def mul(a, b):  # context that is not in the file
     """a times b."""  # rev 2
     x = a
-    return x + b
+    return x * b
 
 
 def clamp(x, lo, hi):
'''


@dataclasses.dataclass
class SWEProject:
    repo_dir: Path
    instance: SWEInstance  # image=None, repo=<repo_dir> (a local git repo)
    patches: dict[str, str]


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL": "/dev/null"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def _write(repo: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)


def _diff_of(repo: Path, files: dict[str, str], *paths: str) -> str:
    """The diff `files` would make to the work tree; the tree is restored afterwards."""
    _write(repo, files)
    _git(repo, "add", "-N", *paths)
    diff = _git(repo, "diff", "--", *paths)
    _git(repo, "reset", "-q", "--", *paths)
    _git(repo, "checkout", "-q", "--", ".")
    _git(repo, "clean", "-qfd")
    return diff


def reverse_patch(diff: str) -> str:
    """The diff backwards: its added lines removed and its removed lines added (headers kept)."""
    return re.sub(r"^([+-])(?![+-]{2} )", lambda m: "+" if m.group(1) == "-" else "-", diff, flags=re.M)


def make_swe_project(root: Path) -> SWEProject:
    """The minicalc repo under `root` (two commits; base_commit has the bug) and its patches."""
    repo = root / "minicalc"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _write(repo, {"calc/__init__.py": _CALC.format(rev=1), "tests/test_calc.py": _TEST_CALC,
                  "tests/__init__.py": ""})
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "minicalc")
    fix = "    return x * b\n"
    three_way = _diff_of(repo, {"calc/__init__.py": _CALC.format(rev=1).replace("    return x + b\n", fix)},
                         "calc/__init__.py")
    _write(repo, {"calc/__init__.py": _CALC.format(rev=2)})
    _git(repo, "commit", "-qam", "mul: document it")
    base = _git(repo, "rev-parse", "HEAD").strip()
    calc = _CALC.format(rev=2)
    gold = _diff_of(repo, {"calc/__init__.py": calc.replace("    return x + b\n", fix)}, "calc/__init__.py")
    wrong = _diff_of(repo, {"calc/__init__.py": calc.replace("    return x + b\n", fix)
                            .replace("    return a + b\n", "    return a - b\n")}, "calc/__init__.py")
    test_patch = _diff_of(repo, {"tests/test_mul.py": _TEST_MUL}, "tests/test_mul.py")
    inst = SWEInstance(
        instance_id="minicalc__mul-1", repo=str(repo), base_commit=base, patch=gold, test_patch=test_patch,
        problem_statement="mul(3, 4) returns 7, not 12: mul adds its arguments instead of multiplying them.",
        FAIL_TO_PASS=list(F2P), PASS_TO_PASS=list(P2P), test_cmd=TEST_CMD)
    reversed_gold = reverse_patch(gold)
    patches = {"gold": gold, "wrong": wrong, "not_applying": _NOT_APPLYING, "empty": "",
               "three_way": three_way, "fuzzy": _FUZZY, "reversed": reversed_gold}
    return SWEProject(repo, inst, patches)


def build_project_image(repo: Path) -> str:
    """The docker image with `repo` at /testbed (content-hashed tag: built once, then cached)."""
    from sandboxes.build_image import build_task_image

    index = repo / ".git" / "index"
    if index.exists():
        index.unlink()  # stat data of this checkout; rebuilt inside the image instead
    return build_task_image(str(repo), setup=("git reset -q",))


def unavailable(why: str):
    if IN_CI:
        pytest.fail(f"{why} -- CI is set, so this must run: scripts/test.sh installs and starts it")
    pytest.skip(why)


@pytest.fixture(scope="session")
def swe_project(tmp_path_factory) -> SWEProject:
    return make_swe_project(tmp_path_factory.mktemp("swe"))


@pytest.fixture(scope="session")
def swe_image(tmp_path_factory) -> str:
    try:
        from sandboxes.build_image import docker_client, ensure_base_image

        client = docker_client()
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure means: no usable daemon
        unavailable(f"no Docker daemon reachable ({type(e).__name__}: {e})")
    ensure_base_image(client=client)
    # a project of its own: the image build drops the index of the checkout it copies
    return build_project_image(make_swe_project(tmp_path_factory.mktemp("swe-image")).repo_dir)


@pytest.fixture(scope="session")
def swe_instance(swe_project, swe_image) -> SWEInstance:
    return dataclasses.replace(swe_project.instance, image=swe_image)


@pytest.fixture(scope="session")
def swe_patches(swe_project) -> dict[str, str]:
    return swe_project.patches


@pytest.fixture(scope="session")
def swe_bwrap() -> None:
    """bwrap with the base rootfs (the bwrap grading sandbox's root); skips like the docker fixture."""
    import shutil

    from sandboxes.build_image import rootfs_path

    if shutil.which("bwrap") is None:
        unavailable("bubblewrap is not installed (apt-get install -y bubblewrap)")
    if not rootfs_path().is_dir():
        unavailable(f"no base rootfs at {rootfs_path()} (build it as root: python -m sandboxes.build_image)")
