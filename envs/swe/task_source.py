"""Where SWE tasks come from: a project tree (sdist or local dir), its layout, git snapshots.

Sdists are fetched with `pip download --no-binary :all: --no-deps` at a pinned version
and their sha256 is recorded, so a task set can be rebuilt on a fresh machine with
index access and checked to be the same bytes. Snapshots are git repos with ONE root
commit and a fixed author, committer and date: the commit hash depends only on the
tree, so the same source and mutation give the same base_commit anywhere.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

# fixed identity and date: commit hashes depend only on the tree
_GIT_ENV = {"GIT_AUTHOR_NAME": "roll_agent", "GIT_AUTHOR_EMAIL": "tasks@roll-agent.invalid",
            "GIT_COMMITTER_NAME": "roll_agent", "GIT_COMMITTER_EMAIL": "tasks@roll-agent.invalid",
            "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000"}
_JUNK_DIRS = {".git", "__pycache__", ".tox", ".nox", ".eggs", "build", "dist", ".pytest_cache", ".mypy_cache"}
_NON_SOURCE = ("setup.py", "conftest.py", "versioneer.py", "_version.py", "noxfile.py", "fabfile.py")
_NON_SOURCE_DIRS = ("tests", "test", "testing", "docs", "doc", "tools", "bin", "scripts", "examples",
                    "benchmarks", "code_templates")


class MakerError(RuntimeError):
    """The project cannot be turned into tasks (the message says why and what to change)."""


# ---------------------------------------------------------------- sources


@dataclasses.dataclass
class Source:
    root: Path  # the project tree (cleaned: no VCS dirs, caches or builds)
    spec: str
    name: str
    version: str
    sha256: str | None  # of the sdist; None for local directories


def _cache_root(cache: str | None) -> Path:
    if cache:
        return Path(cache)
    base = os.environ.get("ROLL_AGENT_CACHE") or os.path.expanduser("~/.cache/roll_agent")
    return Path(base) / "swe-sdists"


def download_sdist(name: str, version: str, cache: str | None = None, sha256: str | None = None) -> Path:
    """The sdist of NAME==VERSION from the package index (cached), checked against `sha256`."""
    dest = _cache_root(cache) / f"{name}=={version}"
    found = sorted(p for p in dest.glob("*") if p.name.endswith((".tar.gz", ".zip", ".tar.bz2")))
    if not found:
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-q",
               "-d", str(dest), f"{name}=={version}"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(p for p in dest.glob("*") if p.name.endswith((".tar.gz", ".zip", ".tar.bz2")))
        if r.returncode != 0 or not found:
            raise MakerError(f"pip download {name}=={version} failed (is the package index reachable?): "
                             f"{r.stderr.strip()[-500:]}")
    digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
    if sha256 and digest != sha256:
        raise MakerError(f"{found[0].name}: sha256 {digest} != expected {sha256}; the index serves a different "
                         f"file (delete {dest} to re-download, or remake the tasks)")
    return found[0]


def _extract(archive: Path, dest: Path) -> None:
    if archive.name.endswith(".zip"):
        raise MakerError(f"{archive.name}: zip sdists are not supported; pick a version with a .tar.gz sdist")
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")
    tops = list(dest.iterdir())
    if len(tops) != 1 or not tops[0].is_dir():
        raise MakerError(f"{archive.name}: expected one top-level directory in the sdist")
    for p in tops[0].iterdir():
        p.rename(dest / p.name)
    tops[0].rmdir()


def _copy_clean(src: Path, dest: Path) -> None:
    def ignore(_dir, names):
        return {n for n in names if n in _JUNK_DIRS or n.endswith((".pyc", ".egg-info"))}

    shutil.copytree(src, dest, ignore=ignore, symlinks=True, dirs_exist_ok=True)


def fetch_source(spec: str, workdir: Path, cache: str | None = None, sha256: str | None = None) -> Source:
    """`pypi:NAME==VERSION[#sha256=HEX]` or a local directory, as a clean tree under `workdir`."""
    root = workdir / "project"
    if spec.startswith("pypi:"):
        m = re.fullmatch(r"pypi:([A-Za-z0-9._-]+)==([A-Za-z0-9.+!_-]+)(?:#sha256=([0-9a-f]{64}))?", spec)
        if not m:
            raise MakerError(f"bad source {spec!r}: write pypi:NAME==VERSION[#sha256=HEX] (a pinned version)")
        name, version, pinned = m.groups()
        if pinned and sha256 and pinned != sha256:
            raise MakerError(f"source {spec!r} pins sha256 {pinned}, but {sha256} is expected")
        archive = download_sdist(name, version, cache, pinned or sha256)
        spec = f"pypi:{name}=={version}"
        raw = workdir / "sdist"
        raw.mkdir()
        _extract(archive, raw)
        _copy_clean(raw, root)
        return Source(root, spec, name, version, hashlib.sha256(archive.read_bytes()).hexdigest())
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise MakerError(f"source {spec!r} is neither pypi:NAME==VERSION nor a directory")
    _copy_clean(path, root)
    return Source(root, str(path.resolve()), path.resolve().name, "local", None)


def git_snapshot(tree: Path) -> str:
    """`tree` as a git repo with one root commit (fixed identity/date); returns its hash."""
    def git(*args):
        r = subprocess.run(["git", "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", *args], cwd=tree,
                           env={**os.environ, **_GIT_ENV}, capture_output=True, text=True)
        if r.returncode != 0:
            raise MakerError(f"git {args[0]} in {tree} failed: {r.stderr.strip()}")
        return r.stdout.strip()

    git("init", "-q")
    git("add", "-A", "-f", ".")
    git("commit", "-q", "--no-verify", "-m", "snapshot")
    return git("rev-parse", "HEAD")


def gold_patch(tree: Path, path: str, original: str) -> str:
    """The fix as `git diff` shows it: `path` restored to `original` in the buggy repo."""
    target = tree / path
    buggy = target.read_bytes()
    target.write_text(original, encoding="utf-8")
    try:
        return subprocess.run(["git", "diff", "--no-color", "--no-ext-diff"], cwd=tree, capture_output=True,
                              text=True, check=True).stdout
    finally:
        target.write_bytes(buggy)


# ---------------------------------------------------------------- project layout


def _matches(rel: str, globs: tuple[str, ...]) -> bool:
    return any(rel == g or fnmatch.fnmatch(rel, g) for g in globs)


def _py_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.is_file())


def discover_tests(root: Path, globs: tuple[str, ...] = ()) -> list[str]:
    files = [f for f in _py_files(root) if (_matches(f, globs) if globs else
                                            re.fullmatch(r"test_.*\.py|.*_test\.py", Path(f).name))]
    if not files:
        raise MakerError(f"no test files found in the project ({globs or 'test_*.py / *_test.py'}); pass --tests")
    return files


def discover_sources(root: Path, tests: list[str], globs: tuple[str, ...] = ()) -> list[str]:
    if globs:
        files = [f for f in _py_files(root) if _matches(f, globs)]
    else:
        files = [f for f in _py_files(root) if f not in tests and Path(f).name not in _NON_SOURCE
                 and not set(Path(f).parts[:-1]) & set(_NON_SOURCE_DIRS)]
    if not files:
        raise MakerError("no source files to mutate; pass --src")
    return files


def restore_task_repo(project: Path, patch: str, base_commit: str, dest: Path) -> Path:
    """A task's buggy repo rebuilt from the clean project tree: the gold patch applied in
    reverse, then snapshotted; the commit must come out as the recorded base_commit."""
    shutil.copytree(project, dest, symlinks=True)
    r = subprocess.run(["git", "apply", "-R", "--whitespace=nowarn", "-"], cwd=dest, input=patch,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise MakerError(f"the gold patch does not reverse-apply to the source tree: {r.stderr.strip()}")
    commit = git_snapshot(dest)
    if commit != base_commit:
        raise MakerError(f"rebuilt repo has commit {commit}, the task says {base_commit}: the source tree "
                         "differs from the one the task was made from (remake the task set)")
    return dest
